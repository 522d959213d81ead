// Helpers shared by the comm and rdzv tests: CMocka glue, ranks as threads, timing, free
// ports, temporary directories.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "free_port.h"

// cmocka.h (1.1) declares its C functions without extern "C".
extern "C" {
#include <cmocka.h>
}

// Fails the test (main thread only: CMocka's failures longjmp) if a Status is not OK.
#define ASSERT_OK(expr)                                                                            \
    do {                                                                                           \
        ::sx::Status assert_ok_ = (expr);                                                          \
        if (!assert_ok_.ok()) {                                                                    \
            print_error("%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #expr, assert_ok_.code(), \
                        assert_ok_.message().c_str());                                             \
            fail();                                                                                \
        }                                                                                          \
    } while (0)

// Fails the test if a Status does not carry `code`.
#define ASSERT_CODE(expr, expected)                                                                    \
    do {                                                                                               \
        ::sx::Status assert_code_ = (expr);                                                            \
        if (assert_code_.code() != (expected)) {                                                       \
            print_error("%s:%d: %s returned %d (%s), expected %d\n", __FILE__, __LINE__, #expr,          \
                        assert_code_.code(), assert_code_.message().c_str(), static_cast<int>(expected)); \
            fail();                                                                                    \
        }                                                                                              \
    } while (0)

namespace sxtest {

using Clock = std::chrono::steady_clock;

inline long long ms_since(Clock::time_point start) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

inline bool contains(const std::string &text, const char *part) { return text.find(part) != std::string::npos; }

// Runs fn(rank) for ranks 0..n-1 on n threads; each returns "" or what went wrong.
// Asserts (on the calling thread) that every rank succeeded.
inline void run_ranks(int n, const std::function<std::string(int)> &fn) {
    std::vector<std::string> errors(static_cast<size_t>(n));
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) threads.emplace_back([&, r] { errors[static_cast<size_t>(r)] = fn(r); });
    for (std::thread &t : threads) t.join();
    bool ok = true;
    for (int r = 0; r < n; ++r) {
        if (!errors[static_cast<size_t>(r)].empty()) {
            print_error("rank %d of %d: %s\n", r, n, errors[static_cast<size_t>(r)].c_str());
            ok = false;
        }
    }
    assert_true(ok);
}

// "" if s is OK, else its text, for rank threads.
inline std::string why(const sx::Status &s, const char *what) {
    return s.ok() ? std::string() : std::string(what) + ": " + s.message();
}

// A fresh directory under $TMPDIR (or /tmp), removed with its files by the destructor.
class TempDir {
  public:
    TempDir() {
        const char *base = std::getenv("TMPDIR");
        std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/sx-comm-test-XXXXXX";
        std::vector<char> buf(tmpl.begin(), tmpl.end());
        buf.push_back('\0');
        if (::mkdtemp(buf.data()) == nullptr) {
            std::perror("mkdtemp");
            std::abort();
        }
        path_ = buf.data();
    }
    ~TempDir() { remove_tree(path_); }
    const std::string &path() const { return path_; }

    // Names in the directory (not recursive).
    std::vector<std::string> list() const {
        std::vector<std::string> names;
        if (DIR *d = ::opendir(path_.c_str())) {
            while (struct dirent *e = ::readdir(d)) {
                std::string n = e->d_name;
                if (n != "." && n != "..") names.push_back(n);
            }
            ::closedir(d);
        }
        return names;
    }

  private:
    static void remove_tree(const std::string &path) {
        if (DIR *d = ::opendir(path.c_str())) {
            while (struct dirent *e = ::readdir(d)) {
                std::string n = e->d_name;
                if (n == "." || n == "..") continue;
                std::string child = path + "/" + n;
                struct stat st;
                if (::lstat(child.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
                    remove_tree(child);
                } else {
                    ::unlink(child.c_str());
                }
            }
            ::closedir(d);
        }
        ::rmdir(path.c_str());
    }
    std::string path_;
};

// A name no other test of this process has used (local:// names, file:// subdirs).
inline std::string unique_name(const char *stem) {
    static std::atomic<int> n{0};
    return std::string(stem) + "-" + std::to_string(::getpid()) + "-" + std::to_string(n.fetch_add(1));
}

}  // namespace sxtest
