// A rank's shard as a checkpoint sees it: what a save copies out of the group and what a
// load puts back. The group exports it (ShardGroup::export_shard) and a load restores it
// at its commit in one call (ShardGroup::restore_shard); the checkpoint code reaches
// nothing else of the group's insides.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "core/device.h"
#include "optim/optimizer.h"

namespace sx {
namespace core {

// torch.cuda.amp.GradScaler's state: the scale, and the steps in a row without inf/NaN
// since it last changed.
struct LossScalerState {
    double scale = 1.0;
    int64_t growth_tracker = 0;
};

// Where one unit's shard lives, in the group's memory (host or device, as its DeviceOps
// allocated it). Valid until the group next changes its buffers (a change of
// trainability allocates state; a load's commit swaps it).
struct UnitShard {
    // This rank's shard of the fp32 values: the fp32 master weights of a 16-bit unit,
    // else its own shard of the flat param buffer.
    float *values = nullptr;
    float *state[3] = {nullptr, nullptr, nullptr};  // each allocated optimizer state slot
    int state_slots = 0;
    uint64_t shard_numel = 0;
};

// A param's updates so far (torch's per-param `step`) and, for SGD, the updates that
// used its momentum buffer (the first one initialises it from the gradient).
struct ParamProgress {
    int64_t step = 0;
    int64_t momentum_steps = 0;
};

// How far the optimizer has come: what a checkpoint holds besides the tensors.
struct ShardProgress {
    uint64_t steps_taken = 0;
    std::vector<ParamProgress> params;  // per param
    std::vector<optim::Hyper> hypers;   // per param group
    LossScalerState scaler;
};

// What ShardGroup::export_shard gives.
struct ShardState {
    // Drawn by every rank in the same order (one per export): names one checkpoint's
    // keys in the rendezvous store.
    uint64_t sequence = 0;
    std::vector<UnitShard> units;    // per unit
    std::vector<uint8_t> trainable;  // per param: the trainer's flag as it stands (0 or 1)
    ShardProgress progress;
};

// What a load puts in place at its commit (the values, read in place, are there already).
struct ShardRestore {
    // Per unit u: state slots [0, slots[u]) were read into (*state)[u][k], shard_numel
    // floats each. Each is exchanged with the group's slot (a slot the unit lacks is
    // added), so that (*state)[u][k] then holds the state it replaced.
    std::vector<std::array<Buffer, 3>> *state = nullptr;
    std::vector<int> slots;
    // Replaces the group's whole progress; null keeps it (a load of the values alone).
    const ShardProgress *progress = nullptr;
};

}  // namespace core
}  // namespace sx
