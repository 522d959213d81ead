// Every stored tensor of a checkpoint, whole, read straight from its shard files by the
// chunks of its MANIFEST and indexes: what tests compare checkpoints by, byte for byte.
// Include it after sx_cmocka.h (it asserts).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <map>
#include <string>
#include <utility>

#include "ckpt/directory.h"
#include "ckpt/manifest.h"
#include "ckpt/shard_index.h"
#include "io/file_ops.h"

namespace sxtest {

// By "param/kind" (the TensorKind's number): the tensor's dtype and its bytes.
using StoredTensors = std::map<std::string, std::pair<int32_t, std::string>>;

inline StoredTensors stored_tensors(const std::string &dir, sx::ckpt::Manifest *out = nullptr) {
    auto ops = sx::io::posix_file_ops();
    sx::ckpt::Manifest m;
    assert_true(sx::ckpt::read_manifest(*ops, dir, &m).ok());
    assert_true(sx::ckpt::read_all_file_indexes(*ops, dir, &m).ok());
    StoredTensors all;
    for (const sx::ckpt::ParamEntry &p : m.params)
        for (const sx::ckpt::Tensor &t : p.tensors) {
            std::string bytes;
            uint64_t next = 0;
            for (const sx::ckpt::Chunk &c : t.chunks) {
                assert_int_equal(c.begin, next);
                next = c.end;
                std::string part(c.length, '\0');
                const int fd = open((dir + "/" + m.files[c.file]).c_str(), O_RDONLY);
                assert_true(fd >= 0);
                assert_int_equal(pread(fd, &part[0], part.size(), static_cast<off_t>(c.offset)),
                                 static_cast<ssize_t>(part.size()));
                close(fd);
                bytes += part;
            }
            assert_int_equal(next, p.numel(t.kind));
            all[p.name + "/" + std::to_string(static_cast<int>(t.kind))] = {t.dtype, bytes};
        }
    if (out) *out = m;
    return all;
}

// Asserts that the checkpoints in a and b store the same tensors, byte for byte.
inline void expect_same_tensors(const std::string &a, const std::string &b) {
    const StoredTensors ta = stored_tensors(a), tb = stored_tensors(b);
    assert_int_equal(ta.size(), tb.size());
    for (const auto &t : ta) {
        const auto it = tb.find(t.first);
        assert_true(it != tb.end());
        if (it->second != t.second)
            print_error("%s differs between %s and %s\n", t.first.c_str(), a.c_str(), b.c_str());
        assert_true(it->second == t.second);
    }
}

}  // namespace sxtest
