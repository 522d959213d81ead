// The mesh part (mesh.h).
#include "core/mesh.h"

#include <algorithm>
#include <set>

#include "base/log.h"
#include "comm/abort_at_deadline.h"
#include "comm/shm/segment.h"
#include "core/staged_comm.h"
#include "rdzv/stores.h"

namespace sx {
namespace core {

void Mesh::place(const Settings &settings, int rank, int world_size) {
    settings_ = settings;
    rank_ = rank;
    world_size_ = world_size;
}

Status Mesh::open(std::shared_ptr<rdzv::Store> store, int s, const CallHeaders &headers,
                  std::chrono::steady_clock::time_point deadline) {
    store_ = std::move(store);
    SX_TRY(connect(store_, rank_, world_size_, &world_, deadline));
    if (world_size_ > 1) {
        // Every rank must have asked for the same mesh (else each is told how they differ),
        // so that a bad size fails every rank alike below.
        const uint64_t h = static_cast<uint64_t>(s);
        uint64_t v[2] = {h, ~h};
        Status agreed;
        bool late = false;
        {
            // Within the creation's deadline, not a collective timeout after it.
            comm::AbortAtDeadline guard(world_.get(), deadline);
            agreed = world_->all_reduce_max(v, 2);
            late = guard.fired();
        }
        SX_CHECK(!late, SX_ERR_TIMEOUT,
                 "the ranks did not all agree on the mesh before the group's creation timed out (timeout_ms "
                 "%lld): a rank stopped after connecting",
                 static_cast<long long>(settings_.timeout_ms));
        SX_TRY(agreed);
        if (v[0] != h || v[1] != ~h)
            return headers.explain("ranks disagree on the mesh", {{"shard_size", std::to_string(s)}}, *world_);
    }
    SX_CHECK_ARG(s <= world_size_ && world_size_ % s == 0,
                 "shard_size %d does not divide the world size %d (the mesh is shard_size ranks per shard group "
                 "times world_size / shard_size replicas)",
                 s, world_size_);
    shard_size_ = s;
    shard_rank_ = rank_ % s;
    replicas_ = world_size_ / s;
    replica_rank_ = rank_ / s;
    if (shard_size_ == world_size_) {
        shard_ = world_.get();
    } else {
        // Shard group k and replica group i connect through key spaces of their own.
        SX_TRY(connect(rdzv::make_prefix_store(store_, format("shard/%d/", replica_rank_)), shard_rank_, shard_size_,
                       &shard_own_, deadline));
        shard_ = shard_own_.get();
    }
    if (replicas_ > 1)
        SX_TRY(connect(rdzv::make_prefix_store(store_, format("replica/%d/", shard_rank_)), replica_rank_, replicas_,
                       &replica_, deadline));
    return Status::Ok();
}

// Whether two of the `size` ranks meeting through `store` share a device: each says its
// host's and its device's identities, and reads the others'.
Status Mesh::share_a_device(rdzv::Store &store, int rank, int size, std::chrono::steady_clock::time_point deadline,
                            bool *shared) const {
    const Clock::time_point until =
        deadline == Clock::time_point() ? Clock::now() + Millis(settings_.timeout_ms) : deadline;
    std::vector<std::string> ids;
    SX_TRY(rdzv::gather_values(store, "device/", rank, size, comm::host_identity() + "|" + settings_.device->identity(),
                               until, &ids));
    *shared = std::set<std::string>(ids.begin(), ids.end()).size() < ids.size();
    return Status::Ok();
}

Status Mesh::connect(std::shared_ptr<rdzv::Store> store, int rank, int size, std::unique_ptr<comm::Communicator> *out,
                     std::chrono::steady_clock::time_point deadline) const {
    comm::CommunicatorSpec spec;
    spec.cuda = settings_.backend == SX_BACKEND_CUDA;
    spec.device = settings_.device_ordinal;
    spec.timeout = Millis(settings_.timeout_ms);
    spec.deadline = deadline;
    spec.bind_address = settings_.bind_address;
    spec.shared_memory = settings_.shared_memory;
    spec.channels = settings_.channels;
    spec.gloo_channels = settings_.gloo_channels;
    spec.label = settings_.label;
    // One rank of a real device: the device's own communicator, which moves no data.
    if (!spec.cuda || !settings_.device || (size == 1 && !settings_.simulated_device))
        return comm::create_communicator(std::move(store), rank, size, spec, out);
    // Ranks that share a device exchange through the host; a simulated device's ranks share
    // it unless it stands in for NCCL between devices.
    bool shared = settings_.simulated_device && !settings_.simulated_nccl;
    if (!settings_.simulated_device && size > 1) SX_TRY(share_a_device(*store, rank, size, deadline, &shared));
    // A simulated device has no NCCL: the CPU transports under NCCL's memory rules stand in.
    spec.cuda = !shared && !settings_.simulated_device;
    std::unique_ptr<comm::Communicator> inner;
    SX_TRY(comm::create_communicator(std::move(store), rank, size, spec, &inner));
    if (!shared && settings_.simulated_device) inner = make_device_only_communicator(std::move(inner), *settings_.device);
    if (shared && rank == 0 && size > 1)
        log(SX_LOG_INFO, "sx: %d ranks share a %s device: they exchange through the CPU transports, staged through host "
            "memory", size, settings_.simulated_device ? "simulated" : "CUDA");
    *out = make_staged_communicator(std::move(inner), *settings_.device, shared ? StagedSide::kHost : StagedSide::kDevice);
    return Status::Ok();
}

void Mesh::abort(const Status &why) {
    for (comm::Communicator *c : {world_.get(), shard_own_.get(), replica_.get()}) {
        if (c && why.ok()) c->abort();
        if (c && !why.ok()) c->fail_channel(why);
    }
}

}  // namespace core
}  // namespace sx
