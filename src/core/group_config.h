// A shard group's configuration (sx_group_config_t, resolved): what sx_create_shard_group
// was given, with the rank, world size and backend it resolved, and what a regroup sets
// for the groups it makes. Its own header so that recovery (src/recovery/) may read and
// write it without seeing the group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "rdzv/rendezvous.h"
#include "sx/sx.h"

namespace sx {
namespace optim {
class OpenMpTeam;  // optim/openmp_team.h
}
namespace core {

class Context;  // context.h

struct GroupConfig {
    std::string rendezvous;
    int rank = 0;
    int world_size = 0;  // 0 = from the environment
    int stage = 2;
    int backend = SX_BACKEND_CPU;
    int num_threads = 0;  // 0 = automatic
    int alignment = 64;   // bytes
    int timeout_ms = 300000;
    uint32_t flags = 0;
    std::string bind_address;
    // The rendezvous server's guard (sx_group_config_t; "" = from the environment).
    std::string rendezvous_token;
    std::string rendezvous_bind;
    int device_ordinal = 0;
    int grad_dtype = 0;    // 0 = each param's dtype, or SX_DTYPE_F32
    int reduce_dtype = 0;  // 0 = the grad dtype, or SX_DTYPE_F32
    int prefetch_depth = 1;  // stage 3: units gathered ahead of the trainer's calls (0: none)
    int transport = SX_TRANSPORT_AUTO;  // CPU: shared memory on one host, or TCP always
    // HSDP: ranks per shard group (a divisor of the world size; 0 = the world size). The
    // layout has shard_size shards; each is replicated world_size / shard_size times.
    int shard_size = 0;
    // 16-bit reductions divide the gradients by this before their sum and multiply the
    // sum back by it in fp32 after; 0 = FSDP's factor for the ranks summed in 16 bits.
    double grad_predivide_factor = 0.0;
    // The step timeline (docs/tracing.md): a file name template ("%r": the rank; empty: no
    // trace) and the most events kept (0: trace::kDefaultCapacity).
    std::string trace_path;
    size_t trace_capacity = 0;
    // Steps between memory copies of the state (memory_copies.h); 0 = none.
    int memory_copy_interval = 0;
    // SX_OFFLOAD_*: where a CUDA group keeps its masters and optimizer state.
    int offload = SX_OFFLOAD_NONE;
    // SX_BACKEND_CUDA on a simulated device (SX_SIMULATED_DEVICE: device.h), whose ranks
    // exchange through the CPU transports.
    bool simulated_device = false;
    int simulated_copy_delay_us = 0;
    bool simulated_nccl = false;  // its ranks exchange as NCCL's on separate devices would
    // SX_GROUP_OPENMP_THREADS: the host's OpenMP runtime, whose team runs the pool's jobs
    // on the thread of the group's API calls (optim/openmp_team.h); nullptr = the pool's.
    const optim::OpenMpTeam *openmp_team = nullptr;
    // SX_GROUP_JOIN: a process that joins a running group at its next regroup (recovery/regroup.cc).
    bool joining = false;
    // Regroups since the group was first created (set by recovery/regroup.cc for the groups it makes).
    int epoch = 0;
    // The context the group is made in (context.h), and its name there; none: a group of
    // its own rendezvous, transport and pool. A regroup's group is made out of the context.
    std::shared_ptr<Context> context;
    // The group's name in its context; for a joining process without a context, the name
    // of the context's group it joins (its key space: group_space_key).
    std::string name;
};

// cfg with its rendezvous read (*rv: rank and world size from the environment where asked),
// its backend decided, a simulated device taken from the environment and its bind address
// chosen (group.cc). A group's creation and a context's resolve alike.
Status resolve_config(const GroupConfig &cfg, rdzv::Rendezvous *rv, GroupConfig *out);
// The host thread pool's size for cfg (resolved): num_threads, or every core (shared among
// the ranks that are threads of one process); 1 for a CUDA group whose state is on its device.
int pool_threads(const GroupConfig &cfg);

// Where a context's live group named `name` has its key space (a key of the context's
// store, whose value is the space, "groups/NAME/N/"): its rank 0 writes it when the group is
// made, and a process that joins the group (SX_GROUP_JOIN with that name) reads it there.
inline std::string group_space_key(const std::string &name) { return "groups/" + name + "/live"; }

}  // namespace core
}  // namespace sx
