// Muon's pieces (optim/muon.h, optim/gemm.h): the ordered matrix product against a plain
// triple loop with the same order of sums (the same bits, at any pool size); each product
// flavour this build has (OpenBLAS's where found) against products in double, within
// fp32's rounding of its sums, the same bits at any pool size and run after run, the
// caller's vector registers left clean; Newton-Schulz with each flavour against the same
// iterations in double (within bf16's rounding), the same bits at any pool size, a tall
// matrix as its transpose's transpose, the flavours within a few bf16 roundings of each
// other; the adjusted lr of each adjust_lr.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "base/vector_state.h"
#include "optim/muon.h"
#include "optim/thread_pool.h"
#include "sx_cmocka.h"
#include "vector_state_check.h"

namespace {

std::vector<float> random_matrix(int64_t rows, int64_t cols, unsigned seed) {
    std::vector<float> m(static_cast<size_t>(rows * cols));
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (float &v : m) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        v = static_cast<float>(static_cast<double>(x % 2000001) / 1000000.0 - 1.0);
    }
    return m;
}

void test_ordered_product(void **) {
    sx::optim::ThreadPool pool(3);
    const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 130, 33}, {64, 64, 64}, {40, 257, 19}};
    for (const auto &s : sizes) {
        const int64_t m = s[0], k = s[1], n = s[2];
        const std::vector<float> a = random_matrix(m, k, 1), b = random_matrix(k, n, 2);
        std::vector<float> want(static_cast<size_t>(m * n)), one(want.size()), three(want.size());
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                float acc = 0.0f;
                for (int64_t q = 0; q < k; ++q) acc += a[i * k + q] * b[q * n + j];
                want[i * n + j] = acc;
            }
        sx::optim::matmul_ordered(a.data(), b.data(), one.data(), m, k, n, nullptr);
        sx::optim::matmul_ordered(a.data(), b.data(), three.data(), m, k, n, &pool);
        assert_memory_equal(one.data(), want.data(), want.size() * sizeof(float));
        assert_memory_equal(three.data(), want.data(), want.size() * sizeof(float));
    }
}

std::vector<sx::optim::Gemm> flavours() {
    std::vector<sx::optim::Gemm> out;
    for (sx::optim::Gemm f : {sx::optim::Gemm::kOrdered, sx::optim::Gemm::kBlas})
        if (sx::optim::gemm_available(f)) out.push_back(f);
    return out;
}

// Rounded values of bf16 precision, as Newton-Schulz multiplies (exact products in fp32).
std::vector<float> bf16_matrix(int64_t rows, int64_t cols, unsigned seed) {
    std::vector<float> m = random_matrix(rows, cols, seed);
    for (float &v : m) {
        uint32_t bits;
        std::memcpy(&bits, &v, sizeof bits);
        bits &= 0xFFFF0000u;
        std::memcpy(&v, &bits, sizeof bits);
    }
    return m;
}

// Each flavour's A B and A B^T against double sums: an fp32 sum of k exact products is
// within k * 2^-24 of the sum of their magnitudes (any order); a wrong index, a missed
// block or a transposed operand is off by far more. The same bits with 1, 2 and 3
// threads and when repeated; the vector registers left clean.
void test_gemm_flavours(void **) {
    sx::optim::ThreadPool two(2), three(3);
    // Rows past one 64-row block and its tail; k of 0 and 1; a wide and a tall C.
    const int64_t sizes[][3] = {{1, 1, 1}, {3, 0, 5}, {5, 1, 4}, {17, 130, 33}, {64, 64, 64}, {150, 70, 9}, {9, 300, 140}};
    for (sx::optim::Gemm f : flavours()) {
        for (const auto &s : sizes) {
            const int64_t m = s[0], k = s[1], n = s[2];
            const std::vector<float> a = bf16_matrix(m, k, 3), b = bf16_matrix(k, n, 4), bt = bf16_matrix(n, k, 4);
            for (int transposed = 0; transposed < 2; ++transposed) {
                std::vector<float> c1(static_cast<size_t>(m * n), -7.0f), c2(c1.size(), -7.0f), c3(c1.size(), -7.0f),
                    again(c1.size(), -7.0f);
                auto run = [&](std::vector<float> &c, sx::optim::ThreadPool *pool) {
                    if (transposed)
                        sx::optim::gemm_abt(f, a.data(), bt.data(), c.data(), m, k, n, pool);
                    else
                        sx::optim::gemm_ab(f, a.data(), b.data(), c.data(), m, k, n, pool);
                };
                sx::leave_vector_state_clean();
                run(c1, nullptr), run(c2, &two), run(c3, &three), run(again, &three);
                if (sxtest::upper_halves_in_use() == 1) fail_msg("%s left the vector registers' upper halves in use", sx::optim::gemm_name(f));
                assert_memory_equal(c1.data(), c2.data(), c1.size() * sizeof(float));
                assert_memory_equal(c1.data(), c3.data(), c1.size() * sizeof(float));
                assert_memory_equal(c3.data(), again.data(), c1.size() * sizeof(float));
                for (int64_t i = 0; i < m; ++i)
                    for (int64_t j = 0; j < n; ++j) {
                        double want = 0.0, mag = 0.0;
                        for (int64_t q = 0; q < k; ++q) {
                            const double x = a[i * k + q], y = transposed ? bt[j * k + q] : b[q * n + j];
                            want += x * y, mag += std::fabs(x * y);
                        }
                        const double got = c1[i * n + j];
                        if (!(std::fabs(got - want) <= static_cast<double>(k) * 0x1p-24 * mag))
                            fail_msg("%s %s %lld x %lld x %lld: [%lld, %lld] = %.9g, want %.9g", sx::optim::gemm_name(f),
                                     transposed ? "A B^T" : "A B", static_cast<long long>(m), static_cast<long long>(k),
                                     static_cast<long long>(n), static_cast<long long>(i), static_cast<long long>(j), got,
                                     want);
                    }
            }
        }
    }
}

