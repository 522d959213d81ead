// bench_sx section step: sx_step with one rank against the fused kernel alone, in fp32
// and with bf16 params (mixed precision); and at two ranks, the default step (which
// zeroes the gradients) against keep_grads.
#include <unistd.h>

#include <cstring>

#include <algorithm>
#include <thread>
#include <vector>

#include "base/half.h"
#include "bench_util.h"
#include "fixtures.h"
#include "optim/kernels.h"
#include "optim/optimizer.h"
#include "optim/thread_pool.h"
#include "sx/sx.h"

namespace sxbench {

using sx::optim::Isa;
using sx::optim::Segment;
using sx::optim::ThreadPool;

// ------------------------------------------------------------------------- step

// sx_step on one rank (no communication) against the fused kernel alone on buffers of
// the same size with the same pool size: what the step adds around the kernel
// (argument and mask checks, segment building, dispatch). keep_grads leaves the
// gradients in place, as a trainer whose backward overwrites them would; the default
// step also zeroes them, one more pass of writes over the gradients, reported apart.
#define STEP_CHECK(call)                                                                      \
    do {                                                                                      \
        if ((call) != SX_OK) {                                                                \
            std::fprintf(stderr, "bench step: %s failed: %s\n", #call, sx_last_error_message()); \
            sx_destroy_shard_group(g);                                                        \
            return 1;                                                                         \
        }                                                                                     \
    } while (0)

// Two ranks (threads of this process over local://, one pool thread each), one AdamW
// param of n elements: the slower rank's time of the default step (which zeroes the
// gradients) and of a keep_grads step, alternating; a = keep_grads, b = default.
PairTimes two_rank_zeroing(size_t n, int reps) {
    PairTimes t;
    Barrier barrier(2);
    double rank_s[2] = {0, 0};
    const std::string url = "local://bench-step-2-" + std::to_string(::getpid());
    auto rank_main = [&](int r) {
        sx_shard_group_t *g = make_group(url, r, 2, 1, n, false);
        sx_step_options_t keep;
        sx_step_options_init(&keep, sizeof keep);
        keep.keep_grads = 1;
        for (int it = 0; it <= reps; ++it) {
            for (int k = 0; k < 2; ++k) {
                const bool keep_side = (k == 0) == (it % 2 == 0);
                barrier.wait();
                const double t0 = now_seconds();
                check(sx_step(g, keep_side ? &keep : nullptr, nullptr), "sx_step");
                rank_s[r] = now_seconds() - t0;
                barrier.wait();
                if (r == 0 && it > 0) (keep_side ? t.a : t.b).push_back(max_of(rank_s, 2));
            }
        }
        sx_destroy_shard_group(g);
    };
    std::thread other(rank_main, 1);
    rank_main(0);
    other.join();
    return t;
}

int section_step(const Options &opt) {
    const int threads = 2;
    sx_shard_group_t *g = make_group("local://bench-step", 0, 1, threads, opt.elements, false);
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    sx_view_t pv, gv;
    sx_view_init(&pv, sizeof pv);
    sx_view_init(&gv, sizeof gv);
    STEP_CHECK(sx_param_view(g, 0, &pv));
    STEP_CHECK(sx_grad_view(g, 0, &gv));

    Streams s;
    if (!s.allocate(opt.elements)) {
        sx_destroy_shard_group(g);
        return 1;
    }
    std::memcpy(pv.data, s.param.data(), opt.elements * sizeof(float));
    std::memcpy(gv.data, s.grad.data(), opt.elements * sizeof(float));
    sx::optim::Hyper h;
    h.kind = sx::optim::Kind::kAdamW;
    h.lr = pg.lr;
    h.weight_decay = pg.weight_decay;
    Segment seg = s.adamw_segment(&h, opt.elements);
    ThreadPool pool(threads);
    auto kernel = [&] {
        ++seg.step;
        double sumsq = 0.0;
        sx::optim::fused_update(&seg, 1, 1.0f, &pool, Isa::kAuto, &sumsq);
    };
    sx_step_options_t keep;
    sx_step_options_init(&keep, sizeof keep);
    keep.keep_grads = 1;
    sx_status_t st = SX_OK;
    auto step_keep = [&] { st |= sx_step(g, &keep, nullptr); };
    auto step_zero = [&] {
        st |= sx_step(g, nullptr, nullptr);
    };
    const PairTimes a = time_pair(kernel, step_keep, opt.reps);
    const PairTimes b = time_pair(kernel, step_zero, opt.reps);
    STEP_CHECK(st);
    sx_destroy_shard_group(g);

    // Mixed precision: bf16 params with fp32 masters, bf16 or fp32 gradients, against the
    // same fp32 kernel. The step also widens bf16 gradients into fp32 (a pass) and rounds
    // the masters into the bf16 params (another): the figure is what those passes cost.
    PairTimes mixed[2];
    const int32_t grad_dtypes[2] = {0, SX_DTYPE_F32};
    for (int k = 0; k < 2; ++k) {
        g = make_group(k ? "local://bench-step-bf16-f32" : "local://bench-step-bf16", 0, 1, threads, opt.elements,
                       false, 0, SX_DTYPE_BF16, grad_dtypes[k]);
        mixed[k] = time_pair(kernel, step_keep, opt.reps);
        STEP_CHECK(st);
        sx_destroy_shard_group(g);
    }

    std::printf("step: sx_step (1 rank, AdamW, %zu elements, %d threads, fp32 unless said) vs the fp32 fused "
                "kernel alone on the same sizes; ratio = median over reps of step time / kernel time\n",
                opt.elements, threads);
    std::printf("%-22s %10s %9s %7s %13s\n", "variant", "kernel_ms", "step_ms", "ratio", "ratio_of_mins");
    std::vector<std::string> json;
    const struct {
        const char *name;
        const PairTimes *t;
    } rows[] = {{"keep_grads", &a},
                {"zero_grads (default)", &b},
                {"bf16 params+grads", &mixed[0]},
                {"bf16 params, fp32 grads", &mixed[1]}};
    for (const auto &r : rows) {
        const double ratio = r.t->paired_ratio(), mins = r.t->min_b() / r.t->min_a();
        std::printf("%-22s %10.2f %9.2f %7.3f %13.3f\n", r.name, r.t->min_a() * 1e3, r.t->min_b() * 1e3,
                    ratio, mins);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"step_vs_kernel\",\"variant\":\"%s\",\"threads\":%d,\"elements\":%zu,"
                      "\"reps\":%d,\"kernel_ms\":%.3f,\"step_ms\":%.3f,\"ratio_step_over_kernel\":%.4f,"
                      "\"ratio_of_mins\":%.4f}",
                      r.t == &a ? "keep_grads" : r.t == &b ? "zero_grads" : r.t == &mixed[0] ? "bf16_params_grads_keep"
                                                                                  : "bf16_params_fp32_grads_keep",
                      threads, opt.elements, opt.reps,
                      r.t->min_a() * 1e3, r.t->min_b() * 1e3, ratio, mins);
        json.push_back(line);
    }
    // Two ranks: the default step's zeroing against keep_grads. Each rank's update zeroes
    // its own shard of the gradient buffer as it reads it; a pass zeroes the peer's half.
    const PairTimes z = two_rank_zeroing(opt.elements, opt.reps);
    std::printf("two ranks (threads over local://, 1 pool thread each): the default step %.2f ms, keep_grads "
                "%.2f ms: %.3fx (ratio of mins %.3f)\n",
                median(z.b) * 1e3, median(z.a) * 1e3, z.paired_ratio(), z.min_b() / z.min_a());
    char line[512];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"step_vs_kernel\",\"variant\":\"two_ranks_zero_grads_vs_keep_grads\",\"elements\":%zu,"
                  "\"reps\":%d,\"keep_grads_ms\":%.3f,\"zero_grads_ms\":%.3f,\"ratio\":%.4f,\"ratio_of_mins\":%.4f}",
                  opt.elements, opt.reps, median(z.a) * 1e3, median(z.b) * 1e3, z.paired_ratio(), z.min_b() / z.min_a());
    json.push_back(line);
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
