// Hugging Face checkpoints and PEFT adapters, as sx writes and reads them (docs/interop.md).
//
// A model (transformers' save_pretrained): the tensors in safetensors files, one
// `model.safetensors` where they fit in max_shard_bytes, else `model-0000K-of-0000N.safetensors`
// files and `model.safetensors.index.json` ({"metadata": {"total_size": bytes},
// "weight_map": {key: file}}); every header's __metadata__ is {"format": "pt"}, which
// transformers requires. A PEFT adapter (peft's save_pretrained): `adapter_model.safetensors`
// and `adapter_config.json`.
//
// Names: the caller's map takes sx's param names to the files' keys (sx name -> key).
// Params the map does not name keep their own names as keys, or, with only_named, take
// no part. This is torch.distributed.checkpoint's LoadPlanner key remapping, as pairs.
//
// A writer makes everything in a temporary directory beside the target, fsyncs each
// file and the directory, and renames it into place (fsyncing the parent): a failure at
// any point leaves no directory under the target's name. A reader checks everything it
// can before any value moves: the files' headers, every key's file, the names, shapes
// and dtypes; then reads param by param. Neither is thread-safe; one call at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "interop/safetensors.h"
#include "io/file_ops.h"

namespace sx {
namespace interop {

constexpr const char *kModelFile = "model.safetensors";
constexpr const char *kModelIndex = "model.safetensors.index.json";
constexpr const char *kAdapterFile = "adapter_model.safetensors";
constexpr const char *kAdapterConfig = "adapter_config.json";
// transformers' default max_shard_size ("5GB").
constexpr uint64_t kDefaultMaxShardBytes = 5000000000ull;

// One param of the group, by index: its name and shape.
struct ParamEntry {
    std::string name;
    std::vector<int64_t> shape;
    uint64_t numel() const;
};

// The caller's names: (sx name, key) pairs, and whether params it does not name take part.
struct NameMap {
    std::vector<std::pair<std::string, std::string>> pairs;
    bool only_named = false;
};

// Each param's key in the files, or "" where it takes no part. Errors
// (SX_ERR_INVALID_ARGUMENT, naming them): a pair naming no param, a param named twice, an
// empty key, two params under one key, or nothing taking part.
Status resolve_keys(const std::vector<ParamEntry> &params, const NameMap &map, std::vector<std::string> *keys);

class HfWriter {
  public:
    explicit HfWriter(io::FileOps &ops) : ops_(ops) {}
    ~HfWriter();  // an export not committed: its temporary directory is removed
    HfWriter(const HfWriter &) = delete;
    HfWriter &operator=(const HfWriter &) = delete;

    // Plans the files and creates the temporary directory. keys: each param's (resolve_keys).
    // dtype: SX_DTYPE_F32, F16 or BF16. peft_config: the adapter's adapter_config.json text
    // (then one adapter_model.safetensors; max_shard_bytes is not used), or "" for a model.
    // Errors: `dir` exists (SX_ERR_ALREADY_EXISTS) or its parent does not (SX_ERR_NOT_FOUND),
    // the file operations'.
    Status plan(const std::string &dir, const std::vector<ParamEntry> &params, const std::vector<std::string> &keys,
                int32_t dtype, uint64_t max_shard_bytes, const std::string &peft_config);
    // Param p's whole values (n fp32), in index order among the planned ones: converted
    // (rounded to nearest even for 16-bit) and written to its place.
    Status write(int32_t p, const float *values, uint64_t n);
    // Every file fsynced and closed, the index or the config written, the directory
    // renamed into place and the parent fsynced.
    Status commit();

  private:
    struct Planned {
        size_t file = 0;
        StTensor tensor;
    };
    struct File {
        std::string name;
        uint64_t data_start = 0;
        int32_t last_param = -1;
    };
    Status open_file(size_t f);
    Status close_file();
    Status write_small(const std::string &name, const std::string &text);

    io::FileOps &ops_;
    std::string dir_, tmp_, peft_config_;
    int32_t dtype_ = 0;
    std::vector<File> files_;
    std::vector<Planned> planned_;  // per param (file unused where it takes no part)
    std::vector<uint8_t> taking_;
    size_t open_ = 0;
    int fd_ = -1;
    bool committed_ = false;
    std::vector<uint16_t> half_;
};

// What an import found: params of the group that have no tensor in the files (their sx
// names and the keys looked for), and the files' keys no param took.
struct KeyReport {
    int32_t loaded = 0;  // params that take a tensor
    std::vector<std::pair<std::string, std::string>> missing;  // (sx name, key)
    std::vector<std::string> unexpected;
};
// The report as bytes (every rank receives them) and back.
std::string encode_report(const KeyReport &r);
KeyReport decode_report(const std::string &bytes);

class HfReader {
  public:
    explicit HfReader(io::FileOps &ops) : ops_(ops) {}
    ~HfReader();
    HfReader(const HfReader &) = delete;
    HfReader &operator=(const HfReader &) = delete;

    // Opens `path`: a .safetensors file, an index (.json), or a directory holding
    // model.safetensors.index.json, adapter_model.safetensors or model.safetensors (looked
    // for in that order), reads every header, and matches the keys: *selected per param,
    // *report what is missing and unexpected. Missing keys fail the call (SX_ERR_NOT_FOUND)
    // unless allow_missing, unexpected ones (SX_ERR_INVALID_ARGUMENT) unless
    // allow_unexpected, naming them; a shape that differs, or a tensor of another dtype
    // than F32, F16 or BF16, fails it always (SX_ERR_INVALID_ARGUMENT, SX_ERR_UNSUPPORTED),
    // naming the param, the key and the file. A damaged file or index is SX_ERR_CORRUPT.
    Status plan(const std::string &path, const std::vector<ParamEntry> &params, const std::vector<std::string> &keys,
                bool allow_missing, bool allow_unexpected, std::vector<uint8_t> *selected, KeyReport *report);
    // Param p's whole values as fp32 (n of them), widened exactly from F16 and BF16.
    Status read(int32_t p, float *values, uint64_t n);

  private:
    struct Key {
        size_t file = 0;
        const StTensor *tensor = nullptr;
    };
    Status open_files(const std::string &path);
    Status open_index(const std::string &path);
    Status check_tensor(const ParamEntry &param, const std::string &key, const Key &k) const;

    io::FileOps &ops_;
    std::vector<StFile> files_;
    std::vector<int> fds_;
    std::vector<std::pair<std::string, Key>> keys_;  // every key, in the files' order
    std::vector<Key> of_param_;
    std::vector<char> scratch_;
};

}  // namespace interop
}  // namespace sx
