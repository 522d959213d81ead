// The failure part (failure.h).
#include "core/failure.h"

namespace sx {
namespace core {

bool Failure::record(const Status &s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_.exchange(true)) return false;
    first_ = s;  // a Status copy never allocates
    return true;
}

Status Failure::check() const {
    if (aborted_.load())
        return SX_ERROR(SX_ERR_GROUP_FAILED, "the group was aborted with sx_abort() and can only be destroyed");
    if (failed_.load()) {
        std::lock_guard<std::mutex> lock(mu_);
        return SX_ERROR(SX_ERR_GROUP_FAILED,
                        "the group failed earlier and can only be destroyed; the first error was: %s",
                        first_.message().c_str());
    }
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
