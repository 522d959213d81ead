#include "checkpoint_dir.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <ctime>

#include "ckpt/directory.h"
#include "ckpt/shard_index.h"
#include "io/crc32c.h"

namespace sx {
namespace tool {

namespace {

// Why DIR has no MANIFEST, when the directory itself can tell.
std::string missing_manifest_hint(io::FileOps &ops, const std::string &dir) {
    std::string trimmed = dir;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    if (ckpt::is_partial_name(trimmed))
        return "; it is a save that never committed (only a directory without the " +
               std::string(ckpt::kPartialSuffix) + " suffix holds a checkpoint)";
    std::string latest;
    if (io::read_file(ops, dir + "/latest", 4096, &latest).ok()) {
        while (!latest.empty() && (latest.back() == '\n' || latest.back() == '\r')) latest.pop_back();
        if (!latest.empty()) return "; its `latest` names '" + printable(latest) + "': try " + dir + "/" + latest;
    }
    return "; is it an sx checkpoint directory?";
}

}  // namespace

Status open_checkpoint(io::FileOps &ops, const std::string &dir, CheckpointDir *out) {
    // An unfinished save's directory may hold a MANIFEST (a save killed between writing
    // it and the rename): it is never a checkpoint, so it is not read as one.
    SX_TRY(ckpt::check_checkpoint_name(dir, "sxckpt"));
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
        const int e = errno;
        return SX_ERROR(e == ENOENT ? SX_ERR_NOT_FOUND : SX_ERR_IO, "%s: %s", dir.c_str(), std::strerror(e));
    }
    SX_CHECK(S_ISDIR(st.st_mode), SX_ERR_INVALID_ARGUMENT,
             "%s is not a directory (a checkpoint is a directory holding MANIFEST and shard files)",
             dir.c_str());
    CheckpointDir c;
    c.path = dir;
    std::string bytes;
    Status s = io::read_file(ops, c.manifest_path(), ckpt::kMaxManifestBytes, &bytes);
    if (s.code() == SX_ERR_NOT_FOUND)
        return SX_ERROR(SX_ERR_NOT_FOUND, "%s has no MANIFEST%s", dir.c_str(),
                        missing_manifest_hint(ops, dir).c_str());
    SX_TRY(s);
    s = ckpt::decode_manifest(bytes.data(), bytes.size(), &c.manifest);
    if (!s.ok()) return s.prefix(c.manifest_path() + ": ");
    c.manifest_bytes = bytes.size();
    c.indexes.assign(c.manifest.files.size(), Status::Ok());
    if (c.manifest.chunks_in_files()) ckpt::read_all_file_indexes(ops, c.path, &c.manifest, &c.indexes);
    *out = std::move(c);
    return Status::Ok();
}

Status CheckpointDir::indexes_ok() const {
    for (const Status &s : indexes)
        if (!s.ok()) return s;
    return Status::Ok();
}

uint64_t CheckpointDir::bytes_needed(uint32_t file, uint64_t chunks_end) const {
    if (!manifest.chunks_in_files()) return chunks_end;
    const ckpt::FileIndex &fi = manifest.file_indexes[file];
    return std::max(chunks_end, fi.offset + fi.length);
}

std::vector<std::vector<ChunkRef>> chunks_by_file(const ckpt::Manifest &m) {
    std::vector<std::vector<ChunkRef>> out(m.files.size());
    for (size_t p = 0; p < m.params.size(); ++p) {
        const ckpt::ParamEntry &e = m.params[p];
        for (size_t t = 0; t < e.tensors.size(); ++t)
            for (const ckpt::Chunk &c : e.tensors[t].chunks)
                out[c.file].push_back({static_cast<int32_t>(p), static_cast<int32_t>(t), &c});
    }
    for (auto &chunks : out)
        std::sort(chunks.begin(), chunks.end(),
                  [](const ChunkRef &a, const ChunkRef &b) { return a.chunk->offset < b.chunk->offset; });
    return out;
}

size_t piece_buffer_bytes(const ckpt::Manifest &m) {
    uint64_t largest = 1;
    for (const ckpt::ParamEntry &p : m.params)
        for (const ckpt::Tensor &t : p.tensors)
            for (const ckpt::Chunk &c : t.chunks) largest = std::max(largest, c.length);
    return static_cast<size_t>(std::min<uint64_t>(largest, kPieceBytes));
}

uint64_t bytes_needed(const std::vector<ChunkRef> &chunks) {
    uint64_t end = 0;
    for (const ChunkRef &r : chunks) end = std::max(end, r.chunk->offset + r.chunk->length);
    return end;
}

std::string describe_chunk(const ckpt::Manifest &m, const ChunkRef &ref) {
    const ckpt::ParamEntry &p = m.params[ref.param];
    return format("param '%s' %s, elements [%" PRIu64 ", %" PRIu64 ")", printable(p.name).c_str(),
                  kind_name(p.tensors[ref.tensor].kind).c_str(), ref.chunk->begin, ref.chunk->end);
}

Status read_chunk(io::FileOps &ops, int fd, const std::string &path, const ckpt::Chunk &c,
                  std::vector<char> *buffer,
                  const std::function<Status(const char *, size_t, uint64_t)> &sink) {
    SX_CHECK(!buffer->empty(), SX_ERR_INTERNAL, "read_chunk needs a buffer");
    uint32_t crc = 0;
    for (uint64_t done = 0; done < c.length;) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(buffer->size(), c.length - done));
        Status s = ops.pread_all(fd, buffer->data(), n, c.offset + done, path);
        if (s.code() == SX_ERR_CORRUPT)
            return SX_ERROR(SX_ERR_CORRUPT, "the file ends before the chunk does (truncated)");
        SX_TRY(s);
        crc = io::crc32c_extend(crc, buffer->data(), n);
        SX_TRY(sink(buffer->data(), n, done));
        done += n;
    }
    SX_CHECK(crc == c.crc32c, SX_ERR_CORRUPT, "CRC32C of its bytes is 0x%08x, the manifest says 0x%08x", crc,
             c.crc32c);
    return Status::Ok();
}

std::string dtype_name(int32_t dtype) {
    switch (dtype) {
        case SX_DTYPE_F32: return "F32";
        case SX_DTYPE_F16: return "F16";
        case SX_DTYPE_BF16: return "BF16";
        case ckpt::kDTypeQ8: return "Q8";
        default: return format("dtype %d", dtype);
    }
}

std::string kind_name(ckpt::TensorKind kind) {
    return kind == ckpt::TensorKind::kParam ? "param" : ckpt::tensor_suffix(kind) + 1;
}

std::string library_version_text(uint32_t v) {
    return format("%u.%u.%u", v / 10000, v / 100 % 100, v % 100);
}

std::string utc_time_text(uint64_t unix_ms) {
    const time_t seconds = static_cast<time_t>(unix_ms / 1000);
    struct tm tm;
    if (gmtime_r(&seconds, &tm) == nullptr) return format("%" PRIu64 " ms after the epoch", unix_ms);
    char buf[64];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    return format("%s.%03uZ", buf, static_cast<unsigned>(unix_ms % 1000));
}

std::string bytes_text(uint64_t n) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    std::string s = format("%" PRIu64 " bytes", n);
    if (n < 1024) return s;
    double v = static_cast<double>(n) / 1024;
    int u = 0;
    while (v >= 1024 && u < 4) v /= 1024, ++u;
    return s + format(" (%.1f %s)", v, units[u]);
}

}  // namespace tool
}  // namespace sx
