// The fused optimizer kernels on a CUDA device: one launch updates every segment of a
// step (the table and block assignment of launch_plan.h), then one block adds the
// blocks' partial sums of squares in block order.
//
// Rounding: the element formulas are kernel_body.h's, operation for operation, each
// with an explicitly rounded intrinsic (__fmul_rn, __fadd_rn, __fsub_rn, __fdiv_rn,
// __fsqrt_rn), which nvcc never contracts into a fused multiply-add, and denormals are
// kept (no -ftz); the constants are the CPU's (make_consts, in double on the host). So
// every element equals reference_update()'s bit for bit. Packed state (state_codec.h) is
// decoded into fp32, updated by the same element bodies and encoded again with the host
// kernels' operations (kernel_body.h): bf16 slots one element at a time, 8-bit slots a
// quantization block per thread block (packed8_chunk). The bf16/fp16 outputs are
// __float2bfloat16_rn / __float2half_rn of the updated fp32 value: round to nearest
// even, NaN stays NaN, overflow gives inf. bf16 params without masters
// (bf16_stochastic_round) are widened, updated by the same bodies and rounded back with
// stochastic_round.h's own functions, one element at a time.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstring>

#include "cuda/status.h"
#include "optim/cuda/launch_plan.h"
#include "optim/elementwise.h"
#include "optim/stochastic_round.h"

