// bench_sx section regroup: how long a lost rank costs. 4 ranks as processes over tcp://
// on the sx-rendezvous command's store train an AdamW param of --elements (default 4 Mi)
// fp32 elements, having saved a checkpoint; rank 1 is SIGKILLed while they step.
//   regroup   from the SIGKILL to the 3 survivors' first completed step after sx_regroup
//             (which agrees who is in, builds the group of 3, loads the checkpoint
//             resharded): the slowest survivor's
//   restart   the alternative without it: 3 new processes started at once (as a launcher
//             restarting the job would, the moment the loss is noticed), each creating a
//             group, loading the same checkpoint and taking one step: from the start to
//             the slowest one's step
// Each from the checkpoint, and from memory copies (config->memory_copy_interval = 1 and
// 10: every rank copies its shard every 1 or 10 steps, and a flat group's ranks send
// theirs to the next rank; "1w": a flat group's steps also wait until the next rank holds
// the copy, SX_GROUP_MEMORY_COPY_WAIT; the survivors regroup with no checkpoint): then also what the
// copies cost, the step time of the 4 ranks against the run without them, and the bytes
// each rank holds in copies against its shard of the optimizer state.
// Flat (stage 2) and a 2 x 2 mesh (the 3 survivors go on flat), the median of --reps
// rounds (at most 5), with the step time of the 4 ranks before the loss (the mean of
// their first 20 steps, the slowest rank's). Times are on CLOCK_MONOTONIC, which every process of the host
// shares.
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "fixtures.h"
#include "sx/sx.h"

extern char **environ;

