// The safetensors format (https://github.com/huggingface/safetensors, "Format"), as
// sx writes and reads it (sxckpt, and Hugging Face checkpoints: interop/hf_files.h):
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
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "io/file_ops.h"

namespace sx {
namespace interop {

// safetensors' reference reader refuses larger headers (MAX_HEADER_SIZE).
constexpr uint64_t kMaxSafetensorsHeaderBytes = 100000000;
constexpr const char *kMetadataKey = "__metadata__";

struct StTensor {
    std::string name;
    int32_t dtype = SX_DTYPE_F32;  // SX_DTYPE_F32, F16, BF16, U8 (bytes), or 0: another (read with any_dtype)
    std::string dtype_text;        // as the file names it ("F32", "I64"...); what a writer writes for dtype 0
    uint64_t elem_bytes = 4;       // bytes per element
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

// A safetensors file opened for reading: its header, checked.
struct StFile {
    std::string path;
    uint64_t data_start = 0;  // 8 + N
    std::vector<StTensor> tensors;  // in the order of their data
    std::unordered_map<std::string, size_t> index;  // name -> position in `tensors`

    const StTensor *find(const std::string &name) const;
};

// safetensors' name of a dtype: "F32", "F16", "BF16", "U8" (SX_DTYPE_U8), else "dtype N".
std::string st_dtype_name(int32_t dtype);
// Bytes per element of SX_DTYPE_F32 (4), F16 and BF16 (2), U8 (1).
uint64_t st_dtype_bytes(int32_t dtype);
// "[300, 17]"; "[]" for a scalar.
std::string shape_text(const std::vector<int64_t> &shape);
// s with control bytes (and DEL) as \xNN, for messages.
std::string printable(const std::string &s);

// Reads and checks the header of `path`: the length field and the file's size, JSON
// (parse_json's rules: no duplicate names), every entry exactly {dtype, shape,
// data_offsets}, dtypes F32, F16, BF16 or U8 (others are refused, naming the tensor),
// extents >= 0, each tensor's bytes = its element count x element size, and the
// tensors' bytes back to back from 0 to the end of the file (so a truncated file is
// caught here). __metadata__, if there, must be an object of strings; it is not kept.
// With any_dtype, tensors of the format's other dtypes (I64, BOOL, F64...) are kept too,
// with dtype 0 and their element size (a Hugging Face checkpoint's buffers may be such);
// read_f32 refuses them.
// Errors: SX_ERR_NOT_FOUND / SX_ERR_IO from the file, SX_ERR_CORRUPT for a file that is
// not a well-formed safetensors file, SX_ERR_UNSUPPORTED for another dtype, each
// prefixed with the path and naming the tensor.
Status read_safetensors(io::FileOps &ops, const std::string &path, StFile *out, bool any_dtype = false);

// Reads elements [first, first + n) of tensor `t` of the file open as `fd` into `dst`
// as they are stored (n x the dtype's size bytes). SX_ERR_CORRUPT if the file ends early.
Status read_raw(io::FileOps &ops, int fd, const StFile &file, const StTensor &t, uint64_t first, uint64_t n,
                void *dst);

// Reads elements [first, first + n) of tensor `t` of the file open as `fd` into `dst`
// as fp32, widening F16 and BF16 exactly (SX_ERR_INVALID_ARGUMENT for U8 and others). `scratch` holds the 16-bit bytes meanwhile.
// SX_ERR_CORRUPT if the file ends early (it changed since it was read).
Status read_f32(io::FileOps &ops, int fd, const StFile &file, const StTensor &t, uint64_t first, uint64_t n,
                float *dst, std::vector<char> *scratch);

}  // namespace interop
}  // namespace sx
