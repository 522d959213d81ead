// The state side of a regroup (restore.cc), between the parts of the recovery module:
// a new group's table and counters taken from the group it came from, and its shards
// restored from the memory copies the survivors chose.
#pragma once

#include "base/status.h"
#include "core/lineage.h"

namespace sx {
namespace recovery {

// `to` (a new group) takes `from`'s param groups, params (units, dtypes), trainable flags
// and counters, and lays them out (collective: every member does it).
Status replay_table(core::RecoveryAccess &to, const core::RecoveryAccess &from);

// `g`'s (a new group's) state from the memory copies of the groups before it, as `choice`
// says (collective): for each shard index of the layout the copy was taken in, the member
// holding it sends every rank the pieces of it that rank owns now. A joining rank holds
// none. Then the params are gathered, as after a load.
Status restore_copies(core::RecoveryAccess &g, const core::CopyChoice &choice);

// As a regroup begins (the group aborted): the copies `g` took become kept ones, which
// every group made from it, and any later try of the regroup, restore from. A copy still
// being sent gets `grace` to arrive.
void keep_copies_for_regroup(core::RecoveryAccess &g, Millis grace);

// The memory copies `g` holds, its own and those of the groups before it.
std::vector<core::CopyHolding> held_copies(const core::RecoveryAccess &g);

}  // namespace recovery
}  // namespace sx
