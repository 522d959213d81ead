// The owned stream (stream.h).
#include "cuda/stream.h"

#include "cuda/device_scope.h"
#include "cuda/status.h"

namespace sx {
namespace cuda {

OwnedStream::~OwnedStream() {
    if (stream_) {
        const DeviceScope scope(device_);
        cudaStreamSynchronize(stream_);
        cudaStreamDestroy(stream_);
    }
}

Status OwnedStream::create(int device, const char *what) {
    SX_CHECK(stream_ == nullptr, SX_ERR_INTERNAL, "%s: the stream was already created", what);
    const DeviceScope scope(device);
    SX_TRY(scope.status());
    SX_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), what);
    device_ = device;
    return Status::Ok();
}

Status OwnedStream::synchronize(const char *what) const {
    SX_CUDA_TRY(cudaStreamSynchronize(stream_), what);
    return Status::Ok();
}

}  // namespace cuda
}  // namespace sx
