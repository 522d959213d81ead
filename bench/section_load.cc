// bench_sx section load: a resharding load through the public API against reading the
// same bytes as one plain file, as torch.load reads a state saved by torch.save
// (docs/conventions.md, "Tests and measurements").
//
//   load_2to1_cold, load_2to1_warm, load_4to2_cold, load_4to2_warm
//     a checkpoint saved by F ranks, loaded by F/2: sx_load_optim_state, the slower rank
//     timed, against each loading rank reading the bytes it loads from one file of its
//     own in one read() call, two ways: into new memory (malloc, faulted in by the read),
//     as torch.load reads a file's records into the new tensors it returns; and into
//     memory faulted in before (the read alone: a ceiling no loader that returns new
//     tensors reaches). "cold": the page cache is dropped before every run of each side
//     (posix_fadvise(DONTNEED) on the fsynced files, checked with mincore); "warm": every
//     file is in the page cache. Goal: the load at least as fast as the read into new
//     memory (read time / load time >= 1). bench/torch_load.py times torch.load itself
//     against sx_load_optim_state.
//
// The state is one AdamW param of E fp32 elements (values and two optimizer states, 12
// bytes an element in the files; --ckpt-mib sets 12*E). Each loading rank has one thread
// in its pool (2 for a single rank); the loads run on threads of one process over
// local://. Files go to a mkdtemp directory under --ckpt-dir, removed at the end.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "bench_util.h"
#include "fixtures.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

// Writes the concatenation of `parts` into `path` and fsyncs it (so that its pages are
// clean and can be dropped from the page cache).
void concatenate(const std::vector<std::string> &parts, const std::string &path) {
    const int out = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    check_sys(out >= 0, "open " + path);
    std::vector<char> buf(size_t(16) << 20);
    for (const std::string &part : parts) {
        const int in = ::open(part.c_str(), O_RDONLY | O_CLOEXEC);
        check_sys(in >= 0, "open " + part);
        for (;;) {
            const ssize_t rc = ::read(in, buf.data(), buf.size());
            check_sys(rc >= 0, "read " + part);
            if (rc == 0) break;
            check_sys(::write(out, buf.data(), static_cast<size_t>(rc)) == rc, "write " + path);
        }
        ::close(in);
    }
    check_sys(::fsync(out) == 0, "fsync " + path);
    check_sys(::close(out) == 0, "close " + path);
}

// A peer: the whole file by one read() call into `into` (its size), as torch.load reads
// a record into its storage.
void read_one_file(const std::string &path, char *into, size_t size) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    check_sys(fd >= 0, "open " + path);
    for (size_t off = 0; off < size;) {
        const ssize_t rc = ::read(fd, into + off, size - off);
        check_sys(rc > 0, "read " + path);
        off += static_cast<size_t>(rc);
    }
    ::close(fd);
}

struct Case {
    int from, to;
    bool cold;
    PairTimes fresh, faulted;  // a: the plain read into new / faulted-in memory, b: the load (the same)
    double worst_resident = 0;
    uint64_t rank_bytes = 0;  // what one loading rank reads
    std::string name() const {
        return "load_" + std::to_string(from) + "to" + std::to_string(to) + (cold ? "_cold" : "_warm");
    }
};

// Times case c's load and plain reads, in rotation, reps + 1 times (the first untimed).
void run_case(Case &c, const std::string &saved, const std::vector<std::string> &one_files, size_t n, int reps,
              const std::string &url) {
    std::vector<std::string> drop;
    shard_bytes(saved, &drop);
    drop.push_back(saved + "/MANIFEST");
    for (const std::string &f : one_files) drop.push_back(f);
    Barrier barrier(c.to);
    std::vector<double> rank_s(static_cast<size_t>(c.to), 0);
    auto rank_main = [&](int r) {
        sx_shard_group_t *g = make_group(url, r, c.to, c.to == 1 ? 2 : 1, n, false);
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = saved.c_str();
        const std::string &mine = one_files[static_cast<size_t>(r)];
        const size_t size = static_cast<size_t>(std::filesystem::file_size(mine));
        HostBuffer into;
        if (!into.allocate(size, "plain read's destination").ok()) die("cannot allocate the plain read's memory");
        std::memset(into.data(), 0, size);  // faulted in before every read into it
        auto timed = [&](std::vector<double> *times, const std::function<void()> &fn) {
            if (r == 0 && c.cold)
                for (const std::string &f : drop) c.worst_resident = std::max(c.worst_resident, drop_cache(f));
            barrier.wait();
            const double t0 = now_seconds();
            fn();
            rank_s[static_cast<size_t>(r)] = now_seconds() - t0;
            barrier.wait();
            if (r == 0 && times) times->push_back(max_of(rank_s.data(), c.to));
        };
        std::vector<double> load_s, fresh_s, faulted_s;
        for (int it = 0; it <= reps; ++it) {
            for (int k = 0; k < 3; ++k) {
                const int side = (it + k) % 3;
                if (side == 0) {
                    timed(it ? &load_s : nullptr, [&] { check(sx_load_optim_state(g, &lo), "sx_load_optim_state"); });
                } else if (side == 1) {
                    timed(it ? &faulted_s : nullptr, [&] { read_one_file(mine, into.as<char>(), size); });
                } else {
                    char *fresh = nullptr;
                    timed(it ? &fresh_s : nullptr, [&] {
                        fresh = static_cast<char *>(std::malloc(size));
                        if (!fresh) die("cannot allocate the plain read's new memory");
                        read_one_file(mine, fresh, size);
                    });
                    std::free(fresh);
                }
            }
        }
        if (r == 0) c.fresh = {fresh_s, load_s}, c.faulted = {faulted_s, load_s};
        if (r == 0) c.rank_bytes = size;
        sx_destroy_shard_group(g);
    };
    std::vector<std::thread> ts;
    for (int r = 0; r < c.to; ++r) ts.emplace_back(rank_main, r);
    for (std::thread &t : ts) t.join();
}

}  // namespace

