// The per-process arena (shared_arena.h): a memfd as large as the machine's memory, mapped
// once, with a first-fit list of free page ranges.
#include "base/shared_arena.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>

namespace sx {
namespace arena {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kGiB = size_t(1) << 30;

struct Arena {
    pid_t pid = 0;
    int fd = -1;
    char *base = nullptr;
    size_t size = 0;
    std::mutex mu;                      // guards free_ranges
    std::map<size_t, size_t> free_ranges;  // offset -> bytes, disjoint, never adjacent
};

std::mutex g_mu;            // guards g_arena and g_failed_pid
Arena *g_arena = nullptr;   // this process's (or, in a fork's child, the parent's until replaced)
pid_t g_failed_pid = 0;     // a process that could not make one does not try again

// The machine's memory, in whole GiB (at least 1): the arena's size.
size_t machine_bytes() {
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
    size_t bytes = pages > 0 && page > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page) : kGiB;
    return (bytes + kGiB - 1) / kGiB * kGiB;
}

Arena *make() {
    const int fd = ::memfd_create("sx-arena", MFD_CLOEXEC);
    if (fd < 0) return nullptr;
    const size_t size = machine_bytes();
    void *p = MAP_FAILED;
    if (::ftruncate(fd, static_cast<off_t>(size)) == 0)
        p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
        ::close(fd);
        return nullptr;
    }
    Arena *a = new Arena;
    a->pid = ::getpid();
    a->fd = fd;
    a->base = static_cast<char *>(p);
    a->size = size;
    a->free_ranges[0] = size;
    return a;
}

// This process's arena; made here where `create` (unless turned off or failed before).
// A fork's child finds its parent's, and makes its own. Arenas live as long as the process.
Arena *current(bool create) {
    const pid_t me = ::getpid();
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_arena && g_arena->pid == me) return g_arena;
    if (!create || g_failed_pid == me) return nullptr;
    const char *env = std::getenv("SX_SHARED_ARENA");
    if (env && std::strcmp(env, "0") == 0) return nullptr;
    Arena *a = make();
    if (!a) {
        g_failed_pid = me;
        return nullptr;
    }
    g_arena = a;  // a parent's, inherited by a fork, stays mapped for the parent's buffers
    return a;
}

// Faults in [p, p + bytes) for writing: MADV_POPULATE_WRITE where the kernel has it, else
// one write per page (the pages are zero, and stay so).
void populate(char *p, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
    if (::madvise(p, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
    for (size_t i = 0; i < bytes; i += kPage) reinterpret_cast<volatile char *>(p)[i] = 0;
}

}  // namespace

bool allocate(size_t bytes, size_t stagger, bool populate_now, Block *out) {
    Arena *a = current(true);
    if (!a || bytes > a->size) return false;
    const size_t need = (bytes + stagger + kPage - 1) / kPage * kPage;
    size_t offset = 0;
    {
        std::lock_guard<std::mutex> lock(a->mu);
        auto it = a->free_ranges.begin();
        while (it != a->free_ranges.end() && it->second < need) ++it;
        if (it == a->free_ranges.end()) return false;
        offset = it->first;
        const size_t left = it->second - need;
        a->free_ranges.erase(it);
        if (left > 0) a->free_ranges[offset + need] = left;
    }
    if (populate_now) populate(a->base + offset, need);
    out->data = a->base + offset + stagger;
    out->owner = a;
    out->offset = offset;
    out->reserved = need;
    return true;
}

void release(const Block &b) {
    Arena *a = static_cast<Arena *>(b.owner);
    if (!a || b.reserved == 0 || a->pid != ::getpid()) return;  // a fork's parent's: not ours to free
    // The pages' memory goes back now; the range reads as zeros when handed out again.
    if (::fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(b.offset),
                    static_cast<off_t>(b.reserved)) != 0) {
        // Without hole punching the range would keep its bytes: zero it instead.
        std::memset(a->base + b.offset, 0, b.reserved);
    }
    std::lock_guard<std::mutex> lock(a->mu);
    size_t offset = b.offset, size = b.reserved;
    auto next = a->free_ranges.lower_bound(offset);
    if (next != a->free_ranges.begin()) {
        auto prev = std::prev(next);
        if (prev->first + prev->second == offset) {
            offset = prev->first;
            size += prev->second;
            a->free_ranges.erase(prev);
        }
    }
    if (next != a->free_ranges.end() && offset + size == next->first) {
        size += next->second;
        a->free_ranges.erase(next);
    }
    a->free_ranges[offset] = size;
}

bool describe(int *fd, size_t *bytes, char **base) {
    Arena *a = current(true);
    if (!a) return false;
    *fd = a->fd;
    *bytes = a->size;
    if (base) *base = a->base;
    return true;
}

}  // namespace arena
}  // namespace sx
