// The flat-buffer layout (docs/design.md, "Concepts"): params of a unit in registration
// order, every start aligned, each unit padded to a multiple of world_size x alignment
// so that it splits into world_size equal shards; rank r owns [r*S, (r+1)*S).
//
// Padding is a property of this layout only: everything outside it speaks of a param's
// own index space [0, numel). Offsets here are in elements.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace sx {
namespace core {

struct ParamShape {
    int32_t unit = 0;        // the trainer's unit id
    uint64_t numel = 0;      // >= 1
    uint32_t elem_bytes = 4; // 4 (fp32) or 2 (fp16, bf16); the same for every param of a unit
    // Elements no shard boundary may split (a power of two): the quantization blocks of
    // 8-bit state (optim/state_codec.h). The param starts on a multiple of it, and its
    // unit's shards are multiples of it, so every shard holds whole blocks of it at any
    // world size.
    uint32_t block = 1;
};

struct UnitLayout {
    int32_t unit_id = 0;
    std::vector<int32_t> params;  // param indices, registration order
    uint64_t numel = 0;           // end of the last param (unpadded extent)
    uint64_t padded_numel = 0;    // multiple of world_size * align_elems
    uint64_t shard_numel = 0;     // padded_numel / world_size
    uint32_t elem_bytes = 4;      // of every param in the unit
    uint64_t align_elems = 1;     // param starts are multiples of this (and of their block)
    uint64_t block = 1;           // shard_numel is a multiple of every param's block
};

// Where one param lives.
struct ParamPlacement {
    int32_t unit_index = 0;  // index into Layout::units()
    uint64_t offset = 0;     // element offset of the param's first element in the unit buffer
};

// The part of a param inside one shard, in both index spaces.
struct ShardPiece {
    uint64_t begin = 0, end = 0;  // in the param's own index space; empty if begin == end
    uint64_t shard_offset = 0;    // element offset of `begin` within the shard
};

class Layout {
  public:
    // Builds the layout. Param starts are aligned to align_bytes (a power of two >= 4):
    // align_bytes / elem_bytes elements of their unit. world_size >= 1.
    static Status build(const std::vector<ParamShape> &params, int world_size, uint64_t align_bytes,
                        Layout *out);

    int world_size() const { return world_size_; }
    const std::vector<UnitLayout> &units() const { return units_; }
    const ParamPlacement &placement(int32_t param) const { return placement_[param]; }
    uint64_t numel(int32_t param) const { return numel_[param]; }
    size_t num_params() const { return numel_.size(); }

    // The intersection of `param` with shard `rank` of its unit.
    ShardPiece piece(int32_t param, int rank) const;

  private:
    int world_size_ = 1;
    std::vector<UnitLayout> units_;
    std::vector<ParamPlacement> placement_;
    std::vector<uint64_t> numel_;
};

}  // namespace core
}  // namespace sx
