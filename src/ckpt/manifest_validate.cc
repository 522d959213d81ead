// validate(): the structural rules a manifest obeys, shared by the writer (a
// violation is the caller's bug: SX_ERR_INVALID_ARGUMENT from encode_manifest) and
// the reader (a violation is damage: SX_ERR_CORRUPT). Every message names the param,
// tensor and chunk, the param group, the file or the field at fault.
#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "ckpt/manifest.h"
#include "ckpt/shard_index.h"
#include "core/params.h"
#include "optim/state_codec.h"

namespace sx {
namespace ckpt {

namespace {

// A name for messages: quoted, bytes outside printable ASCII escaped, cut at 80 bytes
// (the name itself may be the damage).
std::string printable(const std::string &s) {
    std::string out = "'";
    for (size_t i = 0; i < s.size(); ++i) {
        if (i == 80) {
            out += "...";
            break;
        }
        const unsigned char c = static_cast<unsigned char>(s[i]);
        if (c >= 0x20 && c < 0x7F && c != '\'' && c != '\\')
            out.push_back(static_cast<char>(c));
        else
            out += format("\\x%02x", c);
    }
    return out + "'";
}

std::string param_label(size_t i, const ParamEntry &p) {
    return format("param %s (#%zu)", printable(p.name).c_str(), i);
}

// "param" or the torch state name, for messages; nullptr for an unknown kind.
const char *kind_name(TensorKind kind) {
    const int k = static_cast<int>(kind);
    if (k < 0 || k >= kNumTensorKinds) return nullptr;
    return kind == TensorKind::kParam ? "param" : tensor_suffix(kind) + 1;
}

// Re-issues a check of core (written for the C API's arguments) as damage in a manifest.
Status as_corrupt(const Status &s, const std::string &where) {
    if (s.ok()) return s;
    return Status(SX_ERR_CORRUPT, "manifest: " + where + ": " + s.message(), s.file(), s.line());
}

// A name a custom optimizer's registration accepts: 1 to 63 of [A-Za-z0-9_] (and '.'
// and '-' in an optimizer's name).
bool valid_custom_name(const std::string &name, bool dots) {
    if (name.empty() || name.size() > 63) return false;
    for (char c : name)
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              (dots && (c == '.' || c == '-'))))
            return false;
    return true;
}

// A custom optimizer's param group: what a registration could have given (its maths are
// the registering process's, so nothing else can be checked without it).
Status validate_custom_group(const ParamGroupEntry &e, size_t g) {
    SX_CHECK(valid_custom_name(e.optimizer_name, true), SX_ERR_CORRUPT,
             "manifest: param group %zu: custom optimizer name %s is not 1 to 63 of [A-Za-z0-9_.-]", g,
             printable(e.optimizer_name).c_str());
    SX_CHECK(e.slot_names.size() <= static_cast<size_t>(SX_MAX_CUSTOM_SLOTS), SX_ERR_CORRUPT,
             "manifest: param group %zu: %zu state slots; a custom optimizer has at most %d", g, e.slot_names.size(),
             SX_MAX_CUSTOM_SLOTS);
    for (size_t k = 0; k < e.slot_names.size(); ++k) {
        SX_CHECK(valid_custom_name(e.slot_names[k], false), SX_ERR_CORRUPT,
                 "manifest: param group %zu: slot name %s is not 1 to 63 of [A-Za-z0-9_]", g,
                 printable(e.slot_names[k]).c_str());
        for (size_t j = 0; j < k; ++j)
            SX_CHECK(e.slot_names[j] != e.slot_names[k], SX_ERR_CORRUPT,
                     "manifest: param group %zu: slot '%s' is listed twice", g, e.slot_names[k].c_str());
    }
    SX_CHECK(e.custom_names.size() == e.custom_values.size() &&
                 e.custom_names.size() <= static_cast<size_t>(SX_MAX_CUSTOM_HYPERPARAMETERS),
             SX_ERR_CORRUPT, "manifest: param group %zu: %zu custom hyperparameter names, %zu values (at most %d)", g,
             e.custom_names.size(), e.custom_values.size(), SX_MAX_CUSTOM_HYPERPARAMETERS);
    for (size_t i = 0; i < e.custom_names.size(); ++i) {
        SX_CHECK(valid_custom_name(e.custom_names[i], false) && std::isfinite(e.custom_values[i]), SX_ERR_CORRUPT,
                 "manifest: param group %zu: custom hyperparameter %s = %g is not a name of [A-Za-z0-9_] with a "
                 "finite value",
                 g, printable(e.custom_names[i]).c_str(), e.custom_values[i]);
        for (size_t j = 0; j < i; ++j)
            SX_CHECK(e.custom_names[j] != e.custom_names[i], SX_ERR_CORRUPT,
                     "manifest: param group %zu: custom hyperparameter '%s' is listed twice", g,
                     e.custom_names[i].c_str());
    }
#define SX_CHECK_FINITE(name, type, dflt, key, rule)                                                              \
    SX_CHECK(std::isfinite(static_cast<double>(e.name)), SX_ERR_CORRUPT, "manifest: param group %zu: %s is %g", g, \
             #name, static_cast<double>(e.name));
    SX_HYPERPARAMETERS(SX_CHECK_FINITE)
#undef SX_CHECK_FINITE
    return Status::Ok();
}

Status validate_header(const Manifest &m) {
    SX_CHECK(m.world_size >= 1, SX_ERR_CORRUPT, "manifest: world_size is %d; it must be >= 1", m.world_size);
    SX_CHECK(m.step <= kMaxSteps, SX_ERR_CORRUPT, "manifest: step is %llu, more than the %llu steps a count may hold",
             static_cast<unsigned long long>(m.step), static_cast<unsigned long long>(kMaxSteps));
    SX_CHECK(m.shard_size == 0 || (m.shard_size >= 1 && m.shard_size <= m.world_size && m.world_size % m.shard_size == 0),
             SX_ERR_CORRUPT, "manifest: shard_size is %d; it must be 0 or a divisor of world_size %d", m.shard_size,
             m.world_size);
    SX_CHECK(m.stage >= 1 && m.stage <= 3, SX_ERR_CORRUPT, "manifest: stage is %d; it must be 1, 2 or 3", m.stage);
    SX_CHECK(m.alignment >= 1 && m.alignment <= (1 << 20) && (m.alignment & (m.alignment - 1)) == 0,
             SX_ERR_CORRUPT, "manifest: alignment is %d; it must be a power of two in [1, 2^20] bytes",
             m.alignment);
    SX_CHECK(m.user_blob.size() <= kMaxUserBlobBytes, SX_ERR_CORRUPT,
             "manifest: user_blob is %zu bytes, more than the %llu-byte limit", m.user_blob.size(),
             static_cast<unsigned long long>(kMaxUserBlobBytes));
    const LossScalerEntry &ls = m.loss_scaler;
    SX_CHECK(std::isfinite(ls.scale) && ls.scale > 0, SX_ERR_CORRUPT,
             "manifest: loss_scaler.scale is %g; it must be finite and > 0", ls.scale);
    SX_CHECK(std::isfinite(ls.growth_factor) && ls.growth_factor >= 0, SX_ERR_CORRUPT,
             "manifest: loss_scaler.growth_factor is %g; it must be finite and >= 0", ls.growth_factor);
    SX_CHECK(std::isfinite(ls.backoff_factor) && ls.backoff_factor >= 0, SX_ERR_CORRUPT,
             "manifest: loss_scaler.backoff_factor is %g; it must be finite and >= 0", ls.backoff_factor);
    SX_CHECK(ls.growth_tracker >= 0 && ls.growth_interval >= 0, SX_ERR_CORRUPT,
             "manifest: loss_scaler.growth_tracker (%lld) and growth_interval (%lld) must be >= 0",
             static_cast<long long>(ls.growth_tracker), static_cast<long long>(ls.growth_interval));
    for (size_t g = 0; g < m.param_groups.size(); ++g) {
        const ParamGroupEntry &e = m.param_groups[g];
        SX_CHECK(e.steps >= 0 && static_cast<uint64_t>(e.steps) <= m.step, SX_ERR_CORRUPT,
                 "manifest: param group %zu took %lld steps, more than the checkpoint's %llu", g,
                 static_cast<long long>(e.steps), static_cast<unsigned long long>(m.step));
        if (e.optimizer == kCustomOptimizer) {
            SX_TRY(validate_custom_group(e, g));
            continue;
        }
        SX_CHECK(e.optimizer_name.empty() && e.slot_names.empty() && e.custom_names.empty() && e.custom_values.empty(),
                 SX_ERR_CORRUPT, "manifest: param group %zu (%s) has a custom optimizer's names or values", g,
                 optim::optimizer_name(e.optimizer).c_str());
        SX_TRY(as_corrupt(optim::validate(hyper_of(e)), format("param group %zu", g)));
    }
    std::unordered_set<std::string> files;
    for (size_t f = 0; f < m.files.size(); ++f) {
        const std::string &name = m.files[f];
        SX_CHECK(!name.empty() && name.size() <= kMaxFileNameBytes && name != "." && name != ".." &&
                     name.find_first_of(std::string("/\0", 2)) == std::string::npos,
                 SX_ERR_CORRUPT,
                 "manifest: file #%zu is named %s; a shard file name is 1 to %llu bytes, without '/' "
                 "or NUL, and not \".\" or \"..\"",
                 f, printable(name).c_str(), static_cast<unsigned long long>(kMaxFileNameBytes));
        SX_CHECK(files.insert(name).second, SX_ERR_CORRUPT, "manifest: file #%zu, %s, is listed twice", f,
                 printable(name).c_str());
    }
    if (!m.chunks_in_files()) {
        SX_CHECK(m.file_indexes.empty(), SX_ERR_CORRUPT, "manifest: format %u.%u lists %zu file indexes; it has none",
                 m.format_major, m.format_minor, m.file_indexes.size());
        return Status::Ok();
    }
    // 2.0: one file per shard of the saving layout, each with its index at its end.
    const int32_t shards = m.shard_size ? m.shard_size : m.world_size;
    SX_CHECK(m.files.size() == static_cast<size_t>(shards) && m.file_indexes.size() == m.files.size(),
             SX_ERR_CORRUPT,
             "manifest: %zu files and %zu file indexes are listed; a checkpoint of %d shards has one of each per "
             "shard",
             m.files.size(), m.file_indexes.size(), shards);
    for (size_t f = 0; f < m.file_indexes.size(); ++f) {
        const FileIndex &fi = m.file_indexes[f];
        SX_CHECK(fi.length == kIndexHeaderBytes + uint64_t{fi.chunks} * kIndexRecordBytes &&
                     fi.offset <= UINT64_MAX - fi.length,
                 SX_ERR_CORRUPT,
                 "manifest: the index of file %s is %llu bytes at byte %llu; %u records take %llu bytes",
                 printable(m.files[f]).c_str(), static_cast<unsigned long long>(fi.length),
                 static_cast<unsigned long long>(fi.offset), fi.chunks,
                 static_cast<unsigned long long>(kIndexHeaderBytes + uint64_t{fi.chunks} * kIndexRecordBytes));
    }
    return Status::Ok();
}

}  // namespace

std::string optimizer_text(const ParamGroupEntry &g) {
    if (g.optimizer == kCustomOptimizer) return "the custom optimizer '" + g.optimizer_name + "'";
    std::string name = optim::optimizer_name(g.optimizer);
    if (g.optimizer == SX_OPTIM_ADAM || g.optimizer == SX_OPTIM_ADAMW)
        return name + (g.amsgrad ? " with amsgrad" : " without amsgrad");
    if (g.optimizer == SX_OPTIM_RMSPROP)
        name += std::string(g.momentum > 0 ? " with" : " without") + " momentum" + (g.centered ? ", centered" : "");
    return name;
}

namespace {

// Whether a tensor of `kind` belongs to a param updated with optimizer `g` (the state
// slots of its row of the optimizer table).
bool kind_fits(TensorKind kind, const ParamGroupEntry &g, int ndim) {
    for (TensorKind k : stored_kinds(g, ndim))
        if (k == kind) return true;
    return false;
}

// 4.0: a param's state tensors are stored in its group's state dtype (as the param keeps
// it: an 8-bit group's param too small or not a multiple of kScaleBlock keeps fp32), and
// the Q8 codes of state slot k come with their scales (kScales0 + k), and only they.
// 2.0: a param with scales lay in the files so that every file boundary inside it is a
// block boundary (sx's layouts make blocks follow shards), so that each file holds whole
// blocks of it and their scales.
Status validate_blocks_in_files(const Manifest &m, const ParamEntry &p, const std::string &label) {
    bool scaled = false;
    for (const Tensor &t : p.tensors) scaled = scaled || is_scales(t.kind);
    if (!scaled || !m.chunks_in_files() || p.unit_shard_numel == 0) return Status::Ok();
    const uint64_t s = p.unit_shard_numel, numel = p.numel();
    for (uint64_t q = p.unit_offset / s + 1; q < m.files.size() && q * s < p.unit_offset + numel; ++q)
        SX_CHECK((q * s - p.unit_offset) % kScaleBlock == 0, SX_ERR_CORRUPT,
                 "manifest: %s: shard file %llu begins at its element %llu, inside a block of its 8-bit state",
                 label.c_str(), static_cast<unsigned long long>(q), static_cast<unsigned long long>(q * s - p.unit_offset));
    return Status::Ok();
}

Status validate_state_dtypes(const ParamEntry &p, const ParamGroupEntry &group, const std::string &label) {
    const int ndim = static_cast<int>(p.shape.size());
    const std::vector<TensorKind> kinds = stored_kinds(group, ndim);
    const int32_t state = optim::param_state_dtype(static_cast<int32_t>(group.state_dtype), p.numel());
    const int32_t want = state_tensor_dtype(state);
    auto has = [&](TensorKind kind) {
        for (const Tensor &t : p.tensors)
            if (t.kind == kind) return true;
        return false;
    };
    for (const Tensor &t : p.tensors) {
        const char *kind = kind_name(t.kind);
        if (t.kind == TensorKind::kParam) {
            SX_CHECK(t.dtype != kDTypeQ8, SX_ERR_CORRUPT, "manifest: %s: its values are stored as Q8 codes",
                     label.c_str());
        } else if (is_scales(t.kind)) {
            const size_t slot = static_cast<size_t>(scales_slot(t.kind)) + 1;
            SX_CHECK(state == SX_STATE_8BIT && slot < kinds.size() && has(kinds[slot]) && t.dtype == SX_DTYPE_F32,
                     SX_ERR_CORRUPT,
                     "manifest: %s: tensor %s (dtype %d) is no F32 scales of an 8-bit state slot it stores (its group "
                     "keeps %s state)",
                     label.c_str(), kind, t.dtype, optim::state_dtype_name(group.state_dtype));
        } else {
            SX_CHECK(t.dtype == want, SX_ERR_CORRUPT,
                     "manifest: %s: tensor %s is stored as dtype %d; its param group keeps %s state, stored as %d",
                     label.c_str(), kind, t.dtype, optim::state_dtype_name(state), want);
            const int slot = static_cast<int>(std::find(kinds.begin(), kinds.end(), t.kind) - kinds.begin()) - 1;
            SX_CHECK(want != kDTypeQ8 || (slot >= 0 && slot < 3 && has(scales_kind(slot))), SX_ERR_CORRUPT,
                     "manifest: %s: tensor %s holds 8-bit codes without their scales", label.c_str(), kind);
        }
    }
    return Status::Ok();
}

// Where a chunk sits, for the check that chunks of one file do not overlap.
struct Extent {
    uint32_t file;
    uint64_t offset, end;
    size_t param, tensor, chunk;
};

Status validate_chunks(const Manifest &m, size_t pi, size_t ti, uint64_t numel, std::vector<Extent> *extents) {
    const ParamEntry &p = m.params[pi];
    const Tensor &t = p.tensors[ti];
    const uint64_t elem = dtype_bytes(t.dtype);
    uint64_t covered = 0;  // chunks so far cover [0, covered)
    for (size_t ci = 0; ci < t.chunks.size(); ++ci) {
        const Chunk &c = t.chunks[ci];
        // Only a failed check puts the chunk in words: a manifest holds millions of chunks.
        auto where = [&] {
            return format("%s, tensor %s, chunk %zu", param_label(pi, p).c_str(), kind_name(t.kind), ci);
        };
        SX_CHECK(c.begin == covered, SX_ERR_CORRUPT, "manifest: %s begins at element %llu; expected %llu (%s)",
                 where().c_str(), static_cast<unsigned long long>(c.begin), static_cast<unsigned long long>(covered),
                 c.begin < covered ? "chunks overlap or are out of order" : "elements left uncovered");
        SX_CHECK(c.end > c.begin && c.end <= numel, SX_ERR_CORRUPT,
                 "manifest: %s is elements [%llu, %llu); it must be non-empty and end by %llu (the "
                 "param's element count)",
                 where().c_str(), static_cast<unsigned long long>(c.begin), static_cast<unsigned long long>(c.end),
                 static_cast<unsigned long long>(numel));
        uint64_t length = 0;
        SX_CHECK(!__builtin_mul_overflow(c.end - c.begin, elem, &length), SX_ERR_CORRUPT,
                 "manifest: %s: %llu elements of %llu bytes are more than 2^64 bytes", where().c_str(),
                 static_cast<unsigned long long>(c.end - c.begin), static_cast<unsigned long long>(elem));
        SX_CHECK(c.length == length, SX_ERR_CORRUPT,
                 "manifest: %s is %llu bytes long; %llu elements of %llu bytes make %llu", where().c_str(),
                 static_cast<unsigned long long>(c.length),
                 static_cast<unsigned long long>(c.end - c.begin), static_cast<unsigned long long>(elem),
                 static_cast<unsigned long long>(length));
        SX_CHECK(c.offset % kChunkAlignment == 0, SX_ERR_CORRUPT,
                 "manifest: %s starts at byte %llu of its file, not a multiple of %llu", where().c_str(),
                 static_cast<unsigned long long>(c.offset), static_cast<unsigned long long>(kChunkAlignment));
        SX_CHECK(c.file < m.files.size(), SX_ERR_CORRUPT, "manifest: %s is in file #%u, but %zu files are listed",
                 where().c_str(), c.file, m.files.size());
        uint64_t end = 0;
        SX_CHECK(!__builtin_add_overflow(c.offset, c.length, &end), SX_ERR_CORRUPT,
                 "manifest: %s ends past byte 2^64 of its file", where().c_str());
        extents->push_back(Extent{c.file, c.offset, end, pi, ti, ci});
        covered = c.end;
    }
    SX_CHECK(covered == numel, SX_ERR_CORRUPT,
             "manifest: %s, tensor %s: its chunks cover elements [0, %llu) of %llu", param_label(pi, p).c_str(),
             kind_name(t.kind), static_cast<unsigned long long>(covered), static_cast<unsigned long long>(numel));
    return Status::Ok();
}

// Adafactor's factored moments: only for a param of two or more dimensions in an
// Adafactor group, each of its size (prod(shape[:-1]) rows, prod(shape[:-2]) * C
// columns) or empty (before the first update), finite and >= 0 (means of squares).
Status validate_factors(const ParamEntry &p, const ParamGroupEntry &group, const std::string &label) {
    if (p.row_var.empty() && p.col_var.empty()) return Status::Ok();
    SX_CHECK(group.optimizer == SX_OPTIM_ADAFACTOR && p.shape.size() >= 2, SX_ERR_CORRUPT,
             "manifest: %s holds factored moments (row_var, col_var), which only a param of two or more "
             "dimensions keeps under Adafactor (it has %zu, under %s)",
             label.c_str(), p.shape.size(), optimizer_text(group).c_str());
    const uint64_t cols = static_cast<uint64_t>(p.shape.back());
    const uint64_t rows = p.numel() / cols, batch = rows / static_cast<uint64_t>(p.shape[p.shape.size() - 2]);
    SX_CHECK(p.row_var.size() == rows && p.col_var.size() == batch * cols, SX_ERR_CORRUPT,
             "manifest: %s: row_var holds %zu values and col_var %zu; its shape needs %llu and %llu", label.c_str(),
             p.row_var.size(), p.col_var.size(), static_cast<unsigned long long>(rows),
             static_cast<unsigned long long>(batch * cols));
    for (const std::vector<float> *v : {&p.row_var, &p.col_var})
        for (float x : *v)
            SX_CHECK(std::isfinite(x) && x >= 0.0f, SX_ERR_CORRUPT,
                     "manifest: %s: its %s holds %g; means of squares are finite and >= 0", label.c_str(),
                     v == &p.row_var ? "row_var" : "col_var", static_cast<double>(x));
    return Status::Ok();
}

// A param's placement (written since 1.7; whole in older files), by the rules
// sx_add_param applies.
Status validate_param_placement(const ParamEntry &p, const std::string &label) {
    return as_corrupt(core::validate_placement(p.name.c_str(), p.shape, entry_placement(p)), label);
}

Status validate_param(const Manifest &m, size_t pi, std::vector<Extent> *extents) {
    const ParamEntry &p = m.params[pi];
    const std::string label = param_label(pi, p);
    SX_CHECK(p.name.find('\0') == std::string::npos, SX_ERR_CORRUPT, "manifest: %s: the name holds a NUL byte",
             label.c_str());
    SX_TRY(as_corrupt(core::validate_param_name(p.name.c_str()), label));
    SX_CHECK(p.shape.size() <= SX_MAX_NDIM, SX_ERR_CORRUPT, "manifest: %s has %zu dimensions, more than %d",
             label.c_str(), p.shape.size(), SX_MAX_NDIM);
    uint64_t numel = 0;
    SX_TRY(as_corrupt(core::validate_shape(static_cast<int32_t>(p.shape.size()), p.shape.data(), &numel), label));
    SX_CHECK(dtype_bytes(p.dtype) != 0, SX_ERR_CORRUPT, "manifest: %s: dtype %d is not SX_DTYPE_F32, F16 or BF16",
             label.c_str(), p.dtype);
    SX_CHECK(p.unit >= 0, SX_ERR_CORRUPT, "manifest: %s: unit is %d; it must be >= 0", label.c_str(), p.unit);
    SX_CHECK(p.param_group >= 0 && static_cast<size_t>(p.param_group) < m.param_groups.size(), SX_ERR_CORRUPT,
             "manifest: %s: param group %d does not exist (%zu are listed)", label.c_str(), p.param_group,
             m.param_groups.size());
    SX_CHECK(optim::valid_steps(p.step, p.momentum_steps), SX_ERR_CORRUPT,
             "manifest: %s: step %lld and momentum_steps %lld; they must satisfy 0 <= momentum_steps <= step <= 2^53",
             label.c_str(), static_cast<long long>(p.step), static_cast<long long>(p.momentum_steps));
    SX_CHECK(std::isfinite(p.mu_product) && p.mu_product >= 0.0f && p.mu_product <= 1.0f, SX_ERR_CORRUPT,
             "manifest: %s: mu_product %g is not in [0, 1]", label.c_str(), static_cast<double>(p.mu_product));
    SX_TRY(validate_param_placement(p, label));
    // No param is updated more often than the group steps.
    SX_CHECK(static_cast<uint64_t>(p.step) <= m.step, SX_ERR_CORRUPT,
             "manifest: %s: step %lld is more than the checkpoint's %llu steps", label.c_str(),
             static_cast<long long>(p.step), static_cast<unsigned long long>(m.step));
    const ParamGroupEntry &group = m.param_groups[static_cast<size_t>(p.param_group)];
    unsigned seen_kinds = 0;
    for (size_t ti = 0; ti < p.tensors.size(); ++ti) {
        const Tensor &t = p.tensors[ti];
        const char *kind = kind_name(t.kind);
        SX_CHECK(kind != nullptr, SX_ERR_CORRUPT, "manifest: %s, tensor #%zu: kind %d is unknown", label.c_str(), ti,
                 static_cast<int>(t.kind));
        SX_CHECK(dtype_bytes(t.dtype) != 0 && (m.format_major >= 4 || t.dtype != kDTypeQ8), SX_ERR_CORRUPT,
                 "manifest: %s, tensor %s: dtype %d is not F32, F16, BF16 or (from 4.0) Q8", label.c_str(), kind,
                 t.dtype);
        const unsigned bit = 1u << static_cast<int>(t.kind);
        SX_CHECK((seen_kinds & bit) == 0, SX_ERR_CORRUPT, "manifest: %s: tensor %s is listed twice", label.c_str(),
                 kind);
        seen_kinds |= bit;
        SX_CHECK(is_scales(t.kind) ? m.format_major >= 4 : kind_fits(t.kind, group, static_cast<int>(p.shape.size())),
                 SX_ERR_CORRUPT,
                 "manifest: %s: tensor %s does not belong to its param group %d (%s)", label.c_str(), kind,
                 p.param_group, optimizer_text(group).c_str());
        if (m.chunks_in_files())
            SX_CHECK(t.chunks.empty(), SX_ERR_CORRUPT,
                     "manifest: %s, tensor %s lists chunks; from format 2.0 they are in the files' indexes",
                     label.c_str(), kind);
        else
            SX_TRY(validate_chunks(m, pi, ti, numel / kind_block(t.kind), extents));
    }
    SX_TRY(validate_state_dtypes(p, group, label));
    SX_TRY(validate_factors(p, group, label));
    if (m.chunks_in_files()) {
        // The param lay in the saving layout within the files: file q holds the part
        // [q * S, (q + 1) * S) of its unit's flat buffer.
        uint64_t end = 0, span = 0;
        SX_CHECK(p.unit_shard_numel >= 1 && !__builtin_add_overflow(p.unit_offset, numel, &end) &&
                     !__builtin_mul_overflow(p.unit_shard_numel, static_cast<uint64_t>(m.files.size()), &span) &&
                     end <= span,
                 SX_ERR_CORRUPT,
                 "manifest: %s lies at elements [%llu, +%llu) of its unit, whose %zu shards are %llu elements each",
                 label.c_str(), static_cast<unsigned long long>(p.unit_offset), static_cast<unsigned long long>(numel),
                 m.files.size(), static_cast<unsigned long long>(p.unit_shard_numel));
    }
    return validate_blocks_in_files(m, p, label);
}

}  // namespace

core::Placement entry_placement(const ParamEntry &p) {
    core::Placement at;
    at.kind = p.placement;
    at.split_dim = p.split_dim;
    at.global_shape = p.global_shape;
    at.offset = p.split_offset;
    at.replica = p.replica;
    at.replicas = p.replicas;
    return at;
}

Status validate(const Manifest &m) {
    SX_TRY(validate_header(m));
    // Packed state is new in 4.0: an older major's group keeps fp32 state.
    for (size_t g = 0; g < m.param_groups.size(); ++g)
        SX_CHECK(m.format_major >= 4 || m.param_groups[g].state_dtype == SX_STATE_FP32, SX_ERR_CORRUPT,
                 "manifest: param group %zu keeps %s state, which format %u.%u cannot hold (from 4.0)", g,
                 optim::state_dtype_name(m.param_groups[g].state_dtype), m.format_major, m.format_minor);
    std::unordered_map<std::string, size_t> names;
    names.reserve(m.params.size());
    std::vector<Extent> extents;
    for (size_t pi = 0; pi < m.params.size(); ++pi) {
        SX_TRY(validate_param(m, pi, &extents));
        const auto inserted = names.emplace(m.params[pi].name, pi);
        SX_CHECK(inserted.second, SX_ERR_CORRUPT, "manifest: %s has the name of param #%zu",
                 param_label(pi, m.params[pi]).c_str(), inserted.first->second);
    }
    // Two chunks sharing bytes of one file would each read the other's data.
    std::sort(extents.begin(), extents.end(), [](const Extent &a, const Extent &b) {
        if (a.file != b.file) return a.file < b.file;
        if (a.offset != b.offset) return a.offset < b.offset;
        return a.param != b.param ? a.param < b.param : a.tensor < b.tensor;  // deterministic messages
    });
    for (size_t i = 1; i < extents.size(); ++i) {
        const Extent &a = extents[i - 1], &b = extents[i];
        if (a.file != b.file || a.end <= b.offset) continue;
        const ParamEntry &pa = m.params[a.param], &pb = m.params[b.param];
        return SX_ERROR(SX_ERR_CORRUPT,
                        "manifest: %s, tensor %s, chunk %zu and %s, tensor %s, chunk %zu share bytes of file %s "
                        "(from byte %llu)",
                        param_label(a.param, pa).c_str(), kind_name(pa.tensors[a.tensor].kind), a.chunk,
                        param_label(b.param, pb).c_str(), kind_name(pb.tensors[b.tensor].kind), b.chunk,
                        printable(m.files[a.file]).c_str(), static_cast<unsigned long long>(b.offset));
    }
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
