// The optimizer table: one row per optimizer (optimizer.h, OptimizerSpec), and what is
// derived from it (validation, defaults, state slots). docs/optimizers.md shows the rows.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "optim/custom.h"
#include "optim/optimizer.h"
#include "optim/param_passes.h"

namespace sx {
namespace optim {
namespace {

constexpr uint32_t bit(int32_t key) { return 1u << key; }

// Hyperparameters most optimizers share.
constexpr uint32_t kCommon = bit(SX_HP_LR) | bit(SX_HP_WEIGHT_DECAY) | bit(SX_HP_MAXIMIZE);
constexpr uint32_t kBetas = bit(SX_HP_BETA1) | bit(SX_HP_BETA2);
// The elementwise optimizers' slots may be kept in bf16 or 8 bits, and their bf16 params
// without masters (fixed keys: they decide how the slots and values are stored, so they
// change only before the first step).
constexpr uint32_t kState = bit(SX_HP_STATE_DTYPE) | bit(SX_HP_BF16_STOCHASTIC_ROUND);

bool if_momentum(const Hyper &h, int) { return h.momentum != 0.0; }
bool if_amsgrad(const Hyper &h, int) { return h.amsgrad; }
bool if_centered(const Hyper &h, int) { return h.centered; }
// Adafactor's per-element second moment: params of fewer than two dimensions (a larger
// one's moments are factored, optim/adafactor.h).
bool if_unfactored(const Hyper &, int ndim) { return ndim < 2; }

Status check_sgd(const Hyper &h) {
    SX_CHECK_ARG(!h.nesterov || (h.momentum > 0 && h.dampening == 0),
                 "nesterov momentum needs momentum > 0 and dampening = 0 (momentum = %g, dampening = %g)",
                 h.momentum, h.dampening);
    return Status::Ok();
}

Status check_muon(const Hyper &h) {
    SX_CHECK_ARG(h.ns_steps >= 1 && h.ns_steps <= 99 && h.ns_steps == std::floor(h.ns_steps),
                 "ns_steps = %g; Muon takes a whole number of Newton-Schulz iterations from 1 to 99", h.ns_steps);
    SX_CHECK_ARG(h.adjust_lr == SX_MUON_ADJUST_LR_ORIGINAL || h.adjust_lr == SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW ||
                     h.adjust_lr == SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED,
                 "adjust_lr = %g; it is SX_MUON_ADJUST_LR_ORIGINAL (0), _MATCH_RMS_ADAMW (1) or "
                 "_SPECTRAL_UNCLAMPED (2)",
                 h.adjust_lr);
    return Status::Ok();
}

Status check_adafactor(const Hyper &h) {
    SX_CHECK_ARG(h.d >= 1.0, "d = %g; Adafactor's clipping threshold must be >= 1 (as torch.optim.Adafactor's)", h.d);
    return Status::Ok();
}

Status check_ademamix(const Hyper &h) {
    SX_CHECK_ARG(h.t_alpha_beta3 == 0.0 || (h.beta1 > 0.0 && h.beta3 > 0.0),
                 "t_alpha_beta3 = %g warms beta3 up through log(beta1) and log(beta3); AdEMAMix needs beta1 > 0 "
                 "and beta3 > 0 for it (beta1 = %g, beta3 = %g)",
                 h.t_alpha_beta3, h.beta1, h.beta3);
    return Status::Ok();
}

// torch.optim's classes and lion-pytorch's Lion, with their constructors' defaults.
const OptimizerSpec kOptimizers[] = {
    {Kind::kSgd, "SGD", "torch.optim.SGD", Needs::kElementwise,
     kCommon | bit(SX_HP_MOMENTUM) | bit(SX_HP_DAMPENING) | bit(SX_HP_NESTEROV) | kState, kState,
     {{"momentum_buffer", if_momentum}}, nullptr, {{0, 0}}, check_sgd, nullptr, StepCount::kMomentumUpdates},
    {Kind::kAdam, "Adam", "torch.optim.Adam", Needs::kElementwise,
     kCommon | kBetas | bit(SX_HP_EPS) | bit(SX_HP_AMSGRAD) | kState, bit(SX_HP_AMSGRAD) | kState,
     {{"exp_avg", nullptr}, {"exp_avg_sq", nullptr, true}, {"max_exp_avg_sq", if_amsgrad, true}}, nullptr, {{0, 0}}, nullptr, nullptr},
    {Kind::kAdamW, "AdamW", "torch.optim.AdamW", Needs::kElementwise,
     kCommon | kBetas | bit(SX_HP_EPS) | bit(SX_HP_AMSGRAD) | kState, bit(SX_HP_AMSGRAD) | kState,
     {{"exp_avg", nullptr}, {"exp_avg_sq", nullptr, true}, {"max_exp_avg_sq", if_amsgrad, true}}, nullptr,
     {{SX_HP_WEIGHT_DECAY, 1e-2}, {0, 0}}, nullptr, nullptr},
    {Kind::kAdagrad, "Adagrad", "torch.optim.Adagrad", Needs::kElementwise,
     kCommon | bit(SX_HP_EPS) | bit(SX_HP_LR_DECAY) | bit(SX_HP_INITIAL_ACCUMULATOR_VALUE) | kState, kState,
     {{"sum", nullptr, true}}, nullptr, {{SX_HP_LR, 1e-2}, {SX_HP_EPS, 1e-10}, {0, 0}}, nullptr, nullptr},
    {Kind::kRmsprop, "RMSprop", "torch.optim.RMSprop", Needs::kElementwise,
     kCommon | bit(SX_HP_EPS) | bit(SX_HP_ALPHA) | bit(SX_HP_MOMENTUM) | bit(SX_HP_CENTERED) | kState,
     bit(SX_HP_CENTERED) | kState,
     {{"square_avg", nullptr, true}, {"momentum_buffer", if_momentum}, {"grad_avg", if_centered}}, nullptr,
     {{SX_HP_LR, 1e-2}, {0, 0}}, nullptr, nullptr},
    {Kind::kAdamax, "Adamax", "torch.optim.Adamax", Needs::kElementwise, kCommon | kBetas | bit(SX_HP_EPS) | kState, kState,
     {{"exp_avg", nullptr}, {"exp_inf", nullptr, true}}, nullptr, {{SX_HP_LR, 2e-3}, {0, 0}}, nullptr, nullptr},
    {Kind::kNadam, "NAdam", "torch.optim.NAdam", Needs::kElementwise,
     kCommon | kBetas | bit(SX_HP_EPS) | bit(SX_HP_MOMENTUM_DECAY) | bit(SX_HP_DECOUPLED_WEIGHT_DECAY) | kState, kState,
     {{"exp_avg", nullptr}, {"exp_avg_sq", nullptr, true}}, "mu_product", {{SX_HP_LR, 2e-3}, {0, 0}}, nullptr, nullptr},
    {Kind::kRadam, "RAdam", "torch.optim.RAdam", Needs::kElementwise,
     kCommon | kBetas | bit(SX_HP_EPS) | bit(SX_HP_DECOUPLED_WEIGHT_DECAY) | kState, kState,
     {{"exp_avg", nullptr}, {"exp_avg_sq", nullptr, true}}, nullptr, {{0, 0}}, nullptr, nullptr},
    // lion-pytorch 0.2.5's Lion: decoupled weight decay (p *= 1 - lr*wd) always; its
    // own decoupled_weight_decay option (wd divided by the constructor's lr) is the
    // caller's to apply to weight_decay.
    {Kind::kLion, "Lion", "lion_pytorch.Lion", Needs::kElementwise, kCommon | kBetas | kState, kState,
     {{"exp_avg", nullptr}},
     nullptr, {{SX_HP_LR, 1e-4}, {SX_HP_BETA2, 0.99}, {0, 0}}, nullptr, nullptr},
    // pytorch-optimizer 4.1.0's Lamb (optim/lamb.h): its weight_decouple is
    // decoupled_weight_decay (default on); its other options at their defaults.
    {Kind::kLamb, "Lamb", "pytorch_optimizer.Lamb", Needs::kParamReduction,
     kCommon | kBetas | bit(SX_HP_EPS) | bit(SX_HP_DECOUPLED_WEIGHT_DECAY), 0,
     {{"exp_avg", nullptr}, {"exp_avg_sq", nullptr, true}}, nullptr,
     {{SX_HP_EPS, 1e-6}, {SX_HP_DECOUPLED_WEIGHT_DECAY, 1}, {0, 0}}, nullptr, nullptr, StepCount::kGroup, 0,
     &kLambPasses},
    // torch.optim.Muon (optim/muon.h): 2-D params, each orthogonalised whole on one rank.
    {Kind::kMuon, "Muon", "torch.optim.Muon", Needs::kWholeParam,
     bit(SX_HP_LR) | bit(SX_HP_WEIGHT_DECAY) | bit(SX_HP_MOMENTUM) | bit(SX_HP_NESTEROV) | bit(SX_HP_EPS) |
         bit(SX_HP_NS_A) | bit(SX_HP_NS_B) | bit(SX_HP_NS_C) | bit(SX_HP_NS_STEPS) | bit(SX_HP_ADJUST_LR),
     0, {{"momentum_buffer", nullptr}}, nullptr,
     {{SX_HP_WEIGHT_DECAY, 0.1}, {SX_HP_MOMENTUM, 0.95}, {SX_HP_NESTEROV, 1}, {SX_HP_EPS, 1e-7}, {0, 0}}, check_muon,
     nullptr, StepCount::kParam, 2, nullptr, &kMuonUpdate},
    // torch.optim.Adafactor (optim/adafactor.h): its eps pair is (eps, eps2), eps's
    // default torch's None for fp32 (the machine epsilon, 2^-23); the factored moments of
    // a param of two or more dimensions are kept whole per param (its WholeTensors,
    // row_var and col_var), not in a slot.
    {Kind::kAdafactor, "Adafactor", "torch.optim.Adafactor", Needs::kParamReduction,
     kCommon | bit(SX_HP_EPS) | bit(SX_HP_BETA2_DECAY) | bit(SX_HP_EPS2) | bit(SX_HP_D), 0,
     {{"variance", if_unfactored}}, nullptr, {{SX_HP_LR, 1e-2}, {SX_HP_EPS, 0x1p-23}, {0, 0}}, check_adafactor, nullptr,
     StepCount::kParam, 0, &kAdafactorPasses, nullptr, &kAdafactorWholeTensors},
    // pytorch-optimizer 4.1.0's AdEMAMix (optim/ademamix.cc): betas (beta1, beta2, beta3),
    // alpha, t_alpha_beta3 (0: its None, no warmup); its weight_decouple is
    // decoupled_weight_decay; its fixed_decay (p *= 1 - wd) is weight_decay / lr with it off.
    // Its bias corrections and warmup count the group's steps.
    {Kind::kAdemamix, "AdEMAMix", "pytorch_optimizer.AdEMAMix", Needs::kElementwise,
     kCommon | kBetas | bit(SX_HP_BETA3) | bit(SX_HP_EPS) | bit(SX_HP_ALPHA) | bit(SX_HP_T_ALPHA_BETA3) |
         bit(SX_HP_DECOUPLED_WEIGHT_DECAY) | kState,
     kState, {{"exp_avg", nullptr}, {"exp_avg_sq", nullptr, true}, {"exp_avg_slow", nullptr}}, nullptr,
     {{SX_HP_ALPHA, 5.0}, {0, 0}}, check_ademamix, nullptr, StepCount::kGroup},
};
constexpr size_t kNumOptimizers = sizeof kOptimizers / sizeof kOptimizers[0];
#define SX_COUNT_ONE(kind, value, stem) +1
static_assert(kNumOptimizers == 0 SX_BUILTIN_OPTIMIZERS(SX_COUNT_ONE), "one row per built-in optimizer");
#undef SX_COUNT_ONE

double as_double(double v) { return v; }
double as_double(bool v) { return v ? 1.0 : 0.0; }

void set_value(Hyper *h, int32_t key, double value) {
#define SX_SET_VALUE(name, type, dflt, k, rule) \
    if (key == k) h->name = std::is_same<type, bool>::value ? value != 0.0 : value;
    SX_HYPERPARAMETERS(SX_SET_VALUE)
#undef SX_SET_VALUE
}

// "SGD, RMSprop": the optimizers hyperparameter `key` applies to.
std::string users_of(int32_t key) {
    std::string out;
    for (const OptimizerSpec &s : kOptimizers)
        if (s.keys & bit(key)) out += (out.empty() ? "" : ", ") + std::string(s.name);
    return out;
}

// "exp_avg, exp_avg_sq": the slots of a row, for messages; "no slots" for none.
std::string slot_list(const OptimizerSpec &s) {
    std::string out;
    for (const StateSlot &slot : s.slots)
        if (slot.name) out += (out.empty() ? "" : ", ") + std::string(slot.name);
    if (s.whole_tensors) out += out.empty() ? "its factored moments" : " and its factored moments";
    return out.empty() ? "no slots" : out;
}

}  // namespace

const char *state_dtype_name(double state_dtype) {
    if (state_dtype == SX_STATE_FP32) return "fp32";
    if (state_dtype == SX_STATE_BF16) return "bf16";
    if (state_dtype == SX_STATE_8BIT) return "8-bit";
    return "?";
}

const OptimizerSpec *find_optimizer(int32_t optimizer) {
    for (const OptimizerSpec &s : kOptimizers)
        if (static_cast<int32_t>(s.kind) == optimizer) return &s;
    const CustomOptimizer *c = find_custom(optimizer);
    return c ? &c->spec : nullptr;
}

const OptimizerSpec &spec_of(Kind kind) {
    const OptimizerSpec *s = find_optimizer(static_cast<int32_t>(kind));
    return s ? *s : kOptimizers[0];
}

const OptimizerSpec *all_optimizers(size_t *count) {
    *count = kNumOptimizers;
    return kOptimizers;
}

std::string optimizer_list() {
    std::string out;
    for (const OptimizerSpec &s : kOptimizers) out += (out.empty() ? "" : ", ") + std::string(s.name);
    return out;
}

std::string optimizer_name(int32_t optimizer) {
    const OptimizerSpec *s = find_optimizer(optimizer);
    return s ? s->name : "optimizer " + std::to_string(optimizer);
}

bool applies_to(int32_t key, Kind kind) {
    const OptimizerSpec *s = find_optimizer(static_cast<int32_t>(kind));
    return s && key > 0 && key <= kMaxHyperKey && (s->keys & bit(key));
}

Hyper default_hyper(Kind kind) {
    Hyper h;
    h.kind = kind;
    const OptimizerSpec *s = find_optimizer(static_cast<int32_t>(kind));
    if (s && s->custom) {
        for (const CustomHyper &c : s->custom->hypers)
            if (c.key >= SX_HP_CUSTOM)
                h.custom[c.key - SX_HP_CUSTOM] = c.dflt;
            else
                set_value(&h, c.key, c.dflt);
    } else if (s) {
        for (const HyperDefault &d : s->defaults) {
            if (d.key == 0) break;
            set_value(&h, d.key, d.value);
        }
    }
    return h;
}

Status validate(const Hyper &h) {
    const OptimizerSpec *s = find_optimizer(static_cast<int32_t>(h.kind));
    SX_CHECK_ARG(s != nullptr, "optimizer %d is not one sx has (SX_OPTIM_*: %s)", static_cast<int>(h.kind),
                 optimizer_list().c_str());
    const Hyper dflt = default_hyper(h.kind);
    const char *const optimizer = s->name;
    const uint32_t keys = s->keys;
    SX_CHECK_ARG(h.state_dtype == SX_STATE_FP32 || h.state_dtype == SX_STATE_BF16 || h.state_dtype == SX_STATE_8BIT,
                 "state_dtype = %g; it is SX_STATE_FP32 (0), SX_STATE_BF16 (1) or SX_STATE_8BIT (2)", h.state_dtype);
    SX_CHECK_ARG(h.state_dtype == SX_STATE_FP32 || (keys & bit(SX_HP_STATE_DTYPE)),
                 "state_dtype = %s: %s keeps its state slots (%s) in fp32; bf16 and 8-bit state are for the "
                 "elementwise optimizers (%s)",
                 state_dtype_name(h.state_dtype), optimizer, slot_list(*s).c_str(), users_of(SX_HP_STATE_DTYPE).c_str());
    // A custom optimizer sees its params as fp32 arrays: it cannot run on bf16 values alone.
    SX_CHECK_ARG(!h.bf16_stochastic_round || (!s->custom && (keys & bit(SX_HP_BF16_STOCHASTIC_ROUND))),
                 "bf16_stochastic_round = 1: %s cannot update bf16 params without fp32 masters; stochastic "
                 "rounding is for the built-in elementwise optimizers (%s)",
                 optimizer, users_of(SX_HP_BF16_STOCHASTIC_ROUND).c_str());
#define SX_CHECK_ONE(name, type, d, key, rule)                                                                    \
    {                                                                                                             \
        const double v = as_double(h.name);                                                                       \
        SX_CHECK_ARG(std::isfinite(v), "%s = %g; hyperparameters must be finite", #name, v);                      \
        if (!(keys & bit(key)))                                                                                   \
            SX_CHECK_ARG(v == as_double(dflt.name) || v == 0.0, "%s = %g does not apply to %s (it applies to %s)", \
                         #name, v,                                                                                \
                         optimizer, users_of(key).c_str());                                                       \
        SX_CHECK_ARG(Rule::rule != Rule::kNonNegative || v >= 0, "%s = %g; it must be >= 0", #name, v);           \
        SX_CHECK_ARG(Rule::rule != Rule::kNonPositive || v <= 0, "%s = %g; it must be <= 0", #name, v);           \
        SX_CHECK_ARG(Rule::rule != Rule::kBeta || (v >= 0 && v < 1), "%s = %g; it must be in [0, 1)", #name, v); \
    }
    SX_HYPERPARAMETERS(SX_CHECK_ONE)
#undef SX_CHECK_ONE
    if (s->custom) {
        // A registered optimizer's ranges, for sx's hyperparameters and its own alike.
        for (const CustomHyper &c : s->custom->hypers) {
            const double v = hyper_value(h, c.key);
            SX_CHECK_ARG(std::isfinite(v), "%s = %g; hyperparameters must be finite", c.name.c_str(), v);
            SX_CHECK_ARG((c.min == 0.0 && c.max == 0.0) || (v >= c.min && v <= c.max),
                         "%s = %g; %s requires it in [%g, %g]", c.name.c_str(), v, optimizer, c.min, c.max);
        }
        for (int i = s->custom->num_own; i < kMaxCustomHypers; ++i)
            SX_CHECK_ARG(h.custom[i] == 0.0, "custom hyperparameter %d = %g; %s has %d of its own", i, h.custom[i],
                         optimizer, s->custom->num_own);
    } else {
        for (int i = 0; i < kMaxCustomHypers; ++i)
            SX_CHECK_ARG(h.custom[i] == 0.0, "custom hyperparameter %d = %g; %s has none", i, h.custom[i], optimizer);
    }
    if (s->check) SX_TRY(s->check(h));
    return Status::Ok();
}

Hyper with_unused_defaults(const Hyper &h) {
    const OptimizerSpec *s = find_optimizer(static_cast<int32_t>(h.kind));
    if (!s) return h;
    const Hyper dflt = default_hyper(h.kind);
    Hyper out = h;
#define SX_UNUSED_DEFAULT(name, type, d, key, rule) \
    if (!(s->keys & bit(key)) && as_double(out.name) == 0.0) out.name = dflt.name;
    SX_HYPERPARAMETERS(SX_UNUSED_DEFAULT)
#undef SX_UNUSED_DEFAULT
    return out;
}

int state_slots(const Hyper &h, int ndim) {
    const OptimizerSpec &s = spec_of(h.kind);
    int n = 0;
    for (const StateSlot &slot : s.slots)
        if (slot.name && (!slot.kept || slot.kept(h, ndim))) ++n;
    return n;
}

const char *state_slot_name(const Hyper &h, int slot, int ndim) {
    const OptimizerSpec &s = spec_of(h.kind);
    int n = 0;
    for (const StateSlot &sl : s.slots)
        if (sl.name && (!sl.kept || sl.kept(h, ndim)) && n++ == slot) return sl.name;
    return "?";
}

bool state_slot_nonnegative(const Hyper &h, int slot, int ndim) {
    const OptimizerSpec &s = spec_of(h.kind);
    int n = 0;
    for (const StateSlot &sl : s.slots)
        if (sl.name && (!sl.kept || sl.kept(h, ndim)) && n++ == slot) return sl.nonnegative;
    return false;
}

float next_mu_product(const Hyper &h, float before, int64_t step) {
    if (h.kind != Kind::kNadam) return 1.0f;
    const double mu = h.beta1 * (1.0 - 0.5 * std::pow(0.96, static_cast<double>(step) * h.momentum_decay));
    return before * static_cast<float>(mu);
}

float mu_product_after(const Hyper &h, int64_t steps) {
    float product = 1.0f;
    for (int64_t t = 1; h.kind == Kind::kNadam && t <= steps; ++t) product = next_mu_product(h, product, t);
    return product;
}

}  // namespace optim
}  // namespace sx
