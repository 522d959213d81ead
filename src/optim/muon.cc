// Muon's passes and its Newton-Schulz iterations (muon.h).
#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/half.h"
#include "optim/param_passes.h"
#include "optim/passes.h"

namespace sx {
namespace optim {
namespace {


inline float bf16(float x) { return half::bf16_to_f32(half::f32_to_bf16(x)); }

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

// x (rows x cols) transposed into t (cols x rows).
void transpose(const float *x, int64_t rows, int64_t cols, float *t) {
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = x[i * cols + j];
}

// out[i] = bf16(beta * in[i] + alpha * acc[i]) (torch's addmm of bf16 tensors, computed
// in fp32); beta 0: bf16(alpha * acc[i]).
void epilogue(const float *acc, const float *in, float alpha, float beta, float *out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = bf16(in ? beta * in[i] + alpha * acc[i] : alpha * acc[i]);
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

void muon_momentum(const Segment *segs, size_t num_segs, float grad_scale, float *const *updates,
                   double *grad_sumsq) {
    double gs = 0.0;
    for (size_t s = 0; s < num_segs; ++s) {
        const Segment &seg = segs[s];
        if (seg.n == 0) continue;
        const Hyper &h = *seg.hyper;
        const Lerp into_buf(1.0 - h.momentum), nesterov(h.momentum);
        float *buf = seg.state[0], *u = updates[s];
        for (size_t i = 0; i < seg.n; ++i) {
            const float g = seg.grad[i] * grad_scale;
            gs += static_cast<double>(g) * g;
            const float b = into_buf(buf[i], g);  // buf.lerp_(grad, 1 - momentum)
            buf[i] = b;
            u[i] = h.nesterov ? nesterov(g, b) : b;  // grad.lerp(buf, momentum)
        }
    }
    if (grad_sumsq) *grad_sumsq = gs;
}

void newton_schulz(const float *u, int64_t rows, int64_t cols, const Hyper &h, ThreadPool *pool, float *out) {
    // X = bf16(u), transposed to m x n with m <= n.
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
    std::vector<float> x(static_cast<size_t>(m * n)), xt(x.size()), gram(static_cast<size_t>(m * m)),
        acc(std::max(x.size(), gram.size())), upd(gram.size());
    if (tall)
        transpose(u, rows, cols, x.data());
    else
        std::copy(u, u + m * n, x.begin());
    for (float &v : x) v = bf16(v);
    // X.div_(X.norm().clamp(min=eps)): the norm in fp32 of the bf16 values, rounded to bf16.
    double sq = 0.0;
    for (float v : x) sq += static_cast<double>(v) * v;
    const float norm = std::max(bf16(static_cast<float>(std::sqrt(sq))), bf16(static_cast<float>(h.eps)));
    for (float &v : x) v = bf16(v / norm);
    const float a = static_cast<float>(h.ns_a), b = static_cast<float>(h.ns_b), c = static_cast<float>(h.ns_c);
    for (int step = 0; step < static_cast<int>(h.ns_steps); ++step) {
        transpose(x.data(), m, n, xt.data());
        matmul_ordered(x.data(), xt.data(), acc.data(), m, n, m, pool);  // X X^T
        epilogue(acc.data(), nullptr, 1.0f, 0.0f, gram.data(), m * m);
        matmul_ordered(gram.data(), gram.data(), acc.data(), m, m, m, pool);  // addmm(G, G, G, beta=b, alpha=c)
        epilogue(acc.data(), gram.data(), c, b, upd.data(), m * m);
        matmul_ordered(upd.data(), x.data(), acc.data(), m, m, n, pool);  // addmm(X, U, X, beta=a)
        epilogue(acc.data(), x.data(), 1.0f, a, x.data(), m * n);
    }
    if (tall)
        transpose(x.data(), m, n, out);
    else
        std::copy(x.begin(), x.end(), out);
}

double muon_adjusted_lr(const Hyper &h, int64_t rows, int64_t cols) {
    const double A = static_cast<double>(rows), B = static_cast<double>(cols);
    double ratio = std::sqrt(std::max(1.0, A / B));
    if (h.adjust_lr == SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW) ratio = 0.2 * std::sqrt(std::max(A, B));
    if (h.adjust_lr == SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED) ratio = std::sqrt(A / B);
    return h.lr * ratio;
}

void muon_apply(const Segment *segs, size_t num_segs, const float *const *orth, const double *adjusted_lr) {
    for (size_t s = 0; s < num_segs; ++s) {
        const Segment &seg = segs[s];
        if (seg.n == 0) continue;
        const Hyper &h = *seg.hyper;
        const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay), alpha = static_cast<float>(-adjusted_lr[s]);
        float *p = seg.param;
        const float *o = orth[s];
        for (size_t i = 0; i < seg.n; ++i) p[i] = p[i] * decay + alpha * o[i];  // mul_, then add_(O, alpha)
        if (seg.compute_out) half::from_f32(seg.compute_dtype, p, seg.compute_out, seg.n);
    }
}

namespace {

// Newton-Schulz's multiply-adds for a rows x cols matrix, per iteration (m <= n):
// X X^T (m m n), G G (m m m), U X (m m n).
double newton_schulz_cost(const std::vector<int64_t> &shape) {
    const double m = static_cast<double>(std::min(shape[0], shape[1]));
    const double n = static_cast<double>(std::max(shape[0], shape[1]));
    return m * m * (2.0 * n + m);
}

void orthogonalise(const float *u, const std::vector<int64_t> &shape, const Hyper &h, ThreadPool *pool, float *out) {
    newton_schulz(u, shape[0], shape[1], h, pool, out);
}

// The second pass, each segment's lr adjusted to its param's shape.
void apply_orthogonalised(const Segment *segs, size_t num_segs, const std::vector<int64_t> *const *shapes,
                          const float *const *orth) {
    std::vector<double> adjusted(num_segs);
    for (size_t s = 0; s < num_segs; ++s) adjusted[s] = muon_adjusted_lr(*segs[s].hyper, (*shapes[s])[0], (*shapes[s])[1]);
    muon_apply(segs, num_segs, orth, adjusted.data());
}

}  // namespace

const WholeParamUpdate kMuonUpdate = {"newton_schulz", muon_momentum, newton_schulz_cost, orthogonalise, apply_orthogonalised};

}  // namespace optim
}  // namespace sx
