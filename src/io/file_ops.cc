// The POSIX FileOps, and the whole-file helpers built on any FileOps.
//
// Every descriptor is opened O_CLOEXEC (a process the trainer forks must not keep
// checkpoint files open). System calls interrupted by a signal (EINTR) are restarted,
// except close(): Linux releases the descriptor before it can be interrupted, and a
// retry could close a descriptor another thread has just been given.
#include "io/file_ops.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>

namespace sx {
namespace io {

namespace {

// strerror is not required to be thread-safe; glibc's strerror_r (the GNU variant that
// g++'s _GNU_SOURCE selects) returns a pointer to static text or into buf.
std::string errno_text(int err) {
    char buf[128];
    return std::string(strerror_r(err, buf, sizeof buf));
}

sx_status_t errno_code(int err) { return err == ENOENT ? SX_ERR_NOT_FOUND : SX_ERR_IO; }

}  // namespace

// A Status for a failed system call: "OP 'PATH': strerror". A macro so that the Status
// records the line of the call that failed.
#define SX_IO_ERROR(err, op, path)                                                                  \
    ::sx::Status(errno_code(err), ::sx::format("%s '%s': %s", (op), (path).c_str(), errno_text(err).c_str()), \
                 __FILE__, __LINE__)

namespace {

// One pread/pwrite call moves at most this much: Linux caps a call at 0x7ffff000 bytes
// anyway, and a bound keeps the size within ssize_t everywhere.
constexpr size_t kMaxIoPerCall = size_t{1} << 30;

// The last byte offset + n must fit off_t.
bool range_fits(uint64_t offset, size_t n) {
    const uint64_t max_off = static_cast<uint64_t>(INT64_MAX);
    return offset <= max_off && static_cast<uint64_t>(n) <= max_off - offset;
}

// stat(2) of path (follow) or lstat(2) (a symbolic link itself): *found false where nothing
// is there, or where a component of the path is a file (ENOTDIR: nothing can be below it).
Status stat_path(const std::string &path, bool follow, struct stat *st, bool *found) {
    if ((follow ? ::stat(path.c_str(), st) : ::lstat(path.c_str(), st)) == 0) {
        *found = true;
        return Status::Ok();
    }
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) {
        *found = false;
        return Status::Ok();
    }
    return SX_IO_ERROR(err, "stat", path);
}

class PosixFileOps final : public FileOps {
  public:
    Status open_write(const std::string &path, int *fd) override {
        return open_path(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, "open for writing", fd);
    }

    Status open_read(const std::string &path, int *fd) override { return open_regular(path, O_NOFOLLOW, fd); }

    Status open_read_named(const std::string &path, int *fd) override { return open_regular(path, 0, fd); }

    Status pwrite_all(int fd, const void *data, size_t n, uint64_t offset, const std::string &path) override {
        SX_CHECK_ARG(range_fits(offset, n), "write to '%s': %zu bytes at offset %llu pass the largest file offset",
                     path.c_str(), n, static_cast<unsigned long long>(offset));
        const char *p = static_cast<const char *>(data);
        size_t done = 0;
        while (done < n) {
            const size_t want = std::min(n - done, kMaxIoPerCall);
            const ssize_t rc = ::pwrite(fd, p + done, want, static_cast<off_t>(offset + done));
            if (rc < 0) {
                if (errno == EINTR) continue;
                const int err = errno;
                return SX_IO_ERROR(err, "write", path);
            }
            // pwrite returns 0 for a non-empty request only on a file that cannot grow;
            // retrying would spin, so it is reported as "no space".
            if (rc == 0) return SX_IO_ERROR(ENOSPC, "write", path);
            done += static_cast<size_t>(rc);
        }
        return Status::Ok();
    }

    Status pread_all(int fd, void *data, size_t n, uint64_t offset, const std::string &path) override {
        SX_CHECK_ARG(range_fits(offset, n), "read from '%s': %zu bytes at offset %llu pass the largest file offset",
                     path.c_str(), n, static_cast<unsigned long long>(offset));
        char *p = static_cast<char *>(data);
        size_t done = 0;
        while (done < n) {
            const size_t want = std::min(n - done, kMaxIoPerCall);
            const ssize_t rc = ::pread(fd, p + done, want, static_cast<off_t>(offset + done));
            if (rc < 0) {
                if (errno == EINTR) continue;
                const int err = errno;
                return SX_IO_ERROR(err, "read", path);
            }
            if (rc == 0)
                return SX_ERROR(SX_ERR_CORRUPT,
                                "read '%s': truncated: wanted %zu bytes at offset %llu, the file ends after %llu",
                                path.c_str(), n, static_cast<unsigned long long>(offset),
                                static_cast<unsigned long long>(offset + done));
            done += static_cast<size_t>(rc);
        }
        return Status::Ok();
    }

