// Elements of an sx view as fp32, whatever the view's dtype.
#pragma once

#include <cstdint>

#include "base/half.h"
#include "sx/sx.h"

namespace sxtest {

// Element i of a view as fp32 (a 16-bit one widened), and writing one (rounded to the
// nearest 16-bit value).
inline float view_get(const sx_view_t &v, uint64_t i) {
    if (v.dtype == SX_DTYPE_F32) return static_cast<const float *>(v.data)[i];
    const uint16_t x = static_cast<const uint16_t *>(v.data)[i];
    return v.dtype == SX_DTYPE_F16 ? sx::half::f16_to_f32(x) : sx::half::bf16_to_f32(x);
}
inline void view_put(const sx_view_t &v, uint64_t i, float x) {
    if (v.dtype == SX_DTYPE_F32) {
        static_cast<float *>(v.data)[i] = x;
    } else {
        sx::half::from_f32(v.dtype, &x, static_cast<uint16_t *>(v.data) + i, 1);
    }
}

}  // namespace sxtest
