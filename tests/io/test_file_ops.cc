// The POSIX FileOps and the whole-file helpers, on a fresh temporary directory per
// test: each operation's effect on disk, and each error's code and message (which must
// name the path).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "io/fault_file_ops.h"
#include "io/file_ops.h"
#include "io_test_util.h"

using sx::io::FaultFileOps;
using sx::io::FileOps;
using sx::io::OpKind;
using sx::io::posix_file_ops;
using sx::io::read_file;
using sx::io::write_file_atomic;
using namespace sx_io_test;

namespace {

// Writes at two offsets (leaving a hole), reads back each range and the hole's zeros.
void test_write_read_roundtrip(void **state) {
    const std::string path = dir_of(state) + "/data.bin";
    auto ops = posix_file_ops();
    std::vector<char> a(5000), b(123);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 7);
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(255 - i);
    int fd = -1;
    ASSERT_OK(ops->open_write(path, &fd));
    ASSERT_OK(ops->pwrite_all(fd, a.data(), a.size(), 0, path));
    ASSERT_OK(ops->pwrite_all(fd, b.data(), b.size(), 8192, path));
    ASSERT_OK(ops->pwrite_all(fd, nullptr, 0, 100, path));  // nothing to write is fine
    ASSERT_OK(ops->fsync(fd, path));
    uint64_t size = 0;
    ASSERT_OK(ops->file_size(fd, &size, path));
    assert_int_equal(size, 8192 + 123);
    ASSERT_OK(ops->close(fd, path));

    ASSERT_OK(ops->open_read(path, &fd));
    std::vector<char> got_a(a.size()), got_b(b.size()), hole(8192 - 5000, 'x');
    ASSERT_OK(ops->pread_all(fd, got_a.data(), got_a.size(), 0, path));
    ASSERT_OK(ops->pread_all(fd, got_b.data(), got_b.size(), 8192, path));
    ASSERT_OK(ops->pread_all(fd, hole.data(), hole.size(), 5000, path));
    ASSERT_OK(ops->close(fd, path));
    assert_true(got_a == a);
    assert_true(got_b == b);
    assert_true(hole == std::vector<char>(hole.size(), 0));

    // open_write truncates.
    ASSERT_OK(ops->open_write(path, &fd));
    ASSERT_OK(ops->file_size(fd, &size, path));
    ASSERT_OK(ops->close(fd, path));
    assert_int_equal(size, 0);
}

// Reading past the end is a truncated file (SX_ERR_CORRUPT), not an I/O error.
void test_read_past_end_is_truncated(void **state) {
    const std::string path = dir_of(state) + "/short.bin";
    write_whole(path, std::string(100, 'q'));
    auto ops = posix_file_ops();
    int fd = -1;
    ASSERT_OK(ops->open_read(path, &fd));
    char buf[200];
    ASSERT_STATUS(ops->pread_all(fd, buf, 101, 0, path), SX_ERR_CORRUPT, "truncated");
    ASSERT_STATUS(ops->pread_all(fd, buf, 50, 60, path), SX_ERR_CORRUPT, path);
    ASSERT_STATUS(ops->pread_all(fd, buf, 1, 100, path), SX_ERR_CORRUPT, "truncated");
    ASSERT_OK(ops->pread_all(fd, buf, 40, 60, path));
    ASSERT_OK(ops->close(fd, path));
}

void test_open_errors_name_the_path(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    int fd = 12345;
    ASSERT_STATUS(ops->open_read(dir + "/missing", &fd), SX_ERR_NOT_FOUND, dir + "/missing");
    ASSERT_STATUS(ops->open_write(dir + "/no/such/dir/f", &fd), SX_ERR_NOT_FOUND, dir + "/no/such/dir/f");
    assert_int_equal(fd, 12345);  // untouched on failure
    // A directory cannot be opened for writing: an I/O error with strerror's text.
    ASSERT_STATUS(ops->open_write(dir, &fd), SX_ERR_IO, "Is a directory");
    ASSERT_STATUS(ops->open_write(dir, &fd), SX_ERR_IO, dir);
}

