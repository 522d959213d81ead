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

void newton_schulz(const float *u, int64_t rows, int64_t cols, const Hyper &h, ThreadPool *pool, float *out,
                   Gemm flavour) {
    // X = bf16(u), transposed to m x n with m <= n.
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
    std::vector<float> x(static_cast<size_t>(m * n)), gram(static_cast<size_t>(m * m)),
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
        gemm_abt(flavour, x.data(), x.data(), acc.data(), m, n, m, pool);  // X X^T
        epilogue(acc.data(), nullptr, 1.0f, 0.0f, gram.data(), m * m);
        gemm_ab(flavour, gram.data(), gram.data(), acc.data(), m, m, m, pool);  // addmm(G, G, G, beta=b, alpha=c)
        epilogue(acc.data(), gram.data(), c, b, upd.data(), m * m);
        gemm_ab(flavour, upd.data(), x.data(), acc.data(), m, m, n, pool);  // addmm(X, U, X, beta=a)
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
