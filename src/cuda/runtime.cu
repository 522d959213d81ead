// Device discovery, device buffers (runtime.h) and the CUDA error mapping (status.h).
#include "cuda/runtime.h"
#include "cuda/status.h"

namespace sx {
namespace cuda {

Status cuda_status(cudaError_t err, const char *what, const char *file, int line) {
    if (err == cudaSuccess) return Status::Ok();
    sx_status_t code = SX_ERR_INTERNAL;
    if (err == cudaErrorMemoryAllocation)
        code = SX_ERR_OUT_OF_MEMORY;
    else if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
             err == cudaErrorInvalidDevice || err == cudaErrorDevicesUnavailable)
        code = SX_ERR_UNSUPPORTED;
    return Status(code, format("%s: CUDA error %d (%s): %s", what, static_cast<int>(err), cudaGetErrorName(err),
                               cudaGetErrorString(err)),
                  file, line);
}

bool device_available(std::string *reason) {
    int count = 0;
    const cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count > 0) return true;
    if (reason) *reason = err != cudaSuccess ? cudaGetErrorString(err) : "the CUDA runtime found no device";
    // A failed query leaves a sticky "last error" in the runtime; clear it so it does
    // not surface as the error of an unrelated later call.
    cudaGetLastError();
    return false;
}

int device_count() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky error, as above
        return 0;
    }
    return count;
}

Status DeviceBuffer::allocate(size_t bytes, const char *what) {
    void *p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes);
    if (e != cudaSuccess) {
        cudaGetLastError();  // not sticky: clear it, so that it is not a later call's error
        size_t free_bytes = 0, total = 0;
        int device = -1;
        cudaMemGetInfo(&free_bytes, &total);
        cudaGetDevice(&device);
        const std::string context = format("allocating %zu bytes of device memory for %s on CUDA device %d (%zu of "
                                           "%zu bytes free)",
                                           bytes, what, device, free_bytes, total);
        return cuda_status(e, context.c_str(), __FILE__, __LINE__);
    }
    reset();
    data_ = p;
    size_ = bytes;
    return Status::Ok();
}

void DeviceBuffer::reset() {
    if (data_) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
}

Status DeviceBuffer::upload(const void *host, size_t bytes, size_t offset) {
    SX_CHECK_ARG(offset <= size_ && bytes <= size_ - offset, "upload of %zu bytes at %zu into a %zu-byte buffer",
                 bytes, offset, size_);
    SX_CUDA_TRY(cudaMemcpy(static_cast<char *>(data_) + offset, host, bytes, cudaMemcpyHostToDevice),
                "copying to the device");
    return Status::Ok();
}

Status DeviceBuffer::download(void *host, size_t bytes, size_t offset) const {
    SX_CHECK_ARG(offset <= size_ && bytes <= size_ - offset,
                 "download of %zu bytes at %zu from a %zu-byte buffer", bytes, offset, size_);
    SX_CUDA_TRY(cudaMemcpy(host, static_cast<const char *>(data_) + offset, bytes, cudaMemcpyDeviceToHost),
                "copying from the device");
    return Status::Ok();
}

Status DeviceBuffer::fill_bytes(int value) {
    SX_CUDA_TRY(cudaMemset(data_, value, size_), "filling a device buffer");
    return Status::Ok();
}

}  // namespace cuda
}  // namespace sx
