// AdEMAMix (Pagliardini, Ablin and Grangier 2024, "The AdEMAMix Optimizer: Better,
// Faster, Older"), as pytorch-optimizer 4.1.0's AdEMAMix has it: Adam's fast moment
// (beta1) and second moment (beta2), plus a slow moment (beta3) added with weight alpha:
//   m = lerp(m, g, 1 - beta1); v = beta2*v + (1 - beta2)*g*g; s = lerp(s, g, 1 - beta3_t)
//   p -= lr * (m / bc1 + alpha_t*s) / (sqrt(v) / sqrt(bc2) + eps)
// with bc1 = 1 - beta1^t, bc2 = 1 - beta2^t at the param group's step t, and, when
// t_alpha_beta3 = T > 0, the paper's warmups alpha_t = min(t*alpha/T, alpha) and
//   beta3_t = min(exp(ln b1 * ln b3 / ((1 - t/T) ln b3 + (t/T) ln b1)), beta3)
// (T = 0 is pytorch-optimizer's None: alpha_t = alpha, beta3_t = beta3). Weight decay is
// L2 (grad += wd*p) or, with decoupled_weight_decay (its weight_decouple), p *= 1 - wd*lr.
//
// Its row is in optimizers.cc, its element body (every kernel's, CUDA's too) in
// elementwise.h (Variant::kAdemamix); here its per-segment constants and its scalar
// reference.
#include <algorithm>
#include <cmath>

#include "optim/kernels.h"
#include "optim/optimizer.h"

namespace sx {
namespace optim {
namespace internal {
namespace {

// pytorch-optimizer's schedule_alpha and schedule_beta3, in Python floats.
double alpha_at(const Hyper &h, double step) {
    return h.t_alpha_beta3 == 0.0 ? h.alpha : std::min(step * h.alpha / h.t_alpha_beta3, h.alpha);
}

double beta3_at(const Hyper &h, double step) {
    if (h.t_alpha_beta3 == 0.0) return h.beta3;
    const double log_beta1 = std::log(h.beta1), log_beta3 = std::log(h.beta3);
    const double frac = step / h.t_alpha_beta3;
    return std::min(std::exp(log_beta1 * log_beta3 / ((1.0 - frac) * log_beta3 + frac * log_beta1)), h.beta3);
}

}  // namespace

void consts_ademamix(const Segment &seg, const Hyper &h, SegmentConsts &c) {
    const double step = static_cast<double>(seg.step);
    c.variant = Variant::kAdemamix;
    set_decay(h, h.decoupled_weight_decay, &c);
    set_lerp(1.0 - h.beta1, &c);
    c.beta2 = static_cast<float>(h.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
    c.eps = static_cast<float>(h.eps);
    c.lr = static_cast<float>(h.lr);
    c.bias_correction1 = static_cast<float>(1.0 - std::pow(h.beta1, step));
    c.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, step)));
    lerp_weight(1.0 - beta3_at(h, step), &c.slow_lerp_coeff, &c.slow_lerp_from_end);
    c.slow_alpha = static_cast<float>(alpha_at(h, step));
}

// The reference, one tensor op at a time as pytorch-optimizer's non-foreach loop runs
// them (reference.cc says how each op rounds), written apart from the kernels' body.
void reference_ademamix(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const double step = static_cast<double>(seg.step);
    const float w1 = static_cast<float>(1.0 - h.beta1), w3 = static_cast<float>(1.0 - beta3_at(h, step));
    const float beta2 = static_cast<float>(h.beta2), one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
    const float bc1 = static_cast<float>(1.0 - std::pow(h.beta1, step));
    const float bc2_sq = static_cast<float>(std::sqrt(1.0 - std::pow(h.beta2, step)));
    const float eps = static_cast<float>(h.eps), alpha = static_cast<float>(alpha_at(h, step));
    const float neg_lr = static_cast<float>(-h.lr), wd = static_cast<float>(h.weight_decay);
    const float decay = static_cast<float>(1.0 - h.weight_decay * h.lr);
    const auto lerp = [](float self, float end, float weight) {
        return std::fabs(weight) < 0.5f ? self + weight * (end - self) : end - (end - self) * (1.0f - weight);
    };
    for (size_t i = 0; i < seg.n; ++i) {
        float g = seg.grad[i] * grad_scale;
        if (h.maximize) g = -g;
        float p = seg.param[i];
        if (h.weight_decay != 0.0) {
            if (h.decoupled_weight_decay)
                p = p * decay;
            else
                g = g + wd * p;
        }
        float &m = seg.state[0][i], &v = seg.state[1][i], &slow = seg.state[2][i];
        m = lerp(m, g, w1);
        v = v * beta2 + (one_minus_beta2 * g) * g;
        slow = lerp(slow, g, w3);
        const float denom = std::sqrt(v) / bc2_sq + eps;
        const float update = m / bc1 + alpha * slow;
        seg.param[i] = p + (neg_lr * update) / denom;
    }
}

}  // namespace internal
}  // namespace optim
}  // namespace sx