// Several threads of one process (ranks as threads, each with its pool) multiplying at
// once, Muon's shapes and larger, each flavour: every product the same bits as when it ran
// alone.
// A B for even rows of sizes, A B^T (B stored n x k) for odd ones.
void product(sx::optim::Gemm f, const std::vector<float> *a, const std::vector<float> *b, std::vector<float> *c,
             const int64_t *mkn, sx::optim::ThreadPool *pool) {
    if (mkn[3])
        sx::optim::gemm_abt(f, a->data(), b->data(), c->data(), mkn[0], mkn[1], mkn[2], pool);
    else
        sx::optim::gemm_ab(f, a->data(), b->data(), c->data(), mkn[0], mkn[1], mkn[2], pool);
}

void test_gemm_threads_at_once(void **) {
    const int64_t sizes[][4] = {{6, 13, 6, 1}, {9, 24, 9, 1}, {16, 16, 16, 0}, {16, 16, 16, 1}, {64, 200, 64, 1},
                                {130, 96, 130, 0}, {7, 300, 5, 0}, {6, 6, 13, 0}};
    constexpr int kThreads = 6, kRounds = 40;
    for (sx::optim::Gemm f : flavours()) {
        std::vector<std::vector<float>> as, bs, alone;
        for (const auto &s : sizes) {
            as.push_back(bf16_matrix(s[0], s[1], 5)), bs.push_back(bf16_matrix(s[1], s[2], 6));  // n x k when transposed: same size
            alone.emplace_back(static_cast<size_t>(s[0] * s[2]));
            product(f, &as.back(), &bs.back(), &alone.back(), s, nullptr);
        }
        std::atomic<int> wrong{0};
        for (int r = 0; r < kRounds; ++r) {  // new threads every round, as ranks' threads come and go
            std::vector<std::thread> threads;
            for (int t = 0; t < kThreads; ++t)
                threads.emplace_back([&, t, r] {
                    sx::optim::ThreadPool pool(t % 2 + 1);
                    for (int j = 0; j < 2; ++j) {
                        const size_t i = static_cast<size_t>(t + r + j) % alone.size();
                        std::vector<float> c(alone[i].size(), -7.0f);
                        product(f, &as[i], &bs[i], &c, sizes[i], &pool);
                        if (std::memcmp(c.data(), alone[i].data(), c.size() * sizeof(float)) != 0) wrong.fetch_add(1);
                    }
                });
            for (std::thread &t : threads) t.join();
        }
        if (wrong.load() != 0)
            fail_msg("%s: %d of %d products made by %d threads at once differ from the same product alone",
                     sx::optim::gemm_name(f), wrong.load(), 2 * kThreads * kRounds, kThreads);
    }
}