    Status file_size(int fd, uint64_t *size, const std::string &path) override {
        struct stat st;
        if (::fstat(fd, &st) != 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "stat", path);
        }
        *size = static_cast<uint64_t>(st.st_size);
        return Status::Ok();
    }

    Status fsync(int fd, const std::string &path) override {
        int rc;
        do {
            rc = ::fsync(fd);
        } while (rc != 0 && errno == EINTR);
        if (rc != 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "fsync", path);
        }
        return Status::Ok();
    }

    void start_writeback(int fd, uint64_t offset, uint64_t n) override {
#if defined(__linux__)
        // SYNC_FILE_RANGE_WRITE alone only submits the dirty pages of the range for
        // writeback and returns (RocksDB's bytes_per_sync, PostgreSQL's
        // checkpoint_flush_after). Errors are left to fsync, which sees them too.
        if (range_fits(offset, static_cast<size_t>(n)))
            (void)::sync_file_range(fd, static_cast<off64_t>(offset), static_cast<off64_t>(n), SYNC_FILE_RANGE_WRITE);
#else
        (void)fd, (void)offset, (void)n;
#endif
    }

    Status close(int fd, const std::string &path) override {
        // EINTR: the descriptor is released already (see the top of the file), and the
        // data's fate is what fsync reported; nothing more to learn.
        if (::close(fd) != 0 && errno != EINTR) {
            const int err = errno;
            return SX_IO_ERROR(err, "close", path);
        }
        return Status::Ok();
    }

    Status mkdir(const std::string &path) override {
        if (::mkdir(path.c_str(), 0755) != 0) {
            const int err = errno;
            if (err == EEXIST) return SX_ERROR(SX_ERR_ALREADY_EXISTS, "mkdir '%s': it exists already", path.c_str());
            return SX_IO_ERROR(err, "mkdir", path);
        }
        return Status::Ok();
    }

