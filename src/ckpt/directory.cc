#include "ckpt/directory.h"

#include <chrono>
#include <thread>

#include "io/crc32c.h"

namespace sx {
namespace ckpt {

std::string shard_file_name(int rank, int world) { return format("shard-%05d-of-%05d.bin", rank, world); }

Status check_checkpoint_name(const std::string &path, const char *use) {
    std::string p = path;
    while (p.size() > 1 && p.back() == '/') p.pop_back();
    const size_t slash = p.rfind('/');
    const std::string base = slash == std::string::npos ? p : p.substr(slash + 1);
    SX_CHECK_ARG(base != kLatestName && !is_latest_temporary_name(base),
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

Status DirectoryLock::acquire(io::FileOps &ops, const std::string &dir, bool *busy) {
    release();
    io::FileOps::LockState state = io::FileOps::LockState::kUnsupported;
    int fd = -1;
    SX_TRY(ops.lock_directory(dir, &fd, &state));
    if (busy) *busy = state == io::FileOps::LockState::kBusy;
    if (state == io::FileOps::LockState::kHeld) {
        ops_ = &ops;
        fd_ = fd;
    }
    return Status::Ok();
}

void DirectoryLock::release() {
    if (fd_ >= 0) ops_->unlock_directory(fd_);
    fd_ = -1;
    ops_ = nullptr;
}

uint64_t now_unix_ms() {
    return static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
            .count());
}

namespace {

// Whether `path` (a file, or a directory and its files) has gone unchanged for
// kUnlockedPartialQuietMs; a path whose times cannot be read counts as quiet, and
// *gone says whether it no longer exists.
bool quiet_for_long(io::FileOps &ops, const std::string &path, bool *gone) {
    uint64_t changed = 0;
    const Status s = ops.latest_change_ms(path, &changed);
    *gone = s.code() == SX_ERR_NOT_FOUND;
    return !s.ok() || now_unix_ms() >= changed + kUnlockedPartialQuietMs;
}

}  // namespace

Status clear_stale_temporary(io::FileOps &ops, const std::string &path) {
    bool gone = false;
    if (!quiet_for_long(ops, path, &gone) || gone) return Status::Ok();
    const Status s = ops.unlink(path);
    return s.code() == SX_ERR_NOT_FOUND ? Status::Ok() : s;
}

Status clear_unfinished(io::FileOps &ops, const std::string &dir, bool *removed) {
    if (removed) *removed = false;
    DirectoryLock lock;
    bool busy = false;
    Status s = lock.acquire(ops, dir, &busy);
    if (s.code() == SX_ERR_NOT_FOUND) return Status::Ok();  // removed or committed meanwhile
    SX_TRY(s);
    if (busy) return Status::Ok();  // a live process's save (or removal)
    bool gone = false;
    if (!lock.held() && (!quiet_for_long(ops, dir, &gone) || gone)) return Status::Ok();
    s = ops.remove_tree(dir);
    if (s.code() == SX_ERR_NOT_FOUND) return Status::Ok();
    SX_TRY(s);
    if (removed) *removed = true;
    return Status::Ok();
}

Status make_unfinished_directory(io::FileOps &ops, const std::string &final_dir, const std::string &tmp_dir,
                                 DirectoryLock *lock) {
    for (int attempt = 0;; ++attempt) {
        const Status made = ops.mkdir(tmp_dir);
        if (made.code() == SX_ERR_ALREADY_EXISTS)
            return SX_ERROR(SX_ERR_ALREADY_EXISTS,
                            "another save into the checkpoint directory %s is under way: its unfinished directory %s "
                            "belongs to a live process",
                            final_dir.c_str(), tmp_dir.c_str());
        SX_TRY(made);
        bool busy = false;
        const Status locked = lock->acquire(ops, tmp_dir, &busy);
        if (locked.ok() && !busy) return Status::Ok();
        if (!locked.ok() && locked.code() != SX_ERR_NOT_FOUND) {
            (void)ops.remove_tree(tmp_dir);
            return locked;
        }
        // Another process's clearing took it: busy, it is removing it now; not found, gone.
        if (attempt == 2)
            return SX_ERROR(SX_ERR_IO, "could not lock the new directory %s: other processes removed it each time",
                            tmp_dir.c_str());
        bool there = true;
        for (int wait = 0; wait < 200 && there; ++wait) {
            if (!ops.exists(tmp_dir, &there).ok()) break;
            if (there) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }
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
