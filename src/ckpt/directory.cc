#include "ckpt/directory.h"

#include "io/crc32c.h"

namespace sx {
namespace ckpt {

std::string shard_file_name(int rank, int world) { return format("shard-%05d-of-%05d.bin", rank, world); }

Status check_checkpoint_name(const std::string &path, const char *use) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.rfind('/');
    const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
    const std::string latest_tmp = std::string(kLatestName) + ".tmp";
    SX_CHECK_ARG(base != kLatestName && base != latest_tmp,
                 "the checkpoint path '%s' given to %s ends in '%s', the name sx keeps for the file naming the newest "
                 "checkpoint (it holds that checkpoint's name)",
                 path.c_str(), use, base.c_str());
    SX_CHECK_ARG(!is_partial_name(base),
                 "the checkpoint path '%s' given to %s ends in '%s', the suffix of a save that has not committed (or "
                 "was cut short): such a directory never holds a checkpoint, and the next save in its parent removes it",
                 path.c_str(), use, kPartialSuffix);
    return Status::Ok();
}

Status read_manifest(io::FileOps &ops, const std::string &dir, Manifest *out, uint32_t *file_crc) {
    const std::string path = dir + "/" + kManifestName;
    std::string bytes;
    SX_TRY(io::read_file(ops, path, kMaxManifestBytes, &bytes));
    Status d = decode_manifest(bytes.data(), bytes.size(), out);
    if (!d.ok()) return d.prefix(path + ": ");
    if (file_crc) *file_crc = io::crc32c(bytes.data(), bytes.size());
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
    SX_TRY(check_checkpoint_name(dir, "sx_read_user_blob"));
    Manifest m;
    SX_TRY(read_manifest(ops, dir, &m));
    *out = std::move(m.user_blob);
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
