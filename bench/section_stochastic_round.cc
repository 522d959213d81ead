// bench_sx section stochastic_round: whether the rounding of bf16_stochastic_round
// (optim/stochastic_round.h; KernelTable::round_stochastic) keeps up with the memory it
// touches. Three kinds of figure, each against a ceiling measured in the same run:
//   block   the rounding of one cache-sized block (optim's kCastBlock, 4096 floats, as the
//           update rounds it), repeated: against truncating the same block into bf16 (the
//           same loads and stores without the hash), the in-cache ceiling. By the loops
//           the compiler vectorises (stochastic_round, the scalar flavour's) and by this
//           CPU's kernel flavour's (hand-written AVX2 or AVX-512).
//   stream  the rounding of --elements floats from memory into bf16, both ways: against
//           truncation of the same streams (4 bytes read and 2 written per element).
//   update  AdamW with bf16 state over --elements bf16 params without masters (widen,
//           update, round, block by block; 2 pool threads): against a traffic-only pass of
//           its bytes (bf16 param read and written, fp32 gradient read, two bf16 slots read
//           and written: 16 bytes per element), and against the same AdamW keeping fp32
//           masters (rounding them to nearest into bf16 params: 22 bytes per element).
// ratio = median over reps of ceiling time / measured time (1 = at the ceiling).
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "optim/kernels.h"
#include "optim/optimizer.h"
#include "optim/stochastic_round.h"
#include "optim/thread_pool.h"

namespace sxbench {
namespace {

using sx::optim::Segment;
using sx::optim::ThreadPool;
namespace in = sx::optim::internal;

// The ceilings: the upper 16 bits of each float (truncation), vectorised with AVX2, and
// the update's bytes with trivial arithmetic.
#if SX_OPTIM_X86
__attribute__((target("avx2"), optimize("O3")))
#endif
void truncate_ceiling(const float *x, uint16_t *out, size_t n) {
    const uint32_t *bits = reinterpret_cast<const uint32_t *>(x);
    for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint16_t>(bits[i] >> 16);
}

#if SX_OPTIM_X86
__attribute__((target("avx2"), optimize("O3")))
#endif
void update_ceiling(uint16_t *p, const float *g, uint16_t *a, uint16_t *b, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        p[i] = static_cast<uint16_t>(p[i] + static_cast<uint16_t>(g[i] > 0.0f));
        a[i] = static_cast<uint16_t>(a[i] + 1);
        b[i] = static_cast<uint16_t>(b[i] + 1);
    }
}

struct Row {
    std::string what;
    size_t elements;
    double ms, ceiling_ms, ratio;
};

using RoundFn = void (*)(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element);

Row rounding_row(const std::string &what, RoundFn round, size_t n, int repeat, int reps) {
    std::vector<float> x(n);
    std::vector<uint16_t> out(n);
    for (size_t i = 0; i < n; ++i) x[i] = 0.001f * static_cast<float>((i * 7919) % 100003) - 50.0f;
    auto sr = [&] {
        for (int r = 0; r < repeat; ++r) round(x.data(), out.data(), n, 12345u + r, 0);
    };
    auto ceil = [&] {
        for (int r = 0; r < repeat; ++r) truncate_ceiling(x.data(), out.data(), n);
    };
    const PairTimes t = time_pair(sr, ceil, reps);
    return {what, n, t.min_a() * 1e3, t.min_b() * 1e3, t.paired_ratio()};
}

// AdamW with bf16 slots over n bf16 params without masters, and (masters) the same with
// fp32 masters rounded to nearest into the bf16 params.
Row update_row(size_t n, int reps, bool masters) {
    const in::KernelTable &k = in::kernels_for(in::resolve_isa(sx::optim::detect_isa()));
    ThreadPool pool(2);
    Streams s;
    std::vector<uint16_t> params(n, 0x3F00), slot_a(n, 0), slot_b(n, 0);
    if (!s.allocate(n)) std::exit(1);
    sx::optim::Hyper h = sx::optim::default_hyper(sx::optim::Kind::kAdamW);
    h.state_dtype = SX_STATE_BF16;
    h.bf16_stochastic_round = !masters;
    Segment seg = s.adamw_segment(&h, n);
    seg.state_dtype = SX_STATE_BF16;
    seg.state[0] = seg.state[1] = nullptr;
    seg.state16[0] = slot_a.data();
    seg.state16[1] = slot_b.data();
    seg.compute_out = params.data();
    seg.compute_dtype = SX_DTYPE_BF16;
    seg.stochastic_round = !masters;
    if (!masters) seg.param = nullptr;
    seg.step = 10;
    seg.param_index = 0;
    auto kernel = [&] { in::fused_update_with(k, &seg, 1, 1.0f, &pool, in::kMinElementsPerThread, nullptr); };
    auto ceil = [&] {
        pool.run([&](int t) {
            const size_t b = n / 2 * static_cast<size_t>(t), e = t == 0 ? n / 2 : n;
            update_ceiling(params.data() + b, s.grad.as<float>() + b, slot_a.data() + b, slot_b.data() + b, e - b);
        });
    };
    const PairTimes t = time_pair(kernel, ceil, reps);
    return {masters ? "update_masters" : "update", n, t.min_a() * 1e3, t.min_b() * 1e3, t.paired_ratio()};
}

}  // namespace

int section_stochastic_round(const Options &opt) {
    const size_t block = 4096;
    std::printf("stochastic_round: %s; %d reps of each pair; ratio = median over reps of ceiling time / time\n",
                sx::optim::isa_name(sx::optim::detect_isa()), opt.reps);
    // The loops the compiler vectorises (the scalar flavour's), and each hand-written
    // flavour this CPU runs.
    std::vector<std::pair<std::string, RoundFn>> rounds = {{"compiler", &sx::optim::stochastic_round}};
    const sx::optim::Isa best = sx::optim::detect_isa();
    for (sx::optim::Isa isa : {sx::optim::Isa::kAvx2, sx::optim::Isa::kAvx512})
        if (isa <= best && best != sx::optim::Isa::kScalar)
            rounds.push_back({in::kernels_for(isa).name, in::kernels_for(isa).round_stochastic});
    std::vector<Row> rows;
    for (const auto &r : rounds)
        rows.push_back(rounding_row("block_" + r.first, r.second, block, static_cast<int>(opt.elements / block), opt.reps));
    for (const auto &r : rounds) rows.push_back(rounding_row("stream_" + r.first, r.second, opt.elements, 1, opt.reps));
    rows.push_back(update_row(opt.elements, opt.reps, false));
    rows.push_back(update_row(opt.elements, opt.reps, true));
    std::printf("%-15s %10s %10s %11s %8s\n", "figure", "elements", "ms", "ceiling_ms", "ratio");
    for (const Row &r : rows)
        std::printf("%-15s %10zu %10.3f %11.3f %8.3f\n", r.what.c_str(), r.elements, r.ms, r.ceiling_ms, r.ratio);
    for (const Row &r : rows)
        std::printf("{\"bench\":\"stochastic_round\",\"figure\":\"%s\",\"isa\":\"%s\",\"elements\":%zu,\"reps\":%d,"
                    "\"ms\":%.4f,\"ceiling_ms\":%.4f,\"ratio_vs_ceiling\":%.4f}\n",
                    r.what.c_str(), sx::optim::isa_name(sx::optim::detect_isa()), r.elements, opt.reps, r.ms, r.ceiling_ms,
                    r.ratio);
    return 0;
}

}  // namespace sxbench
