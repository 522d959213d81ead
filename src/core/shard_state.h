// What checkpoint code (ckpt/, one layer up) reaches of a shard group, and nothing else:
// the ShardAccess interface below, which ShardGroup implements (core/group.h, on its
// parts' answers in core/group_parts.h, neither of which ckpt includes:
// scripts/check_layers.py holds it to that), and the structs it trades
// in. A rank's shard as a checkpoint sees it is what a save copies out of the group
// (export_shard) and what a load puts back at its commit in one call (restore_shard).
#pragma once

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "rdzv/store.h"
#include "core/device.h"
#include "core/layout.h"
#include "core/params.h"
#include "optim/optimizer.h"
#include "sx/sx.h"

namespace sx {
namespace core {

// torch.cuda.amp.GradScaler's state: the scale, and the steps in a row without inf/NaN
// since it last changed.
struct LossScalerState {
    double scale = 1.0;
    int64_t growth_tracker = 0;
};

// Where one param's piece of this rank's shard keeps its optimizer state in a unit of
// packed state (Units::Unit::state_pieces): in each slot's bytes from byte_offset on, in
// its dtype (SX_STATE_*), and for 8-bit state its scales in the slot's scales from
// scale_offset on (one per optim::kQuantBlock elements).
struct StatePiece {
    int32_t param = -1;
    int32_t dtype = SX_STATE_FP32;
    uint64_t shard_offset = 0, n = 0;
    uint64_t byte_offset = 0, scale_offset = 0;
};
// The piece of `param` among a unit's pieces (in ascending param order, as a unit's
// params are), or null where this rank's shard holds none of it. O(log pieces).
inline const StatePiece *find_state_piece(const std::vector<StatePiece> &pieces, int32_t param) {
    auto it = std::lower_bound(pieces.begin(), pieces.end(), param,
                               [](const StatePiece &sp, int32_t p) { return sp.param < p; });
    return it != pieces.end() && it->param == param ? &*it : nullptr;
}

// How unit u of `layout` keeps its optimizer state in shard `shard`: where a param of the
// unit keeps bf16 or 8-bit state, as pieces (in ascending param order, 64-byte aligned,
// each slot *bytes bytes and *scales 8-bit block scales), else densely (no pieces,
// *bytes = shard_numel floats, padding included). A function of the params, their
// groups' state dtypes and the layout only, so any rank can describe any shard of any
// layout (a regroup reads copies taken under another).
std::vector<StatePiece> state_pieces_of(const Layout &layout, int shard, size_t u, const std::deque<ParamSpec> &params,
                                        const std::vector<ParamGroup> &groups, uint64_t *bytes, uint64_t *scales);

// Where one unit's shard lives, in the group's memory (host or device, as its DeviceOps
// allocated it). Valid until the group next changes its buffers (a change of
// trainability allocates state; a load's commit swaps it).
struct UnitShard {
    // This rank's shard of the fp32 values: the fp32 master weights of a 16-bit unit,
    // else its own shard of the flat param buffer. A unit of a bf16_stochastic_round
    // group has none (null) but while a checkpoint's fp32 copy of its bf16 params exists:
    // from an export_shard (a save, a load, a whole-state call) until the next step.
    float *values = nullptr;
    // bf16_stochastic_round units: this rank's shard of the bf16 params, their only
    // values, in the group's memory (what memory copies hold and restore); else null.
    uint16_t *bf16_params = nullptr;
    float *state[3] = {nullptr, nullptr, nullptr};  // each allocated optimizer state slot
    int state_slots = 0;
    uint64_t shard_numel = 0;
    // How each slot is laid out: packed (a unit with a param group of bf16 or 8-bit
    // state) as these pieces, each slot slot_bytes bytes and its 8-bit pieces' scales
    // slot_scales floats at scales[k]; else (pieces empty) shard_numel floats, padding
    // included, and no scales. Described whether or not the slots are allocated yet.
    std::vector<StatePiece> pieces;
    uint64_t slot_bytes = 0, slot_scales = 0;
    float *scales[3] = {nullptr, nullptr, nullptr};
    // A 16-bit unit: `values` are its fp32 master weights, or, for a bf16_stochastic_round
    // unit, the checkpoint copy (its bf16 params widened, exactly; what is written there
    // is rounded to nearest into the params: Units::masters_to_params).
    bool master = false;
};

// A param's updates so far (torch's per-param `step`) and, for SGD, the updates that
// used its momentum buffer (the first one initialises it from the gradient).
struct ParamProgress {
    int64_t step = 0;
    int64_t momentum_steps = 0;
    float mu_product = 1.0f;  // NAdam's
    // The tensors its optimizer keeps whole (ParamSpec::row_var, col_var: whole(t)).
    std::vector<float> row_var, col_var;
    std::vector<float> &whole(int t) { return t == 0 ? row_var : col_var; }
    const std::vector<float> &whole(int t) const { return t == 0 ? row_var : col_var; }
};

// How far the optimizer has come: what a checkpoint holds besides the tensors.
struct ShardProgress {
    uint64_t steps_taken = 0;
    std::vector<ParamProgress> params;  // per param
    std::vector<optim::Hyper> hypers;   // per param group
    std::vector<int64_t> group_steps;   // per param group: ParamGroup::steps
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
    // Per unit u: state slots [0, slots[u]) were read into (*state)[u][k], laid out as
    // the unit's (UnitShard: slot_bytes each), and a packed unit's scales into
    // (*scales)[u][k] (slot_scales floats each; may be null where no unit has any). Each
    // is exchanged with the group's (a slot the unit lacks is added), so that they then
    // hold the state they replaced.
    std::vector<std::array<Buffer, 3>> *state = nullptr;
    std::vector<std::array<Buffer, 3>> *scales = nullptr;
    std::vector<int> slots;
    // Per unit (may be null): a 16-bit unit's new fp32 master weights, exchanged with the
    // group's (an empty buffer leaves them). The params take their values from them at
    // the next gather_params.
    std::vector<Buffer> *masters = nullptr;
    // Replaces the group's whole progress; null keeps it (a load of the values alone).
    const ShardProgress *progress = nullptr;
};

// torch.cuda.amp.GradScaler's parameters.
struct LossScaling {
    int mode = SX_LOSS_SCALING_NONE;
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
};

// One thing ranks must agree on, in words: what it is ("param 'w' shape") and this
// rank's value ("[4, 4]").
struct Fact {
    std::string what;
    std::string value;
};

// Readers of this rank's shard (a checkpoint's snapshot, copied in the background)
// hold the fence; writers of it (the step's update, a broadcast, a load) wait until no
// reader holds it. Any thread.
class ShardFence {
  public:
    void hold();
    void release();
    void wait_readers() const;  // returns once nothing holds the fence

