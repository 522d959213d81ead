// bench_sx section pipeline: units as a pipeline on a simulated trainer.
//
// Ranks are processes (this program started again once per rank) over tcp://127.0.0.1,
// at 2 and at 4 ranks. The model is 8 units of 1 Mi fp32 each, trained with SGD; each
// unit's forward and backward is a fixed amount of compute, calibrated in the run so
// that the step's total compute equals its total communication (the setting:
// the most an overlap can hide). Two kinds of compute:
//   busy   a dependent chain of integer arithmetic on the rank's thread (a CPU trainer;
//          on this machine the ranks and sx's communication share 2 cores)
//   sleep  the thread sleeps (compute that takes no CPU core, as a device's would)
//
// Per rank count, stage and kind of compute, each timed in the same run, in rotation
// over the repetitions, with every rank starting each variant together; each variant is 4
// steps in a row, each from its backward to the end of the next forward (so that a step's
// background work, deferred gathers and prefetches, is paid for in the block):
//   compute   the trainer's forward and backward alone, no sx call
//   comm+upd  the sx calls of a plain step without compute: the step's communication and
//             the update (stage 3: the gathers around forward and backward too)
//   update    the update alone: sx_step of a 1-rank group holding one rank's shard
//   plain     compute, then sx_step (stage 3: gathers without prefetch, no signals)
//   overl     compute with every unit signalled ready in the backward and the gathers
//             deferred (stages 1-2) or prefetched one unit ahead (stage 3)
// comm = (comm+upd) - update. Goal: overl <= compute + 0.25 comm + update (>= 75% of the
// communication hidden); "hidden" = 1 - (overl - compute - update) / comm. "cpu_floor" is
// the least an overlapped step can take here: compute + update, or the CPU time (user and
// kernel, every thread) that all ranks' compute and sx calls take, over the cores,
// whichever is more; with busy compute on a machine with fewer cores than ranks'
// threads, it is about compute + comm, and nothing can be hidden. Stage 3's peak
// param bytes per rank are reported against 1/W of the model.
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "sx/sx.h"

