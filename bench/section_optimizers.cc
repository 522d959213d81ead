// bench_sx section optimizers: each optimizer of the table beyond SGD and Adam (and AdamW
// for comparison), fused, at --elements (64 Mi) and 1 Mi elements, against
//  - a traffic-only ceiling with its memory pattern (param, grad and its state slots
//    read; param and its state slots written; trivial arithmetic, the kernel's vector
//    width and software prefetch, split across the pool's threads as the kernel is);
//  - torch's fastest CPU implementation of the same class (single-tensor, foreach or
//    fused; lion-pytorch's for Lion), which bench/torch_optimizers.py times in the same
//    run where --torch-python names a Python with torch (or SX_BENCH_TORCH_PYTHON does).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "bench_util.h"
#include "optim/kernels.h"
#include "optim/optimizer.h"
#include "optim/state_codec.h"
#include "optim/thread_pool.h"

#if SX_OPTIM_X86
#include <immintrin.h>
#endif

namespace sxbench {
namespace {

using sx::optim::Hyper;
using sx::optim::Isa;
using sx::optim::Kind;
using sx::optim::Segment;
using sx::optim::ThreadPool;
namespace in = sx::optim::internal;

// The ceiling: p += g; s_k += g for each of kSlots state slots.
template <int kSlots>
void ceiling_tail(float *p, const float *g, float *const *s, size_t i, size_t n) {
    for (; i < n; ++i) {
        p[i] += g[i];
        for (int k = 0; k < kSlots; ++k) s[k][i] += g[i];
    }
}

#if SX_OPTIM_X86
template <int kSlots>
__attribute__((target("avx512f"))) void ceiling_avx512(float *p, const float *g, float *const *s, size_t n) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __builtin_prefetch(p + i + 512);
        __builtin_prefetch(g + i + 512);
        for (int k = 0; k < kSlots; ++k) __builtin_prefetch(s[k] + i + 512);
        const __m512 gv = _mm512_loadu_ps(g + i);
        _mm512_storeu_ps(p + i, _mm512_add_ps(_mm512_loadu_ps(p + i), gv));
        for (int k = 0; k < kSlots; ++k) _mm512_storeu_ps(s[k] + i, _mm512_add_ps(_mm512_loadu_ps(s[k] + i), gv));
    }
    ceiling_tail<kSlots>(p, g, s, i, n);
}

template <int kSlots>
__attribute__((target("avx2"))) void ceiling_avx2(float *p, const float *g, float *const *s, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __builtin_prefetch(p + i + 512);
        __builtin_prefetch(g + i + 512);
        for (int k = 0; k < kSlots; ++k) __builtin_prefetch(s[k] + i + 512);
        const __m256 gv = _mm256_loadu_ps(g + i);
        _mm256_storeu_ps(p + i, _mm256_add_ps(_mm256_loadu_ps(p + i), gv));
        for (int k = 0; k < kSlots; ++k) _mm256_storeu_ps(s[k] + i, _mm256_add_ps(_mm256_loadu_ps(s[k] + i), gv));
    }
    ceiling_tail<kSlots>(p, g, s, i, n);
}
#endif

template <int kSlots>
void ceiling(Isa isa, float *p, const float *g, float *const *s, size_t n) {
#if SX_OPTIM_X86
    if (isa == Isa::kAvx512) return ceiling_avx512<kSlots>(p, g, s, n);
    if (isa == Isa::kAvx2) return ceiling_avx2<kSlots>(p, g, s, n);
#endif
    (void)isa;
    ceiling_tail<kSlots>(p, g, s, 0, n);
}

void ceiling_slots(int slots, Isa isa, float *p, const float *g, float *const *s, size_t n) {
    switch (slots) {
    case 1: return ceiling<1>(isa, p, g, s, n);
    case 2: return ceiling<2>(isa, p, g, s, n);
    default: return ceiling<3>(isa, p, g, s, n);
    }
}

struct Case {
    const char *torch_class;  // the name torch_optimizers.py prints
    Hyper hyper;
};

std::vector<Case> cases() {
    std::vector<Case> out;
    for (Kind k : {Kind::kAdamW, Kind::kAdagrad, Kind::kRmsprop, Kind::kAdamax, Kind::kNadam, Kind::kRadam,
                   Kind::kLion})
        out.push_back({sx::optim::spec_of(k).name, sx::optim::default_hyper(k)});
    return out;
}

