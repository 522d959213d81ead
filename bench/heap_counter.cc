// bench_sx's heap accounting (bench_util.h, HeapCounter): the global operator new and
// delete of this binary, replaced. The library's objects are linked into bench_sx
// (sx_internal), and shared libraries bind their operator new to the executable's, so
// every allocation through operator new in the process is counted: std containers and
// strings, FlatBuffers' builder, Gloo. Memory taken with malloc or mmap directly (host
// buffers) is not; the scale section, the only user, allocates none of that.
//
// Each block carries a 16-byte header before it (its size, and whether it counts), so
// that delete knows what to subtract and blocks keep new's 16-byte alignment. The
// aligned forms (std::align_val_t) are left as they are: they allocate and free on
// their own, uncounted.
#include <atomic>
#include <cstdlib>
#include <new>

#include "bench_util.h"

namespace {

constexpr size_t kHeader = 16;
std::atomic<int64_t> g_live{0};
std::atomic<int64_t> g_peak{0};
thread_local int t_uncounted = 0;

void *allocate(size_t n) {
    if (n == 0) n = 1;
    auto *block = static_cast<uint64_t *>(std::malloc(n + kHeader));
    if (block == nullptr) return nullptr;
    block[0] = n;
    block[1] = t_uncounted == 0;
    if (block[1]) {
        const int64_t bytes = static_cast<int64_t>(n);
        const int64_t now = g_live.fetch_add(bytes, std::memory_order_relaxed) + bytes;
        int64_t peak = g_peak.load(std::memory_order_relaxed);
        while (now > peak && !g_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
        }
    }
    return reinterpret_cast<char *>(block) + kHeader;
}

void *allocate_or_throw(size_t n) {
    void *p = allocate(n);
    if (p == nullptr) throw std::bad_alloc();
    return p;
}

void release(void *p) {
    if (p == nullptr) return;
    auto *block = reinterpret_cast<uint64_t *>(static_cast<char *>(p) - kHeader);
    if (block[1]) g_live.fetch_sub(static_cast<int64_t>(block[0]), std::memory_order_relaxed);
    std::free(block);
}

}  // namespace

void *operator new(size_t n) { return allocate_or_throw(n); }
void *operator new[](size_t n) { return allocate_or_throw(n); }
void *operator new(size_t n, const std::nothrow_t &) noexcept { return allocate(n); }
void *operator new[](size_t n, const std::nothrow_t &) noexcept { return allocate(n); }
void operator delete(void *p) noexcept { release(p); }
void operator delete[](void *p) noexcept { release(p); }
void operator delete(void *p, size_t) noexcept { release(p); }
void operator delete[](void *p, size_t) noexcept { release(p); }
void operator delete(void *p, const std::nothrow_t &) noexcept { release(p); }
void operator delete[](void *p, const std::nothrow_t &) noexcept { release(p); }

namespace sxbench {

int64_t HeapCounter::live() { return g_live.load(std::memory_order_relaxed); }

int64_t HeapCounter::peak() { return g_peak.load(std::memory_order_relaxed); }

void HeapCounter::reset_peak() { g_peak.store(g_live.load(std::memory_order_relaxed), std::memory_order_relaxed); }

HeapCounter::Uncounted::Uncounted() { ++t_uncounted; }

HeapCounter::Uncounted::~Uncounted() { --t_uncounted; }

}  // namespace sxbench