int section_load(const Options &opt) {
    // Elements: a multiple of 4096, so that 4 and 2 ranks split it without padding.
    const size_t n = (opt.ckpt_mib << 20) / 12 / 4096 * 4096;
    if (n == 0) die("--ckpt-mib is too small");
    std::string tmpl = opt.ckpt_dir + "/sx-loadbench-XXXXXX";
    check_sys(::mkdtemp(&tmpl[0]) != nullptr, "mkdtemp " + tmpl);
    g_root = tmpl;
    const std::string root = g_root, url = "local://bench-load-" + std::to_string(::getpid());

    std::vector<Case> cases;
    for (int from : {2, 4}) {
        const std::string saved = root + "/saved-by-" + std::to_string(from);
        {
            std::vector<std::thread> ts;
            for (int r = 0; r < from; ++r)
                ts.emplace_back([&, r] {
                    sx_shard_group_t *g = make_group(url + "-save-" + std::to_string(from), r, from, 1, n, true);
                    save(g, saved, true, nullptr);
                    sx_destroy_shard_group(g);
                });
            for (std::thread &t : ts) t.join();
        }
        std::vector<std::string> files;
        shard_bytes(saved, &files);
        if (files.size() != static_cast<size_t>(from)) die("the save did not make one shard file per rank");
        // Loading rank r of from/2 owns what saving ranks 2r and 2r+1 saved: its one file
        // holds the same bytes.
        std::vector<std::string> one_files;
        for (int r = 0; r < from / 2; ++r) {
            one_files.push_back(root + "/one-file-" + std::to_string(from) + "-" + std::to_string(r) + ".bin");
            concatenate({files[static_cast<size_t>(2 * r)], files[static_cast<size_t>(2 * r + 1)]}, one_files.back());
        }
        for (bool cold : {true, false}) {
            Case c{from, from / 2, cold, {}, {}, 0, 0};
            run_case(c, saved, one_files, n, opt.reps,
                     url + "-load-" + std::to_string(from) + (cold ? "-cold" : "-warm"));
            cases.push_back(std::move(c));
        }
    }
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
    if (ec) die("removing " + root + ": " + ec.message());
    g_root.clear();

    std::printf("load: one AdamW param of %zu fp32 elements, %.1f MiB in the files (values + 2 states); the slower "
                "loading rank against each rank reading its bytes from one file; medians of %d repetitions "
                "(per-rep ratios); under %s\n",
                n, n * 12.0 / 1048576.0, opt.reps, opt.ckpt_dir.c_str());
    std::printf("%-16s %-22s %-24s %8s %-24s %8s %8s\n", "figure", "sx_load_optim_state", "read into new memory",
                "ratio", "read into faulted-in", "ratio", "goal");
    // A ratio is the load's speed over the read's: the read's time over the load's.
    for (const Case &c : cases) {
        const double gb = c.rank_bytes / 1e9;
        char a[64], b[64], f[64];
        std::snprintf(a, sizeof a, "%.1f ms %.2f GB/s", median(c.fresh.b) * 1e3, gb / median(c.fresh.b));
        std::snprintf(b, sizeof b, "%.1f ms %.2f GB/s", median(c.fresh.a) * 1e3, gb / median(c.fresh.a));
        std::snprintf(f, sizeof f, "%.1f ms %.2f GB/s", median(c.faulted.a) * 1e3, gb / median(c.faulted.a));
        std::printf("%-16s %-22s %-24s %8.3f %-24s %8.3f %8s\n", c.name().c_str(), a, b, 1.0 / c.fresh.paired_ratio(), f,
                    1.0 / c.faulted.paired_ratio(), ">= 1.0");
    }
    double worst = 0;
    for (const Case &c : cases) worst = std::max(worst, c.worst_resident);
    std::printf("  cold: page cache dropped before every run of each side; at most %.1f%% of the pages stayed "
                "resident (mincore)\n",
                worst * 100);
    for (const Case &c : cases)
        std::printf("{\"bench\":\"load\",\"figure\":\"%s\",\"from_ranks\":%d,\"to_ranks\":%d,\"page_cache\":\"%s\","
                    "\"rank_bytes\":%llu,\"reps\":%d,\"load_ms\":%.3f,\"read_new_memory_ms\":%.3f,\"ratio\":%.4f,"
                    "\"ratio_of_mins\":%.4f,\"read_faulted_memory_ms\":%.3f,\"ratio_faulted\":%.4f,"
                    "\"max_resident_after_drop\":%.4f,\"goal_min\":1.0}\n",
                    c.name().c_str(), c.from, c.to, c.cold ? "cold" : "warm",
                    static_cast<unsigned long long>(c.rank_bytes), opt.reps, median(c.fresh.b) * 1e3,
                    median(c.fresh.a) * 1e3, 1.0 / c.fresh.paired_ratio(), c.fresh.min_a() / c.fresh.min_b(),
                    median(c.faulted.a) * 1e3, 1.0 / c.faulted.paired_ratio(), c.worst_resident);
    return 0;
}

}  // namespace sxbench
