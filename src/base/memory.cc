#include "base/memory.h"

#include <sys/mman.h>

#include <atomic>
#include <cstring>

namespace sx {
namespace {

constexpr size_t kPage = 4096;
std::atomic<uint32_t> g_stagger{0};
std::atomic<int64_t> g_fail_countdown{0};

bool injected_failure() {
    int64_t n = g_fail_countdown.load(std::memory_order_relaxed);
    while (n > 0) {
        if (g_fail_countdown.compare_exchange_weak(n, n - 1)) return n == 1;
    }
    return false;
}

}  // namespace

namespace testing {
void fail_allocation_after(int64_t n) { g_fail_countdown.store(n < 0 ? 0 : n); }
}  // namespace testing

HostBuffer &HostBuffer::operator=(HostBuffer &&o) noexcept {
    if (this != &o) {
        reset();
        block_ = o.block_;
        base_ = o.base_;
        data_ = o.data_;
        size_ = o.size_;
        mapped_ = o.mapped_;
        o.block_ = arena::Block();
        o.base_ = o.data_ = nullptr;
        o.size_ = o.mapped_ = 0;
    }
    return *this;
}

Status HostBuffer::allocate(size_t bytes, const char *what, Populate populate, Placement placement) {
    if (injected_failure())
        return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "allocating %zu bytes for %s failed (injected)", bytes,
                        what);
    // Offsets cycle through 61 distinct multiples of 64 bytes within a page (61 is
    // prime, so consecutive allocations land far apart).
    uint32_t n = g_stagger.fetch_add(1, std::memory_order_relaxed);
    size_t offset = static_cast<size_t>((n * 17u) % 61u + 1u) * 64u;
    if (bytes > SIZE_MAX - 2 * kPage)
        return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "allocating %zu bytes for %s: size too large", bytes,
                        what);
    arena::Block block;
    if (placement == kExchanged && arena::allocate(bytes, offset, populate == kPopulate, &block)) {
        reset();
        block_ = block;
        data_ = block.data;
        size_ = bytes;
        return Status::Ok();
    }
    size_t total = (bytes + offset + kPage - 1) / kPage * kPage;
    const int flags = MAP_PRIVATE | MAP_ANONYMOUS | (populate == kPopulate ? MAP_POPULATE : 0);
    void *p = mmap(nullptr, total, PROT_READ | PROT_WRITE, flags, -1, 0);
    if (p == MAP_FAILED)
        return SX_ERROR(SX_ERR_OUT_OF_MEMORY, "allocating %zu bytes for %s failed", bytes, what);
    reset();
    base_ = p;
    mapped_ = total;
    data_ = static_cast<char *>(p) + offset;
    size_ = bytes;
    return Status::Ok();
}

void HostBuffer::reset() {
    if (block_.owner) arena::release(block_);
    block_ = arena::Block();
    if (base_) munmap(base_, mapped_);
    base_ = data_ = nullptr;
    size_ = mapped_ = 0;
}

}  // namespace sx
