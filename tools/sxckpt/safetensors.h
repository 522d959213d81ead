// The safetensors format (https://github.com/huggingface/safetensors, "Format"), as
// sxckpt writes it:
//
//   8 bytes   N, little-endian uint64
//   N bytes   JSON: {"__metadata__": {str: str}, NAME: {"dtype": "F32", "shape": [...],
//             "data_offsets": [begin, end]}, ...}, padded with spaces (sxckpt pads to a
//             multiple of 8)
//   the data  every tensor's bytes, little-endian, row-major, at its data_offsets
//             (relative to the end of the header), back to back
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"

namespace sx {
namespace tool {

// safetensors' reference reader refuses larger headers (MAX_HEADER_SIZE).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100000000;
constexpr const char *kMetadataKey = "__metadata__";

struct StTensor {
    std::string name;
    int32_t dtype = SX_DTYPE_F32;  // SX_DTYPE_F32, F16 or BF16
    std::vector<int64_t> shape;    // [] for a scalar
    uint64_t begin = 0, end = 0;   // data_offsets: bytes, relative to the data's start
    uint64_t numel() const;
};

// The header of a safetensors file that sxckpt writes: `metadata` (key, value) in order,
// then the tensors in order. Padded with spaces to a multiple of 8 bytes; *out is the 8
// length bytes and the header. SX_ERR_INVALID_ARGUMENT if it would exceed
// kMaxSafetensorsHeaderBytes.
Status safetensors_header(const std::vector<std::pair<std::string, std::string>> &metadata,
                          const std::vector<StTensor> &tensors, std::string *out);

}  // namespace tool
}  // namespace sx