// Descriptor errors (a read-only descriptor written, a closed one) name the path given.
void test_descriptor_errors_name_the_path(void **state) {
    const std::string path = dir_of(state) + "/ro.bin";
    write_whole(path, "abc");
    auto ops = posix_file_ops();
    int fd = -1;
    ASSERT_OK(ops->open_read(path, &fd));
    ASSERT_STATUS(ops->pwrite_all(fd, "x", 1, 0, path), SX_ERR_IO, "write '" + path + "'");
    ASSERT_OK(ops->close(fd, path));
    uint64_t size = 0;
    char c;
    ASSERT_STATUS(ops->fsync(-1, path), SX_ERR_IO, "fsync '" + path + "': Bad file descriptor");
    ASSERT_STATUS(ops->file_size(-1, &size, path), SX_ERR_IO, path);
    ASSERT_STATUS(ops->pread_all(-1, &c, 1, 0, path), SX_ERR_IO, path);
    ASSERT_STATUS(ops->close(-1, path), SX_ERR_IO, "close '" + path + "'");
    // An offset range past the largest file offset is refused before any call.
    ASSERT_STATUS(ops->pwrite_all(-1, "x", 1, ~uint64_t{0}, path), SX_ERR_INVALID_ARGUMENT, path);
    ASSERT_STATUS(ops->pread_all(-1, &c, 2, uint64_t{INT64_MAX}, path), SX_ERR_INVALID_ARGUMENT, path);
}

