// AVX-512 flavour: 16 floats per vector; FMA only in the sum of squares. Built with
// -mavx512f -mavx512dq -mfma -fno-math-errno and run only where detect_isa() found
// AVX-512F and AVX-512DQ. Loads and stores are unaligned: a thread's piece of a
// segment may start anywhere.
#include <immintrin.h>

#include "optim/kernel_body.h"
#include "optim/stochastic_round.h"

namespace sx {
namespace optim {
namespace internal {
namespace {

struct Avx512Ops {
    using V = __m512;
    using Mask = __mmask16;
    static constexpr size_t W = 16;
    static V load(const float *p) { return _mm512_loadu_ps(p); }
    static void store(float *p, V v) { _mm512_storeu_ps(p, v); }
    static V set1(float x) { return _mm512_set1_ps(x); }
    static Mask mask(bool b) { return b ? Mask(0xFFFF) : Mask(0); }
    static V add(V a, V b) { return _mm512_add_ps(a, b); }
    static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
    static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
    static V div(V a, V b) { return _mm512_div_ps(a, b); }
    static V sqrt(V a) { return _mm512_sqrt_ps(a); }
    // maxps gives b when either is NaN; then a NaN a replaces the result.
    static V maximum(V a, V b) {
        return _mm512_mask_mov_ps(_mm512_max_ps(a, b), _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q), a);
    }
    static V select(Mask m, V a, V b) { return _mm512_mask_blend_ps(m, a, b); }
    static V sq_acc(V acc, V x) { return _mm512_fmadd_ps(x, x, acc); }
    static V abs(V a) { return _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(a), _mm512_set1_epi32(0x7fffffff))); }
    // (0 < a) - (a < 0), each comparison as 1.0f or 0.0f: 0 for zeros and NaN.
    static V sign(V a) {
        const V zero = _mm512_setzero_ps(), one = _mm512_set1_ps(1.0f);
        return _mm512_sub_ps(_mm512_maskz_mov_ps(_mm512_cmp_ps_mask(zero, a, _CMP_LT_OQ), one),
                             _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(a, zero, _CMP_LT_OQ), one));
    }
    static V recip(V a) { return _mm512_div_ps(_mm512_set1_ps(1.0f), a); }
    // bf16 state (kernel_body.h's widen_bf16 and narrow_bf16, 16 lanes at a time).
    static V load16(const uint16_t *p) {
        const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
        return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
    }
    static void store16(uint16_t *p, V v) {
        const __m512i x = _mm512_castps_si512(v);
        const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
        __m512i h = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
        // NaN (magnitude above infinity's bits; both operands are below 2^31): quieted.
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)),
                                                      _mm512_set1_epi32(0x7f800000));
        h = _mm512_mask_or_epi32(h, nan, _mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), _mm512_cvtepi32_epi16(h));
    }
    static double hsum(V acc) {
        __m512d d = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(acc)),
                                  _mm512_cvtps_pd(_mm512_extractf32x8_ps(acc, 1)));
        return _mm512_reduce_add_pd(d);
    }
    // The map's entries looked up in registers (gathers are slow on many CPUs): a
    // two-source permute picks each lane's entry among 32, and bits 5-7 of its code choose
    // among the eight permutes' results (each bit moved into the sign to make its mask).
    // Written out: loops over register arrays end up in memory.
    static void decode8(const uint8_t *codes, size_t n, float scale, const float *map, float *out) {
        const size_t vec = n - n % W;
        const V s = set1(scale);
        const V t0 = load(map), t1 = load(map + 16), t2 = load(map + 32), t3 = load(map + 48);
        const V t4 = load(map + 64), t5 = load(map + 80), t6 = load(map + 96), t7 = load(map + 112);
        const V t8 = load(map + 128), t9 = load(map + 144), t10 = load(map + 160), t11 = load(map + 176);
        const V t12 = load(map + 192), t13 = load(map + 208), t14 = load(map + 224), t15 = load(map + 240);
        for (size_t i = 0; i < vec; i += W) {
            const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(codes + i)));
            const __mmask16 b5 = _mm512_movepi32_mask(_mm512_slli_epi32(c, 26));
            const __mmask16 b6 = _mm512_movepi32_mask(_mm512_slli_epi32(c, 25));
            const __mmask16 b7 = _mm512_movepi32_mask(_mm512_slli_epi32(c, 24));
            const V e0 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t0, c, t1), _mm512_permutex2var_ps(t2, c, t3));
            const V e1 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t4, c, t5), _mm512_permutex2var_ps(t6, c, t7));
            const V e2 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t8, c, t9), _mm512_permutex2var_ps(t10, c, t11));
            const V e3 =
                _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(t12, c, t13), _mm512_permutex2var_ps(t14, c, t15));
            const V low = _mm512_mask_blend_ps(b6, e0, e1), high = _mm512_mask_blend_ps(b6, e2, e3);
            store(out + i, mul(_mm512_mask_blend_ps(b7, low, high), s));
        }
        decode_tail(codes, vec, n, scale, map, out);
    }
    // The reference's code of y = x / scale for 16 lanes, the map's entries looked up in
    // registers (state_codec.h's search_tables; gathers are slow on many CPUs): an 8-step
    // binary search for the largest c with map[c] <= y, which also leaves map[c] (the last
    // threshold passed; map[0] if none) and map[c + 1] (the least threshold failed; the
    // step of c's lowest zero bit tested it) for the step up where y is at least half-way
    // to the next entry. NaN fails every comparison: code 0, as the scalar encoder gives.
    static __m512i searched_codes(V y, const float *map) {
        const float *t = search_tables(map);
        __m512i c = _mm512_setzero_si512();
        V below = set1(map[0]), above = set1(map[255]);
        for (int step = 0; step < 8; ++step) {
            const int k = 128 >> step;
            const __m512i at = _mm512_srli_epi32(c, 8 - step);  // c / 2k
            const float *tk = t + kSearchTableOffset[step];
            V entry;
            if (step <= 4) {
                entry = _mm512_permutexvar_ps(at, load(tk));
            } else if (step == 5) {
                entry = _mm512_permutex2var_ps(load(tk), at, load(tk + 16));
            } else {
                // 64 or 128 entries: pairs of registers chosen by bits 5 and 6 of `at`.
                const __mmask16 b5 = _mm512_test_epi32_mask(at, _mm512_set1_epi32(32));
                V e0 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(load(tk), at, load(tk + 16)),
                                            _mm512_permutex2var_ps(load(tk + 32), at, load(tk + 48)));
                if (step == 7) {
                    const V e1 = _mm512_mask_blend_ps(b5, _mm512_permutex2var_ps(load(tk + 64), at, load(tk + 80)),
                                                      _mm512_permutex2var_ps(load(tk + 96), at, load(tk + 112)));
                    e0 = _mm512_mask_blend_ps(_mm512_test_epi32_mask(at, _mm512_set1_epi32(64)), e0, e1);
                }
                entry = e0;
            }
            const __mmask16 ge = _mm512_cmp_ps_mask(y, entry, _CMP_GE_OQ);
            c = _mm512_mask_add_epi32(c, ge, c, _mm512_set1_epi32(k));
            below = _mm512_mask_mov_ps(below, ge, entry);
            above = _mm512_mask_min_ps(above, static_cast<__mmask16>(~ge), above, entry);
        }
        const __mmask16 round_up = _mm512_cmp_ps_mask(sub(y, below), mul(sub(above, below), set1(0.5f)), _CMP_GE_OQ);
        return _mm512_mask_mov_epi32(c, round_up, _mm512_min_epi32(_mm512_add_epi32(c, _mm512_set1_epi32(1)),
                                                                    _mm512_set1_epi32(255)));
    }
    // The code computed from a = |x| / scale (state_codec.h's FastCodeTables): the class
    // from the octave's entries, then floor(a F - G) within it, mirrored for negative x;
    // `near` gets the lanes too close to a threshold for the estimate to be trusted.
    static __m512i estimated_codes(V x, V recip_scale, const FastCodeTables &ft, __mmask16 *near) {
        const V a = mul(abs(x), recip_scale);
        // The octave's exponent, whose low 5 bits index its entries (a < 2 here: |x| <= scale).
        const __m512i o = _mm512_srli_epi32(
            _mm512_castps_si512(_mm512_max_ps(a, _mm512_castsi512_ps(_mm512_set1_epi32(kFastLowestExponent << 23)))),
            23);
        __m512i q = _mm512_permutex2var_epi32(_mm512_load_si512(ft.octave_class), o,
                                              _mm512_load_si512(ft.octave_class + 16));
        const V bound = _mm512_permutex2var_ps(load(ft.octave_bound), o, load(ft.octave_bound + 16));
        q = _mm512_mask_add_epi32(q, _mm512_cmp_ps_mask(a, bound, _CMP_GE_OQ), q, _mm512_set1_epi32(1));
        // Infinite bounds: inf - a is inf, and inf < inf fails.
        __mmask16 close = _mm512_cmp_ps_mask(abs(sub(a, bound)), mul(bound, set1(kFastGuardRel)), _CMP_LT_OQ);
        const V t = _mm512_fmsub_ps(a, _mm512_permutexvar_ps(q, load(ft.factor)), _mm512_permutexvar_ps(q, load(ft.offset)));
        const __m512i k = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
        // t - round(t), nearest: the distance to the closest grid line.
        close |= _mm512_cmp_ps_mask(abs(_mm512_reduce_ps(t, _MM_FROUND_TO_NEAREST_INT)), set1(kFastGuardT), _CMP_LT_OQ);
        *near = close;
        const __m512i code = _mm512_min_epi32(_mm512_add_epi32(_mm512_max_epi32(k, _mm512_setzero_si512()),
                                                               _mm512_permutexvar_epi32(q, _mm512_load_si512(ft.first))),
                                              _mm512_permutexvar_epi32(q, _mm512_load_si512(ft.last)));
        const __m512i mirrored = _mm512_max_epi32(_mm512_sub_epi32(_mm512_set1_epi32(ft.mirror), code),
                                                  _mm512_setzero_si512());
        return _mm512_mask_mov_epi32(code, _mm512_movepi32_mask(_mm512_castps_si512(x)), mirrored);
    }
    // kernel_body.h's scalar encode8, 16 lanes at a time: codes estimated where the block's
    // scale is finite and no lane of the vector is near a threshold, searched elsewhere.
    static float encode8(const float *x, size_t n, const float *map, const uint8_t *lut, uint8_t *codes) {
        const size_t vec = n - n % W;
        __m512 top = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (size_t i = 0; i < vec; i += W) {
            const V a = abs(load(x + i));
            nan |= _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q);
            top = _mm512_max_ps(top, a);  // NaN lanes are told by `nan`
        }
        float absmax = vec ? _mm512_reduce_max_ps(top) : 0.0f;
        bool any_nan = nan != 0;
        absmax_tail(x, vec, n, &absmax, &any_nan);
        const float scale = block_scale(absmax, any_nan);
        const FastCodeTables &ft = fast_code_tables(map);
        const bool estimate = ft.exact && scale <= 3.0e38f;  // finite
        const V s = set1(scale), r = set1(1.0f / scale);
        for (size_t i = 0; i < vec; i += W) {
            const V xi = load(x + i);
            __mmask16 near = 0xFFFF;
            __m512i c = estimate ? estimated_codes(xi, r, ft, &near) : _mm512_setzero_si512();
            if (near) c = searched_codes(div(xi, s), map);
            _mm_storeu_si128(reinterpret_cast<__m128i *>(codes + i), _mm512_cvtepi32_epi8(c));
        }
        codes_tail(x, vec, n, scale, map, lut, codes);
        return scale;
    }
};

