// The ranks of a shard group and their communicators, a part of the group (docs/design.md,
// "Meshes"): the world's communicator, and for a mesh the shard group's (ranks [k *
// shard_size, (k + 1) * shard_size)) and the replica group's (the ranks with the same
// shard index), all connected through the rendezvous store; and how to connect one more
// communicator of the group's backend among some of its ranks (the gathers' own).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "base/status.h"
#include "comm/communicator.h"
#include "rdzv/store.h"
#include "core/agreement.h"
#include "core/device.h"

namespace sx {
namespace core {

class Mesh {
  public:
    struct Settings {
        int backend = SX_BACKEND_CPU;  // SX_BACKEND_CPU (Gloo) or SX_BACKEND_CUDA (NCCL)
        int device_ordinal = 0;
        int timeout_ms = 300000;
        std::string bind_address;  // the CPU transport's ("" = the host's name)
        // CPU: ranks that all run on this host exchange through shared memory (else, and
        // across hosts, Gloo's TCP).
        bool shared_memory = true;
        // CUDA: where the group's buffers live (borrowed). Ranks that share a device (its
        // identity, on one host), and every rank of a simulated device, exchange through
        // the CPU transports with their device buffers staged through host memory
        // (staged_comm.h): NCCL puts one rank on each device.
        // NCCL takes device memory for its data: host memory handed to a CUDA group's
        // communicator is staged through the device. A simulated device stands in for
        // NCCL between devices where simulated_nccl (else its ranks share it).
        DeviceOps *device = nullptr;
        bool simulated_device = false, simulated_nccl = false;
        // A context's shared memory (context.h): every CPU communicator is a channel of it.
        std::shared_ptr<comm::SharedChannels> channels;
        // A context's Gloo mesh (context.h; where it has no shared memory): every CPU
        // communicator is a channel of it.
        std::shared_ptr<comm::GlooChannels> gloo_channels;
        // A context's group: what its channels' errors call it ("group 'a'").
        std::string label;
    };
    // This rank's place in the world, known from the rendezvous before anything connects.
    void place(const Settings &settings, int rank, int world_size);

    // Collective: the world's communicator through `store`, then the mesh of shard groups
    // of `shard_size` ranks: every rank must ask for the same (else each is told, through
    // `headers`, how they differ), a divisor of the world size (SX_ERR_INVALID_ARGUMENT);
    // the shard and replica groups' communicators connected through key spaces of their
    // own. All by `deadline` (SX_ERR_TIMEOUT otherwise).
    Status open(std::shared_ptr<rdzv::Store> store, int shard_size, const CallHeaders &headers,
                std::chrono::steady_clock::time_point deadline);
    // A communicator of the group's backend among `size` of its ranks through `store`,
    // connected by `deadline` (the zero time point: the timeout from now).
    Status connect(std::shared_ptr<rdzv::Store> store, int rank, int size, std::unique_ptr<comm::Communicator> *out,
                   std::chrono::steady_clock::time_point deadline = {}) const;
    // Any thread: every communicator aborted (collectives in flight return at once); with
    // a failure `why`, the peers' calls fail too (Communicator::fail_channel).
    void abort(const Status &why = Status::Ok());

    int rank() const { return rank_; }
    int world_size() const { return world_size_; }
    int shard_size() const { return shard_size_; }
    int shard_rank() const { return shard_rank_; }
    int replicas() const { return replicas_; }
    int replica_rank() const { return replica_rank_; }
    comm::Communicator &world() const { return *world_; }
    comm::Communicator &shard() const { return *shard_; }    // the world's where the mesh is flat
    comm::Communicator *replica() const { return replica_.get(); }  // null with one replica
    rdzv::Store &store() const { return *store_; }
    const std::shared_ptr<rdzv::Store> &store_ptr() const { return store_; }

  private:
    Status share_a_device(rdzv::Store &store, int rank, int size, std::chrono::steady_clock::time_point deadline,
                          bool *shared) const;

    Settings settings_;
    int rank_ = 0, world_size_ = 1;
    int shard_size_ = 1, shard_rank_ = 0, replicas_ = 1, replica_rank_ = 0;
    std::shared_ptr<rdzv::Store> store_;
    std::unique_ptr<comm::Communicator> world_;
    comm::Communicator *shard_ = nullptr;              // world_, or shard_own_
    std::unique_ptr<comm::Communicator> shard_own_;    // a mesh's shard group
    std::unique_ptr<comm::Communicator> replica_;      // a mesh's replica group (replicas > 1)
};

}  // namespace core
}  // namespace sx
