// The MANIFEST: round trips, every rule of validate() from both directions (encode
// refuses, decode reports corruption, each naming what is wrong) for format 2.0 and for
// the 1.x manifests this library still reads, and versions.
#include "sx_cmocka.h"

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/manifest.h"
#include "io/crc32c.h"
#include "manifest_testing.h"

using sx::Status;
using namespace sx::ckpt;
using sx::ckpt::testing::manifest_equal;
using sx::ckpt::testing::packed_manifest;
using sx::ckpt::testing::raw_encode;
using sx::ckpt::testing::retyped_manifest;
using sx::ckpt::testing::rich_manifest;
using sx::ckpt::testing::rich_manifest_v1;
using sx::ckpt::testing::small_manifest;
using sx::ckpt::testing::small_manifest_v1;

namespace {

// The smallest 2.0 manifest: every field at its default but the one file a group of one
// rank writes, with an index of no records.
Manifest empty_manifest() {
    Manifest m;
    m.files = {"shard-00000-of-00001.bin"};
    m.file_indexes = {FileIndex{0, 8, 0x1234u, 0}};
    return m;
}

void assert_contains(const std::string &haystack, const std::string &needle) {
    if (haystack.find(needle) == std::string::npos) {
        print_error("message \"%s\" does not contain \"%s\"\n", haystack.c_str(), needle.c_str());
        fail();
    }
}

void assert_same(const Manifest &a, const Manifest &b, bool compare_format) {
    std::string where;
    if (!manifest_equal(a, b, compare_format, &where)) {
        print_error("manifests differ at %s\n", where.c_str());
        fail();
    }
}

std::string encode(const Manifest &m) {
    std::string bytes;
    Status s = encode_manifest(m, &bytes);
    if (!s.ok()) print_error("%s\n", s.message().c_str());
    assert_true(s.ok());
    return bytes;
}

Manifest decode(const std::string &bytes) {
    Manifest m;
    Status s = decode_manifest(bytes.data(), bytes.size(), &m);
    if (!s.ok()) print_error("%s\n", s.message().c_str());
    assert_true(s.ok());
    return m;
}

void test_round_trip_field_by_field(void **) {
    Manifest m = rich_manifest();
    m.world_size = 6;  // 1.2: a mesh of 2 x 3, whose first replica group wrote the 3 files
    m.shard_size = 3;
    const std::string bytes = encode(m);
    const Manifest d = decode(bytes);
    assert_int_equal(d.shard_size, 3);
    assert_int_equal(d.format_major, kFp32FormatMajor);  // no packed state: still 3.0
    assert_int_equal(d.format_minor, 0);
    assert_int_equal(d.library_version, 10000);
    assert_int_equal(d.step, 12);
    assert_int_equal(d.world_size, 6);
    assert_int_equal(d.stage, 1);
    assert_int_equal(d.alignment, 256);
    assert_int_equal(d.created_unix_ms, 1795000000123ull);
    assert_int_equal(d.param_groups.size(), 3);
    for (size_t g = 0; g < 3; ++g) {
        const ParamGroupEntry &x = m.param_groups[g], &y = d.param_groups[g];
        assert_int_equal(y.optimizer, x.optimizer);
        assert_true(y.lr == x.lr && y.weight_decay == x.weight_decay && y.beta1 == x.beta1 && y.beta2 == x.beta2);
        assert_true(y.eps == x.eps && y.momentum == x.momentum && y.dampening == x.dampening);
        assert_true(y.nesterov == x.nesterov && y.maximize == x.maximize && y.amsgrad == x.amsgrad);
    }
    assert_int_equal(d.param_groups[0].optimizer, SX_OPTIM_ADAMW);
    assert_true(d.param_groups[0].amsgrad && d.param_groups[0].beta2 == 0.95);
    assert_true(d.param_groups[1].nesterov && d.param_groups[1].maximize && d.param_groups[1].momentum == 0.9);
    assert_int_equal(d.params.size(), 4);
    for (size_t i = 0; i < 4; ++i) {
        const ParamEntry &x = m.params[i], &y = d.params[i];
        assert_string_equal(y.name.c_str(), x.name.c_str());
        assert_true(y.shape == x.shape);
        assert_int_equal(y.dtype, x.dtype);
        assert_int_equal(y.unit, x.unit);
        assert_int_equal(y.param_group, x.param_group);
        assert_int_equal(y.trainable, x.trainable);
        assert_int_equal(y.step, x.step);
        assert_int_equal(y.momentum_steps, x.momentum_steps);
        assert_int_equal(y.numel(), x.numel());
        assert_int_equal(y.tensors.size(), x.tensors.size());
        for (size_t t = 0; t < x.tensors.size(); ++t) {
            assert_int_equal(static_cast<int>(y.tensors[t].kind), static_cast<int>(x.tensors[t].kind));
            assert_int_equal(y.tensors[t].dtype, x.tensors[t].dtype);
            assert_int_equal(y.tensors[t].chunks.size(), x.tensors[t].chunks.size());
            for (size_t c = 0; c < x.tensors[t].chunks.size(); ++c) {
                const Chunk &u = x.tensors[t].chunks[c], &v = y.tensors[t].chunks[c];
                assert_int_equal(v.begin, u.begin);
                assert_int_equal(v.end, u.end);
                assert_int_equal(v.file, u.file);
                assert_int_equal(v.offset, u.offset);
                assert_int_equal(v.length, u.length);
                assert_int_equal(v.crc32c, u.crc32c);
            }
        }
    }
    assert_int_equal(d.params[2].shape.size(), 0);  // a scalar
    assert_int_equal(d.params[2].numel(), 1);
    assert_false(d.params[2].trainable);
    assert_int_equal(d.params[0].tensors[0].chunks.size(), 0);  // 2.0: in the files' indexes
    assert_int_equal(d.params[1].tensors[1].kind, TensorKind::kMomentumBuffer);
    for (size_t i = 0; i < 4; ++i) {
        assert_int_equal(d.params[i].unit_offset, m.params[i].unit_offset);
        assert_int_equal(d.params[i].unit_shard_numel, m.params[i].unit_shard_numel);
    }
    assert_int_equal(d.params[2].unit_offset, 64);  // after the bias, in unit 1
    assert_int_equal(d.file_indexes.size(), 3);
    for (size_t f = 0; f < 3; ++f) {
        assert_int_equal(d.file_indexes[f].offset, m.file_indexes[f].offset);
        assert_int_equal(d.file_indexes[f].length, 8 + 48 * m.file_indexes[f].chunks);
        assert_int_equal(d.file_indexes[f].crc32c, m.file_indexes[f].crc32c);
        assert_int_equal(d.file_indexes[f].chunks, m.file_indexes[f].chunks);
    }
    assert_true(d.chunks_in_files());
    assert_int_equal(d.user_blob.size(), m.user_blob.size());
    assert_memory_equal(d.user_blob.data(), m.user_blob.data(), m.user_blob.size());
    assert_int_equal(d.user_blob[3], '\0');
    assert_true(d.files == m.files);
    assert_true(d.loss_scaler.scale == 65536.0 && d.loss_scaler.growth_tracker == 17 &&
                d.loss_scaler.growth_interval == 2000 && d.loss_scaler.growth_factor == 2.0 &&
                d.loss_scaler.backoff_factor == 0.5);
    assert_same(m, d, true);
    // Deterministic: decoding and encoding again gives the same bytes.
    assert_true(encode(d) == bytes);
}

// Param 0 (a matrix) under Adafactor, in a param group of its own, with its factored
// moments: a valid manifest.
void as_adafactor(Manifest *m) {
    ParamGroupEntry g = param_group_entry(sx::optim::default_hyper(sx::optim::Kind::kAdafactor));
    g.steps = static_cast<int64_t>(m->step);
    m->param_groups.push_back(g);
    ParamEntry &p = m->params[0];
    p.param_group = static_cast<int32_t>(m->param_groups.size() - 1);
    p.tensors.resize(1);  // the values; Adafactor keeps no slot for a matrix
    p.row_var.assign(static_cast<size_t>(p.numel() / p.shape.back()), 0.25f);
    p.col_var.assign(static_cast<size_t>(p.shape.back()), 0.5f);
}

// Adafactor's factored moments go through the MANIFEST whole, bit for bit.
void test_factored_moments_round_trip(void **) {
    Manifest m = rich_manifest();
    as_adafactor(&m);
    m.params[0].row_var[1] = 3.5f;
    m.params[0].col_var.back() = 1e-30f;
    const Manifest d = decode(encode(m));
    assert_true(d.params[0].row_var == m.params[0].row_var);
    assert_true(d.params[0].col_var == m.params[0].col_var);
    assert_true(d.params[1].row_var.empty() && d.params[1].col_var.empty());
    assert_int_equal(d.param_groups.back().optimizer, SX_OPTIM_ADAFACTOR);
    assert_true(d.param_groups.back().beta2_decay == -0.8 && d.param_groups.back().d == 1.0);
}

void test_round_trip_defaults_and_small(void **) {
    const Manifest empty = empty_manifest();
    assert_same(empty, decode(encode(empty)), true);
    const Manifest small = small_manifest();
    assert_same(small, decode(encode(small)), true);
    // A value equal to the schema's default is left out, so -0.0 comes back as 0.0.
    Manifest negative_zero = small_manifest();
    negative_zero.param_groups[0].weight_decay = -0.0;
    negative_zero.loss_scaler.backoff_factor = -0.0;
    const Manifest d = decode(encode(negative_zero));
    assert_false(std::signbit(d.param_groups[0].weight_decay));
    assert_false(std::signbit(d.loss_scaler.backoff_factor));
}

void test_scalars_at_every_alignment(void **) {
    // A scalar's shape is an empty vector of int64, which FlatBuffers' builder does not
    // align to 8 bytes; found by fuzzing (corpus/crash-empty-shape-unaligned).
    for (size_t name_len = 1; name_len <= 16; ++name_len) {
        for (size_t blob_len = 0; blob_len <= 8; ++blob_len) {
            Manifest m = small_manifest();
            m.params[0].name.assign(name_len, 's');
            m.params[0].shape.clear();
            m.params[0].tensors.clear();
            m.user_blob.assign(blob_len, 'b');
            assert_same(m, decode(encode(m)), true);
        }
    }
}

void test_layout_of_the_bytes(void **) {
    const std::string bytes = encode(small_manifest());
    const size_t n = bytes.size() - kTrailerBytes;
    auto le = [&bytes](size_t at, int width) {
        uint64_t v = 0;
        for (int i = width - 1; i >= 0; --i) v = v << 8 | static_cast<unsigned char>(bytes[at + i]);
        return v;
    };
    assert_memory_equal(bytes.data() + 4, "SXCK", 4);  // FlatBuffers' file identifier
    assert_memory_equal(bytes.data() + n, "SXCT", 4);
    assert_int_equal(le(n + 4, 4), sx::io::crc32c(bytes.data(), n));
    assert_int_equal(le(n + 8, 8), n);
    assert_int_equal(sx::io::crc32c("123456789", 9), 0xE3069283u);
}

void test_names_of_things(void **) {
    assert_string_equal(tensor_suffix(TensorKind::kParam), "");
    assert_string_equal(tensor_suffix(TensorKind::kExpAvg), ".exp_avg");
    assert_string_equal(tensor_suffix(TensorKind::kExpAvgSq), ".exp_avg_sq");
    assert_string_equal(tensor_suffix(TensorKind::kMaxExpAvgSq), ".max_exp_avg_sq");
    assert_string_equal(tensor_suffix(TensorKind::kMomentumBuffer), ".momentum_buffer");
    assert_string_equal(tensor_suffix(TensorKind::kSlot0), ".slot0");
    assert_string_equal(tensor_suffix(static_cast<TensorKind>(kNumTensorKinds)), ".unknown");
    assert_int_equal(dtype_bytes(SX_DTYPE_F32), 4);
    assert_int_equal(dtype_bytes(SX_DTYPE_F16), 2);
    assert_int_equal(dtype_bytes(SX_DTYPE_BF16), 2);
    assert_int_equal(dtype_bytes(0), 0);
}

void test_decode_from_unaligned_memory(void **) {
    const std::string bytes = encode(rich_manifest());
    std::vector<char> storage(bytes.size() + 8);
    for (size_t shift = 1; shift < 8; ++shift) {
        std::memcpy(storage.data() + shift, bytes.data(), bytes.size());
        Manifest d;
        assert_true(decode_manifest(storage.data() + shift, bytes.size(), &d).ok());
        assert_same(rich_manifest(), d, true);
    }
}

void test_null_arguments(void **) {
    std::string bytes = encode(small_manifest());
    Manifest m;
    assert_int_equal(encode_manifest(small_manifest(), nullptr).code(), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(decode_manifest(bytes.data(), bytes.size(), nullptr).code(), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(decode_manifest(nullptr, 10, &m).code(), SX_ERR_INVALID_ARGUMENT);
    assert_int_equal(decode_manifest(nullptr, 0, &m).code(), SX_ERR_CORRUPT);
}

// A rule of validate(): how to break it, and what the message names.
struct Rule {
    const char *what;
    std::function<void(Manifest *)> do_break;
    const char *needle;
};

const char *const kEmbed = "'encoder.embed.weight' (#0)";
const char *const kBias = "'encoder.layers.0.bias' (#1)";
const char *const kScale = "'head.scale' (#2)";

// Rules of both formats, broken on rich_manifest() and on rich_manifest_v1().
std::vector<Rule> rules() {
    return {
        {"empty name", [](Manifest *m) { m->params[2].name = ""; }, "'' (#2)"},
        {"duplicate name", [](Manifest *m) { m->params[2].name = "encoder.embed.weight"; }, "name of param #0"},
        {"name not UTF-8", [](Manifest *m) { m->params[1].name = "bias\xff"; }, "'bias\\xff' (#1)"},
        {"name with NUL", [](Manifest *m) { m->params[1].name = std::string("bi\0as", 5); }, "'bi\\x00as' (#1)"},
        {"name too long", [](Manifest *m) { m->params[1].name = std::string(SX_MAX_NAME_BYTES + 1, 'x'); },
         "xxxxxxxx...' (#1)"},
        {"zero extent", [](Manifest *m) { m->params[0].shape = {100, 0}; }, kEmbed},
        {"negative extent", [](Manifest *m) { m->params[0].shape = {-100, -64}; }, kEmbed},
        {"too many dimensions", [](Manifest *m) { m->params[0].shape.assign(SX_MAX_NDIM + 1, 1); }, kEmbed},
        {"more than 2^62 elements", [](Manifest *m) { m->params[0].shape = {1ll << 40, 1ll << 23}; }, kEmbed},
        {"unknown param dtype", [](Manifest *m) { m->params[1].dtype = 7; }, kBias},
        {"negative unit", [](Manifest *m) { m->params[1].unit = -1; }, kBias},
        {"param group out of range", [](Manifest *m) { m->params[1].param_group = 3; }, kBias},
        {"negative param group", [](Manifest *m) { m->params[1].param_group = -1; }, kBias},
        {"negative step", [](Manifest *m) { m->params[2].step = -1; }, kScale},
        {"momentum_steps > step", [](Manifest *m) { m->params[1].momentum_steps = 13; }, kBias},
        {"param step past the checkpoint's", [](Manifest *m) { m->params[3].step = 13; },
         "step 13 is more than the checkpoint's 12 steps"},
        {"step past 2^53",
         [](Manifest *m) {
             m->step = 1ull << 59;
             for (ParamEntry &p : m->params) p.step = 1ll << 59;
         },
         "step is 576460752303423488, more than the 9007199254740992"},
        {"unknown tensor kind", [](Manifest *m) { m->params[2].tensors[1].kind = static_cast<TensorKind>(9); }, kScale},
        {"unknown tensor dtype", [](Manifest *m) { m->params[2].tensors[1].dtype = 0; }, kScale},
        {"tensor kind twice", [](Manifest *m) { m->params[2].tensors[2].kind = TensorKind::kExpAvg; }, kScale},
        {"Adam state on SGD", [](Manifest *m) { m->params[1].tensors[1].kind = TensorKind::kExpAvg; }, kBias},
        {"momentum buffer on Adam",
         [](Manifest *m) { m->params[2].tensors[2].kind = TensorKind::kMomentumBuffer; }, kScale},
        {"max_exp_avg_sq without amsgrad", [](Manifest *m) { m->param_groups[0].amsgrad = false; }, kEmbed},
        {"world_size 0", [](Manifest *m) { m->world_size = 0; }, "world_size"},
        {"shard_size not dividing world_size", [](Manifest *m) { m->shard_size = 2; }, "shard_size"},
        {"shard_size above world_size", [](Manifest *m) { m->shard_size = 6; }, "shard_size"},
        {"shard_size negative", [](Manifest *m) { m->shard_size = -3; }, "shard_size"},
        {"stage 4", [](Manifest *m) { m->stage = 4; }, "stage"},
        {"alignment 96", [](Manifest *m) { m->alignment = 96; }, "alignment"},
        {"alignment 0", [](Manifest *m) { m->alignment = 0; }, "alignment"},
        {"zero loss scale", [](Manifest *m) { m->loss_scaler.scale = 0; }, "loss_scaler.scale"},
        {"NaN loss scale", [](Manifest *m) { m->loss_scaler.scale = __builtin_nan(""); }, "loss_scaler.scale"},
        {"negative growth_interval", [](Manifest *m) { m->loss_scaler.growth_interval = -1; }, "growth_interval"},
        {"infinite growth_factor", [](Manifest *m) { m->loss_scaler.growth_factor = __builtin_inf(); },
         "growth_factor"},
        {"negative lr", [](Manifest *m) { m->param_groups[1].lr = -0.1; }, "param group 1"},
        {"unknown optimizer", [](Manifest *m) { m->param_groups[2].optimizer = 9; }, "param group 2"},
        {"beta2 = 1", [](Manifest *m) { m->param_groups[2].beta2 = 1.0; }, "param group 2"},
        {"nesterov with dampening", [](Manifest *m) { m->param_groups[1].dampening = 0.1; }, "param group 1"},
        {"empty file name", [](Manifest *m) { m->files[1] = ""; }, "file #1"},
        {"file name with '/'", [](Manifest *m) { m->files[1] = "../shard.bin"; }, "file #1"},
        {"file name '..'", [](Manifest *m) { m->files[2] = ".."; }, "file #2"},
        {"file name with NUL", [](Manifest *m) { m->files[2] = std::string("a\0b", 3); }, "file #2"},
        {"file name too long", [](Manifest *m) { m->files[2] = std::string(kMaxFileNameBytes + 1, 'f'); }, "file #2"},
        {"file listed twice", [](Manifest *m) { m->files[2] = m->files[0]; }, "file #2"},
    };
}

// Rules of the chunks, which 1.x manifests hold, broken on rich_manifest_v1().
std::vector<Rule> chunk_rules() {
    auto chunks = [](Manifest *m, size_t p, size_t t) -> std::vector<Chunk> & {
        return m->params[p].tensors[t].chunks;
    };
    return {
        {"chunks out of order",
         [chunks](Manifest *m) { std::swap(chunks(m, 0, 1)[0], chunks(m, 0, 1)[1]); }, kEmbed},
        {"chunks overlap", [chunks](Manifest *m) { chunks(m, 0, 2)[1].begin -= 1, chunks(m, 0, 2)[1].length += 4; },
         kEmbed},
        {"gap between chunks",
         [chunks](Manifest *m) { chunks(m, 0, 2)[1].begin += 1, chunks(m, 0, 2)[1].length -= 4; }, kEmbed},
        {"empty chunk",
         [chunks](Manifest *m) {
             Chunk c = chunks(m, 0, 0)[1];
             c.end = c.begin, c.length = 0;
             chunks(m, 0, 0).insert(chunks(m, 0, 0).begin() + 1, c);
         },
         kEmbed},
        {"chunk past numel", [chunks](Manifest *m) { chunks(m, 0, 3)[2].end += 1, chunks(m, 0, 3)[2].length += 4; },
         kEmbed},
        {"last chunk missing", [chunks](Manifest *m) { chunks(m, 0, 3).pop_back(); }, kEmbed},
        {"tensor without chunks", [chunks](Manifest *m) { chunks(m, 2, 0).clear(); }, kScale},
        {"wrong length", [chunks](Manifest *m) { chunks(m, 1, 1)[0].length += 1; }, kBias},
        {"length for another dtype", [](Manifest *m) { m->params[3].tensors[0].dtype = SX_DTYPE_F32; },
         "(#3), tensor param, chunk 0"},
        {"length overflows",
         [](Manifest *m) {
             m->params[0].shape = {1ll << 31, 1ll << 31};  // 2^62 elements of 4 bytes: 2^64 bytes
             m->params[0].tensors.resize(1);
             m->params[0].tensors[0].chunks = {Chunk{0, 1ull << 62, 0, 1ull << 20, 0, 0}};
         },
         kEmbed},
        {"unaligned offset", [chunks](Manifest *m) { chunks(m, 2, 1)[0].offset += 512; }, kScale},
        {"file index out of range", [chunks](Manifest *m) { chunks(m, 2, 1)[0].file = 3; }, kScale},
        {"offset + length overflows",
         [chunks](Manifest *m) { chunks(m, 0, 1)[2].offset = ~uint64_t(0) / 4096 * 4096; }, kEmbed},
        {"chunks share file bytes",
         [chunks](Manifest *m) {
             chunks(m, 2, 1)[0].file = chunks(m, 1, 0)[0].file;
             chunks(m, 2, 1)[0].offset = chunks(m, 1, 0)[0].offset;
         },
         kBias},
    };
}

// Rules of format 2.0, broken on rich_manifest().
std::vector<Rule> v2_rules() {
    return {
        {"factored moments under AdamW",
         [](Manifest *m) {
             as_adafactor(m);
             m->params[0].param_group = 0;
         },
         "which only a param of two or more dimensions keeps under Adafactor"},
        {"factored moments of the wrong size",
         [](Manifest *m) {
             as_adafactor(m);
             m->params[0].row_var.pop_back();
         },
         "row_var holds"},
        {"a negative factored moment",
         [](Manifest *m) {
             as_adafactor(m);
             m->params[0].col_var[3] = -1.0f;
         },
         "its col_var holds -1"},
        {"chunks in a 2.0 manifest",
         [](Manifest *m) { m->params[0].tensors[1].chunks = {Chunk{0, 1, 0, 0, 4, 0}}; }, "lists chunks"},
        {"file index missing", [](Manifest *m) { m->file_indexes.pop_back(); }, "2 file indexes"},
        {"fewer files than shards",
         [](Manifest *m) {
             m->files.pop_back();
             m->file_indexes.pop_back();
         },
         "checkpoint of 3 shards"},
        {"more files than shards", [](Manifest *m) { m->shard_size = 1; }, "checkpoint of 1 shards"},
        {"index length not its records'", [](Manifest *m) { m->file_indexes[1].length += 48; },
         "the index of file 'shard-00001-of-00003.bin'"},
        {"index end overflows", [](Manifest *m) { m->file_indexes[2].offset = ~uint64_t(0) - 4; },
         "the index of file 'shard-00002-of-00003.bin'"},
        {"unit shards of no element", [](Manifest *m) { m->params[1].unit_shard_numel = 0; }, kBias},
        {"group steps past the checkpoint's", [](Manifest *m) { m->param_groups[0].steps = 13; },
         "param group 0 took 13 steps, more than the checkpoint's 12"},
        {"param past its unit's files",
         [](Manifest *m) { m->params[2].unit_offset = 3 * m->params[2].unit_shard_numel; }, kScale},
        {"unit offset overflows", [](Manifest *m) { m->params[2].unit_offset = ~uint64_t(0); }, kScale},
        {"files times shard overflows", [](Manifest *m) { m->params[0].unit_shard_numel = 1ull << 63; }, kEmbed},
        {"a piece past its logical tensor",
         [](Manifest *m) {
             m->params[0].placement = SX_PLACEMENT_SPLIT;
             m->params[0].global_shape = {150, 64};
             m->params[0].split_offset = 60;
         },
         "does not fit in the logical tensor's extent 150"},
        {"a placement of no kind", [](Manifest *m) { m->params[1].placement = 9; }, "placement 9 is not"},
        {"a copy past the copies",
         [](Manifest *m) {
             m->params[1].placement = SX_PLACEMENT_REPLICATED;
             m->params[1].replica = 2;
             m->params[1].replicas = 2;
         },
         "replica 2 is outside"},
    };
}

// Each rule broken on `good`: validate() and the decoder of a file written without
// validation (at good's format) both refuse it as corrupt, naming what is wrong; a 2.0
// manifest's encoder refuses it too, with the same words.
void expect_every_rule_rejected(const Manifest &good, const std::vector<Rule> &broken) {
    assert_true(validate(good).ok());
    for (const Rule &rule : broken) {
        Manifest bad = good;
        rule.do_break(&bad);
        Status v = validate(bad);
        if (v.code() != SX_ERR_CORRUPT) print_error("rule '%s': validate gave %d\n", rule.what, v.code());
        assert_int_equal(v.code(), SX_ERR_CORRUPT);
        assert_contains(v.message(), rule.needle);

        if (good.chunks_in_files()) {
            std::string bytes = "unchanged";
            Status e = encode_manifest(bad, &bytes);
            assert_int_equal(e.code(), SX_ERR_INVALID_ARGUMENT);
            assert_string_equal(e.message().c_str(), v.message().c_str());
            assert_string_equal(bytes.c_str(), "unchanged");
        }

        // A file that breaks the rule (written without validation) does not load.
        const std::string raw = raw_encode(bad, good.format_major, good.format_minor);
        Manifest out;
        out.step = 424242;
        Status d = decode_manifest(raw.data(), raw.size(), &out);
        if (d.code() != SX_ERR_CORRUPT) print_error("rule '%s': decode gave %d\n", rule.what, d.code());
        assert_int_equal(d.code(), SX_ERR_CORRUPT);
        assert_contains(d.message(), rule.needle);
        assert_int_equal(out.step, 424242);  // untouched
    }
}

void test_every_rule_rejected_both_ways(void **) {
    std::vector<Rule> v2 = rules(), v1 = rules();
    for (Rule &r : v2_rules()) v2.push_back(r);
    for (Rule &r : chunk_rules()) v1.push_back(r);
    expect_every_rule_rejected(rich_manifest(), v2);
    expect_every_rule_rejected(rich_manifest_v1(), v1);
}

// A 1.x manifest is read (its chunks with it) but never written: this library writes 3.0.
void test_v1_is_read_not_written(void **) {
    const Manifest v1 = rich_manifest_v1();
    const Manifest d = decode(raw_encode(v1, 1, 2));
    assert_int_equal(d.format_major, 1);
    assert_int_equal(d.format_minor, 2);
    assert_false(d.chunks_in_files());
    assert_int_equal(d.params[0].tensors[0].chunks.size(), 3);
    assert_same(v1, d, true);
    std::string bytes = "unchanged";
    Status e = encode_manifest(d, &bytes);
    assert_int_equal(e.code(), SX_ERR_INVALID_ARGUMENT);
    assert_contains(e.message(), "format 1.2; this library writes only 3.0 and 4.0");
    assert_string_equal(bytes.c_str(), "unchanged");
    // Its readers never see file indexes (the decoder reads them from 2.0 on).
    Manifest with_indexes = v1;
    with_indexes.file_indexes.resize(3);
    Status v = validate(with_indexes);
    assert_int_equal(v.code(), SX_ERR_CORRUPT);
    assert_contains(v.message(), "format 1.2 lists 3 file indexes");
    // 1.0 and 1.1 manifests lack shard_size; they read as flat groups.
    const Manifest d10 = decode(raw_encode(small_manifest_v1(), 1, 0));
    assert_int_equal(d10.shard_size, 0);
    assert_int_equal(d10.params[0].tensors[0].chunks.size(), 1);
}

void test_user_blob_limit(void **) {
    Manifest m = small_manifest();
    m.user_blob.assign(kMaxUserBlobBytes, '\0');
    assert_true(validate(m).ok());
    m.user_blob.push_back('x');
    Status v = validate(m);
    assert_int_equal(v.code(), SX_ERR_CORRUPT);
    assert_contains(v.message(), "user_blob");
    std::string bytes;
    assert_int_equal(encode_manifest(m, &bytes).code(), SX_ERR_INVALID_ARGUMENT);
    const std::string raw = raw_encode(m, kFormatMajor, kFormatMinor);
    Manifest out;
    Status d = decode_manifest(raw.data(), raw.size(), &out);
    assert_int_equal(d.code(), SX_ERR_CORRUPT);
    assert_contains(d.message(), "user_blob");
}

void test_shared_data_cannot_amplify(void **) {
    // FlatBuffers lets many tables refer to one string or one vector of tables; the
    // reader bounds what it copies out by the size of the file.
    Manifest out;
    const std::string names = sx::ckpt::testing::sharing_manifest(false);
    Status s = decode_manifest(names.data(), names.size(), &out);
    assert_int_equal(s.code(), SX_ERR_CORRUPT);
    assert_contains(s.message(), "past the FlatBuffer's own size");
    const std::string chunks = sx::ckpt::testing::sharing_manifest(true);
    s = decode_manifest(chunks.data(), chunks.size(), &out);
    assert_int_equal(s.code(), SX_ERR_CORRUPT);
    assert_contains(s.message(), "fails verification");
}

void test_stored_defaults_decode_alike(void **) {
    // The library's encoder leaves default values implied; a writer may store them.
    // (Of fp32 state: written as kFp32FormatMajor.0.)
    const Manifest m = rich_manifest();
    assert_same(m, decode(raw_encode(m, kFp32FormatMajor, 0)), true);
    const Manifest empty = empty_manifest();
    assert_same(empty, decode(raw_encode(empty, kFp32FormatMajor, 0)), true);
    const Manifest v1 = rich_manifest_v1();
    assert_same(v1, decode(raw_encode(v1, 1, 2)), true);
}

const std::string kNewer = "checkpoint format 5.0 is newer than this library's 4.0";

void test_newer_major_is_a_version_error(void **) {
    const std::string raw = raw_encode(rich_manifest(), 5, 0);
    Manifest out;
    Status s = decode_manifest(raw.data(), raw.size(), &out);
    assert_int_equal(s.code(), SX_ERR_VERSION);
    assert_contains(s.message(), kNewer);
}

void test_newer_major_with_retyped_fields(void **) {
    // A later major may change every table but Manifest.format and Version: fields
    // retyped so that format 1.0's verifier rejects them still yield SX_ERR_VERSION.
    Manifest out;
    const std::string v3 = retyped_manifest(5);
    Status s = decode_manifest(v3.data(), v3.size(), &out);
    assert_int_equal(s.code(), SX_ERR_VERSION);
    assert_contains(s.message(), kNewer);
    // The same bytes stating 4.0, 3.0, 2.0 or 1.0 are corrupt: the test above means something.
    for (uint16_t major : {4, 3, 2, 1}) {
        const std::string v = retyped_manifest(major);
        s = decode_manifest(v.data(), v.size(), &out);
        assert_int_equal(s.code(), SX_ERR_CORRUPT);
        assert_contains(s.message(), "fails verification");
    }
}

void test_older_major_is_a_version_error(void **) {
    const std::string raw = raw_encode(small_manifest(), 0, 9);
    Manifest out;
    Status s = decode_manifest(raw.data(), raw.size(), &out);
    assert_int_equal(s.code(), SX_ERR_VERSION);
    assert_contains(s.message(), "0.9");
    assert_contains(s.message(), "1.x");
}

// Placement (written since 1.7): a split piece and a replicated copy round-trip, and a
// file without it (every older one) reads as whole params.
void test_placement_round_trips(void **) {
    Manifest m = rich_manifest();
    m.params[0].placement = SX_PLACEMENT_SPLIT;
    m.params[0].global_shape = {300, 64};
    m.params[0].split_dim = 0;
    m.params[0].split_offset = 200;
    m.params[1].placement = SX_PLACEMENT_REPLICATED;
    m.params[1].replica = 1;
    m.params[1].replicas = 4;
    assert_true(validate(m).ok());
    const Manifest d = decode(encode(m));
    assert_same(m, d, true);
    assert_true(d.params[0].global_shape == std::vector<int64_t>({300, 64}));
    assert_int_equal(d.params[1].replicas, 4);
    const Manifest whole = decode(encode(rich_manifest()));
    for (const ParamEntry &p : whole.params) {
        assert_int_equal(p.placement, SX_PLACEMENT_WHOLE);
        assert_true(p.global_shape.empty());
    }
}

void test_same_and_newer_minor_load(void **) {
    // (A manifest of fp32 state: 3.x; one of packed state would be 4.x alike.)
    const Manifest m = rich_manifest();
    Manifest d = decode(raw_encode(m, kFp32FormatMajor, 0, /*unknown_fields=*/true));
    assert_same(m, d, true);
    // A later minor appended fields to every table: this reader ignores them.
    d = decode(raw_encode(m, kFp32FormatMajor, 7, /*unknown_fields=*/true));
    assert_int_equal(d.format_major, kFp32FormatMajor);
    assert_int_equal(d.format_minor, 7);
    assert_same(m, d, false);
    // Encoding again writes this library's version for it, without the unknown fields.
    const Manifest again = decode(encode(d));
    assert_int_equal(again.format_major, kFp32FormatMajor);
    assert_int_equal(again.format_minor, 0);
    assert_same(m, again, true);
}

// 4.0: packed optimizer state (8-bit codes with their scales, bf16 slots, and a param of
// an 8-bit group that keeps fp32 state) round-trips, and each of its rules is enforced
// both ways; a 3.0 manifest may not hold it.
void test_packed_state(void **) {
    const Manifest packed = packed_manifest();
    const Status valid = validate(packed);
    if (!valid.ok()) print_error("the packed manifest: %s\n", valid.message().c_str());
    assert_true(valid.ok());
    const Manifest d = decode(encode(packed));
    assert_same(packed, d, true);
    assert_int_equal(d.format_major, kFormatMajor);
    assert_int_equal(d.params[0].tensors[1].dtype, kDTypeQ8);
    assert_int_equal(d.params[0].tensors[3].kind, static_cast<int>(TensorKind::kScales0));
    assert_int_equal(d.params[2].tensors[1].dtype, SX_DTYPE_BF16);
    auto tensor = [](Manifest *m, size_t p, TensorKind kind) -> Tensor & {
        for (Tensor &t : m->params[p].tensors)
            if (t.kind == kind) return t;
        return m->params[p].tensors[0];
    };
    const std::vector<Rule> broken = {
        {"8-bit codes without their scales",
         [](Manifest *m) { m->params[0].tensors.pop_back(); }, "'w' (#0): tensor exp_avg_sq holds 8-bit codes without"},
        {"scales of a slot kept in fp32",
         [](Manifest *m) { m->params[1].tensors.push_back(Tensor{TensorKind::kScales0, SX_DTYPE_F32, {}}); },
         "is no F32 scales of an 8-bit state slot"},
        {"scales in bf16",
         [&](Manifest *m) { tensor(m, 0, TensorKind::kScales0).dtype = SX_DTYPE_BF16; },
         "is no F32 scales of an 8-bit state slot"},
        {"a bf16 slot stored as fp32", [&](Manifest *m) { tensor(m, 2, TensorKind::kExpAvg).dtype = SX_DTYPE_F32; },
         "keeps bf16 state, stored as 3"},
        {"codes for a param too small for blocks",
         [&](Manifest *m) { tensor(m, 1, TensorKind::kExpAvg).dtype = kDTypeQ8; }, "keeps fp32 state, stored as 1"},
        {"param values as codes", [&](Manifest *m) { tensor(m, 0, TensorKind::kParam).dtype = kDTypeQ8; },
         "its values are stored as Q8 codes"},
    };
    expect_every_rule_rejected(packed, broken);
    // Packed state in a manifest that says 3.0 (as the seed corpus's packed-state-in-3.0).
    const std::string old = raw_encode(packed, kFp32FormatMajor, 0);
    Manifest out;
    const Status s = decode_manifest(old.data(), old.size(), &out);
    assert_int_equal(s.code(), SX_ERR_CORRUPT);
    assert_contains(s.message(), "param group 0 keeps 8-bit state, which format 3.0 cannot hold");
}

}  // namespace

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_field_by_field),
        cmocka_unit_test(test_factored_moments_round_trip),
        cmocka_unit_test(test_round_trip_defaults_and_small),
        cmocka_unit_test(test_scalars_at_every_alignment),
        cmocka_unit_test(test_layout_of_the_bytes),
        cmocka_unit_test(test_names_of_things),
        cmocka_unit_test(test_decode_from_unaligned_memory),
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_every_rule_rejected_both_ways),
        cmocka_unit_test(test_v1_is_read_not_written),
        cmocka_unit_test(test_user_blob_limit),
        cmocka_unit_test(test_shared_data_cannot_amplify),
        cmocka_unit_test(test_stored_defaults_decode_alike),
        cmocka_unit_test(test_newer_major_is_a_version_error),
        cmocka_unit_test(test_newer_major_with_retyped_fields),
        cmocka_unit_test(test_older_major_is_a_version_error),
        cmocka_unit_test(test_same_and_newer_minor_load),
        cmocka_unit_test(test_placement_round_trips),
        cmocka_unit_test(test_packed_state),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
