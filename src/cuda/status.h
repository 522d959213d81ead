// CUDA runtime errors as sx Statuses, for the CUDA code of cuda/, optim/cuda/,
// comm/nccl/ and core/device_cuda.cc.
#pragma once

#include <cuda_runtime.h>

#include "base/status.h"

namespace sx {
namespace cuda {

// SX_OK for cudaSuccess; otherwise a Status naming `what` and the runtime's words:
// SX_ERR_OUT_OF_MEMORY for an allocation failure, SX_ERR_UNSUPPORTED where there is
// no usable device or driver, SX_ERR_INTERNAL for anything else.
Status cuda_status(cudaError_t err, const char *what, const char *file, int line);

}  // namespace cuda
}  // namespace sx

// Returns from the enclosing function if the CUDA call `expr` failed.
#define SX_CUDA_TRY(expr, what)                                                                \
    do {                                                                                       \
        const cudaError_t sx_cuda_err_ = (expr);                                               \
        if (sx_cuda_err_ != cudaSuccess)                                                       \
            return ::sx::cuda::cuda_status(sx_cuda_err_, (what), __FILE__, __LINE__);          \
    } while (0)
