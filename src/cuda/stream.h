// A CUDA stream owned by the object that holds it: created non-blocking on one device,
// and at destruction waited for and destroyed on that device. The CUDA group's device
// operations (core/device_cuda.cc) and the one-rank communicator (comm/nccl/one_device.cc)
// each run their work on one.
#pragma once

#include <cuda_runtime.h>

#include "base/status.h"

namespace sx {
namespace cuda {

class OwnedStream {
  public:
    OwnedStream() = default;
    // Waits for the stream's work, then destroys it, with its device made current for
    // the while (the calling thread's own device after); nothing if create() never
    // succeeded.
    ~OwnedStream();
    OwnedStream(const OwnedStream &) = delete;
    OwnedStream &operator=(const OwnedStream &) = delete;

    // Creates the stream (cudaStreamNonBlocking) on `device`, the calling thread's
    // current device left as it was. Once only. An error names `what`: the device
    // could not be selected, or the stream not created (cuda/status.h's codes).
    Status create(int device, const char *what);

    // Waits for the work enqueued so far; an error names `what`. The caller makes the
    // stream's device current.
    Status synchronize(const char *what) const;

    cudaStream_t get() const { return stream_; }

  private:
    int device_ = -1;
    cudaStream_t stream_ = nullptr;
};

}  // namespace cuda
}  // namespace sx
