// bench_sx section gpu_adamw (built with CUDA only): the fused AdamW step on the device
// against a kernel that moves exactly the same bytes through the same segment table and
// block assignment with no arithmetic (launch_plan.h's traffic_only), timed in
// alternation with device events. The traffic-only kernel runs on buffers of its own: it
// moves each stream's values into another (the params into the first moments, those
// into the second), which in the update's buffers would leave negative second moments
// and NaNs, whose arithmetic takes other paths. Rows: fp32 params; fp32 with the sum of
// squares of the gradients (the step's norm) taken in the same pass; bf16 params with
// fp32 masters. Also the effective bandwidth beside the device's peak, memoryClockRate *
// busWidth * 2 (DDR), from cudaDeviceGetAttribute (CUDA 13 removed those fields from
// cudaDeviceProp). Compare elements/s with bench/torch_adamw.py
// (torch.optim.AdamW(fused=True)) on the same device.
#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cuda/runtime.h"
#include "optim/cuda/launch_plan.h"
#include "optim/cuda_kernels.h"

namespace sxbench {
namespace {

namespace oc = sx::optim::cuda;

bool cuda_ok(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    std::fprintf(stderr, "gpu_adamw: %s: %s\n", what, cudaGetErrorString(e));
    return false;
}

bool status_ok(const sx::Status &s) {
    if (s.ok()) return true;
    std::fprintf(stderr, "gpu_adamw: %s\n", s.message().c_str());
    return false;
}

// Milliseconds of fn on the default stream, between two events.
struct EventTimer {
    cudaEvent_t start = nullptr, stop = nullptr;
    EventTimer() {
        cudaEventCreate(&start);
        cudaEventCreate(&stop);
    }
    ~EventTimer() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
    template <typename Fn>
    double ms(Fn &&fn) {
        cudaEventRecord(start, nullptr);
        if (!fn()) return -1.0;
        cudaEventRecord(stop, nullptr);
        cudaEventSynchronize(stop);
        float t = 0.0f;
        cudaEventElapsedTime(&t, start, stop);
        return t;
    }
};

}  // namespace

bool gpu_skipped(const char *section) {
    std::string reason;
    if (sx::cuda::device_available(&reason)) return false;
    std::printf("%s: skipped: no CUDA device: %s\n", section, reason.c_str());
    std::printf("{\"bench\":\"%s\",\"skipped\":\"no CUDA device: %s\"}\n", section, reason.c_str());
    return true;
}

int section_gpu_adamw(const Options &opt) {
    if (gpu_skipped("gpu_adamw")) return 0;
    int dev = 0, clock_khz = 0, bus_bits = 0;
    cudaDeviceProp prop;
    if (!cuda_ok(cudaGetDevice(&dev), "cudaGetDevice") || !cuda_ok(cudaGetDeviceProperties(&prop, dev), "properties") ||
        !cuda_ok(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev), "memory clock") ||
        !cuda_ok(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev), "bus width"))
        return 1;
    const double peak = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0);  // bytes/s

    const size_t n = opt.gpu_elements;
    const size_t bytes = n * sizeof(float);
    // Two sets of buffers: the update's, and the traffic-only kernel's.
    struct Buffers {
        sx::cuda::DeviceBuffer param, grad, m, v, out;
    } sets[2];
    std::vector<float> host(n);
    for (Buffers &b : sets) {
        if (!status_ok(b.param.allocate(bytes, "param")) || !status_ok(b.grad.allocate(bytes, "grad")) ||
            !status_ok(b.m.allocate(bytes, "exp_avg")) || !status_ok(b.v.allocate(bytes, "exp_avg_sq")) ||
            !status_ok(b.out.allocate(n * 2, "bf16 params")))
            return 1;
        // Random values (never time on zeros): an LCG's floats in [-1, 1).
        uint32_t x = 12345;
        for (size_t i = 0; i < n; ++i) {
            x = x * 1664525u + 1013904223u;
            host[i] = static_cast<float>(static_cast<int32_t>(x)) * (1.0f / 2147483648.0f);
        }
        if (!status_ok(b.grad.upload(host.data(), bytes))) return 1;
        for (float &f : host) f = 0.5f * f + 0.25f;
        if (!status_ok(b.param.upload(host.data(), bytes)) || !status_ok(b.m.fill_bytes(0)) ||
            !status_ok(b.v.fill_bytes(0)))
            return 1;
    }
    host = std::vector<float>();
    sx::optim::Hyper h;  // torch.optim.AdamW's defaults with weight_decay 0.01
    h.kind = sx::optim::Kind::kAdamW;
    h.lr = 1e-3;
    h.weight_decay = 0.01;
    oc::CudaSegment seg[2];
    for (int k = 0; k < 2; ++k) {
        seg[k].seg.param = sets[k].param.as<float>();
        seg[k].seg.grad = sets[k].grad.as<float>();
        seg[k].seg.state[0] = sets[k].m.as<float>();
        seg[k].seg.state[1] = sets[k].v.as<float>();
        seg[k].seg.n = n;
        seg[k].seg.hyper = &h;
    }

    std::printf("gpu_adamw: fused AdamW on %zu elements on %s (peak %.2f TB/s = memory clock %d kHz x %d bits x 2) "
                "vs a kernel moving the same bytes with no arithmetic; %d reps of the pair; "
                "ratio = median over reps of traffic time / update time\n",
                n, prop.name, peak * 1e-12, clock_khz, bus_bits, opt.reps);
    std::printf("%-10s %9s %10s %11s %9s %9s %8s %12s\n", "params", "update_ms", "traffic_ms", "update_TB/s",
                "ratio", "of_peak", "grid", "Gelements/s");
    oc::Workspace ws;
    EventTimer timer;
    std::vector<std::string> json;
    enum Row { kFp32, kFp32Norm, kBf16 };
    for (const Row row : {kFp32, kFp32Norm, kBf16}) {
        const bool bf16 = row == kBf16, norm = row == kFp32Norm;
        for (int k = 0; k < 2; ++k) {
            seg[k].compute_out = bf16 ? sets[k].out.data() : nullptr;
            seg[k].compute_dtype = bf16 ? oc::ComputeDtype::kBf16 : oc::ComputeDtype::kNone;
        }
        // p, g, m, v read; p, m, v written; + 2 bytes of bf16 out.
        const double moved = static_cast<double>(n) * (7 * sizeof(float) + (bf16 ? 2 : 0));
        auto update = [&] {
            ++seg[0].seg.step;
            return status_ok(ws.fused_update(&seg[0], 1, 1.0f, nullptr, norm));
        };
        auto traffic = [&] { return status_ok(oc::internal::traffic_only(&ws, &seg[1], 1, nullptr)); };
        std::vector<double> tu, tt, ratio;
        timer.ms(update);
        timer.ms(traffic);
        for (int r = 0; r < opt.reps; ++r) {
            double a, b;
            if (r % 2 == 0) {
                a = timer.ms(update);
                b = timer.ms(traffic);
            } else {
                b = timer.ms(traffic);
                a = timer.ms(update);
            }
            if (a <= 0 || b <= 0) return 1;
            tu.push_back(a);
            tt.push_back(b);
            ratio.push_back(b / a);
        }
        if (!cuda_ok(cudaDeviceSynchronize(), "running the kernels")) return 1;
        const char *name = bf16 ? "bf16+fp32" : norm ? "fp32+norm" : "fp32";
        const double mu = median(tu), mt = median(tt), q = median(ratio);
        const double bw = moved / (mu * 1e-3);
        std::printf("%-10s %9.3f %10.3f %11.3f %9.3f %9.3f %8u %12.2f\n", name, mu, mt, bw * 1e-12, q, bw / peak,
                    ws.grid_size(), n / (mu * 1e-3) * 1e-9);
        char line[640];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"gpu_adamw\",\"device\":\"%s\",\"params\":\"%s\",\"elements\":%zu,\"reps\":%d,"
                      "\"update_ms\":%.4f,\"traffic_ms\":%.4f,\"update_tbps\":%.4f,\"peak_tbps\":%.4f,"
                      "\"ratio_vs_traffic\":%.4f,\"ratio_vs_peak\":%.4f,\"elements_per_s\":%.4e}",
                      prop.name, name, n, opt.reps, mu, mt, bw * 1e-12, peak * 1e-12, q, bw / peak,
                      n / (mu * 1e-3));
        json.push_back(line);
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
