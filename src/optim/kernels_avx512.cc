// AVX-512 flavour: 16 floats per vector; FMA only in the sum of squares. Built with
// -mavx512f -mavx512dq -mfma -fno-math-errno and run only where detect_isa() found
// AVX-512F and AVX-512DQ. Loads and stores are unaligned: a thread's piece of a
// segment may start anywhere.
#include <immintrin.h>

#include "optim/kernel_body.h"

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
    static double hsum(V acc) {
        __m512d d = _mm512_add_pd(_mm512_cvtps_pd(_mm512_castps512_ps256(acc)),
                                  _mm512_cvtps_pd(_mm512_extractf32x8_ps(acc, 1)));
        return _mm512_reduce_add_pd(d);
    }
};

}  // namespace

const KernelTable kAvx512Kernels = {"avx512", &update_range<Avx512Ops>,
                                    &sum_of_squares_range<Avx512Ops>};

}  // namespace internal
}  // namespace optim
}  // namespace sx
