#include "core/params.h"

#include "optim/custom.h"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace sx {
namespace core {

Status validate_param_name(const char *name) {
    SX_CHECK_ARG(name != nullptr, "param name is NULL");
    size_t len = strnlen(name, SX_MAX_NAME_BYTES + 1);
    SX_CHECK_ARG(len > 0, "param name is empty");
    SX_CHECK_ARG(len <= SX_MAX_NAME_BYTES, "param name is longer than %d bytes", SX_MAX_NAME_BYTES);
    // UTF-8: reject stray continuation bytes, truncated sequences, overlong forms,
    // surrogates and code points above U+10FFFF.
    const unsigned char *s = reinterpret_cast<const unsigned char *>(name);
    for (size_t i = 0; i < len;) {
        unsigned c = s[i];
        size_t extra;
        unsigned cp;
        if (c < 0x80) {
            ++i;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            extra = 1, cp = c & 0x1F;
        } else if ((c & 0xF0) == 0xE0) {
            extra = 2, cp = c & 0x0F;
        } else if ((c & 0xF8) == 0xF0) {
            extra = 3, cp = c & 0x07;
        } else {
            return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "param name is not valid UTF-8 (byte %zu)", i);
        }
        if (i + extra >= len)
            return SX_ERROR(SX_ERR_INVALID_ARGUMENT,
                            "param name is not valid UTF-8 (truncated sequence at byte %zu)", i);
        for (size_t k = 1; k <= extra; ++k) {
            if ((s[i + k] & 0xC0) != 0x80)
                return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "param name is not valid UTF-8 (byte %zu)",
                                i + k);
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        static const unsigned kMin[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < kMin[extra] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "param name is not valid UTF-8 (byte %zu)", i);
        i += extra + 1;
    }
    return Status::Ok();
}

Status validate_shape(int32_t ndim, const int64_t *shape, uint64_t *numel) {
    SX_CHECK_ARG(ndim >= 0 && ndim <= SX_MAX_NDIM, "ndim %d is outside [0, %d]", ndim, SX_MAX_NDIM);
    SX_CHECK_ARG(ndim == 0 || shape != nullptr, "shape is NULL but ndim is %d", ndim);
    uint64_t n = 1;
    for (int32_t d = 0; d < ndim; ++d) {
        SX_CHECK_ARG(shape[d] >= 1,
                     "shape[%d] = %lld; extents must be >= 1 (a zero-sized param holds nothing to update, and "
                     "factored moments' row and column means of one would be of nothing)",
                     d, static_cast<long long>(shape[d]));
        SX_CHECK_ARG(static_cast<uint64_t>(shape[d]) <= (1ull << 62) / n,
                     "shape has more than 2^62 elements");
        n *= static_cast<uint64_t>(shape[d]);
    }
    *numel = n;
    return Status::Ok();
}

// A split piece: split_dim in range, global_shape equal to shape but on split_dim, and
// the piece within the logical tensor there.
static Status validate_split(const char *name, const std::vector<int64_t> &shape, const Placement &p) {
    const int32_t ndim = static_cast<int32_t>(shape.size());
    SX_CHECK_ARG(ndim >= 1, "param '%s': SX_PLACEMENT_SPLIT needs a dimension to split, and the param is a scalar",
                 name);
    SX_CHECK_ARG(p.split_dim >= 0 && p.split_dim < ndim, "param '%s': desc->split_dim %d is outside [0, %d)", name,
                 p.split_dim, ndim);
    SX_CHECK_ARG(static_cast<int32_t>(p.global_shape.size()) == ndim,
                 "param '%s': desc->global_shape is NULL; SX_PLACEMENT_SPLIT needs the logical tensor's %d extents",
                 name, ndim);
    for (int32_t d = 0; d < ndim; ++d) {
        if (d == p.split_dim) continue;
        SX_CHECK_ARG(p.global_shape[d] == shape[d],
                     "param '%s': desc->global_shape[%d] = %lld differs from shape[%d] = %lld; a piece split on "
                     "dimension %d has the logical tensor's extent on every other dimension",
                     name, d, static_cast<long long>(p.global_shape[d]), d, static_cast<long long>(shape[d]),
                     p.split_dim);
    }
    const int64_t extent = shape[p.split_dim], global = p.global_shape[p.split_dim];
    SX_CHECK_ARG(p.offset >= 0 && global >= extent && p.offset <= global - extent,
                 "param '%s': the piece [%lld, %lld) on dimension %d does not fit in the logical tensor's extent "
                 "%lld there (desc->split_offset %lld, shape[%d] = %lld, desc->global_shape[%d] = %lld)",
                 name, static_cast<long long>(p.offset), static_cast<long long>(p.offset + extent), p.split_dim,
                 static_cast<long long>(global), static_cast<long long>(p.offset), p.split_dim,
                 static_cast<long long>(extent), p.split_dim, static_cast<long long>(global));
    SX_CHECK_ARG(p.replica == 0 && p.replicas == 0,
                 "param '%s': desc->replica and desc->replicas are for SX_PLACEMENT_REPLICATED; they must be 0 for "
                 "SX_PLACEMENT_SPLIT", name);
    return Status::Ok();
}

