// LAMB's and Adafactor's passes on a CUDA device (device_passes.h): the kernels behind
// the CUDA PassLauncher. A launch copies the segment table and the floats it reads to
// the device, runs one kernel over every run (or column item), and copies the sums back.
//
// Rounding as fused_update.cu: device_pass_body.h's bodies with explicitly rounded
// intrinsics (never contracted into a fused multiply-add; this module builds with
// --fmad=false, which covers the double sums too). Sums: each thread adds its elements
// of a run in order, the block adds the threads' in a fixed tree (warp shuffles, then
// the warps in order): the same bits every time on one device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/device_scope.h"
#include "cuda/status.h"
#include "optim/cuda/stream_memory.h"
#include "optim/cuda_kernels.h"
#include "optim/device_pass_body.h"
#include "sx/sx.h"

namespace sx {
namespace optim {
namespace cuda {
namespace {

constexpr unsigned kPassThreads = 256;
constexpr unsigned kMaxBlocks = 65535;

struct PassOps {
    __device__ __forceinline__ static float add(float a, float b) { return __fadd_rn(a, b); }
    __device__ __forceinline__ static float sub(float a, float b) { return __fsub_rn(a, b); }
    __device__ __forceinline__ static float mul(float a, float b) { return __fmul_rn(a, b); }
    __device__ __forceinline__ static float div(float a, float b) { return __fdiv_rn(a, b); }
    __device__ __forceinline__ static float sqrt(float a) { return __fsqrt_rn(a); }
    __device__ __forceinline__ static uint16_t to16(int32_t dtype, float x) {
        if (dtype == SX_DTYPE_BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(x));
        return __half_as_ushort(__float2half_rn(x));
    }
};

// The segment holding global run (or item) r: the last whose begin is <= r, among those
// with any (begin() of a segment with none equals the next one's).
template <typename Begin>
__device__ __forceinline__ unsigned find_segment(const PassSegment *segs, unsigned n, uint64_t r, Begin begin) {
    unsigned lo = 0, hi = n;  // the answer lies in [lo, hi)
    while (hi - lo > 1) {
        const unsigned mid = (lo + hi) / 2;
        if (begin(segs[mid]) <= r) lo = mid; else hi = mid;
    }
    return lo;
}

// Adds each thread's kRunSums doubles over the block in a fixed order; thread 0 gets them.
__device__ __forceinline__ void block_sums(double *acc) {
    __shared__ double warp_sums[kPassThreads / 32][kRunSums];
    for (int j = 0; j < kRunSums; ++j)
        for (int offset = 16; offset > 0; offset /= 2) acc[j] += __shfl_down_sync(0xffffffffu, acc[j], offset);
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0)
        for (int j = 0; j < kRunSums; ++j) warp_sums[warp][j] = acc[j];
    __syncthreads();
    if (threadIdx.x == 0)
        for (int j = 0; j < kRunSums; ++j) {
            acc[j] = 0.0;
            for (unsigned w = 0; w < kPassThreads / 32; ++w) acc[j] += warp_sums[w][j];
        }
    __syncthreads();  // warp_sums is written again by the block's next run
}

// Block b runs runs b, b + G, ...: its threads stride over a run's elements, and thread 0
// writes the run's sums to out[kRunSums * run].
template <PassKernel K>
__global__ void __launch_bounds__(kPassThreads) runs_kernel(const PassSegment *segs, unsigned n, uint64_t total_runs,
                                                            const float *aux, double *out) {
    for (uint64_t r = blockIdx.x; r < total_runs; r += gridDim.x) {
        const PassSegment &s = segs[find_segment(segs, n, r, [](const PassSegment &t) { return t.run_begin; })];
        uint64_t lo, hi;
        pass_run(s, r - s.run_begin, &lo, &hi);
        double acc[kRunSums] = {0.0, 0.0, 0.0};
        for (uint64_t i = lo + threadIdx.x; i < hi; i += kPassThreads)
            pass_body::element_at<PassOps>(K, s, aux, i, acc);
        if (!gives_sums(K)) continue;  // uniform over the block: none of it reaches block_sums
        block_sums(acc);
        if (threadIdx.x == 0)
            for (int j = 0; j < kRunSums; ++j) out[r * kRunSums + j] = acc[j];
    }
}

// One thread per column item: adjacent threads read adjacent columns of a row.
__global__ void __launch_bounds__(kPassThreads) columns_kernel(const PassSegment *segs, unsigned n,
                                                               uint64_t total_items, double *out) {
    const uint64_t stride = uint64_t(gridDim.x) * kPassThreads;
    for (uint64_t q = uint64_t(blockIdx.x) * kPassThreads + threadIdx.x; q < total_items; q += stride) {
        const PassSegment &s = segs[find_segment(segs, n, q, [](const PassSegment &t) { return t.column_begin; })];
        out[q] = pass_body::adafactor_column_item<PassOps>(s, q - s.column_begin);
    }
}

class CudaLauncher final : public PassLauncher {
  public:
    CudaLauncher(int device, void *stream) : device_(device), stream_(static_cast<cudaStream_t>(stream)) {}

