// The MANIFEST's encoding: a FlatBuffer (schema manifest.fbs, identifier "SXCK")
// followed by a 16-byte trailer (magic "SXCT", CRC32C of the FlatBuffer, its size).
// Decoding trusts nothing it reads: every length, offset and count is checked before
// it is used, and nothing is copied out before its size is known to be sane.
#include "ckpt/manifest.h"

#include "optim/custom.h"

#include <flatbuffers/flatbuffers.h>

#include <cstring>
#include <utility>

#include "ckpt/manifest_generated.h"
#include "io/crc32c.h"

namespace sx {
namespace ckpt {

namespace {

namespace fb = ::sx::ckpt::fb;
using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

constexpr uint32_t kTrailerMagic = 0x54435853u;  // "SXCT" read as a little-endian uint32
// Manifest > Param > Tensor > Chunk is 4 tables deep; 16 leaves room for later minors
// and stops a crafted buffer from recursing the verifier deep.
constexpr flatbuffers::uoffset_t kMaxDepth = 16;
// Root offset, identifier, one table's soffset and the smallest vtable.
constexpr size_t kMinFlatBufferBytes = 16;

uint32_t load_le32(const uint8_t *p) {
    return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
           static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

uint64_t load_le64(const uint8_t *p) {
    return static_cast<uint64_t>(load_le32(p)) | static_cast<uint64_t>(load_le32(p + 4)) << 32;
}

void store_le(uint64_t v, size_t n, std::string *out) {
    for (size_t i = 0; i < n; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// Four bytes as a quoted string with non-printable bytes escaped, for messages.
std::string quote4(const uint8_t *p) {
    std::string s = "\"";
    for (int i = 0; i < 4; ++i) {
        if (p[i] >= 0x20 && p[i] < 0x7F && p[i] != '"' && p[i] != '\\')
            s.push_back(static_cast<char>(p[i]));
        else
            s += format("\\x%02x", p[i]);
    }
    return s + "\"";
}

// An upper bound on the FlatBuffer's size, every table, vector and string counted
// with its worst-case alignment padding and its own vtable. The builder cannot report
// running past FlatBuffers' 2 GiB limit (it only asserts), so encode checks first.
uint64_t encoded_size_bound(const Manifest &m) {
    // soffset, vtable (header and one entry per field), fields of <= 8 bytes each with
    // <= 7 bytes of padding, the table's own alignment, and the offset that refers to it.
    auto table = [](uint64_t fields) { return 32 + 17 * fields; };
    auto vector = [](uint64_t n, uint64_t elem) { return 16 + n * elem; };  // length, padding, offset
    auto string = [](uint64_t n) { return 16 + n; };                        // ... and the NUL
    uint64_t bound = 64 + table(14) + table(2) + table(5);                 // root, Manifest, Version, LossScaler
    bound += vector(m.param_groups.size(), 4) + m.param_groups.size() * table(30);
    for (const ParamGroupEntry &g : m.param_groups) {
        bound += string(g.optimizer_name.size()) + vector(g.slot_names.size(), 4) + vector(g.custom_names.size(), 4) +
                 vector(g.custom_values.size(), 8);
        for (const std::string &n : g.slot_names) bound += string(n.size());
        for (const std::string &n : g.custom_names) bound += string(n.size());
    }
    bound += vector(m.params.size(), 4);
    bound += vector(m.file_indexes.size(), 4) + m.file_indexes.size() * table(4);
    for (const ParamEntry &p : m.params) {
        bound += table(20) + string(p.name.size()) + vector(p.shape.size(), 8) + vector(p.global_shape.size(), 8) +
                 vector(p.tensors.size(), 4) +
                 vector(p.row_var.size(), 4) + vector(p.col_var.size(), 4);
        for (const Tensor &t : p.tensors)
            bound += table(3) + vector(t.chunks.size(), 4) + t.chunks.size() * table(6);
    }
    bound += vector(m.user_blob.size(), 1) + vector(m.files.size(), 4);
    for (const std::string &f : m.files) bound += string(f.size());
    return bound;
}

Offset<fb::Param> build_param(FlatBufferBuilder &fbb, const ParamEntry &p) {
    std::vector<Offset<fb::Tensor>> tensors;
    tensors.reserve(p.tensors.size());
    for (const Tensor &t : p.tensors) {
        std::vector<Offset<fb::Chunk>> chunks;
        chunks.reserve(t.chunks.size());
        for (const Chunk &c : t.chunks)
            chunks.push_back(fb::CreateChunk(fbb, c.begin, c.end, c.file, c.offset, c.length, c.crc32c));
        tensors.push_back(fb::CreateTensor(fbb, static_cast<fb::TensorKind>(t.kind),
                                           static_cast<fb::DType>(t.dtype), fbb.CreateVector(chunks)));
    }
    const auto name = fbb.CreateString(p.name);
    const auto shape = fbb.CreateVector(p.shape);
    const auto tensor_vector = fbb.CreateVector(tensors);
    const auto row_var = p.row_var.empty() ? 0 : fbb.CreateVector(p.row_var);
    const auto col_var = p.col_var.empty() ? 0 : fbb.CreateVector(p.col_var);
    const auto global_shape = p.global_shape.empty() ? 0 : fbb.CreateVector(p.global_shape);
    return fb::CreateParam(fbb, name, shape, static_cast<fb::DType>(p.dtype), p.unit, p.param_group,
                           p.trainable, p.step, p.momentum_steps, tensor_vector, p.unit_offset, p.unit_shard_numel,
                           p.mu_product, row_var, col_var, p.placement, p.split_dim, global_shape, p.split_offset,
                           p.replica, p.replicas);
}

// Reads the format version before anything else is verified: a later major may
// change every other table, but never Manifest.format nor Version (manifest.fbs).
Status read_format_version(const uint8_t *buf, size_t size, uint16_t *major, uint16_t *minor) {
    flatbuffers::Verifier v(buf, size, kMaxDepth, 2);
    const flatbuffers::uoffset_t root_offset = v.VerifyOffset(0);
    bool ok = root_offset != 0;
    const auto *root = reinterpret_cast<const flatbuffers::Table *>(buf + root_offset);
    ok = ok && root->VerifyTableStart(v) && root->VerifyOffsetRequired(v, fb::Manifest::VT_FORMAT);
    const fb::Version *version = ok ? root->GetPointer<const fb::Version *>(fb::Manifest::VT_FORMAT) : nullptr;
    ok = ok && version->Verify(v);
    SX_CHECK(ok, SX_ERR_CORRUPT,
             "manifest: the format version (Manifest.format) is missing or points outside the "
             "%zu-byte FlatBuffer",
             size);
    *major = version->major();
    *minor = version->minor();
    return Status::Ok();
}

// Copies the verified FlatBuffer into a Manifest; validate() judges the values after.
// The verifier has bounded every table (in number and depth); `budget_` bounds the
// bytes of strings and vectors copied out by the FlatBuffer's own size, so that one
// string or vector shared by many tables cannot make a small file decode into a huge
// manifest.
class Reader {
  public:
    explicit Reader(size_t fb_size) : budget_(fb_size) {}

    Status read(const fb::Manifest &in, Manifest *m) {
        m->format_major = in.format()->major();
        m->format_minor = in.format()->minor();
        m->library_version = in.library_version();
        m->step = in.step();
        m->world_size = in.world_size();
        m->shard_size = in.shard_size();
        m->stage = in.stage();
        m->alignment = in.alignment();
        m->created_unix_ms = in.created_unix_ms();
        if (in.param_groups() != nullptr) {
            m->param_groups.reserve(in.param_groups()->size());
            for (const fb::ParamGroup *g : *in.param_groups()) {
                m->param_groups.emplace_back();
                SX_TRY(group(*g, &m->param_groups.back()));
            }
        }
        if (in.params() != nullptr) {
            m->params.resize(in.params()->size());
            for (flatbuffers::uoffset_t i = 0; i < in.params()->size(); ++i)
                SX_TRY(param(*in.params()->Get(i), i, &m->params[i]));
        }
        if (const fb::LossScaler *ls = in.loss_scaler()) {
            m->loss_scaler.scale = ls->scale();
            m->loss_scaler.growth_tracker = ls->growth_tracker();
            m->loss_scaler.growth_interval = ls->growth_interval();
            m->loss_scaler.growth_factor = ls->growth_factor();
            m->loss_scaler.backoff_factor = ls->backoff_factor();
        } else {
            m->loss_scaler = LossScalerEntry();
        }
        if (const auto *blob = in.user_blob()) {
            SX_TRY(take(blob->size(), "user_blob"));
            m->user_blob.assign(reinterpret_cast<const char *>(blob->data()), blob->size());
        }
        if (const auto *files = in.files()) {
            m->files.reserve(files->size());
            for (flatbuffers::uoffset_t i = 0; i < files->size(); ++i) {
                const flatbuffers::String *f = files->Get(i);
                SX_TRY(take(f->size(), format("file #%u's name", i)));
                m->files.emplace_back(f->data(), f->size());
            }
        }
        // A 1.x reader would not know the field: nor does this one in a 1.x manifest.
        const auto *indexes = m->chunks_in_files() ? in.file_indexes() : nullptr;
        if (indexes) {
            m->file_indexes.reserve(indexes->size());
            for (const fb::FileIndex *f : *indexes)
                m->file_indexes.push_back(FileIndex{f->offset(), f->length(), f->crc32c(), f->chunks()});
        }
        return Status::Ok();
    }

  private:
    Status take(uint64_t bytes, const std::string &what) {
        SX_CHECK(bytes <= budget_, SX_ERR_CORRUPT,
                 "manifest: %s would take the strings and vectors read past the FlatBuffer's "
                 "own size (shared or overlapping data)",
                 what.c_str());
        budget_ -= bytes;
        return Status::Ok();
    }

    Status group(const fb::ParamGroup &g, ParamGroupEntry *out) {
        ParamGroupEntry e;
        e.optimizer = static_cast<int32_t>(g.optimizer());
#define SX_DECODE(name, type, dflt, key, rule) e.name = g.name();
        SX_HYPERPARAMETERS(SX_DECODE)
#undef SX_DECODE
        SX_TRY(string(g.optimizer_name(), "a param group's optimizer_name", &e.optimizer_name));
        SX_TRY(strings(g.slot_names(), "a param group's slot_names", &e.slot_names));
        SX_TRY(strings(g.custom_names(), "a param group's custom_names", &e.custom_names));
        if (const auto *values = g.custom_values()) {
            SX_TRY(take(values->size() * sizeof(double), "a param group's custom_values"));
            e.custom_values.assign(values->begin(), values->end());
        }
        // A count past kMaxSteps (manifest_validate refuses it) stays past it, not negative.
        e.steps = static_cast<int64_t>(std::min<uint64_t>(g.steps(), kMaxSteps + 1));
        *out = std::move(e);
        return Status::Ok();
    }

    Status string(const flatbuffers::String *s, const char *what, std::string *out) {
        if (!s) return Status::Ok();
        SX_TRY(take(s->size(), what));
        out->assign(s->data(), s->size());
        return Status::Ok();
    }

    Status strings(const flatbuffers::Vector<flatbuffers::Offset<flatbuffers::String>> *v, const char *what,
                   std::vector<std::string> *out) {
        if (!v) return Status::Ok();
        for (flatbuffers::uoffset_t i = 0; i < v->size(); ++i) {
            out->emplace_back();
            SX_TRY(string(v->Get(i), what, &out->back()));
        }
        return Status::Ok();
    }

    // The param's placement (0s where the file predates it: a whole param).
    Status placement(const fb::Param &in, flatbuffers::uoffset_t i, ParamEntry *p) {
        p->placement = in.placement();
        p->split_dim = in.split_dim();
        p->split_offset = in.split_offset();
        p->replica = in.replica();
        p->replicas = in.replicas();
        const auto *global = in.global_shape();
        if (!global) return Status::Ok();
        SX_CHECK(global->size() == 0 || reinterpret_cast<uintptr_t>(global->data()) % alignof(int64_t) == 0,
                 SX_ERR_CORRUPT, "manifest: param #%u: its global_shape vector is not 8-byte aligned", i);
        SX_TRY(take(global->size() * sizeof(int64_t), format("param #%u's global_shape", i)));
        p->global_shape.assign(global->begin(), global->end());
        return Status::Ok();
    }

    Status param(const fb::Param &in, flatbuffers::uoffset_t i, ParamEntry *p) {
        const flatbuffers::String *name = in.name();  // required: the verifier saw it
        SX_TRY(take(name->size(), format("param #%u's name", i)));
        p->name.assign(name->data(), name->size());
        if (const auto *shape = in.shape()) {
            // FlatBuffers 2.0.8's verifier checks a vector's length field for 4-byte
            // alignment only; a builder aligns int64 elements to 8 bytes (but not the
            // end of an empty vector: there is nothing to read there).
            SX_CHECK(shape->size() == 0 || reinterpret_cast<uintptr_t>(shape->data()) % alignof(int64_t) == 0,
                     SX_ERR_CORRUPT,
                     "manifest: param #%u: its shape vector is not 8-byte aligned (no FlatBuffers "
                     "builder wrote it)",
                     i);
            SX_TRY(take(shape->size() * sizeof(int64_t), format("param #%u's shape", i)));
            p->shape.assign(shape->begin(), shape->end());
        }
        p->dtype = static_cast<int32_t>(in.dtype());
        p->unit = in.unit();
        p->param_group = in.param_group();
        p->trainable = in.trainable();
        p->step = in.step();
        p->momentum_steps = in.momentum_steps();
        p->mu_product = in.mu_product();
        p->unit_offset = in.unit_offset();
        p->unit_shard_numel = in.unit_shard_numel();
        SX_TRY(placement(in, i, p));
        for (int which = 0; which < 2; ++which) {
            const auto *v = which == 0 ? in.row_var() : in.col_var();
            if (!v) continue;
            SX_TRY(take(v->size() * sizeof(float), format("param #%u's %s", i, which == 0 ? "row_var" : "col_var")));
            (which == 0 ? p->row_var : p->col_var).assign(v->begin(), v->end());
        }
        if (const auto *tensors = in.tensors()) {
            p->tensors.resize(tensors->size());
            for (flatbuffers::uoffset_t t = 0; t < tensors->size(); ++t) {
                const fb::Tensor &src = *tensors->Get(t);
                Tensor &dst = p->tensors[t];
                dst.kind = static_cast<TensorKind>(src.kind());
                dst.dtype = static_cast<int32_t>(src.dtype());
                if (const auto *chunks = src.chunks()) {
                    dst.chunks.resize(chunks->size());
                    for (flatbuffers::uoffset_t c = 0; c < chunks->size(); ++c) {
                        const fb::Chunk &ci = *chunks->Get(c);
                        dst.chunks[c] = Chunk{ci.begin(), ci.end(), ci.file(), ci.offset(), ci.length(), ci.crc32c()};
                    }
                }
            }
        }
        return Status::Ok();
    }

    uint64_t budget_;
};

}  // namespace

ParamGroupEntry param_group_entry(const optim::Hyper &h) {
    ParamGroupEntry e;
    e.optimizer = static_cast<int32_t>(h.kind);
#define SX_TO_ENTRY(name, type, dflt, key, rule) e.name = h.name;
    SX_HYPERPARAMETERS(SX_TO_ENTRY)
#undef SX_TO_ENTRY
    if (const optim::CustomOptimizer *c = optim::find_custom(static_cast<int32_t>(h.kind))) {
        e.optimizer = kCustomOptimizer;
        e.optimizer_name = c->name;
        e.slot_names = c->slot_names;
        for (const optim::CustomHyper &hp : c->hypers)
            if (hp.key >= SX_HP_CUSTOM) {
                e.custom_names.push_back(hp.name);
                e.custom_values.push_back(h.custom[hp.key - SX_HP_CUSTOM]);
            }
    }
    return e;
}

optim::Hyper hyper_of(const ParamGroupEntry &e) {
    optim::Hyper h;
    h.kind = static_cast<optim::Kind>(e.optimizer);
#define SX_FROM_ENTRY(name, type, dflt, key, rule) h.name = e.name;
    SX_HYPERPARAMETERS(SX_FROM_ENTRY)
#undef SX_FROM_ENTRY
    if (e.optimizer == kCustomOptimizer) {
        const optim::CustomOptimizer *c = optim::find_custom(e.optimizer_name);
        h.kind = static_cast<optim::Kind>(c ? c->id : 0);
        if (c) {
            const optim::Hyper dflt = optim::default_hyper(h.kind);
            std::copy(dflt.custom, dflt.custom + optim::kMaxCustomHypers, h.custom);
            for (const optim::CustomHyper &hp : c->hypers)
                for (size_t i = 0; hp.key >= SX_HP_CUSTOM && i < e.custom_names.size() && i < e.custom_values.size(); ++i)
                    if (e.custom_names[i] == hp.name) h.custom[hp.key - SX_HP_CUSTOM] = e.custom_values[i];
        }
    }
    return optim::with_unused_defaults(h);
}

std::string tensor_name(const ParamGroupEntry &g, TensorKind kind) {
    if (kind == TensorKind::kParam) return "param";
    if (is_scales(kind)) {  // "exp_avg.scales": the scales of the group's slot
        const std::vector<TensorKind> kinds = stored_kinds(g);
        const size_t slot = static_cast<size_t>(scales_slot(kind)) + 1;
        return slot < kinds.size() ? tensor_name(g, kinds[slot]) + ".scales" : tensor_suffix(kind) + 1;
    }
    const int k = static_cast<int>(kind) - static_cast<int>(TensorKind::kSlot0);
    const bool named = g.optimizer == kCustomOptimizer && k >= 0 && static_cast<size_t>(k) < g.slot_names.size();
    return named ? g.slot_names[static_cast<size_t>(k)] : tensor_suffix(kind) + 1;
}

std::vector<TensorKind> stored_kinds(const ParamGroupEntry &g, int ndim) {
    if (g.optimizer != kCustomOptimizer) return stored_kinds(hyper_of(g), ndim);
    std::vector<TensorKind> kinds = {TensorKind::kParam};
    for (size_t k = 0; k < g.slot_names.size() && k < static_cast<size_t>(SX_MAX_CUSTOM_SLOTS); ++k)
        kinds.push_back(static_cast<TensorKind>(static_cast<int>(TensorKind::kSlot0) + static_cast<int>(k)));
    return kinds;
}

uint64_t dtype_bytes(int32_t dtype) {
    switch (dtype) {
        case SX_DTYPE_F32: return 4;
        case SX_DTYPE_F16:
        case SX_DTYPE_BF16: return 2;
        case kDTypeQ8: return 1;
        default: return 0;
    }
}

int32_t state_tensor_dtype(int32_t state_dtype) {
    return state_dtype == SX_STATE_BF16 ? SX_DTYPE_BF16 : state_dtype == SX_STATE_8BIT ? kDTypeQ8 : SX_DTYPE_F32;
}

uint16_t written_format_major(const Manifest &m) {
    for (const ParamGroupEntry &g : m.param_groups)
        if (g.state_dtype != SX_STATE_FP32) return kFormatMajor;
    return kFp32FormatMajor;
}

static_assert(static_cast<int>(fb::TensorKind::MAX) + 1 == kNumTensorKinds,
              "every TensorKind of the schema has its value in ckpt::TensorKind");

namespace {

// Each TensorKind's suffix in exports: "." and the state slot's name as torch gives it
// (index: the kind's value).
// A custom optimizer's slots' names are its group's (tensor_name); ".slotK" stands for
// them where no group is at hand.
const char *const kSuffixOfKind[kNumTensorKinds] = {"",     ".exp_avg",    ".exp_avg_sq", ".max_exp_avg_sq", ".momentum_buffer",
                                                    ".sum", ".square_avg", ".grad_avg",   ".exp_inf",
                                                    ".slot0", ".slot1", ".slot2", ".variance",   ".exp_avg_slow",
                                                    ".scales0", ".scales1", ".scales2"};

}  // namespace

const char *tensor_suffix(TensorKind kind) {
    const int k = static_cast<int>(kind);
    return k >= 0 && k < kNumTensorKinds ? kSuffixOfKind[k] : ".unknown";
}

bool tensor_kind_of(const char *slot, TensorKind *kind) {
    for (int k = 1; k < kNumTensorKinds; ++k)
        if ((k < static_cast<int>(TensorKind::kSlot0) || k > static_cast<int>(TensorKind::kSlot2)) &&
            !is_scales(static_cast<TensorKind>(k)) && std::strcmp(kSuffixOfKind[k] + 1, slot) == 0) {
            *kind = static_cast<TensorKind>(k);
            return true;
        }
    return false;
}

Status check_storable(const optim::Hyper &h) {
    if (optim::is_custom(h.kind)) return Status::Ok();
    const char *name = fb::EnumNameOptimizer(static_cast<fb::Optimizer>(h.kind));
    bool slots_named = true;
    for (int k = 0; k < optim::state_slots(h); ++k) {
        TensorKind kind;
        slots_named = slots_named && tensor_kind_of(optim::state_slot_name(h, k), &kind);
    }
    SX_CHECK(name && *name && slots_named, SX_ERR_UNSUPPORTED,
             "a param group of %s cannot be saved: checkpoint format %d.%d has no place for its optimizer or its "
             "state (sx_gather_optim_state gathers it whole)",
             optim::optimizer_name(h.kind).c_str(), kFormatMajor, kFormatMinor);
    return Status::Ok();
}

std::vector<TensorKind> stored_kinds(const optim::Hyper &h, int ndim) {
    std::vector<TensorKind> kinds = {TensorKind::kParam};
    if (optim::is_custom(h.kind)) {
        for (int k = 0; k < optim::state_slots(h); ++k)
            kinds.push_back(static_cast<TensorKind>(static_cast<int>(TensorKind::kSlot0) + k));
        return kinds;
    }
    for (int k = 0; k < optim::state_slots(h, ndim); ++k) {
        TensorKind kind = TensorKind::kParam;
        if (tensor_kind_of(optim::state_slot_name(h, k, ndim), &kind)) kinds.push_back(kind);
    }
    return kinds;
}

uint64_t ParamEntry::numel() const {
    uint64_t n = 1;
    for (int64_t extent : shape) n *= static_cast<uint64_t>(extent);
    return n;
}

namespace {

// encode_manifest of a manifest that states the format it is written as.
Status encode_as_written(const Manifest &m, std::string *bytes) {
    Status valid = validate(m);
    if (!valid.ok()) return Status(SX_ERR_INVALID_ARGUMENT, valid.message(), valid.file(), valid.line());
    const uint64_t bound = encoded_size_bound(m);
    SX_CHECK_ARG(bound < FLATBUFFERS_MAX_BUFFER_SIZE,
                 "the manifest would take up to %llu bytes, more than the %llu-byte limit",
                 static_cast<unsigned long long>(bound), static_cast<unsigned long long>(kMaxManifestBytes));

    FlatBufferBuilder fbb(bound < (1u << 20) ? static_cast<size_t>(bound) : (1u << 20));
    std::vector<Offset<fb::ParamGroup>> groups;
    groups.reserve(m.param_groups.size());
    for (const ParamGroupEntry &g : m.param_groups) {
        // A table's strings and vectors are built before the table.
        Offset<flatbuffers::String> name;
        Offset<flatbuffers::Vector<Offset<flatbuffers::String>>> slots, custom_names;
        Offset<flatbuffers::Vector<double>> custom_values;
        if (g.optimizer == kCustomOptimizer) {
            name = fbb.CreateString(g.optimizer_name);
            slots = fbb.CreateVectorOfStrings(g.slot_names);
            custom_names = fbb.CreateVectorOfStrings(g.custom_names);
            custom_values = fbb.CreateVector(g.custom_values);
        }
        fb::ParamGroupBuilder b(fbb);
#define SX_ENCODE(name, type, dflt, key, rule) b.add_##name(g.name);
        SX_HYPERPARAMETERS(SX_ENCODE)
#undef SX_ENCODE
        b.add_optimizer(static_cast<fb::Optimizer>(g.optimizer));
        b.add_steps(static_cast<uint64_t>(g.steps));
        if (g.optimizer == kCustomOptimizer) {
            b.add_optimizer_name(name);
            b.add_slot_names(slots);
            b.add_custom_names(custom_names);
            b.add_custom_values(custom_values);
        }
        groups.push_back(b.Finish());
    }
    std::vector<Offset<fb::Param>> params;
    params.reserve(m.params.size());
    for (const ParamEntry &p : m.params) params.push_back(build_param(fbb, p));
    const LossScalerEntry &ls = m.loss_scaler;
    const auto format_version = fb::CreateVersion(fbb, written_format_major(m), 0);
    const auto group_vector = fbb.CreateVector(groups);
    const auto param_vector = fbb.CreateVector(params);
    const auto loss_scaler = fb::CreateLossScaler(fbb, ls.scale, ls.growth_tracker, ls.growth_interval,
                                                  ls.growth_factor, ls.backoff_factor);
    const auto user_blob =
        fbb.CreateVector(reinterpret_cast<const uint8_t *>(m.user_blob.data()), m.user_blob.size());
    const auto files = fbb.CreateVectorOfStrings(m.files);
    std::vector<Offset<fb::FileIndex>> indexes;
    indexes.reserve(m.file_indexes.size());
    for (const FileIndex &f : m.file_indexes)
        indexes.push_back(fb::CreateFileIndex(fbb, f.offset, f.length, f.crc32c, f.chunks));
    const auto index_vector = fbb.CreateVector(indexes);
    fb::FinishManifestBuffer(
        fbb, fb::CreateManifest(fbb, format_version, m.library_version, m.step, m.world_size, m.stage,
                                m.alignment, group_vector, param_vector, loss_scaler, user_blob, files,
                                m.created_unix_ms, m.shard_size, index_vector));

    const size_t fb_size = fbb.GetSize();
    SX_CHECK_ARG(fb_size + kTrailerBytes <= kMaxManifestBytes,
                 "the manifest would be %zu bytes, more than the %llu-byte limit", fb_size + kTrailerBytes,
                 static_cast<unsigned long long>(kMaxManifestBytes));
    std::string out;
    out.reserve(fb_size + kTrailerBytes);
    out.assign(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fb_size);
    store_le(kTrailerMagic, 4, &out);
    store_le(io::crc32c(fbb.GetBufferPointer(), fb_size), 4, &out);
    store_le(fb_size, 8, &out);
    *bytes = std::move(out);
    return Status::Ok();
}

}  // namespace

Status encode_manifest(const Manifest &m, std::string *bytes) {
    SX_CHECK_ARG(bytes != nullptr, "bytes is NULL");
    SX_CHECK_ARG(m.format_major == kFormatMajor || m.format_major == kFp32FormatMajor,
                 "the manifest says format %u.%u; this library writes only %u.0 and %u.%u", m.format_major,
                 m.format_minor, kFp32FormatMajor, kFormatMajor, kFormatMinor);
    // Validated as what it is written as.
    const uint16_t major = written_format_major(m);
    if (m.format_major == major && m.format_minor == 0) return encode_as_written(m, bytes);
    Manifest as_written = m;
    as_written.format_major = major;
    as_written.format_minor = 0;
    return encode_as_written(as_written, bytes);
}

Status decode_manifest(const void *data, size_t size, Manifest *out) {
    SX_CHECK_ARG(out != nullptr, "out is NULL");
    SX_CHECK_ARG(data != nullptr || size == 0, "data is NULL but size is %zu", size);
    SX_CHECK(size <= kMaxManifestBytes, SX_ERR_CORRUPT, "manifest is %zu bytes, more than the %llu-byte limit",
             size, static_cast<unsigned long long>(kMaxManifestBytes));
    SX_CHECK(size >= kMinFlatBufferBytes + kTrailerBytes, SX_ERR_CORRUPT,
             "manifest is %zu bytes, shorter than the smallest possible (%zu): it is truncated", size,
             kMinFlatBufferBytes + kTrailerBytes);

    // The trailer checks itself (magic, then the size it states) before its CRC is trusted.
    const uint8_t *bytes = static_cast<const uint8_t *>(data);
    const uint8_t *trailer = bytes + size - kTrailerBytes;
    SX_CHECK(load_le32(trailer) == kTrailerMagic, SX_ERR_CORRUPT,
             "manifest trailer (its last %zu bytes) begins with %s, not \"SXCT\": the file is "
             "truncated or is not an sx MANIFEST",
             kTrailerBytes, quote4(trailer).c_str());
    const size_t fb_size = size - kTrailerBytes;
    const uint64_t stated_size = load_le64(trailer + 8);
    SX_CHECK(stated_size == fb_size, SX_ERR_CORRUPT,
             "manifest trailer states a %llu-byte FlatBuffer but %zu bytes precede it",
             static_cast<unsigned long long>(stated_size), fb_size);
    const uint32_t stated_crc = load_le32(trailer + 4);
    const uint32_t crc = io::crc32c(bytes, fb_size);
    SX_CHECK(stated_crc == crc, SX_ERR_CORRUPT,
             "manifest checksum mismatch: the trailer states CRC32C 0x%08x, the %zu FlatBuffer bytes "
             "give 0x%08x",
             stated_crc, fb_size, crc);

    // FlatBuffers reads scalars in place and its verifier checks their alignment
    // relative to the buffer's start, so the start must be 8-byte aligned.
    std::vector<uint64_t> aligned_copy;
    const uint8_t *buf = bytes;
    if (reinterpret_cast<uintptr_t>(bytes) % alignof(uint64_t) != 0) {
        aligned_copy.resize((fb_size + 7) / 8);
        std::memcpy(aligned_copy.data(), bytes, fb_size);
        buf = reinterpret_cast<const uint8_t *>(aligned_copy.data());
    }

    SX_CHECK(flatbuffers::BufferHasIdentifier(buf, fb::ManifestIdentifier()), SX_ERR_CORRUPT,
             "manifest file identifier is %s, not \"%s\": this is not an sx checkpoint MANIFEST",
             quote4(buf + sizeof(flatbuffers::uoffset_t)).c_str(), fb::ManifestIdentifier());
    uint16_t major = 0, minor = 0;
    SX_TRY(read_format_version(buf, fb_size, &major, &minor));
    SX_CHECK(major <= kFormatMajor, SX_ERR_VERSION,
             "checkpoint format %u.%u is newer than this library's %u.%u; load it with a newer sx", major,
             minor, kFormatMajor, kFormatMinor);
    SX_CHECK(major >= kOldestMajor, SX_ERR_VERSION,
             "checkpoint format %u.%u is older than any this library reads (%u.x to %u.x)", major, minor,
             kOldestMajor, kFormatMajor);

    // A legitimate table takes at least 8 bytes with the offset that refers to it.
    const uint64_t max_tables = fb_size / 8 + 64;
    flatbuffers::Verifier verifier(buf, fb_size, kMaxDepth, static_cast<flatbuffers::uoffset_t>(max_tables));
    SX_CHECK(fb::VerifyManifestBuffer(verifier), SX_ERR_CORRUPT,
             "manifest FlatBuffer (format %u.%u, %zu bytes) fails verification: an offset or length "
             "points outside it, a required field (Manifest.format, a param's name) is missing, or "
             "it nests deeper than %u tables or holds more than %llu",
             major, minor, fb_size, kMaxDepth, static_cast<unsigned long long>(max_tables));

    Manifest m;
    m.format_major = major;
    m.format_minor = minor;
    SX_TRY(Reader(fb_size).read(*fb::GetManifest(buf), &m));
    SX_TRY(validate(m));
    *out = std::move(m);
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
