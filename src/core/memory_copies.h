// Copies of the state in host memory, for regrouping after a lost rank without a
// checkpoint on disk (sx_group_config_t.memory_copy_interval; docs/recovery.md).
//
// At a step boundary each rank copies its shard of the state (the fp32 values or
// masters, each optimizer state slot, and the progress: step counts, hyperparameters,
// loss scale) into one of two slots of host memory; in a flat group a thread of its own
// then sends that copy to the next rank (r to (r + 1) % W) over a communicator of its
// own, and ends with a barrier. A mesh sends nothing: another replica holds each shard.
//
// Why two slots, and why the barrier. A failure mid-step can leave the survivors one
// boundary apart (one finished the step, another did not), and a copy's sending can be
// cut short, so a rank must keep the copy before its newest until every rank holds the
// newest: a rank overwrites the older slot only after the barrier of the newer copy's
// sending passed, which no rank passes before every rank received. Every survivor then
// holds its own copy of some common boundary, and sx_regroup takes the newest boundary
// of which every shard is still held (choose_copies).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "comm/communicator.h"
#include "core/device.h"
#include "core/shard_state.h"

namespace sx {
namespace core {

// One rank's shard of the state at one step boundary.
struct ShardCopy {
    bool valid = false;
    uint64_t seq = 0;     // which copy: the ranks number their copies alike, 1, 2, ...
    int shard = -1;       // the shard index whose values these are (the layout's)
    // Per unit: values then each state slot, shard_numel floats each.
    std::vector<std::vector<float>> units;
    std::vector<int> slots;  // per unit
    ShardProgress progress;  // own copies only
    uint64_t bytes() const;
};

// What one rank holds, as its peers read it (through the rendezvous store).
struct CopyHolding {
    bool own = true;
    uint64_t seq = 0;
    int shard = -1;
};
std::string describe_holdings(const std::vector<CopyHolding> &h);
Status parse_holdings(const std::string &text, std::vector<CopyHolding> *out);

// The copy the survivors restore from: seq, and per shard index of the previous layout
// which member (an index into the members' list) sends it and from which of its copies.
struct CopyChoice {
    bool found = false;
    uint64_t seq = 0;
    std::vector<int> provider;       // per shard index: the member
    std::vector<bool> provider_own;  // per shard index: its own copy (else its peer's)
    std::string why_not;             // when !found: which shard no survivor holds
};
// holdings[m]: member m's. Deterministic: every survivor chooses the same.
CopyChoice choose_copies(const std::vector<std::vector<CopyHolding>> &holdings, int shards);

// A copy's state slots per unit and progress as bytes, for the ranks that hold no copy
// of their own (a rank joining the group), and back (SX_ERR_CORRUPT if truncated).
std::string pack_progress(const std::vector<int> &slots, const ShardProgress &p);
Status unpack_progress(const std::string &bytes, std::vector<int> *slots, ShardProgress *p);

class MemoryCopies {
  public:
    struct Settings {
        int interval = 0;  // steps between copies
        int rank = 0, world_size = 1;
        int shard = 0;      // this rank's shard index
        bool peers = false; // send each copy to the next rank (flat groups)
    };
    // comm: the copies' own communicator (null without peers). ops: where the shard lives.
    MemoryCopies(const Settings &s, DeviceOps &ops, std::unique_ptr<comm::Communicator> comm);
    ~MemoryCopies();

    const Settings &settings() const { return s_; }
    // Whether a copy is due after `steps` steps (or the state was replaced since the last).
    bool due(uint64_t steps) const { return dirty_ || steps % static_cast<uint64_t>(s_.interval) == 0; }
    bool dirty() const { return dirty_; }
    void mark_dirty() { dirty_ = true; }

    // The trainer's thread, at a step boundary: waits for the previous copy's sending,
    // then copies `units` (the live shard, read under `hold`, released once copied) and
    // `progress` in the background and sends the copy on. A failure of the sending is
    // logged and stops later sendings (the copies kept stay usable); it fails nothing else.
    void take(std::vector<UnitShard> units, ShardProgress progress, std::unique_ptr<ShardFence::Hold> hold,
              bool send = true);
    // Waits until the copy last taken is copied and sent: SX_ERR_COMM where its sending
    // failed (or one before it did).
    Status wait_sent();
    // Drops every copy (the layout changed); the next step keeps a new one. Waits for
    // the copy in flight first.
    void reset();
    // Any thread: the sending in flight fails soon, and no later one starts.
    void abort();
    // Waits until no copy is being taken or sent; where one still is after `grace`, its
    // sending is aborted first.
    void finish(Millis grace);
    // The copies held (after finish).
    std::vector<CopyHolding> holdings() const;
    const ShardCopy *find(uint64_t seq, bool own) const;
    uint64_t bytes() const;

  private:
    struct Job {
        int slot = 0;
        std::vector<UnitShard> units;
        ShardProgress progress;
        std::unique_ptr<ShardFence::Hold> hold;
        bool send = true;
    };
    void run();
    Status copy_out(Job &job);
    Status send(int slot);

    Settings s_;
    DeviceOps &ops_;
    std::unique_ptr<comm::Communicator> comm_;
    bool dirty_ = true;
    uint64_t next_seq_ = 1;
    int newest_ = -1;  // the slot of the newest copy every rank holds (after its barrier)
    ShardCopy own_[2], peer_[2];

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::unique_ptr<Job> job_;  // the job queued or running
    bool busy_ = false, stop_ = false, broken_ = false;
    std::atomic<uint64_t> bytes_{0};  // what the slots hold (the worker resizes them)
    std::thread thread_;
};

}  // namespace core
}  // namespace sx
