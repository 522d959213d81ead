#include "ckpt/shard_index.h"

#include <algorithm>
#include <cstring>

#include "io/crc32c.h"

namespace sx {
namespace ckpt {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the index is written in the host's byte order");

constexpr char kIndexMagic[4] = {'S', 'X', 'I', 'X'};

// The tensor of param `p` of kind `kind`, or -1.
int tensor_of(const ParamEntry &p, int32_t kind) {
    for (size_t t = 0; t < p.tensors.size(); ++t)
        if (static_cast<int32_t>(p.tensors[t].kind) == kind) return static_cast<int>(t);
    return -1;
}

}  // namespace

std::string encode_index(const std::vector<IndexRecord> &records) {
    std::string out(kIndexHeaderBytes + records.size() * kIndexRecordBytes, '\0');
    const uint32_t count = static_cast<uint32_t>(records.size());
    std::memcpy(&out[0], kIndexMagic, 4);
    std::memcpy(&out[4], &count, 4);
    if (!records.empty()) std::memcpy(&out[kIndexHeaderBytes], records.data(), records.size() * kIndexRecordBytes);
    return out;
}

Status append_index(io::FileOps &ops, int fd, const std::string &path, uint64_t offset,
                    const std::vector<IndexRecord> &records, FileIndex *out) {
    SX_CHECK(records.size() <= UINT32_MAX, SX_ERR_INTERNAL, "%s: %zu chunks in one file", path.c_str(),
             records.size());
    const std::string bytes = encode_index(records);
    SX_TRY(ops.pwrite_all(fd, bytes.data(), bytes.size(), offset, path));
    out->offset = offset;
    out->length = bytes.size();
    out->crc32c = io::crc32c(bytes.data(), bytes.size());
    out->chunks = static_cast<uint32_t>(records.size());
    return Status::Ok();
}

void piece_in_file(const ParamEntry &p, uint32_t file, uint64_t *begin, uint64_t *end) {
    // validate() made unit_offset + numel <= files * unit_shard_numel, without overflow.
    const uint64_t s = p.unit_shard_numel, first = file * s, last = first + s, off = p.unit_offset;
    const uint64_t b = std::max(first, off), e = std::min(last, off + p.numel());
    *begin = b < e ? b - off : 0;
    *end = b < e ? e - off : 0;
}

std::vector<uint32_t> files_for_shard(const Manifest &m, const core::Layout &layout, int shard,
                                      const std::vector<int32_t> &manifest_index,
                                      const std::vector<PieceCut> &cuts) {
    std::vector<bool> needed(m.files.size(), false);
    for (size_t p = 0; p < manifest_index.size(); ++p) {
        if (manifest_index[p] < 0) continue;
        const core::ShardPiece piece = layout.piece(static_cast<int32_t>(p), shard);
        if (piece.begin == piece.end) continue;
        // File q holds the entry's elements [q * S - unit_offset, (q + 1) * S - unit_offset).
        // Through a cut, the saved elements from the part's first to its last (a range
        // the part's runs lie within).
        const ParamEntry &e = m.params[manifest_index[p]];
        const PieceCut cut = cuts.empty() ? PieceCut() : cuts[p];
        const uint64_t first = (e.unit_offset + cut.at(piece.begin)) / e.unit_shard_numel;
        const uint64_t last = (e.unit_offset + cut.at(piece.end - 1)) / e.unit_shard_numel;
        for (uint64_t f = first; f <= last && f < needed.size(); ++f) needed[f] = true;
    }
    std::vector<uint32_t> files;
    for (uint32_t f = 0; f < needed.size(); ++f)
        if (needed[f]) files.push_back(f);
    return files;
}

Status decode_index(const Manifest &m, uint32_t file, const void *data, size_t size, std::vector<IndexRecord> *out) {
    SX_CHECK(m.chunks_in_files() && file < m.file_indexes.size(), SX_ERR_INTERNAL,
             "no index is listed for file #%u", file);
    const FileIndex &fi = m.file_indexes[file];
    const char *bytes = static_cast<const char *>(data);
    SX_CHECK(size == fi.length, SX_ERR_CORRUPT, "its index is %zu bytes; the MANIFEST says %llu", size,
             static_cast<unsigned long long>(fi.length));
    const uint32_t crc = io::crc32c(bytes, size);
    SX_CHECK(crc == fi.crc32c, SX_ERR_CORRUPT, "its index fails its CRC32C check (0x%08x; the MANIFEST says 0x%08x)",
             crc, fi.crc32c);
    uint32_t count = 0;
    if (size >= kIndexHeaderBytes) std::memcpy(&count, bytes + 4, 4);
    SX_CHECK(size >= kIndexHeaderBytes && std::memcmp(bytes, kIndexMagic, 4) == 0 && count == fi.chunks &&
                 size == kIndexHeaderBytes + uint64_t{count} * kIndexRecordBytes,
             SX_ERR_CORRUPT, "its index does not begin with \"SXIX\" and the MANIFEST's %u records",
             fi.chunks);

    // Per (param, tensor): the next element the file's chunks must begin at; the end of
    // the param's piece in this file. Only params with a piece here take part.
    std::vector<size_t> first_tensor(m.params.size() + 1, 0);
    for (size_t p = 0; p < m.params.size(); ++p) first_tensor[p + 1] = first_tensor[p] + m.params[p].tensors.size();
    // Scales are in block space: validate() made every file boundary inside a param of
    // 8-bit state a block boundary.
    std::vector<uint64_t> next(first_tensor.back()), piece_end(first_tensor.back());
    for (size_t p = 0; p < m.params.size(); ++p) {
        uint64_t b = 0, e = 0;
        piece_in_file(m.params[p], file, &b, &e);
        for (size_t t = first_tensor[p]; t < first_tensor[p + 1]; ++t) {
            const uint64_t block = kind_block(m.params[p].tensors[t - first_tensor[p]].kind);
            next[t] = b / block;
            piece_end[t] = e / block;
        }
    }

    std::vector<IndexRecord> records(count);
    if (count) std::memcpy(records.data(), bytes + kIndexHeaderBytes, uint64_t{count} * kIndexRecordBytes);
    uint64_t bytes_end = 0;  // the records so far take the file's bytes before this
    for (uint32_t i = 0; i < count; ++i) {
        const IndexRecord &r = records[i];
        SX_CHECK(r.param >= 0 && static_cast<size_t>(r.param) < m.params.size(), SX_ERR_CORRUPT,
                 "index record %u names param #%d; the MANIFEST has %zu", i, r.param, m.params.size());
        const ParamEntry &p = m.params[r.param];
        const int t = tensor_of(p, r.kind);
        SX_CHECK(t >= 0 && r.zero == 0, SX_ERR_CORRUPT,
                 "index record %u: param '%s' has no tensor of kind %d in the MANIFEST", i, p.name.c_str(), r.kind);
        uint64_t &at = next[first_tensor[r.param] + t];
        const uint64_t end = piece_end[first_tensor[r.param] + t];
        SX_CHECK(r.begin == at && r.end > r.begin && r.end <= end, SX_ERR_CORRUPT,
                 "index record %u: param '%s'%s elements [%llu, %llu); this file's chunks of it must go on from "
                 "element %llu to at most %llu, in order",
                 i, p.name.c_str(), tensor_suffix(p.tensors[t].kind), static_cast<unsigned long long>(r.begin),
                 static_cast<unsigned long long>(r.end), static_cast<unsigned long long>(at),
                 static_cast<unsigned long long>(end));
        at = r.end;
        const uint64_t elem = dtype_bytes(p.tensors[t].dtype);
        SX_CHECK(r.length == (r.end - r.begin) * elem, SX_ERR_CORRUPT,
                 "index record %u: %llu bytes for %llu elements of %llu bytes", i,
                 static_cast<unsigned long long>(r.length), static_cast<unsigned long long>(r.end - r.begin),
                 static_cast<unsigned long long>(elem));
        SX_CHECK(r.offset % kChunkAlignment == 0 && r.offset >= bytes_end && r.length <= fi.offset &&
                     r.offset <= fi.offset - r.length,
                 SX_ERR_CORRUPT,
                 "index record %u: bytes [%llu, +%llu) are not 4 KiB-aligned after the previous chunk's end "
                 "(%llu) and before the index (%llu)",
                 i, static_cast<unsigned long long>(r.offset), static_cast<unsigned long long>(r.length),
                 static_cast<unsigned long long>(bytes_end), static_cast<unsigned long long>(fi.offset));
        bytes_end = r.offset + r.length;
    }
    for (size_t p = 0; p < m.params.size(); ++p)
        for (size_t t = first_tensor[p]; t < first_tensor[p + 1]; ++t)
            SX_CHECK(next[t] == piece_end[t], SX_ERR_CORRUPT,
                     "its chunks of param '%s'%s end at element %llu; the file holds it up to %llu",
                     m.params[p].name.c_str(), tensor_suffix(m.params[p].tensors[t - first_tensor[p]].kind),
                     static_cast<unsigned long long>(next[t]), static_cast<unsigned long long>(piece_end[t]));
    out->insert(out->end(), records.begin(), records.end());
    return Status::Ok();
}

namespace {

// File `file`'s index, read and decoded.
Status read_index(io::FileOps &ops, const std::string &dir, const Manifest &m, uint32_t file,
                  std::vector<IndexRecord> *out) {
    SX_CHECK(file < m.files.size(), SX_ERR_INTERNAL, "file #%u of %zu", file, m.files.size());
    const std::string path = dir + "/" + m.files[file];
    const FileIndex &fi = m.file_indexes[file];
    std::string bytes(static_cast<size_t>(fi.length), '\0');
    int fd = -1;
    SX_TRY(ops.open_read(path, &fd));
    Status s = ops.pread_all(fd, &bytes[0], bytes.size(), fi.offset, path);
    ops.close(fd, path);
    if (s.code() == SX_ERR_CORRUPT)
        return SX_ERROR(SX_ERR_CORRUPT, "%s: the file ends before its index does (truncated)", path.c_str());
    SX_TRY(s);
    s = decode_index(m, file, bytes.data(), bytes.size(), out);
    if (!s.ok()) return s.prefix(path + ": ");
    return Status::Ok();
}

}  // namespace

Status read_file_indexes(io::FileOps &ops, const std::string &dir, const std::vector<uint32_t> &files, Manifest *m,
                         std::vector<Status> *per_file) {
    SX_CHECK(m->chunks_in_files(), SX_ERR_INTERNAL, "a format %u manifest holds its chunks itself", m->format_major);
    if (per_file) per_file->assign(files.size(), Status::Ok());
    std::vector<bool> seen(m->files.size(), false);
    std::vector<bool> touched(m->params.size(), false);
    Status first;
    for (size_t i = 0; i < files.size(); ++i) {
        const uint32_t f = files[i];
        if (f < seen.size() && seen[f]) continue;
        std::vector<IndexRecord> records;
        Status s = read_index(ops, dir, *m, f, &records);
        if (!s.ok()) {
            if (!per_file) {
                first = s;
                break;
            }
            (*per_file)[i] = s;
            continue;
        }
        seen[f] = true;
        for (const IndexRecord &r : records) {
            ParamEntry &p = m->params[r.param];
            Chunk c;
            c.begin = r.begin, c.end = r.end, c.file = f, c.offset = r.offset, c.length = r.length;
            c.crc32c = r.crc32c;
            p.tensors[tensor_of(p, r.kind)].chunks.push_back(c);
            touched[r.param] = true;
        }
    }
    for (size_t p = 0; p < m->params.size(); ++p)
        if (touched[p])
            for (Tensor &t : m->params[p].tensors)
                std::sort(t.chunks.begin(), t.chunks.end(), [](const Chunk &a, const Chunk &b) { return a.begin < b.begin; });
    return first;
}

Status read_all_file_indexes(io::FileOps &ops, const std::string &dir, Manifest *m, std::vector<Status> *per_file) {
    std::vector<uint32_t> files(m->files.size());
    for (size_t f = 0; f < files.size(); ++f) files[f] = static_cast<uint32_t>(f);
    return read_file_indexes(ops, dir, files, m, per_file);
}

}  // namespace ckpt
}  // namespace sx
