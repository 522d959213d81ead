// Communicators that take one side's memory, for a CUDA group whose buffers lie on both
// (docs/offload.md): the device's params and gradients, and the host's small exchanges,
// offloaded state and memory copies.
// - NCCL takes device memory for its data (and host memory for its small all-reduces): a
//   CUDA group's NCCL communicator is wrapped so that host memory handed to it is staged
//   through device memory (StagedSide::kDevice).
// - NCCL puts one rank on each device, so ranks that share a device exchange through a CPU
//   communicator (shared memory on one host) instead, their device buffers staged through
//   host memory (StagedSide::kHost).
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "core/device.h"

namespace sx {
namespace core {

// Which memory the inner communicator takes.
enum class StagedSide { kHost, kDevice };

// Wraps `inner`; device memory is whatever `ops` holds (borrowed; it outlives the
// communicator). Buffers on the side the inner does not take are copied to scratch on its
// side (kept, grown as needed) before the inner collective and back after it. One thread at
// a time, as any communicator.
std::unique_ptr<comm::Communicator> make_staged_communicator(std::unique_ptr<comm::Communicator> inner,
                                                             DeviceOps &ops, StagedSide inner_takes);

// A simulated device's stand-in for NCCL (tests): `inner` (a CPU communicator) refuses, with
// SX_ERR_INTERNAL naming the call, memory other than what NCCL takes: `ops`'s for the data,
// the host's for all_reduce_sum and all_reduce_max.
std::unique_ptr<comm::Communicator> make_device_only_communicator(std::unique_ptr<comm::Communicator> inner,
                                                                  DeviceOps &ops);

}  // namespace core
}  // namespace sx
