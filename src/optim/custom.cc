// Custom optimizers: the registry of the ones a trainer registered (custom.h), and the
// double-buffered pass that runs their updates over this rank's shard.
#include "optim/custom.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstring>
#include <mutex>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "base/half.h"
#include "optim/thread_pool.h"

namespace sx {
namespace optim {
namespace {

// The registry: entries are written once under the mutex, then published by `count`
// (release), so lookups need no lock and the rows' pointers stay valid for the process.
std::mutex registry_mu;
CustomOptimizer registry[SX_MAX_CUSTOM_OPTIMIZERS];
std::atomic<int> registry_count{0};

// sx's hyperparameter named `name` (its SX_HP_* key), or 0.
int32_t standard_key(const std::string &name) {
#define SX_KEY_OF(n, type, dflt, key, rule) \
    if (name == #n) return key;
    SX_HYPERPARAMETERS(SX_KEY_OF)
#undef SX_KEY_OF
    return 0;
}

bool is_name_char(char c, bool dots) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           (dots && (c == '.' || c == '-'));
}

Status check_name(const char *name, const char *what, bool dots) {
    SX_CHECK_ARG(name != nullptr, "%s is NULL", what);
    const size_t len = strnlen(name, 64);
    SX_CHECK_ARG(len >= 1 && len <= 63, "%s '%.70s' must have 1 to 63 characters", what, name);
    for (size_t i = 0; i < len; ++i)
        SX_CHECK_ARG(is_name_char(name[i], dots), "%s '%s' has '%c'; it may hold only %s", what, name, name[i],
                     dots ? "letters, digits, '_', '.' and '-'" : "letters, digits and '_'");
    return Status::Ok();
}

// A default for one of sx's hyperparameters meets that hyperparameter's rule.
Status check_standard_default(const CustomHyper &h) {
    const double v = h.dflt;
#define SX_RULE_OF(n, type, dflt, k, rule)                                                                        \
    if (h.key == k) {                                                                                            \
        SX_CHECK_ARG(Rule::rule != Rule::kNonNegative || v >= 0, "hyperparameter '%s': its default %g must be >= 0", \
                     #n, v);                                                                                     \
        SX_CHECK_ARG(Rule::rule != Rule::kNonPositive || v <= 0, "hyperparameter '%s': its default %g must be <= 0", \
                     #n, v);                                                                                     \
        SX_CHECK_ARG(Rule::rule != Rule::kBeta || (v >= 0 && v < 1),                                             \
                     "hyperparameter '%s': its default %g must be in [0, 1)", #n, v);                           \
        SX_CHECK_ARG(Rule::rule != Rule::kFlag || v == 0 || v == 1,                                              \
                     "hyperparameter '%s': its default %g must be 0 or 1", #n, v);                              \
    }
    SX_HYPERPARAMETERS(SX_RULE_OF)
#undef SX_RULE_OF
    return Status::Ok();
}

bool same_letters(const char *a, const char *b) {
    for (; *a && *b; ++a, ++b)
        if (std::tolower(static_cast<unsigned char>(*a)) != std::tolower(static_cast<unsigned char>(*b))) return false;
    return *a == *b;
}

bool same(const CustomOptimizer &a, const CustomOptimizer &b) {
    if (a.slot_names != b.slot_names || a.update != b.update || a.user_data != b.user_data || a.in_place != b.in_place ||
        a.hypers.size() != b.hypers.size())
        return false;
    for (size_t k = 0; k < a.slot_names.size(); ++k)
        if (std::memcmp(&a.initial[k], &b.initial[k], sizeof(float)) != 0) return false;
    for (size_t i = 0; i < a.hypers.size(); ++i) {
        const CustomHyper &x = a.hypers[i], &y = b.hypers[i];
        if (x.name != y.name || x.dflt != y.dflt || x.min != y.min || x.max != y.max) return false;
    }
    return true;
}

// The description read into *c, checked whole.
Status describe(const sx_optimizer_desc_t &d, CustomOptimizer *c) {
    SX_TRY(check_name(d.name, "desc->name", true));
    size_t builtins = 0;
    const OptimizerSpec *rows = all_optimizers(&builtins);
    for (size_t i = 0; i < builtins; ++i)
        SX_CHECK_ARG(!same_letters(d.name, rows[i].name),
                     "desc->name '%s' is the name of sx's own %s (SX_OPTIM_*); choose another", d.name, rows[i].name);
    SX_CHECK_ARG(d.update != nullptr, "desc->update is NULL: a custom optimizer needs its update function");
    SX_CHECK_ARG(d.num_slots >= 0 && d.num_slots <= SX_MAX_CUSTOM_SLOTS, "desc->num_slots = %d; it must be in [0, %d]",
                 d.num_slots, SX_MAX_CUSTOM_SLOTS);
    SX_CHECK_ARG(d.num_slots == 0 || d.slot_names != nullptr, "desc->slot_names is NULL but num_slots is %d",
                 d.num_slots);
    SX_CHECK_ARG(d.num_hyperparameters >= 0 && d.num_hyperparameters <= SX_MAX_CUSTOM_HYPERPARAMETERS + kMaxHyperKey,
                 "desc->num_hyperparameters = %d; it must be in [0, %d]", d.num_hyperparameters,
                 SX_MAX_CUSTOM_HYPERPARAMETERS + kMaxHyperKey);
    SX_CHECK_ARG(d.num_hyperparameters == 0 || d.hyperparameters != nullptr,
                 "desc->hyperparameters is NULL but num_hyperparameters is %d", d.num_hyperparameters);
    c->name = d.name;
    for (int32_t k = 0; k < d.num_slots; ++k) {
        char what[32];
        std::snprintf(what, sizeof what, "desc->slot_names[%d]", k);
        SX_TRY(check_name(d.slot_names[k], what, false));
        SX_CHECK_ARG(std::find(c->slot_names.begin(), c->slot_names.end(), d.slot_names[k]) == c->slot_names.end(),
                     "desc->slot_names[%d] '%s' is a name an earlier slot has; slot names must differ", k,
                     d.slot_names[k]);
        SX_CHECK_ARG(std::strcmp(d.slot_names[k], "param") != 0 && std::strcmp(d.slot_names[k], "step") != 0,
                     "desc->slot_names[%d] is '%s', a name checkpoints keep for the param itself", k,
                     d.slot_names[k]);
        c->slot_names.push_back(d.slot_names[k]);
        c->initial[k] = d.slot_initial_values ? d.slot_initial_values[k] : 0.0f;
        SX_CHECK_ARG(std::isfinite(c->initial[k]), "desc->slot_initial_values[%d] = %g; it must be finite", k,
                     static_cast<double>(c->initial[k]));
    }
    uint32_t keys = 0;
    for (int32_t i = 0; i < d.num_hyperparameters; ++i) {
        const sx_optimizer_hyperparameter_t &hp = d.hyperparameters[i];
        char what[40];
        std::snprintf(what, sizeof what, "desc->hyperparameters[%d].name", i);
        SX_TRY(check_name(hp.name, what, false));
        for (const CustomHyper &other : c->hypers)
            SX_CHECK_ARG(other.name != hp.name, "desc->hyperparameters[%d] '%s' is named twice", i, hp.name);
        CustomHyper h;
        h.name = hp.name;
        h.dflt = hp.default_value;
        h.min = hp.min;
        h.max = hp.max;
        SX_CHECK_ARG(std::isfinite(h.dflt) && std::isfinite(h.min) && std::isfinite(h.max),
                     "hyperparameter '%s': its default and range must be finite", hp.name);
        SX_CHECK_ARG(h.min <= h.max, "hyperparameter '%s': min %g > max %g", hp.name, h.min, h.max);
        SX_CHECK_ARG((h.min == 0.0 && h.max == 0.0) || (h.dflt >= h.min && h.dflt <= h.max),
                     "hyperparameter '%s': its default %g lies outside [%g, %g]", hp.name, h.dflt, h.min, h.max);
        h.key = standard_key(h.name);
        if (h.key != 0) {
            SX_TRY(check_standard_default(h));
            keys |= 1u << h.key;
        } else {
            SX_CHECK_ARG(c->num_own < SX_MAX_CUSTOM_HYPERPARAMETERS,
                         "'%s' would be the optimizer's hyperparameter of its own number %d; at most %d",
                         hp.name, c->num_own + 1, SX_MAX_CUSTOM_HYPERPARAMETERS);
            h.key = SX_HP_CUSTOM + c->num_own++;
        }
        c->hypers.push_back(h);
    }
    SX_CHECK_ARG((d.flags & ~static_cast<uint32_t>(SX_OPTIMIZER_IN_PLACE)) == 0,
                 "desc->flags = 0x%x; the known flags are SX_OPTIMIZER_IN_PLACE (0x1)", d.flags);
    SX_CHECK_ARG(d.reserved0 == 0, "desc->reserved0 = %d; it must be 0", d.reserved0);
    c->update = d.update;
    c->user_data = d.user_data;
    c->in_place = (d.flags & SX_OPTIMIZER_IN_PLACE) != 0;
    c->spec.name = nullptr;  // set once the entry has its place
    c->spec.reference = "a custom optimizer (sx_register_optimizer)";
    c->spec.needs = Needs::kElementwise;
    c->spec.keys = keys;
    c->spec.fixed_keys = 0;
    c->spec.param_scalar = nullptr;
    c->spec.defaults[0] = {0, 0.0};
    c->spec.check = nullptr;
    return Status::Ok();
}

}  // namespace

Status register_custom(const sx_optimizer_desc_t &desc, int32_t *id) {
    CustomOptimizer c;
    SX_TRY(describe(desc, &c));
    std::lock_guard<std::mutex> lock(registry_mu);
    const int n = registry_count.load(std::memory_order_relaxed);
    for (int i = 0; i < n; ++i) {
        if (registry[i].name != c.name) continue;
        SX_CHECK(same(registry[i], c), SX_ERR_ALREADY_EXISTS,
                 "an optimizer named '%s' is registered already, with another description (slots, "
                 "hyperparameters, update or user_data)",
                 c.name.c_str());
        *id = registry[i].id;
        return Status::Ok();
    }
    SX_CHECK(n < SX_MAX_CUSTOM_OPTIMIZERS, SX_ERR_INVALID_STATE,
             "%d custom optimizers are registered in this process; that is the most sx keeps", n);
    CustomOptimizer &e = registry[n];
    e = std::move(c);
    e.id = SX_OPTIM_CUSTOM_FIRST + n;
    e.spec.kind = static_cast<Kind>(e.id);
    e.spec.name = e.name.c_str();
    for (size_t k = 0; k < e.slot_names.size(); ++k) e.spec.slots[k] = {e.slot_names[k].c_str(), nullptr};
    e.spec.custom = &e;
    registry_count.store(n + 1, std::memory_order_release);
    *id = e.id;
    return Status::Ok();
}

const CustomOptimizer *find_custom(int32_t id) {
    const int n = registry_count.load(std::memory_order_acquire);
    const int i = id - SX_OPTIM_CUSTOM_FIRST;
    return i >= 0 && i < n ? &registry[i] : nullptr;
}

const CustomOptimizer *find_custom(const std::string &name) {
    const int n = registry_count.load(std::memory_order_acquire);
    for (int i = 0; i < n; ++i)
        if (registry[i].name == name) return &registry[i];
    return nullptr;
}

bool double_buffers(Kind kind) {
    const CustomOptimizer *c = is_custom(kind) ? find_custom(static_cast<int32_t>(kind)) : nullptr;
    return c && !c->in_place;
}

double hyper_value(const Hyper &h, int32_t key) {
    if (key >= SX_HP_CUSTOM && key < SX_HP_CUSTOM + kMaxCustomHypers) return h.custom[key - SX_HP_CUSTOM];
#define SX_VALUE_OF(name, type, dflt, k, rule) \
    if (key == k) return static_cast<double>(h.name);
    SX_HYPERPARAMETERS(SX_VALUE_OF)
#undef SX_VALUE_OF
    return 0.0;
}

namespace {

// Elements per call of an update: the slots' working copies (kMaxStateSlots of them) and
// the piece's param and gradient stay in a core's L2 while the update meets them.
constexpr size_t kPieceElements = 4096;
// How far ahead (elements) the staging pass prefetches each stream, as the fused kernels do.
constexpr size_t kPrefetchAhead = 512;

// A pool thread's working copies of a piece's slots (pool threads live as long as their
// group, so each allocates this once).
float *slot_scratch() {
    thread_local std::vector<float> scratch(static_cast<size_t>(kMaxStateSlots) * kPieceElements);
    return scratch.data();
}

// Copies n floats to dst with non-temporal stores where the CPU has them: dst is not read
// again in this step, so its cache lines are not fetched first (a plain copy would read
// them, a third more traffic). One destination at a time: on AMD's Zen, non-temporal
// stores to several streams in one loop ran at half the speed of the same stores made
// stream after stream. stream_fence() orders them before the step goes on.
#if defined(__SSE2__)
__attribute__((target("avx512f"))) void stream_copy_avx512(float *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 63) != 0; ++i) dst[i] = src[i];
    for (; i + 16 <= n; i += 16) _mm512_stream_ps(dst + i, _mm512_loadu_ps(src + i));
    for (; i < n; ++i) dst[i] = src[i];
    _mm256_zeroupper();
}
__attribute__((target("avx2"))) void stream_copy_avx2(float *dst, const float *src, size_t n) {
    size_t i = 0;
    for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 31) != 0; ++i) dst[i] = src[i];
    for (; i + 8 <= n; i += 8) _mm256_stream_ps(dst + i, _mm256_loadu_ps(src + i));
    for (; i < n; ++i) dst[i] = src[i];
    _mm256_zeroupper();
}
const bool kHaveAvx512 = detect_isa() == Isa::kAvx512;
const bool kHaveAvx2 = detect_isa() == Isa::kAvx2 || kHaveAvx512;
#endif

void stream_copy(float *dst, const float *src, size_t n) {
#if defined(__SSE2__)
    if (kHaveAvx512) return stream_copy_avx512(dst, src, n);
    if (kHaveAvx2) return stream_copy_avx2(dst, src, n);
    size_t i = 0;
    for (; i < n && (reinterpret_cast<uintptr_t>(dst + i) & 15) != 0; ++i) dst[i] = src[i];
    for (; i + 4 <= n; i += 4) _mm_stream_ps(dst + i, _mm_loadu_ps(src + i));
    for (; i < n; ++i) dst[i] = src[i];
#else
    std::memcpy(dst, src, n * sizeof(float));
#endif
}

void stream_fence() {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

// The reads of a piece in one pass: its params streamed into undo, its slots' current
// values (slots > 0 of them, or `fill` where given) copied into the working copies, with
// software prefetch of every stream (gradients too, which the update reads next) ahead
// of the copy, so that the memory streams overlap as in the fused kernels (one stream at
// a time, the copies ran at half the speed).
#if defined(__SSE2__)
__attribute__((target("avx512f"))) void stage_in_avx512(const Segment &p, float *const *work, int slots,
                                                         const float *fill) {
    const size_t n = p.n;
    size_t i = 0;
    const bool aligned = (reinterpret_cast<uintptr_t>(p.undo) & 63) == 0;
    for (; i + 16 <= n; i += 16) {
        __builtin_prefetch(p.param + i + kPrefetchAhead);
        __builtin_prefetch(p.grad + i + kPrefetchAhead);
        for (int k = 0; k < slots; ++k)
            if (!fill) __builtin_prefetch(p.state_in[k] + i + kPrefetchAhead);
        const __m512 v = _mm512_loadu_ps(p.param + i);
        if (aligned)
            _mm512_stream_ps(p.undo + i, v);
        else
            _mm512_storeu_ps(p.undo + i, v);
        for (int k = 0; k < slots; ++k)
            _mm512_storeu_ps(work[k] + i, fill ? _mm512_set1_ps(fill[k]) : _mm512_loadu_ps(p.state_in[k] + i));
    }
    for (; i < n; ++i) {
        p.undo[i] = p.param[i];
        for (int k = 0; k < slots; ++k) work[k][i] = fill ? fill[k] : p.state_in[k][i];
    }
    _mm256_zeroupper();
}
#endif

// AVX2's staging: the params streamed into undo on their own (see stream_copy), then the
// slots' values read into the working copies with the gradients (which the update reads
// next) and the slots prefetched ahead, several read streams in flight at once.
#if defined(__SSE2__)
__attribute__((target("avx2"))) void stage_slots_avx2(const Segment &p, float *const *work, int slots,
                                                       const float *fill) {
    const size_t n = p.n;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __builtin_prefetch(p.grad + i + kPrefetchAhead);
        for (int k = 0; k < slots; ++k) {
            if (fill) {
                _mm256_storeu_ps(work[k] + i, _mm256_set1_ps(fill[k]));
                _mm256_storeu_ps(work[k] + i + 8, _mm256_set1_ps(fill[k]));
                continue;
            }
            __builtin_prefetch(p.state_in[k] + i + kPrefetchAhead);
            _mm256_storeu_ps(work[k] + i, _mm256_loadu_ps(p.state_in[k] + i));
            _mm256_storeu_ps(work[k] + i + 8, _mm256_loadu_ps(p.state_in[k] + i + 8));
        }
    }
    for (; i < n; ++i)
        for (int k = 0; k < slots; ++k) work[k][i] = fill ? fill[k] : p.state_in[k][i];
    _mm256_zeroupper();
}
#endif

void stage_in(const Segment &p, float *const *work, int slots, const float *fill) {
#if defined(__SSE2__)
    if (kHaveAvx512) return stage_in_avx512(p, work, slots, fill);
    if (kHaveAvx2) {
        stream_copy_avx2(p.undo, p.param, p.n);
        return stage_slots_avx2(p, work, slots, fill);
    }
#endif
    stream_copy(p.undo, p.param, p.n);
    for (int k = 0; k < slots; ++k) {
        if (fill)
            std::fill(work[k], work[k] + p.n, fill[k]);
        else
            std::memcpy(work[k], p.state_in[k], p.n * sizeof(float));
    }
}

// A segment's piece [begin, begin + n) as its own segment.
Segment piece_of(const Segment &s, size_t begin, size_t n) {
    Segment p = s;
    p.param += begin;
    p.grad += begin;
    for (int k = 0; k < kMaxStateSlots; ++k) {
        if (p.state[k]) p.state[k] += begin;
        if (p.state_in[k]) p.state_in[k] += begin;
    }
    if (p.undo) p.undo += begin;
    if (p.compute_out) p.compute_out += begin;
    if (p.zero_grad) p.zero_grad += begin;
    p.param_offset += begin;
    p.n = n;
    return p;
}

// The values of n floats at x that are inf or NaN. Nearly always none: a quick test first
// (x * 0 is NaN exactly where x is inf or NaN, and a NaN stays in the sum), and the count
// only where it found some.
#if defined(__SSE2__)
__attribute__((target("avx2"))) bool any_nonfinite_avx2(const float *x, size_t n) {
    const __m256 zero = _mm256_setzero_ps();
    __m256 a = zero, b = zero;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(x + i), zero));
        b = _mm256_add_ps(b, _mm256_mul_ps(_mm256_loadu_ps(x + i + 8), zero));
    }
    const bool bad = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_add_ps(a, b), zero, _CMP_UNORD_Q)) != 0;
    _mm256_zeroupper();
    for (; i < n; ++i)
        if (!std::isfinite(x[i])) return true;
    return bad;
}
#endif

