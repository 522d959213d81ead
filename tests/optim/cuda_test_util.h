// Helpers for the CUDA optimizer tests: round-to-nearest-even conversions to bf16 and
// fp16 written from the formats' definitions (independent of CUDA's), and device
// copies of the guarded host arrays of optim_test_util.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/runtime.h"
#include "optim/optim_test_util.h"

namespace sx {
namespace optim {
namespace test {

inline uint32_t float_bits(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    return x;
}

// bf16 is the high half of a float: add half an ulp of the kept part, minus one if the
// kept part is even (ties to even); NaN stays NaN (quiet).
inline uint16_t bf16_rne(float f) {
    const uint32_t x = float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// IEEE binary16: 5 exponent bits (bias 15), 10 mantissa bits, subnormals in units of 2^-24.
inline uint16_t fp16_rne(float f) {
    uint32_t x = float_bits(f);
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00u;   // NaN
    if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 (halfway past 65504): inf
    if (x < 0x38800000u) {                        // below 2^-14: a multiple of 2^-24
        float a;
        std::memcpy(&a, &x, 4);
        // a * 2^24 is exact; nearbyint rounds half to even in the default rounding mode.
        return sign | static_cast<uint16_t>(std::nearbyint(a * 16777216.0f));
    }
    const uint32_t mant = x & 0x7fffffu;
    uint32_t h = ((((x >> 23) & 0xffu) - 127u + 15u) << 10) | (mant >> 13);
    const uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry moves into the exponent
    return static_cast<uint16_t>(sign | h);
}

inline bool half_is_nan(uint16_t h, bool bf16) {
    return bf16 ? (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0 : (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

// A device copy of a Guarded array, guard cells and the floats before them included,
// so that element 0 has the same position within 16 bytes as on the host.
class DeviceMirror {
  public:
    Status upload(const Guarded &g, size_t offset) {
        offset_ = offset;
        const size_t floats = offset + g.size() + 2 * Guarded::kGuard;
        Status s = buf_.allocate(floats * sizeof(float), "test buffer");
        if (!s.ok()) return s;
        return buf_.upload(g.data() - Guarded::kGuard - offset, floats * sizeof(float));
    }
    Status download(Guarded &g) const {
        return buf_.download(g.data() - Guarded::kGuard - offset_, buf_.size());
    }
    float *data() const { return buf_.as<float>() + offset_ + Guarded::kGuard; }

  private:
    sx::cuda::DeviceBuffer buf_;
    size_t offset_ = 0;
};

}  // namespace test
}  // namespace optim
}  // namespace sx
