// sx's own matrix product, the kOrdered flavour of gemm.h.
#include <algorithm>
#include <cstring>

#include "optim/gemm.h"
#include "optim/passes.h"
#include "optim/thread_pool.h"

namespace sx {
namespace optim {
namespace {

// Rows [r0, r1) of C = A B, every element summed as ((0 + a0 b0) + a1 b1) + ... in
// ascending k. Tiles of kRows x kCols elements of C (12 AVX-512 registers) are summed in
// registers over a block of kBlock values of k (B's kBlock x kCols block, 32 KiB, staying
// in cache across the rows), then
// stored, and the next block of k adds to them: the same order for every element, so the
// tiles' shape (and the vector width) changes no bit.
constexpr int64_t kBlock = 256, kRows = 6, kCols = 32;

// 16 floats (GCC's vector extension: one AVX-512 register, or two AVX2, or four SSE).
typedef float V16 __attribute__((vector_size(64)));
inline V16 load16(const float *p) {
    V16 v;
    std::memcpy(&v, p, sizeof v);
    return v;
}
inline void store16(float *p, V16 v) { std::memcpy(p, &v, sizeof v); }

SX_PASS_CLONES void matmul_rows(const float *a, const float *b, float *c, int64_t r0, int64_t r1, int64_t kk,
                                int64_t n) {
    for (int64_t i = r0; i < r1; ++i) std::fill(c + i * n, c + (i + 1) * n, 0.0f);
    for (int64_t j0 = 0; j0 < n; j0 += kCols) {
        const int64_t cols = std::min(kCols, n - j0);
        for (int64_t k0 = 0; k0 < kk; k0 += kBlock) {
            const int64_t k1 = std::min(kk, k0 + kBlock);
            int64_t i = r0;
            if (cols == kCols) {
                static_assert(kRows == 6 && kCols == 32, "the tile below is written out for 6 x 32");
                for (; i + kRows <= r1; i += kRows) {
                    float *c0 = c + i * n + j0, *c1 = c0 + n, *c2 = c1 + n, *c3 = c2 + n, *c4 = c3 + n, *c5 = c4 + n;
                    V16 x0 = load16(c0), y0 = load16(c0 + 16), x1 = load16(c1), y1 = load16(c1 + 16);
                    V16 x2 = load16(c2), y2 = load16(c2 + 16), x3 = load16(c3), y3 = load16(c3 + 16);
                    V16 x4 = load16(c4), y4 = load16(c4 + 16), x5 = load16(c5), y5 = load16(c5 + 16);
                    const float *a0 = a + i * kk, *a1 = a0 + kk, *a2 = a1 + kk, *a3 = a2 + kk, *a4 = a3 + kk, *a5 = a4 + kk;
                    for (int64_t k = k0; k < k1; ++k) {
                        const V16 lo = load16(b + k * n + j0), hi = load16(b + k * n + j0 + 16);
                        x0 += a0[k] * lo, y0 += a0[k] * hi;  // a product, then a sum: no FMA
                        x1 += a1[k] * lo, y1 += a1[k] * hi;
                        x2 += a2[k] * lo, y2 += a2[k] * hi;
                        x3 += a3[k] * lo, y3 += a3[k] * hi;
                        x4 += a4[k] * lo, y4 += a4[k] * hi;
                        x5 += a5[k] * lo, y5 += a5[k] * hi;
                    }
                    store16(c0, x0), store16(c0 + 16, y0), store16(c1, x1), store16(c1 + 16, y1);
                    store16(c2, x2), store16(c2 + 16, y2), store16(c3, x3), store16(c3 + 16, y3);
                    store16(c4, x4), store16(c4 + 16, y4), store16(c5, x5), store16(c5 + 16, y5);
                }
            }
            for (; i < r1; ++i) {  // the rows (or columns) a tile does not fill, in the same order
                float *ci = c + i * n + j0;
                for (int64_t k = k0; k < k1; ++k) {
                    const float aik = a[i * kk + k];
                    const float *bk = b + k * n + j0;
#pragma omp simd
                    for (int64_t j = 0; j < cols; ++j) ci[j] += aik * bk[j];
                }
            }
        }
    }
}

}  // namespace

void matmul_ordered(const float *a, const float *b, float *c, int64_t m, int64_t kk, int64_t n, ThreadPool *pool) {
    const int threads = pool ? static_cast<int>(std::min<int64_t>(pool->size(), std::max<int64_t>(1, m / 8))) : 1;
    if (threads <= 1) {
        matmul_rows(a, b, c, 0, m, kk, n);
        return;
    }
    pool->run([&](int t) {
        if (t >= threads) return;
        matmul_rows(a, b, c, m * t / threads, m * (t + 1) / threads, kk, n);
    });
}

}  // namespace optim
}  // namespace sx
