// Adafactor's three passes (optim/adafactor.h) against its whole-param reference: a param
// cut into pieces as ranks' shards cut it (mid-row too), each piece's sums added as the
// step's exchanges add them, gives the reference's params and moments over several steps;
// the sums do not depend on the pool's size; the step size's floor (eps2) and the
// update's clipping (d) act as torch's.
#include <cmath>
#include <cstring>
#include <vector>

#include "base/half.h"
#include "optim/adafactor.h"
#include "optim/thread_pool.h"
#include "sx_cmocka.h"

namespace {

using sx::optim::AdafactorParam;
using sx::optim::AdafactorShape;
using sx::optim::Hyper;
using sx::optim::Segment;

struct Param {
    AdafactorShape shape;
    std::vector<float> p, g, variance, row_var, col_var;
    Param(const std::vector<int64_t> &dims, unsigned seed)
        : shape(sx::optim::adafactor_shape(dims)), p(shape.numel), g(shape.numel), variance(shape.numel),
          row_var(shape.row_count()), col_var(shape.col_count()) {
        uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
        auto next = [&] {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            return static_cast<float>(static_cast<double>(x % 2000001) / 1000000.0 - 1.0);
        };
        for (size_t i = 0; i < p.size(); ++i) p[i] = next(), g[i] = next();
    }
    // New gradients for the next step.
    void regrad(unsigned seed) {
        for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(static_cast<float>(i * 7 + seed));
    }
};

Segment whole(Param &x, const Hyper &h, int64_t step) {
    Segment s;
    s.param = x.p.data();
    s.grad = x.g.data();
    s.state[0] = x.variance.data();
    s.n = x.p.size();
    s.hyper = &h;
    s.step = step;
    return s;
}

// The param cut at `cuts` (the ranks' shard boundaries), updated by the three passes with
// the pieces' sums added in piece order as the exchanges add them, on `pool`.
void by_pieces(Param &x, const Hyper &h, int64_t step, const std::vector<size_t> &cuts, float grad_scale,
               sx::optim::ThreadPool *pool) {
    std::vector<Segment> segs;
    size_t lo = 0;
    for (size_t k = 0; k <= cuts.size(); ++k) {
        const size_t hi = k < cuts.size() ? cuts[k] : x.p.size();
        Segment s = whole(x, h, step);
        s.param += lo, s.grad += lo, s.state[0] += lo;
        s.n = hi - lo;
        s.param_offset = lo;
        segs.push_back(s);
        lo = hi;
    }
    const size_t width = x.shape.first_width();
    std::vector<double> blocks(segs.size() * width, 0.0);
    std::vector<AdafactorParam> params(segs.size());
    for (size_t s = 0; s < segs.size(); ++s) {
        params[s].shape = x.shape;
        params[s].sums = blocks.data() + s * width;
    }
    double grad_sumsq = 0.0;
    sx::optim::adafactor_first_pass(segs.data(), segs.size(), params.data(), grad_scale, pool, &grad_sumsq);
    double want_sumsq = 0.0;
    for (float g : x.g) want_sumsq += static_cast<double>(g * grad_scale) * (g * grad_scale);
    assert_true(std::fabs(grad_sumsq - want_sumsq) <= 1e-12 * want_sumsq);
    std::vector<double> sum(width, 0.0);
    for (size_t s = 0; s < segs.size(); ++s)
        for (size_t j = 0; j < width; ++j) sum[j] += blocks[s * width + j];
    std::vector<float> means(x.shape.matrices);
    if (x.shape.factored)
        sx::optim::adafactor_update_factors(h, step, x.shape, sum.data(), x.row_var.data(), x.col_var.data(),
                                            means.data());
    for (AdafactorParam &p : params) {
        p.sums = nullptr;
        p.row_var = x.row_var.data(), p.col_var = x.col_var.data(), p.row_means = means.data();
    }
    std::vector<double> usq(segs.size());
    sx::optim::adafactor_second_pass(segs.data(), segs.size(), params.data(), grad_scale, pool, usq.data());
    double all_usq = 0.0;
    for (double u : usq) all_usq += u;
    std::vector<float> factors(segs.size(), sx::optim::adafactor_factor(h, step, x.shape.numel, sum[0], all_usq));
    sx::optim::adafactor_third_pass(segs.data(), segs.size(), params.data(), factors.data(), grad_scale, pool);
}

double max_rel(const std::vector<float> &a, const std::vector<float> &b) {
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i)
        worst = std::fmax(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / std::fmax(1e-30, std::fabs(b[i])));
    return worst;
}

