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

Status read_user_blob(io::FileOps &ops, const std::string &dir, std::string *out) {
    Manifest m;
    SX_TRY(read_manifest(ops, dir, &m));
    *out = std::move(m.user_blob);
    return Status::Ok();
}

}  // namespace ckpt
}  // namespace sx
