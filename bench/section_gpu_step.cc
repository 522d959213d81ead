// bench_sx section gpu_step (built with CUDA only): sx_step of a one-rank CUDA group with
// one AdamW param of --gpu-elements elements against the fused CUDA kernel alone on
// buffers of the same size, doing what the step's kernel does (the update and the
// gradients' sum of squares for the reported norm, read back), timed in alternation by
// the host clock (sx_step returns when its device work has finished; the kernel alone is
// launched and waited for on its own stream). The step is timed twice: with keep_grads (its work is the kernel's: the
// one-rank reduction is the gradient buffer itself) and with the default zeroing of the
// gradients, which adds a write of the gradient buffer. With bf16 params the step's update
// reads the bf16 gradients and widens them as it goes (a one-rank group's reduction is the
// gradients themselves), where the kernel alone reads fp32 ones: 2 bytes fewer per element.
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cuda/runtime.h"
#include "optim/cuda_kernels.h"

namespace sxbench {
namespace {

namespace oc = sx::optim::cuda;

bool sx_ok(sx_status_t s, const char *what) {
    if (s == SX_OK) return true;
    std::fprintf(stderr, "gpu_step: %s: %s\n", what, sx_last_error_message());
    return false;
}

bool ok(const sx::Status &s, const char *what) {
    if (s.ok()) return true;
    std::fprintf(stderr, "gpu_step: %s: %s\n", what, s.message().c_str());
    return false;
}

// Seconds spent inside a timed function that are not its own (subtracted by host_ms).
double refill_s = 0.0;

double host_ms(const std::function<bool()> &fn) {
    refill_s = 0.0;
    const double t0 = now_seconds();
    if (!fn()) return -1.0;
    return (now_seconds() - t0 - refill_s) * 1e3;
}

// An LCG's floats in [-1, 1): never time on zeros.
std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = static_cast<float>(static_cast<int32_t>(seed)) * (1.0f / 2147483648.0f);
    }
    return v;
}

sx_shard_group_t *make_group(size_t n, int32_t dtype, const char *name) {
    sx_group_config_t cfg;
    sx_group_config_init(&cfg, sizeof cfg);
    const std::string url = std::string("local://bench-gpu-step-") + name;
    cfg.rendezvous = url.c_str();
    cfg.world_size = 1;
    cfg.backend = SX_BACKEND_CUDA;
    cfg.num_threads = 1;
    sx_shard_group_t *g = nullptr;
    if (!sx_ok(sx_create_shard_group(&cfg, &g), "sx_create_shard_group")) return nullptr;
    sx_param_group_desc_t pg;
    sx_param_group_desc_init(&pg, sizeof pg, SX_OPTIM_ADAMW);
    pg.lr = 1e-3;
    pg.weight_decay = 0.01;
    const int64_t shape = static_cast<int64_t>(n);
    sx_param_desc_t d;
    sx_param_desc_init(&d, sizeof d);
    d.name = "w";
    d.ndim = 1;
    d.shape = &shape;
    d.dtype = dtype;
    if (!sx_ok(sx_add_param_group(g, &pg, nullptr), "sx_add_param_group") ||
        !sx_ok(sx_add_param(g, &d, nullptr), "sx_add_param") || !sx_ok(sx_finalize(g), "sx_finalize")) {
        sx_destroy_shard_group(g);
        return nullptr;
    }
    return g;
}

// Random params and gradients into the group's views (fp32, or the top halves: bf16).
bool fill(sx_shard_group_t *g, size_t n, bool bf16, bool grads_only) {
    for (int grad = grads_only ? 1 : 0; grad < 2; ++grad) {
        sx_view_t v;
        sx_view_init(&v, sizeof v);
        if (!sx_ok(grad ? sx_grad_view(g, 0, &v) : sx_param_view(g, 0, &v), "view")) return false;
        std::vector<float> f = random_floats(n, grad ? 7u : 11u);
        if (!grad)
            for (float &x : f) x = 0.5f * x + 0.25f;
        if (!bf16) {
            if (cudaMemcpy(v.data, f.data(), n * 4, cudaMemcpyHostToDevice) != cudaSuccess) return false;
            continue;
        }
        std::vector<uint16_t> h(n);
        for (size_t i = 0; i < n; ++i) {
            uint32_t b;
            std::memcpy(&b, &f[i], 4);
            h[i] = static_cast<uint16_t>(b >> 16);
        }
        if (cudaMemcpy(v.data, h.data(), n * 2, cudaMemcpyHostToDevice) != cudaSuccess) return false;
    }
    return true;
}

}  // namespace

