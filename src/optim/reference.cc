// The scalar reference: torch.optim's single-tensor formulas (torch/optim/<name>.py,
// _single_tensor_<name>, of torch 2.x; lion-pytorch's update_fn for Lion) for fp32
// tensors on the CPU, one element at a time, written independently of the kernels so that tests can
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
//   t / s (s a Python float) self / float(s)
//   s / t                    Tensor.__rtruediv__: t.reciprocal() * s
// torch's vectorised loops evaluate add-with-alpha and lerp with a fused multiply-add
// where the CPU has one, so torch itself differs by that rounding between CPUs; sx
// follows the unfused scalar formulas everywhere (this file builds with
// -ffp-contract=off).
#include <algorithm>
#include <cmath>
#include <limits>

#include <vector>

#include "base/half.h"
#include "optim/kernels.h"
#include "optim/optimizer.h"
#include "optim/state_codec.h"

namespace sx {
namespace optim {
namespace internal {

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

void reference_adam8(const Segment &seg, float grad_scale);

void reference_adam(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    if (h.state_dtype == SX_STATE_8BIT) return reference_adam8(seg, grad_scale);
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

namespace {

// exp_avg.lerp_(grad, weight) with a float weight, as torch evaluates it.
float lerp(float self, float end, float weight) {
    return std::fabs(weight) < 0.5f ? self + weight * (end - self) : end - (end - self) * (1.0f - weight);
}

// torch.maximum: NaN if either is NaN, else the larger.
float maximum(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<float>::quiet_NaN();
    return std::max(a, b);
}

// The gradient of element i as the update uses it: scaled, negated for maximize.
float grad_at(const Segment &seg, size_t i, float grad_scale) {
    const float g = seg.grad[i] * grad_scale;
    return seg.hyper->maximize ? -g : g;
}

}  // namespace

// Adam and AdamW of an 8-bit group: torchao 0.18's single_param_adam
// (torchao/optim/adam.py) as inductor compiles it for the CPU: fp32 throughout, lr an
// fp32 tensor, the Python floats rounded to fp32 where they meet a tensor, each
// operation rounded, no fused multiply-add, the bias corrections 1 - powf(beta, step)
// with the step an fp32 tensor. Weight decay applies even when it is 0 (Adam adds
// 0 * p to the gradient; AdamW subtracts 0 * p), as there.
void reference_adam8(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const float lr = static_cast<float>(h.lr), wd = static_cast<float>(h.weight_decay);
    const float t = static_cast<float>(seg.step);
    const float bc1 = 1.0f - powf(static_cast<float>(h.beta1), t);
    const float bc2 = 1.0f - powf(static_cast<float>(h.beta2), t);
    const float w1 = static_cast<float>(1.0 - h.beta1), w2 = static_cast<float>(1.0 - h.beta2);
    const float eps = static_cast<float>(h.eps);
    for (size_t i = 0; i < seg.n; ++i) {
        float g = grad_at(seg, i, grad_scale);
        float p = seg.param[i];
        if (h.kind == Kind::kAdamW)
            p = p - (lr * wd) * p;
        else
            g = g + wd * p;
        float &m = seg.state[0][i];
        float &v = seg.state[1][i];
        m = lerp(m, g, w1);
        v = lerp(v, g * g, w2);
        float s = v;
        if (h.amsgrad) {
            seg.state[2][i] = maximum(seg.state[2][i], v);
            s = seg.state[2][i];
        }
        const float denom = sqrtf(s) / sqrtf(bc2) + eps;
        seg.param[i] = p - (lr * (m / bc1)) / denom;
    }
}

// torch/optim/adagrad.py, _single_tensor_adagrad (dense gradients).
void reference_adagrad(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const double clr = h.lr / (1.0 + (static_cast<double>(seg.step) - 1.0) * h.lr_decay);
    const float neg_clr = static_cast<float>(-clr);
    const float wd = static_cast<float>(h.weight_decay);
    const float eps = static_cast<float>(h.eps);
    for (size_t i = 0; i < seg.n; ++i) {
        float g = grad_at(seg, i, grad_scale);
        if (h.weight_decay != 0.0) g = g + wd * seg.param[i];
        float &sum = seg.state[0][i];
        if (seg.step == 1) sum = static_cast<float>(h.initial_accumulator_value);  // torch.full_like(p, init)
        sum = sum + (1.0f * g) * g;
        const float std_ = std::sqrt(sum) + eps;
        seg.param[i] = seg.param[i] + (neg_clr * g) / std_;
    }
}

// torch/optim/rmsprop.py, _single_tensor_rmsprop. Slots: square_avg, then
// momentum_buffer if momentum > 0, then grad_avg if centered.
void reference_rmsprop(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const float alpha = static_cast<float>(h.alpha);
    const float one_minus_alpha = static_cast<float>(1.0 - h.alpha);
    const float eps = static_cast<float>(h.eps);
    const float wd = static_cast<float>(h.weight_decay);
    const float momentum = static_cast<float>(h.momentum);
    const float neg_lr = static_cast<float>(-h.lr);
    float *buf = h.momentum > 0 ? seg.state[1] : nullptr;
    float *grad_avg = h.centered ? seg.state[h.momentum > 0 ? 2 : 1] : nullptr;
    for (size_t i = 0; i < seg.n; ++i) {
        float g = grad_at(seg, i, grad_scale);
        if (h.weight_decay != 0.0) g = g + wd * seg.param[i];
        float &sq = seg.state[0][i];
        sq = sq * alpha + (one_minus_alpha * g) * g;
        float avg;
        if (grad_avg) {
            grad_avg[i] = lerp(grad_avg[i], g, one_minus_alpha);
            avg = std::sqrt(sq + (-1.0f * grad_avg[i]) * grad_avg[i]);
        } else {
            avg = std::sqrt(sq);
        }
        avg = avg + eps;
        if (buf) {
            buf[i] = buf[i] * momentum + (1.0f * g) / avg;
            seg.param[i] = seg.param[i] + neg_lr * buf[i];
        } else {
            seg.param[i] = seg.param[i] + (neg_lr * g) / avg;
        }
    }
}

// torch/optim/adamax.py, _single_tensor_adamax.
void reference_adamax(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const double clr = h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(seg.step)));
    const float neg_clr = static_cast<float>(-clr);
    const float w = static_cast<float>(1.0 - h.beta1);
    const float beta2 = static_cast<float>(h.beta2);
    const float eps = static_cast<float>(h.eps);
    const float wd = static_cast<float>(h.weight_decay);
    for (size_t i = 0; i < seg.n; ++i) {
        float g = grad_at(seg, i, grad_scale);
        if (h.weight_decay != 0.0) g = g + wd * seg.param[i];
        float &m = seg.state[0][i];
        float &u = seg.state[1][i];
        m = lerp(m, g, w);
        u = maximum(u * beta2, std::fabs(g) + eps);
        seg.param[i] = seg.param[i] + (neg_clr * m) / u;
    }
}

// torch/optim/nadam.py and radam.py: the part they share with Adam (weight decay, the
// two moments). Returns the param after decoupled decay; g gets L2 decay.
static float nadam_radam_moments(const Segment &seg, size_t i, float grad_scale, float *g_out) {
    const Hyper &h = *seg.hyper;
    float g = grad_at(seg, i, grad_scale);
    float p = seg.param[i];
    if (h.weight_decay != 0.0) {
        if (h.decoupled_weight_decay)
            p = p * static_cast<float>(1.0 - h.lr * h.weight_decay);
        else
            g = g + static_cast<float>(h.weight_decay) * p;
    }
    float &m = seg.state[0][i];
    float &v = seg.state[1][i];
    m = lerp(m, g, static_cast<float>(1.0 - h.beta1));
    v = v * static_cast<float>(h.beta2) + (static_cast<float>(1.0 - h.beta2) * g) * g;
    *g_out = g;
    return p;
}

// torch/optim/nadam.py, _single_tensor_nadam (not capturable): seg.mu_product is the
// param's product including this update's mu.
void reference_nadam(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const double step = static_cast<double>(seg.step);
    const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
    const double mu = h.beta1 * (1.0 - 0.5 * std::pow(0.96, step * h.momentum_decay));
    const double mu_next = h.beta1 * (1.0 - 0.5 * std::pow(0.96, (step + 1.0) * h.momentum_decay));
    const double mu_product = seg.mu_product;
    const double mu_product_next = mu_product * mu_next;
    const float grad_value = static_cast<float>(-h.lr * (1.0 - mu) / (1.0 - mu_product));
    const float avg_value = static_cast<float>((-h.lr * mu_next) / (1.0 - mu_product_next));
    const float bc2 = static_cast<float>(bias_correction2);
    const float eps = static_cast<float>(h.eps);
    for (size_t i = 0; i < seg.n; ++i) {
        float g;
        float p = nadam_radam_moments(seg, i, grad_scale, &g);
        const float denom = std::sqrt(seg.state[1][i] / bc2) + eps;
        p = p + (grad_value * g) / denom;
        p = p + (avg_value * seg.state[0][i]) / denom;
        seg.param[i] = p;
    }
}

// torch/optim/radam.py, _single_tensor_radam (not capturable).
void reference_radam(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const double step = static_cast<double>(seg.step);
    const double bias_correction1 = 1.0 - std::pow(h.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
    const double rho_inf = 2.0 / (1.0 - h.beta2) - 1.0;
    const double rho_t = rho_inf - 2.0 * step * std::pow(h.beta2, step) / bias_correction2;
    const float bc1 = static_cast<float>(bias_correction1);
    const float lr = static_cast<float>(h.lr);
    const float eps = static_cast<float>(h.eps);
    const float bc2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));
    const float rect = static_cast<float>(
        std::pow((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t), 0.5));
    for (size_t i = 0; i < seg.n; ++i) {
        float g;
        float p = nadam_radam_moments(seg, i, grad_scale, &g);
        const float corrected = seg.state[0][i] / bc1;
        if (rho_t > 5.0) {
            const float adaptive = (1.0f / (std::sqrt(seg.state[1][i]) + eps)) * bc2_sqrt;
            p = p + -1.0f * (((corrected * lr) * adaptive) * rect);
        } else {
            p = p + -1.0f * (corrected * lr);
        }
        seg.param[i] = p;
    }
}

// lion-pytorch 0.2.5, lion_pytorch.py's update_fn (sgn_ as torch's vectorised sgn: 0
// for zeros and NaN).
void reference_lion(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    const float decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
    const float beta1 = static_cast<float>(h.beta1), one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
    const float beta2 = static_cast<float>(h.beta2), one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
    const float neg_lr = static_cast<float>(-h.lr);
    for (size_t i = 0; i < seg.n; ++i) {
        const float g = grad_at(seg, i, grad_scale);
        float &m = seg.state[0][i];
        const float p = seg.param[i] * decay;
        const float c = m * beta1 + one_minus_beta1 * g;
        const float update = c > 0.0f ? 1.0f : (c < 0.0f ? -1.0f : 0.0f);
        seg.param[i] = p + neg_lr * update;
        m = m * beta2 + one_minus_beta2 * g;
    }
}

// Not elementwise: lamb.h, muon.h and adafactor.h have their own references.
void reference_not_elementwise(const Segment &, float) {}

}  // namespace internal

