// bench_sx section gpu_offload (built with CUDA only): a one-rank CUDA group of
// --gpu-elements bf16 params (AdamW, 16 units) that offloads its state to the host
// (SX_OFFLOAD_STATE) against the same group keeping it on the device:
//   - device bytes per param of each (sx_memory_stats_t.device_bytes);
//   - sx_step of each, timed in alternation (keep_grads: the same gradients every step);
//   - the host's AdamW kernel alone on fp32 streams of the same size, on the offloaded
//     group's threads, against the host's memory-traffic ceiling with its pattern;
//   - the offloaded step under a simulated backward: the units signalled ready one by one
//     with a sleep before each (together as long as the offloaded step alone), then
//     sx_step; hidden = (backward + step alone - the whole) / step alone, the fraction of
//     the offloaded step's work (reductions, copies, update) that the backward hid.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "cuda/runtime.h"
#include "optim/thread_pool.h"

namespace sxbench {
namespace {

constexpr int kUnits = 16;

bool sx_ok(sx_status_t s, const char *what) {
    if (s == SX_OK) return true;
    std::fprintf(stderr, "gpu_offload: %s: %s\n", what, sx_last_error_message());
    return false;
}

// One-rank CUDA group of n bf16 params in kUnits units (AdamW), random params and
// gradients; offload: its state on the host, updated by `threads` threads.
sx_shard_group_t *make_group(size_t n, bool offload, int threads) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string url = std::string("local://bench-gpu-offload-") + (offload ? "host" : "device");
    cfg.rendezvous = url.c_str();
    cfg.world_size = 1;
    cfg.backend = SX_BACKEND_CUDA;
    cfg.offload = offload ? SX_OFFLOAD_STATE : SX_OFFLOAD_NONE;
    cfg.num_threads = threads;
    sx_shard_group_t *g = nullptr;
    if (!sx_ok(sx_create_shard_group(&cfg, &g), "sx_create_shard_group")) return nullptr;
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    pg.lr = 1e-3;
    pg.weight_decay = 0.01;
    bool good = sx_ok(sx_add_param_group(g, &pg, nullptr), "sx_add_param_group");
    const int64_t per = static_cast<int64_t>(n / kUnits);
    for (int u = 0; u < kUnits && good; ++u) {
        const std::string name = "w" + std::to_string(u);
        sx_param_desc_t d;
        sx_param_desc_init(&d, sizeof d);
        d.name = name.c_str();
        d.ndim = 1;
        d.shape = &per;
        d.dtype = SX_DTYPE_BF16;
        d.unit = u;
        good = sx_ok(sx_add_param(g, &d, nullptr), "sx_add_param");
    }
    good = good && sx_ok(sx_finalize(g), "sx_finalize");
    // Random bf16 params and gradients (the top halves of an LCG's floats).
    std::vector<uint16_t> h(static_cast<size_t>(per));
    uint32_t x = 12345;
    for (int p = 0; p < kUnits && good; ++p)
        for (int grad = 0; grad < 2 && good; ++grad) {
            for (uint16_t &e : h) {
                x = x * 1664525u + 1013904223u;
                float f = static_cast<float>(static_cast<int32_t>(x)) * (1.0f / 2147483648.0f);
                if (!grad) f = 0.5f * f + 0.25f;
                uint32_t b;
                std::memcpy(&b, &f, 4);
                e = static_cast<uint16_t>(b >> 16);
            }
            sx_view_t v;
            sx_view_init(&v, sizeof v);
            good = sx_ok(grad ? sx_grad_view(g, p, &v) : sx_param_view(g, p, &v), "view") &&
                   cudaMemcpy(v.data, h.data(), h.size() * 2, cudaMemcpyHostToDevice) == cudaSuccess;
        }
    if (!good) {
        sx_destroy_shard_group(g);
        return nullptr;
    }
    return g;
}

double device_bytes_per_param(sx_shard_group_t *g, size_t n) {
    sx_memory_stats_t m;
    sx_memory_stats_init(&m, sizeof m);
    if (!sx_ok(sx_get_memory_stats(g, &m), "sx_get_memory_stats")) return -1.0;
    return static_cast<double>(m.device_bytes) / static_cast<double>(n);
}

// The step (keep_grads: the gradients stay for the next one), timed.
double step_s(sx_shard_group_t *g) {
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    o.keep_grads = 1;
    const double t0 = now_seconds();
    if (!sx_ok(sx_step(g, &o, nullptr), "sx_step")) return -1.0;
    return now_seconds() - t0;
}

// The units signalled ready last first, `backward` seconds of sleep spread before them,
// then the step: the whole, timed.
double step_after_backward_s(sx_shard_group_t *g, double backward) {
    sx_unit_ready_options_t ro;
    sx_unit_ready_options_init(&ro, sizeof ro);
    sx_step_options_t o;
    sx_step_options_init(&o, sizeof o);
    o.keep_grads = 1;
    const double t0 = now_seconds();
    for (int u = kUnits - 1; u >= 0; --u) {
        std::this_thread::sleep_for(std::chrono::duration<double>(backward / kUnits));
        if (!sx_ok(sx_unit_grads_ready(g, u, &ro), "sx_unit_grads_ready")) return -1.0;
    }
    if (!sx_ok(sx_step(g, &o, nullptr), "sx_step")) return -1.0;
    return now_seconds() - t0;
}

}  // namespace