// torch's fastest time per class (ms) at n elements, from bench/torch_optimizers.py run
// by `python` (with `extra` arguments: --torchao for torchao's AdamW8bit); empty where it
// cannot run.
std::map<std::string, double> torch_times(const std::string &python, size_t n, int reps, int threads,
                                          const std::string &extra = "") {
    std::map<std::string, double> out;
    if (python.empty()) return out;
    const std::string cmd = torch_command(python, SX_BENCH_SOURCE_DIR "/torch_optimizers.py --elements " +
                                                      std::to_string(n) + " --reps " + std::to_string(reps) +
                                                      " --threads " + std::to_string(threads) + " " + extra);
    FILE *f = popen(cmd.c_str(), "r");
    if (!f) return out;
    char line[1024];
    while (std::fgets(line, sizeof line, f)) {
        const char *c = std::strstr(line, "\"class\": \"");
        const char *ms = std::strstr(line, "\"ms\": ");
        if (!c || !ms) {
            std::printf("  (torch) %s", line);
            continue;
        }
        c += std::strlen("\"class\": \"");
        const char *end = std::strchr(c, '"');
        out[std::string(c, end)] = std::atof(ms + std::strlen("\"ms\": "));
    }
    pclose(f);
    return out;
}

// The Python that times the peers: --torch-python, else SX_BENCH_TORCH_PYTHON, else none.
std::string torch_python(const Options &opt) {
    if (opt.torch_python.empty() && std::getenv("SX_BENCH_TORCH_PYTHON")) return std::getenv("SX_BENCH_TORCH_PYTHON");
    return opt.torch_python;
}

}  // namespace

