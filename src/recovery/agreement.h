// How the survivors of a regroup agree on who forms the next epoch's group, through the
// rendezvous store (regroup.cc says which keys; docs/recovery.md what it means). Apart
// from sx_regroup so that its store traffic can be measured and held to a bound: each
// survivor reads each key once, so its requests and bytes grow as the number of
// survivors W, not W^2.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/deadline.h"
#include "base/status.h"
#include "core/lineage.h"
#include "rdzv/store.h"
#include "recovery/recovery.h"

namespace sx {
namespace recovery {

// What a survivor says of itself when it arrives. Its group's ranks are not in its entry:
// every survivor of one group would repeat the same W identities, and every survivor
// reads every entry (W^2 identities each). They are under "regroup/E/group/<hash>", SET
// once per group (a survivor that finds the key there already leaves it), and each
// survivor reads each group's once.
struct Arrival {
    uint64_t id = 0;
    int rank = 0, admit = 0;                   // in its group; what it asks to admit
    int epoch = 0, world = 0, shard_size = 0;  // its group's
    std::vector<uint64_t> members, lost;  // identities: its group's ranks (not in the entry), those known to have exited
    uint64_t group = 0;                   // the hash of its group's ranks' identities
};

// Arrives at epoch `epoch`'s regroup as `me` (`mine`: the copies it holds; `lost`: asked
// again while it waits, so that a survivor lost meanwhile completes the group at once)
// and waits until the group closes: *members (this survivor among them, or
// SX_ERR_INVALID_STATE if it came after the group closed) and their copies. The join
// window ends early where every rank is accounted for, and is drawn out (to the deadline)
// while a survivor not yet arrived still beats.
Status agree_members(rdzv::Store &store, int epoch, Arrival me, const RegroupSpec &spec,
                     const std::vector<core::CopyHolding> &mine, const std::function<std::vector<uint64_t>()> &lost,
                     Clock::time_point deadline, std::vector<Arrival> *members,
                     std::vector<std::vector<core::CopyHolding>> *holdings);

}  // namespace recovery
}  // namespace sx
