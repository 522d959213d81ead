// LAMB's, Adafactor's and Muon's device passes (optim/device_passes.h), through the host's
// launcher (the CUDA kernels' bodies, runs and column items, one element at a time),
// against the host's passes (lamb.cc, adafactor.cc): params of awkward shapes (a 1-D one
// of several runs, a matrix of more rows than a column item holds, a 3-D one of several
// matrices) cut across 3 ranks mid-row and mid-matrix, their blocks exchanged as the step
// exchanges them, over several steps. The params, slots and factored moments equal the
// host's bit for bit, and the blocks of sums agree to within their rounding.
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "optim/device_passes.h"
#include "optim/muon.h"
#include "optim/optimizer.h"
#include "optim/param_passes.h"
#include "sx/sx.h"
#include "sx_cmocka.h"

namespace {

using sx::optim::Hyper;
using sx::optim::Kind;
using sx::optim::Segment;

constexpr int kRanks = 3;

struct Param {
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    std::vector<float> p, g, s0, s1;
    std::vector<uint16_t> out;           // bf16 params
    std::vector<float> whole[kRanks][2];  // each rank's copy of the whole tensors
    int64_t step = 0;
};

std::vector<Param> make_params(unsigned seed) {
    const std::vector<std::vector<int64_t>> shapes = {{9000}, {600, 7}, {3, 5, 4}, {1, 1}};
    std::vector<Param> out;
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (const auto &shape : shapes) {
        Param q;
        q.shape = shape;
        for (int64_t e : shape) q.numel *= static_cast<uint64_t>(e);
        q.p.resize(q.numel), q.g.resize(q.numel), q.s0.assign(q.numel, 0.0f), q.s1.assign(q.numel, 0.0f);
        q.out.assign(q.numel, 0);
        for (uint64_t i = 0; i < q.numel; ++i) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            q.p[i] = static_cast<float>(static_cast<double>(x % 2000001) / 1000000.0 - 1.0);
        }
        out.push_back(std::move(q));
    }
    return out;
}

void new_grads(std::vector<Param> &params, int step) {
    for (size_t k = 0; k < params.size(); ++k)
        for (uint64_t i = 0; i < params[k].numel; ++i)
            params[k].g[i] = std::sin(static_cast<float>(i * 7 + k * 13 + static_cast<uint64_t>(step) * 3)) * 0.5f;
}

// Rank r's piece of a param of n elements: cut at odd places (mid-row, mid-matrix).
void piece(uint64_t n, int r, uint64_t *lo, uint64_t *hi) {
    const uint64_t cuts[kRanks + 1] = {0, n / 3 + (n > 3 ? 1 : 0), (2 * n) / 3 + (n > 5 ? 2 : 0), n};
    *lo = std::min(cuts[r], n);
    *hi = std::min(cuts[r + 1], n);
}