// The iterations in double, without bf16's roundings.
std::vector<double> ns_double(const std::vector<float> &u, int64_t rows, int64_t cols, const sx::optim::Hyper &h) {
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
    std::vector<double> x(u.size());
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) (tall ? x[j * rows + i] : x[i * cols + j]) = u[i * cols + j];
    double sq = 0.0;
    for (double v : x) sq += v * v;
    for (double &v : x) v /= std::max(std::sqrt(sq), h.eps);
    for (int step = 0; step < static_cast<int>(h.ns_steps); ++step) {
        std::vector<double> g(static_cast<size_t>(m * m), 0.0), upd(g.size(), 0.0), next(x.size(), 0.0);
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < m; ++j)
                for (int64_t q = 0; q < n; ++q) g[i * m + j] += x[i * n + q] * x[j * n + q];
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < m; ++j) {
                double gg = 0.0;
                for (int64_t q = 0; q < m; ++q) gg += g[i * m + q] * g[q * m + j];
                upd[i * m + j] = h.ns_b * g[i * m + j] + h.ns_c * gg;
            }
        for (int64_t i = 0; i < m; ++i)
            for (int64_t j = 0; j < n; ++j) {
                double ux = 0.0;
                for (int64_t q = 0; q < m; ++q) ux += upd[i * m + q] * x[q * n + j];
                next[i * n + j] = h.ns_a * x[i * n + j] + ux;
            }
        x.swap(next);
    }
    std::vector<double> out(x.size());
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) out[i * cols + j] = tall ? x[j * rows + i] : x[i * cols + j];
    return out;
}

void test_newton_schulz(void **) {
    sx::optim::ThreadPool pool(2);
    const sx::optim::Hyper h = sx::optim::default_hyper(sx::optim::Kind::kMuon);
    // 70 x 150: rows past one of the BLAS flavour's blocks.
    const int64_t shapes[][2] = {{5, 9}, {24, 7}, {16, 16}, {1, 6}, {70, 150}, {150, 70}};
    for (const auto &s : shapes) {
        const std::vector<float> u = random_matrix(s[0], s[1], static_cast<unsigned>(s[0] * 100 + s[1]));
        const std::vector<double> want = ns_double(u, s[0], s[1], h);
        std::vector<std::vector<float>> by_flavour;
        for (sx::optim::Gemm f : flavours()) {
            std::vector<float> alone(u.size()), pooled(u.size());
            sx::optim::newton_schulz(u.data(), s[0], s[1], h, nullptr, alone.data(), f);
            sx::optim::newton_schulz(u.data(), s[0], s[1], h, &pool, pooled.data(), f);
            assert_memory_equal(alone.data(), pooled.data(), u.size() * sizeof(float));
            double diff = 0.0, norm = 0.0;
            for (size_t i = 0; i < u.size(); ++i) {
                // Every value is a bf16 value: its low 16 bits are zero.
                uint32_t bits;
                std::memcpy(&bits, &alone[i], sizeof bits);
                assert_int_equal(bits & 0xFFFFu, 0);
                diff += (alone[i] - want[i]) * (alone[i] - want[i]);
                norm += want[i] * want[i];
            }
            // Five iterations of bf16 products: a few of bf16's roundings (2^-8) normwise.
            if (!(std::sqrt(diff / norm) < 0.05))
                fail_msg("%s, %lld x %lld: %g from the double iterations", sx::optim::gemm_name(f),
                         static_cast<long long>(s[0]), static_cast<long long>(s[1]), std::sqrt(diff / norm));
            by_flavour.push_back(alone);
        }
        // The flavours sum in other orders, so an element may round to a neighbouring bf16
        // value and carry that through the iterations: within a few of bf16's roundings
        // (2^-8) of each other normwise, as each is of the double iterations.
        for (size_t f = 1; f < by_flavour.size(); ++f) {
            double diff = 0.0, norm = 0.0;
            for (size_t i = 0; i < u.size(); ++i) {
                const double d = by_flavour[f][i] - by_flavour[0][i];
                diff += d * d, norm += static_cast<double>(by_flavour[0][i]) * by_flavour[0][i];
            }
            if (!(std::sqrt(diff / norm) < 4 * 0x1p-8))
                fail_msg("%lld x %lld: the flavours %g apart", static_cast<long long>(s[0]), static_cast<long long>(s[1]),
                         std::sqrt(diff / norm));
        }
    }
}

void test_adjusted_lr(void **) {
    sx::optim::Hyper h = sx::optim::default_hyper(sx::optim::Kind::kMuon);
    h.lr = 0.5;
    assert_true(sx::optim::muon_adjusted_lr(h, 32, 8) == 0.5 * 2.0);  // sqrt(max(1, 32/8))
    assert_true(sx::optim::muon_adjusted_lr(h, 8, 32) == 0.5);
    h.adjust_lr = SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW;
    assert_true(sx::optim::muon_adjusted_lr(h, 8, 64) == 0.5 * 0.2 * 8.0);
    h.adjust_lr = SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED;
    assert_true(sx::optim::muon_adjusted_lr(h, 8, 32) == 0.5 * 0.5);
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ordered_product),
        cmocka_unit_test(test_gemm_flavours),
        cmocka_unit_test(test_gemm_threads_at_once),
        cmocka_unit_test(test_newton_schulz),
        cmocka_unit_test(test_adjusted_lr),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