void test_pieces_match_the_whole_param(void **) {
    sx::optim::ThreadPool pool(3);
    Hyper plain = sx::optim::default_hyper(sx::optim::Kind::kAdafactor);
    Hyper other = plain;
    other.weight_decay = 0.05, other.maximize = true, other.beta2_decay = -0.5, other.eps = 1e-5, other.eps2 = 1e-2,
    other.d = 1.25, other.lr = 0.05;
    // A matrix; a stack of three; vectors; a scalar; rows longer than a pass's piece
    // (4096 elements); many short rows.
    const std::vector<std::vector<int64_t>> shapes = {{7, 5}, {3, 4, 2}, {13}, {}, {2, 9000}, {300, 70}, {2, 2, 3, 5}};
    for (const Hyper *h : {&plain, &other})
        for (const std::vector<int64_t> &dims : shapes) {
            const size_t n = sx::optim::adafactor_shape(dims).numel;
            // Whole; two ranks, cut mid-row; four, one of which holds a single element.
            std::vector<std::vector<size_t>> cuttings = {{}};
            if (n > 2) cuttings.push_back({n / 2 + 1});
            if (n > 6) cuttings.push_back({n / 3, n / 3 + 1, 2 * n / 3});
            for (const std::vector<size_t> &cuts : cuttings) {
                Param want(dims, static_cast<unsigned>(n)), got = want;
                for (int64_t step = 1; step <= 3; ++step) {
                    sx::optim::adafactor_reference(whole(want, *h, step), want.shape, want.row_var.data(),
                                                   want.col_var.data(), 0.5f);
                    by_pieces(got, *h, step, cuts, 0.5f, &pool);
                    // The 1-D variance is elementwise: exact. The factored moments and the
                    // params come from sums added in another order: within a few fp32
                    // roundings.
                    assert_memory_equal(got.variance.data(), want.variance.data(), n * sizeof(float));
                    const double moments = std::fmax(max_rel(got.row_var, want.row_var), max_rel(got.col_var, want.col_var));
                    if (moments > 1e-6 || max_rel(got.p, want.p) > 1e-6)
                        fail_msg("%zu elements in %zu dims, %zu cuts, step %lld: moments differ by %g, params by %g", n,
                                 dims.size(), cuts.size(), static_cast<long long>(step), moments,
                                 max_rel(got.p, want.p));
                    want.regrad(static_cast<unsigned>(step)), got.regrad(static_cast<unsigned>(step));
                }
                // The params moved: the test compares something that changed.
                const Param start(dims, static_cast<unsigned>(n));
                assert_true(max_rel(got.p, start.p) > 1e-4);
            }
        }
}

// The pieces' sums are added in piece order and each row's and column's in ascending
// order: 1 thread and 3 give the same bits.
void test_any_pool_size_gives_the_same_bits(void **) {
    Hyper h = sx::optim::default_hyper(sx::optim::Kind::kAdafactor);
    h.weight_decay = 0.01;
    for (const std::vector<int64_t> &dims : {std::vector<int64_t>{250, 203}, std::vector<int64_t>{50000}}) {
        Param one(dims, 3), three = one;
        sx::optim::ThreadPool pool(3);
        by_pieces(one, h, 2, {20011}, 1.0f, nullptr);
        by_pieces(three, h, 2, {20011}, 1.0f, &pool);
        assert_memory_equal(one.p.data(), three.p.data(), one.p.size() * sizeof(float));
        assert_memory_equal(one.row_var.data(), three.row_var.data(), one.row_var.size() * sizeof(float));
        assert_memory_equal(one.col_var.data(), three.col_var.data(), one.col_var.size() * sizeof(float));
    }
}

