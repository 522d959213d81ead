// The file operations checkpoints make, behind one seam: tests substitute a FileOps
// that fails or "crashes" at a chosen call (write, fsync, rename, ...), and check that
// nothing torn is ever left that loads.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace sx {
namespace io {

// Every method returns SX_ERR_IO naming the operation, the path and strerror(errno),
// except: a path that does not exist (ENOENT) is SX_ERR_NOT_FOUND, mkdir of an existing
// path is SX_ERR_ALREADY_EXISTS, and pread_all past the end is SX_ERR_CORRUPT.
// `path` arguments of the fd methods only name the file in messages. Thread-safe.
class FileOps {
  public:
    virtual ~FileOps() = default;
    // Opens for writing: created (mode 0644) or truncated. *fd is set only on success.
    virtual Status open_write(const std::string &path, int *fd) = 0;
    // Opens a file sx itself wrote (a checkpoint's MANIFEST and shard files, `latest`)
    // for reading: only a regular file, and never through a symbolic link as its last
    // component (a link in a checkpoint could make a load read any file on the machine).
    // A FIFO, device, socket or directory is SX_ERR_CORRUPT at once (without blocking: a
    // FIFO would wait for a writer forever), a link SX_ERR_CORRUPT saying so.
    virtual Status open_read(const std::string &path, int *fd) = 0;
    // Opens a file the user named for reading (sxckpt import's inputs): as open_read, but
    // a symbolic link is followed. The default is open_read.
    virtual Status open_read_named(const std::string &path, int *fd) { return open_read(path, fd); }
    // Writes all n bytes at offset (retrying short writes and EINTR).
    virtual Status pwrite_all(int fd, const void *data, size_t n, uint64_t offset,
                              const std::string &path) = 0;
    // Reads exactly n bytes at offset; a short file is SX_ERR_CORRUPT ("truncated").
    virtual Status pread_all(int fd, void *data, size_t n, uint64_t offset, const std::string &path) = 0;
    virtual Status file_size(int fd, uint64_t *size, const std::string &path) = 0;
    // A failed fsync is final: the kernel may already have dropped the dirty pages, so a
    // second fsync succeeding proves nothing. Callers give up on the file.
    virtual Status fsync(int fd, const std::string &path) = 0;
    // A hint: asks the kernel to start writing bytes [offset, offset + n) of the file
    // to the device now, without waiting, so that the device works while the caller
    // goes on writing or computing and a later fsync has less left to wait for. It
    // promises nothing: durability comes from fsync alone, which also reports any
    // error of this writeback. The default does nothing.
    virtual void start_writeback(int fd, uint64_t offset, uint64_t n) {
        (void)fd, (void)offset, (void)n;
    }
    // The fd is released even when an error is returned (as Linux's close does).
    virtual Status close(int fd, const std::string &path) = 0;
    virtual Status mkdir(const std::string &path) = 0;       // SX_ERR_ALREADY_EXISTS if it exists
    // Atomically replaces `to` if it exists (rename(2)).
    virtual Status rename(const std::string &from, const std::string &to) = 0;
    // Makes the directory's entries (creations, renames, unlinks) durable.
    virtual Status fsync_dir(const std::string &path) = 0;
    virtual Status unlink(const std::string &path) = 0;
    // A directory and everything below; symbolic links are removed, never followed. A
    // path that is a file or a link is removed itself.
    virtual Status remove_tree(const std::string &path) = 0;
    // The names in a directory, without "." and "..", sorted.
    virtual Status list_dir(const std::string &path, std::vector<std::string> *names) = 0;
    // Whether an entry of any type is at path (a symbolic link is not followed).
    virtual Status exists(const std::string &path, bool *exists) = 0;
    // Whether path is a directory, a symbolic link to one included: *is_dir false where
    // nothing is there (or a component of the path is not a directory) or something else is.
    virtual Status is_directory(const std::string &path, bool *is_dir) = 0;

    // An advisory lock on a directory (flock(2), exclusive), held until unlock_directory
    // or until the process ends, whichever comes first: what tells one process's
    // unfinished save from another's that died. On success *state says how it went:
    // kHeld (*fd is the lock's descriptor), kBusy (another descriptor, in this process
    // or another, holds it; *fd = -1) or kUnsupported (the filesystem keeps no such
    // locks, as NFS for directories; *fd = -1). A path that does not exist, or that no
    // longer names the directory the lock was taken on (removed or renamed meanwhile),
    // is SX_ERR_NOT_FOUND. The defaults: kUnsupported, and nothing to release.
    enum class LockState { kHeld, kBusy, kUnsupported };
    virtual Status lock_directory(const std::string &path, int *fd, LockState *state) {
        (void)path;
        *fd = -1;
        *state = LockState::kUnsupported;
        return Status::Ok();
    }
    virtual void unlock_directory(int fd) { (void)fd; }
    // The latest modification time (milliseconds since the Unix epoch) of a file, or of a
    // directory and the entries directly in it (a save's shard files, while they are
    // written); a symbolic link's own.
    // The default: SX_ERR_UNSUPPORTED.
    virtual Status latest_change_ms(const std::string &path, uint64_t *ms) {
        (void)ms;
        return Status(SX_ERR_UNSUPPORTED, "no modification times for '" + path + "'", __FILE__, __LINE__);
    }
};

// The real thing (POSIX).
std::shared_ptr<FileOps> posix_file_ops();

// Writes a whole small file atomically as dir/name: dir/name.tmp.PID.N (a name of the
// call's own) is written, fsynced, closed, renamed over dir/name, and dir is fsynced.
// Readers see the old file or the new one, never a part. A failure before the rename
// leaves dir/name as it was; a failure of the final directory fsync leaves the new file
// in place, perhaps not yet durable. On failure the temporary file is unlinked (unless
// that fails too, as after a crash). Writers of one dir/name in several threads or
// processes at once never mix their bytes: the last rename wins.
Status write_file_atomic(FileOps &ops, const std::string &dir, const std::string &name,
                         const void *data, size_t n);
// Reads a whole small file (at most max_bytes, else SX_ERR_CORRUPT), opened with
// open_read, or with `named` by open_read_named. *out is replaced only on success.
Status read_file(FileOps &ops, const std::string &path, size_t max_bytes, std::string *out, bool named = false);

}  // namespace io
}  // namespace sx
