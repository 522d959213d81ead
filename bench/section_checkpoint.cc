// bench_sx section checkpoint: saving and loading through the public API, each figure
// against a peer measured in the same run (docs/conventions.md, "Tests and measurements").
//
//   save_blocking     how long sx_save_optim_state blocks its caller when asynchronous,
//                     against a synchronous save of the same state (goal <= 0.05)
//   persist           shard-file bytes / synchronous save time, against a plain
//                     sequential write + fsync of the same bytes to a file in the same
//                     directory (goal >= 0.9)
//   load_reshard      saved by 4 ranks, loaded by 2: sx_load_optim_state (slower rank)
//                     against 2 threads each reading half of the same files
//                     sequentially, page cache dropped before both (goal >= 0.85)
//   step_during_save  time per sx_step while a save persists, against without
//   save_memory       peak RSS growth during a save, against the state's size
//   first_save        a fresh group's first asynchronous save's blocking time, against its
//                     second's, with the staging reserved at sx_finalize and without (goal
//                     <= 1.2 reserved)
//
// The state is one AdamW param of E fp32 elements: its values and two optimizer states,
// 12 bytes an element in the files; --ckpt-mib sets 12*E. Figures 1, 2, 4 and 5 use
// one rank with 2 threads, so the whole state is one shard file. Files go to a mkdtemp
// directory under --ckpt-dir (default /tmp), removed at the end.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "bench_util.h"
#include "fixtures.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

constexpr size_t kWritePiece = size_t(64) << 20;  // the plain writer's pieces (sx writes 64 MiB ones)

// The peer of a synchronous save: `bytes` from memory to a new file, sequentially in
// kWritePiece pieces, fsync, close (as sx writes its shard file). Returns seconds.
double plain_write(const std::string &path, const char *data, size_t bytes) {
    const double t0 = now_seconds();
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    check_sys(fd >= 0, "open " + path);
    for (size_t off = 0; off < bytes;) {
        const ssize_t rc = ::pwrite(fd, data + off, std::min(kWritePiece, bytes - off), static_cast<off_t>(off));
        check_sys(rc > 0, "write " + path);
        off += static_cast<size_t>(rc);
    }
    check_sys(::fsync(fd) == 0, "fsync " + path);
    check_sys(::close(fd) == 0, "close " + path);
    const double t = now_seconds() - t0;
    remove_tree(path);
    return t;
}

// ------------------------------------------------------------------ memory (RSS)

// A field of /proc/self/status in KiB (VmRSS, VmHWM), or -1.
long status_kib(const char *field) {
    std::ifstream in("/proc/self/status");
    std::string line;
    const size_t n = std::strlen(field);
    while (std::getline(in, line))
        if (line.compare(0, n, field) == 0 && line.size() > n && line[n] == ':') return std::atol(line.c_str() + n + 1);
    return -1;
}

// Resets VmHWM to the current RSS (proc(5), /proc/PID/clear_refs); false if refused.
bool reset_peak_rss() {
    const int fd = ::open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool ok = ::write(fd, "5", 1) == 1;
    ::close(fd);
    return ok;
}

// Samples VmRSS every millisecond on its own thread while alive: a second opinion on
// VmHWM, and the only one where clear_refs is refused.
class RssSampler {
  public:
    RssSampler() : thread_([this] {
          while (!stop_.load()) {
              max_kib_ = std::max(max_kib_.load(), status_kib("VmRSS"));
              std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
      }) {}
    long stop() {
        stop_ = true;
        thread_.join();
        return max_kib_;
    }

  private:
    std::atomic<bool> stop_{false};
    std::atomic<long> max_kib_{0};
    std::thread thread_;
};

struct MemoryFigure {
    double before_mib = 0, peak_mib = 0, after_mib = 0;
    bool hwm = false;  // peak from VmHWM (reset by clear_refs) as well as from sampling
};

MemoryFigure save_memory(sx_shard_group_t *g, const std::string &path) {
    MemoryFigure m;
    m.before_mib = status_kib("VmRSS") / 1024.0;
    m.hwm = reset_peak_rss();
    RssSampler sampler;
    save(g, path, false, nullptr);
    long peak = sampler.stop();
    if (m.hwm) peak = std::max(peak, status_kib("VmHWM"));
    m.peak_mib = peak / 1024.0;
    m.after_mib = status_kib("VmRSS") / 1024.0;
    return m;
}

}  // namespace

