// bench_sx section adamw_kernel: the fused AdamW kernel against a streaming ceiling
// with its memory pattern, measured in the same run.
#include <cmath>
#include <cstring>

#include "bench_util.h"
#include "optim/kernels.h"
#include "optim/optimizer.h"
#include "optim/thread_pool.h"

#if SX_OPTIM_X86
#include <immintrin.h>
#endif
#ifdef SX_BENCH_OPENMP
#include <omp.h>
#endif

namespace sxbench {
namespace {

using sx::optim::Isa;
using sx::optim::Segment;
using sx::optim::ThreadPool;
namespace in = sx::optim::internal;

// ------------------------------------------------------------------ adamw_kernel

// The ceiling: the AdamW kernel's memory pattern (read param, grad, exp_avg,
// exp_avg_sq; write param, exp_avg, exp_avg_sq in place) with trivial arithmetic,
// at the same vector width, with the kernel's software prefetch (so the ceiling is
// at least as fast as either choice), split across threads exactly as the kernel is.
using CeilingFn = void (*)(float *p, const float *g, float *m, float *v, size_t n);

void ceiling_tail(float *p, const float *g, float *m, float *v, size_t i, size_t n) {
    for (; i < n; ++i) {
        p[i] += g[i];
        m[i] += g[i];
        v[i] += g[i] * g[i];
    }
}

// As kernel_body.h prefetches: each stream, 512 floats ahead.
inline void prefetch4(const float *p, const float *g, const float *m, const float *v, size_t i) {
    __builtin_prefetch(p + i + 512);
    __builtin_prefetch(g + i + 512);
    __builtin_prefetch(m + i + 512);
    __builtin_prefetch(v + i + 512);
}

#if SX_OPTIM_X86
__attribute__((target("avx512f"))) void ceiling_avx512(float *p, const float *g, float *m, float *v,
                                                        size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        prefetch4(p, g, m, v, i);
        const __m512 gv = _mm512_loadu_ps(g + i);
        _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), gv));
        _mm512_storeu_ps(m + i, _mm512_add_ps(_mm512_loadu_ps(m + i), gv));
        _mm512_storeu_ps(v + i, _mm512_add_ps(_mm512_loadu_ps(v + i), _mm512_mul_ps(gv, gv)));
    }
    ceiling_tail(p, g, m, v, i, n);
}

__attribute__((target("avx2"))) void ceiling_avx2(float *p, const float *g, float *m, float *v,
                                                   size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        prefetch4(p, g, m, v, i);
        const __m256 gv = _mm256_loadu_ps(g + i);
        _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), gv));
        _mm256_storeu_ps(m + i, _mm256_add_ps(_mm256_loadu_ps(m + i), gv));
        _mm256_storeu_ps(v + i, _mm256_add_ps(_mm256_loadu_ps(v + i), _mm256_mul_ps(gv, gv)));
    }
    ceiling_tail(p, g, m, v, i, n);
}
#endif

void ceiling_scalar(float *p, const float *g, float *m, float *v, size_t n) {
    ceiling_tail(p, g, m, v, 0, n);
}

CeilingFn ceiling_for(Isa isa) {
#if SX_OPTIM_X86
    if (isa == Isa::kAvx512) return ceiling_avx512;
    if (isa == Isa::kAvx2) return ceiling_avx2;
#endif
    (void)isa;
    return ceiling_scalar;
}

// The arithmetic floor: the update's divisions and square root alone, as the kernel
// rounds them (denom = sqrt(v) / bias_correction2_sqrt + eps; m / denom), over the same
// elements, with the fewest memory streams (2 read, 1 written). Where the state is in
// cache, the divider and square-root unit bound the kernel here, whatever the traffic.
using FloorFn = void (*)(const float *m, const float *v, float *out, size_t n);

void floor_tail(const float *m, const float *v, float *out, size_t i, size_t n) {
    for (; i < n; ++i) out[i] = m[i] / (std::sqrt(v[i]) / 1.25f + 1e-8f);
}

#if SX_OPTIM_X86
__attribute__((target("avx512f"))) void floor_avx512(const float *m, const float *v, float *out, size_t n) {
    const __m512 c = _mm512_set1_ps(1.25f), eps = _mm512_set1_ps(1e-8f);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 d = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(_mm512_loadu_ps(v + i)), c), eps);
        _mm512_storeu_ps(out + i, _mm512_div_ps(_mm512_loadu_ps(m + i), d));
    }
    floor_tail(m, v, out, i, n);
}

