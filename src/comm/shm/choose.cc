// Which transport a CPU communicator takes (communicator.h, create_cpu_communicator):
// shared memory when every rank is on this host; shared memory within each host and Gloo
// between hosts when there are several hosts of several ranks each, as many on each;
// Gloo's TCP otherwise.
#include <algorithm>

#include "base/log.h"
#include "comm/communicator.h"
#include "comm/gloo/channels.h"
#include "comm/shm/hierarchical.h"
#include "comm/shm/segment.h"
#include "rdzv/stores.h"

namespace sx {
namespace comm {

Status exchange_host_identities(rdzv::Store &store, int rank, int world_size, const std::string &mine,
                                Clock::time_point deadline, std::vector<std::string> *hosts) {
    return rdzv::gather_values(store, "host/", rank, world_size, mine, deadline, hosts);
}

std::vector<std::string> rank_names_on_hosts(const std::vector<std::string> &hosts) {
    std::vector<std::string> names;
    for (size_t q = 0; q < hosts.size(); ++q)
        names.push_back(format("rank %zu (host '%s')", q, host_name_of(hosts[q]).c_str()));
    return names;
}

Status create_context_channel(std::shared_ptr<rdzv::Store> store, int rank, int world_size,
                              const CommunicatorSpec &spec, std::unique_ptr<Communicator> *out) {
    SX_CHECK_ARG(store != nullptr && out != nullptr && spec.channels && spec.gloo_channels,
                 "create_context_channel: store, out, and the context's shared memory and Gloo mesh must not be NULL");
    const Clock::time_point deadline =
        spec.deadline == Clock::time_point() ? Clock::now() + spec.timeout : spec.deadline;
    std::vector<std::string> hosts;
    SX_TRY(exchange_host_identities(*store, rank, world_size, host_identity(), deadline, &hosts));
    ShmOptions so;
    so.timeout = spec.timeout;
    so.deadline = deadline;
    so.channels = spec.channels;
    so.label = spec.label;
    const std::string &mine = hosts[static_cast<size_t>(rank)];
    if (std::all_of(hosts.begin(), hosts.end(), [&](const std::string &h) { return h == mine; }))
        return create_shm_communicator(std::move(store), rank, world_size, so, out);
    GlooOptions g;
    g.timeout = spec.timeout;
    g.deadline = deadline;
    g.label = spec.label;
    g.rank_names = rank_names_on_hosts(hosts);
    HostPlacement p;
    if (!place_hosts(hosts, &p) || !locate_rank(&p, rank))
        return create_gloo_channel(spec.gloo_channels, std::move(store), rank, world_size, g, out);
    std::unique_ptr<Communicator> local, peers, flat;
    so.timeout = host_part_timeout(spec.timeout);
    // Its errors count the host's ranks ("its rank 1" is the host's second).
    so.label = format("%s (its ranks on host '%s', counted from 0 there)", spec.label.c_str(),
                      p.names[static_cast<size_t>(p.host)].c_str());
    SX_TRY(create_shm_communicator(rdzv::make_prefix_store(store, "host" + std::to_string(p.host) + "/"), p.local,
                                   p.per_host, so, &local));
    GlooOptions po = g;
    po.rank_names = host_peer_names(p);
    SX_TRY(create_gloo_channel(spec.gloo_channels, rdzv::make_prefix_store(store, "peers" + std::to_string(p.local) + "/"),
                               p.host, p.hosts, po, &peers));
    SX_TRY(create_gloo_channel(spec.gloo_channels, rdzv::make_prefix_store(store, "flat/"), rank, world_size, g, &flat));
    *out = combine_hosts(p, rank, std::move(local), std::move(peers), std::move(flat), true);
    return Status::Ok();
}

Status create_cpu_communicator(std::shared_ptr<rdzv::Store> store, int rank, int world_size, const GlooOptions &options,
                               bool shared_memory, std::unique_ptr<Communicator> *out, CpuTransport *chosen,
                               const std::string &host) {
    SX_CHECK_ARG(store != nullptr && out != nullptr, "create_cpu_communicator: store and out must not be NULL");
    CpuTransport transport = CpuTransport::kGloo;
    HostPlacement placement;
    std::vector<std::string> hosts;  // per rank, its host's identity (where they said it)
    if (world_size > 1) {
        // Every rank says where it runs (or, empty, that it keeps off shared memory) and
        // learns where the others do: they all decide alike.
        const Clock::time_point deadline =
            options.deadline == Clock::time_point() ? Clock::now() + options.timeout : options.deadline;
        const std::string mine = !shared_memory ? std::string() : host.empty() ? host_identity() : "given:" + host;
        SX_TRY(exchange_host_identities(*store, rank, world_size, mine, deadline, &hosts));
        const auto off = std::find(hosts.begin(), hosts.end(), std::string());
        if (off != hosts.end()) {
            if (shared_memory)
                log(SX_LOG_WARN, "sx: rank %d: rank %d keeps off shared memory (SX_SHARED_MEMORY=0 or "
                    "SX_TRANSPORT_TCP), so every rank exchanges through TCP", rank, static_cast<int>(off - hosts.begin()));
            hosts.clear();
        } else if (std::all_of(hosts.begin(), hosts.end(), [&](const std::string &h) { return h == mine; })) {
            transport = CpuTransport::kSharedMemory;
        } else if (place_hosts(hosts, &placement)) {
            transport = CpuTransport::kHierarchical;
        }
    }
    if (chosen) *chosen = transport;
    if (transport == CpuTransport::kGloo) {
        GlooOptions named = options;  // where the ranks said their hosts, errors name them
        if (!hosts.empty() && named.rank_names.empty()) named.rank_names = rank_names_on_hosts(hosts);
        return create_gloo_communicator(std::move(store), rank, world_size, named, out);
    }
    if (transport == CpuTransport::kHierarchical) {
        bool hierarchical = false;
        SX_TRY(create_hierarchical_communicator(std::move(store), rank, placement, options, out, &hierarchical));
        if (!hierarchical && chosen) *chosen = CpuTransport::kGloo;
        return Status::Ok();
    }
    ShmOptions so;
    so.timeout = options.timeout;
    so.deadline = options.deadline;
    Status s = create_shm_communicator(store, rank, world_size, so, out);
    if (s.ok()) log(SX_LOG_DEBUG, "sx: rank %d of %d: its communicator exchanges through shared memory", rank, world_size);
    if (s.code() != SX_ERR_UNSUPPORTED) return s;
    // Every rank learns it alike (rank 0 could not make the segment): Gloo then.
    log(SX_LOG_WARN, "sx: rank %d: %s; the ranks exchange through TCP instead", rank, s.message().c_str());
    if (chosen) *chosen = CpuTransport::kGloo;
    return create_gloo_communicator(std::move(store), rank, world_size, options, out);
}

}  // namespace comm
}  // namespace sx