    Status rename(const std::string &from, const std::string &to) override {
        if (::rename(from.c_str(), to.c_str()) != 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "rename", from + "' to '" + to);
        }
        return Status::Ok();
    }

    Status fsync_dir(const std::string &path) override {
        int fd = -1;
        SX_TRY(open_path(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC, "open directory", &fd));
        Status st = fsync(fd, path);
        ::close(fd);  // read-only: nothing for close to report that fsync did not
        return st;
    }

    Status unlink(const std::string &path) override {
        if (::unlink(path.c_str()) != 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "unlink", path);
        }
        return Status::Ok();
    }

    Status remove_tree(const std::string &path) override {
        struct stat st;
        if (::lstat(path.c_str(), &st) != 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "remove", path);
        }
        if (!S_ISDIR(st.st_mode)) return unlink(path);
        int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "open directory", path);
        }
        SX_TRY(remove_contents(fd, path));  // closes fd
        if (::rmdir(path.c_str()) != 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "rmdir", path);
        }
        return Status::Ok();
    }

    Status list_dir(const std::string &path, std::vector<std::string> *names) override {
        DIR *dir = ::opendir(path.c_str());
        if (dir == nullptr) {
            const int err = errno;
            return SX_IO_ERROR(err, "list directory", path);
        }
        std::vector<std::string> out;
        Status st = read_names(dir, path, &out);
        ::closedir(dir);
        SX_TRY(st);
        std::sort(out.begin(), out.end());
        *names = std::move(out);
        return Status::Ok();
    }

    Status exists(const std::string &path, bool *exists) override {
        struct stat st;
        return stat_path(path, false, &st, exists);
    }

    Status is_directory(const std::string &path, bool *is_dir) override {
        struct stat st;
        bool found = false;
        SX_TRY(stat_path(path, true, &st, &found));
        *is_dir = found && S_ISDIR(st.st_mode);
        return Status::Ok();
    }

    Status lock_directory(const std::string &path, int *fd, LockState *state) override {
        *fd = -1;
        int dir;
        do {
            dir = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        } while (dir < 0 && errno == EINTR);
        if (dir < 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "open directory", path);
        }
        int rc;
        do {
            rc = ::flock(dir, LOCK_EX | LOCK_NB);
        } while (rc != 0 && errno == EINTR);
        if (rc != 0) {
            const int err = errno;
            ::close(dir);
            if (err == EWOULDBLOCK) {
                *state = LockState::kBusy;
                return Status::Ok();
            }
            // NFS takes a directory's flock as a write lock of a file opened for reading.
            if (err == ENOLCK || err == EOPNOTSUPP || err == EBADF || err == EINVAL) {
                *state = LockState::kUnsupported;
                return Status::Ok();
            }
            return SX_IO_ERROR(err, "lock directory", path);
        }
        // The path may have been removed, or renamed and made again, between the open and
        // the lock: then what was locked is not what the path names now.
        struct stat locked, now;
        bool found = false;
        Status st = ::fstat(dir, &locked) == 0 ? stat_path(path, false, &now, &found)
                                               : SX_IO_ERROR(errno, "stat directory", path);
        if (st.ok() && (!found || locked.st_nlink == 0 || locked.st_ino != now.st_ino || locked.st_dev != now.st_dev))
            st = SX_ERROR(SX_ERR_NOT_FOUND, "lock directory '%s': it was removed or replaced while it was locked",
                          path.c_str());
        if (!st.ok()) {
            ::close(dir);
            return st;
        }
        *fd = dir;
        *state = LockState::kHeld;
        return Status::Ok();
    }

    void unlock_directory(int fd) override {
        if (fd >= 0) ::close(fd);  // releases the flock: the descriptor is its only holder
    }

    Status latest_change_ms(const std::string &path, uint64_t *ms) override {
        struct stat st;
        bool found = false;
        SX_TRY(stat_path(path, false, &st, &found));
        if (!found) return SX_IO_ERROR(ENOENT, "stat", path);
        uint64_t latest = mtime_ms(st);
        if (!S_ISDIR(st.st_mode)) {
            *ms = latest;
            return Status::Ok();
        }
        std::vector<std::string> names;
        SX_TRY(list_dir(path, &names));
        for (const std::string &name : names)
            if (stat_path(path + "/" + name, false, &st, &found).ok() && found) latest = std::max(latest, mtime_ms(st));
        *ms = latest;
        return Status::Ok();
    }

  private:
    static uint64_t mtime_ms(const struct stat &st) {
        return static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000u + static_cast<uint64_t>(st.st_mtim.tv_nsec) / 1000000u;
    }

    // Opens for reading what is a regular file; O_NONBLOCK so that a FIFO does not wait
    // for a writer before fstat can refuse it (it changes nothing for a regular file).
    static Status open_regular(const std::string &path, int extra_flags, int *fd) {
        int rc;
        do {
            rc = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | extra_flags);
        } while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            const int err = errno;
            if (err == ELOOP && (extra_flags & O_NOFOLLOW))
                return SX_ERROR(SX_ERR_CORRUPT,
                                "open for reading '%s': it is a symbolic link; sx reads its own files only as "
                                "regular files in their directory, never through a link",
                                path.c_str());
            struct stat st;  // a socket cannot be opened at all (ENXIO): say what it is
            if (err == ENXIO && ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
                return not_regular(path, st.st_mode);
            return SX_IO_ERROR(err, "open for reading", path);
        }
        struct stat st;
        if (::fstat(rc, &st) != 0) {
            const int err = errno;
            ::close(rc);
            return SX_IO_ERROR(err, "stat", path);
        }
        if (!S_ISREG(st.st_mode)) {
            ::close(rc);
            return not_regular(path, st.st_mode);
        }
        *fd = rc;
        return Status::Ok();
    }

    static Status not_regular(const std::string &path, mode_t mode) {
        const char *kind = S_ISDIR(mode)    ? "a directory"
                           : S_ISFIFO(mode) ? "a FIFO"
                           : S_ISSOCK(mode) ? "a socket"
                           : S_ISCHR(mode)  ? "a character device"
                           : S_ISBLK(mode)  ? "a block device"
                                            : "not a regular file";
        return SX_ERROR(SX_ERR_CORRUPT, "open for reading '%s': it is %s; only a regular file is read", path.c_str(),
                        kind);
    }

    static Status open_path(const std::string &path, int flags, const char *what, int *fd) {
        int rc;
        do {
            rc = ::open(path.c_str(), flags, 0644);
        } while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            const int err = errno;
            return SX_IO_ERROR(err, what, path);
        }
        *fd = rc;
        return Status::Ok();
    }

    // Reads every name but "." and ".." from dir into *out.
    static Status read_names(DIR *dir, const std::string &path, std::vector<std::string> *out) {
        for (;;) {
            errno = 0;  // readdir returns NULL both at the end and on error
            struct dirent *e = ::readdir(dir);
            if (e == nullptr) {
                if (errno != 0) {
                    const int err = errno;
                    return SX_IO_ERROR(err, "list directory", path);
                }
                return Status::Ok();
            }
            if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
            out->emplace_back(e->d_name);
        }
    }

    // Removes everything inside the directory open as dir_fd (named `path` in messages)
    // and closes dir_fd. Works relative to the open descriptor (unlinkat, openat with
    // O_NOFOLLOW), so a name swapped for a symbolic link meanwhile is removed as a link,
    // never followed out of the tree. Recursion depth is the tree's depth; each level
    // holds one descriptor.
    static Status remove_contents(int dir_fd, const std::string &path) {
        DIR *dir = ::fdopendir(dir_fd);
        if (dir == nullptr) {
            const int err = errno;
            ::close(dir_fd);
            return SX_IO_ERROR(err, "list directory", path);
        }
        // Names are read first, then removed: unlinking while readdir walks the same
        // directory may skip entries.
        std::vector<std::string> names;
        Status st = read_names(dir, path, &names);
        for (size_t i = 0; st.ok() && i < names.size(); ++i) st = remove_entry(dirfd(dir), path, names[i]);
        ::closedir(dir);  // closes dir_fd
        return st;
    }

    static Status remove_entry(int dir_fd, const std::string &dir_path, const std::string &name) {
        const std::string path = dir_path + "/" + name;
        struct stat st;
        if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "remove", path);
        }
        if (S_ISDIR(st.st_mode)) {
            const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0) {
                const int err = errno;
                return SX_IO_ERROR(err, "open directory", path);
            }
            SX_TRY(remove_contents(fd, path));
        }
        if (::unlinkat(dir_fd, name.c_str(), S_ISDIR(st.st_mode) ? AT_REMOVEDIR : 0) != 0) {
            const int err = errno;
            return SX_IO_ERROR(err, "remove", path);
        }
        return Status::Ok();
    }
};

}  // namespace

