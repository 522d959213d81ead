// LAMB (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in
// 76 minutes"), as pytorch-optimizer 4.1.0's Lamb computes it: Adam's direction, scaled
// per param by a trust ratio from the norms of the whole param and of its direction.
//
// The options followed are Lamb's defaults but one: grad_averaging (the first moment
// adds (1 - beta1) * g), adam_debias off (so the step size is lr / (1 - beta1^t), t the
// param group's step count, which goes on while a param is frozen: the group's
// ParamGroup::steps, not the param's), no rectification, adam off (the trust ratio is
// used), pre_norm off (sx's own clipping does that job), norms clamped at Lamb.clamp =
// 10; its weight_decouple is decoupled_weight_decay (on by default: p *= 1 - lr * wd
// before the norms; off: wd * p added to the direction). Per element, in fp32 as torch's
// ops round:
//
//   m = m * beta1 + (1 - beta1) * g          v = v * beta2 + (1 - beta2) * g * g
//   p = p * (1 - lr * wd)                    (decoupled)
//   u = m / (sqrt(v) + eps)                  (+ wd * p without decoupling)
// and per param, over all its elements:
//   wn = min(||p||, 10), un = ||u||, trust = (wn == 0 or un == 0) ? 1 : wn / (un + eps)
//   p = p - (lr / (1 - beta1^t)) * trust * u
//
// A param's pieces lie on several ranks, so a step runs lamb_first_pass over this rank's
// segments (the moments and the decay written, and each segment's sums of p^2 and u^2),
// adds the sums over the ranks that hold the param's pieces (the step's one exchange for
// all such params), and runs lamb_second_pass with each param's factor (-step_size * trust),
// recomputing u from the stored moments: the same fp32 operations on the same values,
// so the same u, bit for bit.
#pragma once

#include <cstddef>

#include "optim/optimizer.h"

namespace sx {
namespace optim {

class ThreadPool;

// A segment's partial sums over its elements, in double: of the (decayed) param's
// squares and of the direction's squares.
struct LambSums {
    double param = 0.0;
    double update = 0.0;
};

// The constants of one param group's step, each a Python float rounded to fp32 where a
// tensor op takes it (grad_scale negated under maximize; decay 1 without decoupled decay;
// l2: the decay added to the direction instead).
struct LambConsts {
    float grad_scale, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, weight_decay;
    bool l2;
};
LambConsts lamb_consts(const Hyper &h, float grad_scale);

// The first pass over every segment (hyper->kind == kLamb, n > 0 or skipped): moments and
// the decoupled decay written, sums[s] the sums of segment s (in an order that does not
// depend on the pool's size), *grad_sumsq (if not null) the sum of (grad*grad_scale)^2.
// Every segment's param, grad and two state slots are read; the gradient is not zeroed.
void lamb_first_pass(const Segment *segs, size_t num_segs, float grad_scale, ThreadPool *pool, LambSums *sums,
                     double *grad_sumsq);

// The factor a param's direction is added with (-step_size * trust) at its group's step
// `step` (1 for the first), from the whole param's sums (LambSums added over every
// rank's piece), in fp32 as torch computes it.
float lamb_factor(const Hyper &h, int64_t step, const LambSums &whole);

// The second pass: p += factors[s] * u over segment s, u recomputed from its moments;
// 16-bit params (compute_out) rounded from the result.
void lamb_second_pass(const Segment *segs, size_t num_segs, const float *factors, ThreadPool *pool);

// Reference: the whole param in one segment (its own sums; seg.step is the group's
// step), one element at a time.
void lamb_reference(const Segment &seg, float grad_scale);

}  // namespace optim
}  // namespace sx
