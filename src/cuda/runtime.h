// The CUDA runtime as sx uses it: device discovery and device memory. Built only where
// SX_HAVE_CUDA is defined (a build without CUDA has no sx_cuda; comm/nccl/unavailable.cc
// and core/device_cuda_unavailable.cc stand in for what uses it); no CUDA type appears
// here. The module sits below optim and comm: both use it, neither through the other.
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"

namespace sx {
namespace cuda {

// True if the CUDA runtime finds at least one device. Otherwise *reason (if not null)
// gets the runtime's words, e.g. "CUDA driver version is insufficient for CUDA runtime
// version" where no driver is installed. Any thread.
bool device_available(std::string *reason);

// Number of CUDA devices the runtime finds (0 where there is none, or no driver).
int device_count();

// Device memory that frees itself. allocate() returns SX_ERR_OUT_OF_MEMORY or
// SX_ERR_UNSUPPORTED (no device) with the runtime's words; the copies are synchronous.
class DeviceBuffer {
  public:
    DeviceBuffer() = default;
    ~DeviceBuffer() { reset(); }
    DeviceBuffer(const DeviceBuffer &) = delete;
    DeviceBuffer &operator=(const DeviceBuffer &) = delete;

    Status allocate(size_t bytes, const char *what);
    void reset();
    Status upload(const void *host, size_t bytes, size_t offset = 0);
    Status download(void *host, size_t bytes, size_t offset = 0) const;
    Status fill_bytes(int value);  // every byte of the buffer

    void *data() const { return data_; }
    template <typename T>
    T *as() const { return static_cast<T *>(data_); }
    size_t size() const { return size_; }

  private:
    void *data_ = nullptr;
    size_t size_ = 0;
};

}  // namespace cuda
}  // namespace sx
