// file:///DIR: a store in a directory every rank can reach (a shared file system for
// ranks on several hosts).
//
// Layout: one file per key, named by percent-encoding the key (bytes other than
// [A-Za-z0-9_-] become %XX), so names never begin with '.'; the dot names are ours:
// ".tmp.*" (a value being written) and ".lock.<key>" (add()'s lock). Invariants:
//  - a key's file, when present, holds a complete value: values are written to a
//    temporary file and renamed over the key's name (rename is atomic);
//  - add() is atomic across threads and processes: it holds flock() on the key's lock
//    file around read-modify-rename.
// Waiting polls with exponential backoff (1 ms up to 32 ms): there is no portable
// change notification that also works on network file systems.
//
// The directory must be fresh for each job: keys a crashed earlier job left behind
// would otherwise be read as this job's (each group's keys are removed when its last
// rank leaves; see key_space.cc).
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "rdzv/stores.h"

namespace sx {
namespace rdzv {
namespace {

std::string encode_key(const std::string &key) {
    static const char kHex[] = "0123456789ABCDEF";
    std::string out;
    out.reserve(key.size());
    for (unsigned char c : key) {
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-') {
            out += static_cast<char>(c);
        } else {
            out += '%';
            out += kHex[c >> 4];
            out += kHex[c & 15];
        }
    }
    return out;
}

// Polls `ready` with exponential backoff until it returns true or `deadline` passes.
template <class Ready>
bool poll_until(Clock::time_point deadline, Ready ready) {
    Millis backoff(1);
    for (;;) {
        if (ready()) return true;
        Millis left = time_left(deadline);
        if (left.count() == 0) return false;
        std::this_thread::sleep_for(std::min(backoff, left));
        backoff = std::min(backoff * 2, Millis(32));
    }
}

class FileStore final : public Store {
  public:
    FileStore(std::string dir, Millis lock_timeout) : dir_(std::move(dir)), lock_timeout_(lock_timeout) {}

    Status set(const std::string &key, const std::string &value) override {
        SX_TRY(check_key(key));
        return write_value(key, value);
    }

    Status get(const std::string &key, std::string *value, Millis timeout) override {
        SX_TRY(check_key(key));
        const std::string path = key_path(key);
        Status error;
        bool found = poll_until(Clock::now() + timeout, [&] {
            bool present = false;
            error = read_file(path, value, &present);
            return present || !error.ok();
        });
        SX_TRY(error);
        SX_CHECK(found, SX_ERR_TIMEOUT, "rendezvous key '%s' did not appear in %s within %lld ms", key.c_str(),
                 dir_.c_str(), static_cast<long long>(timeout.count()));
        return Status::Ok();
    }

    Status wait(const std::vector<std::string> &keys, Millis timeout) override {
        const Clock::time_point deadline = Clock::now() + timeout;
        for (const std::string &key : keys) {
            SX_TRY(check_key(key));
            const std::string path = key_path(key);
            bool found = poll_until(deadline, [&] { return exists(path); });
            SX_CHECK(found, SX_ERR_TIMEOUT, "rendezvous key '%s' did not appear in %s within %lld ms",
                     key.c_str(), dir_.c_str(), static_cast<long long>(timeout.count()));
        }
        return Status::Ok();
    }

    Status add(const std::string &key, int64_t delta, int64_t *result) override {
        SX_TRY(check_key(key));
        const std::string lock_path = dir_ + "/.lock." + encode_key(key);
        int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        SX_CHECK(fd >= 0, SX_ERR_IO, "cannot open the lock file %s: %s", lock_path.c_str(), std::strerror(errno));
        // Non-blocking attempts so that a stuck holder costs a timeout, not a hang.
        bool locked = poll_until(Clock::now() + lock_timeout_, [&] { return ::flock(fd, LOCK_EX | LOCK_NB) == 0; });
        Status s;
        if (!locked) {
            s = SX_ERROR(SX_ERR_TIMEOUT, "could not lock rendezvous key '%s' (%s) within %lld ms", key.c_str(),
                         lock_path.c_str(), static_cast<long long>(lock_timeout_.count()));
        } else {
            s = add_locked(key, delta, result);
        }
        ::close(fd);  // releases the flock
        return s;
    }

    Status check(const std::vector<std::string> &keys, bool *present) override {
        *present = true;
        for (const std::string &key : keys) {
            SX_TRY(check_key(key));
            if (!exists(key_path(key))) *present = false;
        }
        return Status::Ok();
    }

    Status erase(const std::string &key) override {
        SX_TRY(check_key(key));
        const std::string path = key_path(key);
        SX_CHECK(::unlink(path.c_str()) == 0 || errno == ENOENT, SX_ERR_IO, "cannot remove %s: %s", path.c_str(),
                 std::strerror(errno));
        return Status::Ok();
    }

