// Recovery: what a shard group does after a lost rank, or to take in new processes
// (sx_regroup, sx_poll_joiners, sx_get_lost_ranks in sx.h; docs/recovery.md). The ranks
// still alive agree on the group of the next epoch and build it beside the broken one
// (regroup.cc); a joining process waits in the lobby until the members admit it;
// the new group's state comes from the memory copies the survivors hold (restore.cc) or
// from a checkpoint the caller loads.
//
// Recovery reaches the group only through RecoveryAccess (core/lineage.h), never
// ShardGroup itself (src/layers.txt's seam; scripts/check_layers.py holds it to that).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/deadline.h"
#include "base/status.h"
#include "core/lineage.h"

namespace sx {
namespace recovery {

using core::RecoveryAccess;

// sx_regroup's choices (sx.h), and what it decided.
struct RegroupSpec {
    Millis join_window{1000};  // how long the survivors wait for each other
    // The new group closes once this many arrived (0: once every rank of the survivors'
    // groups has arrived or is known to have exited).
    int expected_world_size = 0;
    int admit = 0;  // joining processes the members admit (sx_poll_joiners counted them)
    bool have_checkpoint = false;  // the caller loads one where no memory copy holds the state
};
struct RegroupInfo {
    int epoch = 0;
    int rank = 0, world_size = 0, shard_size = 0;
    int previous_rank = 0, previous_world_size = 0;
    bool from_memory = false;  // the state came from the survivors' memory copies
    std::string why_not_memory;  // else why not (with memory copies kept)
};

// The recovery of one group: borrows it for the call (the group's owner thread, as for
// the group's own operations). Holds no state of its own: what a regroup carries from
// one group to the next is the group's Lineage.
class Recovery {
  public:
    explicit Recovery(RecoveryAccess &group) : g_(group) {}

    // What regroup() refuses, before anything changes.
    Status check_regroup(const RegroupSpec &spec) const;
    // Collective over the ranks still alive: a group of them at the next epoch, on the
    // same rendezvous, with this group's params, param groups, trainable flags and
    // counters, and the state of the memory copies (info->from_memory) or zero state
    // (the caller restores it). The group is aborted first; it stays as it was otherwise.
    // A joining group enters the group that admits it instead.
    Status regroup(const RegroupSpec &spec, std::unique_ptr<RecoveryAccess> *out, RegroupInfo *info);
    // Collective (the members): how many processes wait to join (sx_poll_joiners).
    Status poll_joiners(int *waiting);

    // A joining group (SX_GROUP_JOIN): until sx_regroup admits it, a group of its own
    // rank alone, on a rendezvous of its own, where params are registered and laid out.
    bool joining() const { return g_.lineage().joining; }
    int epoch() const { return g_.lineage().epoch; }
    // The ranks of this group whose process is known to have exited (sx_get_lost_ranks).
    std::vector<int> lost_ranks() const;

    // Before sx_regroup breaks the group up: a sound group's members copy their shard,
    // from which the new group's state then comes.
    Status copy_if_sound();
    bool sound() const;  // a CPU group, not failed nor aborted, and between steps
    // Whether it keeps memory copies, or holds some of the groups before it.
    bool holds_copies() const;

  private:
    Status join(std::unique_ptr<RecoveryAccess> *out, RegroupInfo *info);
    Status settle_state(RecoveryAccess &g, const core::CopyChoice &choice, int epoch, RegroupInfo *info);
    Status claim_joiners(int epoch, int admit, bool claimer, Clock::time_point deadline, std::vector<uint64_t> *ids);
    std::vector<uint64_t> lost_ids() const;  // lost_ranks() as the identities regroups know them by

    RecoveryAccess &g_;
};

}  // namespace recovery
}  // namespace sx