// 16-bit params (fp32 masters): the third pass rounds every piece's updated masters into
// them, factored or not, as the reference does.
void test_sixteen_bit_params(void **) {
    Hyper h = sx::optim::default_hyper(sx::optim::Kind::kAdafactor);
    h.weight_decay = 0.01;
    for (const std::vector<int64_t> &dims : {std::vector<int64_t>{30, 17}, std::vector<int64_t>{257}}) {
        Param want(dims, 5), got = want;
        const size_t n = got.p.size();
        std::vector<uint16_t> want16(n), got16(n);
        Segment whole_seg = whole(want, h, 1);
        whole_seg.compute_out = want16.data();
        whole_seg.compute_dtype = SX_DTYPE_BF16;
        sx::optim::adafactor_reference(whole_seg, want.shape, want.row_var.data(), want.col_var.data(), 1.0f);
        // Two pieces, cut mid-row, each rounding into its part of the 16-bit params.
        const size_t cut = n / 2 + 3;
        std::vector<Segment> segs = {whole(got, h, 1), whole(got, h, 1)};
        segs[0].n = cut;
        segs[1].param += cut, segs[1].grad += cut, segs[1].state[0] += cut, segs[1].n = n - cut;
        segs[1].param_offset = cut;
        for (int s = 0; s < 2; ++s) {
            segs[s].compute_out = got16.data() + (s ? cut : 0);
            segs[s].compute_dtype = SX_DTYPE_BF16;
        }
        const size_t width = got.shape.first_width();
        std::vector<double> blocks(2 * width, 0.0), sum(width, 0.0);
        std::vector<AdafactorParam> params(2);
        for (int s = 0; s < 2; ++s) params[s].shape = got.shape, params[s].sums = blocks.data() + s * width;
        sx::optim::adafactor_first_pass(segs.data(), 2, params.data(), 1.0f, nullptr, nullptr);
        for (size_t j = 0; j < width; ++j) sum[j] = blocks[j] + blocks[width + j];
        std::vector<float> means(got.shape.matrices);
        if (got.shape.factored)
            sx::optim::adafactor_update_factors(h, 1, got.shape, sum.data(), got.row_var.data(), got.col_var.data(),
                                                means.data());
        for (AdafactorParam &p : params)
            p.sums = nullptr, p.row_var = got.row_var.data(), p.col_var = got.col_var.data(), p.row_means = means.data();
        std::vector<double> usq(2);
        sx::optim::adafactor_second_pass(segs.data(), 2, params.data(), 1.0f, nullptr, usq.data());
        std::vector<float> factors(2, sx::optim::adafactor_factor(h, 1, got.shape.numel, sum[0], usq[0] + usq[1]));
        sx::optim::adafactor_third_pass(segs.data(), 2, params.data(), factors.data(), 1.0f, nullptr);
        // The 16-bit params are the masters rounded, and follow the reference's within
        // one bf16 rounding where the masters differ in their last bits.
        std::vector<uint16_t> rounded(n);
        sx::half::from_f32(SX_DTYPE_BF16, got.p.data(), rounded.data(), n);
        assert_memory_equal(rounded.data(), got16.data(), n * sizeof(uint16_t));
        for (size_t i = 0; i < n; ++i)
            assert_true(std::fabs(sx::half::bf16_to_f32(got16[i]) - sx::half::bf16_to_f32(want16[i])) <=
                        std::fabs(sx::half::bf16_to_f32(want16[i])) * 0x1p-7f);
    }
}

// torch's step size: alpha = max(eps2, RMS(p)) * min(lr, 1 / sqrt(t)), divided by
// max(1, RMS(u) / d).
void test_step_size(void **) {
    Hyper h = sx::optim::default_hyper(sx::optim::Kind::kAdafactor);
    h.lr = 0.5;
    // A zero param: alpha = eps2 * min(lr, 1/sqrt(t)); RMS(u) = 0.5: no clipping.
    assert_true(sx::optim::adafactor_factor(h, 1, 4, 0.0, 1.0) == static_cast<float>(-1e-3 * 0.5));
    assert_true(sx::optim::adafactor_factor(h, 16, 4, 0.0, 1.0) == static_cast<float>(-1e-3 * 0.25));
    // RMS(p) = 2 and RMS(u) = 3 with d = 1.5: alpha = 2 * 0.5, divided by 2.
    h.d = 1.5;
    assert_true(sx::optim::adafactor_factor(h, 1, 4, 16.0, 36.0) == static_cast<float>(-(2.0 * 0.5) / 2.0));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_match_the_whole_param),
        cmocka_unit_test(test_any_pool_size_gives_the_same_bits),
        cmocka_unit_test(test_sixteen_bit_params),
        cmocka_unit_test(test_step_size),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
