// The shared memory of ranks on one host (shm_communicator.cc): one anonymous segment
// (memfd), made by the communicator's rank 0 and handed to the others as a file
// descriptor over a Unix socket in the abstract namespace. Neither has a name in any
// file system: the segment's memory goes when the last rank that maps it exits, however
// it exits (SIGKILL included), and the socket when rank 0 closes it or dies. Nothing is
// left in /dev/shm or anywhere else to clean up.
#pragma once

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "rdzv/store.h"

namespace sx {
namespace comm {

class SharedChannels;

class SharedSegment {
  public:
    ~SharedSegment();
    SharedSegment(const SharedSegment &) = delete;
    SharedSegment &operator=(const SharedSegment &) = delete;

    // Collective over the `world_size` ranks of a communicator, through `store` (keys
    // under its own space): rank 0 makes a segment of `bytes` (zero-filled) and gives it
    // to every other rank, which maps it. SX_ERR_TIMEOUT at `deadline`; SX_ERR_COMM where
    // the segment or the socket cannot be made or reached (another network namespace: the
    // ranks then do not share this host's abstract sockets).
    // exchange_arenas: every rank also offers its process's shared arena, and maps the
    // others' (peer()).
    // map_bytes (0 = bytes): how much of the segment every rank maps, from its start; the
    // rest is mapped by parts later (SharedChannels). fd (where given): the segment's
    // descriptor, kept open for that and owned by the caller.
    static Status open(rdzv::Store &store, int rank, int world_size, size_t bytes, std::chrono::steady_clock::time_point deadline,
                       std::unique_ptr<SharedSegment> *out, bool exchange_arenas = false, size_t map_bytes = 0,
                       int *fd = nullptr);

    char *data() const { return data_; }
    size_t size() const { return bytes_; }

    // What this rank knows of rank q: its process, and its arena (where this process maps
    // it: its own for this rank and the ranks of this process; null where q offered none).
    struct Peer {
        int32_t pid = 0;
        uint64_t arena_bytes = 0;
        const char *arena = nullptr;
    };
    const Peer &peer(int q) const { return peers_[static_cast<size_t>(q)]; }
    // Whether every other process's arena that was offered is mapped here (false: none is).
    bool arenas_mapped() const { return arenas_mapped_; }

  private:
    friend class SharedChannels;
    SharedSegment(char *data, size_t bytes) : data_(data), bytes_(bytes) {}
    void map_arenas(const std::vector<int> &fds);  // fds: borrowed, -1 where none
    char *data_;
    size_t bytes_;
    size_t map_bytes_ = 0;  // mapped at data_ (a context's segment maps only its first page)
    std::vector<Peer> peers_;
    std::vector<Peer> mappings_;  // the other processes' arenas, mapped here
    bool arenas_mapped_ = false;
    // A channel's segment (SharedChannels::open_channel): data_ lies kChannelHeader bytes
    // into the mapping; the channels keep the arenas' mappings, and the last rank to let
    // the channel go gives its pages back.
    std::shared_ptr<SharedChannels> channels_;
    uint64_t channel_offset_ = 0;
    int channel_ranks_ = 0;
};

// The shared memory of a context's ranks, all on this host (sx_context.h): one sparse
// segment made once, from which every channel of the context's groups takes a region of
// its own. Opening a channel then makes no connection: its rank 0 takes the region (an
// atomic bump of the segment's first word) and names it through the channel's store; every
// rank maps it from the descriptor it kept. The processes' arenas are mapped once, here,
// for every channel. A region's pages go back to the system when its last rank lets go;
// the address range is not reused (the segment is 64 TiB of address space, never memory).
class SharedChannels : public std::enable_shared_from_this<SharedChannels> {
  public:
    ~SharedChannels();
    SharedChannels(const SharedChannels &) = delete;
    SharedChannels &operator=(const SharedChannels &) = delete;

    // Collective over the context's ranks, as SharedSegment::open.
    static Status open(rdzv::Store &store, int rank, int world_size, std::chrono::steady_clock::time_point deadline,
                       std::shared_ptr<SharedChannels> *out);

    // Collective over a channel's `world_size` ranks (any of the context's), through
    // `store` (the channel's own key space): a segment of `bytes`, zero-filled, as
    // SharedSegment::open gives one, whose peers are known by their context ranks.
    Status open_channel(rdzv::Store &store, int rank, int world_size, size_t bytes,
                        std::chrono::steady_clock::time_point deadline, std::unique_ptr<SharedSegment> *out);

    int64_t channels_open() const;  // any thread

  private:
    friend class SharedSegment;
    SharedChannels() = default;
    // A rank lets the channel go: `mapped` bytes of it are mapped at base (its whole
    // `region` at offset, or the header page alone where mapping the region failed). The
    // last of its world_size ranks punches the region out of the segment.
    void close_channel(char *base, uint64_t offset, size_t region, size_t mapped, int world_size);

    std::unique_ptr<SharedSegment> context_;  // its first page: the allocation word
    int fd_ = -1;
    int rank_ = 0;
    std::atomic<int64_t> open_{0};
};

// What identifies this host to its peers: the kernel's boot id and the host name (or
// SX_HOST_ID where set, so that tests can stand several hosts on one machine). Ranks with
// the same identity share memory.
std::string host_identity();

}  // namespace comm
}  // namespace sx
