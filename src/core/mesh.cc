// The mesh part (mesh.h).
#include "core/mesh.h"

#include "comm/abort_at_deadline.h"
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

Status Mesh::connect(std::shared_ptr<rdzv::Store> store, int rank, int size, std::unique_ptr<comm::Communicator> *out,
                     std::chrono::steady_clock::time_point deadline) const {
    comm::CommunicatorSpec spec;
    spec.cuda = settings_.backend == SX_BACKEND_CUDA;
    spec.device = settings_.device_ordinal;
    spec.timeout = Millis(settings_.timeout_ms);
    spec.deadline = deadline;
    spec.bind_address = settings_.bind_address;
    spec.shared_memory = settings_.shared_memory;
    return comm::create_communicator(std::move(store), rank, size, spec, out);
}

void Mesh::abort() {
    for (comm::Communicator *c : {world_.get(), shard_own_.get(), replica_.get()})
        if (c) c->abort();
}

}  // namespace core
}  // namespace sx