uint64_t count_nonfinite(const float *x, size_t n) {
#if defined(__SSE2__)
    if (kHaveAvx2 && !any_nonfinite_avx2(x, n)) return 0;
#endif
    uint64_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += std::isfinite(x[i]) ? 0 : 1;
    return bad;
}

// Copies the piece's params aside (into undo) and its slots' current values (state_in,
// or a custom optimizer's initial values at its first update) into this thread's working
// copies; updates the params in place and the working copies; then streams those into
// the slots' new buffers (state). Returns the custom function's result (0 for
// built-ins); after a failure the new buffers are not written (they are dropped).
int32_t update_piece(const Segment &p, float grad_scale, double *sumsq, std::string *message, uint64_t *nonfinite) {
    const Hyper &h = *p.hyper;
    const CustomOptimizer *c = is_custom(h.kind) ? find_custom(static_cast<int32_t>(h.kind)) : nullptr;
    const int slots = state_slots(h);
    float *work[kMaxStateSlots] = {nullptr, nullptr, nullptr};
    if (!p.undo) {
        // In place (SX_OPTIMIZER_IN_PLACE): the slots are updated where they are.
        for (int k = 0; k < slots; ++k) {
            work[k] = p.state[k];
            if (p.step == 1) std::fill(work[k], work[k] + p.n, c->initial[k]);
        }
    } else {
        for (int k = 0; k < slots; ++k) work[k] = slot_scratch() + static_cast<size_t>(k) * kPieceElements;
        stage_in(p, work, slots, c && p.step == 1 ? c->initial : nullptr);
    }
    int32_t rc = 0;
    if (!c) {
        Segment q = p;
        for (int k = 0; k < slots; ++k) q.state[k] = work[k];
        double part = 0.0;
        fused_update(&q, 1, grad_scale, nullptr, Isa::kAuto, sumsq ? &part : nullptr);
        if (sumsq) *sumsq += part;
    } else {
        if (sumsq) *sumsq += sum_of_squares(&p, 1, grad_scale, nullptr, Isa::kAuto);
        double values[SX_MAX_CUSTOM_HYPERPARAMETERS + kMaxHyperKey];
        for (size_t i = 0; i < c->hypers.size(); ++i) values[i] = hyper_value(h, c->hypers[i].key);
        sx_optimizer_piece_t piece;
        std::memset(&piece, 0, sizeof piece);
        piece.struct_size = sizeof piece;
        piece.param = p.param;
        piece.grad = p.grad;
        for (int k = 0; k < slots; ++k) piece.state[k] = work[k];
        piece.n = p.n;
        piece.grad_scale = grad_scale;
        piece.param_index = p.param_index;
        piece.param_group = p.param_group;
        piece.offset = p.param_offset;
        piece.step = p.step;
        piece.hyperparameters = values;
        piece.user_data = c->user_data;
        piece.num_slots = slots;
        piece.num_hyperparameters = static_cast<int32_t>(c->hypers.size());
        char error[SX_OPTIMIZER_ERROR_BYTES];
        error[0] = '\0';
        piece.error = error;
        piece.error_size = sizeof error;
        rc = c->update(&piece);
        if (rc != 0) message->assign(error, strnlen(error, sizeof error));
        if (rc == 0) {  // what it wrote, while it is in cache
            *nonfinite += count_nonfinite(p.param, p.n);
            for (int k = 0; k < slots; ++k) *nonfinite += count_nonfinite(work[k], p.n);
        }
        if (rc == 0 && p.compute_out) half::from_f32(p.compute_dtype, p.param, p.compute_out, p.n);
    }
    if (rc == 0 && p.undo)
        for (int k = 0; k < slots; ++k) stream_copy(p.state[k], work[k], p.n);
    return rc;
}

