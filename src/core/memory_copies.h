// Copies of the state in host memory, for regrouping after a lost rank without a
// checkpoint on disk (sx_group_config_t.memory_copy_interval; docs/recovery.md).
//
// At a step boundary each rank copies its shard of the state (the fp32 values or
// masters, or the bf16 params of a unit without masters, each optimizer state slot, and
// the progress: step counts, hyperparameters, loss scale) into one of two slots of host
// memory; in a flat group a thread of its own then sends that copy to the next rank (r
// to (r + 1) % W) over a communicator of its own, and ends with a barrier. A mesh sends nothing: another replica holds each shard.
//
// Why two slots, and why the barrier. A failure mid-step can leave the survivors one
// boundary apart (one finished the step, another did not), and a copy's sending can be
// cut short, so a rank must keep the copy before its newest until every rank holds the
// newest: a rank overwrites the older slot only after the barrier of the newer copy's
// sending passed, which no rank passes before every rank received. Every survivor then
// holds its own copy of some common boundary, and sx_regroup takes the newest boundary
// of which every shard is still held (choose_copies). A peer's copy counts as held as soon
// as it has arrived whole, before the barrier: a rank that received it but saw the
// barrier fail (the sender died just after) still holds it.
//
// Lineages. A regroup's new group has a layout of its own, and its copies are numbered
// from 1 again: a copy is named by the epoch of the group that took it and its number.
// The copies of the groups before are kept (KeptCopies, shared and never changed) until
// the new group holds a copy every rank of it holds, so that a regroup that fails, or a
// loss before the new group's first copy is everywhere, still finds the last step every
// survivor can prove.
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
    // Per unit, bytes: the values (shard_numel floats; a bf16_stochastic_round unit's
    // bf16 params, shard_numel bf16s, which restore it exactly without fp32 masters), then
    // each state slot as the unit lays it out (UnitShard::slot_bytes: shard_numel floats, or packed pieces of
    // bf16 and 8-bit state), then each slot's 8-bit block scales (slot_scales floats).
    // CopiedUnit says where each begins.
    std::vector<std::vector<uint8_t>> units;
    std::vector<int> slots;  // per unit
    ShardProgress progress;  // own copies only
    uint64_t bytes() const;
};

// Where a copied unit's tensors begin in its bytes (ShardCopy::units), from the unit's
// shard as the layout describes it; value_size: the bytes of one value (4, or 2 for the
// bf16 params of a bf16_stochastic_round unit).
struct CopiedUnit {
    uint64_t values_bytes = 0, slot_bytes = 0, scale_bytes = 0;
    int slots = 0;
    CopiedUnit(uint64_t shard_numel, uint64_t value_size, int state_slots, uint64_t slot_bytes_, uint64_t slot_scales)
        : values_bytes(shard_numel * value_size), slot_bytes(slot_bytes_), scale_bytes(slot_scales * sizeof(float)),
          slots(state_slots) {}
    uint64_t slot_at(int k) const { return values_bytes + static_cast<uint64_t>(k) * slot_bytes; }
    uint64_t scales_at(int k) const { return slot_at(slots) + static_cast<uint64_t>(k) * scale_bytes; }
    uint64_t bytes() const { return scales_at(slots); }
};

// The copies a group held when a regroup broke it up, for the groups after it.
struct KeptCopies {
    int epoch = 0;   // the group's
    int shards = 0;  // its layout's shard count
    std::vector<ShardCopy> own, peer;  // valid copies only
    const ShardCopy *find(uint64_t seq, bool own_copy) const;
    uint64_t bytes() const;
};

// What one rank holds, as its peers read it (through the rendezvous store).
struct CopyHolding {
    bool own = true;
    int epoch = 0;    // of the group that took it
    uint64_t seq = 0;
    int shard = -1;   // of that group's layout
    int shards = 0;   // that layout's shard count
};
std::string describe_holdings(const std::vector<CopyHolding> &h);
Status parse_holdings(const std::string &text, std::vector<CopyHolding> *out);

// The copy the survivors restore from: the epoch of the group that took it, its number,
// that layout's shard count, per shard index which member (an index into the members'
// list) sends it and from which of its copies, and which member sends the progress
// (step counts: in own copies only).
struct CopyChoice {
    bool found = false;
    int epoch = 0;
    uint64_t seq = 0;
    int shards = 0;
    std::vector<int> provider;       // per shard index: the member
    std::vector<bool> provider_own;  // per shard index: its own copy (else its peer's)
    int progress_from = -1;          // a member holding an own copy
    std::string why_not;             // when !found: which shard no survivor holds
};
// holdings[m]: member m's. The newest copy (the latest epoch, then the highest number) of
// which every shard is held by some member. Deterministic: every survivor chooses the same.
CopyChoice choose_copies(const std::vector<std::vector<CopyHolding>> &holdings);

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
        int shards = 1;     // the layout's shard count
        int epoch = 0;      // the group's (regroups since it was created)
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
    // Whether the copies of the groups before this one may go: flat, the barrier of a
    // sending passed (every rank holds that copy, its own and its predecessor's); a mesh,
    // which sends nothing, once this rank took two (its replicas stepped with it between).
    bool settled() const;
    // The copies held, moved out for the groups after this one (after finish(); no copy
    // is taken later).
    std::shared_ptr<const KeptCopies> release();

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
    int completed_ = 0;  // copies taken (and sent, with peers) whole
    ShardCopy own_[2], peer_[2];

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::unique_ptr<Job> job_;  // the job queued or running
    bool busy_ = false, stop_ = false, broken_ = false;
    bool stop_taking_ = false;  // release()d
    std::atomic<uint64_t> bytes_{0};  // what the slots hold (the worker resizes them)
    std::thread thread_;
};

}  // namespace core
}  // namespace sx
