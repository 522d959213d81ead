// The fused update loops, written once over a vector-operations type O and included by
// each kernel flavour (kernels_scalar.cc, kernels_avx2.cc, kernels_avx512.cc), which
// instantiates them with its own O.
//
// Everything here has internal linkage (anonymous namespace): each flavour's copy is
// compiled with its own target flags, and the linker must never merge an AVX-512
// instantiation into the path that runs on a CPU without AVX-512.
//
// Rounding: every operation rounds where torch's scalar formulas round (see
// reference.cc); there is no fused multiply-add in the update (the module builds with
// -ffp-contract=off), and SIMD add, sub, mul, div and sqrt are correctly rounded IEEE
// operations like their scalar forms. So every flavour gives, bit for bit, the result
// of reference_update(). Only the sum of squares may fuse and reorder.
//
// O provides: V (W floats), Mask (all lanes true or all false, fixed per segment),
// load/store (unaligned), set1, add, sub, mul, div, sqrt, maximum (torch.maximum: the
// larger operand, NaN if either is NaN), select(m, a, b) (b where m, else a),
// sq_acc(acc, x) (acc + x*x) and hsum (the lanes' sum, in double), load16/store16 (bf16
// state: widened, and rounded to nearest even), encode8 (a block of 8-bit state), and
// elementwise.h's abs, sign and recip.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "optim/elementwise.h"
#include "optim/kernels.h"
#include "optim/state_codec.h"