namespace sx {
namespace optim {
namespace cuda {

namespace internal {
namespace {

using optim::internal::SegmentConsts;
using optim::internal::Variant;

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }

// A thread's share of GradStats.
struct Acc {
    double sumsq;
    unsigned nonfinite;
};

__device__ __forceinline__ void account(Acc &acc, float g) {
    const double d = static_cast<double>(g);
    acc.sumsq += d * d;  // exact square of a float in double
    acc.nonfinite += isfinite(g) ? 0u : 1u;
}

// elementwise.h's operations, each explicitly rounded (never contracted into an FMA).
struct CudaOps {
    using V = float;
    using Mask = bool;
    __device__ __forceinline__ static V set1(float x) { return x; }
    __device__ __forceinline__ static Mask mask(bool b) { return b; }
    __device__ __forceinline__ static V add(V a, V b) { return __fadd_rn(a, b); }
    __device__ __forceinline__ static V sub(V a, V b) { return __fsub_rn(a, b); }
    __device__ __forceinline__ static V mul(V a, V b) { return __fmul_rn(a, b); }
    __device__ __forceinline__ static V div(V a, V b) { return __fdiv_rn(a, b); }
    __device__ __forceinline__ static V sqrt(V a) { return __fsqrt_rn(a); }
    __device__ __forceinline__ static V maximum(V a, V b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
    __device__ __forceinline__ static V select(Mask m, V a, V b) { return m ? b : a; }
    __device__ __forceinline__ static V abs(V a) { return fabsf(a); }
    __device__ __forceinline__ static V sign(V a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
    __device__ __forceinline__ static V recip(V a) { return __fdiv_rn(1.0f, a); }
};

// State slots a variant reads and writes (SGD's first momentum step writes its buffer
// without reading it: torch creates it as clone(grad); so does Adagrad's first step).
__host__ __device__ constexpr int slots_read(Variant v) {
    return v == Variant::kSgd || v == Variant::kSgdMomentumFirst ? 0
           : v == Variant::kSgdMomentum                        ? 1
           : v == Variant::kAdam                               ? 2
           : v == Variant::kAdamAmsgrad                        ? 3
                                                               : optim::internal::elementwise_reads(v);
}
__host__ __device__ constexpr int slots_written(Variant v) {
    return v == Variant::kSgdMomentumFirst ? 1
           : v == Variant::kSgd || v == Variant::kSgdMomentum || v == Variant::kAdam || v == Variant::kAdamAmsgrad
               ? slots_read(v)
               : optim::internal::elementwise_writes(v);
}

// elementwise.h's element of variant kV with the segment's constants.
template <Variant kV>
__device__ __forceinline__ void elementwise_element(const SegmentConsts &c, float &p, float g, float &s0, float &s1,
                                                    float &s2) {
    const optim::internal::ElementwiseConsts<CudaOps> k(c);
    float s[3] = {s0, s1, s2};
    if (c.l2)
        optim::internal::elementwise_at<CudaOps, kV, true>(k, p, g, s);
    else
        optim::internal::elementwise_at<CudaOps, kV, false>(k, p, g, s);
    s0 = s[0], s1 = s[1], s2 = s[2];
}

// One element of the update of variant kV (kernel_body.h's sgd_at and adam_at, in the same
// order, and elementwise.h's bodies). The variant is a template argument, chosen once per
// chunk (run_chunk): a switch per element costs the fp32 AdamW update an eighth of its speed.
template <Variant kV>
__device__ __forceinline__ void update_element(const SegmentConsts &c, float &p, float grad, float &s0,
                                               float &s1, float &s2, bool stats, Acc &acc) {
    float g = mul(grad, c.grad_scale);  // maximize is folded into the sign of grad_scale
    if (stats) account(acc, g);
    if constexpr (kV != Variant::kSgd && kV != Variant::kSgdMomentumFirst && kV != Variant::kSgdMomentum &&
                  kV != Variant::kAdam && kV != Variant::kAdamAmsgrad) {
        elementwise_element<kV>(c, p, g, s0, s1, s2);
    } else if constexpr (kV == Variant::kAdam || kV == Variant::kAdamAmsgrad) {
        const float pv = mul(p, c.decay);                      // AdamW: param.mul_(1 - lr*wd)
        if (c.l2) g = add(g, mul(c.weight_decay, pv));         // Adam: grad.add(param, alpha=wd)
        const float m = add(c.lerp_from_end ? g : s0, mul(c.lerp_coeff, sub(g, s0)));  // lerp_
        s0 = m;
        float v = add(mul(s1, c.beta2), mul(mul(c.one_minus_beta2, g), g));  // mul_, addcmul_
        s1 = v;
        if constexpr (kV == Variant::kAdamAmsgrad) {  // torch.maximum: NaN if either is NaN
            v = s2 != s2 ? s2 : (s2 > v ? s2 : v);
            s2 = v;
        }
        const float denom = add(div(sqrt_rn(v), c.bias_correction2_sqrt), c.eps);
        p = sub(pv, div(mul(c.step_size, m), denom));  // addcdiv_(m, denom, -step_size)
    } else {
        if (c.l2) g = add(g, mul(c.weight_decay, p));
        if constexpr (kV == Variant::kSgdMomentumFirst) {
            s0 = g;
            if (c.nesterov) g = add(g, mul(c.momentum, g));
        } else if constexpr (kV == Variant::kSgdMomentum) {
            const float b = add(mul(s0, c.momentum), mul(c.one_minus_dampening, g));
            s0 = b;
            g = c.nesterov ? add(g, mul(c.momentum, b)) : b;
        }
        p = sub(p, mul(c.lr, g));
    }
}

// The update's data movement without its arithmetic (benchmark ceiling): every value
// written is one that was read, so nothing can be optimised away.
__device__ __forceinline__ void move_element(float &p, float grad, float &s0, float &s1, float &s2) {
    const float p0 = p, a = s0, b = s1;
    p = grad;
    s0 = p0;
    s1 = a;
    s2 = b;
}

__device__ __forceinline__ unsigned short to_compute(float x, int32_t dtype) {
    if (dtype == static_cast<int32_t>(ComputeDtype::kBf16)) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    return __half_as_ushort(__float2half_rn(x));
}
// Traffic only: the high half of the bits, no rounding.
__device__ __forceinline__ unsigned short to_compute_moved(float x) {
    return static_cast<unsigned short>(__float_as_uint(x) >> 16);
}

// Gradient e of segment t in fp32: read, or widened from 16 bits (exactly).
__device__ __forceinline__ float widen16(uint16_t h, int32_t dtype) {
    if (dtype == static_cast<int32_t>(ComputeDtype::kBf16)) return __uint_as_float(static_cast<unsigned>(h) << 16);
    return __half2float(__ushort_as_half(h));
}
__device__ __forceinline__ float grad_at(const TableSegment &t, uint64_t e) {
    return t.grad16 ? widen16(t.grad16[e], t.grad_dtype) : t.grad[e];
}

template <Mode M, Variant kV>
__device__ __forceinline__ void element(const TableSegment &t, float &p, float g, float &s0, float &s1, float &s2,
                                        bool stats, Acc &acc) {
    if constexpr (M == Mode::kTrafficOnly)
        move_element(p, g, s0, s1, s2);
    else
        update_element<kV>(t.c, p, g, s0, s1, s2, stats, acc);
}

// The state slots a chunk of variant kV reads and writes in mode M.
template <Mode M, Variant kV>
constexpr int kReads = M == Mode::kStats ? 0 : slots_read(kV);
template <Mode M, Variant kV>
constexpr int kWrites = M == Mode::kStats ? 0 : slots_written(kV);

// bf16 state: kernel_body.h's widen_bf16 and narrow_bf16 (round to nearest even; a NaN
// keeps its high half with the quiet bit set, where __float2bfloat16_rn would give
// another NaN's bits).
__device__ __forceinline__ float widen_bf16(uint16_t h) { return __uint_as_float(static_cast<unsigned>(h) << 16); }
__device__ __forceinline__ uint16_t narrow_bf16(float f) {
    const unsigned x = __float_as_uint(f);
    const unsigned rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : rounded);
}

// Slot k's element e as fp32 (fp32 or bf16 slots; 8-bit ones go a block at a time).
// Only the packed kernel (kUpdatePacked) asks.
template <Mode M>
__device__ __forceinline__ float load_slot(const TableSegment &t, int k, uint64_t e) {
    return M == Mode::kUpdatePacked && t.state_dtype == SX_STATE_BF16 ? widen_bf16(t.state16[k][e]) : t.state[k][e];
}
template <Mode M>
__device__ __forceinline__ void store_slot(const TableSegment &t, int k, uint64_t e, float v) {
    if (M == Mode::kUpdatePacked && t.state_dtype == SX_STATE_BF16)
        t.state16[k][e] = narrow_bf16(v);
    else
        t.state[k][e] = v;
}

// Param e in fp32: read, or (bf16_stochastic_round) its bf16 value widened, exactly.
__device__ __forceinline__ float load_param(const TableSegment &t, uint64_t e) {
    return t.stochastic_round ? widen_bf16(static_cast<const uint16_t *>(t.out)[e]) : t.param[e];
}

// The updated param e, and its copy in the compute dtype if the segment has one; a
// segment of bf16 params without masters rounds it stochastically into them, with the
// host's hash and rounding (stochastic_round.h), so that its bits are the CPU's.
template <Mode M>
__device__ __forceinline__ void store_param(const TableSegment &t, uint64_t e, float p) {
    if (t.stochastic_round) {
        static_cast<uint16_t *>(t.out)[e] = bf16_round_stochastic(p, random16(t.sr_key, t.param_offset + e));
        return;
    }
    t.param[e] = p;
    if (t.out_dtype != static_cast<int32_t>(ComputeDtype::kNone)) {
        unsigned short *out = static_cast<unsigned short *>(t.out);
        out[e] = M == Mode::kTrafficOnly ? to_compute_moved(p) : to_compute(p, t.out_dtype);
    }
}

// Element e of segment t, one at a time (segment ends, misaligned segments, bf16 state).
template <Mode M, Variant kV>
__device__ __forceinline__ void scalar_at(const TableSegment &t, uint64_t e, bool stats, Acc &acc) {
    const float g = grad_at(t, e);
    if (M == Mode::kStats) {
        account(acc, mul(g, t.c.grad_scale));
        return;
    }
    float p = load_param(t, e);
    float s[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < kReads<M, kV>; ++k) s[k] = load_slot<M>(t, k, e);
    element<M, kV>(t, p, g, s[0], s[1], s[2], stats, acc);
    store_param<M>(t, e, p);
#pragma unroll
    for (int k = 0; k < kWrites<M, kV>; ++k) store_slot<M>(t, k, e, s[k]);
}

template <Mode M, Variant kV>
__device__ __forceinline__ void scalar_range(const TableSegment &t, uint64_t lo, uint64_t hi, bool stats, Acc &acc) {
    for (uint64_t q = lo + threadIdx.x; q < hi; q += kThreads) scalar_at<M, kV>(t, q - t.lead, stats, acc);
}

__device__ __forceinline__ float4 load4(const float *base, uint64_t e) {
    return *reinterpret_cast<const float4 *>(base + e);
}
__device__ __forceinline__ void store4(float *base, uint64_t e, float4 v) {
    *reinterpret_cast<float4 *>(base + e) = v;
}
// Gradients e..e+3 of segment t (16-bit ones: 8 bytes, aligned as the plan checked).
__device__ __forceinline__ float4 grad4(const TableSegment &t, uint64_t e) {
    if (!t.grad16) return load4(t.grad, e);
    const uint2 raw = *reinterpret_cast<const uint2 *>(t.grad16 + e);
    return make_float4(widen16(static_cast<uint16_t>(raw.x & 0xffffu), t.grad_dtype),
                       widen16(static_cast<uint16_t>(raw.x >> 16), t.grad_dtype),
                       widen16(static_cast<uint16_t>(raw.y & 0xffffu), t.grad_dtype),
                       widen16(static_cast<uint16_t>(raw.y >> 16), t.grad_dtype));
}

// Groups [g0, g1) of 4 positions (16-byte aligned in every buffer), kIlp groups per
// thread in flight: all loads first, then the arithmetic, then the stores.
template <Mode M, Variant kV>
__device__ __forceinline__ void vector_range(const TableSegment &t, uint64_t g0, uint64_t g1, bool stats, Acc &acc) {
    for (uint64_t base = g0 + threadIdx.x; base < g1; base += uint64_t(kThreads) * kIlp) {
        float4 g[kIlp], p[kIlp], s[3][kIlp];
        bool live[kIlp];
#pragma unroll
        for (unsigned k = 0; k < kIlp; ++k) {
            const uint64_t grp = base + uint64_t(k) * kThreads;
            live[k] = grp < g1;
            if (!live[k]) continue;
            const uint64_t e = grp * 4 - t.lead;
            g[k] = grad4(t, e);
            if (M == Mode::kStats) continue;
            p[k] = load4(t.param, e);
#pragma unroll
            for (int j = 0; j < 3; ++j) s[j][k] = j < kReads<M, kV> ? load4(t.state[j], e) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (unsigned k = 0; k < kIlp; ++k) {
            if (!live[k]) continue;
            if (M == Mode::kStats) {
                const float sc = t.c.grad_scale;
                account(acc, mul(g[k].x, sc));
                account(acc, mul(g[k].y, sc));
                account(acc, mul(g[k].z, sc));
                account(acc, mul(g[k].w, sc));
                continue;
            }
            element<M, kV>(t, p[k].x, g[k].x, s[0][k].x, s[1][k].x, s[2][k].x, stats, acc);
            element<M, kV>(t, p[k].y, g[k].y, s[0][k].y, s[1][k].y, s[2][k].y, stats, acc);
            element<M, kV>(t, p[k].z, g[k].z, s[0][k].z, s[1][k].z, s[2][k].z, stats, acc);
            element<M, kV>(t, p[k].w, g[k].w, s[0][k].w, s[1][k].w, s[2][k].w, stats, acc);
            const uint64_t e = (base + uint64_t(k) * kThreads) * 4 - t.lead;
            store4(t.param, e, p[k]);
#pragma unroll
            for (int j = 0; j < 3; ++j)
                if (j < kWrites<M, kV>) store4(t.state[j], e, s[j][k]);
            if (t.out_dtype != static_cast<int32_t>(ComputeDtype::kNone)) {
                const float4 v = p[k];
                unsigned short h[4];
                if (M == Mode::kTrafficOnly) {
                    h[0] = to_compute_moved(v.x), h[1] = to_compute_moved(v.y);
                    h[2] = to_compute_moved(v.z), h[3] = to_compute_moved(v.w);
                } else {
                    h[0] = to_compute(v.x, t.out_dtype), h[1] = to_compute(v.y, t.out_dtype);
                    h[2] = to_compute(v.z, t.out_dtype), h[3] = to_compute(v.w, t.out_dtype);
                }
                const uint2 packed = make_uint2(h[0] | (unsigned(h[1]) << 16), h[2] | (unsigned(h[3]) << 16));
                *reinterpret_cast<uint2 *>(static_cast<unsigned short *>(t.out) + e) = packed;
            }
        }
    }
}

// Chunk `local` of segment t: positions [local*kChunk, (local+1)*kChunk) that hold
// elements, i.e. within [lead, lead + n).
template <Mode M, Variant kV>
__device__ __forceinline__ void run_chunk_of(const TableSegment &t, uint64_t local, bool stats, Acc &acc) {
    const uint64_t first = local * kChunk;
    const uint64_t lo = first > t.lead ? first : t.lead;
    const uint64_t end = t.lead + t.n;
    const uint64_t hi = first + kChunk < end ? first + kChunk : end;
    const uint64_t vlo = (lo + 3) & ~uint64_t(3), vhi = hi & ~uint64_t(3);
    if (!t.vector || vlo >= vhi) {
        scalar_range<M, kV>(t, lo, hi, stats, acc);
        return;
    }
    scalar_range<M, kV>(t, lo, vlo, stats, acc);
    vector_range<M, kV>(t, vlo / 4, vhi / 4, stats, acc);
    scalar_range<M, kV>(t, vhi, hi, stats, acc);
}

// ------------------------------------------------- 8-bit block-wise state (state_codec.h)

// kSignedMap and kUnsignedMap, copied here by Workspace::Impl::init (per device).
__device__ float g_state_maps[2][kQuantBlock];

// What a block's threads share while they update 8-bit state: the maps, read by each
// encoder's binary search at addresses of its own (shared memory serves those in one pass
// where the constant cache would serialise them), and the warps' part of a reduction.
struct PackedShared {
    float maps[2][kQuantBlock];
    float warp_max[kThreads / 32];
    int warp_nan[kThreads / 32];
};
__device__ __forceinline__ PackedShared &packed_shared() {
    __shared__ PackedShared shared;
    return shared;
}

// The scale of the block whose element on this thread is x, on every thread: its largest
// magnitude clipped to at least 1e-12, NaN (0x7fc00000, kernel_body.h's block_scale) if any
// element is NaN. The maximum of magnitudes that are not NaN is the same in any order.
__device__ __forceinline__ float block_scale(float x, PackedShared &sh) {
    const float a = fabsf(x);
    const bool nan = a != a;
    float most = nan ? 0.0f : a;
    for (int offset = 16; offset > 0; offset /= 2) most = fmaxf(most, __shfl_xor_sync(0xffffffffu, most, offset));
    const bool warp_nan = __any_sync(0xffffffffu, nan) != 0;
    const unsigned warp = threadIdx.x / 32;
    if (threadIdx.x % 32 == 0) {
        sh.warp_max[warp] = most;
        sh.warp_nan[warp] = warp_nan ? 1 : 0;
    }
    __syncthreads();
    bool any_nan = false;
    for (unsigned w = 0; w < kThreads / 32; ++w) {
        most = fmaxf(most, sh.warp_max[w]);
        any_nan = any_nan || sh.warp_nan[w] != 0;
    }
    __syncthreads();  // the warps' parts are rewritten by the next call
    return any_nan ? __uint_as_float(0x7fc00000u) : (most < 1e-12f ? 1e-12f : most);
}

// The nearest code of y in map, ties to the larger: state_codec.cc's nearest_code (a
// binary search for the largest c with map[c] <= y, 0 if none or y is NaN, then a step up
// where y lies at least half-way to the next entry), each operation rounded once.
__device__ __forceinline__ uint8_t nearest_code(float y, const float *map) {
    int c = y >= map[128] ? 128 : 0;
#pragma unroll
    for (int k = 64; k >= 1; k /= 2)
        if (y >= map[c + k]) c += k;
    const int up = c < 255 ? c + 1 : 255;
    return static_cast<uint8_t>(sub(y, map[c]) >= mul(sub(map[up], map[c]), 0.5f) ? up : c);
}

// Chunk `local` of a segment of 8-bit state, a quantization block at a time (kernel_body.h's
// packed_range): every slot decoded (map[code] * scale), the element updated as the fp32
// kernel updates it, every slot encoded again under its block's new scale; slots the
// update does not write are so re-encoded too, as the host's kernels do.
template <Mode M, Variant kV>
__device__ __forceinline__ void packed8_chunk(const TableSegment &t, uint64_t local, bool stats, Acc &acc) {
    PackedShared &sh = packed_shared();
    for (unsigned i = threadIdx.x; i < 2 * kQuantBlock; i += kThreads)
        sh.maps[i / kQuantBlock][i % kQuantBlock] = g_state_maps[i / kQuantBlock][i % kQuantBlock];
    __syncthreads();
    const uint64_t first = local * kChunk;
    const uint64_t end = first + kChunk < t.n ? first + kChunk : t.n;
    for (uint64_t b = first; b < end; b += kQuantBlock) {
        const uint64_t e = b + threadIdx.x, block = b / kQuantBlock;
        float s[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int k = 0; k < 3; ++k)
            if (k < t.slots) s[k] = mul(sh.maps[(t.unsigned_maps >> k) & 1][t.codes[k][e]], t.scales[k][block]);
        float p = load_param(t, e);
        element<M, kV>(t, p, grad_at(t, e), s[0], s[1], s[2], stats, acc);
        store_param<M>(t, e, p);
#pragma unroll
        for (int k = 0; k < 3; ++k) {
            if (k >= t.slots) break;  // t.slots is the same on every thread
            const float scale = block_scale(s[k], sh);  // after every thread read the old one
            t.codes[k][e] = nearest_code(div(s[k], scale), sh.maps[(t.unsigned_maps >> k) & 1]);
            if (threadIdx.x == 0) t.scales[k][block] = scale;
        }
    }
    __syncthreads();  // the maps stay as they are until every thread is done with them
}

// run_chunk_of for the segment's variant (the statistics pass reads no state: one body).
template <Mode M>
__device__ __forceinline__ void run_chunk(const TableSegment &t, uint64_t local, bool stats, Acc &acc) {
    if constexpr (M == Mode::kStats) {
        run_chunk_of<M, Variant::kSgd>(t, local, stats, acc);
    } else {
        const bool blocks = M == Mode::kUpdatePacked && t.state_dtype == SX_STATE_8BIT;
        switch (t.c.variant) {
#define SX_CUDA_VARIANT(v)                                                               \
    case Variant::v:                                                                     \
        if (blocks) return packed8_chunk<M, Variant::v>(t, local, stats, acc);           \
        return run_chunk_of<M, Variant::v>(t, local, stats, acc);
            SX_CUDA_VARIANT(kSgd)
            SX_CUDA_VARIANT(kSgdMomentumFirst)
            SX_CUDA_VARIANT(kSgdMomentum)
            SX_CUDA_VARIANT(kAdam)
            SX_CUDA_VARIANT(kAdamAmsgrad)
#define SX_CUDA_ELEMENTWISE(v, reads, writes) SX_CUDA_VARIANT(v)
            SX_ELEMENTWISE_VARIANTS(SX_CUDA_ELEMENTWISE)
#undef SX_CUDA_ELEMENTWISE
#undef SX_CUDA_VARIANT
        }
    }
}

// Adds each thread's (sumsq, nonfinite) over the block in a fixed order; thread 0 gets it.
__device__ __forceinline__ void block_sum(double &sumsq, double &nonfinite) {
    __shared__ double warp_sums[kThreads / 32][2];
    for (int offset = 16; offset > 0; offset /= 2) {
        sumsq += __shfl_down_sync(0xffffffffu, sumsq, offset);
        nonfinite += __shfl_down_sync(0xffffffffu, nonfinite, offset);
    }
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) {
        warp_sums[warp][0] = sumsq;
        warp_sums[warp][1] = nonfinite;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        sumsq = 0.0;
        nonfinite = 0.0;
        for (unsigned w = 0; w < kThreads / 32; ++w) {
            sumsq += warp_sums[w][0];
            nonfinite += warp_sums[w][1];
        }
    }
}

// Block b runs chunks [b*T/G, (b+1)*T/G), walking the table from first_segment[b];
// with stats it leaves its (sumsq, nonfinite) in partials[2b], partials[2b+1].
// The packed kernel asks for 2 blocks per multiprocessor, not kMinBlocks: capped at 80
// registers, its decoding, block reductions and encoding spilled to local memory.
template <Mode M>
__global__ void __launch_bounds__(kThreads, M == Mode::kUpdatePacked ? 2 : kMinBlocks)
    segments_kernel(const TableSegment *segs, const uint32_t *first_segment, uint64_t total_chunks, int stats,
                    double *partials) {
    const uint64_t grid = gridDim.x;
    uint64_t c = block_chunk_begin(blockIdx.x, total_chunks, grid);
    const uint64_t c_end = block_chunk_begin(blockIdx.x + 1, total_chunks, grid);
    uint32_t s = first_segment[blockIdx.x];
    Acc acc = {0.0, 0u};
    const bool want = M == Mode::kStats || ((M == Mode::kUpdate || M == Mode::kUpdatePacked) && stats != 0);
    while (c < c_end) {
        const TableSegment t = segs[s];
        const uint64_t stop = t.chunk_end < c_end ? t.chunk_end : c_end;
        for (; c < stop; ++c) run_chunk<M>(t, c - t.chunk_begin, want, acc);
        ++s;
    }
    if (!want) return;
    double sumsq = acc.sumsq, nonfinite = static_cast<double>(acc.nonfinite);
    block_sum(sumsq, nonfinite);
    if (threadIdx.x == 0) {
        partials[2 * blockIdx.x] = sumsq;
        partials[2 * blockIdx.x + 1] = nonfinite;
    }
}

// One block: the blocks' partials, each thread a fixed strided subset, then block_sum.
__global__ void __launch_bounds__(kThreads) finish_stats(const double *partials, unsigned blocks, double *stats) {
    double sumsq = 0.0, nonfinite = 0.0;
    for (unsigned b = threadIdx.x; b < blocks; b += kThreads) {
        sumsq += partials[2 * b];
        nonfinite += partials[2 * b + 1];
    }
    block_sum(sumsq, nonfinite);
    if (threadIdx.x == 0) {
        stats[0] = sumsq;
        stats[1] = nonfinite;
    }
}

}  // namespace
}  // namespace internal

using internal::LaunchPlan;
using internal::Mode;
using internal::TableSegment;

// The segment table in pinned host memory and on the device, twice: launch k uses slot
// k % 2, and refilling a slot waits for the launch that used it two launches ago.
class TableSlots {
  public:
    struct Slot {
        char *host = nullptr;
        char *device = nullptr;
        size_t capacity = 0;
        cudaEvent_t done = nullptr;
        bool in_flight = false;
    };
    ~TableSlots() {
        for (Slot &s : slots_) {
            if (s.in_flight) cudaEventSynchronize(s.done);
            if (s.done) cudaEventDestroy(s.done);
            free(s);
        }
    }
    Status create_events() {
        for (Slot &s : slots_)
            SX_CUDA_TRY(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming), "creating a CUDA event");
        return Status::Ok();
    }
    // The next slot, once the launch that used it two launches ago is done, with room for
    // `bytes`.
    Status take(size_t bytes, Slot **out) {
        Slot &slot = slots_[next_];
        if (slot.in_flight) SX_CUDA_TRY(cudaEventSynchronize(slot.done), "waiting for an earlier optimizer launch");
        slot.in_flight = false;
        if (bytes > slot.capacity) {
            free(slot);
            const size_t want = bytes + bytes / 2;
            SX_CUDA_TRY(cudaMallocHost(&slot.host, want), "allocating the pinned segment table");
            SX_CUDA_TRY(cudaMalloc(&slot.device, want), "allocating the device segment table");
            slot.capacity = want;
        }
        *out = &slot;
        return Status::Ok();
    }
    // The launch that used the slot `take` gave is enqueued on `stream`: the slot is busy
    // until it is done, and the next launch takes the other.
    Status launched(cudaStream_t stream) {
        Slot &slot = slots_[next_];
        SX_CUDA_TRY(cudaEventRecord(slot.done, stream), "recording an optimizer event");
        slot.in_flight = true;
        next_ ^= 1;
        return Status::Ok();
    }