// Runs fn(segment piece) over every piece of segs, the pieces split evenly across the
// pool's threads in order (thread t takes a contiguous run of the elements).
template <typename F>
void for_each_piece(const Segment *segs, size_t num_segs, ThreadPool *pool, F fn) {
    size_t total = 0;
    for (size_t s = 0; s < num_segs; ++s) total += segs[s].n;
    const int threads = pool ? static_cast<int>(std::min<size_t>(pool->size(), total / kPieceElements + 1)) : 1;
    auto run = [&](int t) {
        const size_t begin = total * static_cast<size_t>(t) / threads, end = total * static_cast<size_t>(t + 1) / threads;
        size_t at = 0;  // elements before segment s
        for (size_t s = 0; s < num_segs && at < end; at += segs[s].n, ++s) {
            const size_t lo = std::max(begin, at), hi = std::min(end, at + segs[s].n);
            for (size_t i = lo; i < hi; i += kPieceElements) fn(t, piece_of(segs[s], i - at, std::min(kPieceElements, hi - i)));
        }
        stream_fence();
    };
    if (threads == 1)
        run(0);
    else
        pool->run([&](int t) {
            if (t < threads) run(t);
        });
}

}  // namespace

bool custom_update(const Segment *segs, size_t num_segs, float grad_scale, ThreadPool *pool, double *sumsq,
                   CustomFailure *failure) {
    const int most = pool ? pool->size() : 1;
    std::vector<double> sums(static_cast<size_t>(most), 0.0);
    std::vector<CustomFailure> found(static_cast<size_t>(most));  // per thread: its first failure, its inf/NaN
    for_each_piece(segs, num_segs, pool, [&](int t, const Segment &p) {
        CustomFailure &f = found[t];
        // After a failure the rest is still copied aside (it is all undone at once), not
        // updated.
        if (f.param >= 0) {
            if (p.undo) stream_copy(p.undo, p.param, p.n);
            return;
        }
        std::string message;
        uint64_t nonfinite = 0;
        const int32_t rc = update_piece(p, grad_scale, sumsq ? &sums[t] : nullptr, &message, &nonfinite);
        const char *name = spec_of(p.hyper->kind).name;
        if (rc != 0) {
            f.code = rc;
            f.param = p.param_index;
            f.optimizer = name;
            f.message = message;
        }
        if (nonfinite > 0 && f.nonfinite_param < 0) {
            f.nonfinite_param = p.param_index;
            f.nonfinite_optimizer = name;
        }
        f.nonfinite += nonfinite;
    });
    double total = 0.0;
    for (double s : sums) total += s;
    if (sumsq) *sumsq = total;
    *failure = CustomFailure();
    for (const CustomFailure &f : found) {  // the first failure and the first inf/NaN, in piece order
        if (f.param >= 0 && failure->param < 0) {
            failure->code = f.code;
            failure->param = f.param;
            failure->optimizer = f.optimizer;
            failure->message = f.message;
        }
        if (f.nonfinite_param >= 0 && failure->nonfinite_param < 0) {
            failure->nonfinite_param = f.nonfinite_param;
            failure->nonfinite_optimizer = f.nonfinite_optimizer;
        }
        failure->nonfinite += f.nonfinite;
    }
    return failure->param < 0;
}

void undo_double_buffered(const Segment *segs, size_t num_segs, ThreadPool *pool) {
    for_each_piece(segs, num_segs, pool, [](int, const Segment &p) {
        std::memcpy(p.param, p.undo, p.n * sizeof(float));
        if (p.compute_out) half::from_f32(p.compute_dtype, p.param, p.compute_out, p.n);
    });
}

}  // namespace optim
}  // namespace sx
