// make_cuda_ops, make_pinned_allocator and cuda_device_present in a build without CUDA.
#include "core/device.h"

namespace sx {
namespace core {

Status make_cuda_ops(int device, std::unique_ptr<DeviceOps> *out) {
    (void)device, (void)out;
    return SX_ERROR(SX_ERR_UNSUPPORTED,
                    "SX_BACKEND_CUDA is not available: this build of sx has no CUDA support (configure with "
                    "SX_WITH_CUDA=ON where the CUDA toolkit and NCCL are installed)");
}

Status make_pinned_allocator(int device, std::shared_ptr<HostAllocator> *out) {
    (void)device, (void)out;
    return SX_ERROR(SX_ERR_UNSUPPORTED, "pinned host memory needs CUDA, which this build of sx lacks");
}

bool cuda_device_present() { return false; }

}  // namespace core
}  // namespace sx
