// bench_sx section norm_domain: what a norm domain adds to a step (sx_step.h,
// docs/model-parallel.md). Four ranks as threads over local:// (shared memory), laid out
// as TP = 2 x DP = 2: each tensor-parallel slice a data-parallel group of 2 ranks, SGD on
// 3 units of `numel` fp32, every step clipped (max_grad_norm 1e-3, so the norm is taken
// before the update). Two kinds, timed the same way: the two groups stepping alone
// ("alone": each clips by its own slice's norm), and the same groups joined to one domain
// of the 4 ranks ("joined"). Per kind, every rank takes 20 untimed steps and then reps x
// 50 timed ones; the median over repetitions of rank 0's time per step is reported, with
// the ratio joined / alone, and the collectives each rank starts per step (counted over
// every communicator: deterministic, where the times are not). The bytes a domain adds
// per step and rank are its all-gather's: 8 doubles out, 8 x 4 in.
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "comm/communicator.h"

namespace sxbench {
namespace {

constexpr int kUnits = 3, kTP = 2, kDP = 2, kWarm = 20, kSteps = 50;

bool timed(bool joined, int64_t numel, int reps, std::vector<double> *per_step, double *exchanges) {
    const int world = kTP * kDP;
    const std::string base = "local://bench-norm-domain-" + std::to_string(numel) + (joined ? "-joined" : "-alone");
    Barrier barrier(world);
    std::vector<std::vector<double>> times(world);
    std::vector<int> ok(world, 0);
    uint64_t started = 0, ended = 0;
    std::vector<std::thread> ranks;
    for (int r = 0; r < world; ++r)
        ranks.emplace_back([&, r] {
            const int t = r % kTP, d = r / kTP;
            sx_shard_group_t *g = make_sgd_group("norm_domain", base + "-dp" + std::to_string(t), d, kDP, 2, 0, 0,
                                                 kUnits, numel);
            sx_norm_domain_t *domain = nullptr;
            bool good = true;
            if (joined) {
                sx_group_config_t c;
                sx_group_config_init(&c, sizeof c);
                const std::string url = base + "-domain";
                c.rendezvous = url.c_str();
                c.rank = r;
                c.world_size = world;
                c.num_threads = 1;
                c.timeout_ms = 120000;
                good = sx_create_norm_domain(&c, &domain) == SX_OK && sx_join_norm_domain(g, domain, t) == SX_OK;
            }
            sx_step_options_t so;
            sx_step_options_init(&so, sizeof so);
            so.max_grad_norm = 1e-3;
            auto steps = [&](int n) {
                for (int s = 0; s < n && good; ++s) {
                    sx_view_t v;
                    sx_view_init(&v, sizeof v);
                    for (int u = 0; u < kUnits && good; ++u) {
                        good = sx_grad_view(g, u, &v) == SX_OK;
                        if (good) static_cast<float *>(v.data)[0] = 1.0f + static_cast<float>(r);
                    }
                    good = good && sx_step(g, &so, nullptr) == SX_OK;
                }
            };
            steps(kWarm);
            barrier.wait();
            if (r == 0) started = sx::comm::collectives_started();
            for (int rep = 0; rep < reps; ++rep) {
                barrier.wait();
                const double t0 = now_seconds();
                steps(kSteps);
                times[r].push_back((now_seconds() - t0) / kSteps);
            }
            barrier.wait();
            if (r == 0) ended = sx::comm::collectives_started();
            if (!good) std::fprintf(stderr, "norm_domain rank %d: %s\n", r, sx_last_error_message());
            ok[r] = good;
            sx_destroy_shard_group(g);
            sx_destroy_norm_domain(domain);
        });
    for (std::thread &t : ranks) t.join();
    *per_step = times[0];
    *exchanges = static_cast<double>(ended - started) / (double(world) * kSteps * reps);
    for (int v : ok)
        if (!v) return false;
    return true;
}

}  // namespace

int section_norm_domain(const Options &opt) {
    std::printf("norm_domain: 4 ranks (threads, local://) as TP=2 x DP=2, SGD on %d units, clipping; %d reps of %d "
                "steps; median over reps of rank 0's time per step, joined to a norm domain / the groups alone\n",
                kUnits, opt.reps, kSteps);
    std::printf("%-10s %12s %12s %8s %16s %16s %14s\n", "numel", "alone us", "joined us", "ratio", "exch/step alone",
                "exch/step joined", "domain B/rank");
    std::vector<std::string> json;
    for (int64_t numel : {int64_t(1) << 10, int64_t(1) << 18}) {
        std::vector<double> a, j;
        double ea = 0.0, ej = 0.0;
        if (!timed(false, numel, opt.reps, &a, &ea) || !timed(true, numel, opt.reps, &j, &ej)) return 1;
        const double ma = median(a), mj = median(j);
        const int bytes = 8 * 8 * (1 + kTP * kDP);  // 8 doubles out, every rank's 8 in
        std::printf("%-10lld %12.1f %12.1f %8.3f %16.2f %16.2f %14d\n", static_cast<long long>(numel), ma * 1e6,
                    mj * 1e6, mj / ma, ea, ej, bytes);
        char line[360];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"norm_domain\",\"numel_per_unit\":%lld,\"units\":%d,\"reps\":%d,\"alone_us\":%.2f,"
                      "\"joined_us\":%.2f,\"ratio_joined_vs_alone\":%.3f,\"exchanges_per_step_alone\":%.2f,"
                      "\"exchanges_per_step_joined\":%.2f,\"domain_bytes_per_rank\":%d}",
                      static_cast<long long>(numel), kUnits, opt.reps, ma * 1e6, mj * 1e6, mj / ma, ea, ej, bytes);
        json.push_back(line);
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
