// Chooses a kernel flavour for this CPU, derives each segment's constants, splits the
// segments' elements across the pool's threads and adds up the sums of squares.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <vector>

#include "base/half.h"
#include "optim/kernels.h"
#include "optim/optimizer.h"
#include "optim/state_codec.h"
#include "optim/stochastic_round.h"
#include "optim/thread_pool.h"

namespace sx {
namespace optim {

Isa detect_isa() {
#if SX_OPTIM_X86
    // __builtin_cpu_supports also checks that the OS saves the vector registers (XCR0).
    static const Isa best = [] {
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
            return Isa::kAvx512;
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
        return Isa::kScalar;
    }();
    return best;
#else
    return Isa::kScalar;
#endif
}

const char *isa_name(Isa isa) {
    switch (isa) {
    case Isa::kAuto: return "auto";
    case Isa::kScalar: return "scalar";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
    }
    return "unknown";
}

namespace internal {

Isa resolve_isa(Isa requested) {
    const Isa best = detect_isa();
    switch (requested) {
    case Isa::kScalar: return Isa::kScalar;
    case Isa::kAvx2: return best == Isa::kScalar ? best : Isa::kAvx2;
    case Isa::kAvx512: return best;
    case Isa::kAuto: break;
    }
    return best;
}

const KernelTable &kernels_for(Isa resolved) {
#if SX_OPTIM_X86
    if (resolved == Isa::kAvx512) return kAvx512Kernels;
    if (resolved == Isa::kAvx2) return kAvx2Kernels;
#endif
    (void)resolved;
    return kScalarKernels;
}

void lerp_weight(double weight, float *coeff, bool *from_end) {
    const float w = static_cast<float>(weight);
    *from_end = !(std::fabs(w) < 0.5f);
    *coeff = *from_end ? -(1.0f - w) : w;
}

void set_lerp(double weight, SegmentConsts *c) { lerp_weight(weight, &c->lerp_coeff, &c->lerp_from_end); }

void set_decay(const Hyper &h, bool decoupled, SegmentConsts *c) {
    c->l2 = !decoupled && h.weight_decay != 0.0;
    if (decoupled && h.weight_decay != 0.0) c->decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
}

namespace {

void adam_family(const Hyper &h, SegmentConsts *c) {
    set_lerp(1.0 - h.beta1, c);
    c->beta2 = static_cast<float>(h.beta2);
    c->one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
    c->eps = static_cast<float>(h.eps);
}

// Adam and AdamW of an 8-bit group (elementwise.h, adam8_at), every fp32 param of it
// too: torchao's compiled single_param_adam takes lr as an fp32 tensor, its betas,
// weight decay and eps as Python floats rounded to fp32 where they meet a tensor, and
// its step as an fp32 tensor raised to by powf.
void consts_adam8(const Segment &seg, const Hyper &h, SegmentConsts &c) {
    c.variant = h.amsgrad ? Variant::kAdam8Amsgrad : Variant::kAdam8;
    c.l2 = h.kind == Kind::kAdam;
    c.lr = static_cast<float>(h.lr);
    c.lr_wd = c.lr * c.weight_decay;
    set_lerp(1.0 - h.beta1, &c);
    lerp_weight(1.0 - h.beta2, &c.sq_lerp_coeff, &c.sq_lerp_from_end);
    const float step = static_cast<float>(seg.step);
    c.bias_correction1 = 1.0f - powf(static_cast<float>(h.beta1), step);
    c.bias_correction2_sqrt = sqrtf(1.0f - powf(static_cast<float>(h.beta2), step));
    c.eps = static_cast<float>(h.eps);
}

}  // namespace

// Each optimizer's constants (consts_<stem>, SX_BUILTIN_OPTIMIZERS): Python-float
// arithmetic of torch's single-tensor functions, rounded to float where a tensor op takes
// the value (reference.cc repeats it independently). c arrives with grad_scale and
// weight_decay set.

void consts_sgd(const Segment &seg, const Hyper &h, SegmentConsts &c) {
    c.l2 = h.weight_decay != 0.0;
    c.nesterov = h.nesterov;
    c.lr = static_cast<float>(h.lr);
    c.momentum = static_cast<float>(h.momentum);
    c.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
    if (h.momentum == 0.0)
        c.variant = Variant::kSgd;
    else
        c.variant = seg.step == 1 ? Variant::kSgdMomentumFirst : Variant::kSgdMomentum;
}

// Adam and AdamW (decoupled weight decay).
void consts_adam(const Segment &seg, const Hyper &h, SegmentConsts &c) {
    if (h.state_dtype == SX_STATE_8BIT) return consts_adam8(seg, h, c);
    const double step = static_cast<double>(seg.step);
    c.variant = h.amsgrad ? Variant::kAdamAmsgrad : Variant::kAdam;
    set_decay(h, h.kind == Kind::kAdamW, &c);
    adam_family(h, &c);
    const double bias_correction1 = 1.0 - std::pow(h.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
    c.step_size = static_cast<float>(h.lr / bias_correction1);
    c.bias_correction2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));
}

void consts_adagrad(const Segment &seg, const Hyper &h, SegmentConsts &c) {
    const double step = static_cast<double>(seg.step);
    c.variant = seg.step == 1 ? Variant::kAdagradFirst : Variant::kAdagrad;
    c.l2 = h.weight_decay != 0.0;
    c.step_size = static_cast<float>(h.lr / (1.0 + (step - 1.0) * h.lr_decay));
    c.init = static_cast<float>(h.initial_accumulator_value);
    c.eps = static_cast<float>(h.eps);
}

void consts_rmsprop(const Segment &, const Hyper &h, SegmentConsts &c) {
    c.variant = h.centered ? (h.momentum > 0 ? Variant::kRmspropCenteredMomentum : Variant::kRmspropCentered)
                           : (h.momentum > 0 ? Variant::kRmspropMomentum : Variant::kRmsprop);
    c.l2 = h.weight_decay != 0.0;
    c.beta2 = static_cast<float>(h.alpha);
    c.one_minus_beta2 = static_cast<float>(1.0 - h.alpha);
    set_lerp(1.0 - h.alpha, &c);
    c.eps = static_cast<float>(h.eps);
    c.momentum = static_cast<float>(h.momentum);
    c.lr = static_cast<float>(h.lr);
}

void consts_adamax(const Segment &seg, const Hyper &h, SegmentConsts &c) {
    c.variant = Variant::kAdamax;
    c.l2 = h.weight_decay != 0.0;
    adam_family(h, &c);
    c.step_size = static_cast<float>(h.lr / (1.0 - std::pow(h.beta1, static_cast<double>(seg.step))));
}

void consts_nadam(const Segment &seg, const Hyper &h, SegmentConsts &c) {
    const double step = static_cast<double>(seg.step);
    c.variant = Variant::kNadam;
    set_decay(h, h.decoupled_weight_decay, &c);
    adam_family(h, &c);
    c.bias_correction2 = static_cast<float>(1.0 - std::pow(h.beta2, step));
    const double mu = h.beta1 * (1.0 - 0.5 * std::pow(0.96, step * h.momentum_decay));
    const double mu_next = h.beta1 * (1.0 - 0.5 * std::pow(0.96, (step + 1.0) * h.momentum_decay));
    const double mu_product = static_cast<double>(seg.mu_product);
    const double mu_product_next = mu_product * mu_next;
    c.grad_coeff = static_cast<float>(-h.lr * (1.0 - mu) / (1.0 - mu_product));
    c.avg_coeff = static_cast<float>((-h.lr * mu_next) / (1.0 - mu_product_next));
}

void consts_radam(const Segment &seg, const Hyper &h, SegmentConsts &c) {
    const double step = static_cast<double>(seg.step);
    set_decay(h, h.decoupled_weight_decay, &c);
    adam_family(h, &c);
    const double bias_correction1 = 1.0 - std::pow(h.beta1, step);
    const double bias_correction2 = 1.0 - std::pow(h.beta2, step);
    c.bias_correction1 = static_cast<float>(bias_correction1);
    c.lr = static_cast<float>(h.lr);
    const double rho_inf = 2.0 / (1.0 - h.beta2) - 1.0;
    const double rho_t = rho_inf - 2.0 * step * std::pow(h.beta2, step) / bias_correction2;
    c.variant = rho_t > 5.0 ? Variant::kRadamRectified : Variant::kRadam;
    if (rho_t > 5.0) {
        c.rect = static_cast<float>(
            std::pow((rho_t - 4.0) * (rho_t - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t), 0.5));
        c.bias_correction2_sqrt = static_cast<float>(std::pow(bias_correction2, 0.5));
    }
}

void consts_lion(const Segment &, const Hyper &h, SegmentConsts &c) {
    c.variant = Variant::kLion;
    c.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
    c.lr = static_cast<float>(h.lr);
    c.beta1 = static_cast<float>(h.beta1);
    c.one_minus_beta1 = static_cast<float>(1.0 - h.beta1);
    c.beta2 = static_cast<float>(h.beta2);
    c.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
}

// Not elementwise (lamb.h, muon.h, adafactor.h): the step never gives them a kernel.
void consts_not_elementwise(const Segment &, const Hyper &, SegmentConsts &) {}

SegmentConsts make_consts(const Segment &seg, float grad_scale) {
    const Hyper &h = *seg.hyper;
    SegmentConsts c;
    c.grad_scale = h.maximize ? -grad_scale : grad_scale;
    c.weight_decay = static_cast<float>(h.weight_decay);
    switch (h.kind) {
#define SX_CONSTS_CASE(kind, value, stem) \
    case Kind::kind: consts_##stem(seg, h, c); break;
        SX_BUILTIN_OPTIMIZERS(SX_CONSTS_CASE)
#undef SX_CONSTS_CASE
    }
    return c;
}

size_t split_grain(const Segment &seg) {
    return seg.state_dtype == SX_STATE_8BIT ? kQuantBlock : kSplitGrain;
}

std::vector<Cut> partition(const Segment *segs, size_t num_segs, int parts) {
    if (parts < 1) parts = 1;
    size_t total = 0;
    for (size_t s = 0; s < num_segs; ++s) total += segs[s].n;
    std::vector<Cut> cuts;
    cuts.reserve(static_cast<size_t>(parts) + 1);
    cuts.push_back({0, 0});
    size_t s = 0, seg_start = 0;  // segment s covers [seg_start, seg_start + n)
    for (int t = 1; t < parts; ++t) {
        // t*total/parts without overflowing
        const size_t q = total / parts, r = total % parts;
        const size_t target = q * t + r * t / parts;
        while (s < num_segs && seg_start + segs[s].n <= target) seg_start += segs[s++].n;
        if (s == num_segs) {
            cuts.push_back({num_segs, 0});
            continue;
        }
        const size_t grain = split_grain(segs[s]);
        const size_t offset = (target - seg_start) / grain * grain;
        cuts.push_back({s, offset});
    }
    cuts.push_back({num_segs, 0});
    return cuts;
}

int threads_for(size_t total_elements, const ThreadPool *pool, size_t min_elements_per_thread) {
    const int available = pool ? pool->size() : 1;
    if (min_elements_per_thread == 0) min_elements_per_thread = 1;
    const size_t wanted = total_elements / min_elements_per_thread;
    if (wanted < 1) return 1;
    return wanted < static_cast<size_t>(available) ? static_cast<int>(wanted) : available;
}

namespace {

// One double per part on its own cache line, so threads do not write-share lines.
struct alignas(64) Partial {
    double value = 0.0;
};

// Parts per thread of a split: each thread takes the next part until none is left, so a
// thread that starts late or runs slowly (its processor shared with another program's
// threads) takes fewer, and nobody waits for it. A part has at least
// kMinElementsPerThread / kPartsPerThread elements (4 Ki), so taking one costs nothing.
constexpr int kPartsPerThread = 8;

// Runs piece_fn(segment, begin, end) -> double over every element, split into parts that
// the pool's threads take in turn (ThreadPool::run_open); returns the sum of the results,
// added in part order (deterministic for a given thread count, whoever took which part).
template <typename PieceFn>
double run_split(const Segment *segs, size_t num_segs, ThreadPool *pool,
                 size_t min_elements_per_thread, PieceFn &&piece_fn) {
    size_t total = 0;
    for (size_t s = 0; s < num_segs; ++s) total += segs[s].n;
    if (total == 0) return 0.0;
    const int threads = threads_for(total, pool, min_elements_per_thread);
    const int parts = threads == 1 ? 1 : threads * kPartsPerThread;
    const std::vector<Cut> cuts = partition(segs, num_segs, parts);
    std::vector<Partial> partial(static_cast<size_t>(parts));
    std::atomic<int> next{0};
    auto work = [&](int) {
        for (int t; (t = next.fetch_add(1, std::memory_order_relaxed)) < parts;) {
            double sum = 0.0;
            for_each_piece(segs, cuts[t], cuts[t + 1],
                           [&](size_t s, size_t begin, size_t end) { sum += piece_fn(s, begin, end); });
            partial[t].value = sum;
        }
    };
    if (threads == 1)
        work(0);
    else
        pool->run_open(work);
    double sum = 0.0;
    for (const Partial &p : partial) sum += p.value;
    return sum;
}

// A segment of bf16 params without masters: each cache-sized block widened into fp32 on
// the stack, updated there by the kernel, and rounded stochastically back.
double update_rounding_stochastically(const KernelTable &k, const Segment &seg, const SegmentConsts &c,
                                      size_t begin, size_t end) {
    alignas(64) float block[kCastBlock];
    Segment local = seg;
    const uint64_t key = stochastic_round_key(seg.param_index, seg.step);
    double total = 0.0;
    for (size_t b = begin; b < end; b += kCastBlock) {
        const size_t e = std::min(end, b + kCastBlock);
        half::to_f32(SX_DTYPE_BF16, seg.compute_out + b, block, e - b);
        // The kernel indexes the param by the element's place in the segment.
        local.param = block - b;
        total += k.update(local, c, b, e);
        k.round_stochastic(block, seg.compute_out + b, e - b, key, seg.param_offset + b);
    }
    return total;
}

}  // namespace

void fused_update_with(const KernelTable &k, const Segment *segs, size_t num_segs,
                       float grad_scale, ThreadPool *pool, size_t min_elements_per_thread,
                       double *sumsq) {
    // Constants once per segment, before the threads start (pow is not cheap).
    std::vector<SegmentConsts> consts(num_segs);
    for (size_t s = 0; s < num_segs; ++s)
        if (segs[s].n > 0) consts[s] = make_consts(segs[s], grad_scale);
    const double sum = run_split(segs, num_segs, pool, min_elements_per_thread,
                                 [&](size_t s, size_t begin, size_t end) {
                                     const Segment &seg = segs[s];
                                     if (seg.compute_out == nullptr) return k.update(seg, consts[s], begin, end);
                                     if (seg.stochastic_round)
                                         return update_rounding_stochastically(k, seg, consts[s], begin, end);
                                     // The compute copy, a cache-sized block at a time: the rounding
                                     // reads the params the update has just written, not memory.
                                     double total = 0.0;
                                     for (size_t b = begin; b < end; b += kCastBlock) {
                                         const size_t e = std::min(end, b + kCastBlock);
                                         total += k.update(seg, consts[s], b, e);
                                         half::from_f32(seg.compute_dtype, seg.param + b, seg.compute_out + b,
                                                        e - b);
                                     }
                                     return total;
                                 });
    if (sumsq) *sumsq = sum;
}

double sum_of_squares_with(const KernelTable &k, const Segment *segs, size_t num_segs,
                           float grad_scale, ThreadPool *pool, size_t min_elements_per_thread) {
    return run_split(segs, num_segs, pool, min_elements_per_thread,
                     [&](size_t s, size_t begin, size_t end) {
                         return k.sum_of_squares(segs[s].grad + begin, end - begin, grad_scale);
                     });
}

}  // namespace internal

void fused_update(const Segment *segs, size_t num_segs, float grad_scale, ThreadPool *pool,
                  Isa isa, double *sumsq) {
    internal::fused_update_with(internal::kernels_for(internal::resolve_isa(isa)), segs, num_segs,
                                grad_scale, pool, internal::kMinElementsPerThread, sumsq);
}

double sum_of_squares(const Segment *segs, size_t num_segs, float grad_scale, ThreadPool *pool,
                      Isa isa) {
    return internal::sum_of_squares_with(internal::kernels_for(internal::resolve_isa(isa)), segs,
                                         num_segs, grad_scale, pool,
                                         internal::kMinElementsPerThread);
}

}  // namespace optim
}  // namespace sx