  private:
    static void free(Slot &s) {
        if (s.host) cudaFreeHost(s.host);
        if (s.device) cudaFree(s.device);
        s.host = s.device = nullptr;
        s.capacity = 0;
    }
    Slot slots_[2];
    int next_ = 0;
};

struct Workspace::Impl {
    using Slot = TableSlots::Slot;
    int device = -1;
    unsigned max_grid = 0;
    unsigned last_grid = 0;
    TableSlots tables;
    double *partials = nullptr;  // 2 per block, max_grid blocks
    double *stats = nullptr;     // sumsq, nonfinite
    bool stats_written = false;
    LaunchPlan plan;

    ~Impl() {
        if (partials) cudaFree(partials);
        if (stats) cudaFree(stats);
    }

    Status init();
    static int kThreadsInt() { return static_cast<int>(internal::kThreads); }

    // The plan's segment table and first-segment index into the slot and onto the device,
    // on the stream; the kernel's arguments.
    Status upload(Slot &slot, size_t table_bytes, size_t total, cudaStream_t stream, const TableSegment **table,
                  const uint32_t **first) {
        std::memcpy(slot.host, plan.segments.data(), table_bytes);
        std::memcpy(slot.host + table_bytes, plan.first_segment.data(), total - table_bytes);
        SX_CUDA_TRY(cudaMemcpyAsync(slot.device, slot.host, total, cudaMemcpyHostToDevice, stream),
                    "copying the segment table to the device");
        *table = reinterpret_cast<const TableSegment *>(slot.device);
        *first = reinterpret_cast<const uint32_t *>(slot.device + table_bytes);
        return Status::Ok();
    }

