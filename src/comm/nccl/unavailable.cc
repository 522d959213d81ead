// The NCCL communicator where sx was built without CUDA.
#include "comm/communicator.h"

namespace sx {
namespace comm {

Status create_nccl_communicator(std::shared_ptr<rdzv::Store>, int, int, const NcclOptions &, std::unique_ptr<Communicator> *) {
    return SX_ERROR(SX_ERR_UNSUPPORTED, "this libsx was built without CUDA and NCCL (SX_WITH_CUDA=OFF, or the CUDA "
                                        "toolkit or NCCL was not found at build time)");
}

Status create_one_device_communicator(int, std::unique_ptr<Communicator> *) {
    return SX_ERROR(SX_ERR_UNSUPPORTED, "this libsx was built without CUDA (SX_WITH_CUDA=OFF, or the CUDA toolkit "
                                        "was not found at build time)");
}

}  // namespace comm
}  // namespace sx