void test_mkdir(void **state) {
    const std::string dir = dir_of(state) + "/sub";
    auto ops = posix_file_ops();
    ASSERT_OK(ops->mkdir(dir));
    struct stat st;
    assert_int_equal(lstat(dir.c_str(), &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    ASSERT_STATUS(ops->mkdir(dir), SX_ERR_ALREADY_EXISTS, dir);
    // An existing file is an existing path too.
    write_whole(dir + "/f", "x");
    ASSERT_STATUS(ops->mkdir(dir + "/f"), SX_ERR_ALREADY_EXISTS, dir + "/f");
    ASSERT_STATUS(ops->mkdir(dir + "/f/g"), SX_ERR_IO, "Not a directory");
    ASSERT_STATUS(ops->mkdir(dir + "/x/y"), SX_ERR_NOT_FOUND, dir + "/x/y");
}

void test_rename_replaces(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    write_whole(dir + "/a", "new");
    write_whole(dir + "/b", "old");
    ASSERT_OK(ops->rename(dir + "/a", dir + "/b"));
    assert_string_equal(read_whole(dir + "/b").c_str(), "new");
    bool there = true;
    ASSERT_OK(ops->exists(dir + "/a", &there));
    assert_false(there);
    // The message names both ends.
    ASSERT_STATUS(ops->rename(dir + "/a", dir + "/c"), SX_ERR_NOT_FOUND, "'" + dir + "/a' to '" + dir + "/c'");
    // A directory renamed into place, as a checkpoint commit does.
    ASSERT_OK(ops->mkdir(dir + "/ckpt.tmp"));
    write_whole(dir + "/ckpt.tmp/MANIFEST", "m");
    ASSERT_OK(ops->rename(dir + "/ckpt.tmp", dir + "/ckpt"));
    ASSERT_OK(ops->fsync_dir(dir));
    assert_string_equal(read_whole(dir + "/ckpt/MANIFEST").c_str(), "m");
}

void test_fsync_dir(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    ASSERT_OK(ops->fsync_dir(dir));
    ASSERT_STATUS(ops->fsync_dir(dir + "/missing"), SX_ERR_NOT_FOUND, dir + "/missing");
    write_whole(dir + "/file", "x");
    ASSERT_STATUS(ops->fsync_dir(dir + "/file"), SX_ERR_IO, "Not a directory");
}

void test_unlink(void **state) {
    const std::string path = dir_of(state) + "/f";
    auto ops = posix_file_ops();
    write_whole(path, "x");
    ASSERT_OK(ops->unlink(path));
    bool there = true;
    ASSERT_OK(ops->exists(path, &there));
    assert_false(there);
    ASSERT_STATUS(ops->unlink(path), SX_ERR_NOT_FOUND, path);
    ASSERT_STATUS(ops->unlink(dir_of(state)), SX_ERR_IO, dir_of(state));  // a directory
}

void test_list_dir_sorted_without_dots(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    std::vector<std::string> names = {"stale"};
    ASSERT_OK(ops->list_dir(dir, &names));
    assert_true(names.empty());
    for (const char *n : {"shard-00002-of-00003.bin", "MANIFEST", ".hidden", "shard-00000-of-00003.bin"})
        write_whole(dir + "/" + n, "x");
    ASSERT_OK(ops->mkdir(dir + "/subdir"));
    ASSERT_OK(ops->list_dir(dir, &names));
    const std::vector<std::string> want = {".hidden", "MANIFEST", "shard-00000-of-00003.bin",
                                           "shard-00002-of-00003.bin", "subdir"};
    assert_true(names == want);
    ASSERT_STATUS(ops->list_dir(dir + "/missing", &names), SX_ERR_NOT_FOUND, dir + "/missing");
    ASSERT_STATUS(ops->list_dir(dir + "/MANIFEST", &names), SX_ERR_IO, "Not a directory");
    assert_true(names == want);  // untouched on failure
}

void test_exists(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    bool there = false;
    ASSERT_OK(ops->exists(dir, &there));
    assert_true(there);
    write_whole(dir + "/f", "x");
    ASSERT_OK(ops->exists(dir + "/f", &there));
    assert_true(there);
    ASSERT_OK(ops->exists(dir + "/g", &there));
    assert_false(there);
    ASSERT_OK(ops->exists(dir + "/f/below-a-file", &there));
    assert_false(there);
    // A dangling symbolic link is an entry: the name is taken.
    assert_int_equal(symlink((dir + "/nowhere").c_str(), (dir + "/link").c_str()), 0);
    ASSERT_OK(ops->exists(dir + "/link", &there));
    assert_true(there);
}

// A tree with files, nested directories, and symbolic links to a directory and a file
// outside it: everything inside goes, nothing the links point at is touched.
void test_remove_tree(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    ASSERT_OK(ops->mkdir(dir + "/outside"));
    write_whole(dir + "/outside/keep", "keep");
    const std::string t = dir + "/tree";
    ASSERT_OK(ops->mkdir(t));
    ASSERT_OK(ops->mkdir(t + "/a"));
    ASSERT_OK(ops->mkdir(t + "/a/b"));
    ASSERT_OK(ops->mkdir(t + "/a/b/c"));
    ASSERT_OK(ops->mkdir(t + "/empty"));
    for (const char *f : {"/f1", "/a/f2", "/a/b/f3", "/a/b/c/f4", "/a/.dot"}) write_whole(t + f, f);
    assert_int_equal(symlink((dir + "/outside").c_str(), (t + "/a/dirlink").c_str()), 0);
    assert_int_equal(symlink((dir + "/outside/keep").c_str(), (t + "/filelink").c_str()), 0);

    ASSERT_OK(ops->remove_tree(t));
    bool there = true;
    ASSERT_OK(ops->exists(t, &there));
    assert_false(there);
    assert_string_equal(read_whole(dir + "/outside/keep").c_str(), "keep");

    // A link given as the root is removed itself; its target stays.
    assert_int_equal(symlink((dir + "/outside").c_str(), (dir + "/rootlink").c_str()), 0);
    ASSERT_OK(ops->remove_tree(dir + "/rootlink"));
    ASSERT_OK(ops->exists(dir + "/rootlink", &there));
    assert_false(there);
    assert_string_equal(read_whole(dir + "/outside/keep").c_str(), "keep");
    // So is a plain file.
    ASSERT_OK(ops->remove_tree(dir + "/outside/keep"));
    ASSERT_OK(ops->exists(dir + "/outside/keep", &there));
    assert_false(there);
    ASSERT_STATUS(ops->remove_tree(t), SX_ERR_NOT_FOUND, t);
}

// A directory whose contents cannot be removed: the error names the entry. Skipped as
// root, whom permissions do not stop.
void test_remove_tree_error_names_the_entry(void **state) {
    if (geteuid() == 0) {
        skip();
    }
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    ASSERT_OK(ops->mkdir(dir + "/locked"));
    write_whole(dir + "/locked/f", "x");
    chmod((dir + "/locked").c_str(), 0555);
    const sx::Status st = ops->remove_tree(dir + "/locked");
    chmod((dir + "/locked").c_str(), 0755);
    ASSERT_STATUS(st, SX_ERR_IO, dir + "/locked/f");
}

// The file is complete under its name, and no .tmp is left.
void test_write_file_atomic(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    ASSERT_OK(write_file_atomic(*ops, dir, "latest", "step-100", 8));
    assert_string_equal(read_whole(dir + "/latest").c_str(), "step-100");
    ASSERT_OK(write_file_atomic(*ops, dir, "latest", "step-200", 8));
    assert_string_equal(read_whole(dir + "/latest").c_str(), "step-200");
    ASSERT_OK(write_file_atomic(*ops, dir, "empty", nullptr, 0));
    assert_string_equal(read_whole(dir + "/empty").c_str(), "");
    std::vector<std::string> names;
    ASSERT_OK(ops->list_dir(dir, &names));
    assert_true(names == (std::vector<std::string>{"empty", "latest"}));
    ASSERT_STATUS(write_file_atomic(*ops, dir + "/missing", "latest", "x", 1), SX_ERR_NOT_FOUND,
                  dir + "/missing/latest");
}

// A failure at each step before the rename leaves the old file whole and removes the
// .tmp; a failure of the directory fsync comes after the rename, so the new file is in
// place. Either way the reader sees one whole version.
void test_write_file_atomic_failures(void **state) {
    const std::string dir = dir_of(state);
    auto faults = std::make_shared<FaultFileOps>(posix_file_ops());
    struct Case {
        OpKind kind;
        const char *want;
    };
    for (const Case &c : {Case{OpKind::kOpen, "old"}, Case{OpKind::kWrite, "old"}, Case{OpKind::kFsync, "old"},
                          Case{OpKind::kClose, "old"}, Case{OpKind::kRename, "old"},
                          Case{OpKind::kFsyncDir, "new"}}) {
        ASSERT_OK(write_file_atomic(*posix_file_ops(), dir, "f", "old", 3));
        faults->arm(c.kind, 1, false);
        ASSERT_STATUS(write_file_atomic(*faults, dir, "f", "new", 3), SX_ERR_IO, "injected");
        assert_true(faults->fired());
        assert_string_equal(read_whole(dir + "/f").c_str(), c.want);
        std::vector<std::string> names;
        ASSERT_OK(posix_file_ops()->list_dir(dir, &names));
        assert_true(names == std::vector<std::string>{"f"});
    }
    // A crash in the middle of the write (half the bytes reached the disk): the old file
    // is intact, and only the .tmp, which nothing reads, holds the torn bytes.
    ASSERT_OK(write_file_atomic(*posix_file_ops(), dir, "f", "old", 3));
    faults->set_torn_writes(true);
    faults->arm(OpKind::kWrite, 1, true);
    ASSERT_STATUS(write_file_atomic(*faults, dir, "f", "newer", 5), SX_ERR_IO, "injected");
    assert_string_equal(read_whole(dir + "/f").c_str(), "old");
    std::vector<std::string> names;
    ASSERT_OK(posix_file_ops()->list_dir(dir, &names));
    assert_int_equal(names.size(), 2);
    assert_string_equal(names[0].c_str(), "f");
    const std::string tmp = "f.tmp." + std::to_string(static_cast<long long>(getpid())) + ".";
    if (names[1].compare(0, tmp.size(), tmp) != 0) fail_msg("the temporary file: %s", names[1].c_str());
    assert_string_equal(read_whole(dir + "/" + names[1]).c_str(), "ne");
}

// Writers of one file in several threads at once: each call writes a temporary file of
// its own, every call succeeds, the file is one writer's whole bytes, and no temporary
// file stays.
void test_write_file_atomic_from_threads_at_once(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    std::atomic<int> failures{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            const std::string bytes(64 + t, static_cast<char>('a' + t));
            for (int i = 0; i < 200; ++i)
                if (!write_file_atomic(*ops, dir, "latest", bytes.data(), bytes.size()).ok()) failures++;
        });
    for (std::thread &th : threads) th.join();
    assert_int_equal(failures.load(), 0);
    const std::string got = read_whole(dir + "/latest");
    assert_true(got.size() >= 64 && got.size() < 68);
    assert_true(got == std::string(got.size(), static_cast<char>('a' + (got.size() - 64))));
    std::vector<std::string> names;
    ASSERT_OK(ops->list_dir(dir, &names));
    assert_true(names == std::vector<std::string>{"latest"});
}

void test_read_file(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    write_whole(dir + "/f", std::string(1000, 'z'));
    std::string out = "previous";
    ASSERT_OK(read_file(*ops, dir + "/f", 1000, &out));
    assert_true(out == std::string(1000, 'z'));
    out = "previous";
    ASSERT_STATUS(read_file(*ops, dir + "/f", 999, &out), SX_ERR_CORRUPT, dir + "/f");
    assert_string_equal(out.c_str(), "previous");  // untouched on failure
    ASSERT_STATUS(read_file(*ops, dir + "/none", 10, &out), SX_ERR_NOT_FOUND, dir + "/none");
    write_whole(dir + "/empty", "");
    ASSERT_OK(read_file(*ops, dir + "/empty", 0, &out));
    assert_true(out.empty());
    // The descriptor is closed on every path: a failed read is followed by a close.
    FaultFileOps faults(ops);
    faults.arm(OpKind::kRead, 1, false);
    ASSERT_STATUS(read_file(faults, dir + "/f", 1000, &out), SX_ERR_IO, "injected");
    assert_int_equal(faults.count(OpKind::kOpen), 1);
    assert_int_equal(faults.count(OpKind::kClose), 1);
}

// open_read opens regular files only, and never through a link: a FIFO (which would
// block a reader until a writer came), a socket, a directory and a symbolic link are each
// refused at once, saying what they are. open_read_named (a file the user named) follows
// a link to a regular file, and refuses the rest alike.
void test_open_read_takes_regular_files_only(void **state) {
    const std::string dir = dir_of(state);
    auto ops = posix_file_ops();
    write_whole(dir + "/regular", "bytes");
    assert_int_equal(::mkfifo((dir + "/fifo").c_str(), 0644), 0);
    assert_int_equal(::mkdir((dir + "/dir").c_str(), 0755), 0);
    assert_int_equal(::symlink((dir + "/regular").c_str(), (dir + "/link").c_str()), 0);
    assert_int_equal(::symlink((dir + "/fifo").c_str(), (dir + "/link-to-fifo").c_str()), 0);
    const int sock = ::socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(sock >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    const std::string sock_path = dir + "/sock";
    assert_true(sock_path.size() < sizeof addr.sun_path);
    std::memcpy(addr.sun_path, sock_path.c_str(), sock_path.size() + 1);
    assert_int_equal(::bind(sock, reinterpret_cast<sockaddr *>(&addr), sizeof addr), 0);
    int fd = -1;
    ASSERT_OK(ops->open_read(dir + "/regular", &fd));
    ASSERT_OK(ops->close(fd, "regular"));
    const std::pair<const char *, const char *> refused[] = {
        {"fifo", "it is a FIFO"}, {"dir", "it is a directory"}, {"sock", "it is a socket"},
        {"link", "it is a symbolic link"}, {"link-to-fifo", "it is a symbolic link"}};
    for (const auto &r : refused) {
        fd = -1;
        ASSERT_STATUS(ops->open_read(dir + "/" + r.first, &fd), SX_ERR_CORRUPT, r.second);
        assert_int_equal(fd, -1);
    }
    ASSERT_OK(ops->open_read_named(dir + "/link", &fd));
    ASSERT_OK(ops->close(fd, "link"));
    ASSERT_STATUS(ops->open_read_named(dir + "/link-to-fifo", &fd), SX_ERR_CORRUPT, "it is a FIFO");
    std::string out;
    ASSERT_STATUS(read_file(*ops, dir + "/link", 100, &out), SX_ERR_CORRUPT, "symbolic link");
    ASSERT_OK(read_file(*ops, dir + "/link", 100, &out, /*named=*/true));
    assert_string_equal(out.c_str(), "bytes");
    ::close(sock);
}

// start_writeback is a hint: the bytes, the fsync that follows and the file's size are
// as without it, for a range inside the file, one past its end and an empty one; on a
// descriptor that is not open it does nothing at all.
void test_start_writeback_is_only_a_hint(void **state) {
    const std::string path = dir_of(state) + "/data.bin";
    auto ops = posix_file_ops();
    std::vector<char> a(3 * 4096 + 17);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<char>(i * 13);
    int fd = -1;
    ASSERT_OK(ops->open_write(path, &fd));
    ASSERT_OK(ops->pwrite_all(fd, a.data(), 4096, 0, path));
    ops->start_writeback(fd, 0, 4096);
    ASSERT_OK(ops->pwrite_all(fd, a.data() + 4096, a.size() - 4096, 4096, path));
    ops->start_writeback(fd, 4096, a.size());  // reaches past the end
    ops->start_writeback(fd, 0, 0);
    ASSERT_OK(ops->fsync(fd, path));
    uint64_t size = 0;
    ASSERT_OK(ops->file_size(fd, &size, path));
    assert_int_equal(size, a.size());
    ASSERT_OK(ops->close(fd, path));
    ops->start_writeback(fd, 0, 4096);  // closed now
    ops->start_writeback(-1, 0, 4096);

    std::vector<char> got(a.size());
    ASSERT_OK(ops->open_read(path, &fd));
    ASSERT_OK(ops->pread_all(fd, got.data(), got.size(), 0, path));
    ASSERT_OK(ops->close(fd, path));
    assert_true(got == a);
}

// A directory's lock: held once at a time (another descriptor, here of this process as
// of any other, finds it busy, whether sx's or flock(2)'s own), free again once released;
// a missing path is SX_ERR_NOT_FOUND; the lock follows the directory through a rename.
void test_lock_directory(void **state) {
    const std::string dir = dir_of(state) + "/save.sx-partial";
    auto ops = posix_file_ops();
    ASSERT_OK(ops->mkdir(dir));
    int fd = -1, other = -1;
    FileOps::LockState st = FileOps::LockState::kUnsupported;
    ASSERT_OK(ops->lock_directory(dir, &fd, &st));
    assert_true(st == FileOps::LockState::kHeld);
    assert_true(fd >= 0);
    ASSERT_OK(ops->lock_directory(dir, &other, &st));
    assert_true(st == FileOps::LockState::kBusy);
    assert_int_equal(other, -1);
    // Renamed (a save's commit): still held, under its new name.
    const std::string moved = dir_of(state) + "/save";
    ASSERT_OK(ops->rename(dir, moved));
    ASSERT_OK(ops->lock_directory(moved, &other, &st));
    assert_true(st == FileOps::LockState::kBusy);
    ops->unlock_directory(fd);
    ASSERT_OK(ops->lock_directory(moved, &fd, &st));
    assert_true(st == FileOps::LockState::kHeld);
    ops->unlock_directory(fd);
    // flock(2) by another descriptor, as another process's sx holds it.
    const int raw = ::open(moved.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    assert_true(raw >= 0);
    assert_int_equal(::flock(raw, LOCK_EX | LOCK_NB), 0);
    ASSERT_OK(ops->lock_directory(moved, &fd, &st));
    assert_true(st == FileOps::LockState::kBusy);
    ::close(raw);
    ASSERT_OK(ops->lock_directory(moved, &fd, &st));
    assert_true(st == FileOps::LockState::kHeld);
    ops->unlock_directory(fd);
    ops->unlock_directory(-1);  // nothing held: nothing to do
    sx::Status missing = ops->lock_directory(dir, &fd, &st);
    assert_int_equal(missing.code(), SX_ERR_NOT_FOUND);
    assert_non_null(std::strstr(missing.message().c_str(), dir.c_str()));
    // A fault-injecting FileOps forwards the lock.
    FaultFileOps faults(ops);
    faults.arm(OpKind::kAny, 1, true);
    ASSERT_OK(faults.lock_directory(moved, &fd, &st));
    assert_true(st == FileOps::LockState::kHeld);
    faults.unlock_directory(fd);
}

// The latest modification time of a directory and the entries in it.
void test_latest_change(void **state) {
    const std::string dir = dir_of(state) + "/d";
    auto ops = posix_file_ops();
    ASSERT_OK(ops->mkdir(dir));
    write_whole(dir + "/a", "x");
    write_whole(dir + "/b", "y");
    const struct timespec old_times[2] = {{1000000000, 0}, {1000000000, 0}};  // 2001-09-09
    const struct timespec newer[2] = {{1500000000, 250000000}, {1500000000, 250000000}};
    assert_int_equal(::utimensat(AT_FDCWD, (dir + "/a").c_str(), old_times, 0), 0);
    assert_int_equal(::utimensat(AT_FDCWD, (dir + "/b").c_str(), newer, 0), 0);
    assert_int_equal(::utimensat(AT_FDCWD, dir.c_str(), old_times, 0), 0);
    uint64_t ms = 0;
    ASSERT_OK(ops->latest_change_ms(dir, &ms));
    assert_int_equal(ms, 1500000000250ull);  // b's, the newest
    assert_int_equal(::utimensat(AT_FDCWD, (dir + "/b").c_str(), old_times, 0), 0);
    ASSERT_OK(ops->latest_change_ms(dir, &ms));
    assert_int_equal(ms, 1000000000000ull);
    assert_int_equal(ops->latest_change_ms(dir + "/none", &ms).code(), SX_ERR_NOT_FOUND);
}

}  // namespace

#define T(fn) cmocka_unit_test_setup_teardown(fn, make_temp_dir, remove_temp_dir)

int main() {
    const struct CMUnitTest tests[] = {
        T(test_write_read_roundtrip),
        T(test_read_past_end_is_truncated),
        T(test_open_errors_name_the_path),
        T(test_descriptor_errors_name_the_path),
        T(test_mkdir),
        T(test_rename_replaces),
        T(test_fsync_dir),
        T(test_unlink),
        T(test_list_dir_sorted_without_dots),
        T(test_exists),
        T(test_remove_tree),
        T(test_remove_tree_error_names_the_entry),
        T(test_write_file_atomic),
        T(test_write_file_atomic_failures),
        T(test_write_file_atomic_from_threads_at_once),
        T(test_read_file),
        T(test_start_writeback_is_only_a_hint),
        T(test_open_read_takes_regular_files_only),
        T(test_lock_directory),
        T(test_latest_change),
    };
    return cmocka_run_group_tests(tests, nullptr, nullptr);
}
