// sxckpt verify DIR: the MANIFEST decodes (its own CRC32C and structure), every shard
// file is there with the bytes its chunks need, and every chunk's bytes match their
// CRC32C. Goes on past damage, naming every broken file and chunk; one buffer of at
// most kPieceBytes whatever the checkpoint's size.
#include <cinttypes>
#include <cstdio>

#include "checkpoint_dir.h"
#include "commands.h"

namespace sx {
namespace tool {

namespace {

struct Tally {
    size_t chunks = 0, broken_chunks = 0, broken_files = 0;
    uint64_t bytes = 0;  // tensor bytes read and found intact
};

// Checks one shard file and its chunks, printing a line for each thing broken.
void verify_file(io::FileOps &ops, const CheckpointDir &c, uint32_t f, const std::vector<ChunkRef> &chunks,
                 std::vector<char> *buffer, Tally *tally) {
    const ckpt::Manifest &m = c.manifest;
    const std::string name = printable(m.files[f]);
    const std::string path = c.file_path(f);
    const uint64_t needed = c.bytes_needed(f, bytes_needed(chunks));
    // From format 2.0 the MANIFEST counts a file's chunks, whether its index reads or not.
    const size_t count = m.chunks_in_files() ? m.file_indexes[f].chunks : chunks.size();
    tally->chunks += count;
    int fd = -1;
    Status s = ops.open_read(path, &fd);
    uint64_t size = 0;
    if (s.ok()) s = ops.file_size(fd, &size, path);
    if (!s.ok()) {
        std::printf("BROKEN %s: %s (its %zu chunks are lost)\n", name.c_str(),
                    s.code() == SX_ERR_NOT_FOUND ? "missing" : s.message().c_str(), count);
        tally->broken_files++;
        tally->broken_chunks += count;
        if (fd >= 0) ops.close(fd, path);
        return;
    }
    if (size < needed)
        std::printf("BROKEN %s: %" PRIu64 " bytes, but its chunks need %" PRIu64 " (truncated)\n", name.c_str(),
                    size, needed);
    else if (size > needed)
        std::printf("note: %s has %" PRIu64 " bytes after its last chunk or index (the writer leaves none)\n",
                    name.c_str(), size - needed);
    if (size < needed || !c.indexes[f].ok()) tally->broken_files++;
    if (!c.indexes[f].ok()) {
        // Its chunks are unknown: the MANIFEST vouches for the index, and only the index
        // for them.
        std::printf("BROKEN %s: %s (its %zu chunks are lost)\n", name.c_str(), c.indexes[f].message().c_str(),
                    count);
        tally->broken_chunks += count;
        ops.close(fd, path);
        return;
    }
    const auto ignore = [](const char *, size_t, uint64_t) { return Status::Ok(); };
    for (const ChunkRef &ref : chunks) {
        const ckpt::Chunk &ch = *ref.chunk;
        Status cs = ch.offset + ch.length > size
                        ? SX_ERROR(SX_ERR_CORRUPT, "the file ends before the chunk does (truncated)")
                        : read_chunk(ops, fd, path, ch, buffer, ignore);
        if (cs.ok()) {
            tally->bytes += ch.length;
            continue;
        }
        tally->broken_chunks++;
        std::printf("BROKEN %s at byte %" PRIu64 " (%" PRIu64 " bytes): %s: %s\n", name.c_str(), ch.offset, ch.length,
                    describe_chunk(m, ref).c_str(), cs.message().c_str());
    }
    ops.close(fd, path);
}

}  // namespace

int verify_command(const std::vector<std::string> &args) {
    std::vector<std::string> dirs;
    for (const std::string &a : args) {
        if (is_help(a)) {
            std::fputs(kUsage, stdout);
            return kExitOk;
        }
        if (a.size() > 1 && a[0] == '-') return usage_error("verify: unknown option '" + a + "'");
        dirs.push_back(a);
    }
    if (dirs.size() != 1) return usage_error("verify takes one checkpoint directory");
    auto ops = io::posix_file_ops();
    CheckpointDir c;
    Status s = open_checkpoint(*ops, dirs[0], &c);
    if (s.code() == SX_ERR_CORRUPT) {
        // A MANIFEST that does not decode is the checkpoint being broken: part of the
        // report, in the library's words.
        std::printf("BROKEN %s\n", s.message().c_str());
        std::printf("FAILED: %s cannot be loaded\n", printable(dirs[0]).c_str());
        return kExitFailed;
    }
    if (!s.ok()) return failure(s);  // not a checkpoint, unreadable, or a newer format
    const ckpt::Manifest &m = c.manifest;
    const auto by_file = chunks_by_file(m);
    std::printf("checking %s: format %u.%u, step %" PRIu64 ", %zu params, %zu files\n", printable(c.path).c_str(),
                m.format_major, m.format_minor, m.step, m.params.size(), m.files.size());
    std::vector<char> buffer(piece_buffer_bytes(m));
    Tally tally;
    for (uint32_t f = 0; f < m.files.size(); ++f) verify_file(*ops, c, f, by_file[f], &buffer, &tally);
    if (tally.broken_chunks == 0 && tally.broken_files == 0) {
        std::printf("OK: MANIFEST, %zu files, %zu chunks, %s of tensor data intact\n", m.files.size(), tally.chunks,
                    bytes_text(tally.bytes).c_str());
        return kExitOk;
    }
    std::printf("FAILED: %zu of %zu chunks broken, %zu of %zu files broken\n", tally.broken_chunks, tally.chunks,
                tally.broken_files, m.files.size());
    return kExitFailed;
}

}  // namespace tool
}  // namespace sx
