#include "core/memory_budget.h"

#include <string>

namespace sx {
namespace core {
namespace {

// "1.5 GiB (1610612736 bytes)", "12.6 KiB (12928 bytes)", "100 bytes".
std::string mib(uint64_t bytes) {
    const unsigned long long b = static_cast<unsigned long long>(bytes);
    if (bytes < 1024) return format("%llu bytes", b);
    const char *unit = bytes < (1ull << 20) ? "KiB" : bytes < (1ull << 30) ? "MiB" : "GiB";
    const double scale = bytes < (1ull << 20) ? 1024.0 : bytes < (1ull << 30) ? 1048576.0 : 1073741824.0;
    return format("%.1f %s (%llu bytes)", static_cast<double>(bytes) / scale, unit, b);
}

}  // namespace

Status MemoryBudget::refuse(uint64_t bytes, uint64_t used, const char *what) const {
    return SX_ERROR(SX_ERR_OUT_OF_MEMORY,
                    "the context's memory budget of %s on this rank has no room for %s: %s requested, %s held by its "
                    "groups already, %s left",
                    mib(limit_).c_str(), what, mib(bytes).c_str(), mib(used).c_str(),
                    mib(used < limit_ ? limit_ - used : 0).c_str());
}

Status MemoryBudget::check(uint64_t bytes, const char *what) const {
    const uint64_t used = used_.load();
    if (limit_ != 0 && (bytes > limit_ || used > limit_ - bytes)) return refuse(bytes, used, what);
    return Status::Ok();
}

Status MemoryBudget::charge(uint64_t bytes, const char *what, std::shared_ptr<void> *held) {
    uint64_t used = used_.load();
    do {
        if (limit_ != 0 && (bytes > limit_ || used > limit_ - bytes)) return refuse(bytes, used, what);
    } while (!used_.compare_exchange_weak(used, used + bytes));
    // The count outlives the budget's owner if a buffer does (it holds the count, not the budget).
    std::shared_ptr<std::atomic<uint64_t>> count = used_ptr_;
    *held = std::shared_ptr<void>(nullptr, [count, bytes](void *) { count->fetch_sub(bytes); });
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
