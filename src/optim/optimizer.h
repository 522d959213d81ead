// Optimizer math over one rank's shard: torch.optim's SGD, Adam and AdamW, as a plain
// scalar reference and as fused multi-threaded SIMD kernels (AVX2, AVX-512, chosen at
// run time). Knows nothing of communicators or layouts: it sees segments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace sx {
namespace optim {

class ThreadPool;

enum class Kind : int32_t { kSgd = SX_OPTIM_SGD, kAdam = SX_OPTIM_ADAM, kAdamW = SX_OPTIM_ADAMW };

// An SX_OPTIM_* value as torch names the optimizer ("SGD", "Adam", "AdamW"), or
// "optimizer N" for another value, for messages.
inline std::string optimizer_name(int32_t optimizer) {
    switch (optimizer) {
        case SX_OPTIM_SGD: return "SGD";
        case SX_OPTIM_ADAM: return "Adam";
        case SX_OPTIM_ADAMW: return "AdamW";
        default: return "optimizer " + std::to_string(optimizer);
    }
}
inline std::string optimizer_name(Kind kind) { return optimizer_name(static_cast<int32_t>(kind)); }

// Which optimizers a hyperparameter applies to.
enum class Applies : int32_t { kAll, kSgd, kAdam /* Adam and AdamW */ };

// Every hyperparameter, with torch.optim's names and meanings: the one table from which
// the param group descriptor's reading, the public keys (SX_HP_*), the ranks'
// agreement, the checkpoint's MANIFEST (writing, reading, validation) and `sxckpt`
// derive theirs. X(name, type, default, key, applies); `name` is also the member of
// sx_param_group_desc_t and of the MANIFEST's ParamGroup table. A new hyperparameter is
// a line here, its members there, and its use in the kernels.
#define SX_HYPERPARAMETERS(X)                                      \
    X(lr, double, 1e-3, SX_HP_LR, kAll)                            \
    X(weight_decay, double, 0.0, SX_HP_WEIGHT_DECAY, kAll)         \
    X(beta1, double, 0.9, SX_HP_BETA1, kAdam)                      \
    X(beta2, double, 0.999, SX_HP_BETA2, kAdam)                    \
    X(eps, double, 1e-8, SX_HP_EPS, kAdam)                         \
    X(momentum, double, 0.0, SX_HP_MOMENTUM, kSgd)                 \
    X(dampening, double, 0.0, SX_HP_DAMPENING, kSgd)               \
    X(nesterov, bool, false, SX_HP_NESTEROV, kSgd)                 \
    X(maximize, bool, false, SX_HP_MAXIMIZE, kAll)                 \
    X(amsgrad, bool, false, SX_HP_AMSGRAD, kAdam)

// The most steps a param (or a group) may count: 2^53, the last count a double holds
// exactly (the bias corrections raise betas to the step in double); a step a
// microsecond would take 285 years to reach it.
constexpr uint64_t kMaxSteps = 1ull << 53;

// The step counts a param may hold: 0 <= momentum_steps <= step <= kMaxSteps.
inline bool valid_steps(int64_t step, int64_t momentum_steps) {
    return momentum_steps >= 0 && momentum_steps <= step && static_cast<uint64_t>(step) <= kMaxSteps;
}

// An optimizer and its hyperparameters (one member per line of the table above).
struct Hyper {
    Kind kind = Kind::kAdamW;
#define SX_HYPER_MEMBER(name, type, dflt, key, applies) type name = dflt;
    SX_HYPERPARAMETERS(SX_HYPER_MEMBER)
#undef SX_HYPER_MEMBER
};

// Whether hyperparameter `applies` (a column of the table) applies to optimizer `kind`.
inline bool applies_to(Applies applies, Kind kind) {
    return applies == Applies::kAll || (applies == Applies::kSgd) == (kind == Kind::kSgd);
}

// Number of fp32 state slots the optimizer keeps per element:
// SGD: 1 if momentum != 0 (momentum_buffer) else 0; Adam/AdamW: 2 (exp_avg,
// exp_avg_sq), 3 with amsgrad (max_exp_avg_sq).
int state_slots(const Hyper &h);

// torch's name of state slot `slot` (< state_slots(h)): "momentum_buffer" (SGD);
// "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (Adam, AdamW).
const char *state_slot_name(const Hyper &h, int slot);

// A contiguous run of elements of one param inside this rank's shard, updated with
// that param's hyperparameters. state[i] points at slot i (nullptr where unused).
struct Segment {
    float *param = nullptr;
    const float *grad = nullptr;
    float *state[3] = {nullptr, nullptr, nullptr};
    size_t n = 0;
    const Hyper *hyper = nullptr;
    // The param's step count including this update (1 for its first update). Adam's
    // bias corrections use it; SGD initialises its momentum buffer to the gradient
    // when it is 1, as torch does when the buffer does not exist yet.
    int64_t step = 1;
    // Mixed precision: if set, the updated fp32 values (param, the master weights) are
    // also written here rounded to compute_dtype (SX_DTYPE_BF16 or SX_DTYPE_F16), n
    // of them, block by block while they are still in cache.
    uint16_t *compute_out = nullptr;
    int32_t compute_dtype = 0;
    // If set (host kernels only), the update zeroes these n floats as it reads each
    // gradient: `grad` itself, when the next backward adds into the same buffer, so that
    // the step needs no pass of its own to zero it.
    float *zero_grad = nullptr;
};

// Every element's gradient is used as grad[i] * grad_scale (the scale folds the average
// over ranks and the clipping coefficient into the update, so neither needs its own
// pass over memory).

// Reference: torch's single-tensor formulas, one element at a time, in double-free
// float arithmetic matching torch's fp32 CPU path.
void reference_update(const Segment &seg, float grad_scale);

enum class Isa { kAuto = 0, kScalar = 1, kAvx2 = 2, kAvx512 = 3 };

// The best ISA this CPU supports (AVX-512F, else AVX2+FMA, else scalar).
Isa detect_isa();
const char *isa_name(Isa isa);

// Fused update of all segments, split across the pool's threads by element count.
// isa kAuto picks detect_isa(); an ISA the CPU lacks falls back to the best it has.
// If sumsq is not null, it receives the sum over all elements of (grad*grad_scale)^2,
// computed in the same pass. Segments must not overlap.
// Every flavour gives, bit for bit, what reference_update gives for each segment (the
// kernels round where the reference rounds and never fuse a multiply-add into the
// update). A segment with n > 0 needs hyper and the first state_slots(*hyper) state
// pointers; one with n == 0 is skipped unread. pool may be null (the caller's thread
// does all the work); small updates use fewer threads than the pool has.
void fused_update(const Segment *segs, size_t num_segs, float grad_scale, ThreadPool *pool,
                  Isa isa, double *sumsq);

// Sum of squares of grad[i]*grad_scale over all segments' gradients (for the clipping
// pass), split across the pool, with the same ISA selection.
double sum_of_squares(const Segment *segs, size_t num_segs, float grad_scale, ThreadPool *pool,
                      Isa isa);

}  // namespace optim
}  // namespace sx
