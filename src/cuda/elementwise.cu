// Element-wise kernels on the device (elementwise.h): the 16-bit conversions, with
// base/half.h's results (round to nearest even, overflow to inf, denormals kept), and the
// fp32 add that the reduce-scatters' accumulation needs.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <string>
#include <type_traits>

#include "cuda/elementwise.h"
#include "cuda/status.h"

namespace sx {
namespace cuda {
namespace {

// One element per thread up to kMaxBlocks blocks, grid-stride beyond.
constexpr int kThreads = 256;
constexpr size_t kMaxBlocks = 8192;

unsigned elementwise_blocks(size_t n) {
    const size_t b = (n + kThreads - 1) / kThreads;
    return static_cast<unsigned>(b < kMaxBlocks ? (b ? b : 1) : kMaxBlocks);
}

template <bool kBf16>
__device__ __forceinline__ float widen1(uint16_t h) {
    if (kBf16) return __uint_as_float(static_cast<unsigned>(h) << 16);
    return __half2float(__ushort_as_half(h));
}

template <bool kBf16>
__device__ __forceinline__ uint16_t narrow1(float x) {
    if (kBf16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
    return __half_as_ushort(__float2half_rn(x));
}

template <bool kBf16>
__global__ void widen_kernel(const uint16_t *__restrict__ in, float *__restrict__ out, size_t n, float scale,
                             bool accumulate) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const float x = __fmul_rn(widen1<kBf16>(in[i]), scale);
        out[i] = accumulate ? __fadd_rn(out[i], x) : x;
    }
}

__global__ void add_kernel(float *__restrict__ out, const float *__restrict__ in, size_t n) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        out[i] = __fadd_rn(out[i], in[i]);
}

template <bool kBf16>
__global__ void narrow_kernel(const float *__restrict__ in, uint16_t *__restrict__ out, size_t n) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        out[i] = narrow1<kBf16>(in[i]);
}

template <bool kBf16>
__global__ void scale_kernel(uint16_t *__restrict__ p, float s, size_t n) {
    for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
         i += static_cast<size_t>(gridDim.x) * blockDim.x)
        p[i] = narrow1<kBf16>(__fmul_rn(widen1<kBf16>(p[i]), s));
}

// Runs launch(kBf16) for n > 0 elements of a 16-bit `dtype`, kBf16 a std::bool_constant,
// and reports a failed launch of the kernel `what` names.
template <typename Launch>
Status launch16(int32_t dtype, const char *what, size_t n, Launch launch) {
    SX_CHECK_ARG(dtype == SX_DTYPE_F16 || dtype == SX_DTYPE_BF16, "%s: dtype %d is not SX_DTYPE_F16 or SX_DTYPE_BF16",
                 what, dtype);
    if (n == 0) return Status::Ok();
    if (dtype == SX_DTYPE_BF16) {
        launch(std::true_type());
    } else {
        launch(std::false_type());
    }
    SX_CUDA_TRY(cudaGetLastError(), (std::string("launching the kernel of ") + what).c_str());
    return Status::Ok();
}

}  // namespace

Status widen(int32_t dtype, const uint16_t *in, float *out, size_t n, float scale, bool accumulate, void *stream) {
    return launch16(dtype, "16-bit widening", n, [&](auto bf16) {
        widen_kernel<decltype(bf16)::value>
            <<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n, scale, accumulate);
    });
}

Status narrow(int32_t dtype, const float *in, uint16_t *out, size_t n, void *stream) {
    return launch16(dtype, "16-bit narrowing", n, [&](auto bf16) {
        narrow_kernel<decltype(bf16)::value>
            <<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(in, out, n);
    });
}

Status scale16(int32_t dtype, uint16_t *p, float factor, size_t n, void *stream) {
    return launch16(dtype, "16-bit scaling", n, [&](auto bf16) {
        scale_kernel<decltype(bf16)::value>
            <<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(p, factor, n);
    });
}

Status add(float *out, const float *in, size_t n, void *stream) {
    if (n == 0) return Status::Ok();
    add_kernel<<<elementwise_blocks(n), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(out, in, n);
    SX_CUDA_TRY(cudaGetLastError(), "launching the fp32 adding kernel");
    return Status::Ok();
}

}  // namespace cuda
}  // namespace sx
