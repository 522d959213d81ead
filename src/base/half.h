// 16-bit floating point: IEEE 754 binary16 (fp16) and bfloat16 (the upper half of a
// binary32), held as uint16_t bit patterns. Conversions from fp32 round to nearest,
// ties to even, as CUDA's __float2half_rn / __float2bfloat16_rn and F16C's VCVTPS2PH do;
// fp16 overflow becomes infinity, and a NaN stays a NaN (quieted, sign and upper
// payload bits kept). Conversions to fp32 are exact.
//
// The bulk functions run F16C / AVX2 code where the CPU has it (chosen at run time)
// and give, bit for bit, what the scalar functions give.
#pragma once

#include <cstddef>
#include <cstdint>

#include "sx/sx.h"

namespace sx {
namespace half {

uint16_t f32_to_f16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float bf16_to_f32(uint16_t h);

// dtype is SX_DTYPE_F16 or SX_DTYPE_BF16. src and dst must not overlap.
void to_f32(int32_t dtype, const uint16_t *src, float *dst, size_t n);
void from_f32(int32_t dtype, const float *src, uint16_t *dst, size_t n);
// dst[i] += float(src[i]) (fp32 dst).
void add_to_f32(int32_t dtype, const uint16_t *src, float *dst, size_t n);
// dst[i] = round(float(dst[i]) + float(src[i])): one 16-bit sum, as a reduction in
// that dtype computes it.
void add_into(int32_t dtype, uint16_t *dst, const uint16_t *src, size_t n);
// dst[i] = round(float(dst[i]) * factor).
void scale(int32_t dtype, uint16_t *data, float factor, size_t n);

// Whether the bulk functions use the F16C / AVX2 code on this CPU.
bool simd_available();

namespace internal {
// The bulk functions of one flavour; the scalar one is the reference.
struct Table {
    void (*to_f32)(int32_t dtype, const uint16_t *src, float *dst, size_t n);
    void (*from_f32)(int32_t dtype, const float *src, uint16_t *dst, size_t n);
};
extern const Table kScalar;
#if defined(__x86_64__)
extern const Table kF16cAvx2;
#endif
}  // namespace internal

}  // namespace half
}  // namespace sx