    // Holds the fence while alive.
    class Hold {
      public:
        explicit Hold(ShardFence &fence) : fence_(fence) { fence_.hold(); }
        ~Hold() { fence_.release(); }
        Hold(const Hold &) = delete;
        Hold &operator=(const Hold &) = delete;

      private:
        ShardFence &fence_;
    };

  private:
    mutable std::mutex mu_;
    mutable std::condition_variable cv_;
    int holds_ = 0;
};

// A shard group as checkpoint code sees it (see the top of this file). Thread safety as
// ShardGroup's: the trainer's thread, but where a member says otherwise.
class ShardAccess {
  public:
    virtual ~ShardAccess() = default;

    // --- the ranks and the layout ---
    virtual int rank() const = 0;
    virtual int world_size() const = 0;
    // The mesh: shard groups of shard_size ranks; this rank owns shard shard_rank of every
    // unit, in replica group replica_rank (see ShardGroup).
    virtual int shard_size() const = 0;
    virtual int shard_rank() const = 0;
    virtual int replica_rank() const = 0;
    virtual int stage() const = 0;
    virtual int alignment() const = 0;   // bytes: where each param starts in a unit
    virtual int timeout_ms() const = 0;  // of every collective and rendezvous wait
    virtual int32_t num_params() const = 0;
    virtual const ParamSpec &param(int32_t index) const = 0;
    virtual const Layout &layout() const = 0;
    virtual const optim::Hyper &hyper(int32_t group) const = 0;
    virtual const LossScaling &loss_scaling() const = 0;
    // Finalized, with nothing added since (SX_ERR_INVALID_STATE saying which otherwise).
    virtual Status check_finalized() const = 0;

    // --- the shard ---
    // Collective in order (every rank exports for the same save or load). Waits for the
    // trainer's writes into the views (the legacy default stream), derives the fp32
    // masters of 16-bit units where they are not yet (they are what a checkpoint
    // stores), widens the bf16 params of bf16_stochastic_round units into a fresh fp32
    // copy (UnitShard::values, until the next step), and describes the shard.
    virtual Status export_shard(ShardState *out) = 0;
    // A load's commit: checks everything first (SX_ERR_INTERNAL, and nothing changes, if
    // r does not fit the group), then swaps the state buffers in and replaces the
    // progress. Cannot fail half-way.
    virtual Status restore_shard(const ShardRestore &r) = 0;
    // Collective: every rank rounds its masters (if any) into its own shard of the
    // params, and the ranks all-gather the rest, so that the params hold the values of
    // every rank's shard (after a load wrote them). A failed collective fails the group.
    virtual Status gather_params() = 0;
    // Held while a snapshot of this rank's shard is being copied out; everything in the
    // group that writes the shard waits for it first. Any thread.
    virtual ShardFence &shard_fence() = 0;
    // Where the group's buffers live, and the work on them.
    virtual DeviceOps &ops() = 0;
    // Where the fp32 values (UnitShard::values) and the optimizer state live: ops() but in
    // a group that offloads them to the host (SX_OFFLOAD_STATE).
    virtual DeviceOps &state_ops() = 0;

    // --- what the ranks do together ---
    // Collective, the first exchange (the header) of a call outside the step's family (a
    // save, a load): the ranks compare `call` and `facts` (what must agree for it: a
    // path, a checkpoint's CRC). A rank in another call, or with another value, fails
    // every rank with SX_ERR_MISMATCH naming each rank's call or value. `local`: this
    // rank's own verdict on its arguments, compared too, so that a rank that refuses the
    // call still takes part and no peer waits; it is returned where it failed.
    virtual Status agree_call(const char *call, std::vector<Fact> facts, const Status &local = Status::Ok(),
                              const char *intro = "ranks disagree") = 0;
    // Runs a collective through the group's communicator; a failure fails the group.
    virtual Status collective(const std::function<Status(comm::Communicator &)> &fn) = 0;
    // The rendezvous store (a save's commit agrees through it, never through the
    // training communicator).
    virtual rdzv::Store &store() = 0;

    // --- failure ---
    // Marks the group failed with s: every later call fails with its words, and the
    // communicators are aborted. Returns s. Any thread.
    virtual Status fail(Status s) = 0;
    // SX_ERR_GROUP_FAILED with the first failure's message, or ok.
    virtual Status check_usable() const = 0;
    // Whether sx_abort() was called. Any thread.
    virtual bool aborted() const = 0;
    // The step timeline, or null when tracing is off. Any thread.
    virtual trace::Tracer *tracer() const = 0;
};

}  // namespace core
}  // namespace sx
