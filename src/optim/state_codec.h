// How a param group's optimizer state slots are stored when they are not fp32
// (Hyper::state_dtype, SX_STATE_*): bf16, or 8-bit block-wise. Every update is computed
// in fp32: a piece of a slot is decoded into fp32, updated, and encoded again
// (packed_range in kernel_body.h, in each kernel flavour).
//
// 8-bit block-wise follows torchao 0.18's OptimState8bit (torchao/optim/subclass_8bit.py,
// quant_utils.py), chosen over bitsandbytes because its quantizer is exact (the nearest
// code of the map, found by binary search) on every device, where bitsandbytes' CPU path
// uses an approximate lookup table and its CUDA kernel another rounding:
// - a param's elements, flattened, are cut into blocks of kQuantBlock; each block keeps
//   one fp32 scale, its largest magnitude (at least 1e-12), and one code per element,
//   an index into a 256-entry map of [-1, 1] (signed) or [0, 1] (unsigned, for slots that
//   are never negative: StateSlot::nonnegative);
// - a param of fewer than kMin8bitNumel elements, or not a whole number of blocks, keeps
//   its slots in fp32 (torchao's rule);
// - decoding is map[code] * scale; encoding divides by the scale and takes the nearest
//   code, ties to the larger.
// Blocks belong to the param, not to the shard: the layout starts every shard of such a
// param on a block boundary (core/layout.h, ParamShape::block), so any world size holds
// the same blocks and a reshard moves codes and scales as they are.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sx/sx_params.h"