__attribute__((target("avx2"))) void floor_avx2(const float *m, const float *v, float *out, size_t n) {
    const __m256 c = _mm256_set1_ps(1.25f), eps = _mm256_set1_ps(1e-8f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 d = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(_mm256_loadu_ps(v + i)), c), eps);
        _mm256_storeu_ps(out + i, _mm256_div_ps(_mm256_loadu_ps(m + i), d));
    }
    floor_tail(m, v, out, i, n);
}
#endif

void floor_scalar(const float *m, const float *v, float *out, size_t n) { floor_tail(m, v, out, 0, n); }

FloorFn floor_for(Isa isa) {
#if SX_OPTIM_X86
    if (isa == Isa::kAvx512) return floor_avx512;
    if (isa == Isa::kAvx2) return floor_avx2;
#endif
    (void)isa;
    return floor_scalar;
}

// Calls piece(b, e) over seg's elements, cut among threads exactly as the kernel cuts
// them, on the pool's threads, or on OpenMP's (as many as the pool would run).
template <typename Piece>
void on_pool(const Segment &seg, ThreadPool &pool, const Piece &piece) {
    const int threads = in::threads_for(seg.n, &pool, in::kMinElementsPerThread);
    const std::vector<in::Cut> cuts = in::partition(&seg, 1, threads);
    pool.run([&](int t) {
        if (t < threads)
            in::for_each_piece(&seg, cuts[t], cuts[t + 1], [&](size_t, size_t b, size_t e) { piece(b, e); });
    });
}

#ifdef SX_BENCH_OPENMP
// The pool's hand-off against OpenMP's. bench_sx runs with OMP_WAIT_POLICY=passive unless
// it is set (main.cc): OpenMP's threads then sleep between regions as the pool's sleep
// between jobs. Active, they spin for milliseconds after each region, and on a machine
// with as many processors as threads they take the processors from the pool's run that
// follows.
template <typename Piece>
void on_openmp(const Segment &seg, const ThreadPool &pool, const Piece &piece) {
    const int threads = in::threads_for(seg.n, &pool, in::kMinElementsPerThread);
    const std::vector<in::Cut> cuts = in::partition(&seg, 1, threads);
#pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num();
        in::for_each_piece(&seg, cuts[t], cuts[t + 1], [&](size_t, size_t b, size_t e) { piece(b, e); });
    }
}
#endif

}  // namespace

PairTimes adamw_kernel_vs_ceiling(Segment *seg, Isa isa, ThreadPool &pool, int reps) {
    const in::KernelTable &k = in::kernels_for(in::resolve_isa(isa));
    auto kernel = [&] {
        ++seg->step;
        double sumsq = 0.0;
        in::fused_update_with(k, seg, 1, 1.0f, &pool, in::kMinElementsPerThread, &sumsq);
    };
    const CeilingFn ceiling_fn = ceiling_for(isa);
    auto ceiling = [&] {
        on_pool(*seg, pool, [&](size_t b, size_t e) {
            ceiling_fn(seg->param + b, seg->grad + b, seg->state[0] + b, seg->state[1] + b, e - b);
        });
    };
    return time_pair(kernel, ceiling, reps);
}

