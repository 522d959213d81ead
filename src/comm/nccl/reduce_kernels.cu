#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "comm/nccl/reduce_kernels.h"
#include "optim/cuda/elementwise.h"

namespace sx {
namespace comm {
namespace nccl {
namespace {

using optim::cuda::elementwise_blocks;
constexpr int kThreads = optim::cuda::kElementwiseThreads;

__global__ void add_kernel(float *__restrict__ out, const float *__restrict__ in, size_t n) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        out[i] = __fadd_rn(out[i], in[i]);
}

template <bool kBf16>
__global__ void widen_kernel(float *__restrict__ out, const uint16_t *__restrict__ in, float scale, bool accumulate,
                             size_t n) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        float x;
        if (kBf16) {
            x = __uint_as_float(static_cast<unsigned>(in[i]) << 16);
        } else {
            x = __half2float(__ushort_as_half(in[i]));
        }
        const float v = __fmul_rn(x, scale);
        out[i] = accumulate ? __fadd_rn(out[i], v) : v;
    }
}

Status launched(const char *what) {
    const cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess) return Status::Ok();
    return SX_ERROR(SX_ERR_INTERNAL, "%s: CUDA error %d (%s): %s", what, static_cast<int>(err), cudaGetErrorName(err),
                    cudaGetErrorString(err));
}

}  // namespace

Status add_into(float *out, const float *in, size_t n, void *stream) {
    if (n == 0) return Status::Ok();
    add_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, in, n);
    return launched("adding a reduced shard into the accumulator");
}

Status widen_into(float *out, const uint16_t *in, int32_t dtype, float scale, bool accumulate, size_t n,
                  void *stream) {
    if (n == 0) return Status::Ok();
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (dtype == SX_DTYPE_BF16) {
        widen_kernel<true><<<elementwise_blocks(n), kThreads, 0, s>>>(out, in, scale, accumulate, n);
    } else {
        widen_kernel<false><<<elementwise_blocks(n), kThreads, 0, s>>>(out, in, scale, accumulate, n);
    }
    return launched("widening a 16-bit reduced shard");
}

}  // namespace nccl
}  // namespace comm
}  // namespace sx
