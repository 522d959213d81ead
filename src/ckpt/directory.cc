#include "ckpt/directory.h"

namespace sx {
namespace ckpt {

std::string shard_file_name(int rank, int world) { return format("shard-%05d-of-%05d.bin", rank, world); }

Status read_manifest(io::FileOps &ops, const std::string &dir, Manifest *out) {
    const std::string path = dir + "/" + kManifestName;
    std::string bytes;
    SX_TRY(io::read_file(ops, path, kMaxManifestBytes, &bytes));
    Status d = decode_manifest(bytes.data(), bytes.size(), out);
    if (!d.ok()) return d.prefix(path + ": ");
    return Status::Ok();
}

Status write_durable_file(io::FileOps &ops, const std::string &path, const std::string &bytes) {
    int fd = -1;
    SX_TRY(ops.open_write(path, &fd));
    Status w = ops.pwrite_all(fd, bytes.data(), bytes.size(), 0, path);
    if (w.ok()) w = ops.fsync(fd, path);
    Status c = ops.close(fd, path);
    SX_TRY(w);
    return c;
}

Status commit_checkpoint(io::FileOps &ops, const Manifest &m, const std::string &tmp_dir,
                         const std::string &final_dir, const std::string &parent) {
    std::string bytes;
    SX_TRY(encode_manifest(m, &bytes));
    SX_TRY(write_durable_file(ops, tmp_dir + "/" + kManifestName, bytes));
    SX_TRY(ops.fsync_dir(tmp_dir));
    SX_TRY(ops.rename(tmp_dir, final_dir));
    return ops.fsync_dir(parent);
}

Status read_user_blob(io::FileOps &ops, const std::string &dir, std::string *out) {
    Manifest m;
    SX_TRY(read_manifest(ops, dir, &m));
    *out = std::move(m.user_blob);
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
