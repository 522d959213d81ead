// A communicator for ranks that share a device (docs/offload.md, "Ranks on one device"):
// NCCL puts one rank on each device, so ranks of a CUDA group on one device exchange
// through a CPU communicator (shared memory on one host) instead, their device buffers
// staged through host memory around each collective. Host memory handed to it (the small
// exchanges of the step, memory copies) goes straight to the inner communicator.
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "core/device.h"

namespace sx {
namespace core {

// Wraps `inner` (a CPU communicator); device memory is whatever `ops` holds (borrowed; it
// outlives the communicator). One thread at a time, as any communicator.
std::unique_ptr<comm::Communicator> make_staged_communicator(std::unique_ptr<comm::Communicator> inner,
                                                             DeviceOps &ops);

}  // namespace core
}  // namespace sx