namespace {

// A segment of packed slots (state_codec.h): the whole segment's slots decoded into fp32,
// the fp32 reference run over it, the slots encoded again (bf16 rounded to nearest even;
// 8 bits a block at a time).
void reference_packed(const Segment &seg, float grad_scale) {
    const int slots = state_slots(*seg.hyper);
    std::vector<float> values[kMaxStateSlots];
    Segment wide = seg;
    wide.state_dtype = SX_STATE_FP32;
    for (int j = 0; j < slots; ++j) {
        values[j].resize(seg.n);
        const float *map = state_slot_nonnegative(*seg.hyper, j) ? kUnsignedMap : kSignedMap;
        for (size_t i = 0; i < seg.n; ++i)
            values[j][i] = seg.state_dtype == SX_STATE_BF16 ? half::bf16_to_f32(seg.state16[j][i])
                                                            : map[seg.codes[j][i]] * seg.scales[j][i / kQuantBlock];
        wide.state[j] = values[j].data();
    }
    reference_update(wide, grad_scale);
    for (int j = 0; j < slots; ++j) {
        const float *map = state_slot_nonnegative(*seg.hyper, j) ? kUnsignedMap : kSignedMap;
        if (seg.state_dtype == SX_STATE_BF16) {
            for (size_t i = 0; i < seg.n; ++i) seg.state16[j][i] = half::f32_to_bf16(values[j][i]);
        } else {
            for (size_t b = 0; b < seg.n; b += kQuantBlock)
                seg.scales[j][b / kQuantBlock] = encode_block(values[j].data() + b, std::min(kQuantBlock, seg.n - b),
                                                              map, seg.codes[j] + b);
        }
    }
}

}  // namespace

void reference_update(const Segment &seg, float grad_scale) {
    if (seg.n == 0) return;
    if (seg.state_dtype != SX_STATE_FP32) return reference_packed(seg, grad_scale);
    switch (seg.hyper->kind) {
#define SX_REFERENCE_CASE(kind, value, stem) \
    case Kind::kind: return internal::reference_##stem(seg, grad_scale);
        SX_BUILTIN_OPTIMIZERS(SX_REFERENCE_CASE)
#undef SX_REFERENCE_CASE
    }
}

}  // namespace optim
}  // namespace sx
