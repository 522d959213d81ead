// Files for tests: a fresh temporary directory, its removal (through the project's own
// io::FileOps, which never follows links), and whole-file reads and writes.
#pragma once

#include <stdlib.h>

#include <cstdio>
#include <string>

#include "ckpt/directory.h"
#include "io/file_ops.h"

namespace sxtest {

// A new directory /tmp/sx-<tag>-XXXXXX, or "" if none could be made.
inline std::string make_tmpdir(const std::string &tag) {
    std::string tmpl = "/tmp/sx-" + tag + "-XXXXXX";
    return mkdtemp(&tmpl[0]) ? tmpl : std::string();
}

inline void remove_tree(const std::string &path) {
    const sx::Status s = sx::io::posix_file_ops()->remove_tree(path);
    if (!s.ok()) std::fprintf(stderr, "could not remove %s: %s\n", path.c_str(), s.message().c_str());
}

// The whole file, or "" if it cannot be opened.
inline std::string read_file(const std::string &path) {
    FILE *f = std::fopen(path.c_str(), "rb");
    if (!f) return "";
    std::string out;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
    std::fclose(f);
    return out;
}

// Replaces the file's contents; false if it cannot be written.
inline bool write_file(const std::string &path, const std::string &bytes) {
    FILE *f = std::fopen(path.c_str(), "wb");
    if (!f) return false;
    const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
    return std::fclose(f) == 0 && ok;
}

// The bytes of tensor data in file `file` of the checkpoint in `dir`: where its index
// begins (format 2.0), which follows its last chunk; 0 if the MANIFEST cannot be read.
inline uint64_t shard_data_bytes(const std::string &dir, uint32_t file) {
    sx::ckpt::Manifest m;
    if (!sx::ckpt::read_manifest(*sx::io::posix_file_ops(), dir, &m).ok() || file >= m.file_indexes.size()) return 0;
    return m.file_indexes[file].offset;
}

}  // namespace sxtest
