// Host memory for large buffers (flat params and grads, optimizer state, staging).
//
// Why staggered: large allocations come back page-aligned, so buffers that a kernel
// streams together sit exactly 2^k bytes apart and their elements map to the same
// cache sets and 4 KiB-alias in the load/store unit; that ran the optimizer 3-6x
// slower. Each allocation therefore starts at a different multiple of 64 bytes
// within its page.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/shared_arena.h"
#include "base/status.h"

namespace sx {

class HostBuffer {
  public:
    HostBuffer() = default;
    ~HostBuffer() { reset(); }
    HostBuffer(const HostBuffer &) = delete;
    HostBuffer &operator=(const HostBuffer &) = delete;
    HostBuffer(HostBuffer &&o) noexcept { *this = static_cast<HostBuffer &&>(o); }
    HostBuffer &operator=(HostBuffer &&o) noexcept;

    // kPopulate: every page is faulted in at once (the first pass over fresh memory
    // then runs at memory speed); kLazy: on first touch (for memory whose first writer
    // is the kernel, e.g. a read(2) into it, which faults it in while the device works).
    enum Populate { kPopulate, kLazy };
    // kPrivate: this process's alone; kExchanged: from this process's shared arena
    // (base/shared_arena.h) where it has room, so that ranks on this host can read it in
    // place, else private.
    enum Placement { kPrivate, kExchanged };
    // Allocates `bytes` (zero-filled), 64-byte aligned, staggered.
    // Returns SX_ERR_OUT_OF_MEMORY naming `what` on failure; *this is unchanged then.
    Status allocate(size_t bytes, const char *what, Populate populate = kPopulate, Placement placement = kPrivate);
    void reset();

    void *data() const { return data_; }
    template <typename T>
    T *as() const { return static_cast<T *>(data_); }
    size_t size() const { return size_; }
    bool empty() const { return data_ == nullptr; }
    bool exchanged() const { return block_.owner != nullptr; }

  private:
    arena::Block block_;  // where the arena holds it (owner null: mapped privately)
    void *base_ = nullptr;
    void *data_ = nullptr;
    size_t size_ = 0;
    size_t mapped_ = 0;
};

namespace testing {
// Test seam: the n-th HostBuffer::allocate from now fails (1 = the next one);
// 0 turns it off.
void fail_allocation_after(int64_t n);
}  // namespace testing

}  // namespace sx
