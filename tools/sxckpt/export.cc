// sxckpt export --safetensors OUT [--optimizer PREFIX [--state-format torch|torchao]] DIR:
// the full, unsharded params as one safetensors file (safetensors.h), and on request the
// optimizer state as PREFIX.safetensors and PREFIX.json (optimizer_json.h), in torch's
// names:
//
//   OUT                  NAME for every param, in its shape ([] for a scalar): what
//                        torch's Module.load_state_dict(strict=True) takes
//   PREFIX.safetensors   NAME.exp_avg, NAME.exp_avg_sq, NAME.max_exp_avg_sq,
//                        NAME.momentum_buffer, ...: the state tensors each param has
//                        (Adafactor's factored NAME.row_var and NAME.col_var, from
//                        the MANIFEST, in torch's shapes [..., R, 1] and [..., 1, C])
//   PREFIX.json          the param groups in torch's key names, each param's steps
//
// Values and fp32 state are exported as stored ("F32"). Packed state (format 4.0) is
// exported, by default ("torch"), as fp32 in the param's shape: a bf16 slot widened, an
// 8-bit slot decoded as sx's kernels decode it (map[code] x its block's scale); with
// "torchao", in the form of torchao's OptimState8bit: a bf16 slot as BF16, an 8-bit slot
// as NAME.SLOT.codes (U8, the param's shape) and NAME.SLOT.scale (F32, one per block of
// 256), both copied as stored.
//
// Streaming: the headers come from the MANIFEST alone (every tensor's size is known
// from its shape), then the shard files are read one at a time, chunk by chunk in
// file order, each chunk's CRC32C checked while its bytes go straight to their place
// in their output (an 8-bit chunk's scales are read first, from their own chunks).
// Memory: the manifest, the headers, one buffer of at most kPieceBytes and small
// conversion buffers, whatever the size of the checkpoint. Every output is written as
// NAME.tmp and fsynced; only once all are complete are they renamed into place, and
// their directories fsynced. A failure leaves no .tmp behind and none of the outputs
// this run renamed.
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_set>

#include <algorithm>

#include "base/half.h"
#include "checkpoint_dir.h"
#include "ckpt/directory.h"
#include "core/params.h"
#include "commands.h"
#include "optimizer_json.h"
#include "optim/state_codec.h"

