// make_cuda_ops and cuda_device_present in a build without CUDA.
#include "core/device.h"

namespace sx {
namespace core {

Status make_cuda_ops(int device, std::unique_ptr<DeviceOps> *out) {
    (void)device, (void)out;
    return SX_ERROR(SX_ERR_UNSUPPORTED,
                    "SX_BACKEND_CUDA is not available: this build of sx has no CUDA support (configure with "
                    "SX_WITH_CUDA=ON where the CUDA toolkit and NCCL are installed)");
}

bool cuda_device_present() { return false; }

}  // namespace core
}  // namespace sx