int section_gpu_offload(const Options &opt) {
    if (gpu_skipped("gpu_offload")) return 0;
    const size_t n = opt.gpu_elements / kUnits * kUnits;
    const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    sx_shard_group_t *dev = make_group(n, false, 1), *off = make_group(n, true, threads);
    if (!dev || !off) {
        sx_destroy_shard_group(dev);
        sx_destroy_shard_group(off);
        return 1;
    }
    std::printf("gpu_offload: %zu bf16 params (AdamW, %d units), one rank; offloaded: state on the host, %d "
                "threads; %d reps of each pair, medians\n",
                n, kUnits, threads, opt.reps);
    const double bytes_dev = device_bytes_per_param(dev, n), bytes_off = device_bytes_per_param(off, n);
    // Warm-up: the optimizer state is allocated at the first step.
    int rc = step_s(dev) > 0 && step_s(off) > 0 ? 0 : 1;
    std::vector<double> t_dev, t_off, ratio;
    for (int r = 0; r < opt.reps && rc == 0; ++r) {
        const bool first = r % 2 == 0;
        const double a = first ? step_s(dev) : 0.0, b = step_s(off), c = first ? a : step_s(dev);
        if (b <= 0 || c <= 0) rc = 1;
        t_dev.push_back(c);
        t_off.push_back(b);
        ratio.push_back(b / c);
    }
    // The host's kernel alone on the offloaded group's threads, against the ceiling.
    Streams s;
    sx::optim::Hyper h;
    h.kind = sx::optim::Kind::kAdamW;
    h.lr = 1e-3;
    h.weight_decay = 0.01;
    double kernel_ms = 0, ceiling_ms = 0, vs_ceiling = 0;
    if (rc == 0 && s.allocate(n)) {
        sx::optim::Segment seg = s.adamw_segment(&h, n);
        sx::optim::ThreadPool pool(threads);
        const PairTimes t = adamw_kernel_vs_ceiling(&seg, sx::optim::detect_isa(), pool, opt.reps);
        kernel_ms = t.min_a() * 1e3;
        ceiling_ms = t.min_b() * 1e3;
        vs_ceiling = t.paired_ratio();
    }
    // Under a simulated backward as long as the offloaded step alone.
    const double alone = median(t_off);
    std::vector<double> whole;
    for (int r = 0; r < opt.reps && rc == 0; ++r) {
        const double w = step_after_backward_s(off, alone);
        if (w <= 0) rc = 1;
        whole.push_back(w);
    }
    sx_destroy_shard_group(dev);
    sx_destroy_shard_group(off);
    if (rc) return rc;
    const double hidden = (alone + alone - median(whole)) / alone;
    std::printf("%-34s %12s %12s %9s\n", "figure", "offloaded", "on_device", "ratio");
    std::printf("%-34s %12.3f %12.3f %9.3f\n", "device bytes per param", bytes_off, bytes_dev, bytes_off / bytes_dev);
    std::printf("%-34s %12.2f %12.2f %9.3f\n", "sx_step ms", median(t_off) * 1e3, median(t_dev) * 1e3, median(ratio));
    std::printf("host AdamW kernel alone: %.2f ms, its ceiling %.2f ms: %.3f of the ceiling (fp32 streams, %d "
                "threads)\n",
                kernel_ms, ceiling_ms, vs_ceiling, threads);
    std::printf("offloaded step under a backward of %.2f ms: %.2f ms in all, %.3f of the step hidden\n", alone * 1e3,
                median(whole) * 1e3, hidden);
    std::printf("{\"bench\":\"gpu_offload\",\"elements\":%zu,\"units\":%d,\"threads\":%d,\"reps\":%d,"
                "\"device_bytes_per_param_offloaded\":%.4f,\"device_bytes_per_param_on_device\":%.4f,"
                "\"step_ms_offloaded\":%.3f,\"step_ms_on_device\":%.3f,\"ratio_offloaded_vs_on_device\":%.4f,"
                "\"host_kernel_ms\":%.3f,\"host_ceiling_ms\":%.3f,\"host_kernel_vs_ceiling\":%.4f,"
                "\"backward_ms\":%.3f,\"step_after_backward_ms\":%.3f,\"fraction_hidden\":%.4f}\n",
                n, kUnits, threads, opt.reps, bytes_off, bytes_dev, median(t_off) * 1e3, median(t_dev) * 1e3,
                median(ratio), kernel_ms, ceiling_ms, vs_ceiling, alone * 1e3, median(whole) * 1e3, hidden);
    return 0;
}

}  // namespace sxbench