int section_adamw_kernel(const Options &opt) {
    Streams s;
    if (!s.allocate(opt.elements)) return 1;
    sx::optim::Hyper h;  // torch.optim.AdamW with its defaults and weight_decay 0.01
    h.kind = sx::optim::Kind::kAdamW;
    h.lr = 1e-3;
    h.weight_decay = 0.01;
    Segment seg = s.adamw_segment(&h, opt.elements);
    HostBuffer scratch;  // where the arithmetic floor writes
    if (!scratch.allocate(opt.elements * sizeof(float), "benchmark scratch").ok()) return 1;

    std::vector<Isa> isas = {sx::optim::detect_isa()};
    if (isas[0] == Isa::kAvx512) isas.push_back(Isa::kAvx2);
    const double bytes = 7.0 * sizeof(float) * static_cast<double>(opt.elements);

    std::printf("adamw_kernel: fused AdamW on %zu fp32 elements vs a ceiling with the same memory "
                "pattern (4 streams read, 3 written), %d reps of the pair; times are each one's "
                "fastest rep; ratio = median over reps of ceiling time / kernel time; vs_openmp: the same "
                "with the ceiling run on OpenMP's threads (OMP_WAIT_POLICY passive unless set: they sleep between "
                "regions, as the pool's threads sleep between jobs; 0: built without OpenMP); vs_floor: floor time / "
                "kernel time, the floor being the update's two divisions and square root alone; floor_ms: its fastest "
                "rep; best_ratio: ceiling_ms / floor_ms, the most any kernel doing those operations could reach "
                "against the ceiling\n",
                opt.elements, opt.reps);
    std::printf("%-8s %7s %10s %11s %12s %13s %7s %13s %10s %9s %9s %10s\n", "isa", "threads", "kernel_ms",
                "ceiling_ms", "kernel_GB/s", "ceiling_GB/s", "ratio", "ratio_of_mins", "vs_openmp", "vs_floor",
                "floor_ms", "best_ratio");
    std::vector<std::string> json;
    for (Isa isa : isas) {
        const in::KernelTable &k = in::kernels_for(in::resolve_isa(isa));
        for (int threads : {1, 2}) {
            ThreadPool pool(threads);
            auto kernel = [&] {
                ++seg.step;
                double sumsq = 0.0;
                in::fused_update_with(k, &seg, 1, 1.0f, &pool, in::kMinElementsPerThread, &sumsq);
            };
            const CeilingFn ceiling_fn = ceiling_for(isa);
            auto ceiling_piece = [&](size_t b, size_t e) {
                ceiling_fn(seg.param + b, seg.grad + b, seg.state[0] + b, seg.state[1] + b, e - b);
            };
            const PairTimes t = adamw_kernel_vs_ceiling(&seg, isa, pool, opt.reps);
            const double tk = t.min_a(), tc = t.min_b();
            const double ratio = t.paired_ratio(), ratio_of_mins = tc / tk;
            // The arithmetic floor, against the kernel, both on the pool.
            const FloorFn floor_fn = floor_for(isa);
            auto floor = [&] {
                on_pool(seg, pool, [&](size_t b, size_t e) {
                    floor_fn(seg.state[0] + b, seg.state[1] + b, scratch.as<float>() + b, e - b);
                });
            };
            const PairTimes tf = time_pair(kernel, floor, opt.reps);
            const double floor_ratio = tf.paired_ratio(), tfloor = tf.min_b();
            // The ceiling on OpenMP's threads, against the kernel on the pool.
            double omp_ratio = 0;
#ifdef SX_BENCH_OPENMP
            auto ceiling_omp = [&] { on_openmp(seg, pool, ceiling_piece); };
            omp_ratio = time_pair(kernel, ceiling_omp, opt.reps).paired_ratio();
#endif
            std::printf("%-8s %7d %10.2f %11.2f %12.2f %13.2f %7.3f %13.3f %10.3f %9.3f %9.2f %10.3f\n",
                        sx::optim::isa_name(isa), threads, tk * 1e3, tc * 1e3, bytes / tk * 1e-9, bytes / tc * 1e-9,
                        ratio, ratio_of_mins, omp_ratio, floor_ratio, tfloor * 1e3, tc / tfloor);
            char line[512];
            std::snprintf(line, sizeof line,
                          "{\"bench\":\"adamw_kernel\",\"isa\":\"%s\",\"threads\":%d,\"elements\":%zu,"
                          "\"reps\":%d,\"kernel_ms\":%.3f,\"ceiling_ms\":%.3f,\"kernel_gbps\":%.2f,"
                          "\"ceiling_gbps\":%.2f,\"ratio_vs_ceiling\":%.4f,\"ratio_of_mins\":%.4f,"
                          "\"ratio_vs_openmp_ceiling\":%.4f,\"ratio_vs_arithmetic_floor\":%.4f,"
                          "\"floor_ms\":%.3f,\"best_ratio_vs_ceiling\":%.4f}",
                          sx::optim::isa_name(isa), threads, opt.elements, opt.reps, tk * 1e3, tc * 1e3,
                          bytes / tk * 1e-9, bytes / tc * 1e-9, ratio, ratio_of_mins, omp_ratio, floor_ratio,
                          tfloor * 1e3, tc / tfloor);
            json.push_back(line);
        }
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