namespace sxbench {

namespace {

constexpr int kUnits = 8;
constexpr int64_t kUnitNumel = int64_t(1) << 20;
constexpr int kCalibrationReps = 5;
constexpr int kBlock = 4;  // steps timed in a row

void die(const char *what) {
    std::fprintf(stderr, "bench_sx pipeline: %s: %s\n", what, sx_last_error_message());
    std::exit(1);
}

void check(sx_status_t st, const char *what) {
    if (st != SX_OK) die(what);
}

// A dependent chain: one multiply-add and a shift per iteration, nothing the compiler
// can vectorise or drop.
uint64_t spin(uint64_t iters) {
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (uint64_t i = 0; i < iters; ++i) x = (x * 6364136223846793005ull + 1442695040888963407ull) ^ (x >> 29);
    return x;
}
volatile uint64_t g_sink;

struct Compute {
    bool busy = true;
    uint64_t iters = 0;   // busy: per unit per pass
    double seconds = 0;   // sleep: per unit per pass
    void operator()() const {
        if (busy)
            g_sink = spin(iters);
        else
            std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    }
};

sx_shard_group_t *make_group(const std::string &url, int rank, int world, int stage, int prefetch,
                             int64_t unit_numel) {
    return make_sgd_group("pipeline", url, rank, world, stage, prefetch, 0, unit_numel == 1 ? 1 : kUnits, unit_numel);
}

// The trainer's forward: each unit gathered (stage 3; after a deferred step: waited
// for), its compute, released. g null: compute only.
void forward(sx_shard_group_t *g, const Compute *compute) {
    for (int u = 0; u < kUnits; ++u) {
        if (g) check(sx_unit_gather(g, u), "sx_unit_gather");
        if (compute) (*compute)();
        if (g) check(sx_unit_release(g, u), "sx_unit_release");
    }
}

// The trainer's backward, then sx_step. overlap: units signalled ready as their
// gradients are done, and the gather deferred.
void backward_and_step(sx_shard_group_t *g, const Compute *compute, bool overlap) {
    for (int u = kUnits - 1; u >= 0; --u) {
        if (g) check(sx_unit_gather(g, u), "sx_unit_gather");
        if (compute) (*compute)();
        if (g) check(sx_unit_release(g, u), "sx_unit_release");
        if (g && overlap) check(sx_unit_grads_ready(g, u, nullptr), "sx_unit_grads_ready");
    }
    if (!g) return;
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    o.keep_grads = 1;
    o.defer_gather = overlap ? 1 : 0;
    check(sx_step(g, &o, nullptr), "sx_step");
}

// kBlock training steps in a row, each timed from its backward to the end of the next
// forward: a step's background work (deferred gathers, prefetches) ends within the block,
// and its cost is the trainer's as in a run that never stops.
void block(sx_shard_group_t *g, const Compute *compute, bool overlap) {
    for (int k = 0; k < kBlock; ++k) {
        backward_and_step(g, compute, overlap);
        forward(g, compute);
    }
}

// A barrier and a way to hand rank 0's numbers to every rank: a group of one small param.
struct Control {
    sx_shard_group_t *g = nullptr;
    void barrier() const { check(sx_step(g, nullptr, nullptr), "barrier"); }
    // Every rank gets rank 0's `v`.
    double share(double v, int rank) const {
        sx_view_t view;
        sx_view_init(&view, sizeof view);
        check(sx_param_view(g, 0, &view), "sx_param_view");
        float *p = static_cast<float *>(view.data);
        if (rank == 0) p[0] = static_cast<float>(v);
        check(sx_broadcast_params(g, 0), "sx_broadcast_params");
        return p[0];
    }
};

// Median seconds of fn over reps, every rank starting each repetition together.
double timed(const Control &c, int reps, const std::function<void()> &fn) {
    std::vector<double> t;
    for (int r = 0; r < reps; ++r) {
        c.barrier();
        const double t0 = now_seconds();
        fn();
        t.push_back(now_seconds() - t0);
    }
    return median(t);
}

// CPU seconds this process has used (every thread, user and kernel).
double cpu_seconds() {
    rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           1e-6 * static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

struct Row {
    double compute = 0, comm_upd = 0, update = 0, plain = 0, overl = 0;
    // CPU seconds per step of this rank's compute alone and of its sx calls alone.
    double cpu_compute = 0, cpu_comm_upd = 0;
    uint64_t peak = 0;
};

// One stage, one kind of compute: calibrate, then time the variants in rotation.
Row run_stage(const Control &c, int rank, bool busy, int reps, double busy_rate,
              sx_shard_group_t *plain_g, sx_shard_group_t *overl_g, sx_shard_group_t *update_g) {
    Row row;
    const double comm_upd = timed(c, kCalibrationReps, [&] { block(plain_g, nullptr, false); }) / kBlock;
    const double update = timed(c, kCalibrationReps, [&] { block(update_g, nullptr, false); }) / kBlock;
    // Total compute (2 passes of 8 units) = the communication, as rank 0 measured it.
    const double per_unit = c.share((comm_upd - update) / (2.0 * kUnits), rank);
    Compute compute;
    compute.busy = busy;
    compute.seconds = per_unit;
    compute.iters = static_cast<uint64_t>(per_unit * busy_rate);
    std::vector<double> t[5], cpu[5];
    const std::function<void()> variants[5] = {
        [&] { block(nullptr, &compute, false); },
        [&] { block(plain_g, nullptr, false); },
        [&] { block(update_g, nullptr, false); },
        [&] { block(plain_g, &compute, false); },
        [&] { block(overl_g, &compute, true); },
    };
    for (int v = 0; v < 5; ++v) variants[v]();  // once untimed
    for (int r = 0; r < reps; ++r) {
        for (int k = 0; k < 5; ++k) {
            const int v = (r + k) % 5;
            c.barrier();
            const double t0 = now_seconds(), c0 = cpu_seconds();
            variants[v]();
            t[v].push_back((now_seconds() - t0) / kBlock);
            cpu[v].push_back((cpu_seconds() - c0) / kBlock);
        }
    }
    row.cpu_compute = median(cpu[0]);
    row.cpu_comm_upd = median(cpu[1]);
    row.compute = median(t[0]);
    row.comm_upd = median(t[1]);
    row.update = median(t[2]);
    row.plain = median(t[3]);
    row.overl = median(t[4]);
    sx_memory_stats_t m;
    sx_memory_stats_init(&m, sizeof m);
    check(sx_get_memory_stats(overl_g, &m), "sx_get_memory_stats");
    row.peak = m.peak_param_bytes;
    return row;
}

void report(const Row &r, int world, int stage, bool busy, int reps, std::vector<std::string> *json) {
    const double comm = r.comm_upd - r.update;
    const double goal = r.compute + 0.25 * comm + r.update;
    const double hidden = comm > 0 ? 1.0 - (r.overl - r.compute - r.update) / comm : 0.0;
    // The least an overlapped step can take on this machine: its compute and update, or
    // the CPU time every rank's compute and sx calls need, spread over the cores
    // (the ranks are alike, so every rank's is this rank's).
    const double cores = static_cast<double>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
    const double floor = std::max(r.compute + r.update, (r.cpu_compute + r.cpu_comm_upd) * world / cores);
    const char *kind = busy ? "busy" : "sleep";
    std::printf("%5d %5d %-6s %9.1f %9.1f %8.1f %9.1f %9.1f %9.1f %9.1f %10.3f %7.3f\n", world, stage, kind,
                r.compute * 1e3, comm * 1e3, r.update * 1e3, r.plain * 1e3, r.overl * 1e3, goal * 1e3, floor * 1e3,
                r.overl / goal, hidden);
    char line[1024];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"pipeline\",\"ranks\":%d,\"stage\":%d,\"compute\":\"%s\",\"units\":%d,\"unit_numel\":%lld,"
                  "\"reps\":%d,\"compute_ms\":%.3f,\"comm_ms\":%.3f,\"update_ms\":%.3f,\"plain_ms\":%.3f,"
                  "\"overlapped_ms\":%.3f,\"goal_ms\":%.3f,\"cpu_floor_ms\":%.3f,\"ratio_overlapped_over_goal\":%.4f,"
                  "\"ratio_overlapped_over_cpu_floor\":%.4f,\"ratio_plain_over_compute_comm_update\":%.4f,"
                  "\"comm_hidden\":%.4f}",
                  world, stage, kind, kUnits, static_cast<long long>(kUnitNumel), reps, r.compute * 1e3, comm * 1e3,
                  r.update * 1e3, r.plain * 1e3, r.overl * 1e3, goal * 1e3, floor * 1e3, r.overl / goal,
                  r.overl / floor, r.plain / (r.compute + comm + r.update), hidden);
    json->push_back(line);
}

}  // namespace

// One rank of the pipeline section: bench_sx --pipeline-rank R WORLD PORT0 REPS BUSY
int pipeline_rank_main(int argc, char **argv) {
    if (argc != 7) return 2;
    const int rank = std::atoi(argv[2]), world = std::atoi(argv[3]), port0 = std::atoi(argv[4]);
    const int reps = std::atoi(argv[5]);
    const bool busy = std::atoi(argv[6]) != 0;
    auto url = [&](int k) { return "tcp://127.0.0.1:" + std::to_string(port0 + k); };
    Control c;
    c.g = make_group(url(0), rank, world, 2, 0, 1);
    sx_shard_group_t *s2 = make_group(url(1), rank, world, 2, 0, kUnitNumel);
    sx_shard_group_t *s3plain = make_group(url(2), rank, world, 3, SX_PREFETCH_NONE, kUnitNumel);
    sx_shard_group_t *s3 = make_group(url(3), rank, world, 3, 1, kUnitNumel);
    // The update alone: one rank's shard of every unit, in a group of its own.
    const std::string local = "local://bench-pipeline-update-" + std::to_string(::getpid());
    sx_shard_group_t *upd = make_group(local, 0, 1, 2, 0, kUnitNumel / world);

    // The busy loop's speed with every rank spinning at once (the ranks share the cores).
    double rate = 0;
    if (busy) {
        const uint64_t n = 50000000;
        c.barrier();
        const double t0 = now_seconds();
        g_sink = spin(n);
        rate = c.share(static_cast<double>(n) / (now_seconds() - t0), rank);
    }
    const Row r2 = run_stage(c, rank, busy, reps, rate, s2, s2, upd);
    const Row r3 = run_stage(c, rank, busy, reps, rate, s3plain, s3, upd);
    if (rank == 0) {
        std::vector<std::string> json;
        report(r2, world, 2, busy, reps, &json);
        report(r3, world, 3, busy, reps, &json);
        const double model = static_cast<double>(kUnits) * kUnitNumel * sizeof(float);
        const double bound = model / world + 2.0 * kUnitNumel * sizeof(float);  // shards + 1 held + 1 prefetched
        std::printf("%5d     3 %-6s stage 3 peak param bytes %llu = %.3f of the model / %d (bound: shards + 1 unit held"
                    " + 1 prefetched = %.3f)\n",
                    world, busy ? "busy" : "sleep", static_cast<unsigned long long>(r3.peak), r3.peak / (model / world),
                    world, bound / (model / world));
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"pipeline_memory\",\"ranks\":%d,\"stage3_peak_param_bytes\":%llu,"
                      "\"model_bytes_over_ranks\":%.0f,\"ratio\":%.4f,\"bound_ratio\":%.4f}",
                      world, static_cast<unsigned long long>(r3.peak), model / world, r3.peak / (model / world),
                      bound / (model / world));
        json.push_back(line);
        for (const std::string &l : json) std::printf("%s\n", l.c_str());
        std::fflush(stdout);
    }
    c.barrier();
    for (sx_shard_group_t *g : {upd, s3, s3plain, s2, c.g}) sx_destroy_shard_group(g);
    return 0;
}

