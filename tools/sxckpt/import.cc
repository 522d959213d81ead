// sxckpt import --safetensors WEIGHTS [--optimizer PREFIX] [--world-size N] DIR: a new
// sx checkpoint from the files `export` writes (or torch's tensors written the same
// way, tools/sxckpt/sxckpt_torch.py), saved as if by a group of N ranks, so that it loads
// into any world size, stage and unit split like any other. A param group whose
// "state_dtype" is bf16 or 8bit stores its state so (format 4.0): fp32 tensors rounded to
// bf16 or quantized by sx's own encoder, bf16 ones and torchao's 8-bit codes and scales
// (NAME.SLOT.codes, NAME.SLOT.scale) copied as they are.
//
// The checkpoint is laid out by the library's own code: a core::Layout of the params
// over N ranks (their units as PREFIX.json gives them, else one unit), ckpt::plan_write
// for each rank's chunks, the MANIFEST checked by ckpt::validate() as it is encoded,
// and the commit of ckpt::commit_checkpoint: every shard file is written into
// DIR.sx-partial and fsynced, MANIFEST last, then the directory is renamed to DIR. A
// failure removes DIR.sx-partial; nothing that loads is left behind.
//
// Streaming: the headers and PREFIX.json are read whole; the tensors are read chunk by
// chunk (at most ckpt::kMaxChunkBytes) while each rank's file is written, so memory
// stays bounded whatever the size of the model.
#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#include "base/half.h"
#include "checkpoint_dir.h"
#include "ckpt/directory.h"
#include "ckpt/shard_index.h"
#include "ckpt/shard_plan.h"
#include "commands.h"
#include "core/layout.h"
#include "core/params.h"
#include "io/crc32c.h"
#include "optim/state_codec.h"
#include "optimizer_json.h"

