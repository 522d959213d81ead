// The index at the end of a shard file (checkpoint format 2.0, docs/format.md): the
// file's own chunk table, so that the MANIFEST stays the size of the model's description
// however many files a checkpoint has, and a loader reads the tables of the files it
// reads and no others.
//
// Layout, little-endian, starting right after the file's last chunk:
//   "SXIX", uint32 record count, then per chunk 48 bytes:
//   int32 param (index in the MANIFEST), int32 tensor kind, uint64 begin, end (elements),
//   uint64 offset, length (bytes in the file), uint32 crc32c, uint32 zero.
// The MANIFEST's FileIndex for the file holds the index's offset, length, record count
// and CRC32C, so an index is trusted only as far as the committed MANIFEST vouches for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_plan.h"
#include "core/layout.h"
#include "io/file_ops.h"

namespace sx {
namespace ckpt {

constexpr uint64_t kIndexHeaderBytes = 8;
constexpr uint64_t kIndexRecordBytes = 48;

// One chunk of a shard file, as its index holds it (and as a writing rank reports it).
struct IndexRecord {
    int32_t param = 0;
    int32_t kind = 0;
    uint64_t begin = 0, end = 0, offset = 0, length = 0;
    uint32_t crc32c = 0;
    uint32_t zero = 0;
};
static_assert(sizeof(IndexRecord) == kIndexRecordBytes, "IndexRecord is the on-disk record");

// The index bytes of `records` (in the order given: a writer lists them by offset).
std::string encode_index(const std::vector<IndexRecord> &records);

// Appends the index of `records` to the open file `fd` at byte `offset` (the end of its
// last chunk) and describes it in *out. Does not fsync. Any thread.
Status append_index(io::FileOps &ops, int fd, const std::string &path, uint64_t offset,
                    const std::vector<IndexRecord> &records, FileIndex *out);

// The elements [*begin, *end) of param `p` that file `file` holds: its part of shard
// `file` of the saving layout (empty where the shard holds none of it). 2.0 manifests.
void piece_in_file(const ParamEntry &p, uint32_t file, uint64_t *begin, uint64_t *end);

// The files (ascending) holding what shard `shard` of `layout` owns of the params the
// manifest has: manifest_index[p] is current param p's entry in `m`, or -1 (not there),
// and cuts[p] where p's piece lies in it (empty: nowhere but its own tensor). Found from
// each entry's place in the saving layout alone. 2.0 manifests.
std::vector<uint32_t> files_for_shard(const Manifest &m, const core::Layout &layout, int shard,
                                      const std::vector<int32_t> &manifest_index,
                                      const std::vector<PieceCut> &cuts = {});

// Reads the indexes of `files` (of the checkpoint in `dir`, whose MANIFEST decoded into
// *m, format 2.0) and adds their chunks to m's tensors, each tensor's sorted by element.
// Each index is checked against its FileIndex (length, count, CRC32C) and each record
// against the MANIFEST: a known param and tensor, elements inside the file's piece of the
// param, the byte length its elements take, 4 KiB-aligned offsets, the chunks in offset
// order before the index without sharing bytes, and every tensor of every param the file
// holds a piece of covered exactly. A file listed twice is read once. With `per_file`
// null the first failure ends the call (SX_ERR_CORRUPT naming the file and what is
// wrong; the file's read errors as they are) and *m is left with the chunks of the files
// read before it; otherwise (*per_file)[i] gets files[i]'s status and the call goes on,
// adding only the chunks of the files that passed. Any thread.
Status read_file_indexes(io::FileOps &ops, const std::string &dir, const std::vector<uint32_t> &files, Manifest *m,
                         std::vector<Status> *per_file = nullptr);

// Every file's index (as read_file_indexes with all files).
Status read_all_file_indexes(io::FileOps &ops, const std::string &dir, Manifest *m,
                             std::vector<Status> *per_file = nullptr);

// The chunks of file `file` out of the index bytes `data` (checked as read_file_indexes
// says), appended to *out only if every check passes. Any thread.
Status decode_index(const Manifest &m, uint32_t file, const void *data, size_t size,
                    std::vector<IndexRecord> *out);

}  // namespace ckpt
}  // namespace sx