int section_checkpoint(const Options &opt) {
    const int reps = opt.reps;
    // Elements: a multiple of 4096, so that 4 and 2 ranks split it without padding.
    const size_t n = (opt.ckpt_mib << 20) / 12 / 4096 * 4096;
    if (n == 0) die("--ckpt-mib is too small");
    std::string tmpl = opt.ckpt_dir + "/sx-ckbench-XXXXXX";
    check_sys(::mkdtemp(&tmpl[0]) != nullptr, "mkdtemp " + tmpl);
    g_root = tmpl;
    const std::string root = g_root;
    int serial = 0;
    auto fresh = [&](const char *what) { return root + "/" + what + "-" + std::to_string(++serial); };
    const std::string url = "local://bench-ckpt-" + std::to_string(::getpid());

    // ---- one rank, 2 threads: figures 5, 1, 2, 4
    sx_shard_group_t *g = make_group(url + "-1", 0, 1, 2, n, true);

    // 5. Peak memory: the first save allocates its staging; later ones reuse it.
    std::string dir = fresh("mem");
    const MemoryFigure mem_first = save_memory(g, dir);
    const uint64_t file_bytes = shard_bytes(dir, nullptr);
    remove_tree(dir);
    dir = fresh("mem");
    const MemoryFigure mem_later = save_memory(g, dir);
    remove_tree(dir);
    const double state_mib = file_bytes / 1048576.0;

    // 1 and 2. Each repetition runs an asynchronous save, a synchronous one and the plain
    // write, in an order that reverses every other repetition; the first is dropped.
    HostBuffer source;
    if (!source.allocate(file_bytes, "plain write source").ok()) die("cannot allocate the plain write's source");
    std::memset(source.data(), 0x5a, file_bytes);
    std::vector<double> blocked, async_total, synced, plain;
    for (int r = 0; r <= reps; ++r) {
        double b = 0, at = 0, st = 0, pw = 0;
        for (int k = 0; k < 3; ++k) {
            const int which = r % 2 ? 2 - k : k;
            if (which == 0) {
                dir = fresh("async");
                b = save(g, dir, false, &at);
            } else if (which == 1) {
                dir = fresh("sync");
                st = save(g, dir, true, nullptr);
            } else {
                pw = plain_write(root + "/plain.bin", source.as<char>(), file_bytes);
                continue;
            }
            remove_tree(dir);
        }
        if (r == 0) continue;
        blocked.push_back(b), async_total.push_back(at), synced.push_back(st), plain.push_back(pw);
    }
    source.reset();
    PairTimes f1{synced, blocked}, f2{synced, plain};

    // 6. A fresh group's first asynchronous save against its second, with the staging
    // reserved at sx_finalize (SX_GROUP_RESERVE_CHECKPOINT_STAGING) and without: the
    // first save of a group without it allocates and faults in its staging.
    PairTimes first_plain, first_reserved;
    for (int r = 0; r < reps; ++r) {
        for (bool reserve : {false, true}) {
            const std::string u = url + "-first-" + std::to_string(r) + (reserve ? "-reserved" : "-plain");
            sx_shard_group_t *f = make_group(u, 0, 1, 2, n, true, reserve ? SX_GROUP_RESERVE_CHECKPOINT_STAGING : 0);
            double blocked_s[2];
            for (int k = 0; k < 2; ++k) {
                dir = fresh(k ? "second" : "first");
                blocked_s[k] = save(f, dir, false, nullptr);
                remove_tree(dir);
            }
            PairTimes &into = reserve ? first_reserved : first_plain;
            into.a.push_back(blocked_s[1]);  // later
            into.b.push_back(blocked_s[0]);  // first
            sx_destroy_shard_group(f);
        }
    }

    // 4. Steps with a save in flight vs without: "with" runs steps from the return of an
    // asynchronous save until it completes; "without" as many steps with nothing else.
    sx_step_options_t keep;
    sx_step_options_init(&keep, sizeof keep);
    keep.keep_grads = 1;
    int steps_per_save = 8;
    std::vector<double> step_alone, step_with, persist_with;
    for (int r = 0; r <= reps; ++r) {
        double alone = 0, with = 0, pers = 0;
        for (int k = 0; k < 2; ++k) {
            if ((k == 0) == (r % 2 == 0)) {
                dir = fresh("steps");
                sx_save_options_t o;
                sx_save_options_init(&o, sizeof o);
                o.path = dir.c_str();
                sx_future_t *f = nullptr;
                check(sx_save_optim_state(g, &o, &f), "sx_save_optim_state");
                const double t0 = now_seconds();
                int steps = 0, done = 0;
                for (;;) {
                    check(sx_future_poll(f, &done), "sx_future_poll");
                    if (done) break;
                    check(sx_step(g, &keep, nullptr), "sx_step");
                    ++steps;
                }
                pers = now_seconds() - t0;
                if (sx_future_wait(f, -1) != SX_OK) die(std::string("save failed: ") + sx_future_error_message(f));
                sx_future_destroy(f);
                remove_tree(dir);
                if (steps == 0) die("the save completed before one step: make --ckpt-mib larger");
                with = pers / steps;
                steps_per_save = steps;
            } else {
                const double t0 = now_seconds();
                for (int s = 0; s < steps_per_save; ++s) check(sx_step(g, &keep, nullptr), "sx_step");
                alone = (now_seconds() - t0) / steps_per_save;
            }
        }
        if (r == 0) continue;
        step_alone.push_back(alone), step_with.push_back(with), persist_with.push_back(pers);
    }
    PairTimes f4{step_alone, step_with};
    sx_destroy_shard_group(g);

    // ---- 3. Save with 4 ranks, load into 2: the same state, resharded.
    const std::string saved = root + "/reshard-4";
    {
        std::vector<std::thread> ts;
        for (int r = 0; r < 4; ++r)
            ts.emplace_back([&, r] {
                sx_shard_group_t *g4 = make_group(url + "-4", r, 4, 1, n, true);
                save(g4, saved, true, nullptr);
                sx_destroy_shard_group(g4);
            });
        for (std::thread &t : ts) t.join();
    }
    std::vector<std::string> files;
    const uint64_t load_bytes = shard_bytes(saved, &files);
    if (files.size() != 4) die("the 4-rank save did not make 4 shard files");
    std::vector<std::string> drop = files;
    drop.push_back(saved + "/MANIFEST");
    std::vector<double> load_s, read_s;
    double worst_resident = 0;
    {
        Barrier barrier(2);
        double rank_s[2] = {0, 0};
        auto rank_main = [&](int r) {
            sx_shard_group_t *g2 = make_group(url + "-2", r, 2, 1, n, false);
            sx_load_options_t lo;
            sx_load_optim_state_options_init(&lo, sizeof lo);
            lo.path = saved.c_str();
            // Rank r of 2 owns the half that ranks 2r and 2r+1 of 4 saved.
            const std::vector<std::string> mine = {files[2 * r], files[2 * r + 1]};
            std::vector<char> buf;
            auto timed = [&](std::vector<double> *into, const std::function<void()> &fn) {
                if (r == 0)
                    for (const std::string &f : drop) worst_resident = std::max(worst_resident, drop_cache(f));
                barrier.wait();
                const double t0 = now_seconds();
                fn();
                rank_s[r] = now_seconds() - t0;
                barrier.wait();
                if (r == 0 && into) into->push_back(max_of(rank_s, 2));
            };
            for (int it = 0; it <= reps; ++it) {
                for (int side = 0; side < 2; ++side) {
                    if ((side == 0) == (it % 2 == 0)) {
                        timed(it ? &load_s : nullptr, [&] { check(sx_load_optim_state(g2, &lo), "sx_load_optim_state"); });
                    } else {
                        timed(it ? &read_s : nullptr, [&] { plain_read(mine, &buf); });
                    }
                }
            }
            sx_destroy_shard_group(g2);
        };
        std::vector<std::thread> ts;
        for (int r = 0; r < 2; ++r) ts.emplace_back(rank_main, r);
        for (std::thread &t : ts) t.join();
    }
    PairTimes f3{load_s, read_s};
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
    if (ec) die("removing " + root + ": " + ec.message());
    g_root.clear();

    // ---- report
    const double gb = file_bytes / 1e9, lgb = load_bytes / 1e9;
    const double r1 = f1.paired_ratio(), r2 = f2.paired_ratio(), r3 = f3.paired_ratio(), r4 = f4.paired_ratio();
    const double extra_first = mem_first.peak_mib - mem_first.before_mib;
    const double extra_later = mem_later.peak_mib - mem_later.before_mib;
    const char *peak_how = mem_first.hwm && mem_later.hwm ? "VmHWM reset by clear_refs, and VmRSS sampled every 1 ms"
                                                          : "VmRSS sampled every 1 ms (clear_refs refused)";
    std::printf("checkpoint: one AdamW param of %zu fp32 elements, %.1f MiB in the shard files (values + 2 states); "
                "figures 1, 2, 4, 5 on 1 rank with 2 threads; medians of %d repetitions (per-rep ratios); under %s\n",
                n, state_mib, reps, opt.ckpt_dir.c_str());
    std::printf("%-17s %-34s %-38s %8s %8s\n", "figure", "sx", "peer", "ratio", "goal");
    char a[64], b[64];
    std::snprintf(a, sizeof a, "async call blocks %.1f ms", median(blocked) * 1e3);
    std::snprintf(b, sizeof b, "synchronous save %.1f ms", median(synced) * 1e3);
    std::printf("%-17s %-34s %-38s %8.3f %8s\n", "save_blocking", a, b, r1, "<= 0.05");
    std::snprintf(a, sizeof a, "sync save %.2f GB/s", gb / median(synced));
    std::snprintf(b, sizeof b, "plain write+fsync %.2f GB/s", gb / median(plain));
    std::printf("%-17s %-34s %-38s %8.3f %8s\n", "persist", a, b, r2, ">= 0.9");
    std::snprintf(a, sizeof a, "load 4->2 %.1f ms (%.2f GB/s)", median(load_s) * 1e3, lgb / median(load_s));
    std::snprintf(b, sizeof b, "2 threads read %.1f ms (%.2f GB/s)", median(read_s) * 1e3, lgb / median(read_s));
    std::printf("%-17s %-34s %-38s %8.3f %8s\n", "load_reshard", a, b, r3, ">= 0.85");
    std::snprintf(a, sizeof a, "step %.2f ms, save in flight", median(step_with) * 1e3);
    std::snprintf(b, sizeof b, "step %.2f ms, alone", median(step_alone) * 1e3);
    std::printf("%-17s %-34s %-38s %8.3f %8s\n", "step_during_save", a, b, r4, "");
    std::snprintf(a, sizeof a, "first blocks %.1f ms, reserved", median(first_reserved.b) * 1e3);
    std::snprintf(b, sizeof b, "second blocks %.1f ms", median(first_reserved.a) * 1e3);
    std::printf("%-17s %-34s %-38s %8.3f %8s\n", "first_save", a, b, first_reserved.paired_ratio(), "<= 1.2");
    std::snprintf(a, sizeof a, "first blocks %.1f ms, not reserved", median(first_plain.b) * 1e3);
    std::snprintf(b, sizeof b, "second blocks %.1f ms", median(first_plain.a) * 1e3);
    std::printf("%-17s %-34s %-38s %8.3f %8s\n", "", a, b, first_plain.paired_ratio(), "");
    std::snprintf(a, sizeof a, "first save +%.1f MiB", extra_first);
    std::snprintf(b, sizeof b, "state %.1f MiB", state_mib);
    std::printf("%-17s %-34s %-38s %8.3f %8s\n", "save_memory", a, b, extra_first / state_mib, "");
    std::snprintf(a, sizeof a, "later saves +%.1f MiB", extra_later);
    std::printf("%-17s %-34s %-38s %8.3f %8s\n", "", a, b, extra_later / state_mib, "");
    std::printf("  persist: the save's background part took %.1f ms alone, %.1f ms with steps running\n",
                median(async_total) * 1e3 - median(blocked) * 1e3, median(persist_with) * 1e3);
    std::printf("  load_reshard: page cache dropped before every run of both sides with posix_fadvise(DONTNEED) "
                "on the fsynced files; at most %.1f%% of their pages stayed resident (mincore)\n",
                worst_resident * 100);
    std::printf("  save_memory: peak from %s; RSS after the first save +%.1f MiB (staging kept for reuse)\n", peak_how,
                mem_first.after_mib - mem_first.before_mib);

    std::printf("{\"bench\":\"checkpoint\",\"figure\":\"first_save\",\"reps\":%d,\"reserved_first_ms\":%.3f,"
                "\"reserved_second_ms\":%.3f,\"reserved_ratio\":%.4f,\"plain_first_ms\":%.3f,\"plain_second_ms\":%.3f,"
                "\"plain_ratio\":%.4f,\"goal_max\":1.2}\n",
                reps, median(first_reserved.b) * 1e3, median(first_reserved.a) * 1e3, first_reserved.paired_ratio(),
                median(first_plain.b) * 1e3, median(first_plain.a) * 1e3, first_plain.paired_ratio());
    std::printf("{\"bench\":\"checkpoint\",\"figure\":\"save_blocking\",\"elements\":%zu,\"file_bytes\":%llu,"
                "\"reps\":%d,\"async_blocked_ms\":%.3f,\"sync_save_ms\":%.3f,\"ratio\":%.4f,\"ratio_of_mins\":%.4f,"
                "\"goal_max\":0.05}\n",
                n, static_cast<unsigned long long>(file_bytes), reps, median(blocked) * 1e3, median(synced) * 1e3, r1,
                f1.min_b() / f1.min_a());
    std::printf("{\"bench\":\"checkpoint\",\"figure\":\"persist\",\"file_bytes\":%llu,\"reps\":%d,\"sync_save_ms\":%.3f,"
                "\"plain_write_fsync_ms\":%.3f,\"sx_gb_s\":%.3f,\"plain_gb_s\":%.3f,\"ratio\":%.4f,"
                "\"ratio_of_mins\":%.4f,\"goal_min\":0.9}\n",
                static_cast<unsigned long long>(file_bytes), reps, median(synced) * 1e3, median(plain) * 1e3,
                gb / median(synced), gb / median(plain), r2, f2.min_b() / f2.min_a());
    std::printf("{\"bench\":\"checkpoint\",\"figure\":\"load_reshard\",\"from_ranks\":4,\"to_ranks\":2,\"bytes\":%llu,"
                "\"reps\":%d,\"load_ms\":%.3f,\"plain_read_ms\":%.3f,\"ratio\":%.4f,\"ratio_of_mins\":%.4f,"
                "\"page_cache\":\"posix_fadvise_dontneed\",\"max_resident_after_drop\":%.4f,\"goal_min\":0.85}\n",
                static_cast<unsigned long long>(load_bytes), reps, median(load_s) * 1e3, median(read_s) * 1e3, r3,
                f3.min_b() / f3.min_a(), worst_resident);
    std::printf("{\"bench\":\"checkpoint\",\"figure\":\"step_during_save\",\"elements\":%zu,\"reps\":%d,"
                "\"step_alone_ms\":%.3f,\"step_with_save_ms\":%.3f,\"ratio\":%.4f,\"persist_alone_ms\":%.3f,"
                "\"persist_with_steps_ms\":%.3f}\n",
                n, reps, median(step_alone) * 1e3, median(step_with) * 1e3, r4,
                (median(async_total) - median(blocked)) * 1e3, median(persist_with) * 1e3);
    std::printf("{\"bench\":\"checkpoint\",\"figure\":\"save_memory\",\"state_mib\":%.1f,\"first_save_extra_mib\":%.1f,"
                "\"first_save_fraction\":%.4f,\"later_save_extra_mib\":%.1f,\"later_save_fraction\":%.4f,"
                "\"retained_mib\":%.1f,\"peak_from\":\"%s\"}\n",
                state_mib, extra_first, extra_first / state_mib, extra_later, extra_later / state_mib,
                mem_first.after_mib - mem_first.before_mib, mem_first.hwm && mem_later.hwm ? "vmhwm+sampled" : "sampled");
    return 0;
}

}  // namespace sxbench