namespace sx {
namespace tool {

namespace {

constexpr uint64_t kMaxOptimizerJsonBytes = 1ull << 30;
constexpr int kMaxWorldSize = 99999;  // the width of the shard files' rank numbers
constexpr uint64_t kAlignmentBytes = 64;  // sx's default; informational in the MANIFEST
constexpr int32_t kStage = 2;             // sx's default; informational in the MANIFEST
// Elements of the source read at once while a chunk is written: 4 MiB of fp32 (and
// kPieceElems / 256 blocks for scales, which quantizing reads the block's elements of).
constexpr uint64_t kPieceElems = 1u << 20;

// Where a stored tensor's elements come from: a tensor of numbers (F32, F16, BF16), or
// torchao's form of an 8-bit slot, its codes (U8) and scales (F32). A slot's scales
// (kScales0 + k) come from the slot's source: its `scale` tensor, or the numbers
// quantized again.
struct Source {
    int file = 0;  // 0: the weights, 1: the optimizer state
    const StTensor *tensor = nullptr;
    const StTensor *scale = nullptr;  // with codes in `tensor`
};

struct Inputs {
    StFile files[2];            // the weights, and the optimizer state if given
    bool has_optimizer = false;
    OptimizerDoc doc;
    std::string json_path;
};

struct ImportPlan {
    ckpt::Manifest manifest;                 // but for files and chunks
    std::vector<std::vector<Source>> source; // [param][tensor]
    size_t state_tensors = 0;
    // Adafactor's factored moments, which the MANIFEST holds: per param, its row_var and
    // col_var tensors in the optimizer file.
    std::vector<std::pair<size_t, std::array<const StTensor *, 2>>> factored;
};

std::string quoted(const std::string &s) { return "'" + printable(s) + "'"; }

// A weight becomes a param: its name and shape as sx_add_param accepts them.
Status param_of(const StFile &w, const StTensor &t, ckpt::ParamEntry *e) {
    Status s = core::validate_param_name(t.name.c_str());
    uint64_t numel = 0;
    if (s.ok() && t.name.find('\0') != std::string::npos)
        s = SX_ERROR(SX_ERR_INVALID_ARGUMENT, "the name holds a NUL byte");
    if (s.ok()) s = core::validate_shape(static_cast<int32_t>(t.shape.size()), t.shape.data(), &numel);
    if (s.ok() && t.dtype == ckpt::kDTypeQ8)
        s = SX_ERROR(SX_ERR_INVALID_ARGUMENT, "its dtype is U8; a param's values are F32, F16 or BF16");
    if (!s.ok()) return s.prefix(printable(w.path) + ": tensor " + quoted(t.name) + ": ");
    e->name = t.name;
    e->shape = t.shape;
    e->dtype = t.dtype;
    ckpt::Tensor values;
    values.kind = ckpt::TensorKind::kParam;
    e->tensors.push_back(values);
    return Status::Ok();
}

// Why a tensor of the optimizer file is no param's state, in words.
std::string stray_reason(const ImportPlan &plan, const std::string &tensor) {
    std::string name = tensor;  // torchao's form: the slot's name, then .codes or .scale
    for (const std::string form : {".codes", ".scale"})
        if (name.size() > form.size() && name.compare(name.size() - form.size(), form.size(), form) == 0)
            name.resize(name.size() - form.size());
    for (int k = 1; k < ckpt::kNumTensorKinds; ++k) {
        const ckpt::TensorKind kind = static_cast<ckpt::TensorKind>(k);
        const std::string suffix = ckpt::tensor_suffix(kind);
        if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
            continue;
        const std::string param = name.substr(0, name.size() - suffix.size());
        for (const ckpt::ParamEntry &p : plan.manifest.params)
            if (p.name == param) {
                const ckpt::ParamGroupEntry &g = plan.manifest.param_groups[p.param_group];
                return format("param %s is in param group %d (%s), which keeps no %s", quoted(param).c_str(),
                              p.param_group, ckpt::optimizer_text(g).c_str(), suffix.c_str() + 1);
            }
        return "there is no param " + quoted(param);
    }
    return "its name is no param's NAME.exp_avg, NAME.exp_avg_sq, NAME.max_exp_avg_sq or NAME.momentum_buffer";
}

// "fp32 state (its param group's state_dtype is fp32)", for messages: how param e keeps
// its state, and why.
std::string keeps_text(const ckpt::ParamGroupEntry &g, const ckpt::ParamEntry &e, int32_t kept) {
    const char *how = optim::state_dtype_name(kept);
    if (kept == static_cast<int32_t>(g.state_dtype))
        return format("%s state (its param group's state_dtype is %s)", how, how);
    return format("%s state (its param group is 8-bit, but %" PRIu64
                  " elements are fewer than 4096 or not whole blocks of 256)",
                  how, e.numel());
}

// The tensors of one state slot (`name`: NAME.SLOT) of param e, which keeps its state
// as `kept` (SX_STATE_*): NAME.SLOT, a tensor of numbers in the param's shape, or, for
// 8-bit state only, torchao's NAME.SLOT.codes (U8, the param's shape) and
// NAME.SLOT.scale (F32, one per block of 256). *src stays empty where neither is there.
Status find_slot(const StFile &s, const ckpt::ParamGroupEntry &g, const ckpt::ParamEntry &e, int32_t kept,
                 const std::string &name, std::vector<bool> *used, Source *src, std::string *present) {
    const StTensor *plain = s.find(name), *codes = s.find(name + ".codes"), *scale = s.find(name + ".scale");
    const std::string file = printable(s.path);
    std::string mine;  // this slot's tensors
    for (const StTensor *t : {plain, codes, scale})
        if (t) {
            (*used)[s.index.at(t->name)] = true;
            mine += (mine.empty() ? "" : " and ") + quoted(t->name);
        }
    if (mine.empty()) return Status::Ok();
    *present += (present->empty() ? "" : ", ") + mine;
    SX_CHECK(!plain || (!codes && !scale), SX_ERR_INVALID_ARGUMENT,
             "%s: param %s has both %s and torchao's %s of one state slot; give one", file.c_str(),
             quoted(e.name).c_str(), quoted(name).c_str(), quoted(name + (codes ? ".codes" : ".scale")).c_str());
    if (plain) {
        SX_CHECK(plain->dtype != ckpt::kDTypeQ8, SX_ERR_INVALID_ARGUMENT,
                 "%s: tensor %s has dtype U8; state tensors are F32, F16 or BF16 (8-bit state comes as torchao's "
                 "%s and %s)",
                 file.c_str(), quoted(name).c_str(), quoted(name + ".codes").c_str(), quoted(name + ".scale").c_str());
        SX_CHECK(plain->shape == e.shape, SX_ERR_INVALID_ARGUMENT, "%s: tensor %s has shape %s, but param %s has %s",
                 file.c_str(), quoted(name).c_str(), shape_text(plain->shape).c_str(), quoted(e.name).c_str(),
                 shape_text(e.shape).c_str());
        *src = {1, plain, nullptr};
        return Status::Ok();
    }
    SX_CHECK(kept == SX_STATE_8BIT, SX_ERR_INVALID_ARGUMENT,
             "%s: %s: torchao's 8-bit state, but param %s keeps %s", file.c_str(), mine.c_str(),
             quoted(e.name).c_str(), keeps_text(g, e, kept).c_str());
    SX_CHECK(codes && scale, SX_ERR_INVALID_ARGUMENT, "%s: param %s has %s but no %s; torchao's 8-bit state is both",
             file.c_str(), quoted(e.name).c_str(), quoted(codes ? codes->name : scale->name).c_str(),
             quoted(name + (codes ? ".scale" : ".codes")).c_str());
    SX_CHECK(codes->dtype == ckpt::kDTypeQ8 && codes->shape == e.shape, SX_ERR_INVALID_ARGUMENT,
             "%s: tensor %s is %s %s; the codes of param %s are U8 %s", file.c_str(), quoted(codes->name).c_str(),
             st_dtype_name(codes->dtype).c_str(), shape_text(codes->shape).c_str(), quoted(e.name).c_str(),
             shape_text(e.shape).c_str());
    const std::vector<int64_t> blocks = {static_cast<int64_t>(e.numel() / optim::kQuantBlock)};
    SX_CHECK(scale->dtype == SX_DTYPE_F32 && scale->shape == blocks, SX_ERR_INVALID_ARGUMENT,
             "%s: tensor %s is %s %s; param %s (%" PRIu64 " elements) has one F32 scale per block of %zu: %s",
             file.c_str(), quoted(scale->name).c_str(), st_dtype_name(scale->dtype).c_str(),
             shape_text(scale->shape).c_str(), quoted(e.name).c_str(), e.numel(), optim::kQuantBlock,
             shape_text(blocks).c_str());
    *src = {1, codes, scale};
    return Status::Ok();
}

// Param p's optimizer state from the optimizer file: all the tensors its optimizer
// keeps, or none (a param never updated, or never trainable, as sx writes it), in the
// dtype its group keeps (an 8-bit slot followed by its scales).
Status add_state(const Inputs &in, size_t p, std::vector<bool> *used, ImportPlan *plan) {
    ckpt::ParamEntry &e = plan->manifest.params[p];
    const StFile &s = in.files[1];
    const ckpt::ParamGroupEntry &g = plan->manifest.param_groups[e.param_group];
    const std::vector<ckpt::TensorKind> kinds = ckpt::stored_kinds(ckpt::hyper_of(g), static_cast<int>(e.shape.size()));
    const int32_t kept = optim::param_state_dtype(static_cast<int32_t>(g.state_dtype), e.numel());
    std::vector<Source> found(kinds.size());  // per state kind
    std::string present;                       // their names, for messages
    for (size_t k = 1; k < kinds.size(); ++k)
        SX_TRY(find_slot(s, g, e, kept, e.name + ckpt::tensor_suffix(kinds[k]), used, &found[k], &present));
    // Adafactor's factored moments (a param of two or more dimensions), in torch's
    // shapes [..., R, 1] and [..., 1, C].
    std::array<const StTensor *, 2> factored = {nullptr, nullptr};
    if (g.optimizer == SX_OPTIM_ADAFACTOR && e.shape.size() >= 2) {
        std::vector<int64_t> rows(e.shape.begin(), e.shape.end() - 1), cols(e.shape.begin(), e.shape.end() - 2);
        rows.push_back(1);
        cols.push_back(1);
        cols.push_back(e.shape.back());
        const std::vector<int64_t> *shapes[2] = {&rows, &cols};
        const char *suffixes[2] = {".row_var", ".col_var"};
        for (int k = 0; k < 2; ++k) {
            const std::string name = e.name + suffixes[k];
            const StTensor *t = s.find(name);
            if (!t) continue;
            SX_CHECK(t->shape == *shapes[k], SX_ERR_INVALID_ARGUMENT,
                     "%s: tensor %s has shape %s; Adafactor's %s of param %s (shape %s) has shape %s",
                     printable(s.path).c_str(), quoted(name).c_str(), shape_text(t->shape).c_str(), suffixes[k] + 1,
                     quoted(e.name).c_str(), shape_text(e.shape).c_str(), shape_text(*shapes[k]).c_str());
            (*used)[s.index.at(name)] = true;
            present += (present.empty() ? "" : ", ") + quoted(name);
            factored[k] = t;
        }
        for (int k = 0; k < 2 && !present.empty(); ++k)
            SX_CHECK(factored[k] != nullptr, SX_ERR_INVALID_ARGUMENT,
                     "%s: param %s (param group %d, Adafactor) has %s but no tensor %s; a param's state is every "
                     "tensor its optimizer keeps, or none",
                     printable(s.path).c_str(), quoted(e.name).c_str(), e.param_group, present.c_str(),
                     quoted(e.name + suffixes[k]).c_str());
        if (!present.empty()) plan->factored.push_back({p, factored});
    }
    if (present.empty()) return Status::Ok();  // no state at all
    for (size_t k = 1; k < kinds.size(); ++k)
        SX_CHECK(found[k].tensor != nullptr, SX_ERR_INVALID_ARGUMENT,
                 "%s: param %s (param group %d, %s) has %s but no tensor %s; a param's state is every tensor "
                 "its optimizer keeps, or none",
                 printable(s.path).c_str(), quoted(e.name).c_str(), e.param_group,
                 optimizer_name(g.optimizer).c_str(), present.c_str(),
                 quoted(e.name + ckpt::tensor_suffix(kinds[k])).c_str());
    for (size_t k = 1; k < kinds.size(); ++k) {
        ckpt::Tensor t;
        t.kind = kinds[k];
        t.dtype = ckpt::state_tensor_dtype(kept);
        e.tensors.push_back(t);
        plan->source[p].push_back(found[k]);
        plan->state_tensors++;
    }
    for (size_t k = 1; k < kinds.size() && kept == SX_STATE_8BIT; ++k) {
        ckpt::Tensor t;
        t.kind = ckpt::scales_kind(static_cast<int>(k) - 1);
        e.tensors.push_back(t);
        plan->source[p].push_back(found[k]);
    }
    return Status::Ok();
}

// Adafactor's factored moments into the MANIFEST, read whole from the optimizer file.
Status read_factored(io::FileOps &ops, const Inputs &in, ImportPlan *plan) {
    if (plan->factored.empty()) return Status::Ok();
    int fd = -1;
    SX_TRY(ops.open_read_named(in.files[1].path, &fd));
    std::vector<char> scratch;
    Status s;
    for (const auto &[p, tensors] : plan->factored) {
        ckpt::ParamEntry &e = plan->manifest.params[p];
        std::vector<float> *into[2] = {&e.row_var, &e.col_var};
        for (int k = 0; k < 2 && s.ok(); ++k) {
            into[k]->resize(tensors[k]->numel());
            s = read_f32(ops, fd, in.files[1], *tensors[k], 0, tensors[k]->numel(), into[k]->data(), &scratch);
        }
    }
    ops.close(fd, in.files[1].path);
    return s;
}

// The MANIFEST but for files and chunks, and where every tensor's elements come from.
Status plan_import(const Inputs &in, int world_size, ImportPlan *plan) {
    const StFile &w = in.files[0];
    ckpt::Manifest &m = plan->manifest;
    m.library_version = SX_VERSION_NUMBER;
    m.world_size = world_size;
    m.shard_size = world_size;
    m.stage = kStage;
    m.alignment = static_cast<int32_t>(kAlignmentBytes);
    m.created_unix_ms = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                  std::chrono::system_clock::now().time_since_epoch())
                                                  .count());
    SX_CHECK(!w.tensors.empty(), SX_ERR_INVALID_ARGUMENT, "%s holds no tensors", printable(w.path).c_str());
    // The params in the order of their data: the order export writes them in, which is
    // the checkpoint's registration order.
    for (const StTensor &t : w.tensors) {
        ckpt::ParamEntry e;
        SX_TRY(param_of(w, t, &e));
        m.params.push_back(std::move(e));
        plan->source.push_back({{0, &t}});
    }
    if (!in.has_optimizer) {
        // Values only: one group with torch.optim.AdamW's defaults, every step 0, no
        // state. Load it with SX_LOAD_PARAMS_ONLY (docs/format.md).
        m.param_groups.push_back(ckpt::param_group_entry(core::default_hyper(SX_OPTIM_ADAMW)));
        return Status::Ok();
    }
    const OptimizerDoc &doc = in.doc;
    m.step = doc.step;
    if (doc.has_loss_scaler) m.loss_scaler = doc.loss_scaler;
    m.user_blob = doc.user_blob;
    for (const OptimizerGroup &g : doc.groups) m.param_groups.push_back(g.hyper);
    std::unordered_map<std::string, const OptimizerParam *> listed;
    for (const OptimizerParam &p : doc.params) listed.emplace(p.name, &p);
    for (size_t g = 0; g < doc.groups.size(); ++g)
        for (const std::string &name : doc.groups[g].params)
            SX_CHECK(w.find(name) != nullptr, SX_ERR_INVALID_ARGUMENT,
                     "%s: param %s of param group %zu is not in %s", printable(in.json_path).c_str(),
                     quoted(name).c_str(), g, printable(w.path).c_str());
    std::vector<bool> used(in.files[1].tensors.size(), false);
    for (size_t p = 0; p < m.params.size(); ++p) {
        ckpt::ParamEntry &e = m.params[p];
        const auto it = listed.find(e.name);
        SX_CHECK(it != listed.end(), SX_ERR_INVALID_ARGUMENT,
                 "%s has param %s, which no param group of %s lists (every param is in one group)",
                 printable(w.path).c_str(), quoted(e.name).c_str(), printable(in.json_path).c_str());
        const OptimizerParam &op = *it->second;
        e.param_group = op.group;
        e.unit = op.unit;
        e.trainable = op.trainable;
        e.step = op.step;
        e.momentum_steps = op.momentum_steps;
        e.mu_product = op.mu_product;
        SX_TRY(add_state(in, p, &used, plan));
    }
    for (size_t i = 0; i < used.size(); ++i)
        SX_CHECK(used[i], SX_ERR_INVALID_ARGUMENT, "%s: tensor %s is no param's state: %s",
                 printable(in.files[1].path).c_str(), quoted(in.files[1].tensors[i].name).c_str(),
                 stray_reason(*plan, in.files[1].tensors[i].name).c_str());
    return Status::Ok();
}

// Elements [first, first + n) of chunk c (blocks, for scales) in the chunk's dtype,
// into *out, from `src`: fp32 values and state read (widened from F16, BF16); bf16 state
// copied from BF16, else rounded to nearest even; 8-bit codes and scales copied from
// torchao's, else quantized by sx's encoder, each block on its own (encode_decoded_block:
// values an 8-bit slot decoded to, as the default export writes them, take back their
// codes and scale).
Status chunk_bytes(io::FileOps &ops, const Inputs &in, const int fds[2], const Source &src,
                   const ckpt::WriteChunk &c, const float *map, uint64_t first, uint64_t n, std::vector<char> *out,
                   std::vector<float> *values, std::vector<char> *scratch) {
    const int fd = fds[src.file];
    const StFile &file = in.files[src.file];
    out->resize(n * ckpt::dtype_bytes(c.dtype));
    const bool scales = ckpt::is_scales(c.kind);
    if (src.scale) return read_raw(ops, fd, file, scales ? *src.scale : *src.tensor, first, n, out->data());
    if (c.dtype == SX_DTYPE_BF16 && src.tensor->dtype == SX_DTYPE_BF16)
        return read_raw(ops, fd, file, *src.tensor, first, n, out->data());
    const uint64_t per = scales ? optim::kQuantBlock : 1;  // elements of the source per element here
    values->resize(n * per);
    SX_TRY(read_f32(ops, fd, file, *src.tensor, first * per, n * per, values->data(), scratch));
    if (c.dtype == SX_DTYPE_F32 && !scales) {
        std::memcpy(out->data(), values->data(), n * sizeof(float));
    } else if (c.dtype == SX_DTYPE_BF16) {
        half::from_f32(SX_DTYPE_BF16, values->data(), reinterpret_cast<uint16_t *>(out->data()), n);
    } else {  // codes (n elements, whole blocks) or scales (n blocks)
        uint8_t codes[optim::kQuantBlock];
        for (uint64_t b = 0; b < n * per; b += optim::kQuantBlock) {
            uint8_t *dst = scales ? codes : reinterpret_cast<uint8_t *>(out->data()) + b;
            const float scale = optim::encode_decoded_block(values->data() + b, optim::kQuantBlock, map, dst);
            if (scales) std::memcpy(out->data() + b / optim::kQuantBlock * sizeof(float), &scale, sizeof scale);
        }
    }
    return Status::Ok();
}

// Rank `rank`'s shard file, written from the inputs chunk by chunk (each in pieces of at
// most kPieceElems elements of the source), then its index; where that is goes into the
// manifest.
Status write_shard(io::FileOps &ops, const Inputs &in, const int fds[2], const core::Layout &layout,
                   const std::vector<std::vector<ckpt::TensorKind>> &kinds_of, const std::vector<int32_t> &kept,
                   int rank, const std::string &path, ImportPlan *plan, std::vector<float> *values,
                   std::vector<char> *scratch) {
    const ckpt::WritePlan wp = ckpt::plan_write(layout, rank, kinds_of, kept);
    int fd = -1;
    SX_TRY(ops.open_write(path, &fd));
    Status s;
    std::vector<ckpt::IndexRecord> records;
    std::vector<char> bytes;
    for (size_t i = 0; i < wp.chunks.size() && s.ok(); ++i) {
        const ckpt::WriteChunk &c = wp.chunks[i];
        const ckpt::ParamEntry &e = plan->manifest.params[c.param];
        size_t t = 0;  // the tensor's index, and its source's
        while (e.tensors[t].kind != c.kind) ++t;
        const Source &src = plan->source[c.param][t];
        const float *map = nullptr;
        if (c.slot >= 0 && kept[c.param] == SX_STATE_8BIT)
            map = optim::state_slot_nonnegative(ckpt::hyper_of(plan->manifest.param_groups[e.param_group]), c.slot,
                                                static_cast<int>(e.shape.size()))
                      ? optim::kUnsignedMap
                      : optim::kSignedMap;
        const uint64_t step = ckpt::is_scales(c.kind) ? kPieceElems / optim::kQuantBlock : kPieceElems;
        uint32_t crc = 0;
        uint64_t at = c.file_offset;
        for (uint64_t b = c.begin; b < c.end && s.ok(); b += step) {
            const uint64_t n = std::min(step, c.end - b);
            s = chunk_bytes(ops, in, fds, src, c, map, b, n, &bytes, values, scratch);
            if (s.ok()) s = ops.pwrite_all(fd, bytes.data(), bytes.size(), at, path);
            crc = io::crc32c_extend(crc, bytes.data(), bytes.size());
            at += bytes.size();
        }
        ckpt::IndexRecord r;
        r.param = c.param;
        r.kind = static_cast<int32_t>(c.kind);
        r.begin = c.begin;
        r.end = c.end;
        r.offset = c.file_offset;
        r.length = c.bytes;
        r.crc32c = crc;
        records.push_back(r);
    }
    ckpt::FileIndex index;
    if (s.ok()) s = ckpt::append_index(ops, fd, path, wp.file_bytes, records, &index);
    if (s.ok()) plan->manifest.file_indexes.push_back(index);
    if (s.ok()) s = ops.fsync(fd, path);
    Status closed = ops.close(fd, path);
    SX_TRY(s);
    return closed;
}

// Every rank's file into tmp_dir, then the MANIFEST, and the commit.
Status write_checkpoint(io::FileOps &ops, const Inputs &in, int world_size, ImportPlan *plan,
                        const std::string &tmp_dir, const std::string &final_dir, const std::string &parent) {
    std::vector<core::ParamShape> shapes;
    std::vector<std::vector<ckpt::TensorKind>> kinds_of;  // per param, its values and slots (no scales)
    std::vector<int32_t> kept;                            // how each keeps its state (SX_STATE_*)
    for (const ckpt::ParamEntry &e : plan->manifest.params) {
        kept.push_back(optim::param_state_dtype(
            static_cast<int32_t>(plan->manifest.param_groups[e.param_group].state_dtype), e.numel()));
        core::ParamShape s;
        s.unit = e.unit;
        s.numel = e.numel();
        s.elem_bytes = sizeof(float);
        // As a group lays it out: an 8-bit param's blocks are never split between shards.
        if (kept.back() == SX_STATE_8BIT) s.block = static_cast<uint32_t>(optim::kQuantBlock);
        shapes.push_back(s);
        std::vector<ckpt::TensorKind> kinds;
        for (const ckpt::Tensor &t : e.tensors)
            if (!ckpt::is_scales(t.kind)) kinds.push_back(t.kind);
        kinds_of.push_back(std::move(kinds));
    }
    core::Layout layout;
    SX_TRY(core::Layout::build(shapes, world_size, kAlignmentBytes, &layout));
    for (size_t p = 0; p < plan->manifest.params.size(); ++p) {
        const core::ParamPlacement &at = layout.placement(static_cast<int32_t>(p));
        plan->manifest.params[p].unit_offset = at.offset;
        plan->manifest.params[p].unit_shard_numel = layout.units()[at.unit_index].shard_numel;
    }
    int fds[2] = {-1, -1};
    Status s;
    for (int f = 0; f < (in.has_optimizer ? 2 : 1) && s.ok(); ++f) s = ops.open_read_named(in.files[f].path, &fds[f]);
    std::vector<float> values;
    std::vector<char> scratch;
    for (int r = 0; r < world_size && s.ok(); ++r) {
        const std::string name = ckpt::shard_file_name(r, world_size);
        plan->manifest.files.push_back(name);
        s = write_shard(ops, in, fds, layout, kinds_of, kept, r, tmp_dir + "/" + name, plan, &values, &scratch);
    }
    for (int f = 0; f < 2; ++f)
        if (fds[f] >= 0) ops.close(fds[f], in.files[f].path);
    SX_TRY(s);
    return ckpt::commit_checkpoint(ops, plan->manifest, tmp_dir, final_dir, parent);
}

Status read_inputs(io::FileOps &ops, const std::string &weights, const std::string &prefix, Inputs *in) {
    SX_TRY(read_safetensors(ops, weights, &in->files[0]));
    if (prefix.empty()) return Status::Ok();
    in->has_optimizer = true;
    in->json_path = prefix + ".json";
    std::string text;
    SX_TRY(io::read_file(ops, in->json_path, kMaxOptimizerJsonBytes, &text, /*named=*/true));
    SX_TRY(parse_optimizer_json(text, printable(in->json_path), &in->doc));
    return read_safetensors(ops, prefix + ".safetensors", &in->files[1]);
}

Status import_checkpoint(io::FileOps &ops, const std::string &weights, const std::string &prefix, int world_size,
                         const std::string &dir, ImportPlan *plan) {
    std::string trimmed = dir;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    const size_t slash = trimmed.rfind('/');
    const std::string parent =
        slash == std::string::npos ? "." : (slash == 0 ? "/" : trimmed.substr(0, slash));
    const std::string tmp_dir = trimmed + ckpt::kPartialSuffix;
    bool exists = false;
    SX_TRY(ops.exists(trimmed, &exists));
    SX_CHECK(!exists, SX_ERR_ALREADY_EXISTS, "%s already exists; import makes a new checkpoint directory",
             printable(trimmed).c_str());

    Inputs in;
    SX_TRY(read_inputs(ops, weights, prefix, &in));
    SX_TRY(plan_import(in, world_size, plan));
    SX_TRY(read_factored(ops, in, plan));
    // A directory with this suffix never holds a checkpoint: it is what an import or a
    // save left when it did not commit, removed here unless a live process (another
    // import, or a save's rank 0) holds it; this import holds its own until it is done.
    SX_TRY(ckpt::clear_unfinished(ops, tmp_dir));
    ckpt::DirectoryLock lock;
    SX_TRY(ckpt::make_unfinished_directory(ops, trimmed, tmp_dir, &lock));
    Status s = write_checkpoint(ops, in, world_size, plan, tmp_dir, trimmed, parent);
    if (!s.ok()) {
        bool left = false;
        if (ops.exists(tmp_dir, &left).ok() && left) ops.remove_tree(tmp_dir);  // best effort: s matters
    }
    return s;
}

// What import wrote, in a line.
std::string import_summary(const std::string &dir, const ImportPlan &plan) {
    const ckpt::Manifest &m = plan.manifest;
    return format("wrote %s: %zu params, %zu optimizer state tensors, %zu param groups, as %d ranks' shards; step "
                  "%" PRIu64 ", format %u.%u\n",
                  printable(dir).c_str(), m.params.size(), plan.state_tensors, m.param_groups.size(), m.world_size,
                  m.step, ckpt::kFormatMajor, ckpt::kFormatMinor);
}

}  // namespace

