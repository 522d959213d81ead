// The element formulas of the elementwise optimizers beyond SGD and Adam (Adagrad,
// RMSprop, Adamax, NAdam, RAdam, Lion, AdEMAMix, and Adam of 8-bit state), written once over a vector-operations type O and
// used by every flavour: the CPU loops of kernel_body.h (scalar, AVX2, AVX-512) and the
// CUDA kernel (cuda/fused_update.cu, whose O rounds through __fmul_rn and its kin).
//
// Each formula is torch's single-tensor function (torch/optim/<name>.py,
// _single_tensor_<name>; lion-pytorch 0.2.5's update_fn for Lion), operation for
// operation, rounding where each tensor op rounds (reference.cc lists the ops' scalar
// formulas): so every flavour gives reference_update()'s result bit for bit.
//
// O provides, besides kernel_body.h's operations: abs (|x|), sign ((x > 0) - (x < 0),
// 0 for 0 and NaN, as torch's vectorised sgn) and recip (1/x, torch.reciprocal).
#pragma once

#include "optim/kernels.h"

#if defined(__CUDACC__)
#define SX_ELEMENTWISE_FN __host__ __device__ __forceinline__
#else
#define SX_ELEMENTWISE_FN inline
#endif

namespace sx {
namespace optim {
namespace internal {

// SegmentConsts broadcast into O's vectors, once per piece of a segment.
template <class O>
struct ElementwiseConsts {
    using V = typename O::V;
    V grad_scale, weight_decay, decay, lr, momentum, lerp_coeff, beta1, one_minus_beta1, beta2, one_minus_beta2,
        step_size, eps, init, bias_correction1, bias_correction2, bias_correction2_sqrt, rect, grad_coeff, avg_coeff,
        slow_lerp_coeff, slow_alpha, lr_wd, sq_lerp_coeff;
    typename O::Mask lerp_from_end, slow_lerp_from_end, sq_lerp_from_end;
    SX_ELEMENTWISE_FN explicit ElementwiseConsts(const SegmentConsts &c)
        : grad_scale(O::set1(c.grad_scale)), weight_decay(O::set1(c.weight_decay)), decay(O::set1(c.decay)),
          lr(O::set1(c.lr)), momentum(O::set1(c.momentum)), lerp_coeff(O::set1(c.lerp_coeff)),
          beta1(O::set1(c.beta1)), one_minus_beta1(O::set1(c.one_minus_beta1)), beta2(O::set1(c.beta2)),
          one_minus_beta2(O::set1(c.one_minus_beta2)), step_size(O::set1(c.step_size)), eps(O::set1(c.eps)),
          init(O::set1(c.init)), bias_correction1(O::set1(c.bias_correction1)),
          bias_correction2(O::set1(c.bias_correction2)), bias_correction2_sqrt(O::set1(c.bias_correction2_sqrt)),
          rect(O::set1(c.rect)), grad_coeff(O::set1(c.grad_coeff)), avg_coeff(O::set1(c.avg_coeff)),
          slow_lerp_coeff(O::set1(c.slow_lerp_coeff)), slow_alpha(O::set1(c.slow_alpha)), lr_wd(O::set1(c.lr_wd)),
          sq_lerp_coeff(O::set1(c.sq_lerp_coeff)), lerp_from_end(O::mask(c.lerp_from_end)),
          slow_lerp_from_end(O::mask(c.slow_lerp_from_end)), sq_lerp_from_end(O::mask(c.sq_lerp_from_end)) {}
};

// State slots variant v reads, and writes (SX_ELEMENTWISE_VARIANTS).
SX_ELEMENTWISE_FN constexpr int elementwise_reads(Variant v) {
#define SX_READS(variant, reads, writes) v == Variant::variant ? reads:
    return SX_ELEMENTWISE_VARIANTS(SX_READS) 1;
#undef SX_READS
}
SX_ELEMENTWISE_FN constexpr int elementwise_writes(Variant v) {
#define SX_WRITES(variant, reads, writes) v == Variant::variant ? writes:
    return SX_ELEMENTWISE_VARIANTS(SX_WRITES) 1;
#undef SX_WRITES
}

// self.lerp_(end, w) as torch evaluates it (SegmentConsts: lerp_coeff, lerp_from_end),
// for a weight of coefficient `coeff` and mask `from_end`.
template <class O>
SX_ELEMENTWISE_FN typename O::V lerp_with(typename O::V coeff, typename O::Mask from_end, typename O::V self,
                                          typename O::V end) {
    return O::add(O::select(from_end, self, end), O::mul(coeff, O::sub(end, self)));
}
template <class O>
SX_ELEMENTWISE_FN typename O::V lerp(const ElementwiseConsts<O> &k, typename O::V self, typename O::V end) {
    return lerp_with<O>(k.lerp_coeff, k.lerp_from_end, self, end);
}

// AdEMAMix (optim/ademamix.cc), pytorch-optimizer's AdEMAMix.step (not foreach):
// weight decay, three moments, one addcdiv_. As elementwise_at's arguments.
template <class O, bool kL2>
SX_ELEMENTWISE_FN void ademamix_at(const ElementwiseConsts<O> &k, typename O::V &p, typename O::V g,
                                   typename O::V *s) {
    using V = typename O::V;
    p = O::mul(p, k.decay);  // weight_decouple: p.mul_(1 - wd*lr); 1 otherwise (exact no-op)
    if (kL2) g = O::add(g, O::mul(k.weight_decay, p));  // grad.add_(p, alpha=wd)
    const V m = lerp<O>(k, s[0], g);  // exp_avg.lerp_(grad, 1 - beta1)
    s[0] = m;
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    const V v = O::add(O::mul(s[1], k.beta2), O::mul(O::mul(k.one_minus_beta2, g), g));
    s[1] = v;
    const V slow = lerp_with<O>(k.slow_lerp_coeff, k.slow_lerp_from_end, s[2], g);  // lerp_(grad, 1 - beta3_t)
    s[2] = slow;
    // de_nom = exp_avg_sq.sqrt().div_(bias_correction2_sq).add_(eps)
    const V denom = O::add(O::div(O::sqrt(v), k.bias_correction2_sqrt), k.eps);
    // update = exp_avg.div(bias_correction1).add_(exp_avg_slow, alpha=alpha_t)
    const V update = O::add(O::div(m, k.bias_correction1), O::mul(k.slow_alpha, slow));
    p = O::sub(p, O::div(O::mul(k.lr, update), denom));  // p.addcdiv_(update, de_nom, value=-lr)
}

// Adam and AdamW of an 8-bit group: torchao 0.18's single_param_adam
// (torchao/optim/adam.py) as its compiled CPU kernel rounds it, one operation at a time,
// no fused multiply-add (kL2: Adam, whose weight decay is always added to the gradient;
// else AdamW, whose decay always scales the param). The moments are used unquantized.
template <class O, bool kL2, bool kAmsgrad>
SX_ELEMENTWISE_FN void adam8_at(const ElementwiseConsts<O> &k, typename O::V &p, typename O::V g, typename O::V *s) {
    using V = typename O::V;
    if (kL2)
        g = O::add(g, O::mul(k.weight_decay, p));  // grad_f32 + weight_decay * p_f32
    else
        p = O::sub(p, O::mul(k.lr_wd, p));  // p_f32 - lr * weight_decay * p_f32
    const V m = lerp<O>(k, s[0], g);  // exp_avg.float().lerp(grad_f32, 1 - beta1)
    s[0] = m;
    V v = lerp_with<O>(k.sq_lerp_coeff, k.sq_lerp_from_end, s[1], O::mul(g, g));  // .lerp(grad.square(), 1 - beta2)
    s[1] = v;
    if (kAmsgrad) {  // torch.maximum(max_exp_avg_sq.float(), exp_avg_sq_f32)
        v = O::maximum(s[2], v);
        s[2] = v;
    }
    // denom = (v.sqrt() / bias_correction2.sqrt()) + eps; p - lr * (m / bias_correction1) / denom
    const V denom = O::add(O::div(O::sqrt(v), k.bias_correction2_sqrt), k.eps);
    p = O::sub(p, O::div(O::mul(k.lr, O::div(m, k.bias_correction1)), denom));
}

// One element: p the param (fp32), g the gradient already scaled (grad*grad_scale,
// maximize in its sign), s the state slots (s[0..reads) read, s[0..writes) written).
// kL2: weight_decay added to the gradient (grad.add(param, alpha=weight_decay)).
template <class O, Variant kV, bool kL2>
SX_ELEMENTWISE_FN void elementwise_at(const ElementwiseConsts<O> &k, typename O::V &p, typename O::V g,
                                      typename O::V *s) {
    using V = typename O::V;
    if (kV == Variant::kAdagradFirst || kV == Variant::kAdagrad) {
        if (kL2) g = O::add(g, O::mul(k.weight_decay, p));
        // state_sum.addcmul_(grad, grad, value=1); std = state_sum.sqrt().add_(eps)
        const V sum = O::add(kV == Variant::kAdagradFirst ? k.init : s[0], O::mul(g, g));
        s[0] = sum;
        const V std = O::add(O::sqrt(sum), k.eps);
        p = O::sub(p, O::div(O::mul(k.step_size, g), std));  // param.addcdiv_(grad, std, value=-clr)
    } else if (kV == Variant::kRmsprop || kV == Variant::kRmspropMomentum || kV == Variant::kRmspropCentered ||
               kV == Variant::kRmspropCenteredMomentum) {
        constexpr bool kMomentum = kV == Variant::kRmspropMomentum || kV == Variant::kRmspropCenteredMomentum;
        constexpr bool kCentered = kV == Variant::kRmspropCentered || kV == Variant::kRmspropCenteredMomentum;
        if (kL2) g = O::add(g, O::mul(k.weight_decay, p));
        // square_avg.mul_(alpha).addcmul_(grad, grad, value=1 - alpha)
        const V sq = O::add(O::mul(s[0], k.beta2), O::mul(O::mul(k.one_minus_beta2, g), g));
        s[0] = sq;
        V avg;
        if (kCentered) {
            V &grad_avg = s[kMomentum ? 2 : 1];
            grad_avg = lerp<O>(k, grad_avg, g);  // grad_avg.lerp_(grad, 1 - alpha)
            // square_avg.addcmul(grad_avg, grad_avg, value=-1).sqrt_()
            avg = O::sqrt(O::sub(sq, O::mul(grad_avg, grad_avg)));
        } else {
            avg = O::sqrt(sq);
        }
        avg = O::add(avg, k.eps);
        if (kMomentum) {
            const V buf = O::add(O::mul(s[1], k.momentum), O::div(g, avg));  // buf.mul_(m).addcdiv_(grad, avg)
            s[1] = buf;
            p = O::sub(p, O::mul(k.lr, buf));  // param.add_(buf, alpha=-lr)
        } else {
            p = O::sub(p, O::div(O::mul(k.lr, g), avg));  // param.addcdiv_(grad, avg, value=-lr)
        }
    } else if (kV == Variant::kAdamax) {
        if (kL2) g = O::add(g, O::mul(k.weight_decay, p));
        const V m = lerp<O>(k, s[0], g);  // exp_avg.lerp_(grad, 1 - beta1)
        s[0] = m;
        // torch.maximum(exp_inf.mul_(beta2), grad.abs().add_(eps), out=exp_inf)
        const V u = O::maximum(O::mul(s[1], k.beta2), O::add(O::abs(g), k.eps));
        s[1] = u;
        p = O::sub(p, O::div(O::mul(k.step_size, m), u));  // param.addcdiv_(exp_avg, exp_inf, value=-clr)
    } else if (kV == Variant::kNadam || kV == Variant::kRadam || kV == Variant::kRadamRectified) {
        p = O::mul(p, k.decay);  // decoupled: param.mul_(1 - lr*wd); 1 otherwise (exact no-op)
        if (kL2) g = O::add(g, O::mul(k.weight_decay, p));
        const V m = lerp<O>(k, s[0], g);
        s[0] = m;
        const V v = O::add(O::mul(s[1], k.beta2), O::mul(O::mul(k.one_minus_beta2, g), g));
        s[1] = v;
        if (kV == Variant::kNadam) {
            // denom = exp_avg_sq.div(bias_correction2).sqrt().add_(eps); two addcdiv_
            const V denom = O::add(O::sqrt(O::div(v, k.bias_correction2)), k.eps);
            p = O::add(p, O::div(O::mul(k.grad_coeff, g), denom));
            p = O::add(p, O::div(O::mul(k.avg_coeff, m), denom));
        } else {
            const V corrected = O::div(m, k.bias_correction1);  // exp_avg / bias_correction1
            if (kV == Variant::kRadamRectified) {
                // (bias_correction2 ** 0.5) / exp_avg_sq.sqrt().add_(eps) is Tensor.__rtruediv__:
                // reciprocal() * (bias_correction2 ** 0.5); then ((corrected*lr)*adaptive)*rect.
                const V adaptive = O::mul(O::recip(O::add(O::sqrt(v), k.eps)), k.bias_correction2_sqrt);
                p = O::sub(p, O::mul(O::mul(O::mul(corrected, k.lr), adaptive), k.rect));
            } else {
                p = O::sub(p, O::mul(corrected, k.lr));  // param.add_(corrected * lr, alpha=-1.0)
            }
        }
    } else if (kV == Variant::kLion) {
        p = O::mul(p, k.decay);  // p.data.mul_(1 - lr*wd)
        // exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sgn_()
        const V update = O::sign(O::add(O::mul(s[0], k.beta1), O::mul(k.one_minus_beta1, g)));
        p = O::sub(p, O::mul(k.lr, update));  // p.add_(update, alpha=-lr)
        s[0] = O::add(O::mul(s[0], k.beta2), O::mul(k.one_minus_beta2, g));  // exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)
    } else if (kV == Variant::kAdemamix) {
        ademamix_at<O, kL2>(k, p, g, s);
    } else if (kV == Variant::kAdam8 || kV == Variant::kAdam8Amsgrad) {
        adam8_at<O, kL2, kV == Variant::kAdam8Amsgrad>(k, p, g, s);
    }
}

}  // namespace internal
}  // namespace optim
}  // namespace sx