namespace {

bool run_ranks(int world, int reps, bool busy) {
    const int port0 = free_ports(4);
    if (port0 == 0) return false;
    return run_self(world, [&](int r) {
        return std::vector<std::string>{"--pipeline-rank", std::to_string(r), std::to_string(world),
                                        std::to_string(port0), std::to_string(reps), busy ? "1" : "0"};
    });
}

}  // namespace

int section_pipeline(const Options &opt) {
    std::printf("pipeline: ranks as processes over tcp://127.0.0.1, %d units of %lld fp32, SGD, 1 thread per rank; "
                "compute per unit per pass calibrated so that total compute = total communication; medians of %d "
                "repetitions (ms)\n",
                kUnits, static_cast<long long>(kUnitNumel), opt.reps);
    std::printf("%5s %5s %-6s %9s %9s %8s %9s %9s %9s %9s %10s %7s\n", "ranks", "stage", "comp", "compute", "comm",
                "update", "plain", "overl", "goal", "cpu_floor", "overl/goal", "hidden");
    std::fflush(stdout);
    bool ok = true;
    for (bool busy : {true, false})
        for (int world : {2, 4}) ok = run_ranks(world, opt.reps, busy) && ok;
    if (!ok) std::fprintf(stderr, "bench_sx pipeline: a rank failed\n");
    return ok ? 0 : 1;
}

}  // namespace sxbench
