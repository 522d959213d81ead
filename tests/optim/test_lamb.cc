// LAMB's two passes (optim/lamb.h) against its whole-param reference: a param cut into
// pieces as ranks' shards cut it, each piece's sums added as the step's exchange adds
// them, gives the reference's params and moments; the sums do not depend on the pool's
// size; a param whose norm is 0 takes the plain step (trust ratio 1).
#include <cmath>
#include <cstring>
#include <vector>

#include "optim/lamb.h"
#include "optim/thread_pool.h"
#include "sx_cmocka.h"

namespace {

using sx::optim::Hyper;
using sx::optim::LambSums;
using sx::optim::Segment;

struct Param {
    std::vector<float> p, g, m, v;
    explicit Param(size_t n, unsigned seed) : p(n), g(n), m(n), v(n) {
        uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
        auto next = [&] {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            return static_cast<float>(static_cast<double>(x % 2000001) / 1000000.0 - 1.0);
        };
        for (size_t i = 0; i < n; ++i) p[i] = next(), g[i] = next(), m[i] = 0.1f * next(), v[i] = std::fabs(next()) * 0.01f;
    }
};

Segment whole(Param &x, const Hyper &h, int64_t step) {
    Segment s;
    s.param = x.p.data();
    s.grad = x.g.data();
    s.state[0] = x.m.data();
    s.state[1] = x.v.data();
    s.n = x.p.size();
    s.hyper = &h;
    s.step = step;
    return s;
}

// The param cut at `cuts` (the ranks' shard boundaries), updated by the two passes with
// the pieces' sums added in piece order, on `pool`.
void by_pieces(Param &x, const Hyper &h, int64_t step, const std::vector<size_t> &cuts, float grad_scale,
               sx::optim::ThreadPool *pool) {
    std::vector<Segment> segs;
    size_t lo = 0;
    for (size_t k = 0; k <= cuts.size(); ++k) {
        const size_t hi = k < cuts.size() ? cuts[k] : x.p.size();
        Segment s = whole(x, h, step);
        s.param += lo, s.grad += lo, s.state[0] += lo, s.state[1] += lo;
        s.n = hi - lo;
        segs.push_back(s);
        lo = hi;
    }
    std::vector<LambSums> sums(segs.size());
    double grad_sumsq = 0.0;
    sx::optim::lamb_first_pass(segs.data(), segs.size(), grad_scale, pool, sums.data(), &grad_sumsq);
    LambSums all;
    double want_sumsq = 0.0;
    for (size_t i = 0; i < x.g.size(); ++i) want_sumsq += static_cast<double>(x.g[i] * grad_scale) * (x.g[i] * grad_scale);
    assert_true(std::fabs(grad_sumsq - want_sumsq) <= 1e-12 * want_sumsq);
    for (const LambSums &s : sums) all.param += s.param, all.update += s.update;
    std::vector<float> factors(segs.size(), sx::optim::lamb_factor(h, step, all));
    sx::optim::lamb_second_pass(segs.data(), segs.size(), factors.data(), pool);
}

double max_rel(const std::vector<float> &a, const std::vector<float> &b) {
    double worst = 0.0;
    for (size_t i = 0; i < a.size(); ++i)
        worst = std::fmax(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / std::fmax(1e-30, std::fabs(b[i])));
    return worst;
}

void test_pieces_match_the_whole_param(void **) {
    sx::optim::ThreadPool pool(3);
    Hyper decoupled = sx::optim::default_hyper(sx::optim::Kind::kLamb);
    decoupled.lr = 0.01, decoupled.weight_decay = 0.05;
    Hyper l2 = decoupled;
    l2.decoupled_weight_decay = false, l2.beta1 = 0.8, l2.eps = 1e-8, l2.maximize = true;
    for (const Hyper *h : {&decoupled, &l2})
        for (size_t n : {size_t(1), size_t(37), size_t(4096), size_t(10007)}) {
            // Whole; two ranks; four, one of which holds a single element.
            std::vector<std::vector<size_t>> cuttings = {{}};
            if (n > 2) cuttings.push_back({n / 2});
            if (n > 6) cuttings.push_back({n / 3, n / 3 + 1, 2 * n / 3});
            for (const std::vector<size_t> &cuts : cuttings)
                for (int64_t step : {int64_t(1), int64_t(7)}) {
                    Param want(n, static_cast<unsigned>(n)), got = want;
                    sx::optim::lamb_reference(whole(want, *h, step), 0.5f);
                    by_pieces(got, *h, step, cuts, 0.5f, &pool);
                    // The moments are elementwise: exact. The params' factor comes from
                    // sums added in another order: within a few fp32 roundings.
                    assert_memory_equal(got.m.data(), want.m.data(), n * sizeof(float));
                    assert_memory_equal(got.v.data(), want.v.data(), n * sizeof(float));
                    if (max_rel(got.p, want.p) > 1e-6)
                        fail_msg("n %zu, %zu cuts, step %lld: params differ by %g", n, cuts.size(),
                                 static_cast<long long>(step), max_rel(got.p, want.p));
                }
        }
}

// The pieces' sums are added in piece order: 1 thread and 3 give the same bits.
void test_any_pool_size_gives_the_same_bits(void **) {
    Hyper h = sx::optim::default_hyper(sx::optim::Kind::kLamb);
    h.weight_decay = 0.01;
    Param one(50000, 3), three = one;
    sx::optim::ThreadPool pool(3);
    by_pieces(one, h, 3, {20011}, 1.0f, nullptr);
    by_pieces(three, h, 3, {20011}, 1.0f, &pool);
    assert_memory_equal(one.p.data(), three.p.data(), one.p.size() * sizeof(float));
}

// pytorch-optimizer's Lamb: trust ratio 1 where the param's norm is 0; the norm is
// clamped at 10; the step size is lr / (1 - beta1^t).
void test_trust_ratio_edges(void **) {
    Hyper h = sx::optim::default_hyper(sx::optim::Kind::kLamb);
    h.lr = 0.1;
    LambSums zero_param{0.0, 4.0};
    const double step_size = 0.1 / (1.0 - 0.9);
    assert_true(sx::optim::lamb_factor(h, 1, zero_param) == static_cast<float>(-step_size));
    LambSums big{1e6, 4.0};  // ||p|| = 1000, clamped to 10; ||u|| = 2
    const float trust = 10.0f / (2.0f + static_cast<float>(h.eps));
    assert_true(sx::optim::lamb_factor(h, 1, big) == static_cast<float>(-step_size) * trust);
    const double later = 0.1 / (1.0 - std::pow(0.9, 50.0));
    assert_true(sx::optim::lamb_factor(h, 50, zero_param) == static_cast<float>(-later));
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_match_the_whole_param),
        cmocka_unit_test(test_any_pool_size_gives_the_same_bits),
        cmocka_unit_test(test_trust_ratio_edges),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