    // The segments kernel of `mode` over the plan.
    Status enqueue(Mode mode, const TableSegment *table, const uint32_t *first, bool want_stats,
                   cudaStream_t stream);

    Status launch(Mode mode, const CudaSegment *segs, size_t num_segs, float grad_scale, void *stream_ptr,
                  bool want_stats);
};

Status Workspace::Impl::init() {
    int current = -1;
    SX_CUDA_TRY(cudaGetDevice(&current), "finding the current CUDA device");
    if (device >= 0) {
        SX_CHECK(current == device, SX_ERR_INVALID_STATE,
                 "this optimizer workspace belongs to CUDA device %d but device %d is current", device,
                 current);
        return Status::Ok();
    }
    int sms = 0, per_sm = 0;
    SX_CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, current), "counting SMs");
    SX_CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                    &per_sm, internal::segments_kernel<Mode::kUpdate>, kThreadsInt(), 0),
                "sizing the optimizer grid");
    if (per_sm < 1) per_sm = 1;
    const unsigned grid = static_cast<unsigned>(sms) * static_cast<unsigned>(per_sm);
    SX_CUDA_TRY(cudaMalloc(&partials, sizeof(double) * 2 * grid), "allocating the optimizer's partial sums");
    SX_CUDA_TRY(cudaMalloc(&stats, sizeof(double) * 2), "allocating the optimizer's gradient statistics");
    SX_TRY(tables.create_events());
    // Every workspace of the device copies the same values: the maps never change.
    SX_CUDA_TRY(cudaMemcpyToSymbol(internal::g_state_maps, kSignedMap, sizeof(float) * kQuantBlock, 0),
                "copying the 8-bit state's signed map to the device");
    SX_CUDA_TRY(cudaMemcpyToSymbol(internal::g_state_maps, kUnsignedMap, sizeof(float) * kQuantBlock,
                                   sizeof(float) * kQuantBlock),
                "copying the 8-bit state's unsigned map to the device");
    max_grid = grid;
    device = current;
    return Status::Ok();
}

