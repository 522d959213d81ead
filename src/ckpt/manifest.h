// The manifest in plain C++ (what the writer fills and the reader returns), and its
// encoding: a FlatBuffer (schema manifest.fbs) followed by a 16-byte trailer.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/params.h"
#include "optim/optimizer.h"

namespace sx {
namespace ckpt {

// 1.1: the stage may be 3 (format 1.0 readers refuse such a manifest as corrupt).
// 1.2: the mesh's shard_size (older readers ignore it: the files and chunks say all).
// 2.0: the chunks are in an index at the end of each shard file, not in the MANIFEST.
// 3.0: ten more optimizers and registered ones.
// 4.0: packed optimizer state (bf16 slots, 8-bit codes and their scales). A checkpoint
// without it is written as kFp32FormatMajor.0, byte for byte what 3.0 writers wrote.
constexpr uint16_t kFormatMajor = 4;  // the newest this library reads and writes
constexpr uint16_t kFormatMinor = 0;
constexpr uint16_t kFp32FormatMajor = 3;  // what a checkpoint of fp32 state only is written as
constexpr uint16_t kOldestMajor = 1;  // the oldest major this library reads
constexpr uint64_t kChunkAlignment = 4096;     // every chunk starts on a 4 KiB boundary
constexpr uint64_t kMaxManifestBytes = 1ull << 30;  // refuse larger manifests unread
constexpr uint64_t kMaxUserBlobBytes = 64ull << 20;
constexpr uint64_t kMaxFileNameBytes = 255;       // a shard file name (NAME_MAX)
constexpr uint64_t kMaxSteps = optim::kMaxSteps;  // the most steps a manifest may count
constexpr size_t kTrailerBytes = 16;               // magic "SXCT", crc32c, FlatBuffer size

// The manifest's DType of 8-bit optimizer state's codes (4.0): the value of SX_DTYPE_U8,
// the dtype sx_state_view gives them.
constexpr int32_t kDTypeQ8 = SX_DTYPE_U8;
// Elements per scale of 8-bit state (optim::kQuantBlock).
constexpr uint64_t kScaleBlock = 256;

// Bytes per element of SX_DTYPE_* and kDTypeQ8; 0 for a value that is not one.
uint64_t dtype_bytes(int32_t dtype);
// The DType a state slot of SX_STATE_* `state_dtype` is stored as (F32, BF16, Q8).
int32_t state_tensor_dtype(int32_t state_dtype);

enum class TensorKind : int8_t {
    kParam = 0,
    kExpAvg = 1,
    kExpAvgSq = 2,
    kMaxExpAvgSq = 3,
    kMomentumBuffer = 4,
    kSum = 5,
    kSquareAvg = 6,
    kGradAvg = 7,
    kExpInf = 8,
    kSlot0 = 9,  // a custom optimizer's slot k: kSlot0 + k, named by its group's slot_names
    kSlot1 = 10,
    kSlot2 = 11,
    kVariance = 12,    // Adafactor's, of a 0-D or 1-D param
    kExpAvgSlow = 13,  // AdEMAMix's slow moment
    kScales0 = 14,     // 4.0: the scales of the param's 8-bit state slot k: kScales0 + k
    kScales1 = 15,
    kScales2 = 16,
};
constexpr int kNumTensorKinds = 17;
// Whether `kind` holds scales (block space), and the state slot they belong to.
inline bool is_scales(TensorKind kind) { return kind >= TensorKind::kScales0 && kind <= TensorKind::kScales2; }
inline int scales_slot(TensorKind kind) { return static_cast<int>(kind) - static_cast<int>(TensorKind::kScales0); }
inline TensorKind scales_kind(int slot) {
    return static_cast<TensorKind>(static_cast<int>(TensorKind::kScales0) + slot);
}
// Elements of a param's index space per element of a tensor of `kind`: kScaleBlock for
// scales, 1 for every other.
inline uint64_t kind_block(TensorKind kind) { return is_scales(kind) ? kScaleBlock : 1; }
// The manifest's Optimizer value of a registered optimizer (ParamGroupEntry::optimizer_name).
constexpr int32_t kCustomOptimizer = 100;
// "", ".exp_avg", ".exp_avg_sq", ...: the suffix of the tensor's name in exports ("."
// and torch's name of the state slot it holds; "" for the param's values).
const char *tensor_suffix(TensorKind kind);
// The kind that holds the state slot torch names `slot` ("exp_avg"); false if none does.
bool tensor_kind_of(const char *slot, TensorKind *kind);
// What a param of `ndim` dimensions in a group with hyperparameters h stores: kParam,
// then one kind per state slot of its optimizer (optim::state_slot_name), in slot order.
std::vector<TensorKind> stored_kinds(const optim::Hyper &h, int ndim = -1);
// SX_ERR_UNSUPPORTED, naming the optimizer, if this format has no Optimizer value for
// h's optimizer or no TensorKind for one of its state slots (a save would lose it).
Status check_storable(const optim::Hyper &h);

struct Chunk {
    uint64_t begin = 0, end = 0;  // elements, in the param's own index space
    uint32_t file = 0;
    uint64_t offset = 0, length = 0;  // bytes
    uint32_t crc32c = 0;
};

struct Tensor {
    TensorKind kind = TensorKind::kParam;
    int32_t dtype = SX_DTYPE_F32;
    std::vector<Chunk> chunks;
};

struct ParamEntry {
    std::string name;
    std::vector<int64_t> shape;
    int32_t dtype = SX_DTYPE_F32;
    int32_t unit = 0, param_group = 0;
    bool trainable = true;
    int64_t step = 0, momentum_steps = 0;
    float mu_product = 1.0f;  // 3.0: NAdam's; 1 before (NAdam is new in 3.0)
    // 3.0: Adafactor's factored moments of a param of two or more dimensions (rows'
    // means, then columns'), whole; empty before its first update and for other params.
    std::vector<float> row_var, col_var;
    // The tensors' kinds and dtypes; their chunks as far as they are known (format 1.x:
    // all, from the MANIFEST; 2.0: those of the files whose indexes were read).
    std::vector<Tensor> tensors;
    // 2.0: where the param lay in the saving layout: its first element at unit_offset of
    // its unit, whose shards were unit_shard_numel elements each; shard file q holds (at
    // most) its elements [q * S - unit_offset, (q + 1) * S - unit_offset). 0 in 1.x.
    uint64_t unit_offset = 0, unit_shard_numel = 0;
    // Written since 1.7 (0 before: whole): the param's placement (sx_param_desc_t,
    // SX_PLACEMENT_*) and its fields.
    int32_t placement = 0, split_dim = 0, replica = 0, replicas = 0;
    std::vector<int64_t> global_shape;
    int64_t split_offset = 0;
    // Product of the extents (1 for a scalar); meaningful once validate() accepted it.
    uint64_t numel() const;
    // Elements of its tensor of `kind`: numel(), or its blocks for scales.
    uint64_t numel(TensorKind kind) const { return numel() / kind_block(kind); }
};

// A param group: its optimizer and every hyperparameter of optim/optimizer.h's table
// (the table's default where a manifest does not hold it).
struct ParamGroupEntry {
    int32_t optimizer = SX_OPTIM_ADAMW;  // SX_OPTIM_*, or kCustomOptimizer
#define SX_ENTRY_MEMBER(name, type, dflt, key, rule) type name = dflt;
    SX_HYPERPARAMETERS(SX_ENTRY_MEMBER)
#undef SX_ENTRY_MEMBER
    // kCustomOptimizer: the registered optimizer's name, its slots' names (tensor kind
    // kSlot0 + k is slot_names[k]) and its own hyperparameters by name.
    std::string optimizer_name;
    std::vector<std::string> slot_names;
    std::vector<std::string> custom_names;
    std::vector<double> custom_values;
    // Steps the group took (ParamGroup::steps): pytorch-optimizer's per-group `step`.
    int64_t steps = 0;
};

// The name of a param's tensor of `kind` in group g ("exp_avg"; "param" for kParam): a
// custom optimizer's slot names come from g.
std::string tensor_name(const ParamGroupEntry &g, TensorKind kind);
// The kinds a param of group g stores: as stored_kinds(hyper_of(g)), and for a custom
// optimizer (registered here or not) kParam then kSlot0 + k for each of its slots.
std::vector<TensorKind> stored_kinds(const ParamGroupEntry &g, int ndim = -1);

// The group's optimizer for messages, with what decides its state slots: "SGD",
// "Adam with amsgrad", "RMSprop with momentum, centered".
std::string optimizer_text(const ParamGroupEntry &g);

// A param group's optimizer and hyperparameters as the manifest holds them, and back. A
// custom optimizer's entry names it; hyper_of finds it among those registered in this
// process (by name: ids differ between processes) and takes its own hyperparameters by
// name (kind 0, which validate refuses, if none is registered under that name).
ParamGroupEntry param_group_entry(const optim::Hyper &h);
optim::Hyper hyper_of(const ParamGroupEntry &e);

// 2.0: where a shard file's index is (its last `length` bytes, at `offset`), its CRC32C,
// and how many chunk records it holds.
struct FileIndex {
    uint64_t offset = 0, length = 0;
    uint32_t crc32c = 0, chunks = 0;
};

struct LossScalerEntry {
    double scale = 1.0;
    int64_t growth_tracker = 0, growth_interval = 0;
    double growth_factor = 0, backoff_factor = 0;
};

struct Manifest {
    // The version decode_manifest read. encode_manifest writes written_format_major(m).0,
    // whatever these hold; a manifest made here starts as what one of fp32 state is.
    uint16_t format_major = kFp32FormatMajor, format_minor = 0;
    uint32_t library_version = 0;
    uint64_t step = 0;
    int32_t world_size = 1, stage = 2, alignment = 64;
    // 1.2: the saving group's ranks per shard group (its files: one per shard); 0 (every
    // manifest before 1.2) = world_size, a flat group. Informational, as the stage is.
    int32_t shard_size = 0;
    std::vector<ParamGroupEntry> param_groups;
    std::vector<ParamEntry> params;
    LossScalerEntry loss_scaler;
    std::string user_blob;
    std::vector<std::string> files;
    uint64_t created_unix_ms = 0;
    // 2.0: one per file (file q holds shard q of the saving layout); empty in 1.x.
    std::vector<FileIndex> file_indexes;
    // Whether the chunks are in the files' indexes (2.0) rather than in the MANIFEST.
    bool chunks_in_files() const { return format_major >= 2; }
};

// The format a manifest is written as: kFormatMajor.0 if a param group keeps packed
// state (state_dtype not SX_STATE_FP32), else kFp32FormatMajor.0.
uint16_t written_format_major(const Manifest &m);

// Serialises (FlatBuffer + trailer) into *bytes (replaced), as format
// written_format_major(m).0 (so `m` must be a 2.0-style manifest: no chunks, one
// FileIndex per file; see validate()). SX_ERR_INVALID_ARGUMENT if the manifest is not self-consistent
// or would exceed kMaxManifestBytes; *bytes is then unchanged. Deterministic: equal
// manifests give equal bytes. Any thread.
Status encode_manifest(const Manifest &m, std::string *bytes);

// Verifies and decodes, trusting nothing: size limits, the trailer's magic, length
// and CRC32C, the file identifier, the FlatBuffers Verifier (depth and table limits
// set tight), the format version (a newer major: SX_ERR_VERSION naming both), then
// validate(). Errors: SX_ERR_CORRUPT saying what is wrong, SX_ERR_VERSION (also for a
// major older than any this library reads); *out is changed only on success. `data`
// is borrowed for the call and needs no particular alignment. Any thread.
Status decode_manifest(const void *data, size_t size, Manifest *out);

// Structural checks shared by both directions. Format 1.x (m.format_major 1): the
// chunks are in the manifest and every tensor's cover [0, numel) exactly once. 2.0: no
// chunk in the manifest, one FileIndex per file, as many files as shards (shard_size, or
// world_size), and every param within the files' range (unit_shard_numel >= 1,
// unit_offset + numel <= files * unit_shard_numel). Always: names unique and non-empty, shapes
// positive, dtypes and kinds known, param_group indices valid, each tensor's chunks
// sorted and covering [0, numel) exactly once, lengths = elements * element size,
// offsets 4 KiB-aligned, file indices valid. Also: names as sx_add_param accepts them,
// hyperparameters as sx_add_param_group accepts them, optimizer state kinds that
// belong to the param's optimizer, momentum_steps in [0, step], each param's step at
// most the manifest's step, which is at most kMaxSteps, chunks of one file
// not overlapping, shard file names plain (no '/', not "." or "..") and unique,
// world_size >= 1, shard_size 0 or a divisor of world_size, stage 1 to 3, alignment a power of two in [64, 2^20], a positive
// finite loss scale, user_blob at most kMaxUserBlobBytes. SX_ERR_CORRUPT naming the
// param (and tensor and chunk), the param group, the file or the field. Any thread.
Status validate(const Manifest &m);
// A param entry's placement as sx_add_param takes it (whole where the file predates it).
core::Placement entry_placement(const ParamEntry &p);

}  // namespace ckpt
}  // namespace sx