    Status erase_prefix(const std::string &prefix) override {
        const std::string enc = encode_key(prefix);
        DIR *d = ::opendir(dir_.c_str());
        SX_CHECK(d != nullptr, SX_ERR_IO, "cannot list %s: %s", dir_.c_str(), std::strerror(errno));
        // Percent-encoding maps each byte on its own, so a key begins with `prefix`
        // exactly when its file name begins with encode(prefix).
        const std::string names[] = {enc, ".lock." + enc, ".tmp." + enc};
        Status s;
        while (struct dirent *e = ::readdir(d)) {
            for (const std::string &p : names) {
                if (std::strncmp(e->d_name, p.c_str(), p.size()) != 0) continue;
                std::string path = dir_ + "/" + e->d_name;
                if (::unlink(path.c_str()) != 0 && errno != ENOENT && s.ok())
                    s = SX_ERROR(SX_ERR_IO, "cannot remove %s: %s", path.c_str(), std::strerror(errno));
                break;
            }
        }
        ::closedir(d);
        return s;
    }

  private:
    Status check_key(const std::string &key) const {
        // NAME_MAX is 255; leave room for the ".lock." and ".tmp." decorations.
        SX_CHECK_ARG(!key.empty() && encode_key(key).size() <= 200,
                     "rendezvous key '%.64s' is empty or too long for a file name", key.c_str());
        return Status::Ok();
    }

    std::string key_path(const std::string &key) const { return dir_ + "/" + encode_key(key); }

    static bool exists(const std::string &path) {
        struct stat st;
        return ::stat(path.c_str(), &st) == 0;
    }

    // Reads the whole file; *present = false (and OK) if it does not exist.
    static Status read_file(const std::string &path, std::string *out, bool *present) {
        int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            *present = false;
            SX_CHECK(errno == ENOENT, SX_ERR_IO, "cannot open %s: %s", path.c_str(), std::strerror(errno));
            return Status::Ok();
        }
        std::string data;
        char buf[4096];
        for (;;) {
            ssize_t n = ::read(fd, buf, sizeof buf);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                int err = errno;
                ::close(fd);
                return SX_ERROR(SX_ERR_IO, "cannot read %s: %s", path.c_str(), std::strerror(err));
            }
            if (n == 0) break;
            data.append(buf, static_cast<size_t>(n));
        }
        ::close(fd);
        *present = true;
        if (out != nullptr) *out = std::move(data);
        return Status::Ok();
    }

    // Writes value to a fresh temporary file and renames it over the key's file.
    Status write_value(const std::string &key, const std::string &value) {
        static std::atomic<uint64_t> counter{0};
        const std::string path = key_path(key);
        const std::string tmp = dir_ + "/.tmp." + encode_key(key) + "." + std::to_string(::getpid()) + "." +
                                std::to_string(counter.fetch_add(1));
        int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        SX_CHECK(fd >= 0, SX_ERR_IO, "cannot create %s: %s", tmp.c_str(), std::strerror(errno));
        size_t done = 0;
        while (done < value.size()) {
            ssize_t n = ::write(fd, value.data() + done, value.size() - done);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                int err = errno;
                ::close(fd);
                ::unlink(tmp.c_str());
                return SX_ERROR(SX_ERR_IO, "cannot write %s: %s", tmp.c_str(), std::strerror(err));
            }
            done += static_cast<size_t>(n);
        }
        if (::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
            int err = errno;
            ::unlink(tmp.c_str());
            return SX_ERROR(SX_ERR_IO, "cannot write rendezvous key '%s' to %s: %s", key.c_str(), path.c_str(),
                            std::strerror(err));
        }
        return Status::Ok();
    }

    // add() once the key's lock is held.
    Status add_locked(const std::string &key, int64_t delta, int64_t *result) {
        std::string old;
        bool present = false;
        SX_TRY(read_file(key_path(key), &old, &present));
        int64_t value = 0;
        SX_TRY(apply_add(key, present ? &old : nullptr, delta, &value));
        SX_TRY(write_value(key, std::to_string(value)));
        if (result != nullptr) *result = value;
        return Status::Ok();
    }

    const std::string dir_;
    const Millis lock_timeout_;
};

// mkdir -p: creates `dir` and its missing parents.
Status make_directories(const std::string &dir) {
    for (size_t pos = 1; pos <= dir.size(); ++pos) {
        if (pos != dir.size() && dir[pos] != '/') continue;
        std::string part = dir.substr(0, pos);
        if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
            return SX_ERROR(SX_ERR_IO, "cannot create the rendezvous directory %s: %s", part.c_str(),
                            std::strerror(errno));
        }
    }
    struct stat st;
    SX_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), SX_ERR_IO,
             "the rendezvous path %s is not a directory", dir.c_str());
    SX_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, SX_ERR_IO, "the rendezvous directory %s is not writable: %s",
             dir.c_str(), std::strerror(errno));
    return Status::Ok();
}

}  // namespace

Status open_file_store(const std::string &dir, Millis lock_timeout, std::shared_ptr<Store> *out) {
    std::string d = dir;
    while (d.size() > 1 && d.back() == '/') d.pop_back();
    SX_TRY(make_directories(d));
    *out = std::make_shared<FileStore>(d, lock_timeout);
    return Status::Ok();
}

}  // namespace rdzv
}  // namespace sx