namespace sx {
namespace tool {

namespace {

// Elements converted at a time (kWidenBf16, kDecode8): the size of the fp32 buffer.
constexpr size_t kConvertElems = 1u << 16;

// How packed optimizer state is exported (--state-format).
enum class StateFormat {
    kTorch,    // fp32 in torch's names: what torch.optim's state dicts hold
    kTorchao,  // torchao's OptimState8bit: NAME.SLOT.codes and NAME.SLOT.scale; bf16 as BF16
};

// One safetensors output.
struct OutFile {
    std::string path;
    std::vector<StTensor> tensors;
    std::string head;  // the length field and the header
    uint64_t data_bytes = 0;
    int fd = -1;
    // Tensors whose values the MANIFEST holds (Adafactor's factored moments): their
    // data's offset and values.
    std::vector<std::pair<uint64_t, const std::vector<float> *>> from_manifest;
};

// How a stored tensor's bytes become the exported ones.
enum class Conversion {
    kCopy,       // as stored
    kWidenBf16,  // bf16 state as fp32 (exact)
    kDecode8,    // 8-bit codes as fp32: map[code] x the block's scale
};

// Where a stored tensor goes: file index into ExportPlan::files (-1: not exported) and
// the tensor's index there; for kDecode8 the map and the index of the scales' tensor
// (into the param's tensors).
struct Route {
    int file = -1;
    size_t tensor = 0;
    Conversion conversion = Conversion::kCopy;
    const float *map = nullptr;
    size_t scales = 0;
    // A piece of a split tensor (several checkpoints): its element i is element
    // base + (i / run) * stride + i % run of the logical tensor. run 0: element i is i.
    uint64_t base = 0, run = 0, stride = 0;
};

struct ExportPlan {
    StateFormat state_format = StateFormat::kTorch;
    std::vector<OutFile> files;               // [0] the params, [1] the optimizer state
    std::vector<std::vector<std::vector<Route>>> route;  // [checkpoint][param][tensor], as in its manifest
    std::string optimizer_json;               // "" unless asked for
    // Several checkpoints: the logical model's manifest, for PREFIX.json (each logical
    // param once, with its group and step counts; unit 0).
    ckpt::Manifest logical;
    // For `sxckpt join`: refuse what import would not store again exactly (a split
    // param whose pieces keep another state dtype than the logical tensor would), and
    // carry the loss scaler and the user blob in PREFIX.json.
    bool exact = false;
};

// Where tensor i of param p goes, as what: *o gets its name, dtype and shape. The
// params go to file 0; their optimizer state to file 1 (which exists only with
// --optimizer). Packed state in StateFormat::kTorch: fp32 in the param's shape (the
// scales are read for decoding, not exported); in kTorchao: bf16 as it is, 8-bit as
// NAME.SLOT.codes (U8) and NAME.SLOT.scale (F32, [blocks]).
Route route_of(const ckpt::Manifest &m, const ckpt::ParamEntry &p, size_t i, StateFormat format, StTensor *o) {
    const ckpt::Tensor &t = p.tensors[i];
    const ckpt::ParamGroupEntry &g = m.param_groups[static_cast<size_t>(p.param_group)];
    Route r;
    r.file = t.kind == ckpt::TensorKind::kParam ? 0 : 1;
    o->dtype = t.dtype;
    o->shape = p.shape;
    if (t.kind == ckpt::TensorKind::kParam) {
        o->name = p.name;
        return r;
    }
    const bool torchao = format == StateFormat::kTorchao;
    const int ndim = static_cast<int>(p.shape.size());
    if (ckpt::is_scales(t.kind)) {
        if (!torchao) r.file = -1;  // read while decoding its slot
        const std::vector<ckpt::TensorKind> kinds = ckpt::stored_kinds(g, ndim);
        o->name = p.name + "." + ckpt::tensor_name(g, kinds[static_cast<size_t>(ckpt::scales_slot(t.kind)) + 1]) +
                  ".scale";
        o->shape = {static_cast<int64_t>(p.numel(t.kind))};
        return r;
    }
    // A custom optimizer's slots carry the names it registered.
    o->name = p.name + "." + ckpt::tensor_name(g, t.kind);
    if (t.dtype == ckpt::kDTypeQ8 && torchao) {
        o->name += ".codes";
    } else if (t.dtype == ckpt::kDTypeQ8) {
        o->dtype = SX_DTYPE_F32;
        r.conversion = Conversion::kDecode8;
        const std::vector<ckpt::TensorKind> kinds = ckpt::stored_kinds(g, ndim);
        const int slot = static_cast<int>(std::find(kinds.begin(), kinds.end(), t.kind) - kinds.begin()) - 1;
        r.map = optim::state_slot_nonnegative(ckpt::hyper_of(g), slot, ndim) ? optim::kUnsignedMap
                                                                               : optim::kSignedMap;
        for (size_t j = 0; j < p.tensors.size(); ++j)
            if (p.tensors[j].kind == ckpt::scales_kind(slot)) r.scales = j;
    } else if (t.dtype == SX_DTYPE_BF16 && !torchao) {
        o->dtype = SX_DTYPE_F32;
        r.conversion = Conversion::kWidenBf16;
    }
    return r;
}

// The outputs' metadata: the writer, the checkpoint's versions and step, and `last`.
std::vector<std::pair<std::string, std::string>> export_metadata(const ckpt::Manifest &m, const char *last,
                                                                 const std::string &value) {
    return {
        {"writer", "sxckpt"},
        {"sx_format_version", format("%u.%u", m.format_major, m.format_minor)},
        {"sx_library_version", library_version_text(m.library_version)},
        {"step", format("%" PRIu64, m.step)},
        {last, value},
    };
}

// Adafactor's factored moments of p (if it has them) into f, which the MANIFEST holds,
// in torch's shapes: row_var [..., R, 1], col_var [..., 1, C].
Status add_factored(const ckpt::ParamEntry &p, OutFile *f, std::unordered_set<std::string> *names, uint64_t *cursor) {
    if (p.row_var.empty()) return Status::Ok();
    std::vector<int64_t> rows(p.shape.begin(), p.shape.end() - 1), cols(p.shape.begin(), p.shape.end() - 2);
    rows.push_back(1);
    cols.push_back(1);
    cols.push_back(p.shape.back());
    for (const auto &[suffix, shape, values] :
         {std::make_tuple(".row_var", rows, &p.row_var), std::make_tuple(".col_var", cols, &p.col_var)}) {
        StTensor o;
        o.name = p.name + suffix;
        SX_CHECK(names->insert(o.name).second, SX_ERR_INVALID_ARGUMENT,
                 "the checkpoint would give two tensors of %s the name '%s'", printable(f->path).c_str(),
                 printable(o.name).c_str());
        o.dtype = SX_DTYPE_F32;
        o.shape = shape;
        o.begin = *cursor;
        o.end = *cursor = o.begin + values->size() * sizeof(float);
        f->from_manifest.emplace_back(o.begin, values);
        f->tensors.push_back(std::move(o));
    }
    return Status::Ok();
}

// Names, offsets and headers, from the manifest alone. The params go to file 0; their
// optimizer state to file 1 if there is one, else nowhere.
Status plan_export(const ckpt::Manifest &m, ExportPlan *plan) {
    const auto metadata = export_metadata(m, "world_size", format("%d", m.world_size));
    std::vector<std::unordered_set<std::string>> names(plan->files.size(), {kMetadataKey});
    std::vector<uint64_t> cursor(plan->files.size(), 0);
    plan->route.assign(1, {});
    for (const ckpt::ParamEntry &p : m.params) {
        std::vector<Route> routes;
        for (size_t i = 0; i < p.tensors.size(); ++i) {
            StTensor o;
            Route r = route_of(m, p, i, plan->state_format, &o);
            if (static_cast<size_t>(r.file) >= plan->files.size()) {
                routes.push_back(Route());
                continue;
            }
            OutFile &f = plan->files[r.file];
            // A param named like the metadata key would give two entries one name:
            // refuse rather than lose one; and so any other collision of names.
            SX_CHECK(names[r.file].insert(o.name).second, SX_ERR_INVALID_ARGUMENT,
                     "the checkpoint would give two tensors of %s the name '%s' (param '%s' %s); safetensors "
                     "names must be unique",
                     printable(f.path).c_str(), printable(o.name).c_str(), printable(p.name).c_str(),
                     kind_name(p.tensors[i].kind).c_str());
            // numel < 2^62 (validate), so bytes fit; the running total is checked.
            uint64_t bytes = ckpt::dtype_bytes(o.dtype);
            for (int64_t e : o.shape) bytes *= static_cast<uint64_t>(e);
            SX_CHECK(cursor[r.file] + bytes >= cursor[r.file], SX_ERR_INVALID_ARGUMENT,
                     "the tensors exceed 2^64 bytes");
            o.begin = cursor[r.file];
            o.end = cursor[r.file] = o.begin + bytes;
            r.tensor = f.tensors.size();
            f.tensors.push_back(std::move(o));
            routes.push_back(r);
        }
        plan->route[0].push_back(std::move(routes));
        if (plan->files.size() >= 2) SX_TRY(add_factored(p, &plan->files[1], &names[1], &cursor[1]));
    }
    for (size_t i = 0; i < plan->files.size(); ++i) {
        SX_TRY(safetensors_header(metadata, plan->files[i].tensors, &plan->files[i].head));
        plan->files[i].data_bytes = cursor[i];
    }
    return Status::Ok();
}

// --- Several checkpoints: the slices of a model-parallel trainer ---

// Param `param` of checkpoint `ck`.
struct Piece {
    size_t ck = 0, param = 0;
};

std::string placement_words(const ckpt::ParamEntry &e) {
    return e.placement == SX_PLACEMENT_SPLIT ? "split" : e.placement == SX_PLACEMENT_REPLICATED ? "replicated" : "whole";
}

// A split param's pieces, sorted by offset, must tile its dimension of the logical tensor.
Status check_tiling(const std::vector<CheckpointDir> &cs, const std::string &name, std::vector<Piece> *pieces) {
    const ckpt::ParamEntry &first = cs[(*pieces)[0].ck].manifest.params[(*pieces)[0].param];
    for (const Piece &p : *pieces) {
        const ckpt::ParamEntry &e = cs[p.ck].manifest.params[p.param];
        SX_CHECK(e.split_dim == first.split_dim && e.global_shape == first.global_shape, SX_ERR_INVALID_ARGUMENT,
                 "param '%s' is split on dimension %d of %s in %s but on dimension %d of %s in %s", printable(name).c_str(),
                 first.split_dim, core::shape_text(first.global_shape).c_str(), printable(cs[(*pieces)[0].ck].path).c_str(),
                 e.split_dim, core::shape_text(e.global_shape).c_str(), printable(cs[p.ck].path).c_str());
    }
    const auto offset = [&](const Piece &p) { return cs[p.ck].manifest.params[p.param].split_offset; };
    std::stable_sort(pieces->begin(), pieces->end(), [&](const Piece &a, const Piece &b) { return offset(a) < offset(b); });
    const size_t d = static_cast<size_t>(first.split_dim);
    int64_t next = 0;
    for (const Piece &p : *pieces) {
        const ckpt::ParamEntry &e = cs[p.ck].manifest.params[p.param];
        SX_CHECK(e.split_offset <= next, SX_ERR_INVALID_ARGUMENT,
                 "param '%s': [%" PRId64 ", %" PRId64 ") of dimension %zu (of %" PRId64 ") is in none of the checkpoints",
                 printable(name).c_str(), next, e.split_offset, d, first.global_shape[d]);
        SX_CHECK(e.split_offset == next, SX_ERR_INVALID_ARGUMENT,
                 "param '%s': the pieces in the checkpoints overlap at %" PRId64 " of dimension %zu (%s holds [%" PRId64
                 ", %" PRId64 "))",
                 printable(name).c_str(), e.split_offset, d, printable(cs[p.ck].path).c_str(), e.split_offset,
                 e.split_offset + e.shape[d]);
        next += e.shape[d];
    }
    SX_CHECK(next == first.global_shape[d], SX_ERR_INVALID_ARGUMENT,
             "param '%s': [%" PRId64 ", %" PRId64 ") of dimension %zu (of %" PRId64 ") is in none of the checkpoints",
             printable(name).c_str(), next, first.global_shape[d], d, first.global_shape[d]);
    return Status::Ok();
}

// Which of a name's pieces make its logical tensor, and its shape: a whole param's one
// piece, a replicated param's first copy, or every piece of a split one, by offset.
Status join_pieces(const std::vector<CheckpointDir> &cs, const std::string &name, std::vector<Piece> *pieces,
                   std::vector<int64_t> *shape) {
    const Piece p0 = (*pieces)[0];
    const ckpt::ParamEntry &first = cs[p0.ck].manifest.params[p0.param];
    for (const Piece &p : *pieces) {
        const ckpt::ParamEntry &e = cs[p.ck].manifest.params[p.param];
        SX_CHECK(e.placement == first.placement, SX_ERR_INVALID_ARGUMENT, "param '%s' is %s in %s but %s in %s",
                 printable(name).c_str(), placement_words(first).c_str(), printable(cs[p0.ck].path).c_str(),
                 placement_words(e).c_str(), printable(cs[p.ck].path).c_str());
        SX_CHECK(first.placement != SX_PLACEMENT_WHOLE || p.ck == p0.ck, SX_ERR_INVALID_ARGUMENT,
                 "param '%s' is whole in both %s and %s: the checkpoints' params must be distinct (pipeline stages), "
                 "or declared replicated or split (sx_param_desc_t.placement)",
                 printable(name).c_str(), printable(cs[p0.ck].path).c_str(), printable(cs[p.ck].path).c_str());
        SX_CHECK(first.placement != SX_PLACEMENT_REPLICATED || e.shape == first.shape, SX_ERR_INVALID_ARGUMENT,
                 "param '%s' is replicated with shape %s in %s but %s in %s", printable(name).c_str(),
                 core::shape_text(first.shape).c_str(), printable(cs[p0.ck].path).c_str(),
                 core::shape_text(e.shape).c_str(), printable(cs[p.ck].path).c_str());
    }
    if (first.placement != SX_PLACEMENT_SPLIT) {
        pieces->resize(1);
        *shape = first.shape;
        return Status::Ok();
    }
    *shape = first.global_shape;
    return check_tiling(cs, name, pieces);
}

// Where a piece's values go in its logical tensor (Route's base, run and stride).
void place_piece(const ckpt::ParamEntry &e, Route *r) {
    if (e.placement != SX_PLACEMENT_SPLIT) return;
    const size_t d = static_cast<size_t>(e.split_dim);
    uint64_t inner = 1;
    for (size_t i = d + 1; i < e.shape.size(); ++i) inner *= static_cast<uint64_t>(e.shape[i]);
    r->run = static_cast<uint64_t>(e.shape[d]) * inner;
    r->stride = static_cast<uint64_t>(e.global_shape[d]) * inner;
    r->base = static_cast<uint64_t>(e.split_offset) * inner;
}

// What differs between two param groups ("" if nothing): the optimizer, a
// hyperparameter (the state dtype is one), a custom optimizer's own, or the group's steps.
std::string group_difference(const ckpt::ParamGroupEntry &a, const ckpt::ParamGroupEntry &b) {
    if (a.optimizer != b.optimizer || a.optimizer_name != b.optimizer_name || a.slot_names != b.slot_names)
        return "the optimizer is " + ckpt::optimizer_text(a) + " in one and " + ckpt::optimizer_text(b) + " in the other";
#define SX_DIFFERS(name, type, dflt, key, rule) \
    if (a.name != b.name) return format(#name " is %g in one and %g in the other", double(a.name), double(b.name));
    SX_HYPERPARAMETERS(SX_DIFFERS)
#undef SX_DIFFERS
    if (a.custom_names != b.custom_names || a.custom_values != b.custom_values)
        return "the custom optimizer's hyperparameters differ";
    if (a.steps != b.steps) return format("the group's steps are %" PRId64 " in one and %" PRId64 " in the other",
                                          a.steps, b.steps);
    return "";
}

// The optimizer state of several checkpoints joins only where their param group tables
// are equal: group g the same optimizer, hyperparameters and state dtype in every one.
Status check_groups(const std::vector<CheckpointDir> &cs) {
    const auto &first = cs[0].manifest.param_groups;
    for (size_t k = 1; k < cs.size(); ++k) {
        const auto &groups = cs[k].manifest.param_groups;
        SX_CHECK(groups.size() == first.size(), SX_ERR_INVALID_ARGUMENT,
                 "%s has %zu param groups but %s has %zu: the slices' optimizer state joins only where every "
                 "checkpoint has the same param groups",
                 printable(cs[0].path).c_str(), first.size(), printable(cs[k].path).c_str(), groups.size());
        for (size_t g = 0; g < first.size(); ++g) {
            const std::string why = group_difference(first[g], groups[g]);
            SX_CHECK(why.empty(), SX_ERR_INVALID_ARGUMENT,
                     "param group %zu differs between %s and %s (%s): the slices' optimizer state joins only where "
                     "every checkpoint has the same param groups",
                     g, printable(cs[0].path).c_str(), printable(cs[k].path).c_str(), why.c_str());
        }
    }
    return Status::Ok();
}

std::string kinds_text(const ckpt::ParamEntry &e) {
    std::string text;
    for (const ckpt::Tensor &t : e.tensors)
        if (t.kind != ckpt::TensorKind::kParam)
            text += (text.empty() ? "" : ", ") + kind_name(t.kind) + (t.dtype == ckpt::kDTypeQ8 ? " (8-bit)" : "");
    return text.empty() ? "none" : text;
}

// Every piece (every copy) of a name must have taken the same steps, be in the same
// group, trainable alike, with the same state tensors; Adafactor's factored moments of
// a split param are refused (a piece's column means are not the logical tensor's).
Status check_state_agrees(const std::vector<CheckpointDir> &cs, const std::string &name,
                          const std::vector<Piece> &all, StateFormat state_format) {
    const ckpt::ParamEntry &a = cs[all[0].ck].manifest.params[all[0].param];
    const std::string at = printable(cs[all[0].ck].path), n = printable(name);
    for (const Piece &p : all) {
        const ckpt::ParamEntry &e = cs[p.ck].manifest.params[p.param];
        const std::string here = printable(cs[p.ck].path);
        SX_CHECK(e.step == a.step && e.momentum_steps == a.momentum_steps && e.mu_product == a.mu_product,
                 SX_ERR_INVALID_ARGUMENT,
                 "param '%s' has taken %" PRId64 " steps (momentum_steps %" PRId64 ", mu_product %g) in %s but %" PRId64
                 " (momentum_steps %" PRId64 ", mu_product %g) in %s: its pieces' optimizer state cannot be joined",
                 n.c_str(), a.step, a.momentum_steps, double(a.mu_product), at.c_str(), e.step, e.momentum_steps,
                 double(e.mu_product), here.c_str());
        SX_CHECK(e.param_group == a.param_group && e.trainable == a.trainable, SX_ERR_INVALID_ARGUMENT,
                 "param '%s' is in param group %d (%s) in %s but in param group %d (%s) in %s", n.c_str(),
                 a.param_group, a.trainable ? "trainable" : "frozen", at.c_str(), e.param_group,
                 e.trainable ? "trainable" : "frozen", here.c_str());
        bool same = e.tensors.size() == a.tensors.size();
        for (size_t i = 0; same && i < e.tensors.size(); ++i)
            same = e.tensors[i].kind == a.tensors[i].kind &&
                   (state_format == StateFormat::kTorch || e.tensors[i].dtype == a.tensors[i].dtype);
        SX_CHECK(same, SX_ERR_INVALID_ARGUMENT, "param '%s' has optimizer state %s in %s but %s in %s", n.c_str(),
                 kinds_text(a).c_str(), at.c_str(), kinds_text(e).c_str(), here.c_str());
        SX_CHECK(e.placement != SX_PLACEMENT_SPLIT || e.row_var.empty(), SX_ERR_INVALID_ARGUMENT,
                 "param '%s' is split (on dimension %d) and has Adafactor's factored moments (row_var, col_var) in %s: "
                 "the means over a piece's rows or columns cannot be joined into the logical tensor's exactly",
                 n.c_str(), e.split_dim, here.c_str());
    }
    return Status::Ok();
}

// A split param's 8-bit codes and scales join as they are only where every piece's
// blocks of 256 are blocks of the logical tensor: each piece one run of it (no dimension
// before the split one longer than 1) of whole blocks. With `exact` (join), also: the
// logical tensor keeps the pieces' state dtype (import would quantize fp32 pieces).
Status check_blocks(const std::vector<CheckpointDir> &cs, const std::string &name, const std::vector<Piece> &pieces,
                    uint64_t logical_numel, bool exact) {
    const ckpt::ParamEntry &a = cs[pieces[0].ck].manifest.params[pieces[0].param];
    if (a.placement != SX_PLACEMENT_SPLIT || a.tensors.size() < 2) return Status::Ok();
    const ckpt::ParamGroupEntry &g = cs[0].manifest.param_groups[static_cast<size_t>(a.param_group)];
    const int32_t logical = optim::param_state_dtype(static_cast<int32_t>(g.state_dtype), logical_numel);
    bool q8 = false;
    for (const ckpt::Tensor &t : a.tensors) q8 |= t.dtype == ckpt::kDTypeQ8;
    const char *how = exact ? "join would quantize them again; it refuses"
                            : "export it with --state-format torch (each piece decoded with its own scales)";
    for (const Piece &p : pieces) {
        const ckpt::ParamEntry &e = cs[p.ck].manifest.params[p.param];
        const int32_t kept = optim::param_state_dtype(static_cast<int32_t>(g.state_dtype), e.numel());
        SX_CHECK(!exact || kept == logical, SX_ERR_INVALID_ARGUMENT,
                 "param '%s': its piece in %s (%" PRIu64 " elements) keeps %s state, but the logical tensor (%" PRIu64
                 " elements) would keep %s state: %s",
                 printable(name).c_str(), printable(cs[p.ck].path).c_str(), e.numel(), optim::state_dtype_name(kept),
                 logical_numel, optim::state_dtype_name(logical), how);
        int64_t before = 1;
        for (int d = 0; d < e.split_dim; ++d) before *= e.global_shape[static_cast<size_t>(d)];
        SX_CHECK(!q8 || (before == 1 && e.numel() % optim::kQuantBlock == 0), SX_ERR_INVALID_ARGUMENT,
                 "param '%s' keeps 8-bit state and is split on dimension %d of %s: the blocks of %zu elements of "
                 "its piece in %s are not blocks of the logical tensor, so their codes and scales cannot be joined "
                 "as they are; %s",
                 printable(name).c_str(), e.split_dim, core::shape_text(e.global_shape).c_str(), optim::kQuantBlock,
                 printable(cs[p.ck].path).c_str(), how);
    }
    return Status::Ok();
}

// Where a piece's block scales go in the logical tensor's (contiguous: check_blocks).
void place_scales(const ckpt::ParamEntry &e, uint64_t logical_numel, Route *r) {
    if (e.placement != SX_PLACEMENT_SPLIT) return;
    place_piece(e, r);
    r->base /= optim::kQuantBlock;
    r->run = e.numel() / optim::kQuantBlock;
    r->stride = logical_numel / optim::kQuantBlock;
}

// The optimizer state of one logical param into file 1: each state tensor in the
// logical shape, every piece routed to its place; and the param into plan->logical.
Status plan_joined_state(const std::vector<CheckpointDir> &cs, const std::string &name,
                         const std::vector<Piece> &pieces, const std::vector<int64_t> &shape, ExportPlan *plan,
                         std::unordered_set<std::string> *names, uint64_t *cursor) {
    const ckpt::ParamEntry &a = cs[pieces[0].ck].manifest.params[pieces[0].param];
    uint64_t numel = 1;
    for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
    if (plan->state_format == StateFormat::kTorchao || plan->exact)
        SX_TRY(check_blocks(cs, name, pieces, numel, plan->exact));
    OutFile &f = plan->files[1];
    for (size_t i = 0; i < a.tensors.size(); ++i) {
        StTensor o;
        if (route_of(cs[pieces[0].ck].manifest, a, i, plan->state_format, &o).file != 1) continue;
        const bool scales = ckpt::is_scales(a.tensors[i].kind);
        o.shape = scales ? std::vector<int64_t>{static_cast<int64_t>(numel / optim::kQuantBlock)} : shape;
        SX_CHECK(names->insert(o.name).second, SX_ERR_INVALID_ARGUMENT,
                 "the checkpoints would give two tensors of %s the name '%s'", printable(f.path).c_str(),
                 printable(o.name).c_str());
        const uint64_t bytes = (scales ? numel / optim::kQuantBlock : numel) * ckpt::dtype_bytes(o.dtype);
        SX_CHECK(*cursor + bytes >= *cursor, SX_ERR_INVALID_ARGUMENT, "the tensors exceed 2^64 bytes");
        o.begin = *cursor;
        o.end = *cursor += bytes;
        for (const Piece &p : pieces) {
            const ckpt::ParamEntry &e = cs[p.ck].manifest.params[p.param];
            StTensor ignored;
            Route &r = plan->route[p.ck][p.param][i];
            r = route_of(cs[p.ck].manifest, e, i, plan->state_format, &ignored);
            r.tensor = f.tensors.size();
            if (scales)
                place_scales(e, numel, &r);
            else
                place_piece(e, &r);
        }
        f.tensors.push_back(std::move(o));
    }
    SX_TRY(add_factored(a, &f, names, cursor));  // whole and replicated params only (check_state_agrees)
    ckpt::ParamEntry logical;
    logical.name = name;
    logical.shape = shape;
    logical.param_group = a.param_group;
    logical.trainable = a.trainable;
    logical.step = a.step;
    logical.momentum_steps = a.momentum_steps;
    logical.mu_product = a.mu_product;
    plan->logical.params.push_back(std::move(logical));
    return Status::Ok();
}

// One logical param's values into file 0, every piece routed to its place.
Status plan_joined_param(const std::vector<CheckpointDir> &cs, const std::string &name,
                         const std::vector<Piece> &pieces, const std::vector<int64_t> &shape, ExportPlan *plan,
                         uint64_t *cursor) {
    OutFile &f = plan->files[0];
    StTensor o;
    o.shape = shape;
    o.name = name;
    o.dtype = SX_DTYPE_F32;
    uint64_t bytes = sizeof(float);
    for (int64_t e : o.shape) bytes *= static_cast<uint64_t>(e);
    SX_CHECK(*cursor + bytes >= *cursor, SX_ERR_INVALID_ARGUMENT, "the tensors exceed 2^64 bytes");
    o.begin = *cursor;
    o.end = *cursor += bytes;
    for (const Piece &p : pieces) {
        const ckpt::ParamEntry &e = cs[p.ck].manifest.params[p.param];
        for (size_t i = 0; i < e.tensors.size(); ++i) {
            if (e.tensors[i].kind != ckpt::TensorKind::kParam) continue;
            Route &r = plan->route[p.ck][p.param][i];
            r.file = 0;
            r.tensor = f.tensors.size();
            place_piece(e, &r);
        }
    }
    f.tensors.push_back(std::move(o));
    return Status::Ok();
}

// The params of several checkpoints (the slices of one model) as logical tensors, in
// file 0, in the order their names first appear; with file 1, their optimizer state
// joined the same way (the checkpoints' param groups equal, each name's pieces agreeing
// on their steps). Every checkpoint must be of one step.
Status plan_joined(const std::vector<CheckpointDir> &cs, ExportPlan *plan) {
    std::vector<std::string> order;
    std::map<std::string, std::vector<Piece>> by_name;
    plan->route.assign(cs.size(), {});
    for (size_t k = 0; k < cs.size(); ++k) {
        const ckpt::Manifest &m = cs[k].manifest;
        SX_CHECK(m.step == cs[0].manifest.step, SX_ERR_INVALID_ARGUMENT,
                 "%s is of step %" PRIu64 " but %s of step %" PRIu64 ": the slices of one model are saved together",
                 printable(cs[0].path).c_str(), cs[0].manifest.step, printable(cs[k].path).c_str(), m.step);
        for (size_t p = 0; p < m.params.size(); ++p) {
            plan->route[k].emplace_back(m.params[p].tensors.size());
            auto &list = by_name[m.params[p].name];
            if (list.empty()) order.push_back(m.params[p].name);
            list.push_back({k, p});
        }
    }
    const bool state = plan->files.size() > 1;
    if (state) SX_TRY(check_groups(cs));
    std::vector<uint64_t> cursor(plan->files.size(), 0);
    std::unordered_set<std::string> names = {kMetadataKey};
    for (const std::string &name : order) {
        SX_CHECK(name != kMetadataKey, SX_ERR_INVALID_ARGUMENT, "the checkpoints would give two tensors of %s the name '%s'",
                 printable(plan->files[0].path).c_str(), kMetadataKey);
        std::vector<Piece> &pieces = by_name[name];
        const std::vector<Piece> all = pieces;  // join_pieces keeps one copy of a replicated param
        std::vector<int64_t> shape;
        SX_TRY(join_pieces(cs, name, &pieces, &shape));
        if (state) SX_TRY(check_state_agrees(cs, name, all, plan->state_format));
        SX_TRY(plan_joined_param(cs, name, pieces, shape, plan, &cursor[0]));
        if (state) SX_TRY(plan_joined_state(cs, name, pieces, shape, plan, &names, &cursor[1]));
    }
    const auto metadata = export_metadata(cs[0].manifest, "checkpoints", format("%zu", cs.size()));
    for (size_t i = 0; i < plan->files.size(); ++i) {
        SX_TRY(safetensors_header(metadata, plan->files[i].tensors, &plan->files[i].head));
        plan->files[i].data_bytes = cursor[i];
    }
    return Status::Ok();
}

// Blocks [b, e) of the scales (tensor `scales` of param `param`) into *out, from their
// chunks, each read whole through `buffer` and its CRC32C checked.
Status read_scales(io::FileOps &ops, const CheckpointDir &c, int32_t param, size_t scales, uint64_t b, uint64_t e,
                   std::vector<char> *buffer, std::vector<float> *out) {
    const ckpt::Tensor &t = c.manifest.params[static_cast<size_t>(param)].tensors[scales];
    out->assign(e - b, 0.0f);
    char *dst = reinterpret_cast<char *>(out->data());
    uint64_t covered = 0;
    for (const ckpt::Chunk &ch : t.chunks) {
        if (ch.end <= b || ch.begin >= e) continue;
        const std::string path = c.file_path(ch.file);
        int fd = -1;
        SX_TRY(ops.open_read(path, &fd));
        // The bytes of blocks [max(b, begin), min(e, end)) of the chunk's.
        const uint64_t lo = (std::max(b, ch.begin) - ch.begin) * 4, hi = (std::min(e, ch.end) - ch.begin) * 4;
        Status s = read_chunk(ops, fd, path, ch, buffer, [&](const char *data, size_t n, uint64_t off) {
            const uint64_t from = std::max(off, lo), to = std::min<uint64_t>(off + n, hi);
            if (from < to) std::memcpy(dst + (ch.begin * 4 + from - b * 4), data + (from - off), to - from);
            return Status::Ok();
        });
        ops.close(fd, path);
        if (!s.ok())
            return s.prefix(format("%s at byte %" PRIu64 ": ", printable(c.manifest.files[ch.file]).c_str(), ch.offset));
        covered += hi - lo;
    }
    SX_CHECK(covered == (e - b) * 4, SX_ERR_CORRUPT, "param '%s': the scales of blocks [%" PRIu64 ", %" PRIu64
             ") are not all in the checkpoint", printable(c.manifest.params[static_cast<size_t>(param)].name).c_str(),
             b, e);
    return Status::Ok();
}

// Converts n stored elements of a chunk (the first is element `first` of the param) into
// fp32 in `out` (n <= kConvertElems): bf16 widened, or 8-bit codes decoded with the
// scales of blocks from `block0` on.
void convert(const Route &r, const char *data, size_t n, uint64_t first, uint64_t block0,
             const std::vector<float> &scales, float *out) {
    if (r.conversion == Conversion::kWidenBf16) {
        std::vector<uint16_t> bits(n);  // the piece may not be 2-byte aligned
        std::memcpy(bits.data(), data, n * 2);
        half::to_f32(SX_DTYPE_BF16, bits.data(), out, n);
        return;
    }
    const uint8_t *codes = reinterpret_cast<const uint8_t *>(data);
    for (size_t i = 0; i < n;) {
        const uint64_t e = first + i;
        const size_t run = std::min<size_t>(n - i, optim::kQuantBlock - e % optim::kQuantBlock);
        optim::decode_block(codes + i, run, scales[e / optim::kQuantBlock - block0], r.map, out + i);
        i += run;
    }
}

// Writes n bytes of a piece of a split tensor, from byte `from` of the piece on, at their
// places in the logical tensor t: runs of r.run elements, r.stride elements apart.
Status scatter_write(io::FileOps &ops, const OutFile &out, const StTensor &t, const Route &r, const char *data,
                     size_t n, uint64_t from) {
    const uint64_t es = ckpt::dtype_bytes(t.dtype), run = r.run * es;
    const uint64_t at = out.head.size() + t.begin + r.base * es;
    while (n > 0) {
        const uint64_t q = from / run, in_run = from % run;
        const size_t len = static_cast<size_t>(std::min<uint64_t>(n, run - in_run));
        SX_TRY(ops.pwrite_all(out.fd, data, len, at + q * r.stride * es + in_run, out.path + ".tmp"));
        data += len, n -= len, from += len;
    }
    return Status::Ok();
}

// Writes chunk `ref` of the open file `fd` at its place in its output: as stored, or
// converted to fp32 (Conversion) kConvertElems at a time.
Status export_chunk(io::FileOps &ops, const CheckpointDir &c, int fd, const std::string &path, const ChunkRef &ref,
                    const ExportPlan &plan, const std::vector<std::vector<Route>> &routes, std::vector<char> *buffer) {
    const Route &r = routes[ref.param][ref.tensor];
    const OutFile &out = plan.files[r.file];
    const StTensor &t = out.tensors[r.tensor];
    const ckpt::Chunk &ch = *ref.chunk;
    const uint64_t at = out.head.size() + t.begin + ch.begin * ckpt::dtype_bytes(t.dtype);
    const std::string out_tmp = out.path + ".tmp";
    if (r.conversion == Conversion::kCopy && r.run)
        return read_chunk(ops, fd, path, ch, buffer, [&](const char *data, size_t n, uint64_t off) {
            return scatter_write(ops, out, t, r, data, n, ch.begin * ckpt::dtype_bytes(t.dtype) + off);
        });
    if (r.conversion == Conversion::kCopy)
        return read_chunk(ops, fd, path, ch, buffer, [&](const char *data, size_t n, uint64_t off) {
            return ops.pwrite_all(out.fd, data, n, at + off, out_tmp);
        });
    const uint64_t elem = r.conversion == Conversion::kWidenBf16 ? 2 : 1;
    const uint64_t block0 = ch.begin / optim::kQuantBlock;
    std::vector<float> scales, converted(kConvertElems);
    if (r.conversion == Conversion::kDecode8)
        SX_TRY(read_scales(ops, c, ref.param, r.scales, block0,
                           (ch.end + optim::kQuantBlock - 1) / optim::kQuantBlock, buffer, &scales));
    std::vector<char> carry;  // a bf16 split between two pieces: its first byte
    return read_chunk(ops, fd, path, ch, buffer, [&](const char *data, size_t n, uint64_t off) {
        std::vector<char> joined;
        if (!carry.empty()) {  // pieces are whole elements unless a chunk is larger than the buffer
            joined.assign(carry.begin(), carry.end());
            joined.insert(joined.end(), data, data + n);
            data = joined.data(), n = joined.size(), off -= carry.size();
            carry.clear();
        }
        const size_t whole = n / elem;
        carry.assign(data + whole * elem, data + n);
        for (size_t i = 0; i < whole; i += kConvertElems) {
            const size_t k = std::min<size_t>(kConvertElems, whole - i);
            const uint64_t first = ch.begin + off / elem + i;
            convert(r, data + i * elem, k, first, block0, scales, converted.data());
            const uint64_t pos = (off / elem + i) * sizeof(float);  // into the chunk's output
            const char *bytes = reinterpret_cast<const char *>(converted.data());
            SX_TRY(r.run ? scatter_write(ops, out, t, r, bytes, k * sizeof(float), ch.begin * sizeof(float) + pos)
                         : ops.pwrite_all(out.fd, bytes, k * sizeof(float), at + pos, out_tmp));
        }
        return Status::Ok();
    });
}

// Writes every exported chunk of shard file f at its place in its output.
Status copy_file(io::FileOps &ops, const CheckpointDir &c, uint32_t f, const std::vector<ChunkRef> &chunks,
                 const ExportPlan &plan, const std::vector<std::vector<Route>> &routes, std::vector<char> *buffer) {
    bool any = false;
    for (const ChunkRef &ref : chunks) any |= routes[ref.param][ref.tensor].file >= 0;
    if (!any) return Status::Ok();
    const std::string path = c.file_path(f);
    int fd = -1;
    SX_TRY(ops.open_read(path, &fd));
    Status s;
    for (const ChunkRef &ref : chunks) {
        if (routes[ref.param][ref.tensor].file < 0) continue;
        s = export_chunk(ops, c, fd, path, ref, plan, routes, buffer);
        if (!s.ok()) {
            s.prefix(format("%s at byte %" PRIu64 " (%" PRIu64 " bytes): %s: ",
                            printable(c.manifest.files[f]).c_str(), ref.chunk->offset, ref.chunk->length,
                            describe_chunk(c.manifest, ref).c_str()));
            break;
        }
    }
    ops.close(fd, path);
    return s;
}

std::string parent_of(const std::string &path) {
    const size_t slash = path.rfind('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

// Writes every output as PATH.tmp: the safetensors files streamed from the shard files,
// then the JSON.
Status write_temporaries(io::FileOps &ops, const std::vector<CheckpointDir> &cs, ExportPlan *plan,
                         const std::string &json_path) {
    Status s;
    for (OutFile &f : plan->files) {
        const std::string tmp = f.path + ".tmp";
        s = ops.open_write(tmp, &f.fd);
        if (s.ok()) s = ops.pwrite_all(f.fd, f.head.data(), f.head.size(), 0, tmp);
        for (const auto &[at, values] : f.from_manifest)
            if (s.ok())
                s = ops.pwrite_all(f.fd, reinterpret_cast<const char *>(values->data()), values->size() * sizeof(float),
                                   f.head.size() + at, tmp);
        if (!s.ok()) break;
    }
    for (size_t k = 0; k < cs.size() && s.ok(); ++k) {
        const CheckpointDir &c = cs[k];
        s = c.indexes_ok();  // a file whose chunks are unknown cannot be exported
        if (!s.ok()) break;
        const auto by_file = chunks_by_file(c.manifest);
        std::vector<char> buffer(piece_buffer_bytes(c.manifest));
        for (uint32_t f = 0; f < c.manifest.files.size() && s.ok(); ++f)
            s = copy_file(ops, c, f, by_file[f], *plan, plan->route[k], &buffer);
    }
    for (OutFile &f : plan->files) {
        if (f.fd < 0) continue;
        const std::string tmp = f.path + ".tmp";
        if (s.ok()) s = ops.fsync(f.fd, tmp);
        Status closed = ops.close(f.fd, tmp);
        if (s.ok()) s = closed;
        f.fd = -1;
    }
    if (s.ok() && !json_path.empty()) s = ckpt::write_durable_file(ops, json_path + ".tmp", plan->optimizer_json);
    return s;
}

Status export_files(io::FileOps &ops, const std::vector<CheckpointDir> &cs, const std::string &out,
                    const std::string &prefix, ExportPlan *plan) {
    plan->files.resize(prefix.empty() ? 1 : 2);
    plan->files[0].path = out;
    std::vector<std::string> finals = {out};
    std::string json_path;
    if (!prefix.empty()) {
        plan->files[1].path = prefix + ".safetensors";
        json_path = prefix + ".json";
        finals.push_back(plan->files[1].path);
        finals.push_back(json_path);
    }
    const bool joined = cs.size() > 1 || plan->exact;
    SX_TRY(joined ? plan_joined(cs, plan) : plan_export(cs[0].manifest, plan));
    if (!prefix.empty() && !joined) plan->optimizer_json = optimizer_json(cs[0].manifest);
    if (!prefix.empty() && joined) {
        // The logical model's: the first checkpoint's groups (all equal: check_groups),
        // step, loss scaler and user blob.
        const ckpt::Manifest &m = cs[0].manifest;
        ckpt::Manifest &l = plan->logical;
        l.format_major = m.format_major, l.format_minor = m.format_minor, l.step = m.step;
        l.param_groups = m.param_groups;
        l.loss_scaler = m.loss_scaler;
        l.user_blob = m.user_blob;
        plan->optimizer_json = optimizer_json(l, /*run_state=*/plan->exact);
    }
    Status s = write_temporaries(ops, cs, plan, json_path);
    size_t renamed = 0;
    for (; s.ok() && renamed < finals.size(); ++renamed) s = ops.rename(finals[renamed] + ".tmp", finals[renamed]);
    if (!s.ok()) {
        // Best effort: the error that matters is s.
        for (size_t i = 0; i < finals.size(); ++i) ops.unlink(finals[i] + (i < renamed ? "" : ".tmp"));
        return s;
    }
    std::unordered_set<std::string> dirs;
    for (const std::string &f : finals)
        if (dirs.insert(parent_of(f)).second) SX_TRY(ops.fsync_dir(parent_of(f)));
    return Status::Ok();
}

}  // namespace

Status export_for_join(io::FileOps &ops, const std::vector<std::string> &dirs, const std::string &weights,
                       const std::string &prefix) {
    std::vector<CheckpointDir> cs(dirs.size());
    for (size_t k = 0; k < dirs.size(); ++k) SX_TRY(open_checkpoint(ops, dirs[k], &cs[k]));
    ExportPlan plan;
    plan.state_format = StateFormat::kTorchao;  // packed state copied as stored
    plan.exact = true;
    return export_files(ops, cs, weights, prefix, &plan);
}

int export_command(const std::vector<std::string> &args) {
    std::string out, prefix, state_format;
    std::vector<std::string> dirs;
    const int parsed = parse_args(
        "export", args, {{"--safetensors", &out}, {"--optimizer", &prefix}, {"--state-format", &state_format}}, &dirs);
    if (parsed >= 0) return parsed;
    if (out.empty()) return usage_error("export needs --safetensors OUT");
    if (dirs.empty()) return usage_error("export takes a checkpoint directory");
    ExportPlan plan;
    if (!state_format.empty() && prefix.empty())
        return usage_error("export: --state-format applies to the optimizer state; it needs --optimizer PREFIX");
    if (state_format == "torchao")
        plan.state_format = StateFormat::kTorchao;
    else if (!state_format.empty() && state_format != "torch")
        return usage_error("export: --state-format is '" + printable(state_format) + "'; it is torch or torchao");
    if (!prefix.empty() && (out == prefix + ".safetensors" || out == prefix + ".json"))
        return usage_error("export: OUT and the files of --optimizer " + prefix + " must differ");
    auto ops = io::posix_file_ops();
    std::vector<CheckpointDir> cs(dirs.size());
    Status s;
    for (size_t k = 0; k < dirs.size() && s.ok(); ++k) s = open_checkpoint(*ops, dirs[k], &cs[k]);
    if (!s.ok()) return failure(s);
    s = export_files(*ops, cs, out, prefix, &plan);
    if (!s.ok()) return failure(s.prefix("export to " + printable(out) + " failed: "));
    std::printf("wrote %s: %zu params, %s\n", printable(out).c_str(), plan.files[0].tensors.size(),
                bytes_text(plan.files[0].head.size() + plan.files[0].data_bytes).c_str());
    if (!prefix.empty()) {
        std::printf("wrote %s: %zu optimizer state tensors, %s\n", printable(plan.files[1].path).c_str(),
                    plan.files[1].tensors.size(),
                    bytes_text(plan.files[1].head.size() + plan.files[1].data_bytes).c_str());
        std::printf("wrote %s: %zu param groups\n", printable(prefix + ".json").c_str(),
                    cs[0].manifest.param_groups.size());
    }
    const ckpt::Manifest &m = cs[0].manifest;
    std::printf("step %" PRIu64 ", format %u.%u\n", m.step, m.format_major, m.format_minor);
    return kExitOk;
}

}  // namespace tool
}  // namespace sx
