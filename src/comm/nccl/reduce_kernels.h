// What NCCL's reduce-scatter leaves to its caller, on the device: adding a reduced
// shard into an accumulator, and widening a 16-bit sum to fp32. Enqueued on `stream`
// (a cudaStream_t); errors name the launch. Built only with SX_HAVE_CUDA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace sx {
namespace comm {
namespace nccl {

// out[i] += in[i], i < n (fp32).
Status add_into(float *out, const float *in, size_t n, void *stream);

// out[i] = (accumulate ? out[i] : 0) + scale * float(in[i]), i < n; in holds dtype
// (SX_DTYPE_F16 or SX_DTYPE_BF16) values.
Status widen_into(float *out, const uint16_t *in, int32_t dtype, float scale, bool accumulate, size_t n,
                  void *stream);

}  // namespace nccl
}  // namespace comm
}  // namespace sx
