// The scalar reference: torch.optim's single-tensor formulas (torch/optim/sgd.py
// _single_tensor_sgd, torch/optim/adam.py _single_tensor_adam) for fp32 tensors on the
// CPU, one element at a time, written independently of the kernels so that tests can
// hold the kernels to it.
//
// Where torch rounds: hyperparameter arithmetic happens in Python floats (double);
// each tensor op converts its scalar argument to float and rounds after every
// operation of its scalar formula:
//   add(other, alpha)        self + alpha*other
//   lerp_(end, weight)       |w| < 0.5 ? self + w*(end - self) : end - (end - self)*(1 - w)
//   addcmul_(t1, t2, value)  self + value*t1*t2, i.e. self + ((value*t1)*t2)
//   addcdiv_(t1, t2, value)  self + value*t1/t2, i.e. self + ((value*t1)/t2)
//   maximum(a, b)            NaN if either is NaN, else the larger
// torch's vectorised loops evaluate add-with-alpha and lerp with a fused multiply-add
// where the CPU has one, so torch itself differs by that rounding between CPUs; sx
// follows the unfused scalar formulas everywhere (this file builds with
// -ffp-contract=off).
#include <algorithm>
#include <cmath>
#include <limits>

#include "optim/optimizer.h"

namespace sx {
namespace optim {

int state_slots(const Hyper &h) {
    if (h.kind == Kind::kSgd) return h.momentum != 0.0 ? 1 : 0;
    return h.amsgrad ? 3 : 2;
}

const char *state_slot_name(const Hyper &h, int slot) {
    if (h.kind == Kind::kSgd) return "momentum_buffer";
    static const char *const kAdam[3] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return kAdam[slot];
}

namespace {

void reference_sgd(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const float wd = static_cast<float>(h.weight_decay);
    const float momentum = static_cast<float>(h.momentum);
    const float one_minus_dampening = static_cast<float>(1.0 - h.dampening);
    const float lr = static_cast<float>(h.lr);
    for (size_t i = 0; i < seg.n; ++i) {
        float g = seg.grad[i] * grad_scale;
        if (h.maximize) g = -g;
        const float p = seg.param[i];
        if (h.weight_decay != 0.0) g = g + wd * p;
        if (h.momentum != 0.0) {
            float &buf = seg.state[0][i];
            if (seg.step == 1)
                buf = g;  // the momentum buffer does not exist yet: buf = clone(grad)
            else
                buf = buf * momentum + one_minus_dampening * g;
            g = h.nesterov ? g + momentum * buf : buf;
        }
        seg.param[i] = p + (-lr) * g;
    }
}

void reference_adam(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const bool decoupled = h.kind == Kind::kAdamW;
    // step is a float32 tensor in torch; step.item() is an exact double for any
    // realistic count, and beta ** step is Python's pow(double, double).
    const double step = static_cast<double>(seg.step);
    const double bias_correction1 = 1.0 - std::pow(h.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
    const float neg_step_size = static_cast<float>(-(h.lr / bias_correction1));
    const float bc2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));
    const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
    const float wd = static_cast<float>(h.weight_decay);
    const float w = static_cast<float>(1.0 - h.beta1);
    const float beta2 = static_cast<float>(h.beta2);
    const float one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
    const float eps = static_cast<float>(h.eps);

    for (size_t i = 0; i < seg.n; ++i) {
        float g = seg.grad[i] * grad_scale;
        if (h.maximize) g = -g;
        float p = seg.param[i];
        if (h.weight_decay != 0.0) {
            if (decoupled)
                p = p * decay;
            else
                g = g + wd * p;
        }
        float &m = seg.state[0][i];
        float &v = seg.state[1][i];
        m = std::fabs(w) < 0.5f ? m + w * (g - m) : g - (g - m) * (1.0f - w);
        v = v * beta2 + (one_minus_beta2 * g) * g;
        float s = v;
        if (h.amsgrad) {
            float &vmax = seg.state[2][i];
            if (std::isnan(vmax) || std::isnan(v))
                vmax = std::numeric_limits<float>::quiet_NaN();
            else
                vmax = std::max(vmax, v);
            s = vmax;
        }
        const float denom = std::sqrt(s) / bc2_sqrt + eps;
        seg.param[i] = p + (neg_step_size * m) / denom;
    }
}

}  // namespace

void reference_update(const Segment &seg, float grad_scale) {
    if (seg.n == 0) return;
    if (seg.hyper->kind == Kind::kSgd)
        reference_sgd(seg, grad_scale);
    else
        reference_adam(seg, grad_scale);
}

}  // namespace optim
}  // namespace sx
