#include "manifest_testing.h"

#include <flatbuffers/flatbuffers.h>

#include <algorithm>
#include <map>
#include <vector>

#include "ckpt/manifest_generated.h"
#include "io/crc32c.h"

namespace sx {
namespace ckpt {
namespace testing {

namespace {

namespace fb = ::sx::ckpt::fb;
using flatbuffers::FlatBufferBuilder;
using flatbuffers::Offset;

// Stores `kind` of param `p` in chunks of about numel / files.size() elements, chunk i
// in file i at the next 4 KiB boundary after what that file holds so far.
// (Scales of 8-bit state lie in block space: one per kScaleBlock elements.)
void add_tensor(Manifest *m, size_t p, TensorKind kind, int32_t dtype, std::vector<uint64_t> *file_end) {
    ParamEntry &param = m->params[p];
    Tensor t;
    t.kind = kind;
    t.dtype = dtype;
    const uint64_t numel = is_scales(kind) ? param.numel() / kScaleBlock : param.numel(),
                   files = m->files.size();
    const uint64_t per_chunk = (numel + files - 1) / files;
    for (uint64_t begin = 0, f = 0; begin < numel; begin += per_chunk, ++f) {
        Chunk c;
        c.begin = begin;
        c.end = begin + per_chunk < numel ? begin + per_chunk : numel;
        c.file = static_cast<uint32_t>(f);
        c.offset = ((*file_end)[f] + kChunkAlignment - 1) / kChunkAlignment * kChunkAlignment;
        c.length = (c.end - c.begin) * dtype_bytes(dtype);
        c.crc32c = static_cast<uint32_t>(0x9E3779B9u * (p + 1) + 0x85EBCA6Bu * c.begin + static_cast<uint32_t>(kind));
        (*file_end)[f] = c.offset + c.length;
        t.chunks.push_back(c);
    }
    param.tensors.push_back(t);
}

// A field slot after every field format 1.0 defines in a table whose last is `last`.
flatbuffers::voffset_t after(flatbuffers::voffset_t last, int k) {
    return static_cast<flatbuffers::voffset_t>(last + 2 * k);
}

bool same_double(double a, double b) { return a == b; }

}  // namespace

Manifest rich_manifest() { return as_v2(rich_manifest_v1()); }

Manifest small_manifest() { return as_v2(small_manifest_v1()); }

Manifest as_v2(const Manifest &v1) {
    Manifest m = v1;
    m.format_major = kFp32FormatMajor;  // fp32 state: what a save writes it as
    m.format_minor = kFormatMinor;
    const uint64_t files = m.files.size();
    m.file_indexes.assign(files, FileIndex());
    // 3.0 counts each param group's steps (its second group was added 5 steps later).
    for (size_t g = 0; g < m.param_groups.size(); ++g) m.param_groups[g].steps = g == 1 ? 7 : static_cast<int64_t>(m.step);
    std::vector<uint64_t> data_end(files, 0);
    for (const ParamEntry &p : v1.params)
        for (const Tensor &t : p.tensors)
            for (const Chunk &c : t.chunks) {
                m.file_indexes[c.file].chunks++;
                data_end[c.file] = std::max(data_end[c.file], c.offset + c.length);
            }
    for (uint64_t f = 0; f < files; ++f) {
        FileIndex &fi = m.file_indexes[f];
        fi.offset = data_end[f];
        fi.length = 8 + 48 * uint64_t{fi.chunks};
        fi.crc32c = static_cast<uint32_t>(0x2545F491u * (f + 1));
    }
    // Units: params in order, each start a multiple of 16 elements, split into `files`
    // equal shards.
    std::map<int32_t, uint64_t> unit_end;
    for (ParamEntry &p : m.params) {
        for (Tensor &t : p.tensors) t.chunks.clear();
        uint64_t &end = unit_end[p.unit];
        p.unit_offset = (end + 15) / 16 * 16;
        end = p.unit_offset + p.numel();
    }
    for (ParamEntry &p : m.params) p.unit_shard_numel = (unit_end[p.unit] + files - 1) / (files ? files : 1);
    return m;
}

Manifest rich_manifest_v1() {
    Manifest m;
    m.format_major = 1;
    m.format_minor = 2;
    m.library_version = 10000;
    m.step = 12;
    m.world_size = 3;
    m.stage = 1;
    m.alignment = 256;
    m.created_unix_ms = 1795000000123ull;
    ParamGroupEntry adamw;
    adamw.optimizer = SX_OPTIM_ADAMW;
    adamw.lr = 3e-4;
    adamw.weight_decay = 0.01;
    adamw.beta1 = 0.9;
    adamw.beta2 = 0.95;
    adamw.eps = 1e-8;
    adamw.amsgrad = true;
    ParamGroupEntry sgd;
    sgd.optimizer = SX_OPTIM_SGD;
    sgd.lr = 0.1;
    sgd.momentum = 0.9;
    sgd.nesterov = true;
    sgd.maximize = true;
    ParamGroupEntry adam;
    adam.optimizer = SX_OPTIM_ADAM;
    adam.lr = 1e-3;
    adam.beta1 = 0.8;
    adam.beta2 = 0.999;
    adam.eps = 1e-6;
    adam.weight_decay = 1e-5;
    m.param_groups = {adamw, sgd, adam};
    m.files = {"shard-00000-of-00003.bin", "shard-00001-of-00003.bin", "shard-00002-of-00003.bin"};

    ParamEntry embed;
    embed.name = "encoder.embed.weight";
    embed.shape = {100, 64};
    embed.unit = 0;
    embed.param_group = 0;
    embed.step = 12;
    ParamEntry bias;
    bias.name = "encoder.layers.0.bias";
    bias.shape = {64};
    bias.dtype = SX_DTYPE_BF16;
    bias.unit = 1;
    bias.param_group = 1;
    bias.step = 12;
    bias.momentum_steps = 11;
    ParamEntry scale;
    scale.name = "head.scale";
    scale.dtype = SX_DTYPE_F16;
    scale.unit = 1;
    scale.param_group = 2;
    scale.trainable = false;
    scale.step = 5;
    ParamEntry utf8;
    utf8.name = "d\xc3\xa9\x63odeur.\xc3\x9f.\xe2\x82\xac";  // "décodeur.ß.€"
    utf8.shape = {3, 5, 7};
    utf8.unit = 2;
    utf8.param_group = 0;
    utf8.step = 7;
    m.params = {embed, bias, scale, utf8};

    std::vector<uint64_t> file_end(m.files.size(), 0);
    for (TensorKind k : {TensorKind::kParam, TensorKind::kExpAvg, TensorKind::kExpAvgSq, TensorKind::kMaxExpAvgSq})
        add_tensor(&m, 0, k, SX_DTYPE_F32, &file_end);
    add_tensor(&m, 1, TensorKind::kParam, SX_DTYPE_F32, &file_end);
    add_tensor(&m, 1, TensorKind::kMomentumBuffer, SX_DTYPE_F32, &file_end);
    for (TensorKind k : {TensorKind::kParam, TensorKind::kExpAvg, TensorKind::kExpAvgSq})
        add_tensor(&m, 2, k, SX_DTYPE_F32, &file_end);
    add_tensor(&m, 3, TensorKind::kParam, SX_DTYPE_BF16, &file_end);

    m.loss_scaler.scale = 65536.0;
    m.loss_scaler.growth_tracker = 17;
    m.loss_scaler.growth_interval = 2000;
    m.loss_scaler.growth_factor = 2.0;
    m.loss_scaler.backoff_factor = 0.5;
    static const char kBlob[] = "rng\0state\0\0\xff loader pos=1234\0";
    m.user_blob.assign(kBlob, sizeof kBlob);  // NUL bytes inside and at the end
    for (int i = 0; i < 200; ++i) m.user_blob.push_back(static_cast<char>((i * 37 + 11) & 0xFF));
    return m;
}

Manifest packed_manifest() {
    Manifest m = small_manifest_v1();
    ParamGroupEntry eight;
    eight.optimizer = SX_OPTIM_ADAMW;
    eight.lr = 1e-3;
    eight.weight_decay = 0.01;
    eight.beta1 = 0.9;
    eight.beta2 = 0.999;
    eight.eps = 1e-8;
    eight.state_dtype = SX_STATE_8BIT;
    ParamGroupEntry bf16 = eight;
    bf16.state_dtype = SX_STATE_BF16;
    m.param_groups = {eight, bf16};
    m.params.clear();
    struct Def {
        const char *name;
        std::vector<int64_t> shape;
        int32_t group, unit, state;
    };
    // "w" in 8-bit blocks, "b" (too small for them) keeping fp32 state in the same group
    // and unit, "v" of bf16 state in a unit of its own.
    const Def defs[] = {{"w", {16, 256}, 0, 0, SX_STATE_8BIT}, {"b", {300}, 0, 0, SX_STATE_FP32},
                        {"v", {5, 7}, 1, 1, SX_STATE_BF16}};
    std::vector<uint64_t> file_end(1, 0);
    for (const Def &d : defs) {
        ParamEntry p;
        p.name = d.name;
        p.shape = d.shape;
        p.param_group = d.group;
        p.unit = d.unit;
        p.step = 3;
        m.params.push_back(p);
        const size_t i = m.params.size() - 1;
        const int32_t slot_dtype = d.state == SX_STATE_8BIT ? kDTypeQ8 : d.state == SX_STATE_BF16 ? SX_DTYPE_BF16
                                                                                                  : SX_DTYPE_F32;
        add_tensor(&m, i, TensorKind::kParam, SX_DTYPE_F32, &file_end);
        add_tensor(&m, i, TensorKind::kExpAvg, slot_dtype, &file_end);
        add_tensor(&m, i, TensorKind::kExpAvgSq, slot_dtype, &file_end);
        if (d.state != SX_STATE_8BIT) continue;
        add_tensor(&m, i, TensorKind::kScales0, SX_DTYPE_F32, &file_end);
        add_tensor(&m, i, TensorKind::kScales1, SX_DTYPE_F32, &file_end);
    }
    Manifest packed = as_v2(m);
    packed.format_major = kFormatMajor;
    packed.format_minor = 0;
    for (ParamGroupEntry &g : packed.param_groups) g.steps = static_cast<int64_t>(packed.step);
    // 8-bit blocks never straddle a shard: "w" starts its unit, whose one shard is whole.
    return packed;
}

Manifest small_manifest_v1() {
    Manifest m;
    m.format_major = 1;
    m.format_minor = 2;
    m.step = 3;
    m.param_groups.resize(1);
    m.files = {"shard-00000-of-00001.bin"};
    ParamEntry p;
    p.name = "w";
    p.shape = {2, 3};
    p.step = 3;
    m.params = {p};
    std::vector<uint64_t> file_end(1, 0);
    add_tensor(&m, 0, TensorKind::kParam, SX_DTYPE_F32, &file_end);
    m.user_blob = std::string("a\0b", 3);
    return m;
}

std::string with_trailer(const std::string &flatbuffer) {
    std::string out = flatbuffer;
    auto put = [&out](uint64_t v, int n) {
        for (int i = 0; i < n; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
    };
    out += "SXCT";
    put(io::crc32c(flatbuffer.data(), flatbuffer.size()), 4);
    put(flatbuffer.size(), 8);
    return out;
}

std::string raw_encode(const Manifest &m, uint16_t major, uint16_t minor, bool unknown_fields) {
    FlatBufferBuilder fbb;
    fbb.ForceDefaults(true);  // unlike the library's encoder: defaults stored, not implied
    // Fields a later minor might append, added to the table being built.
    Offset<flatbuffers::String> note;
    Offset<void> extra_table;
    if (unknown_fields) {
        note = fbb.CreateString("written by a later minor");
        const flatbuffers::uoffset_t start = fbb.StartTable();
        fbb.AddElement<double>(4, 2.5, 0.0);
        fbb.AddElement<int32_t>(6, -7, 0);
        extra_table = Offset<void>(fbb.EndTable(start));
    }
    auto extras = [&](flatbuffers::voffset_t last) {
        if (!unknown_fields) return;
        fbb.AddElement<uint64_t>(after(last, 1), 0x0123456789ABCDEFull, 0);
        fbb.AddOffset(after(last, 2), note);
        fbb.AddOffset(after(last, 3), extra_table);
    };

    std::vector<Offset<fb::ParamGroup>> groups;
    for (const ParamGroupEntry &g : m.param_groups) {
        fb::ParamGroupBuilder b(fbb);
        b.add_optimizer(static_cast<fb::Optimizer>(g.optimizer));
        b.add_lr(g.lr);
        b.add_weight_decay(g.weight_decay);
        b.add_beta1(g.beta1);
        b.add_beta2(g.beta2);
        b.add_eps(g.eps);
        b.add_momentum(g.momentum);
        b.add_dampening(g.dampening);
        b.add_nesterov(g.nesterov);
        b.add_maximize(g.maximize);
        b.add_amsgrad(g.amsgrad);
        if (major >= 3) {  // 3.0 appended the hyperparameters of the optimizers it added
            b.add_lr_decay(g.lr_decay);
            b.add_initial_accumulator_value(g.initial_accumulator_value);
            b.add_alpha(g.alpha);
            b.add_centered(g.centered);
            b.add_momentum_decay(g.momentum_decay);
            b.add_decoupled_weight_decay(g.decoupled_weight_decay);
            b.add_steps(static_cast<uint64_t>(g.steps));
            b.add_ns_a(g.ns_a);
            b.add_ns_b(g.ns_b);
            b.add_ns_c(g.ns_c);
            b.add_ns_steps(g.ns_steps);
            b.add_adjust_lr(g.adjust_lr);
            b.add_beta2_decay(g.beta2_decay);
            b.add_eps2(g.eps2);
            b.add_d(g.d);
            // 4.0's (a packed group's): written into a 3.x file too where a test asks,
            // which a 3.x reader must refuse.
            if (g.state_dtype != 0) b.add_state_dtype(g.state_dtype);
        }
        extras(major >= 3 ? fb::ParamGroup::VT_STATE_DTYPE : fb::ParamGroup::VT_AMSGRAD);
        groups.push_back(b.Finish());
    }
    std::vector<Offset<fb::Param>> params;
    for (const ParamEntry &p : m.params) {
        std::vector<Offset<fb::Tensor>> tensors;
        for (const Tensor &t : p.tensors) {
            std::vector<Offset<fb::Chunk>> chunks;
            for (const Chunk &c : t.chunks) {
                fb::ChunkBuilder b(fbb);
                b.add_begin(c.begin);
                b.add_end(c.end);
                b.add_file(c.file);
                b.add_offset(c.offset);
                b.add_length(c.length);
                b.add_crc32c(c.crc32c);
                extras(fb::Chunk::VT_CRC32C);
                chunks.push_back(b.Finish());
            }
            const auto chunk_vector = fbb.CreateVector(chunks);
            fb::TensorBuilder b(fbb);
            b.add_kind(static_cast<fb::TensorKind>(t.kind));
            b.add_dtype(static_cast<fb::DType>(t.dtype));
            b.add_chunks(chunk_vector);
            extras(fb::Tensor::VT_CHUNKS);
            tensors.push_back(b.Finish());
        }
        const auto name = fbb.CreateString(p.name);
        const auto shape = fbb.CreateVector(p.shape);
        const auto tensor_vector = fbb.CreateVector(tensors);
        const auto row_var = major >= 3 && !p.row_var.empty() ? fbb.CreateVector(p.row_var) : 0;
        const auto col_var = major >= 3 && !p.col_var.empty() ? fbb.CreateVector(p.col_var) : 0;
        const auto global_shape = major >= 3 && !p.global_shape.empty() ? fbb.CreateVector(p.global_shape) : 0;
        fb::ParamBuilder b(fbb);
        b.add_name(name);
        b.add_shape(shape);
        b.add_dtype(static_cast<fb::DType>(p.dtype));
        b.add_unit(p.unit);
        b.add_param_group(p.param_group);
        b.add_trainable(p.trainable);
        b.add_step(p.step);
        b.add_momentum_steps(p.momentum_steps);
        b.add_tensors(tensor_vector);
        if (major >= 2) {
            b.add_unit_offset(p.unit_offset);
            b.add_unit_shard_numel(p.unit_shard_numel);
        }
        if (major >= 3) {  // 3.0
            b.add_mu_product(p.mu_product);
            if (!row_var.IsNull()) b.add_row_var(row_var);
            if (!col_var.IsNull()) b.add_col_var(col_var);
            // Placement (written since 1.7, in 3.x and 4.x files alike).
            b.add_placement(p.placement);
            b.add_split_dim(p.split_dim);
            if (!global_shape.IsNull()) b.add_global_shape(global_shape);
            b.add_split_offset(p.split_offset);
            b.add_replica(p.replica);
            b.add_replicas(p.replicas);
        }
        extras(major >= 3   ? fb::Param::VT_REPLICAS
               : major >= 2 ? fb::Param::VT_UNIT_SHARD_NUMEL
                            : fb::Param::VT_TENSORS);
        params.push_back(b.Finish());
    }
    fb::VersionBuilder vb(fbb);
    vb.add_major(major);
    vb.add_minor(minor);
    const auto version = vb.Finish();
    fb::LossScalerBuilder lb(fbb);
    lb.add_scale(m.loss_scaler.scale);
    lb.add_growth_tracker(m.loss_scaler.growth_tracker);
    lb.add_growth_interval(m.loss_scaler.growth_interval);
    lb.add_growth_factor(m.loss_scaler.growth_factor);
    lb.add_backoff_factor(m.loss_scaler.backoff_factor);
    extras(fb::LossScaler::VT_BACKOFF_FACTOR);
    const auto loss_scaler = lb.Finish();
    const auto group_vector = fbb.CreateVector(groups);
    const auto param_vector = fbb.CreateVector(params);
    const auto blob = fbb.CreateVector(reinterpret_cast<const uint8_t *>(m.user_blob.data()), m.user_blob.size());
    const auto files = fbb.CreateVectorOfStrings(m.files);
    std::vector<Offset<fb::FileIndex>> indexes;
    for (const FileIndex &f : m.file_indexes) {
        fb::FileIndexBuilder ib(fbb);
        ib.add_offset(f.offset);
        ib.add_length(f.length);
        ib.add_crc32c(f.crc32c);
        ib.add_chunks(f.chunks);
        extras(fb::FileIndex::VT_CHUNKS);
        indexes.push_back(ib.Finish());
    }
    const auto index_vector = fbb.CreateVector(indexes);
    fb::ManifestBuilder b(fbb);
    b.add_format(version);
    b.add_library_version(m.library_version);
    b.add_step(m.step);
    b.add_world_size(m.world_size);
    b.add_stage(m.stage);
    b.add_alignment(m.alignment);
    b.add_param_groups(group_vector);
    b.add_params(param_vector);
    b.add_loss_scaler(loss_scaler);
    b.add_user_blob(blob);
    b.add_files(files);
    b.add_created_unix_ms(m.created_unix_ms);
    // 1.2 appended shard_size: later minors write it, and append after it.
    const bool has_shard_size = major > 1 || minor >= 2;
    if (has_shard_size) b.add_shard_size(m.shard_size);
    // 2.0 appended file_indexes.
    if (major >= 2) b.add_file_indexes(index_vector);
    extras(major >= 2 ? fb::Manifest::VT_FILE_INDEXES
                      : has_shard_size ? fb::Manifest::VT_SHARD_SIZE : fb::Manifest::VT_CREATED_UNIX_MS);
    fb::FinishManifestBuffer(fbb, b.Finish());
    return with_trailer(std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize()));
}

std::string retyped_manifest(uint16_t major) {
    FlatBufferBuilder fbb;
    const auto version = fb::CreateVersion(fbb, major, 0);
    const auto text = fbb.CreateString("world size as text");
    const flatbuffers::uoffset_t start = fbb.StartTable();
    fbb.AddOffset(fb::Manifest::VT_FORMAT, version);
    fbb.AddElement<uint32_t>(fb::Manifest::VT_PARAMS, 0x7FFFFFF0u, 0);
    fbb.AddOffset(fb::Manifest::VT_WORLD_SIZE, text);
    fbb.Finish(Offset<fb::Manifest>(fbb.EndTable(start)), fb::ManifestIdentifier());
    return with_trailer(std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize()));
}

std::string sharing_manifest(bool share_tensors) {
    FlatBufferBuilder fbb;
    const auto shared_name = fbb.CreateString(std::string(1000, 'n'));
    std::vector<Offset<fb::Chunk>> chunks;
    for (uint64_t c = 0; c < 1000; ++c) chunks.push_back(fb::CreateChunk(fbb, c, c + 1, 0, 4096 * c, 4, 0));
    const auto chunk_vector = fbb.CreateVector(chunks);
    const auto tensor = fb::CreateTensor(fbb, fb::TensorKind::Param, fb::DType::F32, chunk_vector);
    const auto tensors = fbb.CreateVector(&tensor, 1);
    const std::vector<int64_t> extent = {1000};
    const auto shape = fbb.CreateVector(extent);
    std::vector<Offset<fb::Param>> params;
    for (int i = 0; i < 2000; ++i) {
        const auto name = share_tensors ? fbb.CreateString("p" + std::to_string(i)) : shared_name;
        params.push_back(fb::CreateParam(fbb, name, shape, fb::DType::F32, 0, 0, true, 0, 0,
                                         share_tensors ? tensors : 0));
    }
    const auto group = fb::CreateParamGroup(fbb);
    const auto groups = fbb.CreateVector(&group, 1);
    const auto param_vector = fbb.CreateVector(params);
    const auto files = fbb.CreateVectorOfStrings({"shard-00000-of-00001.bin"});
    const auto version = fb::CreateVersion(fbb, kFormatMajor, kFormatMinor);
    fb::FinishManifestBuffer(fbb, fb::CreateManifest(fbb, version, 0, 0, 1, 2, 64, groups, param_vector, 0, 0, files));
    return with_trailer(std::string(reinterpret_cast<const char *>(fbb.GetBufferPointer()), fbb.GetSize()));
}

bool manifest_equal(const Manifest &a, const Manifest &b, bool compare_format, std::string *where) {
    auto differ = [where](const std::string &field) {
        if (where != nullptr) *where = field;
        return false;
    };
    if (compare_format && (a.format_major != b.format_major || a.format_minor != b.format_minor))
        return differ("format");
    if (a.library_version != b.library_version) return differ("library_version");
    if (a.step != b.step) return differ("step");
    if (a.world_size != b.world_size) return differ("world_size");
    if (a.shard_size != b.shard_size) return differ("shard_size");
    if (a.stage != b.stage) return differ("stage");
    if (a.alignment != b.alignment) return differ("alignment");
    if (a.created_unix_ms != b.created_unix_ms) return differ("created_unix_ms");
    if (a.user_blob != b.user_blob) return differ("user_blob");
    if (a.files != b.files) return differ("files");
    if (a.file_indexes.size() != b.file_indexes.size()) return differ("file_indexes (count)");
    for (size_t f = 0; f < a.file_indexes.size(); ++f) {
        const FileIndex &x = a.file_indexes[f], &y = b.file_indexes[f];
        if (x.offset != y.offset || x.length != y.length || x.crc32c != y.crc32c || x.chunks != y.chunks)
            return differ("file index " + std::to_string(f));
    }
    const LossScalerEntry &la = a.loss_scaler, &lb = b.loss_scaler;
    if (!same_double(la.scale, lb.scale) || la.growth_tracker != lb.growth_tracker ||
        la.growth_interval != lb.growth_interval || !same_double(la.growth_factor, lb.growth_factor) ||
        !same_double(la.backoff_factor, lb.backoff_factor))
        return differ("loss_scaler");
    if (a.param_groups.size() != b.param_groups.size()) return differ("param_groups (count)");
    for (size_t g = 0; g < a.param_groups.size(); ++g) {
        const ParamGroupEntry &x = a.param_groups[g], &y = b.param_groups[g];
        if (x.optimizer != y.optimizer || !same_double(x.lr, y.lr) || !same_double(x.weight_decay, y.weight_decay) ||
            !same_double(x.beta1, y.beta1) || !same_double(x.beta2, y.beta2) || !same_double(x.eps, y.eps) ||
            !same_double(x.momentum, y.momentum) || !same_double(x.dampening, y.dampening) ||
            x.nesterov != y.nesterov || x.maximize != y.maximize || x.amsgrad != y.amsgrad || x.steps != y.steps)
            return differ("param group " + std::to_string(g));
    }
    if (a.params.size() != b.params.size()) return differ("params (count)");
    for (size_t i = 0; i < a.params.size(); ++i) {
        const ParamEntry &x = a.params[i], &y = b.params[i];
        const std::string p = "param #" + std::to_string(i);
        if (x.name != y.name) return differ(p + " name");
        if (x.shape != y.shape) return differ(p + " shape");
        if (x.dtype != y.dtype || x.unit != y.unit || x.param_group != y.param_group || x.trainable != y.trainable ||
            x.step != y.step || x.momentum_steps != y.momentum_steps || x.unit_offset != y.unit_offset ||
            x.unit_shard_numel != y.unit_shard_numel)
            return differ(p + " scalars");
        if (x.placement != y.placement || x.split_dim != y.split_dim || x.global_shape != y.global_shape ||
            x.split_offset != y.split_offset || x.replica != y.replica || x.replicas != y.replicas)
            return differ(p + " placement");
        if (x.tensors.size() != y.tensors.size()) return differ(p + " tensors (count)");
        for (size_t t = 0; t < x.tensors.size(); ++t) {
            const Tensor &u = x.tensors[t], &v = y.tensors[t];
            const std::string tn = p + " tensor #" + std::to_string(t);
            if (u.kind != v.kind || u.dtype != v.dtype) return differ(tn + " kind/dtype");
            if (u.chunks.size() != v.chunks.size()) return differ(tn + " chunks (count)");
            for (size_t c = 0; c < u.chunks.size(); ++c) {
                const Chunk &r = u.chunks[c], &s = v.chunks[c];
                if (r.begin != s.begin || r.end != s.end || r.file != s.file || r.offset != s.offset ||
                    r.length != s.length || r.crc32c != s.crc32c)
                    return differ(tn + " chunk #" + std::to_string(c));
            }
        }
    }
    return true;
}

}  // namespace testing
}  // namespace ckpt
}  // namespace sx
