// AVX2 flavour: 8 floats per vector; FMA only in the sum of squares. Built with
// -mavx2 -mfma -fno-math-errno and run only where detect_isa() found AVX2 and FMA.
// Loads and stores are unaligned: a thread's piece of a segment may start anywhere.
#include <immintrin.h>

#include "optim/kernel_body.h"

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
    static double hsum(V acc) {
        __m256d d = _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(acc)),
                                  _mm256_cvtps_pd(_mm256_extractf128_ps(acc, 1)));
        __m128d h = _mm_add_pd(_mm256_castpd256_pd128(d), _mm256_extractf128_pd(d, 1));
        return _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
    }
};

}  // namespace

const KernelTable kAvx2Kernels = {"avx2", &update_range<Avx2Ops>, &sum_of_squares_range<Avx2Ops>};

}  // namespace internal
}  // namespace optim
}  // namespace sx
