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

// Every rank of `world_size` says where it runs (`mine`, a host identity) through `store`
// ("host/<rank>") and reads where the others do, by `deadline`: *hosts, per rank, the
// same on every rank, so that all decide alike.
Status exchange_host_identities(rdzv::Store &store, int rank, int world_size, const std::string &mine,
                                std::chrono::steady_clock::time_point deadline, std::vector<std::string> *hosts);

// The names errors give the ranks whose host identities are `hosts`: "rank 2 (host 'b')".
std::vector<std::string> rank_names_on_hosts(const std::vector<std::string> &hosts);

// The placement of the ranks whose host identities are `hosts` (one per rank, in rank
// order), where a hierarchy applies: at least 2 hosts, every one with the same number of
// ranks, at least 2. False otherwise (one host, a rank alone on a host, or hosts of
// different sizes).
bool place_hosts(const std::vector<std::string> &hosts, HostPlacement *out);

// Finds `rank` in the placement and sets its host and local index: false where it is on no
// host.
bool locate_rank(HostPlacement *placement, int rank);

// The communicator that combines through `local` (this host's ranks, by local index),
// `peers` (the ranks of this local index on every host, by host) and `flat` (every rank),
// as create_hierarchical_communicator's does; `placement` located at `rank`. channels: the
// three are a context's channels, so that a failure of one is told to every peer through
// all three (Communicator::fail_channel), not only to this host's ranks.
std::unique_ptr<Communicator> combine_hosts(const HostPlacement &placement, int rank,
                                            std::unique_ptr<Communicator> local, std::unique_ptr<Communicator> peers,
                                            std::unique_ptr<Communicator> flat, bool channels);

// The timeout of a host's shared-memory part, given the exchange between hosts' `timeout`:
// a little longer, so that where a host peer stalls, this host's rank that waits on it gives
// up first and tells its host's ranks why (which host peer it waited for), rather than
// they timing out at once on it.
Millis host_part_timeout(Millis timeout);

// The names errors give the host peers of local index placement.local: "rank 5 (host 'b')".
std::vector<std::string> host_peer_names(const HostPlacement &placement);

// A channel of a context whose ranks run on several hosts, sharing memory within each
// (spec.channels: this host's) and one Gloo mesh across them (spec.gloo_channels), over
// `world_size` of its ranks that meet through `store`: shared memory alone where they all
// run on this host; shared memory within each host and the Gloo mesh between host peers
// (combine_hosts) where they run on several hosts of the same number (two or more) each;
// else the Gloo mesh alone. Collective over those ranks; errors as create_communicator's.
Status create_context_channel(std::shared_ptr<rdzv::Store> store, int rank, int world_size,
                              const CommunicatorSpec &spec, std::unique_ptr<Communicator> *out);

// Collective over every rank of the placement: the communicator that combines through
// shared memory on each host and through Gloo between host peers (keys under "flat/",
// "host<h>/" and "peers<i>/" of `store`). Where a host cannot share memory, every rank
// learns it and the group's communicator is plain Gloo instead (*hierarchical false).
Status create_hierarchical_communicator(std::shared_ptr<rdzv::Store> store, int rank, const HostPlacement &placement,
                                        const GlooOptions &options, std::unique_ptr<Communicator> *out,
                                        bool *hierarchical);

}  // namespace comm
}  // namespace sx
