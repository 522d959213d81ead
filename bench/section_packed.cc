// bench_sx section packed: what the packed layout (alignment 4 for fp32: each param starts
// where the one before ends, sx_unit_view's one block) costs a step against the default
// alignment of 64 bytes. One rank, 2 pool threads, AdamW over 64 params of odd sizes
// (about --elements in all) in one unit, so that nearly every packed param and segment
// starts off a vector boundary; the two groups' steps (keep_grads) are timed in rotation
// in the same run, and the figure is the median over repetitions of packed / aligned.
#include <unistd.h>

#include <string>
#include <vector>

#include "bench_util.h"
#include "sx/sx.h"

namespace sxbench {
namespace {

constexpr int kParams = 64;

sx_shard_group_t *make_layout_group(const std::string &url, int32_t alignment, size_t elements) {
    auto check = [](sx_status_t st, const char *what) {
        if (st == SX_OK) return;
        std::fprintf(stderr, "bench_sx packed: %s: %s\n", what, sx_last_error_message());
        std::exit(1);
    };
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    cfg.backend = SX_BACKEND_CPU;
    cfg.rendezvous = url.c_str();
    cfg.rank = 0;
    cfg.world_size = 1;
    cfg.num_threads = 2;
    cfg.alignment = alignment;
    sx_shard_group_t *g = nullptr;
    check(sx_create_shard_group(&cfg, &g), "sx_create_shard_group");
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    check(sx_add_param_group(g, &pg, nullptr), "sx_add_param_group");
    const int64_t base = static_cast<int64_t>(elements / kParams) | 1;  // odd
    for (int p = 0; p < kParams; ++p) {
        const std::string name = "p" + std::to_string(p);
        const int64_t n = base + 2 * ((p * 37) % 61);  // odd sizes, all different
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = &n;
        check(sx_add_param(g, &d, nullptr), "sx_add_param");
    }
    check(sx_finalize(g), "sx_finalize");
    for (int p = 0; p < kParams; ++p) {
        sx_view_t pv, gv;
        sx_view_init(&pv, sizeof pv);
        sx_view_init(&gv, sizeof gv);
        check(sx_param_view(g, p, &pv), "sx_param_view");
        check(sx_grad_view(g, p, &gv), "sx_grad_view");
        for (uint64_t i = 0; i < pv.numel; ++i) {
            static_cast<float *>(pv.data)[i] = 0.001f * static_cast<float>((i * 7 + p) % 1000);
            static_cast<float *>(gv.data)[i] = 0.0001f * static_cast<float>((i * 13 + p) % 997) - 0.05f;
        }
    }
    return g;
}

}  // namespace

int section_packed(const Options &opt) {
    const std::string pid = std::to_string(::getpid());
    sx_shard_group_t *aligned = make_layout_group("local://bench-packed-64-" + pid, 0, opt.elements);
    sx_shard_group_t *packed = make_layout_group("local://bench-packed-4-" + pid, 4, opt.elements);
    sx_step_options_t keep;
    sx_step_options_init(&keep, sizeof keep);
    keep.keep_grads = 1;
    sx_status_t st = SX_OK;
    const PairTimes t = time_pair([&] { st |= sx_step(aligned, &keep, nullptr); },
                                  [&] { st |= sx_step(packed, &keep, nullptr); }, opt.reps);
    if (st != SX_OK) std::fprintf(stderr, "bench_sx packed: sx_step: %s\n", sx_last_error_message());
    sx_destroy_shard_group(aligned);
    sx_destroy_shard_group(packed);
    if (st != SX_OK) return 1;
    std::printf("packed: sx_step (1 rank, 2 threads, AdamW, %d params of odd sizes, %zu elements, keep_grads), "
                "alignment 4 (packed) vs 64 (the default); %d reps in rotation\n",
                kParams, opt.elements, opt.reps);
    std::printf("%-12s %10s %10s %7s %13s\n", "layout", "aligned_ms", "packed_ms", "ratio", "ratio_of_mins");
    std::printf("%-12s %10.2f %10.2f %7.3f %13.3f\n", "packed/64", median(t.a) * 1e3, median(t.b) * 1e3,
                t.paired_ratio(), t.min_b() / t.min_a());
    std::printf("{\"bench\":\"packed_layout\",\"params\":%d,\"elements\":%zu,\"reps\":%d,\"aligned_ms\":%.3f,"
                "\"packed_ms\":%.3f,\"ratio_packed_over_aligned\":%.4f,\"ratio_of_mins\":%.4f}\n",
                kParams, opt.elements, opt.reps, median(t.a) * 1e3, median(t.b) * 1e3, t.paired_ratio(),
                t.min_b() / t.min_a());
    return 0;
}

}  // namespace sxbench