int section_optimizers(const Options &opt) {
    const Isa isa = sx::optim::detect_isa();
    const in::KernelTable &k = in::kernels_for(in::resolve_isa(isa));
    const int threads = 2;
    ThreadPool pool(threads);
    const std::string python = torch_python(opt);
    std::printf("optimizers: each optimizer fused (%s, %d threads) vs a ceiling with its memory pattern (param, grad "
                "and its state slots read, param and state written, trivial arithmetic), %d reps of the pair; "
                "ratio = median over reps of ceiling time / kernel time; vs_torch = torch's fastest CPU "
                "implementation's fastest step / sx's fastest (%s)\n",
                sx::optim::isa_name(isa), threads, opt.reps,
                python.empty() ? "not run: no --torch-python or SX_BENCH_TORCH_PYTHON" : python.c_str());
    std::printf("%-8s %10s %6s %10s %11s %12s %8s %9s %9s\n", "optim", "elements", "slots", "kernel_ms", "ceiling_ms",
                "kernel_GB/s", "ratio", "torch_ms", "vs_torch");
    std::vector<std::string> json;
    for (size_t n : {opt.elements, size_t(1) << 20}) {
        const std::map<std::string, double> peer = torch_times(python, n, opt.reps, threads);
        Streams s;
        HostBuffer extra;  // the third state slot
        if (!s.allocate(n) || !extra.allocate(n * sizeof(float), "benchmark stream").ok()) return 1;
        std::memset(s.m.as<float>(), 0, n * sizeof(float));
        std::memset(s.v.as<float>(), 0, n * sizeof(float));
        std::memset(extra.as<float>(), 0, n * sizeof(float));
        for (Case &c : cases()) {
            Segment seg = s.adamw_segment(&c.hyper, n);
            seg.state[2] = extra.as<float>();
            const int slots = sx::optim::state_slots(c.hyper);
            seg.step = 10;  // past Adagrad's first step and RAdam's untractable ones
            seg.mu_product = sx::optim::mu_product_after(c.hyper, seg.step);
            auto kernel = [&] { in::fused_update_with(k, &seg, 1, 1e-3f, &pool, in::kMinElementsPerThread, nullptr); };
            auto ceil = [&] {
                const int parts = in::threads_for(n, &pool, in::kMinElementsPerThread);
                const std::vector<in::Cut> cuts = in::partition(&seg, 1, parts);
                pool.run([&](int t) {
                    if (t < parts)
                        in::for_each_piece(&seg, cuts[t], cuts[t + 1], [&](size_t, size_t b, size_t e) {
                            float *st[3] = {seg.state[0] + b, seg.state[1] + b, seg.state[2] + b};
                            ceiling_slots(slots, isa, seg.param + b, seg.grad + b, st, e - b);
                        });
                });
            };
            const PairTimes t = time_pair(kernel, ceil, opt.reps);
            const double tk = t.min_a(), tc = t.min_b();
            const double bytes = (2.0 * slots + 3.0) * sizeof(float) * static_cast<double>(n);
            const auto found = peer.find(c.torch_class);
            const double torch_ms = found == peer.end() ? 0.0 : found->second;
            const double vs_torch = torch_ms > 0 ? torch_ms / (tk * 1e3) : 0.0;
            std::printf("%-8s %10zu %6d %10.3f %11.3f %12.2f %8.3f %9.3f %9.2f\n", c.torch_class, n, slots, tk * 1e3,
                        tc * 1e3, bytes / tk * 1e-9, t.paired_ratio(), torch_ms, vs_torch);
            char line[512];
            std::snprintf(line, sizeof line,
                          "{\"bench\":\"optimizers\",\"optimizer\":\"%s\",\"isa\":\"%s\",\"threads\":%d,"
                          "\"elements\":%zu,\"slots\":%d,\"reps\":%d,\"kernel_ms\":%.4f,\"ceiling_ms\":%.4f,"
                          "\"ratio_vs_ceiling\":%.4f,\"torch_ms\":%.4f,\"ratio_vs_torch\":%.4f}",
                          c.torch_class, sx::optim::isa_name(isa), threads, n, slots, opt.reps, tk * 1e3, tc * 1e3,
                          t.paired_ratio(), torch_ms, vs_torch);
            json.push_back(line);
        }
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench

// bench_sx section state_dtype: AdamW at --elements (64 Mi) with its two slots in fp32,
// bf16 and 8 bits (optim/state_codec.h), each fused (2 pool threads) against a
// traffic-only ceiling of its own bytes (param and grad read, param written, each slot's
// bytes read and written, 8-bit scales included), and 8 bits against torchao's AdamW8bit
// (bench/torch_optimizers.py --torchao, same elements and threads) where --torch-python names a
// Python with torch and torchao (or SX_BENCH_TORCH_PYTHON does).
namespace sxbench {
namespace {

// One pass over n elements: p += g, and each of two packed slots' elements read and
// written (T: uint16_t for bf16, uint8_t for codes), vectorised with AVX2 (which every
// CPU that runs the SIMD kernels has).
template <typename T>
#if SX_OPTIM_X86
__attribute__((target("avx2"), optimize("O3")))
#endif
void packed_ceiling(float *p, const float *g, T *a, T *b, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        p[i] += g[i];
        a[i] = static_cast<T>(a[i] + 1);
        b[i] = static_cast<T>(b[i] + 1);
    }
}

// The ceiling's pass over elements [b, e) of seg (b a block boundary where 8-bit): fp32's
// is the optimizers section's, with prefetch.
void state_ceiling_piece(const Segment &seg, Isa isa, size_t b, size_t e) {
    if (seg.state_dtype == SX_STATE_FP32) {
        float *st[2] = {seg.state[0] + b, seg.state[1] + b};
        ceiling<2>(isa, seg.param + b, seg.grad + b, st, e - b);
    } else if (seg.state_dtype == SX_STATE_BF16) {
        packed_ceiling(seg.param + b, seg.grad + b, seg.state16[0] + b, seg.state16[1] + b, e - b);
    } else {
        packed_ceiling(seg.param + b, seg.grad + b, seg.codes[0] + b, seg.codes[1] + b, e - b);
        for (size_t k = b / sx::optim::kQuantBlock; k < e / sx::optim::kQuantBlock; ++k)
            seg.scales[0][k] += 1.0f, seg.scales[1][k] += 1.0f;
    }
}

// Nanoseconds per element of fn(), which handles `elements` elements: the fastest of 7
// timings of `rounds` calls, after one untimed call.
template <typename Fn>
double ns_per_element(Fn &&fn, size_t elements, int rounds) {
    fn();
    double best = 1e30;
    for (int r = 0; r < 7; ++r) {
        const double t0 = now_seconds();
        for (int i = 0; i < rounds; ++i) fn();
        best = std::min(best, (now_seconds() - t0) / rounds);
    }
    return best * 1e9 / static_cast<double>(elements);
}

// What the 8-bit update spends per element on one thread, in cache (16 blocks of
// kQuantBlock, 64 KiB of fp32 params, grads and slots): one slot's encode (k.encode8),
// one slot's decode (k.decode8), AdamW8bit's formula on fp32 slots (the update without
// the codec), and the whole 8-bit update; against what the ceiling allows a thread per
// element (its time x threads / elements).
void state_block_costs(const in::KernelTable &k, double budget_ns, std::vector<std::string> *json) {
    constexpr size_t kElems = 16 * sx::optim::kQuantBlock;
    std::vector<float> p(kElems), g(kElems), m(kElems), v(kElems), scratch(kElems), sc0(16), sc1(16);
    std::vector<uint8_t> c0(kElems), c1(kElems);
    uint32_t x = 777;
    for (size_t i = 0; i < kElems; ++i) {
        x = x * 1664525u + 1013904223u;
        g[i] = static_cast<float>(static_cast<int32_t>(x)) * (1.0f / 2147483648.0f);
        p[i] = 0.5f * g[i] + 0.25f, m[i] = 0.1f * g[i], v[i] = 0.01f * g[i] * g[i];
    }
    const float *signed_map = sx::optim::kSignedMap, *unsigned_map = sx::optim::kUnsignedMap;
    for (size_t b = 0; b < 16; ++b) {
        sc0[b] = sx::optim::encode_block(&m[b * 256], 256, signed_map, &c0[b * 256]);
        sc1[b] = sx::optim::encode_block(&v[b * 256], 256, unsigned_map, &c1[b * 256]);
    }
    const uint8_t *lut = sx::optim::code_lut(signed_map);
    uint8_t out[sx::optim::kQuantBlock];
    const double enc = ns_per_element([&] {
        for (size_t b = 0; b < kElems; b += 256) k.encode8(&m[b], 256, signed_map, lut, out);
    }, kElems, 200);
    const double dec = ns_per_element([&] {
        for (size_t b = 0; b < kElems; b += 256) k.decode8(&c0[b], 256, sc0[b / 256], signed_map, &scratch[b]);
    }, kElems, 200);
    Hyper h = sx::optim::default_hyper(Kind::kAdamW);
    h.state_dtype = SX_STATE_8BIT;
    Segment seg;
    seg.param = p.data(), seg.grad = g.data(), seg.state[0] = m.data(), seg.state[1] = v.data();
    seg.n = kElems, seg.hyper = &h, seg.step = 10;
    const in::SegmentConsts consts = in::make_consts(seg, 1.0f);
    const double formula = ns_per_element([&] { k.update(seg, consts, 0, kElems); }, kElems, 200);
    seg.state_dtype = SX_STATE_8BIT;
    seg.state[0] = seg.state[1] = nullptr;
    seg.codes[0] = c0.data(), seg.codes[1] = c1.data(), seg.scales[0] = sc0.data(), seg.scales[1] = sc1.data();
    const double whole = ns_per_element([&] { k.update(seg, consts, 0, kElems); }, kElems, 200);
    std::printf("8-bit in cache, ns per element on one thread (the ceiling allows %.3f): encode a slot %.3f, decode "
                "a slot %.3f, AdamW8bit's formula on fp32 slots %.3f, the whole 8-bit update %.3f\n",
                budget_ns, enc, dec, formula, whole);
    char line[400];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"state_dtype_in_cache\",\"isa\":\"%s\",\"budget_ns\":%.4f,\"encode_ns\":%.4f,"
                  "\"decode_ns\":%.4f,\"formula_ns\":%.4f,\"update_8bit_ns\":%.4f}",
                  k.name, budget_ns, enc, dec, formula, whole);
    json->push_back(line);
}

}  // namespace

int section_state_dtype(const Options &opt) {
    const Isa isa = sx::optim::detect_isa();
    const in::KernelTable &k = in::kernels_for(in::resolve_isa(isa));
    const int threads = 2;
    ThreadPool pool(threads);
    const std::string python = torch_python(opt);
    const size_t n = opt.elements / sx::optim::kQuantBlock * sx::optim::kQuantBlock;
    std::printf("state_dtype: AdamW over %zu elements with its slots in fp32, bf16 and 8 bits (%s, %d threads), each "
                "vs a ceiling of its own bytes, %d reps of the pair; ratio = median over reps of ceiling time / kernel "
                "time; vs_fp32 = fp32's fastest / this one's; torchao = AdamW8bit's fastest step (%s)\n",
                n, sx::optim::isa_name(isa), threads, opt.reps,
                python.empty() ? "not run: no --torch-python or SX_BENCH_TORCH_PYTHON" : python.c_str());
    const std::map<std::string, double> peer = torch_times(python, n, opt.reps, threads, "--torchao");
    Streams s;
    HostBuffer packed[2], scales[2];
    if (!s.allocate(n)) return 1;
    for (int j = 0; j < 2; ++j)
        if (!packed[j].allocate(2 * n, "benchmark slot").ok() ||
            !scales[j].allocate(n / sx::optim::kQuantBlock * sizeof(float), "benchmark scales").ok())
            return 1;
    std::printf("%-6s %10s %11s %12s %8s %8s %11s %11s\n", "state", "kernel_ms", "ceiling_ms", "B/element", "ratio",
                "vs_fp32", "torchao_ms", "vs_torchao");
    std::vector<std::string> json;
    double fp32_ms = 0;
    for (int32_t dtype : {SX_STATE_FP32, SX_STATE_BF16, SX_STATE_8BIT}) {
        Hyper h = sx::optim::default_hyper(Kind::kAdamW);
        h.state_dtype = dtype;
        std::memset(s.m.as<float>(), 0, n * sizeof(float));
        std::memset(s.v.as<float>(), 0, n * sizeof(float));
        for (int j = 0; j < 2; ++j) {
            std::memset(packed[j].data(), 0, 2 * n);
            std::memset(scales[j].data(), 0, n / sx::optim::kQuantBlock * sizeof(float));
        }
        Segment seg = s.adamw_segment(&h, n);
        seg.state_dtype = dtype;
        for (int j = 0; j < 2 && dtype != SX_STATE_FP32; ++j) {
            seg.state[j] = nullptr;
            seg.state16[j] = dtype == SX_STATE_BF16 ? packed[j].as<uint16_t>() : nullptr;
            seg.codes[j] = dtype == SX_STATE_8BIT ? packed[j].as<uint8_t>() : nullptr;
            seg.scales[j] = dtype == SX_STATE_8BIT ? scales[j].as<float>() : nullptr;
        }
        seg.step = 10;
        auto kernel = [&] { in::fused_update_with(k, &seg, 1, 1.0f, &pool, in::kMinElementsPerThread, nullptr); };
        auto ceil = [&] {
            const int parts = in::threads_for(n, &pool, in::kMinElementsPerThread);
            const std::vector<in::Cut> cuts = in::partition(&seg, 1, parts);
            pool.run([&](int t) {
                if (t < parts)
                    in::for_each_piece(&seg, cuts[t], cuts[t + 1],
                                       [&](size_t, size_t b, size_t e) { state_ceiling_piece(seg, isa, b, e); });
            });
        };
        const PairTimes t = time_pair(kernel, ceil, opt.reps);
        const double tk = t.min_a() * 1e3, tc = t.min_b() * 1e3;
        if (dtype == SX_STATE_FP32) fp32_ms = tk;
        const double slot = dtype == SX_STATE_8BIT ? 1.0 + 4.0 / sx::optim::kQuantBlock
                                                   : static_cast<double>(sx::optim::state_elem_bytes(dtype));
        const double per_element = 12.0 + 4.0 * slot;  // p, g read; p written; two slots read and written
        const auto found = peer.find("AdamW8bit");
        const double torchao_ms = dtype == SX_STATE_8BIT && found != peer.end() ? found->second : 0.0;
        std::printf("%-6s %10.2f %11.2f %12.3f %8.3f %8.2f %11.2f %11.2f\n", sx::optim::state_dtype_name(dtype), tk,
                    tc, per_element, t.paired_ratio(), fp32_ms / tk, torchao_ms, torchao_ms > 0 ? torchao_ms / tk : 0.0);
        char line[512];
        std::snprintf(line, sizeof line,
                      "{\"bench\":\"state_dtype\",\"state\":\"%s\",\"isa\":\"%s\",\"threads\":%d,\"elements\":%zu,"
                      "\"reps\":%d,\"kernel_ms\":%.4f,\"ceiling_ms\":%.4f,\"bytes_per_element\":%.4f,"
                      "\"ratio_vs_ceiling\":%.4f,\"ratio_vs_fp32\":%.4f,\"torchao_ms\":%.4f,\"ratio_vs_torchao\":%.4f}",
                      sx::optim::state_dtype_name(dtype), sx::optim::isa_name(isa), threads, n, opt.reps, tk, tc,
                      per_element, t.paired_ratio(), fp32_ms / tk, torchao_ms, torchao_ms > 0 ? torchao_ms / tk : 0.0);
        json.push_back(line);
        if (dtype == SX_STATE_8BIT) state_block_costs(k, tc * 1e6 * threads / static_cast<double>(n), &json);
    }
    for (const std::string &l : json) std::printf("%s\n", l.c_str());
    return 0;
}

}  // namespace sxbench
