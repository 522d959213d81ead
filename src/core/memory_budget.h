// A context's memory budget on one rank (sx_context.h): what its groups hold, charged as
// their DeviceOps allocate (device.h) and given back as each buffer goes.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "base/status.h"

namespace sx {
namespace core {

class MemoryBudget {
  public:
    // limit: the most bytes charged at once; 0 = none (the use is still counted).
    explicit MemoryBudget(uint64_t limit) : limit_(limit) {}
    uint64_t limit() const { return limit_; }
    uint64_t used() const { return used_.load(); }  // any thread

    // Whether `bytes` more fit: else SX_ERR_OUT_OF_MEMORY naming the budget, the request
    // (`what`, `bytes`) and what is held. Any thread.
    Status check(uint64_t bytes, const char *what) const;
    // The check and the charge, at once (two threads cannot both take the last bytes);
    // *held gives them back when its last copy goes. Any thread.
    Status charge(uint64_t bytes, const char *what, std::shared_ptr<void> *held);

  private:
    Status refuse(uint64_t bytes, uint64_t used, const char *what) const;
    const uint64_t limit_;
    std::shared_ptr<std::atomic<uint64_t>> used_ptr_ = std::make_shared<std::atomic<uint64_t>>(0);
    std::atomic<uint64_t> &used_ = *used_ptr_;
};

}  // namespace core
}  // namespace sx
