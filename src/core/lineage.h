// What recovery (src/recovery/, one layer up: regroups, joining, the lobby, memory copies
// and their restore) reaches of a shard group, and nothing else: the RecoveryAccess
// interface below, which ShardGroup implements (core/group.h, on its parts' answers in
// core/group_parts.h, neither of which recovery includes: scripts/check_layers.py holds
// it to that), and the Lineage a group carries
// from the groups before it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/status.h"
#include "rdzv/store.h"
#include "core/group_config.h"
#include "core/memory_copies.h"
#include "core/param_table.h"
#include "core/shard_state.h"

namespace sx {
namespace core {

// Who a group is among the groups a regroup made of one another: what a regroup reads
// of the group it starts from and sets in the groups it makes.
struct Lineage {
    int epoch = 0;  // regroups since the group was created
    // The last epoch a regroup of this group (or of the one it came from) tried: each try
    // is a new epoch, whether it formed a group or failed (recovery/regroup.cc).
    int attempted_epoch = 0;
    // Per rank, the identity its process keeps across regroups (its rank when the group
    // was created; kJoinerIds + its place in the lobby for a process that joined).
    std::vector<uint64_t> member_ids;
    // The store through the key space of the group's first epoch ("g<N>/"): the lobby,
    // every regroup's agreement ("regroup/E/") and every epoch's key space ("eE/").
    std::shared_ptr<rdzv::Store> root_store;
    // A joining group (SX_GROUP_JOIN): until a regroup admits it, a group of its own rank
    // alone, on a rendezvous of its own; join_config is the group it joins.
    bool joining = false;
    GroupConfig join_config;
    // The copies of the groups before this one, kept until the group's own memory copies
    // hold one every rank holds (memory_copies.h, "Lineages").
    std::vector<std::shared_ptr<const KeptCopies>> kept;
};

// A shard group as recovery sees it: what checkpoints see (ShardAccess), and the few
// things a regroup needs besides. Every function is called by the group's owner thread,
// like the group's own operations; errors are statuses as the group's.
class RecoveryAccess : public ShardAccess {
  public:
    virtual const GroupConfig &config() const = 0;
    virtual Lineage &lineage() = 0;
    virtual const Lineage &lineage() const = 0;
    // The group's memory copies (memory_copies.h): null without them. Recovery gives a
    // group without them some (set_memory_copies, before its copy of a sound shard), and
    // takes them from the group it regroups (take_memory_copies: null where it had none),
    // keeping what they hold in the lineage.
    virtual const MemoryCopies *memory_copies() const = 0;
    virtual void set_memory_copies(std::unique_ptr<MemoryCopies> copies) = 0;
    virtual std::unique_ptr<MemoryCopies> take_memory_copies() = 0;
    // The param table (registration, trainable flags, per-param progress).
    virtual ParamTable &table() = 0;
    virtual const ParamTable &table() const = 0;
    // Collective: lays out what was added to the table (sx_finalize).
    virtual Status finalize() = 0;
    // The layout the table would have over `shard_size` shards (the current one's rules).
    virtual Status build_layout(int shard_size, Layout *out) const = 0;
    // Unit u's shard in the group's memory; its fp32 masters made valid first.
    virtual UnitShard unit_shard(size_t u) const = 0;
    virtual Status ensure_masters() = 0;
    // The ranks of the mesh whose process is known to have exited.
    virtual std::vector<int> exited_peers() const = 0;
    // Between steps: no reduction round open and no micro-batch accumulated.
    virtual bool between_steps() const = 0;
    // Waits for the background work on the shard (deferred gathers, prefetches).
    virtual Status settle() = 0;
    // Copies the live shard into the memory copies (sent to the peers where `send`).
    virtual Status keep_copy(bool send) = 0;
    // The step and loss-scaling counters, and a new group's taking them from another.
    virtual uint64_t steps_taken() const = 0;
    virtual const LossScalerState &loss_scaler() const = 0;
    virtual void continue_counters(uint64_t steps, const LossScaling &settings, const LossScalerState &state) = 0;
    // Any thread: collectives in flight fail, and later calls (sx_abort).
    virtual void abort() = 0;
    // A new group, of this one's kind, of config `c` on `store` (the ranks' arrival, the
    // mesh's communicators, the units' machinery), by `deadline`; its lineage is empty.
    virtual Status form(const GroupConfig &c, const std::string &trace_path, Clock::time_point deadline,
                        std::shared_ptr<rdzv::Store> store, std::unique_ptr<RecoveryAccess> *out) const = 0;
};

}  // namespace core
}  // namespace sx
