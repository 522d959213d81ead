// Ranks on several hosts with several ranks each (hierarchical.cc): shared memory within
// each host, Gloo between the hosts' peers.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace sx {
namespace comm {

// Where the ranks run: `hosts` hosts of `per_host` ranks each; rank_of[h * per_host + i]
// is the global rank of local index i on host h (hosts ordered by their lowest rank, a
// host's ranks in rank order). host and local: this rank's.
struct HostPlacement {
    int hosts = 0, per_host = 0;
    int host = 0, local = 0;
    std::vector<int> rank_of;
    std::vector<std::string> names;  // per host, readable (its host name, or SX_HOST_ID)
};

// A host identity (host_identity()) in words: the host name, or the SX_HOST_ID given.
std::string host_name_of(const std::string &identity);

// The placement of the ranks whose host identities are `hosts` (one per rank, in rank
// order), where a hierarchy applies: at least 2 hosts, every one with the same number of
// ranks, at least 2. False otherwise (one host, a rank alone on a host, or hosts of
// different sizes).
bool place_hosts(const std::vector<std::string> &hosts, HostPlacement *out);

// Collective over every rank of the placement: the communicator that combines through
// shared memory on each host and through Gloo between host peers (keys under "flat/",
// "host<h>/" and "peers<i>/" of `store`). Where a host cannot share memory, every rank
// learns it and the group's communicator is plain Gloo instead (*hierarchical false).
Status create_hierarchical_communicator(std::shared_ptr<rdzv::Store> store, int rank, const HostPlacement &placement,
                                        const GlooOptions &options, std::unique_ptr<Communicator> *out,
                                        bool *hierarchical);

}  // namespace comm
}  // namespace sx
