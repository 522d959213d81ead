// What the optimizers that look at whole params (LAMB, Muon, Adafactor) share in their
// passes over a rank's segments: work split into pieces of fixed size, whose partial sums
// are added in piece order (the same bits for any thread count), run across the pool; and
// torch's lerp_ of fp32 tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "optim/optimizer.h"
#include "optim/thread_pool.h"

namespace sx {
namespace optim {

// Loops compiled for AVX-512, AVX2 and the baseline, the one for this processor chosen
// when the library loads (GCC's target_clones, resolved through an ifunc). Not under
// ThreadSanitizer, whose instrumented resolvers would run before it has started.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define SX_PASS_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SX_PASS_CLONES
#endif

// Elements per piece: a piece's partial sums are added in piece order.
constexpr size_t kPassPiece = 4096;

// A piece of work: elements [lo, hi) of segment `seg`.
struct PassPiece {
    size_t seg, lo, hi;
};

// Every segment cut into pieces of kPassPiece elements, in segment order.
inline std::vector<PassPiece> pass_pieces(const Segment *segs, size_t num_segs) {
    std::vector<PassPiece> out;
    for (size_t s = 0; s < num_segs; ++s)
        for (size_t lo = 0; lo < segs[s].n; lo += kPassPiece)
            out.push_back({s, lo, std::min(segs[s].n, lo + kPassPiece)});
    return out;
}

// fn(i) for every i in [0, count), split into contiguous runs across the pool (the
// caller's thread alone without one).
template <typename F>
void for_each_index(size_t count, ThreadPool *pool, F fn) {
    const int threads = pool ? static_cast<int>(std::min<size_t>(static_cast<size_t>(pool->size()), count)) : 1;
    if (threads <= 1) {
        for (size_t i = 0; i < count; ++i) fn(i);
        return;
    }
    pool->run([&](int t) {
        if (t >= threads) return;
        const size_t begin = count * static_cast<size_t>(t) / threads, end = count * static_cast<size_t>(t + 1) / threads;
        for (size_t i = begin; i < end; ++i) fn(i);
    });
}

// torch's lerp_ of fp32 tensors with a scalar weight w: self + w * (end - self) for
// |w| < 0.5, else end - (1 - w) * (end - self).
struct Lerp {
    float coeff;
    bool from_end;
    explicit Lerp(double weight) {
        const float w = static_cast<float>(weight);
        from_end = !(std::fabs(w) < 0.5f);
        coeff = from_end ? -(1.0f - w) : w;
    }
    float operator()(float self, float end) const { return (from_end ? end : self) + coeff * (end - self); }
};

}  // namespace optim
}  // namespace sx
