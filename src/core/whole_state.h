// The whole-state exchange part of a shard group: whole params' optimizer state gathered
// onto one rank (sx_gather_optim_state, as ZeroRedundancyOptimizer.consolidate_state_dict
// does) and scattered from one rank into every rank's shard (sx_scatter_optim_state, its
// load_state_dict). Param by param, in index order: the root holds one param's whole
// state at a time (one buffer sized for the largest param, allocated before the first
// exchange) besides its own shard, whatever the model's size. Each param's pieces travel
// point to point between their owner and the root (gather_pieces, scatter_pieces),
// straight from and into the owners' shards. A scatter writes into copies of every rank's
// shard, which replace the shard only when every rank has its pieces and the root's
// callback succeeded for every param: a failure anywhere changes nothing.
//
// It reaches the group as checkpoints do, through ShardAccess (the shard exported and
// restored), with the mesh's communicators given explicitly.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <vector>

#include "base/status.h"
#include "comm/communicator.h"
#include "core/shard_state.h"
#include "optim/param_passes.h"

namespace sx {
namespace core {

// One param's whole, unpadded optimizer state, on the root of sx_gather_optim_state (or
// to fill, on the root of sx_scatter_optim_state): its step counts and its tensors by
// torch's names, numel fp32 each in host memory (valid for the callback).
struct ParamState {
    int32_t param = 0;
    int32_t group = 0;
    const char *name = nullptr;
    uint64_t numel = 0;
    int64_t step = 0;
    int64_t momentum_steps = 0;
    float mu_product = 0.0f;  // NAdam's (0: other optimizers; in a scatter, derive it from step)
    std::vector<const char *> names;
    std::vector<float *> tensors;
    std::vector<uint64_t> numels;  // each tensor's elements: numel, but for the whole tensors' (WholeTensorSizes)
};
using StateFn = std::function<Status(ParamState &)>;

// A param's sharded state tensors in gather/scatter order: its optimizer's slots (where
// its unit has them, or always with as_if_allocated), then "master" for 16-bit params.
struct StateTensor {
    const char *name;
    int slot;  // -1: the master weights
};
std::vector<StateTensor> state_tensors(const ShardAccess &g, const UnitShard &unit, int32_t p, bool as_if_allocated);

// The tensors param p's optimizer keeps whole besides its slots (optim::WholeTensors:
// every rank keeps them whole, not sharded), after its slots in gather/scatter order:
// its row's description (or null) and each tensor's element count (0 for a param that
// keeps none).
struct WholeTensorSizes {
    const optim::WholeTensors *row = nullptr;
    uint64_t numel[optim::kMaxWholeTensors] = {};
    int count() const { return row ? row->count : 0; }
    uint64_t total() const {
        uint64_t n = 0;
        for (int t = 0; t < count(); ++t) n += numel[t];
        return n;
    }
    bool any() const { return total() > 0; }
};
WholeTensorSizes whole_tensor_sizes(const ShardAccess &g, int32_t p);

class PieceCodec;  // packed state to and from fp32 (whole_state.cc)

class WholeState {
  public:
    // The mesh and its communicators (null where a group has one rank).
    struct Mesh {
        comm::Communicator *world = nullptr, *shard = nullptr, *replica = nullptr;
    };
    WholeState(ShardAccess &group, const Mesh &mesh) : g_(group), mesh_(mesh) {}

    // Collective, once the ranks agreed on the call: root's fn gets every param's whole
    // state, in index order (fn's first failure ends the calls; every rank then fails
    // with it).
    Status gather(int root, const StateFn &fn);
    // Collective, likewise: root's fn fills every param's whole state, in index order,
    // and every rank's shard takes its part; nothing changes unless every rank and every
    // call of fn succeeded. Each rank holds a second copy of its shard's state meanwhile.
    Status scatter(int root, const StateFn &fn);
    // Collective within a call: param p's whole tensors (on the root: `full`, numel each,
    // in the state's memory) scattered; this rank's piece of tensor t goes to own[t]
    // (where its shard holds a piece of p). Also the whole values' (whole_values.h).
    Status scatter_param(int root, int32_t p, float *full, const std::vector<float *> &own);

  private:
    // Where a scatter receives this rank's shard: a copy of every state slot any param's
    // optimizer keeps (zero where the root leaves nothing: the units' padding), and of the
    // masters; the root's staging for one whole param (and its host copy where the
    // device is not the host).
    struct Targets {
        std::vector<std::array<Buffer, 3>> state, scales;
        std::vector<int> slots;
        std::vector<Buffer> masters;
        Buffer staging;
        std::vector<float> host;
        Buffer pieces;  // this rank's pieces of one param's packed slots, as fp32
    };
    Status allocate_targets(int root, const std::vector<UnitShard> &units, PieceCodec *codec, Targets *t);
    // Where this rank's own pieces of one param's packed slots are held as fp32 (the
    // largest piece, times three slots, in the state's memory), and the codec's room.
    Status packed_scratch(const std::vector<UnitShard> &units, PieceCodec *codec, Buffer *pieces);
    std::vector<float *> own_targets(const UnitShard &unit, int32_t p, const std::vector<StateTensor> &tensors,
                                     Targets *t);
    // A packed param's received pieces (t->pieces) encoded into the copies of its slots.
    Status encode_own(const UnitShard &unit, int32_t p, const std::vector<StateTensor> &tensors, PieceCodec *codec,
                      Targets *t);
    Status root_buffers(int root, const std::vector<UnitShard> &units, bool as_if_allocated, Buffer *staging,
                        std::vector<float> *host);
    Status share_outcome(int root, Status mine, const char *what);
    ParamState gathered(int32_t p, const std::vector<StateTensor> &tensors, float *data, ParamProgress &own);
    bool in_root_group(int root) const { return g_.replica_rank() == root / g_.shard_size(); }

    ShardAccess &g_;
    Mesh mesh_;
};

}  // namespace core
}  // namespace sx
