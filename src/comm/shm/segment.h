// The shared memory of ranks on one host (shm_communicator.cc): one anonymous segment
// (memfd), made by the communicator's rank 0 and handed to the others as a file
// descriptor over a Unix socket in the abstract namespace. Neither has a name in any
// file system: the segment's memory goes when the last rank that maps it exits, however
// it exits (SIGKILL included), and the socket when rank 0 closes it or dies. Nothing is
// left in /dev/shm or anywhere else to clean up.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "rdzv/store.h"

namespace sx {
namespace comm {

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
    static Status open(rdzv::Store &store, int rank, int world_size, size_t bytes, std::chrono::steady_clock::time_point deadline,
                       std::unique_ptr<SharedSegment> *out, bool exchange_arenas = false);

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
    SharedSegment(char *data, size_t bytes) : data_(data), bytes_(bytes) {}
    void map_arenas(const std::vector<int> &fds);  // fds: borrowed, -1 where none
    char *data_;
    size_t bytes_;
    std::vector<Peer> peers_;
    std::vector<Peer> mappings_;  // the other processes' arenas, mapped here
    bool arenas_mapped_ = false;
};

// What identifies this host to its peers: the kernel's boot id and the host name (or
// SX_HOST_ID where set, so that tests can stand several hosts on one machine). Ranks with
// the same identity share memory.
std::string host_identity();

}  // namespace comm
}  // namespace sx
