#include "base/half.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

#include "sx/sx.h"

namespace sx {
namespace half {
namespace {

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
}

float float_of(uint32_t u) {
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
}

void scalar_to_f32(int32_t dtype, const uint16_t *src, float *dst, size_t n) {
    if (dtype == SX_DTYPE_BF16) {
        for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
    } else {
        for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
    }
}

void scalar_from_f32(int32_t dtype, const float *src, uint16_t *dst, size_t n) {
    if (dtype == SX_DTYPE_BF16) {
        for (size_t i = 0; i < n; ++i) dst[i] = f32_to_bf16(src[i]);
    } else {
        for (size_t i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
    }
}

#if defined(__x86_64__)
bool cpu_has_f16c_avx2() {
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2")) return false;  // also: the OS saves AVX state
    // F16C is CPUID leaf 1, ECX bit 29, read directly: clang's __builtin_cpu_supports does
    // not know the name "f16c".
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

const internal::Table &table() {
#if defined(__x86_64__)
    static const internal::Table &t = cpu_has_f16c_avx2() ? internal::kF16cAvx2 : internal::kScalar;
#else
    static const internal::Table &t = internal::kScalar;
#endif
    return t;
}

// Bulk work through a stack buffer of fp32, so that the SIMD conversions do the work:
// fn(first element, count, buffer) for each piece of [0, n).
constexpr size_t kPiece = 1024;

template <typename Fn>
void in_pieces(size_t n, Fn &&fn) {
    float a[kPiece];
    for (size_t i = 0; i < n; i += kPiece) fn(i, n - i < kPiece ? n - i : kPiece, a);
}

}  // namespace

// Round to nearest even by integer arithmetic (after F. Giesen's float_to_half_fast3_rtne):
// subnormal results come from one float addition that leaves the wanted bits at the
// bottom of the mantissa, rounded by the FPU's own round-to-nearest-even.
uint16_t f32_to_f16(float f) {
    uint32_t x = bits_of(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    uint16_t o;
    if (x >= 0x47800000u) {                                // |f| >= 65536, inf or NaN
        if (x > 0x7f800000u) {
            o = static_cast<uint16_t>(0x7e00u | ((x >> 13) & 0x3ffu));  // NaN: quiet, upper payload
        } else {
            o = 0x7c00u;
        }
    } else if (x < 0x38800000u) {                          // below 2^-14: fp16 subnormal or zero
        const uint32_t magic = 126u << 23;                 // 0.5: lines the result bits up at the bottom
        o = static_cast<uint16_t>(bits_of(float_of(x) + float_of(magic)) - magic);
    } else {
        const uint32_t odd = (x >> 13) & 1u;
        x += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + odd;  // rebias, round half to even
        o = static_cast<uint16_t>(x >> 13);                // a carry into the exponent is correct, up to inf
    }
    return static_cast<uint16_t>(o | sign);
}

float f16_to_f32(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t o;
    if (exp == 0x1f) {
        o = 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u);  // inf, or NaN made quiet
    } else if (exp != 0) {
        o = ((exp + 127 - 15) << 23) | (mant << 13);
    } else if (mant == 0) {
        o = 0;
    } else {
        const float v = static_cast<float>(mant) * 0x1p-24f;  // subnormal: mant * 2^-24, exact
        return sign ? -v : v;
    }
    return float_of(o | sign);
}

uint16_t f32_to_bf16(float f) {
    const uint32_t x = bits_of(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // NaN: quiet
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float bf16_to_f32(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

namespace internal {
const Table kScalar = {scalar_to_f32, scalar_from_f32};
}  // namespace internal

bool simd_available() { return &table() != &internal::kScalar; }

void to_f32(int32_t dtype, const uint16_t *src, float *dst, size_t n) { table().to_f32(dtype, src, dst, n); }

void from_f32(int32_t dtype, const float *src, uint16_t *dst, size_t n) { table().from_f32(dtype, src, dst, n); }

void add_into(int32_t dtype, uint16_t *dst, const uint16_t *src, size_t n) {
    in_pieces(n, [&](size_t i, size_t m, float *a) {
        float b[kPiece];
        table().to_f32(dtype, dst + i, a, m);
        table().to_f32(dtype, src + i, b, m);
        for (size_t k = 0; k < m; ++k) a[k] += b[k];
        table().from_f32(dtype, a, dst + i, m);
    });
}

void add_to_f32(int32_t dtype, const uint16_t *src, float *dst, size_t n) {
    in_pieces(n, [&](size_t i, size_t m, float *a) {
        table().to_f32(dtype, src + i, a, m);
        for (size_t k = 0; k < m; ++k) dst[i + k] += a[k];
    });
}

void scale(int32_t dtype, uint16_t *data, float factor, size_t n) {
    in_pieces(n, [&](size_t i, size_t m, float *a) {
        table().to_f32(dtype, data + i, a, m);
        for (size_t k = 0; k < m; ++k) a[k] *= factor;
        table().from_f32(dtype, a, data + i, m);
    });
}

}  // namespace half
}  // namespace sx
