// A checkpoint directory as the tool sees it: the MANIFEST decoded (and so verified)
// by the library's own decoder, the chunks of each shard file, and reading a chunk in
// bounded pieces while checking its CRC32C.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "ckpt/manifest.h"
#include "interop/json.h"
#include "interop/json_value.h"
#include "interop/safetensors.h"
#include "io/file_ops.h"

namespace sx {
namespace tool {

// JSON and safetensors are libsx's (src/interop), shared with sx_export_hf and sx_import_hf.
using namespace interop;  // NOLINT(google-build-using-namespace): the tool's own names stay distinct

// The most bytes read at once: one piece of a chunk. The writer never makes a chunk
// larger (ckpt::kMaxChunkBytes); a larger one from another writer is read in pieces,
// so memory stays bounded whatever the checkpoint holds.
constexpr size_t kPieceBytes = 4u << 20;

struct CheckpointDir {
    std::string path;          // as given on the command line
    ckpt::Manifest manifest;
    uint64_t manifest_bytes = 0;

    // Format 2.0: each file's index read (its chunks are then in `manifest`), or why not:
    // one status per file (all ok for a 1.x checkpoint, whose MANIFEST lists the chunks).
    std::vector<Status> indexes;

    std::string manifest_path() const { return path + "/MANIFEST"; }
    std::string file_path(uint32_t file) const { return path + "/" + manifest.files[file]; }
    // The first file whose index could not be read, or ok.
    Status indexes_ok() const;
    // The bytes file `file` must hold: the end of its last chunk, or of its index (2.0).
    uint64_t bytes_needed(uint32_t file, uint64_t chunks_end) const;
};

// Reads DIR/MANIFEST and decodes it, which verifies its checksum and structure, and
// (format 2.0) every shard file's index, each file's outcome in out->indexes.
// Errors say what the user got wrong: DIR missing or not a directory; DIR without a
// MANIFEST (pointing to the checkpoint named by DIR/latest when DIR is the parent, and
// saying so when DIR is a save that never committed); otherwise the library's message,
// prefixed with the MANIFEST's path. Any thread.
Status open_checkpoint(io::FileOps &ops, const std::string &dir, CheckpointDir *out);

// One chunk with the tensor it belongs to.
struct ChunkRef {
    int32_t param = 0;
    int32_t tensor = 0;  // index into the param's tensors
    const ckpt::Chunk *chunk = nullptr;
};

// For each shard file (index as in manifest.files), its chunks in offset order.
std::vector<std::vector<ChunkRef>> chunks_by_file(const ckpt::Manifest &m);

// The size of the one buffer chunks are read through: the largest chunk, at most
// kPieceBytes.
size_t piece_buffer_bytes(const ckpt::Manifest &m);

// The bytes a file must hold for its chunks: the end of its last one (0 for none).
uint64_t bytes_needed(const std::vector<ChunkRef> &chunks);

// "param 'NAME' exp_avg, elements [B, E)" for messages (the name made printable).
std::string describe_chunk(const ckpt::Manifest &m, const ChunkRef &ref);

// Reads chunk `c` from the open file `fd` in pieces of at most buffer->size() bytes
// (not empty; see piece_buffer_bytes), hands each to sink(data, n,
// byte offset in the chunk), and checks the CRC32C over the whole chunk. Errors:
// SX_ERR_CORRUPT when the file ends before the chunk does, or when the CRC32C differs
// (naming both values); the file's read errors and the sink's errors as they are.
// The sink may already have seen every piece of a chunk whose CRC32C then fails.
Status read_chunk(io::FileOps &ops, int fd, const std::string &path, const ckpt::Chunk &c,
                  std::vector<char> *buffer,
                  const std::function<Status(const char *, size_t, uint64_t)> &sink);

// --- text ---
// "F32", "F16", "BF16" (safetensors' names for them), "Q8" (8-bit state's codes), or "dtype N".
std::string dtype_name(int32_t dtype);
// "SGD", "Adam", "AdamW", or "optimizer N".
using optim::optimizer_name;
// "param", "exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer".
std::string kind_name(ckpt::TensorKind kind);
// MAJOR*10000 + MINOR*100 + PATCH as "MAJOR.MINOR.PATCH".
std::string library_version_text(uint32_t v);
// Milliseconds since the Unix epoch as "2025-01-31T12:34:56.789Z".
std::string utc_time_text(uint64_t unix_ms);
// "88361 bytes (86.3 KiB)".
std::string bytes_text(uint64_t n);

}  // namespace tool
}  // namespace sx