Status Workspace::Impl::enqueue(Mode mode, const TableSegment *table, const uint32_t *first, bool want_stats,
               cudaStream_t stream) {
    const int stats_flag = want_stats ? 1 : 0;
    switch (mode) {
    case Mode::kUpdate:
        internal::segments_kernel<Mode::kUpdate><<<plan.grid, internal::kThreads, 0, stream>>>(
            table, first, plan.total_chunks, stats_flag, partials);
        break;
    case Mode::kUpdatePacked:
        internal::segments_kernel<Mode::kUpdatePacked><<<plan.grid, internal::kThreads, 0, stream>>>(
            table, first, plan.total_chunks, stats_flag, partials);
        break;
    case Mode::kStats:
        internal::segments_kernel<Mode::kStats><<<plan.grid, internal::kThreads, 0, stream>>>(
            table, first, plan.total_chunks, stats_flag, partials);
        break;
    case Mode::kTrafficOnly:
        internal::segments_kernel<Mode::kTrafficOnly><<<plan.grid, internal::kThreads, 0, stream>>>(
            table, first, plan.total_chunks, 0, partials);
        break;
    }
    SX_CUDA_TRY(cudaGetLastError(), "launching the optimizer kernel");
    return Status::Ok();
}

Status Workspace::Impl::launch(Mode mode, const CudaSegment *segs, size_t num_segs, float grad_scale, void *stream_ptr,
              bool want_stats) {
    SX_TRY(init());
    // Everything is checked before anything is enqueued.
    SX_TRY(internal::build_plan(segs, num_segs, grad_scale, mode, max_grid, &plan));
    const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    if (plan.grid == 0 && !want_stats) return Status::Ok();
    const size_t table_bytes = plan.segments.size() * sizeof(TableSegment);
    const size_t total = table_bytes + plan.first_segment.size() * sizeof(uint32_t);
    Slot *slot = nullptr;
    SX_TRY(tables.take(total, &slot));
    if (plan.grid > 0) {
        const TableSegment *table = nullptr;
        const uint32_t *first = nullptr;
        SX_TRY(upload(*slot, table_bytes, total, stream, &table, &first));
        SX_TRY(enqueue(mode == Mode::kUpdate && plan.packed ? Mode::kUpdatePacked : mode, table, first, want_stats,
                       stream));
    }
    if (want_stats) {
        internal::finish_stats<<<1, internal::kThreads, 0, stream>>>(partials, plan.grid, stats);
        SX_CUDA_TRY(cudaGetLastError(), "launching the gradient statistics reduction");
        stats_written = true;
    }
    SX_TRY(tables.launched(stream));
    last_grid = plan.grid;
    return Status::Ok();
}