namespace sxbench {
namespace {

void fail(const char *what) {
    std::fprintf(stderr, "bench_sx regroup: %s: %s\n", what, sx_last_error_message());
    std::exit(1);
}

sx_shard_group_t *make_adamw(const std::string &url, int rank, int world, int shard_size, int64_t n,
                             int memory_copies = 0, bool wait = false) {
    sx_group_config_t c;
    sx_group_config_init(&c, sizeof c);
    c.backend = SX_BACKEND_CPU;
    c.rendezvous = url.c_str();
    c.rank = rank;
    c.world_size = world;
    c.stage = 2;
    c.num_threads = 1;
    c.shard_size = shard_size;
    c.timeout_ms = 60000;
    c.memory_copy_interval = memory_copies;
    if (wait) c.flags |= SX_GROUP_MEMORY_COPY_WAIT;
    return make_adamw_group(c, n);
}

sx_status_t fill_and_step(sx_shard_group_t *g) {
    sx_view_t v;
    sx_view_init(&v, sizeof v);
    sx_status_t st = sx_grad_view(g, 0, &v);
    if (st != SX_OK) return st;
    std::fill(static_cast<float *>(v.data), static_cast<float *>(v.data) + v.numel, 0.001f);
    return sx_step(g, nullptr, nullptr);
}

bool write_number(const std::string &path, double value) {
    std::ofstream f(path + ".tmp");
    f.precision(17);
    f << value << "\n";
    f.close();
    return f.good() && std::rename((path + ".tmp").c_str(), path.c_str()) == 0;
}

double read_number(const std::string &path) {
    std::ifstream f(path);
    double v = -1;
    return f >> v ? v : -1;
}

pid_t spawn(const std::vector<std::string> &args) {
    std::vector<char *> argv;
    for (const std::string &s : args) argv.push_back(const_cast<char *>(s.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    return posix_spawn(&pid, args[0].c_str(), nullptr, nullptr, argv.data(), environ) == 0 ? pid : -1;
}

bool wait_for_file(const std::string &path, double seconds) {
    const double until = now_seconds() + seconds;
    while (now_seconds() < until) {
        if (access(path.c_str(), F_OK) == 0) return true;
        usleep(1000);
    }
    return false;
}

}  // namespace

// One rank: bench_sx --regroup-rank MODE R WORLD URL SHARD_SIZE ELEMENTS DIR
//   MODE run: save DIR/ckpt (rank 0 waits for it), step until a step fails, writing
//     DIR/ready.R after the first steps and DIR/step_ms.R; then sx_regroup from DIR/ckpt
//     and one step, writing DIR/done.R (the time it completed).
//   MODE memory1, memory1w, memory10: the same with memory copies every 1 or 10 steps (1w:
//     each waited for), regrouping
//     without a checkpoint; also DIR/copy_ratio.R: the bytes in copies / the optimizer
//     state's.
//   MODE restart: create, load DIR/ckpt, one step, write DIR/done.R.
int regroup_rank_main(int argc, char **argv) {
    if (argc != 9) return 2;
    const std::string mode = argv[2], url = argv[5], dir = argv[8];
    const int rank = std::atoi(argv[3]), world = std::atoi(argv[4]), shard_size = std::atoi(argv[6]);
    const int64_t n = std::strtoll(argv[7], nullptr, 10);
    const std::string me = "." + std::to_string(rank);
    // memory1w: every step, and each step waits until the next rank holds its copy.
    const int interval = mode == "memory1" || mode == "memory1w" ? 1 : mode == "memory10" ? 10 : 0;
    const bool memory = interval > 0;
    sx_shard_group_t *g = make_adamw(url, rank, world, shard_size, n, interval, mode == "memory1w");
    const std::string ckpt = dir + "/ckpt";
    if (mode == "restart") {
        sx_load_options_t lo;
        sx_load_optim_state_options_init(&lo, sizeof lo);
        lo.path = ckpt.c_str();
        if (sx_load_optim_state(g, &lo) != SX_OK) fail("sx_load_optim_state");
        if (fill_and_step(g) != SX_OK) fail("the step after the restart");
        write_number(dir + "/done" + me, now_seconds());
        sx_destroy_shard_group(g);
        return 0;
    }
    if (fill_and_step(g) != SX_OK) fail("the first step");
    sx_save_options_t so;
    sx_save_options_init(&so, sizeof so);
    so.path = ckpt.c_str();
    so.synchronous = 1;
    sx_future_t *f = nullptr;
    if (sx_save_optim_state(g, &so, &f) != SX_OK || sx_future_wait(f, -1) != SX_OK) fail("the save");
    sx_future_destroy(f);
    std::vector<double> ms;
    sx_status_t st = SX_OK;
    for (int s = 0; st == SX_OK; ++s) {
        const double t0 = now_seconds();
        st = fill_and_step(g);
        if (st == SX_OK) ms.push_back((now_seconds() - t0) * 1e3);
        if (s == 19) {
            double sum = 0;
            for (double v : ms) sum += v;
            write_number(dir + "/step_ms" + me, sum / static_cast<double>(ms.size()));
            sx_memory_stats_t m;
            sx_memory_stats_init(&m, sizeof m);
            if (sx_get_memory_stats(g, &m) != SX_OK) fail("sx_get_memory_stats");
            write_number(dir + "/copy_ratio" + me,
                         static_cast<double>(m.memory_copy_bytes) / static_cast<double>(m.optimizer_bytes));
            write_number(dir + "/ready" + me, 1);
        }
    }
    sx_regroup_options_t ro;
    sx_regroup_options_init(&ro, sizeof ro);
    ro.checkpoint = memory ? nullptr : ckpt.c_str();
    ro.expected_world_size = world - 1;
    ro.join_window_ms = 30000;
    sx_regroup_result_t rr;
    sx_regroup_result_init(&rr, sizeof rr);
    if (sx_regroup(g, &ro, &rr) != SX_OK) fail("sx_regroup");
    if (rr.from_memory != (memory ? 1 : 0)) fail("the regroup's state came from elsewhere than asked");
    if (fill_and_step(g) != SX_OK) fail("the step after the regroup");
    write_number(dir + "/done" + me, now_seconds());
    sx_destroy_shard_group(g);
    return 0;
}

namespace {

struct Figures {
    double regroup_s = -1, restart_s = -1, step_ms = -1, copy_ratio = 0;
};

// One round: the 4-rank run losing rank 1, then the restart of 3.
// interval: 0 = from the checkpoint; -1 = memory copies every step, each waited for.
Figures run_round(int shard_size, int64_t n, int interval) {
    Figures out;
    char tmpl[] = "/tmp/sx-bench-regroup-XXXXXX";
    if (!mkdtemp(tmpl)) return out;
    const std::string dir = tmpl;
    const int port = free_ports(1);
    const pid_t server = spawn({SX_RENDEZVOUS_PATH, "--port", std::to_string(port), "--bind", "127.0.0.1"});
    const std::string url = "tcp://127.0.0.1:" + std::to_string(port) + "?server=external";
    std::vector<pid_t> ranks;
    for (int r = 0; r < 4; ++r)
        ranks.push_back(spawn({"/proc/self/exe", "--regroup-rank",
                               interval < 0 ? std::string("memory1w")
                                            : interval ? "memory" + std::to_string(interval) : "run",
                               std::to_string(r), "4", url,
                               std::to_string(shard_size), std::to_string(n), dir}));
    bool ready = server > 0;
    for (int r = 0; r < 4 && ready; ++r) ready = wait_for_file(dir + "/ready." + std::to_string(r), 120);
    double killed = -1;
    if (ready) {
        killed = now_seconds();
        kill(ranks[1], SIGKILL);
    }
    bool ok = ready;
    for (int r = 0; r < 4; ++r) {
        int status = 0;
        if (!ok) kill(ranks[r], SIGKILL);
        waitpid(ranks[r], &status, 0);
        if (r != 1 && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) ok = false;
    }
    if (ok) {
        double done = 0, step = 0;
        for (int r : {0, 2, 3}) done = std::max(done, read_number(dir + "/done." + std::to_string(r)));
        for (int r = 0; r < 4; ++r) step = std::max(step, read_number(dir + "/step_ms." + std::to_string(r)));
        for (int r = 0; r < 4; ++r)
            out.copy_ratio = std::max(out.copy_ratio, read_number(dir + "/copy_ratio." + std::to_string(r)));
        out.regroup_s = done - killed;
        out.step_ms = step;
        // The restart: 3 new processes on a new rendezvous, loading the same checkpoint.
        const std::string fresh = "tcp://127.0.0.1:" + std::to_string(free_ports(1));
        const double start = now_seconds();
        std::vector<pid_t> again;
        for (int r = 0; r < 3; ++r) {
            std::remove((dir + "/done." + std::to_string(r)).c_str());
            again.push_back(spawn({"/proc/self/exe", "--regroup-rank", "restart", std::to_string(r), "3", fresh, "0",
                                   std::to_string(n), dir}));
        }
        bool restarted = true;
        for (pid_t p : again) {
            int status = 0;
            waitpid(p, &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) restarted = false;
        }
        double last = 0;
        for (int r = 0; r < 3 && restarted; ++r) last = std::max(last, read_number(dir + "/done." + std::to_string(r)));
        if (restarted) out.restart_s = last - start;
    }
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, nullptr, 0);
    }
    const std::string rm = "rm -rf '" + dir + "'";
    if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "bench_sx regroup: could not remove %s\n", dir.c_str());
    return out;
}

}  // namespace

