// A FileOps for tests: passes calls to another FileOps, counts them by kind, and fails
// the chosen one. "Crash" mode also fails every call after it, as if the process had
// died there (what was done before stays on disk, nothing after happens).
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>

#include "io/file_ops.h"

namespace sx {
namespace io {

// kOpen: open_write and open_read. kStat: file_size, exists and is_directory. kAny (last)
// stands for every kind.
enum class OpKind { kOpen, kWrite, kRead, kFsync, kClose, kMkdir, kRename, kFsyncDir, kUnlink, kRemove, kList, kStat, kAny };

// Thread-safe. With calls on several threads, "the n-th call" and "after it" follow
// the order in which calls reach the fault check; a call already past it completes.
class FaultFileOps : public FileOps {
  public:
    explicit FaultFileOps(std::shared_ptr<FileOps> inner);
    // Fails the n-th call (1-based) of `kind` (kAny: of any kind) from now on with
    // SX_ERR_IO; with crash, every call after it fails too. n = 0 disarms. Every arm()
    // (n = 0 included) ends an earlier crash and clears fired().
    void arm(OpKind kind, int64_t n, bool crash);
    // With torn writes on, a failing pwrite_all first writes the first half of its bytes
    // (what a crash in the middle of a large write leaves). Off by default.
    void set_torn_writes(bool torn);
    // Calls of `kind` made since construction (kAny: all), failed ones included.
    int64_t count(OpKind kind) const;
    // Whether the armed call has failed since the last arm().
    bool fired() const;

    // Every FileOps method: counts the call, then fails it (SX_ERR_IO, "injected ...")
    // if it is the armed one or comes after a crash, else forwards it. An injected
    // close still closes the descriptor (a failed close releases it on Linux, and a
    // crashed process's descriptors are closed by the kernel), so tests leak none.
    Status open_write(const std::string &path, int *fd) override;
    Status open_read(const std::string &path, int *fd) override;
    Status open_read_named(const std::string &path, int *fd) override;
    Status pwrite_all(int fd, const void *data, size_t n, uint64_t offset, const std::string &path) override;
    Status pread_all(int fd, void *data, size_t n, uint64_t offset, const std::string &path) override;
    Status file_size(int fd, uint64_t *size, const std::string &path) override;
    Status fsync(int fd, const std::string &path) override;
    Status close(int fd, const std::string &path) override;
    Status mkdir(const std::string &path) override;
    Status rename(const std::string &from, const std::string &to) override;
    Status fsync_dir(const std::string &path) override;
    Status unlink(const std::string &path) override;
    Status remove_tree(const std::string &path) override;
    Status list_dir(const std::string &path, std::vector<std::string> *names) override;
    Status exists(const std::string &path, bool *exists) override;
    Status is_directory(const std::string &path, bool *is_dir) override;
    // Forwarded, neither counted nor failed: a lock changes nothing on disk, and fault
    // tests number the calls that do.
    Status lock_directory(const std::string &path, int *fd, LockState *state) override {
        return inner_->lock_directory(path, fd, state);
    }
    void unlock_directory(int fd) override { inner_->unlock_directory(fd); }
    Status latest_change_ms(const std::string &path, uint64_t *ms) override {
        return inner_->latest_change_ms(path, ms);
    }

  private:
    static constexpr size_t kKinds = static_cast<size_t>(OpKind::kAny) + 1;
    // Counts the call; an error if it is to fail, else ok.
    Status check(OpKind kind, const char *op, const std::string &path);

    std::shared_ptr<FileOps> inner_;
    std::array<std::atomic<int64_t>, kKinds> counts_{};
    std::atomic<bool> torn_writes_{false};
    // The armed call, as the ordinal (1-based, since construction) of the call of
    // armed_kind_ that fails; 0 when disarmed.
    mutable std::mutex mu_;
    OpKind armed_kind_ = OpKind::kAny;
    int64_t armed_at_ = 0;
    bool crash_ = false;
    bool fired_ = false;
    bool crashed_ = false;  // fired_ in crash mode: every later call fails
};

}  // namespace io
}  // namespace sx
