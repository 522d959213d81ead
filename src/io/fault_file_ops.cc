#include "io/fault_file_ops.h"

#include <utility>

namespace sx {
namespace io {

namespace {

const char *kind_name(OpKind kind) {
    switch (kind) {
    case OpKind::kOpen: return "open";
    case OpKind::kWrite: return "write";
    case OpKind::kRead: return "read";
    case OpKind::kFsync: return "fsync";
    case OpKind::kClose: return "close";
    case OpKind::kMkdir: return "mkdir";
    case OpKind::kRename: return "rename";
    case OpKind::kFsyncDir: return "fsync_dir";
    case OpKind::kUnlink: return "unlink";
    case OpKind::kRemove: return "remove_tree";
    case OpKind::kList: return "list_dir";
    case OpKind::kStat: return "stat";
    case OpKind::kAny: return "any";
    }
    return "?";
}

}  // namespace

FaultFileOps::FaultFileOps(std::shared_ptr<FileOps> inner) : inner_(std::move(inner)) {}

void FaultFileOps::arm(OpKind kind, int64_t n, bool crash) {
    std::lock_guard<std::mutex> lock(mu_);
    armed_kind_ = kind;
    // Relative to the calls made so far: "the n-th call from now on".
    armed_at_ = n > 0 ? counts_[static_cast<size_t>(kind)].load() + n : 0;
    crash_ = crash;
    fired_ = false;
    crashed_ = false;
}

void FaultFileOps::set_torn_writes(bool torn) { torn_writes_.store(torn); }

int64_t FaultFileOps::count(OpKind kind) const { return counts_[static_cast<size_t>(kind)].load(); }

bool FaultFileOps::fired() const {
    std::lock_guard<std::mutex> lock(mu_);
    return fired_;
}

Status FaultFileOps::check(OpKind kind, const char *op, const std::string &path) {
    // Each call gets a unique ordinal per kind and overall, so exactly one call matches
    // armed_at_ however the calls interleave.
    const int64_t nth_of_kind = counts_[static_cast<size_t>(kind)].fetch_add(1) + 1;
    const int64_t nth_of_any = counts_[static_cast<size_t>(OpKind::kAny)].fetch_add(1) + 1;
    std::lock_guard<std::mutex> lock(mu_);
    if (crashed_)
        return SX_ERROR(SX_ERR_IO, "%s '%s': injected fault: after the crash at the armed %s call", op, path.c_str(),
                        kind_name(armed_kind_));
    if (armed_at_ == 0) return Status::Ok();
    const int64_t nth = armed_kind_ == OpKind::kAny ? nth_of_any : nth_of_kind;
    if ((armed_kind_ != OpKind::kAny && armed_kind_ != kind) || nth != armed_at_) return Status::Ok();
    fired_ = true;
    crashed_ = crash_;
    armed_at_ = 0;  // it fails once; a crash fails the rest through crashed_
    return SX_ERROR(SX_ERR_IO, "%s '%s': injected fault (%s call %lld)", op, path.c_str(), kind_name(kind),
                    static_cast<long long>(nth_of_kind));
}

Status FaultFileOps::open_write(const std::string &path, int *fd) {
    SX_TRY(check(OpKind::kOpen, "open for writing", path));
    return inner_->open_write(path, fd);
}

Status FaultFileOps::open_read(const std::string &path, int *fd) {
    SX_TRY(check(OpKind::kOpen, "open for reading", path));
    return inner_->open_read(path, fd);
}

Status FaultFileOps::open_read_named(const std::string &path, int *fd) {
    SX_TRY(check(OpKind::kOpen, "open for reading", path));
    return inner_->open_read_named(path, fd);
}

Status FaultFileOps::pwrite_all(int fd, const void *data, size_t n, uint64_t offset, const std::string &path) {
    Status st = check(OpKind::kWrite, "write", path);
    if (!st.ok() && torn_writes_.load() && n / 2 > 0) {
        // What reached the disk before the failure; its own result does not matter.
        inner_->pwrite_all(fd, data, n / 2, offset, path);
    }
    SX_TRY(st);
    return inner_->pwrite_all(fd, data, n, offset, path);
}

Status FaultFileOps::pread_all(int fd, void *data, size_t n, uint64_t offset, const std::string &path) {
    SX_TRY(check(OpKind::kRead, "read", path));
    return inner_->pread_all(fd, data, n, offset, path);
}

Status FaultFileOps::file_size(int fd, uint64_t *size, const std::string &path) {
    SX_TRY(check(OpKind::kStat, "stat", path));
    return inner_->file_size(fd, size, path);
}

Status FaultFileOps::fsync(int fd, const std::string &path) {
    SX_TRY(check(OpKind::kFsync, "fsync", path));
    return inner_->fsync(fd, path);
}

Status FaultFileOps::close(int fd, const std::string &path) {
    Status st = check(OpKind::kClose, "close", path);
    Status closed = inner_->close(fd, path);  // always: see the header
    SX_TRY(st);
    return closed;
}

Status FaultFileOps::mkdir(const std::string &path) {
    SX_TRY(check(OpKind::kMkdir, "mkdir", path));
    return inner_->mkdir(path);
}

Status FaultFileOps::rename(const std::string &from, const std::string &to) {
    SX_TRY(check(OpKind::kRename, "rename", from + "' to '" + to));
    return inner_->rename(from, to);
}

Status FaultFileOps::fsync_dir(const std::string &path) {
    SX_TRY(check(OpKind::kFsyncDir, "fsync directory", path));
    return inner_->fsync_dir(path);
}

Status FaultFileOps::unlink(const std::string &path) {
    SX_TRY(check(OpKind::kUnlink, "unlink", path));
    return inner_->unlink(path);
}

Status FaultFileOps::remove_tree(const std::string &path) {
    SX_TRY(check(OpKind::kRemove, "remove", path));
    return inner_->remove_tree(path);
}

Status FaultFileOps::list_dir(const std::string &path, std::vector<std::string> *names) {
    SX_TRY(check(OpKind::kList, "list directory", path));
    return inner_->list_dir(path, names);
}

Status FaultFileOps::exists(const std::string &path, bool *exists) {
    SX_TRY(check(OpKind::kStat, "stat", path));
    return inner_->exists(path, exists);
}

Status FaultFileOps::is_directory(const std::string &path, bool *is_dir) {
    SX_TRY(check(OpKind::kStat, "stat", path));
    return inner_->is_directory(path, is_dir);
}

}  // namespace io
}  // namespace sx