int section_regroup(const Options &opt) {
    const int64_t n = opt.elements == (size_t(64) << 20) ? int64_t(4) << 20 : static_cast<int64_t>(opt.elements);
    const int rounds = std::min(opt.reps, 5);
    std::printf("regroup: 4 ranks as processes over tcp:// (sx-rendezvous's store), AdamW on %lld fp32 elements; "
                "rank 1 SIGKILLed while stepping. regroup: from the kill to the 3 survivors' first step after "
                "sx_regroup (from the checkpoint, or from memory copies kept every 1 or 10 steps); restart: 3 new "
                "processes "
                "creating a group, loading the checkpoint and stepping; step_vs_off: the 4 ranks' step with the "
                "copies against without; copy_bytes: a rank's copies / its optimizer state. Median of %d rounds\n",
                static_cast<long long>(n), rounds);
    std::printf("%8s %11s %10s %10s %10s %16s %12s %11s\n", "mesh", "state_from", "step_ms", "regroup_s", "restart_s",
                "regroup/restart", "step_vs_off", "copy_bytes");
    std::vector<std::string> json;
    for (int shard_size : {0, 2}) {
        double step_off = 0;
        for (int interval : {0, 1, -1, 10}) {
            if (interval < 0 && shard_size) continue;  // a mesh sends no copy to wait for
            std::vector<double> regroup, restart, step, ratio;
            for (int k = 0; k < rounds; ++k) {
                const Figures f = run_round(shard_size, n, interval);
                if (f.regroup_s < 0 || f.restart_s < 0) {
                    std::printf("%8s (the ranks failed)\n", shard_size ? "2x2" : "flat");
                    return 1;
                }
                regroup.push_back(f.regroup_s);
                restart.push_back(f.restart_s);
                step.push_back(f.step_ms);
                ratio.push_back(f.copy_ratio);
            }
            const double rg = median(regroup), rs = median(restart), st = median(step), cr = median(ratio);
            if (!interval) step_off = st;
            const char *mesh = shard_size ? "2x2" : "flat";
            const std::string from_text = interval < 0 ? "memory/1w" : interval ? "memory/" + std::to_string(interval)
                                                                                  : "checkpoint";
            const char *from = from_text.c_str();
            std::printf("%8s %11s %10.1f %10.3f %10.3f %16.3f %12.3f %11.2f\n", mesh, from, st, rg, rs, rg / rs,
                        st / step_off, cr);
            char line[640];
            std::snprintf(line, sizeof line,
                          "{\"bench\":\"regroup\",\"mesh\":\"%s\",\"state_from\":\"%s\",\"elements\":%lld,"
                          "\"rounds\":%d,\"step_ms\":%.3f,\"regroup_s\":%.4f,\"restart_s\":%.4f,"
                          "\"regroup_vs_restart\":%.3f,\"step_vs_off\":%.3f,\"copy_bytes_vs_optimizer\":%.3f}",
                          mesh, from, static_cast<long long>(n), rounds, st, rg, rs, rg / rs, st / step_off, cr);
            json.push_back(line);
        }
    }
    for (const std::string &j : json) std::printf("%s\n", j.c_str());
    return 0;
}

}  // namespace sxbench
