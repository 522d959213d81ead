// Makes a CUDA device current for a scope and gives the calling thread its own back after:
// sx runs on the trainer's threads and must not leave them on another device.
#pragma once

#include <cuda_runtime.h>

#include "cuda/status.h"

namespace sx {
namespace cuda {

class DeviceScope {
  public:
    explicit DeviceScope(int device) {
        if (cudaGetDevice(&previous_) != cudaSuccess) {
            cudaGetLastError();
            previous_ = -1;
        }
        const cudaError_t e = previous_ == device ? cudaSuccess : cudaSetDevice(device);
        status_ = cuda_status(e, "selecting the group's CUDA device", __FILE__, __LINE__);
    }
    ~DeviceScope() {
        int now = -1;
        if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) cudaSetDevice(previous_);
    }
    DeviceScope(const DeviceScope &) = delete;
    DeviceScope &operator=(const DeviceScope &) = delete;

    const Status &status() const { return status_; }

  private:
    int previous_ = -1;
    Status status_;
};

}  // namespace cuda
}  // namespace sx
