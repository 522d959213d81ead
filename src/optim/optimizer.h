// Optimizer math over one rank's shard: the optimizer table (what each optimizer is,
// keeps and accepts), and torch.optim's elementwise optimizers as a plain scalar
// reference and as fused multi-threaded SIMD kernels (AVX2, AVX-512, chosen at run time). Knows nothing of communicators or layouts: it sees segments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "sx/sx_params.h"

namespace sx {
namespace optim {

class ThreadPool;

// The optimizers sx has built in, one line each: X(kind, SX_OPTIM_* value, stem). Every
// enum and switch over them expands from this list: the Kind below, each optimizer's
// per-segment constants (dispatch.cc, consts_<stem>) and its scalar reference
// (reference.cc, reference_<stem>); its row of the optimizer table (optimizers.cc) says
// what it keeps, accepts and needs. Optimizers that are not elementwise have the stem
// not_elementwise (their updates are lamb.h's, muon.h's, adafactor.h's, which the step
// runs through their rows' param_passes.h interfaces).
#define SX_BUILTIN_OPTIMIZERS(X)                       \
    X(kSgd, SX_OPTIM_SGD, sgd)                         \
    X(kAdam, SX_OPTIM_ADAM, adam)                      \
    X(kAdamW, SX_OPTIM_ADAMW, adam)                    \
    X(kAdagrad, SX_OPTIM_ADAGRAD, adagrad)             \
    X(kRmsprop, SX_OPTIM_RMSPROP, rmsprop)             \
    X(kAdamax, SX_OPTIM_ADAMAX, adamax)                \
    X(kNadam, SX_OPTIM_NADAM, nadam)                   \
    X(kRadam, SX_OPTIM_RADAM, radam)                   \
    X(kLion, SX_OPTIM_LION, lion)                      \
    X(kLamb, SX_OPTIM_LAMB, not_elementwise)           \
    X(kMuon, SX_OPTIM_MUON, not_elementwise)           \
    X(kAdafactor, SX_OPTIM_ADAFACTOR, not_elementwise) \
    X(kAdemamix, SX_OPTIM_ADEMAMIX, ademamix)

// The optimizers sx runs, by their public SX_OPTIM_* values (a registered optimizer's
// id is one too: custom.h).
enum class Kind : int32_t {
#define SX_KIND_VALUE(kind, value, stem) kind = value,
    SX_BUILTIN_OPTIMIZERS(SX_KIND_VALUE)
#undef SX_KIND_VALUE
};

// The range a hyperparameter's value must lie in (besides being finite).
enum class Rule : int32_t {
    kAny,
    kNonNegative,  // >= 0
    kNonPositive,  // <= 0
    kBeta,         // in [0, 1)
    kFlag,         // 0 or 1
    kStateDtype,   // SX_STATE_FP32, SX_STATE_BF16 or SX_STATE_8BIT
};

// Every hyperparameter, with torch.optim's names and meanings: the one table from which
// the param group descriptor's reading, the public keys (SX_HP_*), the ranks'
// agreement, the checkpoint's MANIFEST (writing, reading, validation) and `sxckpt`
// derive theirs. X(name, type, default, key, rule); `name` is also the member of
// sx_param_group_desc_t and of the MANIFEST's ParamGroup table, and `default` is its
// value wherever an optimizer's row (kOptimizers) says nothing else. Which optimizers
// it applies to is in their rows. A new hyperparameter is a line here, its members
// there, and its use in the kernels.
#define SX_HYPERPARAMETERS(X)                                                       \
    X(lr, double, 1e-3, SX_HP_LR, kNonNegative)                                     \
    X(weight_decay, double, 0.0, SX_HP_WEIGHT_DECAY, kNonNegative)                  \
    X(beta1, double, 0.9, SX_HP_BETA1, kBeta)                                       \
    X(beta2, double, 0.999, SX_HP_BETA2, kBeta)                                     \
    X(eps, double, 1e-8, SX_HP_EPS, kNonNegative)                                   \
    X(momentum, double, 0.0, SX_HP_MOMENTUM, kNonNegative)                          \
    X(dampening, double, 0.0, SX_HP_DAMPENING, kAny)                                \
    X(nesterov, bool, false, SX_HP_NESTEROV, kFlag)                                 \
    X(maximize, bool, false, SX_HP_MAXIMIZE, kFlag)                                 \
    X(amsgrad, bool, false, SX_HP_AMSGRAD, kFlag)                                   \
    X(lr_decay, double, 0.0, SX_HP_LR_DECAY, kNonNegative)                          \
    X(initial_accumulator_value, double, 0.0, SX_HP_INITIAL_ACCUMULATOR_VALUE, kNonNegative) \
    X(alpha, double, 0.99, SX_HP_ALPHA, kNonNegative)                               \
    X(centered, bool, false, SX_HP_CENTERED, kFlag)                                 \
    X(momentum_decay, double, 4e-3, SX_HP_MOMENTUM_DECAY, kNonNegative)             \
    X(decoupled_weight_decay, bool, false, SX_HP_DECOUPLED_WEIGHT_DECAY, kFlag)      \
    X(ns_a, double, 3.4445, SX_HP_NS_A, kAny)                                       \
    X(ns_b, double, -4.7750, SX_HP_NS_B, kAny)                                      \
    X(ns_c, double, 2.0315, SX_HP_NS_C, kAny)                                       \
    X(ns_steps, double, 5.0, SX_HP_NS_STEPS, kNonNegative)                          \
    X(adjust_lr, double, 0.0, SX_HP_ADJUST_LR, kNonNegative)                        \
    X(beta2_decay, double, -0.8, SX_HP_BETA2_DECAY, kNonPositive)                   \
    X(eps2, double, 1e-3, SX_HP_EPS2, kNonNegative)                                 \
    X(d, double, 1.0, SX_HP_D, kNonNegative)                                        \
    X(beta3, double, 0.9999, SX_HP_BETA3, kBeta)                                    \
    X(t_alpha_beta3, double, 0.0, SX_HP_T_ALPHA_BETA3, kNonNegative)               \
    X(state_dtype, double, 0.0, SX_HP_STATE_DTYPE, kStateDtype)                     \
    X(bf16_stochastic_round, bool, false, SX_HP_BF16_STOCHASTIC_ROUND, kFlag)

// The largest SX_HP_* key.
constexpr int32_t kMaxHyperKey = SX_HP_BF16_STOCHASTIC_ROUND;

// The most steps a param (or a group) may count: 2^53, the last count a double holds
// exactly (the bias corrections raise betas to the step in double); a step a
// microsecond would take 285 years to reach it.
constexpr uint64_t kMaxSteps = 1ull << 53;

// The step counts a param may hold: 0 <= momentum_steps <= step <= kMaxSteps.
inline bool valid_steps(int64_t step, int64_t momentum_steps) {
    return momentum_steps >= 0 && momentum_steps <= step && static_cast<uint64_t>(step) <= kMaxSteps;
}

// The most hyperparameters of its own a custom optimizer may have (custom.h).
constexpr int kMaxCustomHypers = SX_MAX_CUSTOM_HYPERPARAMETERS;

// An optimizer and its hyperparameters (one member per line of the table above; a
// custom optimizer's own in `custom`, in its registration's order).
struct Hyper {
    Kind kind = Kind::kAdamW;
#define SX_HYPER_MEMBER(name, type, dflt, key, rule) type name = dflt;
    SX_HYPERPARAMETERS(SX_HYPER_MEMBER)
#undef SX_HYPER_MEMBER
    double custom[kMaxCustomHypers] = {};
};

// The most state slots (fp32 tensors of a param's size) any optimizer keeps.
constexpr int kMaxStateSlots = 3;
static_assert(SX_MAX_CUSTOM_SLOTS <= kMaxStateSlots, "custom optimizers' slots are the built-ins'");

struct CustomOptimizer;
struct ParamPasses;
struct WholeParamUpdate;
struct WholeTensors;

// What an optimizer needs from the step besides its own segment's elements.
enum class Needs : int32_t {
    kElementwise,    // nothing: it runs per segment, fused
    kParamReduction, // per-param sums over every rank's piece (LAMB's norms, Adafactor's means)
    kWholeParam,     // the whole param on one rank (Muon's orthogonalisation)
};

// Which of a param's step counts its update is told (Segment::step), and so which a
// checkpoint's whole state must give back.
enum class StepCount : int32_t {
    kParam,           // the param's own updates (torch.optim's per-param state["step"])
    kMomentumUpdates, // the updates that used its momentum buffer (SGD's momentum > 0)
    kGroup,           // its param group's steps, counted on while the param is frozen
                      // (pytorch-optimizer's group["step"])
};

// One state slot: torch's name for it in the optimizer's state dict, and whether a
// param of `ndim` dimensions in a group with hyperparameters h keeps it (nullptr:
// always). ndim -1 asks whether any param of the group may keep it.
struct StateSlot {
    const char *name;
    bool (*kept)(const Hyper &h, int ndim);
    // Never negative (a second moment, a sum of squares, a max): kept in 8 bits, it uses
    // the unsigned map (optim/state_codec.h).
    bool nonnegative = false;
};

// A hyperparameter value an optimizer's row sets in place of the table's default.
struct HyperDefault {
    int32_t key;  // SX_HP_*; 0 ends the list
    double value;
};

// One row of the optimizer table: everything sx derives about an optimizer (its
// validation, its descriptor's defaults, its state slots' names in checkpoints and
// exports, sxckpt's torch names) comes from here; docs/optimizers.md lists the rows.
struct OptimizerSpec {
    Kind kind;
    const char *name;        // sx's and torch's class name: "AdamW"
    const char *reference;   // the implementation it matches: "torch.optim.AdamW"
    Needs needs;
    uint32_t keys;           // bit k set: hyperparameter SX_HP_* k applies
    uint32_t fixed_keys;     // keys that change the state slots: only before the first step
    StateSlot slots[kMaxStateSlots];  // in torch's state-dict order
    const char *param_scalar;  // a per-param float torch keeps besides `step` (NAdam's
                               // "mu_product"), or nullptr
    HyperDefault defaults[6];
    // Rules beyond each hyperparameter's own range (SGD's nesterov needs momentum), or
    // nullptr; returns an error naming what is wrong.
    Status (*check)(const Hyper &h);
    // A registered optimizer (custom.h): the rest of its description; nullptr for sx's own.
    const CustomOptimizer *custom;
    // Traits the step asks instead of the optimizer's name.
    StepCount step_count = StepCount::kParam;
    int32_t param_ndim = 0;  // the dimensions every param must have (Muon's 2), or 0: any
    // How the step runs it (param_passes.h): kParamReduction's passes and exchanges,
    // kWholeParam's update; nullptr for an elementwise optimizer.
    const ParamPasses *passes = nullptr;
    const WholeParamUpdate *whole_update = nullptr;
    // The per-param tensors it keeps whole on every rank besides its slots (Adafactor's
    // factored moments), or nullptr.
    const WholeTensors *whole_tensors = nullptr;
};

// The row of SX_OPTIM_* value `optimizer` (or a registered optimizer's id), or nullptr
// if there is none.
const OptimizerSpec *find_optimizer(int32_t optimizer);
// The row of a valid kind.
const OptimizerSpec &spec_of(Kind kind);
// Every row, in SX_OPTIM_* order; *count receives how many.
const OptimizerSpec *all_optimizers(size_t *count);

// "SGD, Adam, AdamW, ..." for messages naming what is accepted.
std::string optimizer_list();

// "fp32", "bf16" or "8-bit": an SX_STATE_* value (Hyper::state_dtype), for messages.
const char *state_dtype_name(double state_dtype);

// An SX_OPTIM_* value as torch names the optimizer ("SGD", "Adam", "AdamW"), or
// "optimizer N" for another value, for messages.
std::string optimizer_name(int32_t optimizer);
inline std::string optimizer_name(Kind kind) { return optimizer_name(static_cast<int32_t>(kind)); }

// Whether hyperparameter `key` (SX_HP_*) applies to optimizer `kind`.
bool applies_to(int32_t key, Kind kind);

// The hyperparameters of `optimizer` with their defaults (the row's, else the table's).
Hyper default_hyper(Kind kind);

// Checks h as torch.optim does: a known optimizer, every value finite and in its
// range, hyperparameters that do not apply at their defaults or 0, the row's own rules.
Status validate(const Hyper &h);

// h with every hyperparameter that does not apply to its optimizer and holds 0 (what a
// zero-filled descriptor or an older MANIFEST holds there) set to its default, so that
// ranks and checkpoints see one value.
Hyper with_unused_defaults(const Hyper &h);

// Number of fp32 state slots a param of `ndim` dimensions in a group with
// hyperparameters h keeps per element (those of its row that h keeps for it; ndim -1:
// the most any param of the group keeps), and torch's name of slot `slot` (<
// state_slots(h, ndim)). Only Adafactor's depend on ndim (a 0-D or 1-D param's
// `variance`; a larger one keeps its factored moments outside the slots).
int state_slots(const Hyper &h, int ndim = -1);
const char *state_slot_name(const Hyper &h, int slot, int ndim = -1);
// Whether slot `slot` is never negative (StateSlot::nonnegative: its 8-bit map is the
// unsigned one).
bool state_slot_nonnegative(const Hyper &h, int slot, int ndim = -1);

// NAdam: the param's product of momentum coefficients after update `step` (1 for its
// first), from the product before it, as torch computes it (a float32 tensor times
// mu_t = beta1 * (1 - 0.5 * 0.96^(step * momentum_decay))). 1 for other optimizers.
float next_mu_product(const Hyper &h, float before, int64_t step);
// NAdam: the product after `steps` updates under h's beta1 and momentum_decay throughout
// (next_mu_product from 1, step by step); 1 for other optimizers.
float mu_product_after(const Hyper &h, int64_t steps);

// A contiguous run of elements of one param inside this rank's shard, updated with
// that param's hyperparameters. state[i] points at slot i (nullptr where unused).
struct Segment {
    float *param = nullptr;
    const float *grad = nullptr;
    float *state[kMaxStateSlots] = {nullptr, nullptr, nullptr};
    size_t n = 0;
    const Hyper *hyper = nullptr;
    // The param's step count including this update (1 for its first update). Adam's
    // bias corrections use it; SGD initialises its momentum buffer to the gradient
    // when it is 1, as torch does when the buffer does not exist yet; Adagrad starts its
    // sum from initial_accumulator_value then.
    int64_t step = 1;
    // NAdam: the param's mu_product including this update (next_mu_product).
    float mu_product = 1.0f;
    // Mixed precision: if set, the updated fp32 values (param, the master weights) are
    // also written here rounded to compute_dtype (SX_DTYPE_BF16 or SX_DTYPE_F16), n
    // of them, block by block while they are still in cache.
    uint16_t *compute_out = nullptr;
    int32_t compute_dtype = 0;
    // bf16_stochastic_round (host kernels only): `param` is null and compute_out holds the
    // bf16 params themselves; the update widens them a block at a time, computes in fp32
    // and rounds them back stochastically (stochastic_round.h), with bits keyed by
    // param_index, step and param_offset + i.
    bool stochastic_round = false;
    // Device kernels only (core's DeviceOps::reads_16bit_grads): the gradient in 16 bits,
    // of grad_dtype (SX_DTYPE_BF16 or SX_DTYPE_F16), widened as the update reads it, with
    // `grad` null: a one-rank shard group's 16-bit gradients, which would otherwise be
    // widened into an fp32 sum in a pass of their own first.
    const uint16_t *grad16 = nullptr;
    int32_t grad_dtype = 0;
    // If set (host kernels only), the update zeroes these n floats as it reads each
    // gradient: `grad` itself, when the next backward adds into the same buffer, so that
    // the step needs no pass of its own to zero it.
    float *zero_grad = nullptr;
    // Double-buffered segments (custom.h, custom_update): the slots' current
    // values, copied into `state` before the update, and where the param's current
    // values are saved. Null for segments updated in place.
    const float *state_in[kMaxStateSlots] = {nullptr, nullptr, nullptr};
    float *undo = nullptr;
    // How the slots are stored (Hyper::state_dtype, optim/state_codec.h): SX_STATE_FP32 in
    // `state`; SX_STATE_BF16 in `state16`; SX_STATE_8BIT in `codes` with one scale per
    // kQuantBlock elements in `scales` (param_offset and n then whole blocks). Packed
    // slots are decoded, updated and encoded block by block (host kernels only).
    int32_t state_dtype = SX_STATE_FP32;
    uint16_t *state16[kMaxStateSlots] = {nullptr, nullptr, nullptr};
    uint8_t *codes[kMaxStateSlots] = {nullptr, nullptr, nullptr};
    float *scales[kMaxStateSlots] = {nullptr, nullptr, nullptr};
    // Which param the elements belong to, its param group, and param[0]'s offset in it.
    int32_t param_index = -1;
    int32_t param_group = -1;
    uint64_t param_offset = 0;
};

// The elements of segs, all together.
template <class Segments>
uint64_t total_elements(const Segments &segs) {
    uint64_t n = 0;
    for (const Segment &seg : segs) n += seg.n;
    return n;
}

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