bool parse_world_size(const std::string &text, int *n) {
    char *end = nullptr;
    const long v = std::strtol(text.c_str(), &end, 10);
    if (text.empty() || *end != '\0' || v < 1 || v > kMaxWorldSize) return false;
    *n = static_cast<int>(v);
    return true;
}

Status import_for_join(io::FileOps &ops, const std::string &weights, const std::string &prefix, int world_size,
                       const std::string &dir, std::string *summary) {
    ImportPlan plan;
    SX_TRY(import_checkpoint(ops, weights, prefix, world_size, dir, &plan));
    *summary = import_summary(dir, plan);
    return Status::Ok();
}

int import_command(const std::vector<std::string> &args) {
    std::string weights, prefix, world = "1";
    std::vector<std::string> dirs;
    const int parsed = parse_args(
        "import", args, {{"--safetensors", &weights}, {"--optimizer", &prefix}, {"--world-size", &world}}, &dirs);
    if (parsed >= 0) return parsed;
    if (weights.empty()) return usage_error("import needs --safetensors WEIGHTS");
    if (dirs.size() != 1) return usage_error("import takes one checkpoint directory to create");
    int n = 0;
    if (!parse_world_size(world, &n))
        return usage_error(format("import: --world-size is '%s'; it must be a number from 1 to %d", world.c_str(),
                                  kMaxWorldSize));
    auto ops = io::posix_file_ops();
    ImportPlan plan;
    Status s = import_checkpoint(*ops, weights, prefix, n, dirs[0], &plan);
    if (!s.ok()) return failure(s.prefix("import into " + printable(dirs[0]) + " failed: "));
    std::fputs(import_summary(dirs[0], plan).c_str(), stdout);
    if (prefix.empty())
        std::printf("values only (no optimizer state): load it with SX_LOAD_PARAMS_ONLY\n");
    return kExitOk;
}

}  // namespace tool
}  // namespace sx