Workspace::Workspace() : impl_(new Impl) {}
Workspace::~Workspace() { delete impl_; }

Status Workspace::fused_update(const CudaSegment *segs, size_t num_segs, float grad_scale, void *stream,
                               bool want_stats) {
    return impl_->launch(Mode::kUpdate, segs, num_segs, grad_scale, stream, want_stats);
}

Status Workspace::grad_stats(const CudaSegment *segs, size_t num_segs, float grad_scale, void *stream) {
    return impl_->launch(Mode::kStats, segs, num_segs, grad_scale, stream, true);
}

const double *Workspace::stats_device() const { return impl_->stats_written ? impl_->stats : nullptr; }

Status Workspace::read_stats(void *stream_ptr, GradStats *out) {
    SX_CHECK_ARG(out != nullptr, "out is null");
    SX_CHECK(impl_->stats_written, SX_ERR_INVALID_STATE, "no launch has computed gradient statistics yet");
    double host[2];
    const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    SX_CUDA_TRY(cudaMemcpyAsync(host, impl_->stats, sizeof host, cudaMemcpyDeviceToHost, stream),
                "copying the gradient statistics");
    SX_CUDA_TRY(cudaStreamSynchronize(stream), "waiting for the optimizer stream");
    out->sumsq = host[0];
    out->nonfinite = host[1];
    return Status::Ok();
}

unsigned Workspace::grid_size() const { return impl_->last_grid; }

namespace internal {

Status traffic_only(Workspace *ws, const CudaSegment *segs, size_t num_segs, void *stream) {
    return ws->impl()->launch(Mode::kTrafficOnly, segs, num_segs, 1.0f, stream, false);
}

}  // namespace internal

}  // namespace cuda
}  // namespace optim
}  // namespace sx
