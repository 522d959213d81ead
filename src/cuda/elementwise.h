// Element-wise kernels on a CUDA device: the 16-bit conversions and the fp32 add that
// the reduce-scatters' accumulation and the CUDA groups' mixed precision need. Built
// only where SX_HAVE_CUDA is defined; no CUDA type appears here (streams are void*, a
// cudaStream_t; null is the legacy default stream).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace sx {
namespace cuda {

// The same results as base/half.h's (except a NaN's payload: a NaN narrows to the
// canonical NaN, where the host keeps its top bits): widen sets
// out[i] = (accumulate ? out[i] : 0) + scale * float(in[i]) (scale 1: the exact
// widening); narrow rounds each in[i] to dtype (nearest even); scale16 sets
// p[i] = dtype(float(p[i]) * factor); add sets out[i] += in[i] (fp32). dtype is
// SX_DTYPE_F16 or SX_DTYPE_BF16 (else SX_ERR_INVALID_ARGUMENT); pointers are device
// addresses. Enqueued on `stream` only; SX_ERR_INTERNAL naming a failed launch.
Status widen(int32_t dtype, const uint16_t *in, float *out, size_t n, float scale, bool accumulate, void *stream);
Status add(float *out, const float *in, size_t n, void *stream);
Status narrow(int32_t dtype, const float *in, uint16_t *out, size_t n, void *stream);
Status scale16(int32_t dtype, uint16_t *p, float factor, size_t n, void *stream);

}  // namespace cuda
}  // namespace sx