// The top 16 bits of mix64(z), 8 lanes: its last xor-shift (z ^ z >> 31) leaves the top
// 33 bits as they are, so two rounds and the shift give random16's bits.
__m512i top16_of_mix64(__m512i z) {
    const __m512i c1 = _mm512_set1_epi64(static_cast<long long>(0xBF58476D1CE4E5B9ull));
    const __m512i c2 = _mm512_set1_epi64(static_cast<long long>(0x94D049BB133111EBull));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), c1);
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), c2);
    return _mm512_srli_epi64(z, 48);
}

// stochastic_round_reference, 16 elements at a time: their 16 counters (key + (element +
// 1) * kGoldenGamma, wrapping) in two registers of 8 x 64 bits (AVX-512DQ's 64-bit
// multiplies), the bits added below each float's bf16 part, NaN quieted; the tail is the
// reference's.
void round_stochastic(const float *x, uint16_t *out, size_t n, uint64_t key, uint64_t first_element) {
    const size_t vec = n - n % 16;
    alignas(64) uint64_t start[8];
    for (int l = 0; l < 8; ++l) start[l] = key + (first_element + 1 + static_cast<uint64_t>(l)) * kGoldenGamma;
    __m512i lo = _mm512_load_si512(start);
    const __m512i eight = _mm512_set1_epi64(static_cast<long long>(8 * kGoldenGamma));
    const __m512i sixteen = _mm512_set1_epi64(static_cast<long long>(16 * kGoldenGamma));
    const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
    for (size_t i = 0; i < vec; i += 16, lo = _mm512_add_epi64(lo, sixteen)) {
        const __m256i r0 = _mm512_cvtepi64_epi32(top16_of_mix64(lo));
        const __m256i r1 = _mm512_cvtepi64_epi32(top16_of_mix64(_mm512_add_epi64(lo, eight)));
        const __m512i rand = _mm512_inserti64x4(_mm512_castsi256_si512(r0), r1, 1);
        const __m512i v = _mm512_loadu_si512(x + i);
        const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(v, magnitude), inf);
        __m512i h = _mm512_srli_epi32(_mm512_add_epi32(v, rand), 16);
        h = _mm512_mask_or_epi32(h, nan, _mm512_srli_epi32(v, 16), _mm512_set1_epi32(0x40));
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(out + i), _mm512_cvtepi32_epi16(h));
    }
    stochastic_round_reference(x + vec, out + vec, n - vec, key, first_element + vec);
}

}  // namespace

const KernelTable kAvx512Kernels = {"avx512", &update_range<Avx512Ops>, &sum_of_squares_range<Avx512Ops>,
                                    &Avx512Ops::encode8, &Avx512Ops::decode8, &round_stochastic};

}  // namespace internal
}  // namespace optim
}  // namespace sx