    Status launch(PassKernel kernel, const std::vector<PassSegment> &segs, const std::vector<float> &aux,
                  std::vector<double> *out) override {
        const ::sx::cuda::DeviceScope scope(device_);
        SX_TRY(scope.status());
        uint64_t runs = 0, items = 0;
        for (const PassSegment &s : segs) runs += s.run_count, items += s.column_count;
        const bool columns = kernel == PassKernel::kAdafactorColumns;
        const uint64_t count = columns ? items : runs;
        out->assign(!gives_sums(kernel) ? 0 : columns ? items : runs * kRunSums, 0.0);
        if (count == 0) return Status::Ok();
        StreamMemory table(stream_), floats(stream_), sums(stream_);
        SX_TRY(table.allocate(segs.size() * sizeof(PassSegment), "the passes' segment table"));
        SX_TRY(floats.allocate(aux.size() * sizeof(float), "the passes' moments"));
        SX_TRY(sums.allocate(out->size() * sizeof(double), "the passes' sums"));
        // From pageable host memory: each copy has read its source when the call returns.
        SX_CUDA_TRY(cudaMemcpyAsync(table.as<void>(), segs.data(), segs.size() * sizeof(PassSegment),
                                    cudaMemcpyHostToDevice, stream_),
                    "copying the passes' segment table to the device");
        if (!aux.empty())
            SX_CUDA_TRY(cudaMemcpyAsync(floats.as<void>(), aux.data(), aux.size() * sizeof(float),
                                        cudaMemcpyHostToDevice, stream_),
                        "copying Adafactor's moments to the device");
        const unsigned n = static_cast<unsigned>(segs.size());
        if (columns) {
            const uint64_t blocks = std::min<uint64_t>(kMaxBlocks, (items + kPassThreads - 1) / kPassThreads);
            columns_kernel<<<static_cast<unsigned>(blocks), kPassThreads, 0, stream_>>>(table.as<PassSegment>(), n,
                                                                                      items, sums.as<double>());
        } else {
            const unsigned blocks = static_cast<unsigned>(std::min<uint64_t>(kMaxBlocks, runs));
            const PassSegment *t = table.as<PassSegment>();
            const float *a = floats.as<float>();
            double *o = sums.as<double>();
            switch (kernel) {
#define SX_RUNS_KERNEL(k) \
    case PassKernel::k: runs_kernel<PassKernel::k><<<blocks, kPassThreads, 0, stream_>>>(t, n, runs, a, o); break;
                SX_RUNS_KERNEL(kLambFirst)
                SX_RUNS_KERNEL(kLambApply)
                SX_RUNS_KERNEL(kAdafactorSums)
                SX_RUNS_KERNEL(kAdafactorSecond)
                SX_RUNS_KERNEL(kAdafactorApply)
                SX_RUNS_KERNEL(kMuonMomentum)
                SX_RUNS_KERNEL(kMuonApply)
#undef SX_RUNS_KERNEL
                case PassKernel::kAdafactorColumns: break;
            }
        }
        SX_CUDA_TRY(cudaGetLastError(), "launching an optimizer pass");
        if (!out->empty())
            SX_CUDA_TRY(cudaMemcpyAsync(out->data(), sums.as<void>(), out->size() * sizeof(double),
                                        cudaMemcpyDeviceToHost, stream_),
                        "copying an optimizer pass's sums to the host");
        SX_CUDA_TRY(cudaStreamSynchronize(stream_), "running an optimizer pass");
        return Status::Ok();
    }

  private:
    const int device_;
    const cudaStream_t stream_;
};

}  // namespace

std::unique_ptr<PassLauncher> make_cuda_pass_launcher(int device, void *stream) {
    return std::unique_ptr<PassLauncher>(new CudaLauncher(device, stream));
}

}  // namespace cuda
}  // namespace optim
}  // namespace sx