// One step of every param through `kind`'s passes, on the host's (device false) or the
// device passes' host launcher; the ranks' blocks added in rank order between passes.
// *blocks gets each exchange's summed blocks, for comparison.
void step(Kind kind, const Hyper &h, std::vector<Param> &params, bool device, float grad_scale,
          std::vector<std::vector<double>> *blocks, double *grad_sumsq) {
    const sx::optim::OptimizerSpec &spec = sx::optim::spec_of(kind);
    const sx::optim::ParamPasses &passes = *spec.passes;
    for (Param &q : params) ++q.step;
    std::vector<sx::optim::PassParam> pass_params[kRanks];
    std::vector<Segment> segs[kRanks];
    std::vector<size_t> param_of[kRanks];
    std::unique_ptr<sx::optim::ParamPassRun> runs[kRanks];
    for (int r = 0; r < kRanks; ++r) {
        for (size_t k = 0; k < params.size(); ++k) {
            Param &q = params[k];
            sx::optim::PassParam pp;
            pp.hyper = &h;
            pp.shape = &q.shape;
            pp.next_step = q.step;
            pp.whole[0] = &q.whole[r][0];
            pp.whole[1] = &q.whole[r][1];
            pass_params[r].push_back(pp);
            uint64_t lo, hi;
            piece(q.numel, r, &lo, &hi);
            if (lo >= hi) continue;
            Segment s;
            s.param = q.p.data() + lo;
            s.grad = q.g.data() + lo;
            s.state[0] = q.s0.data() + lo;
            s.state[1] = q.s1.data() + lo;
            s.compute_out = q.out.data() + lo;
            s.compute_dtype = SX_DTYPE_BF16;
            s.n = hi - lo;
            s.hyper = &h;
            s.step = q.step;
            s.param_offset = lo;
            s.param_index = static_cast<int32_t>(k);
            segs[r].push_back(s);
            param_of[r].push_back(k);
        }
    }
    for (int r = 0; r < kRanks; ++r) {
        sx::optim::PassInput in;
        in.segs = segs[r].data();
        in.num_segs = segs[r].size();
        in.param_of = param_of[r].data();
        in.params = pass_params[r].data();
        in.num_params = params.size();
        in.grad_scale = grad_scale;
        if (device) {
            assert_int_equal(sx::optim::start_device_passes(kind, in, sx::optim::make_host_pass_launcher(), &runs[r]).code(),
                             SX_OK);
        } else {
            runs[r] = passes.start(in);
        }
    }
    blocks->clear();
    // Each exchange's blocks, summed over the ranks (the third pass reads the first's too).
    std::vector<std::vector<double>> keep[sx::optim::kMaxParamExchanges];
    *grad_sumsq = 0.0;
    for (int pass = 0; pass <= passes.exchanges; ++pass) {
        std::vector<std::vector<double>> next(params.size());
        for (size_t k = 0; k < params.size(); ++k)
            if (pass < passes.exchanges) next[k].assign(passes.block_width(pass, params[k].shape), 0.0);
        for (int r = 0; r < kRanks; ++r) {
            std::vector<std::vector<double>> mine(params.size());
            std::vector<double *> mine_p(params.size(), nullptr);
            std::vector<const double *> summed_p(params.size(), nullptr);
            for (size_t k = 0; k < params.size(); ++k) {
                mine[k].assign(next[k].size(), 0.0);
                mine_p[k] = pass < passes.exchanges ? mine[k].data() : nullptr;
                summed_p[k] = pass > 0 ? keep[pass - 1][k].data() : nullptr;
            }
            double g = 0.0;
            assert_int_equal(runs[r]->pass(pass, summed_p.data(), mine_p.data(), pass == 0 ? &g : nullptr).code(),
                             SX_OK);
            *grad_sumsq += g;
            for (size_t k = 0; k < params.size(); ++k)
                for (size_t j = 0; j < next[k].size(); ++j) next[k][j] += mine[k][j];
        }
        if (pass < passes.exchanges) {
            keep[pass] = next;
            for (const auto &b : next) blocks->push_back(b);
        }
    }
}

