// The rendezvous key-value store: how ranks find each other, exchange bootstrap ids
// (Gloo, NCCL) and agree outside the training communicator (checkpoint commits).
// Implementations: in-process (local://), a directory (file://), and a TCP server on
// libuv run by rank 0 (tcp://, env://).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/status.h"

namespace sx {
namespace rdzv {

class Store {
  public:
    virtual ~Store() = default;

    // Sets key to value, replacing any earlier value, and wakes waiters.
    virtual Status set(const std::string &key, const std::string &value) = 0;
    // Waits until key exists (at most `timeout`) and returns its value.
    // SX_ERR_TIMEOUT naming the key if it does not appear in time.
    virtual Status get(const std::string &key, std::string *value, Millis timeout) = 0;
    // Waits until every key exists (at most `timeout`); SX_ERR_TIMEOUT names a missing one.
    virtual Status wait(const std::vector<std::string> &keys, Millis timeout) = 0;
    // Atomically adds delta to the integer stored at key (absent = 0) and returns the
    // new value in *result (may be null).
    virtual Status add(const std::string &key, int64_t delta, int64_t *result) = 0;
    // *present = whether every key exists now (no waiting).
    virtual Status check(const std::vector<std::string> &keys, bool *present) = 0;
    // Removes key if present.
    virtual Status erase(const std::string &key) = 0;
    // Removes every key that begins with `prefix`. A store that cannot answers
    // SX_ERR_UNSUPPORTED (the default).
    virtual Status erase_prefix(const std::string &prefix);
    // Whether the ranks that the waits on this store are for are still there, for waits
    // outside the store (a socket a peer should connect to): a watched store asks its
    // watch (make_watched_store); the others know nothing, and say so (Ok).
    virtual Status alive() { return Status::Ok(); }
};

// Returns once all `world_size` ranks of a group have called it on the group's store
// (each adds itself to a counter; the last to arrive says so), or at `deadline` with
// SX_ERR_TIMEOUT saying how many had arrived with this rank. Costs each rank two
// requests and a wait. World size 1 returns at once.
Status await_ranks(Store &store, int rank, int world_size, std::chrono::steady_clock::time_point deadline);

// Every one of `world_size` ranks says `mine` (key `prefix` + its rank) and learns what each
// rank said, by `deadline`: *all, per rank, the same on every rank that returns Ok. Rank 0
// reads every rank's key and publishes them as one table (`prefix` + "all": each distinct
// value once, then a 4-byte index per rank), which every other rank reads: one set and one
// get per rank (world_size gets on rank 0), 4 bytes per rank plus the distinct values
// received by each, not world_size requests per rank. SX_ERR_CORRUPT where the table is
// not one.
Status gather_values(Store &store, const std::string &prefix, int rank, int world_size, const std::string &mine,
                     std::chrono::steady_clock::time_point deadline, std::vector<std::string> *all);

// A view of `inner` whose keys all begin with `prefix` (groups and purposes sharing
// one store keep apart this way).
std::shared_ptr<Store> make_prefix_store(std::shared_ptr<Store> inner, const std::string &prefix);

// What a watched store asks while it waits: whether the ranks it waits for are still
// there. Until disarmed; from then on the store's waits are `inner`'s own again, and
// `alive` is never called after disarm() returns (so it may refer to what dies next).
class StoreWatch {
  public:
    explicit StoreWatch(std::function<Status()> alive);
    // Ok, or why not to wait any longer; *armed says whether it asked.
    Status check(bool *armed);
    void disarm();

  private:
    std::mutex mu_;
    std::function<Status()> alive_;  // empty once disarmed
};

// A view of `inner` whose waits (get, wait), while `watch` is armed, poll and ask it
// between polls (every 2 ms growing to 50 ms), failing with its error as soon as it has
// one: a group forming among ranks of which one may be lost before it connects fails at
// once, not at the timeout. Any thread, as `inner`.
std::shared_ptr<Store> make_watched_store(std::shared_ptr<Store> inner, std::shared_ptr<StoreWatch> watch);

}  // namespace rdzv
}  // namespace sx