std::string shape_text(const std::vector<int64_t> &shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string placement_text(const Placement &p) {
    if (p.kind == SX_PLACEMENT_REPLICATED)
        return "copy " + std::to_string(p.replica) + " of " + std::to_string(p.replicas);
    if (p.kind != SX_PLACEMENT_SPLIT) return "whole";
    const size_t d = static_cast<size_t>(p.split_dim);
    const int64_t global = d < p.global_shape.size() ? p.global_shape[d] : 0;
    // The piece's end is the offset plus the param's extent, which the caller's shape
    // gives; here the piece is named by its start and the logical tensor.
    return "the piece at " + std::to_string(p.offset) + " on dimension " + std::to_string(p.split_dim) + " (of " +
           std::to_string(global) + ") of " + shape_text(p.global_shape);
}

bool placement_loads_into(const Placement &saved, const Placement &here) {
    if (saved.kind != SX_PLACEMENT_SPLIT) return true;
    return here.kind == SX_PLACEMENT_SPLIT && here.split_dim == saved.split_dim &&
           here.global_shape == saved.global_shape && here.offset == saved.offset;
}

Status validate_placement(const char *name, const std::vector<int64_t> &shape, const Placement &p) {
    SX_CHECK_ARG(p.kind >= SX_PLACEMENT_WHOLE && p.kind <= SX_PLACEMENT_SPLIT,
                 "param '%s': desc->placement %d is not SX_PLACEMENT_WHOLE, _REPLICATED or _SPLIT", name, p.kind);
    if (p.kind == SX_PLACEMENT_SPLIT) return validate_split(name, shape, p);
    SX_CHECK_ARG(p.split_dim == 0 && p.global_shape.empty() && p.offset == 0,
                 "param '%s': desc->split_dim, global_shape and split_offset are for SX_PLACEMENT_SPLIT; they must be "
                 "0 (NULL) for placement %d", name, p.kind);
    if (p.kind == SX_PLACEMENT_WHOLE) {
        SX_CHECK_ARG(p.replica == 0 && p.replicas == 0,
                     "param '%s': desc->replica and desc->replicas are for SX_PLACEMENT_REPLICATED; they must be 0 "
                     "for SX_PLACEMENT_WHOLE", name);
        return Status::Ok();
    }
    SX_CHECK_ARG(p.replicas >= 1 && p.replica >= 0 && p.replica < p.replicas,
                 "param '%s': desc->replica %d is outside [0, desc->replicas = %d); SX_PLACEMENT_REPLICATED needs "
                 "replicas >= 1 and 0 <= replica < replicas", name, p.replica, p.replicas);
    return Status::Ok();
}

namespace {

// A hyperparameter's value as a double (flags are 0 or 1).
double as_double(double v) { return v; }
double as_double(bool v) { return v ? 1.0 : 0.0; }

}  // namespace

optim::Hyper hyper_from_desc(const sx_param_group_desc_t &d) {
    optim::Hyper h;
    h.kind = static_cast<optim::Kind>(d.optimizer);
#define SX_FROM_DESC(name, type, dflt, key, rule) h.name = static_cast<type>(d.name);
    SX_HYPERPARAMETERS(SX_FROM_DESC)
#undef SX_FROM_DESC
    // A custom optimizer's own hyperparameters start at their defaults (the descriptor
    // has no fields for them: sx_set_hyperparameter sets them).
    const optim::Hyper dflt = optim::default_hyper(h.kind);
    for (int i = 0; i < optim::kMaxCustomHypers; ++i) h.custom[i] = dflt.custom[i];
    return optim::with_unused_defaults(h);
}

void hyper_to_desc(const optim::Hyper &h, sx_param_group_desc_t *d) {
    d->optimizer = static_cast<int32_t>(h.kind);
#define SX_TO_DESC(name, type, dflt, key, rule) d->name = h.name;
    SX_HYPERPARAMETERS(SX_TO_DESC)
#undef SX_TO_DESC
}

Status check_desc_flags(const sx_param_group_desc_t &d) {
#define SX_CHECK_FLAG(name, type, dflt, key, rule)                                           \
    if (std::is_same<type, bool>::value)                                                        \
        SX_CHECK_ARG(d.name == 0 || d.name == 1, "desc->%s is %g; it must be 0 or 1", #name, \
                     static_cast<double>(d.name));
    SX_HYPERPARAMETERS(SX_CHECK_FLAG)
#undef SX_CHECK_FLAG
    return Status::Ok();
}

optim::Hyper default_hyper(int32_t optimizer) {
    return optim::default_hyper(static_cast<optim::Kind>(optimizer == 0 ? SX_OPTIM_ADAMW : optimizer));
}

uint64_t hyper_fingerprint(const optim::Hyper &h, uint64_t seed) {
    uint64_t f = fnv1a(&h.kind, sizeof h.kind, seed);
#define SX_FINGERPRINT(name, type, dflt, key, rule) \
    {                                                  \
        const type v = h.name;                         \
        f = fnv1a(&v, sizeof v, f);                    \
    }
    SX_HYPERPARAMETERS(SX_FINGERPRINT)
#undef SX_FINGERPRINT
    f = fnv1a(h.custom, sizeof h.custom, f);
    // A custom optimizer is the same on every rank if its name, slots and
    // hyperparameters are (its id is the order of registration, which may differ).
    if (const optim::CustomOptimizer *c = optim::find_custom(static_cast<int32_t>(h.kind))) {
        f = fnv1a(c->name.data(), c->name.size(), f);
        for (const std::string &slot : c->slot_names) f = fnv1a(slot.c_str(), slot.size() + 1, f);
        for (size_t k = 0; k < c->slot_names.size(); ++k) f = fnv1a(&c->initial[k], sizeof(float), f);
        for (const optim::CustomHyper &hp : c->hypers) f = fnv1a(hp.name.c_str(), hp.name.size() + 1, f);
    }
    return f;
}

const char *hyperparameter_name(int32_t key) {
#define SX_NAME_OF(name, type, dflt, k, rule) \
    if (key == k) return #name;
    SX_HYPERPARAMETERS(SX_NAME_OF)
#undef SX_NAME_OF
    return nullptr;
}

namespace {

Status assign(int32_t key, double value, double *out) {
    (void)key;
    *out = value;
    return Status::Ok();
}

Status assign(int32_t key, double value, bool *out) {
    SX_CHECK_ARG(value == 0.0 || value == 1.0, "%s must be 0 or 1, not %g", hyperparameter_name(key),
                 value);
    *out = value == 1.0;
    return Status::Ok();
}

}  // namespace

const char *hyperparameter_name(const optim::Hyper &h, int32_t key) {
    if (const optim::CustomOptimizer *c = optim::find_custom(static_cast<int32_t>(h.kind)))
        for (const optim::CustomHyper &hp : c->hypers)
            if (hp.key == key) return hp.name.c_str();
    return hyperparameter_name(key);
}

namespace {

// A custom optimizer's own hyperparameter `key` (SX_HP_CUSTOM + i): *index receives i.
Status custom_key(const optim::Hyper &h, int32_t key, int *index) {
    const optim::CustomOptimizer *c = optim::find_custom(static_cast<int32_t>(h.kind));
    SX_CHECK_ARG(c != nullptr, "key %d (SX_HP_CUSTOM + %d) names a custom optimizer's own hyperparameter; %s has none",
                 key, key - SX_HP_CUSTOM, optim::optimizer_name(h.kind).c_str());
    SX_CHECK_ARG(key - SX_HP_CUSTOM < c->num_own,
                 "key %d (SX_HP_CUSTOM + %d): the optimizer '%s' has %d hyperparameter%s of its own", key,
                 key - SX_HP_CUSTOM, c->name.c_str(), c->num_own, c->num_own == 1 ? "" : "s");
    *index = key - SX_HP_CUSTOM;
    return Status::Ok();
}

}  // namespace

Status set_hyperparameter(optim::Hyper *h, int32_t key, double value) {
    if (key >= SX_HP_CUSTOM) {
        int i = 0;
        SX_TRY(custom_key(*h, key, &i));
        optim::Hyper n = *h;
        n.custom[i] = value;
        Status s = optim::validate(n);
        if (!s.ok()) return s.prefix(format("setting %s = %g: ", hyperparameter_name(*h, key), value));
        *h = n;
        return Status::Ok();
    }
    const char *name = hyperparameter_name(key);
    SX_CHECK_ARG(name != nullptr, "unknown hyperparameter key %d (expected SX_HP_*)", key);
    optim::Hyper n = *h;
#define SX_SET(field, type, dflt, k, rule)                                                      \
    if (key == k) {                                                                                \
        SX_CHECK_ARG(optim::applies_to(k, h->kind), "%s does not apply to %s", name,              \
                     optim::optimizer_name(h->kind).c_str());                                      \
        SX_TRY(assign(key, value, &n.field));                                                      \
    }
    SX_HYPERPARAMETERS(SX_SET)
#undef SX_SET
    Status s = optim::validate(n);
    if (!s.ok()) return s.prefix(format("setting %s = %g: ", name, value));
    *h = n;
    return Status::Ok();
}

Status get_hyperparameter(const optim::Hyper &h, int32_t key, double *value) {
    if (key >= SX_HP_CUSTOM) {
        int i = 0;
        SX_TRY(custom_key(h, key, &i));
        *value = h.custom[i];
        return Status::Ok();
    }
    const char *name = hyperparameter_name(key);
    SX_CHECK_ARG(name != nullptr, "unknown hyperparameter key %d (expected SX_HP_*)", key);
#define SX_GET(field, type, dflt, k, rule) \
    if (key == k) *value = as_double(h.field);
    SX_HYPERPARAMETERS(SX_GET)
#undef SX_GET
    return Status::Ok();
}

uint64_t fnv1a(const void *data, size_t bytes, uint64_t seed) {
    const unsigned char *p = static_cast<const unsigned char *>(data);
    uint64_t h = seed;
    for (size_t i = 0; i < bytes; ++i) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

}  // namespace core
}  // namespace sx
