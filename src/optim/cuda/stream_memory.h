// Device memory from the stream-ordered pool (cudaMallocAsync), given back in stream order
// when it goes: scratch of one call of the optimizer passes' and Newton-Schulz's kernels.
#pragma once

#include <cuda_runtime.h>

#include "cuda/status.h"

namespace sx {
namespace optim {
namespace cuda {

class StreamMemory {
  public:
    explicit StreamMemory(cudaStream_t stream) : stream_(stream) {}
    ~StreamMemory() {
        if (p_) cudaFreeAsync(p_, stream_);
    }
    StreamMemory(const StreamMemory &) = delete;
    StreamMemory &operator=(const StreamMemory &) = delete;

    // `bytes` (none: nothing); an error names `what`.
    Status allocate(size_t bytes, const char *what) {
        if (bytes == 0) return Status::Ok();
        SX_CUDA_TRY(cudaMallocAsync(&p_, bytes, stream_), what);
        return Status::Ok();
    }
    template <typename T>
    T *as() const { return static_cast<T *>(p_); }

  private:
    cudaStream_t stream_;
    void *p_ = nullptr;
};

}  // namespace cuda
}  // namespace optim
}  // namespace sx
