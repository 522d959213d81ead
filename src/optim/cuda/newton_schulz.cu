// Muon's Newton-Schulz iterations on a CUDA device (cuda_kernels.h), as torch.optim.Muon
// runs them there: X = bf16(u) (transposed to m x n, m <= n), X /= max(||X||, eps), then
// ns_steps times G = X X^T, U = b G + c G G, X = a X + U X, every product a bf16 matrix
// product through cuBLAS (cublasGemmEx: bf16 operands, fp32 sums, the addmm epilogue in
// fp32, the result rounded to bf16 once, as torch's addmm of bf16 CUDA tensors).
//
// The matrices live column-major as cuBLAS wants them: Y = X^T (n x m, leading dimension
// n) is what the buffers hold, and the iteration becomes G = Y^T Y, U = b G + c G G,
// Y = a Y + Y U^T, with no assumption that G or U is symmetric to the bit.
//
// cuBLAS is opened at run time (libcublas.so.13, or SX_CUBLAS_LIBRARY), so libsx needs it
// only where Muon runs on a device.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <string>

#include "cuda/device_scope.h"
#include "cuda/status.h"
#include "optim/cuda/stream_memory.h"
#include "optim/cuda_kernels.h"

namespace sx {
namespace optim {
namespace cuda {
namespace {

// The cuBLAS functions sx calls.
struct Cublas {
    decltype(&cublasCreate_v2) create = nullptr;
    decltype(&cublasDestroy_v2) destroy = nullptr;
    decltype(&cublasSetStream_v2) set_stream = nullptr;
    // cublasGemmEx (C++ overloads it: the one with a cublasComputeType_t).
    cublasStatus_t (*gemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                           const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                           cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

Status open_cublas(Cublas *api) {
    const char *env = std::getenv("SX_CUBLAS_LIBRARY");
    // The cuBLAS of the CUDA 13 runtime sx is built with (or the one the user names).
    const std::string name = env && *env ? env : "libcublas.so.13";
    void *lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *why = dlerror();
        return SX_ERROR(SX_ERR_UNSUPPORTED, "Muon on a CUDA device needs cuBLAS, which could not be opened (%s: %s); "
                        "install it, set SX_CUBLAS_LIBRARY to its path, or keep the state on the host "
                        "(SX_OFFLOAD_STATE)", name.c_str(), why ? why : "not found");
    }
    api->create = reinterpret_cast<decltype(api->create)>(dlsym(lib, "cublasCreate_v2"));
    api->destroy = reinterpret_cast<decltype(api->destroy)>(dlsym(lib, "cublasDestroy_v2"));
    api->set_stream = reinterpret_cast<decltype(api->set_stream)>(dlsym(lib, "cublasSetStream_v2"));
    api->gemm = reinterpret_cast<decltype(api->gemm)>(dlsym(lib, "cublasGemmEx"));
    if (!api->create || !api->destroy || !api->set_stream || !api->gemm) {
        dlclose(lib);
        return SX_ERROR(SX_ERR_UNSUPPORTED, "the cuBLAS library opened lacks cublasCreate_v2, cublasSetStream_v2 or "
                        "cublasGemmEx");
    }
    return Status::Ok();  // open for the life of the process
}

Status load_cublas(const Cublas **out) {
    static std::once_flag once;
    static Cublas api;
    static Status status;
    std::call_once(once, [] { status = open_cublas(&api); });
    if (!status.ok()) return status;
    *out = &api;
    return Status::Ok();
}

Status cublas_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
    return SX_ERROR(s == CUBLAS_STATUS_ALLOC_FAILED ? SX_ERR_OUT_OF_MEMORY : SX_ERR_INTERNAL, "%s: cuBLAS status %d",
                    what, static_cast<int>(s));
}

constexpr unsigned kThreads = 256;

__device__ __forceinline__ float bf(__nv_bfloat16 x) { return __bfloat162float(x); }

// Y (n x m, column-major) = X^T, X = bf16(u) or its transpose (tall).
__global__ void load_kernel(const float *u, int64_t rows, int64_t cols, bool tall, int64_t n, int64_t m,
                            __nv_bfloat16 *y) {
    const int64_t total = n * m;
    for (int64_t q = blockIdx.x * int64_t(kThreads) + threadIdx.x; q < total; q += int64_t(gridDim.x) * kThreads) {
        const int64_t i = q % n, j = q / n;  // Y[i, j] = X[j, i]
        y[q] = __float2bfloat16_rn(tall ? u[i * cols + j] : u[j * cols + i]);
    }
}

// One block: the sum of the squares of the bf16 values, in double, each thread's strided
// share in order, then a fixed tree.
__global__ void sumsq_kernel(const __nv_bfloat16 *y, int64_t total, double *out) {
    __shared__ double part[kThreads];
    double s = 0.0;
    for (int64_t q = threadIdx.x; q < total; q += kThreads) {
        const double v = bf(y[q]);
        s += v * v;
    }
    part[threadIdx.x] = s;
    __syncthreads();
    for (unsigned w = kThreads / 2; w > 0; w /= 2) {
        if (threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) *out = part[0];
}

__global__ void divide_kernel(__nv_bfloat16 *y, int64_t total, float norm) {
    for (int64_t q = blockIdx.x * int64_t(kThreads) + threadIdx.x; q < total; q += int64_t(gridDim.x) * kThreads)
        y[q] = __float2bfloat16_rn(__fdiv_rn(bf(y[q]), norm));
}

// out (rows x cols, row-major fp32) = O = X (or X^T, tall), X[j, i] = Y[i, j].
__global__ void store_kernel(const __nv_bfloat16 *y, int64_t rows, int64_t cols, bool tall, int64_t n, float *out) {
    const int64_t total = rows * cols;
    for (int64_t q = blockIdx.x * int64_t(kThreads) + threadIdx.x; q < total; q += int64_t(gridDim.x) * kThreads) {
        const int64_t r = q / cols, c = q % cols;
        out[q] = bf(tall ? y[r + c * n] : y[c + r * n]);
    }
}

unsigned grid_for(int64_t total) {
    const int64_t blocks = (total + kThreads - 1) / kThreads;
    return static_cast<unsigned>(blocks < 4096 ? (blocks > 0 ? blocks : 1) : 4096);
}

// C = alpha op(A) op(B) + beta C, bf16 matrices, fp32 compute (column-major).
Status gemm(const Cublas &api, cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n,
            int64_t k, float alpha, const __nv_bfloat16 *a, int64_t lda, const __nv_bfloat16 *b, int64_t ldb,
            float beta, __nv_bfloat16 *c, int64_t ldc) {
    return cublas_status(api.gemm(h, ta, tb, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &alpha, a,
                                  CUDA_R_16BF, static_cast<int>(lda), b, CUDA_R_16BF, static_cast<int>(ldb), &beta, c,
                                  CUDA_R_16BF, static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "a Newton-Schulz matrix product");
}

// The iterations over Y (n x m) with its scratch: G and U (m x m), Y2 (n x m).
Status iterate(const Cublas &api, cublasHandle_t h, cudaStream_t stream, const Hyper &hp, int64_t n, int64_t m,
               __nv_bfloat16 *y, __nv_bfloat16 *y2, __nv_bfloat16 *g, __nv_bfloat16 *u) {
    const float a = static_cast<float>(hp.ns_a), b = static_cast<float>(hp.ns_b), c = static_cast<float>(hp.ns_c);
    for (int step = 0; step < static_cast<int>(hp.ns_steps); ++step) {
        // G = Y^T Y (= X X^T)
        SX_TRY(gemm(api, h, CUBLAS_OP_T, CUBLAS_OP_N, m, m, n, 1.0f, y, n, y, n, 0.0f, g, m));
        // U = b G + c G G (addmm(G, G, G, beta=b, alpha=c))
        SX_CUDA_TRY(cudaMemcpyAsync(u, g, sizeof(__nv_bfloat16) * m * m, cudaMemcpyDeviceToDevice, stream),
                    "copying the Gram matrix");
        SX_TRY(gemm(api, h, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, c, g, m, g, m, b, u, m));
        // Y = a Y + Y U^T (X = addmm(X, U, X, beta=a), transposed)
        SX_CUDA_TRY(cudaMemcpyAsync(y2, y, sizeof(__nv_bfloat16) * n * m, cudaMemcpyDeviceToDevice, stream),
                    "copying the iterate");
        SX_TRY(gemm(api, h, CUBLAS_OP_N, CUBLAS_OP_T, n, m, m, 1.0f, y, n, u, m, a, y2, n));
        SX_CUDA_TRY(cudaMemcpyAsync(y, y2, sizeof(__nv_bfloat16) * n * m, cudaMemcpyDeviceToDevice, stream),
                    "copying the iterate");
    }
    return Status::Ok();
}

// One cuBLAS handle per device, used under a lock from setting its stream until that
// stream's products are done.
std::mutex g_handles_mu;
cublasHandle_t g_handles[64] = {};

}  // namespace

bool cublas_available(std::string *why) {
    const Cublas *api = nullptr;
    const Status s = load_cublas(&api);
    if (!s.ok() && why) *why = s.message();
    return s.ok();
}

Status newton_schulz_cuda(int device, void *stream_ptr, const float *u, int64_t rows, int64_t cols, const Hyper &hp,
                          float *out) {
    const Cublas *api = nullptr;
    SX_TRY(load_cublas(&api));
    SX_CHECK(device >= 0 && device < 64, SX_ERR_INTERNAL, "CUDA device %d past the handles sx keeps", device);
    const ::sx::cuda::DeviceScope scope(device);
    SX_TRY(scope.status());
    cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    const bool tall = rows > cols;
    const int64_t m = tall ? cols : rows, n = tall ? rows : cols;
    const char *what = "allocating Newton-Schulz's matrices";
    StreamMemory y(stream), y2(stream), g(stream), uu(stream), sq(stream);
    SX_TRY(y.allocate(sizeof(__nv_bfloat16) * n * m, what));
    SX_TRY(y2.allocate(sizeof(__nv_bfloat16) * n * m, what));
    SX_TRY(g.allocate(sizeof(__nv_bfloat16) * m * m, what));
    SX_TRY(uu.allocate(sizeof(__nv_bfloat16) * m * m, what));
    SX_TRY(sq.allocate(sizeof(double), what));
    load_kernel<<<grid_for(n * m), kThreads, 0, stream>>>(u, rows, cols, tall, n, m, y.as<__nv_bfloat16>());
    sumsq_kernel<<<1, kThreads, 0, stream>>>(y.as<__nv_bfloat16>(), n * m, sq.as<double>());
    SX_CUDA_TRY(cudaGetLastError(), "launching Newton-Schulz's first kernels");
    double sumsq = 0.0;
    SX_CUDA_TRY(cudaMemcpyAsync(&sumsq, sq.as<double>(), sizeof sumsq, cudaMemcpyDeviceToHost, stream),
                "reading the matrix's norm");
    SX_CUDA_TRY(cudaStreamSynchronize(stream), "Newton-Schulz's norm");
    // X.div_(X.norm().clamp(min=eps)): muon.cc's, on the host.
    const auto round_bf16 = [](float x) { return __bfloat162float(__float2bfloat16_rn(x)); };
    const float norm = std::max(round_bf16(static_cast<float>(std::sqrt(sumsq))), round_bf16(static_cast<float>(hp.eps)));
    divide_kernel<<<grid_for(n * m), kThreads, 0, stream>>>(y.as<__nv_bfloat16>(), n * m, norm);
    SX_CUDA_TRY(cudaGetLastError(), "launching Newton-Schulz's normalisation");
    // The handle (and its one workspace) serves one stream at a time: held until this
    // stream's products are done, so that another group's on the same device never run
    // beside them in the same workspace.
    std::lock_guard<std::mutex> lock(g_handles_mu);
    cublasHandle_t &h = g_handles[device];
    if (!h) SX_TRY(cublas_status(api->create(&h), "creating a cuBLAS handle"));
    SX_TRY(cublas_status(api->set_stream(h, stream), "setting cuBLAS's stream"));
    Status st = iterate(*api, h, stream, hp, n, m, y.as<__nv_bfloat16>(), y2.as<__nv_bfloat16>(),
                        g.as<__nv_bfloat16>(), uu.as<__nv_bfloat16>());
    if (st.ok()) {
        store_kernel<<<grid_for(rows * cols), kThreads, 0, stream>>>(y.as<__nv_bfloat16>(), rows, cols, tall, n, out);
        st = ::sx::cuda::cuda_status(cudaGetLastError(), "launching Newton-Schulz's last kernel", __FILE__, __LINE__);
    }
    // Waited for even after a failure: nothing of this call may still run on the handle.
    const cudaError_t done = cudaStreamSynchronize(stream);
    SX_TRY(st);
    SX_CUDA_TRY(done, "Newton-Schulz's iterations");
    return Status::Ok();
}

}  // namespace cuda
}  // namespace optim
}  // namespace sx
