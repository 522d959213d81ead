// Internal interface of the optimizer kernels: what dispatch.cc hands to a kernel
// flavour (kernels_scalar.cc, kernels_avx2.cc, kernels_avx512.cc, all behind the same
// KernelTable), and how work is split across threads. Tests and benchmarks use it to
// reach one flavour or one split directly; nothing outside optim/ needs it otherwise.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "optim/optimizer.h"

// The SIMD flavours exist on x86-64 only; elsewhere the scalar one runs.
#if defined(__x86_64__)
#define SX_OPTIM_X86 1
#else
#define SX_OPTIM_X86 0
#endif

namespace sx {
namespace optim {
namespace internal {

// The specialisations elementwise.h's bodies run, one line each: X(variant, state slots
// read, state slots written; a first update writes what it does not read). Every switch
// over them (kernel_body.h's, cuda/fused_update.cu's) expands from this list.
#define SX_ELEMENTWISE_VARIANTS(X)                                                          \
    X(kAdagradFirst, 0, 1) /* a param's first update: its sum starts at initial_accumulator_value */ \
    X(kAdagrad, 1, 1)                                                                       \
    X(kRmsprop, 1, 1)                 /* square_avg */                                      \
    X(kRmspropMomentum, 2, 2)         /* square_avg, momentum_buffer */                     \
    X(kRmspropCentered, 2, 2)         /* square_avg, grad_avg */                            \
    X(kRmspropCenteredMomentum, 3, 3) /* square_avg, momentum_buffer, grad_avg */           \
    X(kAdamax, 2, 2)                                                                        \
    X(kNadam, 2, 2)                                                                         \
    X(kRadam, 2, 2)          /* while the variance is not tractable (rho_t <= 5) */         \
    X(kRadamRectified, 2, 2) /* with the rectification term */                              \
    X(kLion, 1, 1)                                                                          \
    X(kAdemamix, 3, 3)       /* exp_avg, exp_avg_sq, exp_avg_slow */                \
    X(kAdam8, 2, 2)          /* Adam, AdamW of 8-bit state: torchao's AdamW8bit */  \
    X(kAdam8Amsgrad, 3, 3)   /* ... with amsgrad (max_exp_avg_sq) */

// Which specialisation of the update a segment runs. Chosen once per segment so that
// the per-element loop has no branch on hyperparameters.
enum class Variant : int {
    kSgd,                // no momentum
    kSgdMomentumFirst,   // momentum, first step: torch creates the buffer as clone(grad)
    kSgdMomentum,        // momentum, later steps
    kAdam,               // Adam and AdamW
    kAdamAmsgrad,        // Adam and AdamW with amsgrad
    // The rest run elementwise.h's bodies.
#define SX_VARIANT_NAME(variant, reads, writes) variant,
    SX_ELEMENTWISE_VARIANTS(SX_VARIANT_NAME)
#undef SX_VARIANT_NAME
};

// Per-segment constants. torch.optim computes its scalars as Python floats (double)
// and each tensor op rounds its scalar argument to the tensor's dtype (float); these
// are those rounded values, derived once per segment by make_consts().
struct SegmentConsts {
    Variant variant = Variant::kSgd;
    bool l2 = false;        // weight_decay != 0 with L2 (SGD, Adam): g = g + wd*p
    bool nesterov = false;  // SGD
    float grad_scale = 1;   // grad_scale, negated when maximize: -(a*s) == a*(-s) exactly
    float weight_decay = 0;
    // SGD
    float lr = 0, momentum = 0, one_minus_dampening = 1;
    // Adam/AdamW. exp_avg.lerp_(grad, w) with float weight w = 1 - beta1 is, as torch
    // evaluates it, m + w*(g - m) when |w| < 0.5 and g - (g - m)*(1 - w) otherwise;
    // both are base + lerp_coeff*(g - m) with base m (lerp_from_end false, coeff w) or
    // base g (true, coeff -(1 - w)); negating a factor is exact, so this rounds alike.
    float decay = 1;        // AdamW: param.mul_(1 - lr*wd); 1 otherwise (exact no-op)
    float lerp_coeff = 0;
    bool lerp_from_end = false;
    float beta2 = 0, one_minus_beta2 = 0;
    float step_size = 0;              // lr / (1 - beta1^step)
    float bias_correction2_sqrt = 1;  // (1 - beta2^step) ** 0.5
    float eps = 0;
    // The other elementwise optimizers (elementwise.h says which uses what). Adagrad:
    // step_size = lr / (1 + (step - 1)*lr_decay), init = initial_accumulator_value.
    // RMSprop: beta2 = alpha, one_minus_beta2 = 1 - alpha, lerp from w = 1 - alpha.
    // Adamax: step_size = lr / (1 - beta1^step). NAdam: bias_correction2, and the
    // coefficients of grad and exp_avg in its two addcdiv_. RAdam: bias_correction1,
    // bias_correction2_sqrt, rect. Lion: beta1, one_minus_beta1, beta2,
    // one_minus_beta2, lr, decay.
    float beta1 = 0, one_minus_beta1 = 0;
    float init = 0;
    float bias_correction1 = 1, bias_correction2 = 1;
    float rect = 1;
    float grad_coeff = 0, avg_coeff = 0;
    // AdEMAMix (optim/ademamix.cc): Adam's constants (lerp from 1 - beta1, beta2,
    // bias_correction1, bias_correction2_sqrt, eps, lr, decay), the slow moment's lerp
    // from 1 - beta3_t (slow_lerp_coeff, slow_lerp_from_end) and its weight alpha_t.
    float slow_lerp_coeff = 0;
    bool slow_lerp_from_end = false;
    float slow_alpha = 0;
    // Adam and AdamW of an 8-bit group, as torchao 0.18's single_param_adam computes
    // (optim/state_codec.h): lr, lr_wd = lr*wd (in fp32), weight_decay (Adam's L2 is
    // always applied, l2 set), the first moment's lerp, the second's (sq_lerp_*: of
    // g*g with 1 - beta2), bias_correction1 and bias_correction2_sqrt in fp32 from powf,
    // eps.
    float lr_wd = 0;
    float sq_lerp_coeff = 0;
    bool sq_lerp_from_end = false;
};

SegmentConsts make_consts(const Segment &seg, float grad_scale);

// Each built-in optimizer's part of make_consts (c arrives with grad_scale and
// weight_decay set) and its scalar reference (reference_update's), by the stems of
// SX_BUILTIN_OPTIMIZERS: consts_adam, reference_adam, ... An optimizer's file may
// define its own (dispatch.cc and reference.cc hold the older ones').
#define SX_DECLARE_OPTIMIZER_PARTS(kind, value, stem)                        \
    void consts_##stem(const Segment &seg, const Hyper &h, SegmentConsts &c); \
    void reference_##stem(const Segment &seg, float grad_scale);
SX_BUILTIN_OPTIMIZERS(SX_DECLARE_OPTIMIZER_PARTS)
#undef SX_DECLARE_OPTIMIZER_PARTS

// Helpers of the consts_* functions. exp_avg.lerp_(grad, w) for the float weight w =
// `weight`, as torch evaluates it (SegmentConsts::lerp_coeff, lerp_from_end): into
// *coeff and *from_end, or into c's lerp_coeff and lerp_from_end.
void lerp_weight(double weight, float *coeff, bool *from_end);
void set_lerp(double weight, SegmentConsts *c);
// Weight decay: decoupled (param.mul_(1 - lr*wd), c->decay) or L2 (grad.add(param,
// alpha=wd), c->l2).
void set_decay(const Hyper &h, bool decoupled, SegmentConsts *c);

// One kernel flavour. Both functions return the sum over their elements of
// (grad*grad_scale)^2, accumulated in float lanes over blocks of kSumBlock elements and
// in double across blocks. update() runs elements [begin, end) of seg.
struct KernelTable {
    const char *name;
    double (*update)(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end);
    double (*sum_of_squares)(const float *grad, size_t n, float grad_scale);
    // One block of 8-bit state (n <= kQuantBlock): state_codec.h's encode_block, with the
    // map's index `lut` (code_lut(map)). The update calls it; the tests hold it to the
    // reference.
    float (*encode8)(const float *x, size_t n, const float *map, const uint8_t *lut, uint8_t *codes);
    // Its inverse, state_codec.h's decode_block.
    void (*decode8)(const uint8_t *codes, size_t n, float scale, const float *map, float *out);
    // bf16_stochastic_round's rounding of n fp32 values into bf16 (stochastic_round.h,
    // bit for bit its stochastic_round_reference): the scalar flavour's is the loops the
    // compiler vectorises, the others' are written by hand (the hash's 64-bit multiplies
    // cost the compiler's loops more than the memory they touch).
    void (*round_stochastic)(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element);
};
constexpr size_t kSumBlock = 1024;  // a multiple of every flavour's vector width
// Elements updated between two roundings into a segment's compute copy (16 KiB of
// fp32 params: they are still in L1/L2 when the rounding reads them).
constexpr size_t kCastBlock = 4 * kSumBlock;

extern const KernelTable kScalarKernels;
#if SX_OPTIM_X86
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;
#endif

// kAuto -> detect_isa(); an ISA above detect_isa() -> detect_isa().
Isa resolve_isa(Isa requested);
const KernelTable &kernels_for(Isa resolved);

// A split point: element `offset` of segment `segment`. partition() returns parts + 1
// cuts, the first {0, 0}, the last {num_segs, 0}; part t runs from cut t to cut t+1.
// Parts hold about total/parts elements each; each inner cut's offset is rounded down
// to a multiple of kSplitGrain so that threads do not share the cache lines of an
// aligned segment. Cuts are non-decreasing, so parts are disjoint and cover everything.
struct Cut {
    size_t segment;
    size_t offset;
};
constexpr size_t kSplitGrain = 16;  // floats: one 64-byte cache line
// A segment of 8-bit state is cut only between its blocks (state_codec.h).
size_t split_grain(const Segment &seg);

std::vector<Cut> partition(const Segment *segs, size_t num_segs, int parts);

// Calls fn(segment_index, begin, end) for every non-empty piece of part t.
template <typename Fn>
void for_each_piece(const Segment *segs, const Cut &from, const Cut &to, Fn &&fn) {
    for (size_t s = from.segment; s < to.segment || (s == to.segment && to.offset > 0); ++s) {
        size_t begin = s == from.segment ? from.offset : 0;
        size_t end = s == to.segment ? to.offset : segs[s].n;
        if (begin < end) fn(s, begin, end);
    }
}

// Threads a split uses: the pool's size, but no more than one per
// min_elements_per_thread elements (waking a thread costs more than a small update).
int threads_for(size_t total_elements, const ThreadPool *pool, size_t min_elements_per_thread);
constexpr size_t kMinElementsPerThread = size_t(1) << 15;

// fused_update and sum_of_squares with an explicit kernel table and thread threshold
// (tests pass 1 to split even tiny inputs across threads).
void fused_update_with(const KernelTable &k, const Segment *segs, size_t num_segs,
                       float grad_scale, ThreadPool *pool, size_t min_elements_per_thread,
                       double *sumsq);
double sum_of_squares_with(const KernelTable &k, const Segment *segs, size_t num_segs,
                           float grad_scale, ThreadPool *pool, size_t min_elements_per_thread);

}  // namespace internal
}  // namespace optim
}  // namespace sx