void expect_equal(const std::vector<float> &a, const std::vector<float> &b, const char *what, size_t k) {
    assert_int_equal(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
            fail_msg("param %zu's %s[%zu]: device passes %.9g, host passes %.9g", k, what, i, static_cast<double>(a[i]),
                     static_cast<double>(b[i]));
}

void compare(Kind kind, Hyper h) {
    std::vector<Param> host = make_params(1), dev = make_params(1);
    for (int t = 1; t <= 4; ++t) {
        new_grads(host, t);
        new_grads(dev, t);
        std::vector<std::vector<double>> bh, bd;
        double gh = 0.0, gd = 0.0;
        const float scale = t == 3 ? 0.25f : 1.0f;
        step(kind, h, host, false, scale, &bh, &gh);
        step(kind, h, dev, true, scale, &bd, &gd);
        assert_true(std::fabs(gh - gd) <= 1e-12 * gh);
        assert_int_equal(bh.size(), bd.size());
        for (size_t b = 0; b < bh.size(); ++b)
            for (size_t j = 0; j < bh[b].size(); ++j)
                if (!(std::fabs(bh[b][j] - bd[b][j]) <= 1e-12 * std::fabs(bh[b][j]) + 1e-300))
                    fail_msg("step %d block %zu [%zu]: device passes %.17g, host passes %.17g", t, b, j, bd[b][j],
                             bh[b][j]);
        for (size_t k = 0; k < host.size(); ++k) {
            expect_equal(dev[k].p, host[k].p, "param", k);
            expect_equal(dev[k].s0, host[k].s0, "slot 0", k);
            expect_equal(dev[k].s1, host[k].s1, "slot 1", k);
            assert_memory_equal(dev[k].out.data(), host[k].out.data(), host[k].out.size() * 2);
            for (int r = 0; r < kRanks; ++r)
                for (int w = 0; w < 2; ++w) expect_equal(dev[k].whole[r][w], host[k].whole[r][w], "whole tensor", k);
        }
    }
    // The steps changed the params, and the factored moments were kept (the comparison is
    // of something).
    std::vector<Param> start = make_params(1);
    assert_true(std::memcmp(start[1].p.data(), host[1].p.data(), host[1].p.size() * 4) != 0);
    if (kind == Kind::kAdafactor) assert_int_equal(host[1].whole[0][0].size(), 600);
}

void test_lamb(void **) {
    Hyper h = sx::optim::default_hyper(Kind::kLamb);
    h.weight_decay = 0.01;
    compare(Kind::kLamb, h);
    h.decoupled_weight_decay = 0;  // the decay added to the direction
    h.maximize = 1;
    compare(Kind::kLamb, h);
}

void test_adafactor(void **) {
    Hyper h = sx::optim::default_hyper(Kind::kAdafactor);
    h.weight_decay = 0.01;
    compare(Kind::kAdafactor, h);
    h.lr = 0.5;  // rho = 1 / sqrt(t) from the second step
    h.maximize = 1;
    compare(Kind::kAdafactor, h);
}

// Muon's first and last passes through the host launcher against muon.cc's, on segments
// of awkward lengths, with and without Nesterov: the buffer, u, the params and their bf16
// copies bit for bit, the gradients' sum of squares within its rounding.
void test_muon_passes(void **) {
    for (int nesterov : {1, 0}) {
        Hyper h = sx::optim::default_hyper(Kind::kMuon);
        h.nesterov = nesterov;
        h.weight_decay = 0.05;
        std::vector<Param> host = make_params(2), dev = make_params(2);
        const std::vector<int64_t> shapes[] = {{90, 100}, {600, 7}, {15, 4}, {1, 1}};
        for (int t = 1; t <= 3; ++t) {
            new_grads(host, t);
            new_grads(dev, t);
            double sums[2] = {0.0, 0.0};
            std::vector<Param> *both[2] = {&host, &dev};
            std::vector<std::vector<float>> u[2];
            for (int w = 0; w < 2; ++w) {
                std::vector<Segment> segs;
                std::vector<float *> pieces;
                std::vector<const std::vector<int64_t> *> shape_of;
                u[w].resize(both[w]->size());
                for (size_t k = 0; k < both[w]->size(); ++k) {
                    Param &q = (*both[w])[k];
                    u[w][k].assign(q.numel, 0.0f);
                    Segment s;
                    s.param = q.p.data(), s.grad = q.g.data(), s.state[0] = q.s0.data();
                    s.compute_out = q.out.data(), s.compute_dtype = SX_DTYPE_BF16;
                    s.n = q.numel, s.hyper = &h, s.step = t;
                    segs.push_back(s);
                    pieces.push_back(u[w][k].data());
                    shape_of.push_back(&shapes[k]);
                }
                const float scale = t == 2 ? 0.5f : 1.0f;
                const std::unique_ptr<sx::optim::PassLauncher> launcher = sx::optim::make_host_pass_launcher();
                if (w == 0) {
                    sx::optim::kMuonUpdate.first(segs.data(), segs.size(), scale, pieces.data(), &sums[0]);
                } else {
                    assert_int_equal(sx::optim::device_muon_momentum(*launcher, segs.data(), segs.size(), scale,
                                                                     pieces.data(), &sums[1]).code(),
                                     SX_OK);
                }
                // Stand-in for the orthogonalised update: u scaled, the same on both sides.
                for (std::vector<float> &x : u[w])
                    for (float &v : x) v *= 0.75f;
                std::vector<const float *> orth(pieces.begin(), pieces.end());
                if (w == 0) {
                    sx::optim::kMuonUpdate.apply(segs.data(), segs.size(), shape_of.data(), orth.data());
                } else {
                    assert_int_equal(sx::optim::device_muon_apply(*launcher, segs.data(), segs.size(), shape_of.data(),
                                                                  orth.data()).code(),
                                     SX_OK);
                }
            }
            assert_true(std::fabs(sums[0] - sums[1]) <= 1e-12 * sums[0]);
            for (size_t k = 0; k < host.size(); ++k) {
                expect_equal(dev[k].s0, host[k].s0, "momentum buffer", k);
                expect_equal(u[1][k], u[0][k], "update", k);
                expect_equal(dev[k].p, host[k].p, "param", k);
                assert_memory_equal(dev[k].out.data(), host[k].out.data(), host[k].out.size() * 2);
            }
        }
        const std::vector<Param> start = make_params(2);
        assert_true(std::memcmp(start[0].p.data(), host[0].p.data(), host[0].p.size() * 4) != 0);
    }
}

void test_other_optimizers_have_none(void **) {
    std::unique_ptr<sx::optim::ParamPassRun> run;
    sx::optim::PassInput in;
    assert_int_equal(sx::optim::start_device_passes(Kind::kMuon, in, sx::optim::make_host_pass_launcher(), &run).code(),
                     SX_ERR_UNSUPPORTED);
    assert_null(run.get());
}

}  // namespace

int main() {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lamb),
        cmocka_unit_test(test_adafactor),
        cmocka_unit_test(test_muon_passes),
        cmocka_unit_test(test_other_optimizers_have_none),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