std::shared_ptr<FileOps> posix_file_ops() {
    // Stateless: one instance serves every caller.
    static const std::shared_ptr<FileOps> ops = std::make_shared<PosixFileOps>();
    return ops;
}

Status write_file_atomic(FileOps &ops, const std::string &dir, const std::string &name, const void *data,
                         size_t n) {
    // A temporary name of this call's own: writers of one file in several processes (two
    // jobs saving into one directory) or threads never write into each other's.
    static std::atomic<uint64_t> calls{0};
    const std::string path = dir + "/" + name;
    const std::string tmp = path + ".tmp." + std::to_string(static_cast<long long>(::getpid())) + "." +
                            std::to_string(calls.fetch_add(1, std::memory_order_relaxed));
    int fd = -1;
    bool renamed = false;
    auto steps = [&]() -> Status {
        SX_TRY(ops.open_write(tmp, &fd));
        SX_TRY(ops.pwrite_all(fd, data, n, 0, tmp));
        SX_TRY(ops.fsync(fd, tmp));
        const int closing = fd;
        fd = -1;  // close releases it whatever it returns
        SX_TRY(ops.close(closing, tmp));
        SX_TRY(ops.rename(tmp, path));
        renamed = true;
        return ops.fsync_dir(dir);
    };
    Status st = steps();
    if (!st.ok()) {
        // The one cleanup path: release the descriptor and take the partial file away.
        // Their own errors are dropped; the first failure is the one to report.
        if (fd >= 0) ops.close(fd, tmp);
        if (!renamed) ops.unlink(tmp);
        st.prefix("writing '" + path + "': ");
    }
    return st;
}

Status read_file(FileOps &ops, const std::string &path, size_t max_bytes, std::string *out, bool named) {
    int fd = -1;
    SX_TRY(named ? ops.open_read_named(path, &fd) : ops.open_read(path, &fd));
    std::string bytes;
    auto steps = [&]() -> Status {
        uint64_t size = 0;
        SX_TRY(ops.file_size(fd, &size, path));
        SX_CHECK(size <= max_bytes, SX_ERR_CORRUPT, "read '%s': %llu bytes, more than the %zu allowed", path.c_str(),
                 static_cast<unsigned long long>(size), max_bytes);
        bytes.resize(static_cast<size_t>(size));
        return ops.pread_all(fd, &bytes[0], bytes.size(), 0, path);
    };
    Status st = steps();
    Status closed = ops.close(fd, path);
    SX_TRY(st);
    SX_TRY(closed);
    *out = std::move(bytes);
    return Status::Ok();
}

}  // namespace io
}  // namespace sx
