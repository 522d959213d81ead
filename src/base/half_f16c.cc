// The F16C / AVX2 flavour of half.h's bulk conversions (built with -mf16c -mavx2, run
// only where half.cc finds both). fp16 uses the hardware conversions; bf16, which has
// no instruction before AVX-512 BF16, rounds with integer vector arithmetic exactly as
// f32_to_bf16 does.
#include <immintrin.h>

#include "base/half.h"
#include "sx/sx.h"

namespace sx {
namespace half {
namespace {

void to_f32_simd(int32_t dtype, const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    if (dtype == SX_DTYPE_BF16) {
        for (; i + 8 <= n; i += 8) {
            const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i)));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        }
        for (; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
    } else {
        for (; i + 8 <= n; i += 8)
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(src + i))));
        for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
    }
}

void from_f32_simd(int32_t dtype, const float *src, uint16_t *dst, size_t n) {
    size_t i = 0;
    if (dtype == SX_DTYPE_BF16) {
        const __m256i bias = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1), quiet = _mm256_set1_epi32(0x40);
        for (; i + 8 <= n; i += 8) {
            const __m256 v = _mm256_loadu_ps(src + i);
            const __m256i x = _mm256_castps_si256(v);
            const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
            const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, odd)), 16);
            const __m256i nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), quiet);
            const __m256i is_nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            const __m256i r = _mm256_blendv_epi8(rounded, nan, is_nan);
            // Every lane is in [0, 0xffff], so the unsigned-saturating pack keeps it; the
            // pack interleaves 128-bit lanes, the permute puts the 8 results in order.
            const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
            _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + i), _mm256_castsi256_si128(packed));
        }
        for (; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
    } else {
        for (; i + 8 <= n; i += 8)
            _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        for (; i < n; ++i) dst[i] = f32_to_f16(src[i]);
    }
}

}  // namespace

namespace internal {
const Table kF16cAvx2 = {to_f32_simd, from_f32_simd};
}  // namespace internal

}  // namespace half
}  // namespace sx
