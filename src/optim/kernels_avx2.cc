// AVX2 flavour: 8 floats per vector; FMA only in the sum of squares. Built with
// -mavx2 -mfma -fno-math-errno and run only where detect_isa() found AVX2 and FMA.
// Loads and stores are unaligned: a thread's piece of a segment may start anywhere.
#include <immintrin.h>

#include "optim/kernel_body.h"
#include "optim/stochastic_round.h"

namespace sx {
namespace optim {
namespace internal {
namespace {

struct Avx2Ops {
    using V = __m256;
    using Mask = __m256;
    static constexpr size_t W = 8;
    static V load(const float *p) { return _mm256_loadu_ps(p); }
    static void store(float *p, V v) { _mm256_storeu_ps(p, v); }
    static V set1(float x) { return _mm256_set1_ps(x); }
    static Mask mask(bool b) { return b ? _mm256_castsi256_ps(_mm256_set1_epi32(-1)) : _mm256_setzero_ps(); }
    static V add(V a, V b) { return _mm256_add_ps(a, b); }
    static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
    static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
    static V div(V a, V b) { return _mm256_div_ps(a, b); }
    static V sqrt(V a) { return _mm256_sqrt_ps(a); }
    // maxps gives b when either is NaN; then a NaN a replaces the result.
    static V maximum(V a, V b) {
        return _mm256_blendv_ps(_mm256_max_ps(a, b), a, _mm256_cmp_ps(a, a, _CMP_UNORD_Q));
    }
    static V select(Mask m, V a, V b) { return _mm256_blendv_ps(a, b, m); }
    static V sq_acc(V acc, V x) { return _mm256_fmadd_ps(x, x, acc); }
    static V abs(V a) { return _mm256_and_ps(a, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff))); }
    // (0 < a) - (a < 0), each comparison as 1.0f or 0.0f: 0 for zeros and NaN.
    static V sign(V a) {
        const V zero = _mm256_setzero_ps(), one = _mm256_set1_ps(1.0f);
        return _mm256_sub_ps(_mm256_and_ps(_mm256_cmp_ps(zero, a, _CMP_LT_OQ), one),
                             _mm256_and_ps(_mm256_cmp_ps(a, zero, _CMP_LT_OQ), one));
    }
    static V recip(V a) { return _mm256_div_ps(_mm256_set1_ps(1.0f), a); }
    // bf16 state (kernel_body.h's widen_bf16 and narrow_bf16, 8 lanes at a time).
    static V load16(const uint16_t *p) {
        const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
        return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    }
    static void store16(uint16_t *p, V v) {
        const __m256i x = _mm256_castps_si256(v);
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
        const __m256i rounded =
            _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
        // NaN (magnitude above infinity's bits; both operands are below 2^31): quieted.
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                               _mm256_set1_epi32(0x7f800000));
        const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
        const __m256i h = _mm256_blendv_epi8(rounded, quiet, nan);
        // 32-bit lanes of at most 0xffff into 16 bits: pack within each 128-bit half, then
        // put the halves' results side by side.
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0xD8);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(p), _mm256_castsi256_si128(packed));
    }
    // The map's entries loaded one at a time and put side by side: on Zen 3 that takes
    // about two thirds of the time of a gather of 8 lanes (bench/README.md).
    static void decode8(const uint8_t *codes, size_t n, float scale, const float *map, float *out) {
        const size_t vec = n - n % W;
        const V s = set1(scale);
        for (size_t i = 0; i < vec; i += W) {
            uint64_t c;
            std::memcpy(&c, codes + i, 8);
            const __m128 lo = _mm_setr_ps(map[c & 0xff], map[(c >> 8) & 0xff], map[(c >> 16) & 0xff], map[(c >> 24) & 0xff]);
            const __m128 hi = _mm_setr_ps(map[(c >> 32) & 0xff], map[(c >> 40) & 0xff], map[(c >> 48) & 0xff], map[c >> 56]);
            store(out + i, mul(_mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1), s));
        }
        decode_tail(codes, vec, n, scale, map, out);
    }
    // The reference's code of y = x / scale, 8 lanes (kernel_body.h's scalar
    // nearest_code): the map's index and the entries each lane compares with gathered.
    static __m256i searched_codes(V y, const float *map, const uint8_t *lut) {
        const __m256i one = _mm256_set1_epi32(1), last = _mm256_set1_epi32(255);
        // state_codec.h's lut_key, 8 lanes
        const __m256i bits = _mm256_castps_si256(y);
        __m256i key = _mm256_sub_epi32(_mm256_srli_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)), 15),
                                       _mm256_set1_epi32(102 << 8));
        key = _mm256_min_epi32(_mm256_max_epi32(key, _mm256_setzero_si256()), _mm256_set1_epi32(kLutBuckets - 1));
        key = _mm256_add_epi32(key, _mm256_mullo_epi32(_mm256_srli_epi32(bits, 31), _mm256_set1_epi32(kLutBuckets)));
        __m256i c = _mm256_and_si256(_mm256_i32gather_epi32(reinterpret_cast<const int *>(lut), key, 1),
                                     _mm256_set1_epi32(0xff));
        const __m256i next = _mm256_min_epi32(_mm256_add_epi32(c, one), last);
        const V ge = _mm256_cmp_ps(y, _mm256_i32gather_ps(map, next, 4), _CMP_GE_OQ);
        c = _mm256_blendv_epi8(c, next, _mm256_castps_si256(ge));
        const __m256i up = _mm256_min_epi32(_mm256_add_epi32(c, one), last);
        const V qc = _mm256_i32gather_ps(map, c, 4), qu = _mm256_i32gather_ps(map, up, 4);
        const V round_up = _mm256_cmp_ps(sub(y, qc), mul(sub(qu, qc), set1(0.5f)), _CMP_GE_OQ);
        c = _mm256_blendv_epi8(c, up, _mm256_castps_si256(round_up));
        return _mm256_and_si256(c, _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_ORD_Q)));  // NaN: code 0
    }
    // The code estimated from a = |x| * (1 / scale) by state_codec.h's MagnitudeIndex (one
    // gather, one integer compare with the bucket's threshold, mirrored for negative x);
    // lanes within the guard of the threshold are set in `near`.
    static __m256i estimated_codes(V x, V recip_scale, const MagnitudeIndex &mi, __m256i *near) {
        const __m256i a = _mm256_castps_si256(abs(mul(x, recip_scale)));
        __m256i key = _mm256_sub_epi32(_mm256_srli_epi32(a, 16), _mm256_set1_epi32(kMagnitudeKeyBase));
        key = _mm256_min_epi32(_mm256_max_epi32(key, _mm256_setzero_si256()), _mm256_set1_epi32(kMagnitudeBuckets - 1));
        alignas(32) uint32_t k[W];  // loads one at a time: faster than a gather on Zen 3
        _mm256_store_si256(reinterpret_cast<__m256i *>(k), key);
        const uint32_t *t = mi.entries;
        const __m256i e = _mm256_setr_epi32(static_cast<int>(t[k[0]]), static_cast<int>(t[k[1]]), static_cast<int>(t[k[2]]),
                                            static_cast<int>(t[k[3]]), static_cast<int>(t[k[4]]), static_cast<int>(t[k[5]]),
                                            static_cast<int>(t[k[6]]), static_cast<int>(t[k[7]]));
        // d = bits(a) - bits(T): a's place in its bucket, biased, minus the threshold's.
        const __m256i d = _mm256_sub_epi32(
            _mm256_add_epi32(_mm256_and_si256(a, _mm256_set1_epi32(0xffff)), _mm256_set1_epi32(kMagnitudeBias)),
            _mm256_srli_epi32(e, 8));
        // The entry's code, plus one where d >= 0 (d >> 31 is -1 where d < 0).
        const __m256i code = _mm256_add_epi32(_mm256_and_si256(e, _mm256_set1_epi32(0xff)),
                                              _mm256_add_epi32(_mm256_srai_epi32(d, 31), _mm256_set1_epi32(1)));
        *near = _mm256_or_si256(*near, _mm256_cmpgt_epi32(_mm256_set1_epi32(kMagnitudeGuard + 1), _mm256_abs_epi32(d)));
        const __m256i mirrored =
            _mm256_max_epi32(_mm256_sub_epi32(_mm256_set1_epi32(mi.mirror), code), _mm256_setzero_si256());
        return _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(code), _mm256_castsi256_ps(mirrored), x));
    }
    // 32 codes (each lane below 256) as bytes, in order: the packs work within 128-bit
    // halves, so the dwords come out as a0-3 b0-3 c0-3 d0-3 a4-7 b4-7 c4-7 d4-7.
    static void store_codes(uint8_t *out, __m256i a, __m256i b, __m256i c, __m256i d) {
        const __m256i packed = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out),
                            _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    // The block's scale from its largest magnitude (NaN if any element is NaN): the
    // largest of the magnitudes' bits, as non-negative floats order as their bits and a
    // NaN's lie above every other's.
    static float scale_of(const float *x, size_t n) {
        const size_t vec = n - n % W;
        const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
        __m256i top = _mm256_setzero_si256();
        for (size_t i = 0; i < vec; i += W)
            top = _mm256_max_epi32(top, _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + i)),
                                                         magnitude));
        alignas(32) uint32_t lanes[W];
        _mm256_store_si256(reinterpret_cast<__m256i *>(lanes), top);
        uint32_t most = 0;
        for (uint32_t l : lanes) most = l > most ? l : most;
        bool any_nan = most > 0x7f800000u;
        float absmax;
        std::memcpy(&absmax, &most, 4);
        if (any_nan) absmax = 0.0f;
        absmax_tail(x, vec, n, &absmax, &any_nan);
        return block_scale(absmax, any_nan);
    }
    // kernel_body.h's scalar encode8, 32 lanes at a time: codes estimated where the
    // block's scale is finite and none of the 32 is near a threshold, searched elsewhere.
    static float encode8(const float *x, size_t n, const float *map, const uint8_t *lut, uint8_t *codes) {
        const float scale = scale_of(x, n);
        const MagnitudeIndex &mi = magnitude_index(map);
        const bool estimate = mi.exact && scale <= 3.0e38f;  // finite
        const V s = set1(scale), r = set1(1.0f / scale);
        size_t i = 0;
        for (; i + 4 * W <= n; i += 4 * W) {
            __m256i near = _mm256_set1_epi32(-1), c0 = near, c1 = near, c2 = near, c3 = near;
            if (estimate) {
                near = _mm256_setzero_si256();
                c0 = estimated_codes(load(x + i), r, mi, &near);
                c1 = estimated_codes(load(x + i + W), r, mi, &near);
                c2 = estimated_codes(load(x + i + 2 * W), r, mi, &near);
                c3 = estimated_codes(load(x + i + 3 * W), r, mi, &near);
            }
            if (!_mm256_testz_si256(near, near)) {
                c0 = searched_codes(div(load(x + i), s), map, lut);
                c1 = searched_codes(div(load(x + i + W), s), map, lut);
                c2 = searched_codes(div(load(x + i + 2 * W), s), map, lut);
                c3 = searched_codes(div(load(x + i + 3 * W), s), map, lut);
            }
            store_codes(codes + i, c0, c1, c2, c3);
        }
        codes_tail(x, i, n, scale, map, lut, codes);
        return scale;
    }
    static double hsum(V acc) {
        __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(acc)),
                                  _mm256_cvtps_pd(_mm256_extractf128_ps(acc, 1)));
        __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
        return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    }
};