namespace sx {
namespace optim {

constexpr size_t kQuantBlock = 256;
constexpr uint64_t kMin8bitNumel = 4096;

// torchao's create_dynamic_map(signed, 7, 8) values, ascending (state_maps.cc).
extern const float kSignedMap[256];
extern const float kUnsignedMap[256];

// How a param of `numel` elements in a group of state dtype `group_dtype` (SX_STATE_*)
// keeps its slots: SX_STATE_8BIT falls back to SX_STATE_FP32 for a param torchao would
// not quantize.
inline int32_t param_state_dtype(int32_t group_dtype, uint64_t numel) {
    if (group_dtype == SX_STATE_8BIT && (numel < kMin8bitNumel || numel % kQuantBlock != 0)) return SX_STATE_FP32;
    return group_dtype;
}

// Bytes a slot keeps per element, and scales per element (1 / kQuantBlock for 8 bits).
inline size_t state_elem_bytes(int32_t dtype) { return dtype == SX_STATE_BF16 ? 2 : dtype == SX_STATE_8BIT ? 1 : 4; }

// The kernels' index of a map, so that an encoder needs no binary search: y's bits pick
// a bucket (its sign, and its magnitude's exponent and top 8 bits of mantissa, every
// magnitude below 2^-25 in bucket 0), and the code below y, the largest c with map[c] <= y,
// is the bucket's entry or the one above it (no bucket holds two entries of a map:
// code_lut_exact() says so of both maps). Buckets per sign:
constexpr uint32_t kLutBuckets = 26 * 256;
inline uint32_t lut_key(uint32_t bits) {
    const int32_t k = static_cast<int32_t>((bits & 0x7fffffffu) >> 15) - (102 << 8);
    const uint32_t clamped = k < 0 ? 0u : (k >= static_cast<int32_t>(kLutBuckets) ? kLutBuckets - 1 : static_cast<uint32_t>(k));
    return clamped + (bits >> 31) * kLutBuckets;
}
// The index of kSignedMap or kUnsignedMap (2 * kLutBuckets entries, readable 3 bytes past
// the end: a vector gather reads 4 bytes at a time). Built once, thread-safe.
const uint8_t *code_lut(const float *map);
// Whether no bucket of either map holds two of its entries (the tests ask).
bool code_lut_exact();
// The thresholds of a binary search over the map, for encoders that look entries up in
// registers: the step of stride k (128, 64, ..., 1) compares y with map[c + k], c a
// multiple of 2k, which is entry c / 2k of table k: map[(2i + 1)k] for i < 128 / k.
// Tables 128 to 8 take 16 floats each (the first 128/k used), table 4 32, table 2 64,
// table 1 128, in that order from kSearchTableOffset[...]: 304 floats, 64-byte aligned;
// built once, thread-safe.
constexpr int kSearchTableOffset[8] = {0, 16, 32, 48, 64, 80, 112, 176};  // k = 128, 64, ..., 1
const float *search_tables(const float *map);

// The tables of an encoder that computes a code instead of searching for it (the AVX-512
// flavour's). The maps' positive entries come in decades: decade d (0..6) holds n_d codes
// (2^d signed, 2^(d+1) unsigned) at 10^(d-6) (0.1 + (k + 1/2) 0.9 / n_d), so the nearest
// code of a magnitude a inside decade d is floor(t), t = a F_d - G_d, F_d = 10^(6-d) n_d / 0.9,
// G_d = n_d / 9, up to rounding near the thresholds between codes. A magnitude's "class"
// is the zero code (0), decade d (1 + d) or the 1.0 code (8). Classes change at the exact
// thresholds of the reference encoder (the least a whose code is the class's first), at
// most one inside each binary octave, so an octave's table entries (at its biased
// exponent e modulo 32, e from kFastLowestExponent, which also holds every magnitude
// below, up to 127, which holds 1.0) give the class at its lower end and the threshold
// inside it. An encoder takes the estimate only where a is
// farther than the guards from every threshold (kFastGuardT in units of t, kFastGuardRel
// relative to a class threshold), which covers a = |x| * (1 / scale) being an ulp or two
// off x / scale; elsewhere it searches. `exact` says that every threshold lies well inside
// its guard (built once per map, checked against the reference encoder; thread-safe).
constexpr uint32_t kFastLowestExponent = 100;
constexpr float kFastGuardT = 1.0f / 1024, kFastGuardRel = 1.0f / 262144;
struct FastCodeTables {
    alignas(64) int32_t octave_class[32];
    alignas(64) float octave_bound[32];  // +inf where the octave holds no class change
    alignas(64) float factor[16];        // F by class (0 for the zero and 1.0 codes)
    alignas(64) float offset[16];        // G by class (-0.5: t = 0.5, never near a threshold)
    alignas(64) int32_t first[16];       // the class's first code
    alignas(64) int32_t last[16];        // and its last
    int32_t mirror;                      // a negative y's code is max(mirror - code(|y|), 0)
    bool exact;
};
const FastCodeTables &fast_code_tables(const float *map);

// The index of an encoder that multiplies by the scale's reciprocal instead of dividing
// (the AVX2 flavour's): a magnitude a = |x| * (1 / scale), as bits, picks a bucket (its
// exponent and top 7 bits of mantissa; every magnitude below 2^-24 in bucket 0, every one
// from 1.0 up in the last), and the bucket's entry holds the code of non-negative y just
// below the one threshold that matters there (bits 0-7) and that threshold T (bits 8-31:
// bits(T) - the bucket's first bits + kMagnitudeBias; kMagnitudeNone if none), so that
// code(a) = entry's code + (bits(a) >= bits(T)). T is the bucket's own threshold (the least
// y whose code is one more), or a neighbour's that lies within kMagnitudeGuard ulps of
// the bucket's edge. A negative x's code is max(mirror - code(|x| / scale), 0). The
// estimate is the reference's wherever bits(a) is more than kMagnitudeGuard ulps from T:
// |x| * (1 / scale) is within 2 ulps of x / scale, and a negative y's thresholds are the
// positive ones' within 4 ulps (`exact` says so of the map, checked against the reference
// encoder when the index is built); nearer, an encoder divides and searches.
constexpr uint32_t kMagnitudeKeyBase = 103u << 7;         // the bucket of 2^-24
constexpr uint32_t kMagnitudeBuckets = (24u << 7) + 1;    // 2^-24 up to 1.0's bucket
constexpr uint32_t kMagnitudeBias = 1u << 20, kMagnitudeNone = 0xffffffu;
constexpr int32_t kMagnitudeGuard = 8;
struct MagnitudeIndex {
    alignas(64) uint32_t entries[kMagnitudeBuckets];
    int32_t mirror;  // 254 for the signed map, 0 for the unsigned one
    bool exact;
};
// Built once per map, thread-safe.
const MagnitudeIndex &magnitude_index(const float *map);
// The bucket of a magnitude's bits (sign clear).
inline uint32_t magnitude_key(uint32_t abs_bits) {
    const int32_t k = static_cast<int32_t>(abs_bits >> 16) - static_cast<int32_t>(kMagnitudeKeyBase);
    return k < 0 ? 0u : (k >= static_cast<int32_t>(kMagnitudeBuckets) ? kMagnitudeBuckets - 1 : static_cast<uint32_t>(k));
}
// The estimate for a magnitude's bits `a` (the encoders' vector form, one lane): the code
// of a, or of -a where `negative`, and whether a lies within the guard of the threshold.
inline int magnitude_estimate(const MagnitudeIndex &mi, uint32_t a, bool negative, bool *near) {
    const uint32_t e = mi.entries[magnitude_key(a)];
    const int32_t d = static_cast<int32_t>((a & 0xffffu) + kMagnitudeBias) - static_cast<int32_t>(e >> 8);
    *near = d >= -kMagnitudeGuard && d <= kMagnitudeGuard;
    const int code = static_cast<int>(e & 0xffu) + (d >= 0);
    return negative ? (mi.mirror - code > 0 ? mi.mirror - code : 0) : code;
}

// One block of n <= kQuantBlock elements: its scale, and the codes of x / scale in map.
// NaN in x gives a NaN scale (torch's amax propagates it).
float encode_block(const float *x, size_t n, const float *map, uint8_t *codes);
// map[codes[i]] * scale, for n elements.
void decode_block(const uint8_t *codes, size_t n, float scale, const float *map, float *out);
// The codes and scale that decode_block turns into exactly x (bit for bit; NaN for NaN)
// where x is a decoded block, else encode_block's. encode_block alone does not give back
// the encoding a decoded block came from when its largest magnitude is negative and
// signed: the signed map's lowest entry is -0.99297 (its highest 1.0), so that element
// decoded to -0.99297 * scale, and encoding the decoded block takes a smaller scale. The
// scale it came from is then found from that element (its value over map[0], give or
// take an ulp), and taken where the block's codes under it decode to x exactly. A block
// never updated (scale 0, every code 0) comes back as it was with the signed map (it
// decodes to -0.0); with the unsigned map it decodes to +0.0, as zeros encoded by a step
// do, and takes their scale, 1e-12.
float encode_decoded_block(const float *x, size_t n, const float *map, uint8_t *codes);

}  // namespace optim
}  // namespace sx