int section_gpu_step(const Options &opt) {
    if (gpu_skipped("gpu_step")) return 0;
    const size_t n = opt.gpu_elements;
    const size_t bytes = n * sizeof(float);
    // The kernel alone: its own buffers, the same size, random values.
    sx::cuda::DeviceBuffer param, grad, m, v, out;
    if (!ok(param.allocate(bytes, "param"), "allocate") || !ok(grad.allocate(bytes, "grad"), "allocate") ||
        !ok(m.allocate(bytes, "exp_avg"), "allocate") || !ok(v.allocate(bytes, "exp_avg_sq"), "allocate") ||
        !ok(out.allocate(n * 2, "bf16 params"), "allocate"))
        return 1;
    {
        std::vector<float> host = random_floats(n, 7u);
        if (!ok(grad.upload(host.data(), bytes), "upload") || !ok(m.fill_bytes(0), "zero") ||
            !ok(v.fill_bytes(0), "zero"))
            return 1;
        for (float &f : host) f = 0.5f * f + 0.25f;
        if (!ok(param.upload(host.data(), bytes), "upload")) return 1;
    }
    cudaStream_t stream = nullptr;
    if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return 1;
    sx::optim::Hyper h;
    h.kind = sx::optim::Kind::kAdamW;
    h.lr = 1e-3;
    h.weight_decay = 0.01;
    oc::CudaSegment seg;
    seg.seg.param = param.as<float>();
    seg.seg.grad = grad.as<float>();
    seg.seg.state[0] = m.as<float>();
    seg.seg.state[1] = v.as<float>();
    seg.seg.n = n;
    seg.seg.hyper = &h;
    oc::Workspace ws;

    std::printf("gpu_step: sx_step of a one-rank CUDA group, one AdamW param of %zu elements, vs the fused kernel "
                "alone on buffers of the same size (host clock, each waited for); %d reps of the pair; "
                "ratio = median over reps of step time / kernel time\n",
                n, opt.reps);
    std::printf("%-10s %-11s %9s %10s %9s\n", "params", "step", "step_ms", "kernel_ms", "ratio");
    std::vector<std::string> json;
    int rc = 0;
    for (const bool bf16 : {false, true}) {
        sx_shard_group_t *g = make_group(n, bf16 ? SX_DTYPE_BF16 : SX_DTYPE_F32, bf16 ? "bf16" : "fp32");
        if (!g || !fill(g, n, bf16, false)) {
            sx_destroy_shard_group(g);
            rc = 1;
            break;
        }
        seg.compute_out = bf16 ? out.data() : nullptr;
        seg.compute_dtype = bf16 ? oc::ComputeDtype::kBf16 : oc::ComputeDtype::kNone;
        // The kernel as the step runs it: the gradients' sum of squares (the norm the step
        // reports) out of the same pass, and read back.
        auto kernel = [&] {
            ++seg.seg.step;
            oc::GradStats st;
            return ok(ws.fused_update(&seg, 1, 1.0f, stream, true), "fused_update") &&
                   ok(ws.read_stats(stream, &st), "read_stats");
        };
        for (const int keep : {1, 0}) {
            sx_step_options_t so;
            sx_step_options_init(&so, sizeof so);
            so.keep_grads = keep;
            sx_step_result_t res;
            sx_step_result_init(&res, sizeof res);
            // Each step's gradients are copied in untimed (the default step leaves zeros,
            // and no timing runs on zeros): the kernel's random fp32 gradients, or its
            // bf16 outputs.
            sx_view_t gv;
            sx_view_init(&gv, sizeof gv);
            if (!sx_ok(sx_grad_view(g, 0, &gv), "sx_grad_view")) {
                rc = 1;
                break;
            }
            auto step = [&] {
                const double t0 = now_seconds();
                // A copy within the device does not wait for itself: waited for here, so
                // that the step does not (it follows the legacy default stream).
                if (cudaMemcpy(gv.data, bf16 ? out.data() : grad.data(), n * (bf16 ? 2 : 4), cudaMemcpyDeviceToDevice) !=
                        cudaSuccess ||
                    cudaDeviceSynchronize() != cudaSuccess)
                    return false;
                refill_s += now_seconds() - t0;
                return sx_ok(sx_step(g, &so, &res), "sx_step");
            };
            host_ms(step);  // warm-up: the optimizer state is allocated at the first step
            host_ms(kernel);
            std::vector<double> ts, tk, ratio;
            for (int r = 0; r < opt.reps; ++r) {
                double a, b;
                if (r % 2 == 0) {
                    a = host_ms(step);
                    b = host_ms(kernel);
                } else {
                    b = host_ms(kernel);
                    a = host_ms(step);
                }
                if (a <= 0 || b <= 0) {
                    rc = 1;
                    break;
                }
                ts.push_back(a);
                tk.push_back(b);
                ratio.push_back(a / b);
            }
            if (rc) break;
            const char *what = keep ? "keep_grads" : "zero_grads";
            const double ms = median(ts), mk = median(tk), q = median(ratio);
            std::printf("%-10s %-11s %9.3f %10.3f %9.3f\n", bf16 ? "bf16+fp32" : "fp32", what, ms, mk, q);
            char line[512];
            std::snprintf(line, sizeof line,
                          "{\"bench\":\"gpu_step\",\"params\":\"%s\",\"step\":\"%s\",\"elements\":%zu,\"reps\":%d,"
                          "\"step_ms\":%.4f,\"kernel_ms\":%.4f,\"ratio_step_vs_kernel\":%.4f}",
                          bf16 ? "bf16+fp32" : "fp32", what, n, opt.reps, ms, mk, q);
            json.push_back(line);
        }
        sx_destroy_shard_group(g);
        if (rc) break;
    }
    cudaStreamDestroy(stream);
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return rc;
}

}  // namespace sxbench
