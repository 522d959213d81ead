// bench_sx section param_sums: the step of an optimizer that needs per-param sums over the
// ranks (LAMB: its trust ratio's norms) against AdamW's on the same model, at 2 and 4
// ranks (threads of this process over local://, one pool thread each): the slower rank's
// step time, the two groups stepped alternately. Beside it, the bytes a rank exchanges
// per step for the sums (one all-gather of 16 bytes per LAMB param and rank) against the
// gradients' reduce-scatter, and the state bytes per element per rank.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "fixtures.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

// `count` square params of rows x rows elements, one unit, one param group of `optimizer`.
sx_shard_group_t *model(const std::string &url, int rank, int world, int32_t optimizer, int count, int64_t rows) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.rendezvous = url.c_str();
    cfg.rank = rank;
    cfg.world_size = world;
    cfg.num_threads = 1;
    cfg.backend = SX_BACKEND_CPU;
    cfg.timeout_ms = 600000;
    sx_shard_group_t *g = nullptr;
    check(sx_create_shard_group(&cfg, &g), "sx_create_shard_group");
    sx_param_group_desc_t pd;
    sx_param_group_desc_init(&pd, sizeof pd, optimizer);
    pd.weight_decay = 0.01;
    check(sx_add_param_group(g, &pd, nullptr), "sx_add_param_group");
    const int64_t shape[2] = {rows, rows};
    for (int k = 0; k < count; ++k) {
        const std::string name = "w" + std::to_string(k);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 2;
        d.shape = shape;
        check(sx_add_param(g, &d, nullptr), "sx_add_param");
    }
    check(sx_finalize(g), "sx_finalize");
    for (int k = 0; k < count; ++k) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        check(sx_param_view(g, k, &v), "sx_param_view");
        fill(v, 1.0f);
        check(sx_grad_view(g, k, &v), "sx_grad_view");
        fill(v, 0.1f);
    }
    return g;
}

// The slower rank's step times of an AdamW group (a) and a LAMB group (b) over the same
// model, alternating which goes first.
PairTimes steps(int world, int count, int64_t rows, int reps) {
    PairTimes t;
    Barrier barrier(world);
    std::vector<double> rank_s(static_cast<size_t>(world), 0.0);
    const std::string base = "local://bench-param-sums-" + std::to_string(::getpid()) + "-" + std::to_string(world);
    auto rank_main = [&](int r) {
        sx_shard_group_t *adamw = model(base + "-adamw", r, world, SX_OPTIM_ADAMW, count, rows);
        sx_shard_group_t *lamb = model(base + "-lamb", r, world, SX_OPTIM_LAMB, count, rows);
        sx_step_options_t keep;
        sx_step_options_init(&keep, sizeof keep);
        keep.keep_grads = 1;
        for (int it = 0; it <= reps; ++it)
            for (int k = 0; k < 2; ++k) {
                const bool lamb_side = (k == 0) == (it % 2 == 0);
                barrier.wait();
                const double t0 = now_seconds();
                check(sx_step(lamb_side ? lamb : adamw, &keep, nullptr), "sx_step");
                rank_s[static_cast<size_t>(r)] = now_seconds() - t0;
                barrier.wait();
                if (r == 0 && it > 0) (lamb_side ? t.b : t.a).push_back(max_of(rank_s.data(), world));
            }
        sx_destroy_shard_group(lamb);
        sx_destroy_shard_group(adamw);
    };
    std::vector<std::thread> others;
    for (int r = 1; r < world; ++r) others.emplace_back(rank_main, r);
    rank_main(0);
    for (std::thread &th : others) th.join();
    return t;
}

}  // namespace

int section_param_sums(const Options &opt) {
    // 16 params of 512 x 512: 4 Mi elements, 16 MiB of fp32 gradients.
    const int count = 16;
    const int64_t rows = 512;
    const double elements = static_cast<double>(count) * static_cast<double>(rows * rows);
    std::printf("param_sums: sx_step with LAMB (per-param norms summed over the ranks) vs AdamW on the same model "
                "(%d params of %lld x %lld, one unit, fp32, keep_grads), ranks as threads over local://, one pool "
                "thread each; ratio = median over reps of LAMB's step time / AdamW's (the slower rank's)\n",
                count, static_cast<long long>(rows), static_cast<long long>(rows));
    std::printf("%6s %11s %10s %8s %16s %18s %12s\n", "ranks", "adamw_ms", "lamb_ms", "ratio", "sums_bytes/rank",
                "reduce_scatter_b/r", "bytes_ratio");
    std::vector<std::string> json;
    for (int world : {2, 4}) {
        const PairTimes t = steps(world, count, rows, opt.reps);
        // Per rank and step: the all-gather of every rank's 2 doubles per LAMB param
        // (received from the world - 1 others), against the reduce-scatter of the fp32
        // gradients (the world - 1 shards it sends).
        const double sums = 16.0 * count * (world - 1);
        const double scatter = 4.0 * elements * (world - 1) / world;
        std::printf("%6d %11.3f %10.3f %8.3f %16.0f %18.0f %12.2e\n", world, t.min_a() * 1e3, t.min_b() * 1e3,
                    t.paired_ratio(), sums, scatter, sums / scatter);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"param_sums\",\"optimizer\":\"Lamb\",\"ranks\":%d,\"elements\":%.0f,\"params\":%d,"
                      "\"reps\":%d,\"adamw_ms\":%.4f,\"lamb_ms\":%.4f,\"ratio_lamb_vs_adamw\":%.4f,"
                      "\"sums_bytes_per_rank\":%.0f,\"reduce_scatter_bytes_per_rank\":%.0f}",
                      world, elements, count, opt.reps, t.min_a() * 1e3, t.min_b() * 1e3, t.paired_ratio(), sums,
                      scatter);
        json.push_back(line);
    }
    std::printf("state per element per rank: LAMB 8 bytes / world (exp_avg, exp_avg_sq: Adam's), AdamW the same\n");
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
