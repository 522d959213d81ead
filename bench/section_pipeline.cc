// bench_sx section pipeline: units as a pipeline on a simulated trainer. Two ranks
// (threads, local://) train 8 units of 1 Mi fp32 each with SGD; each unit's forward and
// backward is a sleep of a fixed time (compute that does not take a CPU core, as a
// device's would). A plain step (backward, then sx_step reduces, updates and gathers
// everything) is timed against an overlapped one (each unit signalled ready in the
// backward, the all-gather deferred and waited for unit by unit in the next forward), in
// alternation on the same group; stage 3 (every unit gathered around its forward and
// backward, prefetch depth 1) is timed against stage 3 without signals or prefetch.
// Figures: the overlapped step time over the plain one, and how much of the plain step's
// communication (its time beyond the compute) the overlap hides; stage 3's peak param
// bytes over stage 2's.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "sx/sx.h"

namespace sxbench {

namespace {

constexpr int kUnits = 8;
constexpr int64_t kUnitNumel = int64_t(1) << 20;
constexpr int kComputeMs = 4;  // per unit, forward and backward each

void compute() { std::this_thread::sleep_for(std::chrono::milliseconds(kComputeMs)); }

struct Rank {
    sx_shard_group_t *g = nullptr;
    ~Rank() { sx_destroy_shard_group(g); }
};

bool make(const std::string &url, int rank, int stage, int prefetch, Rank *out) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.rendezvous = url.c_str();
    cfg.rank = rank;
    cfg.world_size = 2;
    cfg.stage = stage;
    cfg.num_threads = 1;
    cfg.prefetch_depth = prefetch;
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_SGD);
    pg.lr = 1e-3;
    if (sx_create_shard_group(&cfg, &out->g) != SX_OK || sx_add_param_group(out->g, &pg, nullptr) != SX_OK) return false;
    for (int u = 0; u < kUnits; ++u) {
        const std::string name = "layer" + std::to_string(u);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = &kUnitNumel;
        d.unit = u;
        if (sx_add_param(out->g, &d, nullptr) != SX_OK) return false;
    }
    return sx_finalize(out->g) == SX_OK;
}

// One training step of the simulated trainer; overlap: signals and deferred gathers.
sx_status_t train_step(sx_shard_group_t *g, bool overlap) {
    sx_status_t st = SX_OK;
    for (int u = 0; u < kUnits && st == SX_OK; ++u) {
        st = sx_unit_gather(g, u);  // stage 3: gathers; after a deferred step: waits
        compute();
        if (st == SX_OK) st = sx_unit_release(g, u);
    }
    for (int u = kUnits - 1; u >= 0 && st == SX_OK; --u) {
        st = sx_unit_gather(g, u);
        compute();
        if (st == SX_OK) st = sx_unit_release(g, u);
        if (st == SX_OK && overlap) st = sx_unit_grads_ready(g, u, nullptr);
    }
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    o.keep_grads = 1;
    o.defer_gather = overlap ? 1 : 0;
    return st == SX_OK ? sx_step(g, &o, nullptr) : st;
}

}  // namespace

int section_pipeline(const Options &opt) {
    PairTimes t12, t3;
    uint64_t peak[2] = {0, 0};
    bool ok[2] = {true, true};
    std::vector<std::thread> ranks;
    for (int r = 0; r < 2; ++r) {
        ranks.emplace_back([&, r] {
            Rank s2, s3plain, s3;
            if (!make("local://bench-pipe-s2", r, 2, 0, &s2) ||
                !make("local://bench-pipe-s3p", r, 3, SX_PREFETCH_NONE, &s3plain) ||
                !make("local://bench-pipe-s3", r, 3, 1, &s3)) {
                ok[r] = false;
                return;
            }
            sx_status_t st = SX_OK;
            PairTimes a = time_pair([&] { st |= train_step(s2.g, false); }, [&] { st |= train_step(s2.g, true); }, opt.reps);
            PairTimes b = time_pair([&] { st |= train_step(s3plain.g, false); }, [&] { st |= train_step(s3.g, true); }, opt.reps);
            sx_memory_stats_t m2, m3;
            sx_memory_stats_init(&m2, sizeof m2);
            sx_memory_stats_init(&m3, sizeof m3);
            sx_get_memory_stats(s2.g, &m2);
            sx_get_memory_stats(s3.g, &m3);
            if (st != SX_OK) {
                std::fprintf(stderr, "bench pipeline: a step failed: %s\n", sx_last_error_message());
                ok[r] = false;
            }
            if (r == 0) {
                t12 = a;
                t3 = b;
                peak[0] = m2.peak_param_bytes;
                peak[1] = m3.peak_param_bytes;
            }
        });
    }
    for (auto &t : ranks) t.join();
    if (!ok[0] || !ok[1]) return 1;
    const double compute_s = 2.0 * kUnits * kComputeMs * 1e-3;
    std::printf("pipeline: 2 ranks (threads), %d units of %lld fp32, SGD; compute %d ms per unit per pass "
                "(a sleep), %.0f ms per step; ratio = median over reps of overlapped / plain step time\n",
                kUnits, static_cast<long long>(kUnitNumel), kComputeMs, compute_s * 1e3);
    std::printf("%-34s %9s %9s %7s %13s %14s\n", "variant", "plain_ms", "overl_ms", "ratio", "ratio_of_mins",
                "comm_hidden");
    const struct {
        const char *name, *key;
        const PairTimes *t;
    } rows[] = {{"stage 2: signals + deferred gather", "stage2", &t12},
                {"stage 3: + prefetch 1 (vs none)", "stage3", &t3}};
    std::vector<std::string> json;
    for (const auto &row : rows) {
        const double ratio = row.t->paired_ratio(), mins = row.t->min_b() / row.t->min_a();
        // The plain step's time beyond its compute is exposed communication and update;
        // the share of it the overlapped step no longer shows.
        const double hidden = 1.0 - (row.t->min_b() - compute_s) / (row.t->min_a() - compute_s);
        std::printf("%-34s %9.1f %9.1f %7.3f %13.3f %14.3f\n", row.name, row.t->min_a() * 1e3, row.t->min_b() * 1e3,
                    ratio, mins, hidden);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"pipeline\",\"variant\":\"%s\",\"units\":%d,\"unit_numel\":%lld,\"reps\":%d,"
                      "\"compute_ms\":%.1f,\"plain_ms\":%.3f,\"overlapped_ms\":%.3f,\"ratio_overlapped_over_plain\":%.4f,"
                      "\"ratio_of_mins\":%.4f,\"comm_hidden\":%.4f}",
                      row.key, kUnits, static_cast<long long>(kUnitNumel), opt.reps, compute_s * 1e3,
                      row.t->min_a() * 1e3, row.t->min_b() * 1e3, ratio, mins, hidden);
        json.push_back(line);
    }
    std::printf("peak param bytes on rank 0: stage 2 %llu, stage 3 %llu (%.3f of stage 2's)\n",
                static_cast<unsigned long long>(peak[0]), static_cast<unsigned long long>(peak[1]),
                static_cast<double>(peak[1]) / static_cast<double>(peak[0]));
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"pipeline_memory\",\"stage2_peak_param_bytes\":%llu,\"stage3_peak_param_bytes\":%llu,"
                  "\"ratio\":%.4f}",
                  static_cast<unsigned long long>(peak[0]), static_cast<unsigned long long>(peak[1]),
                  static_cast<double>(peak[1]) / static_cast<double>(peak[0]));
    json.push_back(line);
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