namespace sx {
namespace optim {
namespace internal {
namespace {

// The scalar operations: the whole of the scalar flavour, and every flavour's tail.
struct ScalarOps {
    using V = float;
    using Mask = bool;
    static constexpr size_t W = 1;
    static V load(const float *p) { return *p; }
    static void store(float *p, V v) { *p = v; }
    static V set1(float x) { return x; }
    static Mask mask(bool b) { return b; }
    static V add(V a, V b) { return a + b; }
    static V sub(V a, V b) { return a - b; }
    static V mul(V a, V b) { return a * b; }
    static V div(V a, V b) { return a / b; }
    static V sqrt(V a) { return __builtin_sqrtf(a); }
    // As x86's maxps (a > b ? a : b, so b when either is NaN), then a if a is NaN.
    static V maximum(V a, V b) { return a != a ? a : (a > b ? a : b); }
    static V select(Mask m, V a, V b) { return m ? b : a; }
    static V sq_acc(V acc, V x) { return acc + x * x; }
    static double hsum(V acc) { return static_cast<double>(acc); }
    static V abs(V a) { return __builtin_fabsf(a); }
    static V sign(V a) { return a > 0.0f ? 1.0f : (a < 0.0f ? -1.0f : 0.0f); }
    static V recip(V a) { return 1.0f / a; }
    // A block of 8-bit state: its scale and codes (state_codec.h's encode_block).
    static float encode8(const float *x, size_t n, const float *map, const uint8_t *lut, uint8_t *codes);
    static void decode8(const uint8_t *codes, size_t n, float scale, const float *map, float *out);
    // bf16 state: widened exactly, narrowed to nearest even (NaN stays a quiet NaN).
    static V load16(const uint16_t *p);
    static void store16(uint16_t *p, V v);
};

enum Momentum { kNoMomentum, kMomentumFirst, kMomentumLater };

// Software prefetch of each stream, kPrefetchAhead floats (2 KiB) ahead of the
// vector being updated. Adam's divisions and square root make every iteration long,
// so the out-of-order window holds fewer iterations and so fewer outstanding cache
// misses than four streams need; on Zen 4 the single-thread AdamW kernel reached
// about 0.9 of the streaming ceiling without it, about 1.0 with it. Prefetching an
// address past the end of a buffer is harmless (a prefetch never faults). The scalar
// flavour would issue one per element, far too many, so it does not prefetch.
constexpr size_t kPrefetchAhead = 512;

template <class O, class T>
inline void prefetch(const T *stream, size_t i) {
    if (O::W >= 8) __builtin_prefetch(stream + i + kPrefetchAhead);
}

// Runs vec_fn(i, acc) over whole vectors of [0, n) and tail_fn(i, tail) over the rest.
// acc restarts every kSumBlock elements and is added into the double total, so no float
// accumulator sums more than kSumBlock / W squares.
template <class O, class VecFn, class TailFn>
inline double blocked_loop(size_t n, VecFn &&vec_fn, TailFn &&tail_fn) {
    double total = 0.0;
    size_t i = 0;
    const size_t vec_end = n - n % O::W;
    while (i < vec_end) {
        const size_t stop = vec_end - i > kSumBlock ? i + kSumBlock : vec_end;
        typename O::V acc = O::set1(0.0f);
        for (; i < stop; i += O::W) vec_fn(i, acc);
        total += O::hsum(acc);
    }
    float tail = 0.0f;
    for (; i < n; ++i) tail_fn(i, tail);
    return total + static_cast<double>(tail);
}

// ---------------------------------------------------------------------------- SGD

// A state slot's element as fp32, from fp32 slots or bf16 ones (O::load16: the same bits
// as packed_range's widening and narrowing, without the round trip through a block).
template <class O>
inline typename O::V load_slot(const float *p) { return O::load(p); }
template <class O>
inline typename O::V load_slot(const uint16_t *p) { return O::load16(p); }
template <class O>
inline void store_slot(float *p, typename O::V v) { O::store(p, v); }
template <class O>
inline void store_slot(uint16_t *p, typename O::V v) { O::store16(p, v); }
template <class T>
inline T *const *slots_of(const Segment &seg);
template <>
inline float *const *slots_of<float>(const Segment &seg) { return seg.state; }
template <>
inline uint16_t *const *slots_of<uint16_t>(const Segment &seg) { return seg.state16; }

template <class O>
struct SgdConsts {
    typename O::V grad_scale, weight_decay, lr, momentum, one_minus_dampening;
    explicit SgdConsts(const SegmentConsts &c)
        : grad_scale(O::set1(c.grad_scale)), weight_decay(O::set1(c.weight_decay)),
          lr(O::set1(c.lr)), momentum(O::set1(c.momentum)),
          one_minus_dampening(O::set1(c.one_minus_dampening)) {}
};

// torch.optim.SGD (_single_tensor_sgd), element i.
template <class O, bool kL2, int kMomentum, bool kNesterov, class T>
inline void sgd_at(const SgdConsts<O> &k, size_t i, float *p, const float *grad, T *buf, float *zero_grad,
                   typename O::V &acc) {
    using V = typename O::V;
    V g = O::mul(O::load(grad + i), k.grad_scale);  // maximize is folded into the sign
    if (zero_grad) O::store(zero_grad + i, O::set1(0.0f));  // the next backward's clean slate
    acc = O::sq_acc(acc, g);
    V pv = O::load(p + i);
    if (kL2) g = O::add(g, O::mul(k.weight_decay, pv));  // grad.add(param, alpha=wd)
    if (kMomentum == kMomentumFirst) {
        store_slot<O>(buf + i, g);                                // clone(grad)
        if (kNesterov) g = O::add(g, O::mul(k.momentum, g));      // grad.add(buf, alpha=mom)
    } else if (kMomentum == kMomentumLater) {
        // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
        V b = O::add(O::mul(load_slot<O>(buf + i), k.momentum), O::mul(k.one_minus_dampening, g));
        store_slot<O>(buf + i, b);
        g = kNesterov ? O::add(g, O::mul(k.momentum, b)) : b;
    }
    O::store(p + i, O::sub(pv, O::mul(k.lr, g)));  // param.add_(grad, alpha=-lr)
}

template <class O, bool kL2, int kMomentum, bool kNesterov, class T>
double sgd_range(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end) {
    float *p = seg.param + begin;
    const float *g = seg.grad + begin;
    T *buf = kMomentum != kNoMomentum ? slots_of<T>(seg)[0] + begin : nullptr;
    float *gz = seg.zero_grad ? seg.zero_grad + begin : nullptr;
    const SgdConsts<O> kv(c);
    const SgdConsts<ScalarOps> ks(c);
    return blocked_loop<O>(
        end - begin,
        [&](size_t i, typename O::V &acc) {
            prefetch<O>(p, i);
            prefetch<O>(g, i);
            if (kMomentum != kNoMomentum) prefetch<O>(buf, i);
            sgd_at<O, kL2, kMomentum, kNesterov, T>(kv, i, p, g, buf, gz, acc);
        },
        [&](size_t i, float &acc) {
            sgd_at<ScalarOps, kL2, kMomentum, kNesterov, T>(ks, i, p, g, buf, gz, acc);
        });
}

template <class O, int kMomentum, class T>
double sgd_pick(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end) {
    if (c.l2)
        return c.nesterov ? sgd_range<O, true, kMomentum, true, T>(seg, c, begin, end)
                          : sgd_range<O, true, kMomentum, false, T>(seg, c, begin, end);
    return c.nesterov ? sgd_range<O, false, kMomentum, true, T>(seg, c, begin, end)
                      : sgd_range<O, false, kMomentum, false, T>(seg, c, begin, end);
}

// ---------------------------------------------------------------------- Adam, AdamW

template <class O>
struct AdamConsts {
    typename O::V grad_scale, weight_decay, decay, lerp_coeff, beta2, one_minus_beta2, step_size,
        bias_correction2_sqrt, eps;
    typename O::Mask lerp_from_end;
    explicit AdamConsts(const SegmentConsts &c)
        : grad_scale(O::set1(c.grad_scale)), weight_decay(O::set1(c.weight_decay)),
          decay(O::set1(c.decay)), lerp_coeff(O::set1(c.lerp_coeff)), beta2(O::set1(c.beta2)),
          one_minus_beta2(O::set1(c.one_minus_beta2)), step_size(O::set1(c.step_size)),
          bias_correction2_sqrt(O::set1(c.bias_correction2_sqrt)), eps(O::set1(c.eps)),
          lerp_from_end(O::mask(c.lerp_from_end)) {}
};

// torch.optim.Adam / AdamW (_single_tensor_adam), element i. T: the slots' type (float,
// or uint16_t for bf16 state: the moments are computed in fp32 and used unrounded for the
// param's update, and only their stored copies are rounded, as in reference_packed).
template <class O, bool kL2, bool kAmsgrad, class T>
inline void adam_at(const AdamConsts<O> &k, size_t i, float *p, const float *grad, T *m, T *v, T *vmax,
                    float *zero_grad, typename O::V &acc) {
    using V = typename O::V;
    V g = O::mul(O::load(grad + i), k.grad_scale);
    if (zero_grad) O::store(zero_grad + i, O::set1(0.0f));  // the next backward's clean slate
    acc = O::sq_acc(acc, g);
    V pv = O::mul(O::load(p + i), k.decay);              // AdamW: param.mul_(1 - lr*wd)
    if (kL2) g = O::add(g, O::mul(k.weight_decay, pv));  // Adam: grad.add(param, alpha=wd)
    V mv = load_slot<O>(m + i);
    // exp_avg.lerp_(grad, 1 - beta1)
    mv = O::add(O::select(k.lerp_from_end, mv, g), O::mul(k.lerp_coeff, O::sub(g, mv)));
    store_slot<O>(m + i, mv);
    // exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    V vv = O::add(O::mul(load_slot<O>(v + i), k.beta2), O::mul(O::mul(k.one_minus_beta2, g), g));
    store_slot<O>(v + i, vv);
    if (kAmsgrad) {  // torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)
        vv = O::maximum(load_slot<O>(vmax + i), vv);
        store_slot<O>(vmax + i, vv);
    }

    // denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)
    V denom = O::add(O::div(O::sqrt(vv), k.bias_correction2_sqrt), k.eps);
    // param.addcdiv_(exp_avg, denom, value=-step_size): p + ((-s)*m)/denom == p - (s*m)/denom
    O::store(p + i, O::sub(pv, O::div(O::mul(k.step_size, mv), denom)));
}

template <class O, bool kL2, bool kAmsgrad, class T>
double adam_range(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end) {
    T *const *state = slots_of<T>(seg);
    float *p = seg.param + begin;
    const float *g = seg.grad + begin;
    T *m = state[0] + begin;
    T *v = state[1] + begin;
    T *vmax = kAmsgrad ? state[2] + begin : nullptr;
    float *gz = seg.zero_grad ? seg.zero_grad + begin : nullptr;
    const AdamConsts<O> kv(c);
    const AdamConsts<ScalarOps> ks(c);
    return blocked_loop<O>(
        end - begin,
        [&](size_t i, typename O::V &acc) {
            prefetch<O>(p, i);
            prefetch<O>(g, i);
            prefetch<O>(m, i);
            prefetch<O>(v, i);
            if (kAmsgrad) prefetch<O>(vmax, i);
            adam_at<O, kL2, kAmsgrad, T>(kv, i, p, g, m, v, vmax, gz, acc);
        },
        [&](size_t i, float &acc) { adam_at<ScalarOps, kL2, kAmsgrad, T>(ks, i, p, g, m, v, vmax, gz, acc); });
}

// ------------------------------------------- Adagrad, RMSprop, Adamax, NAdam, RAdam, Lion

template <class O, Variant kV, bool kL2, class T>
double elementwise_range(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end) {
    constexpr int kReads = elementwise_reads(kV), kWrites = elementwise_writes(kV);
    float *p = seg.param + begin;
    const float *g = seg.grad + begin;
    T *st[kMaxStateSlots] = {nullptr, nullptr, nullptr};
    for (int k = 0; k < kWrites; ++k) st[k] = slots_of<T>(seg)[k] + begin;
    float *gz = seg.zero_grad ? seg.zero_grad + begin : nullptr;
    const ElementwiseConsts<O> kv(c);
    const ElementwiseConsts<ScalarOps> ks(c);
    auto at = [&](auto ops, const auto &k, size_t i, auto &acc) {
        using Ops = decltype(ops);
        using V = typename Ops::V;
        V gv = Ops::mul(Ops::load(g + i), k.grad_scale);  // maximize is folded into the sign
        if (gz) Ops::store(gz + i, Ops::set1(0.0f));        // the next backward's clean slate
        acc = Ops::sq_acc(acc, gv);
        V pv = Ops::load(p + i);
        V sv[kMaxStateSlots];
        for (int j = 0; j < kReads; ++j) sv[j] = load_slot<Ops>(st[j] + i);
        elementwise_at<Ops, kV, kL2>(k, pv, gv, sv);
        Ops::store(p + i, pv);
        for (int j = 0; j < kWrites; ++j) store_slot<Ops>(st[j] + i, sv[j]);
    };
    return blocked_loop<O>(
        end - begin,
        [&](size_t i, typename O::V &acc) {
            prefetch<O>(p, i);
            prefetch<O>(g, i);
            for (int j = 0; j < kReads; ++j) prefetch<O>(st[j], i);
            at(O{}, kv, i, acc);
        },
        [&](size_t i, float &acc) { at(ScalarOps{}, ks, i, acc); });
}

template <class O, Variant kV, class T>
double elementwise_pick(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end) {
    return c.l2 ? elementwise_range<O, kV, true, T>(seg, c, begin, end)
                : elementwise_range<O, kV, false, T>(seg, c, begin, end);
}

// ------------------------------------------------- packed slots (state_codec.h)
//
// The same bits as state_codec.cc's encode_block and decode_block and half.h's bf16
// conversions (the reference uses those), written as loops the flavour's compiler
// vectorises (omp simd: gathers from the maps, no fused multiply-add in this module).

inline float widen_bf16(uint16_t h) {
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// Round to nearest even; NaN stays a quiet NaN.
inline uint16_t narrow_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? (x >> 16) | 0x40u : rounded);
}

inline float ScalarOps::load16(const uint16_t *p) { return widen_bf16(*p); }
inline void ScalarOps::store16(uint16_t *p, float v) { *p = narrow_bf16(v); }

// map[code] * scale, element by element: the flavours' decode8 from `from` on.
inline void decode_tail(const uint8_t *codes, size_t from, size_t n, float scale, const float *map, float *out) {
    for (size_t i = from; i < n; ++i) out[i] = map[codes[i]] * scale;
}
inline void ScalarOps::decode8(const uint8_t *codes, size_t n, float scale, const float *map, float *out) {
    decode_tail(codes, 0, n, scale, map, out);
}

// encode_block's pieces. A block's scale from its largest magnitude (NaN if any element
// is NaN), and the code of y = x / scale: the largest c with map[c] <= y (0 if none or NaN;
// the map's index, state_codec.h's code_lut, gives it or the one below it), then one step
// up where y is at least half-way to the next entry, as encode_block's binary search
// finds. The flavours' encode8 vectorise them.
inline float block_scale(float absmax, bool nan) {
    return nan ? __builtin_nanf("") : (absmax < 1e-12f ? 1e-12f : absmax);
}

inline uint8_t nearest_code(float y, const float *map, const uint8_t *lut) {
    if (y != y) return 0;
    uint32_t bits;
    std::memcpy(&bits, &y, 4);
    int c = lut[lut_key(bits)];
    const int next = c < 255 ? c + 1 : 255;
    c = y >= map[next] ? next : c;
    const int up = c < 255 ? c + 1 : 255;
    return static_cast<uint8_t>((y - map[c]) >= (map[up] - map[c]) * 0.5f ? up : c);
}

// Elements [from, n) of a block: its absmax and NaN so far folded in (the vector part
// did [0, from)), then their codes once the scale is known.
inline void absmax_tail(const float *x, size_t from, size_t n, float *absmax, bool *nan) {
    for (size_t i = from; i < n; ++i) {
        const float a = __builtin_fabsf(x[i]);
        *absmax = a > *absmax ? a : *absmax;
        *nan = *nan || a != a;
    }
}
inline void codes_tail(const float *x, size_t from, size_t n, float scale, const float *map, const uint8_t *lut,
                       uint8_t *codes) {
    for (size_t i = from; i < n; ++i) codes[i] = nearest_code(x[i] / scale, map, lut);
}

inline float ScalarOps::encode8(const float *x, size_t n, const float *map, const uint8_t *lut, uint8_t *codes) {
    float absmax = 0.0f;
    bool nan = false;
    absmax_tail(x, 0, n, &absmax, &nan);
    const float scale = block_scale(absmax, nan);
    codes_tail(x, 0, n, scale, map, lut, codes);
    return scale;
}

template <class O>
double update_range(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end);

// A segment of 8-bit slots, a block of its param at a time (it starts on one and is cut
// between them): its slots decoded into fp32, updated by the fp32 loops, encoded back.
template <class O>
double packed_range(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end) {
    const int slots = state_slots(*seg.hyper);
    const float *maps[kMaxStateSlots];
    const uint8_t *luts[kMaxStateSlots];
    for (int j = 0; j < slots; ++j) {
        maps[j] = state_slot_nonnegative(*seg.hyper, j) ? kUnsignedMap : kSignedMap;
        luts[j] = code_lut(maps[j]);
    }
    alignas(64) float slot[kMaxStateSlots][kQuantBlock];
    double total = 0.0;
    for (size_t b = begin; b < end;) {
        const size_t e = end < (b / kQuantBlock + 1) * kQuantBlock ? end : (b / kQuantBlock + 1) * kQuantBlock;
        const size_t n = e - b;
        Segment piece = seg;
        piece.state_dtype = SX_STATE_FP32;
        piece.param = seg.param + b;
        if (seg.grad) piece.grad = seg.grad + b;
        if (seg.zero_grad) piece.zero_grad = seg.zero_grad + b;
        piece.param_offset = seg.param_offset + b;
        piece.n = n;
        for (int j = 0; j < slots; ++j) {
            O::decode8(seg.codes[j] + b, n, seg.scales[j][b / kQuantBlock], maps[j], slot[j]);
            piece.state[j] = slot[j];
        }
        total += update_range<O>(piece, c, 0, n);
        for (int j = 0; j < slots; ++j)
            seg.scales[j][b / kQuantBlock] = O::encode8(slot[j], n, maps[j], luts[j], seg.codes[j] + b);
        b = e;
    }
    return total;
}

// ------------------------------------------------------------------- entry points

// The update of fp32 slots (T = float) or bf16 ones (T = uint16_t: widened and narrowed
// in the loop itself, the same bits as packed_range's blocks through fp32).
template <class O, class T>
double update_slots(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end) {
    switch (c.variant) {
    case Variant::kSgd:
        return c.l2 ? sgd_range<O, true, kNoMomentum, false, T>(seg, c, begin, end)
                    : sgd_range<O, false, kNoMomentum, false, T>(seg, c, begin, end);
    case Variant::kSgdMomentumFirst:
        return sgd_pick<O, kMomentumFirst, T>(seg, c, begin, end);
    case Variant::kSgdMomentum:
        return sgd_pick<O, kMomentumLater, T>(seg, c, begin, end);
    case Variant::kAdam:
        return c.l2 ? adam_range<O, true, false, T>(seg, c, begin, end)
                    : adam_range<O, false, false, T>(seg, c, begin, end);
    case Variant::kAdamAmsgrad:
        return c.l2 ? adam_range<O, true, true, T>(seg, c, begin, end)
                    : adam_range<O, false, true, T>(seg, c, begin, end);
#define SX_ELEMENTWISE_CASE(v, reads, writes) \
    case Variant::v: return elementwise_pick<O, Variant::v, T>(seg, c, begin, end);
    SX_ELEMENTWISE_VARIANTS(SX_ELEMENTWISE_CASE)
#undef SX_ELEMENTWISE_CASE
    }
    return 0.0;
}

template <class O>
double update_range(const Segment &seg, const SegmentConsts &c, size_t begin, size_t end) {
    if (seg.state_dtype == SX_STATE_BF16) return update_slots<O, uint16_t>(seg, c, begin, end);
    if (seg.state_dtype == SX_STATE_8BIT) return packed_range<O>(seg, c, begin, end);
    return update_slots<O, float>(seg, c, begin, end);
}

// Two accumulators: with one, the add latency, not memory, would bound a single stream.
template <class O>
double sum_of_squares_range(const float *grad, size_t n, float grad_scale) {
    using V = typename O::V;
    const V s = O::set1(grad_scale);
    double total = 0.0;
    size_t i = 0;
    const size_t vec_end = n - n % (2 * O::W);
    while (i < vec_end) {
        const size_t stop = vec_end - i > kSumBlock ? i + kSumBlock : vec_end;
        V a0 = O::set1(0.0f), a1 = O::set1(0.0f);
        for (; i < stop; i += 2 * O::W) {
            a0 = O::sq_acc(a0, O::mul(O::load(grad + i), s));
            a1 = O::sq_acc(a1, O::mul(O::load(grad + i + O::W), s));
        }
        total += O::hsum(a0) + O::hsum(a1);
    }
    float tail = 0.0f;
    for (; i < n; ++i) {
        const float g = grad[i] * grad_scale;
        tail += g * g;
    }
    return total + static_cast<double>(tail);
}

}  // namespace
}  // namespace internal
}  // namespace optim
}  // namespace sx