// a * c mod 2^64 in each of 4 lanes, c a constant: AVX2 multiplies 32 x 32 bits only, so
// lo(a) lo(c) + (hi(a) lo(c) + lo(a) hi(c)) << 32.
__m256i mul64(__m256i a, uint64_t c) {
    const __m256i c_lo = _mm256_set1_epi64x(static_cast<long long>(c & 0xFFFFFFFFu));
    const __m256i c_hi = _mm256_set1_epi64x(static_cast<long long>(c >> 32));
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), c_lo), _mm256_mul_epu32(a, c_hi));
    return _mm256_add_epi64(_mm256_mul_epu32(a, c_lo), _mm256_slli_epi64(cross, 32));
}

// The top 16 bits of mix64(z), 4 lanes (its last xor-shift leaves them as they are).
__m256i top16_of_mix64(__m256i z) {
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), 0xBF58476D1CE4E5B9ull);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), 0x94D049BB133111EBull);
    return _mm256_srli_epi64(z, 48);
}

// stochastic_round_reference, 8 elements at a time: their counters in two registers of 4
// x 64 bits, whose low halves are gathered into one of 8 x 32; the bits added below each
// float's bf16 part, NaN quieted; the tail is the reference's.
void round_stochastic(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element) {
    const size_t vec = n - n % 8;
    alignas(32) uint64_t start[4];
    for (int l = 0; l < 4; ++l) start[l] = key + (first_element + 1 + static_cast<uint64_t>(l)) * kGoldenGamma;
    __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i *>(start));
    const __m256i four = _mm256_set1_epi64x(static_cast<long long>(4 * kGoldenGamma));
    const __m256i eight = _mm256_set1_epi64x(static_cast<long long>(8 * kGoldenGamma));
    const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    for (size_t i = 0; i < vec; i += 8, lo = _mm256_add_epi64(lo, eight)) {
        const __m256i r0 = _mm256_permutevar8x32_epi32(top16_of_mix64(lo), low_halves);
        const __m256i r1 = _mm256_permutevar8x32_epi32(top16_of_mix64(_mm256_add_epi64(lo, four)), low_halves);
        const __m256i rand = _mm256_blend_epi32(r0, r1, 0xF0);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(x + i));
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(v, magnitude), inf);
        const __m256i h = _mm256_blendv_epi8(_mm256_srli_epi32(_mm256_add_epi32(v, rand), 16),
                                             _mm256_or_si256(_mm256_srli_epi32(v, 16), _mm256_set1_epi32(0x40)), nan);
        // Each lane < 2^16: packus keeps it; the two 128-bit halves' words then joined.
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, h), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i *>(out + i), _mm256_castsi256_si128(packed));
    }
    stochastic_round_reference(x + vec, out + vec, n - vec, key, first_element + vec);
}

}  // namespace

const KernelTable kAvx2Kernels = {"avx2", &update_range<Avx2Ops>, &sum_of_squares_range<Avx2Ops>,
                                  &Avx2Ops::encode8, &Avx2Ops::decode8, &round_stochastic};

}  // namespace internal
}  // namespace optim
}  // namespace sx
