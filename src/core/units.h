// The units' memory on this rank, a part of a shard group: for each unit laid out, its
// flat param and gradient buffers (stage 3: this rank's shard of the params), the fp32
// master weights of 16-bit params, the fp32 accumulator of reduced gradients and the
// optimizer state of its shard; and what is done with them that involves no other rank
// but a unit's reduce-scatter (on the communicator the caller gives): the allocation at
// sx_finalize, the state a trainable mask needs, the masters derived and rounded, the
// step's segments and a unit's sum of squares, the gradients zeroed.
//
// It reads the group's param table and layout, registered once (configure) and owned by
// the group, which outlives it.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "base/status.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "core/device.h"
#include "core/layout.h"
#include "core/params.h"
#include "core/shard_state.h"
#include "optim/optimizer.h"

namespace sx {
namespace core {

class Units {
  public:
    struct Unit {
        int32_t dtype = SX_DTYPE_F32;       // of the params
        int32_t grad_dtype = SX_DTYPE_F32;  // of the grads
        Buffer params, grads;
        Buffer master;              // 16-bit params: this rank's shard in fp32
        // bf16 params of bf16_stochastic_round groups: no masters (`master` holds only a
        // checkpoint's fp32 copy, from a save or load until the next step: ensure_masters);
        // the update widens the params, computes in fp32 and rounds stochastically back
        // (optim/stochastic_round.h).
        // Offloaded, their values are on the host as every offloaded unit's are (`own` at
        // stage 3, `host_params` at stages 1-2), where the host's kernels update them.
        bool stochastic_round = false;
        // The state side's copy of the values is current: the masters, or for an offloaded
        // bf16_stochastic_round unit at stages 1-2 (no masters) host_params, which the
        // host's kernels update. False: the device's params are newer (the trainer wrote
        // them, or a broadcast did), and the next step or state view takes them first.
        // A bf16_stochastic_round unit's checkpoint copy in `master` is taken afresh at
        // every save and never counts.
        bool values_valid = false;
        // Stage 2, or 16-bit grads: this rank's shard of the reduced (and accumulated)
        // gradients in fp32.
        Buffer accum;
        Buffer state[3];         // this rank's shard of each optimizer state slot
        int state_slots = 0;     // slots allocated
        // A unit with a param group of bf16 or 8-bit state: each slot's bytes follow these
        // pieces, one per param in this rank's shard (padding keeps none), and `scales`
        // hold its 8-bit pieces' scales. Empty for a unit of fp32 state only, whose slots
        // are shard_numel floats each, padding included.
        std::vector<StatePiece> state_pieces;
        Buffer scales[3];
        // Units with a custom optimizer's params: the step writes the slots' new values
        // here and swaps them in once every rank's update succeeded; `undo` keeps the
        // params the update overwrote (optim/custom.h).
        Buffer state_next[3];
        Buffer undo;
        bool trainable = false;  // any param trainable (as applied)
        bool accum_live = false; // accum holds gradients of earlier micro-batches
        // Stage 3: this rank's shard of the params, in their dtype (`params` is empty: the
        // whole params exist only while the unit is gathered, in the gathers' buffer).
        Buffer own;
        // Offloaded 16-bit units at stages 1-2: this rank's shard of the params on the
        // host, which the update rounds the masters into and which is copied to the
        // device after it (at stage 3, `own` is on the host and takes them).
        Buffer host_params;
        // Offloaded: the copies in flight (DeviceOps tickets; 0: none) of the reduced
        // gradients to the host's accumulator, and of the updated params to the device.
        mutable uint64_t grads_copy = 0;
        uint64_t params_copy = 0;
        // The step's reduced shard (`accum`) is the unit's 16-bit gradients themselves, not
        // yet widened: its segments hand the update `grads` (optim::Segment::grad16),
        // which widens them as it reads them. Until the gradients are zeroed.
        bool grads16_pending = false;
    };
    Units() = default;
    ~Units();
    Units(const Units &) = delete;
    Units &operator=(const Units &) = delete;
    struct Settings {
        int stage = 2;
        int shard_rank = 0, shard_size = 1;
        int grad_dtype = 0;    // 0: each param's dtype, or SX_DTYPE_F32
        int reduce_dtype = 0;  // 0: the gradients' dtype, or SX_DTYPE_F32
        double predivide = 1.0;  // 16-bit sums: the gradients' divisor before, multiplier after
        // The shard group's ranks read each other's buffers in place (processes on one
        // host): the buffers its collectives move come from the shared arena.
        bool exchanged = false;
        // SX_OFFLOAD_STATE: the masters (of every unit, fp32 ones too), the optimizer state
        // and the reduced gradients' shard live on the host (the state ops'), where the
        // update runs; the params and gradients stay on the device.
        bool offload = false;
        // The device's update reads 16-bit gradients (DeviceOps::reads_16bit_grads), and
        // nothing but the update reads a reduced shard (no replicas to all-reduce it, not
        // offloaded): a one-rank shard group's 16-bit gradients then go to the update as
        // they are (Unit::grads16_pending).
        bool widen_in_update = false;
    };
    // The group's table: its layout, params, param groups and applied mask (per param).
    struct Table {
        const Layout *layout = nullptr;
        const std::deque<ParamSpec> *params = nullptr;
        const std::vector<ParamGroup> *groups = nullptr;
        const std::vector<uint8_t> *applied = nullptr;
    };
    // ops: where the params and gradients live; state_ops: where the masters, optimizer
    // state and reduced gradient shards live and the update runs (ops itself but where
    // settings.offload says otherwise). Both borrowed; they outlive the units.
    void configure(const Settings &settings, DeviceOps *ops, DeviceOps *state_ops, trace::Tracer *tracer,
                   const Table &table);
    DeviceOps &state_ops() const { return *state_ops_; }
    bool offloaded() const { return settings_.offload; }
    // Stage 3, offloaded: each unit's own shard of the params (`own`) is on the host, where
    // the update writes it; the gathers copy it to the device.
    bool own_on_host() const { return settings_.offload && settings_.stage == 3; }

    size_t size() const { return units_.size(); }
    Unit &operator[](size_t u) { return units_[u]; }
    const Unit &operator[](size_t u) const { return units_[u]; }
    std::vector<Unit>::iterator begin() { return units_.begin(); }
    std::vector<Unit>::iterator end() { return units_.end(); }
    std::vector<Unit>::const_iterator begin() const { return units_.begin(); }
    std::vector<Unit>::const_iterator end() const { return units_.end(); }

    // --- sx_finalize ---
    // Every unit's params share one dtype (SX_ERR_INVALID_ARGUMENT naming two that do not).
    Status check_dtypes() const;
    // Every param of a bf16_stochastic_round group is bf16, and a unit's params all take
    // it or none does (SX_ERR_INVALID_ARGUMENT naming the params otherwise).
    Status check_stochastic_round() const;
    // The buffers of the units of `layout` from index `first` on, into *added (nothing
    // here changes); then append them, or drop the units from `count` on (an undo).
    Status allocate(const Layout &layout, size_t first, std::vector<Unit> *added) const;
    // The bytes that allocate() and then the optimizer state of the trainable params
    // (trainable[p]) would take for those units: what a context's budget is asked for
    // before anything is allocated.
    uint64_t planned_bytes(const Layout &layout, size_t first, const std::vector<uint8_t> &trainable) const;
    // The buffers allocate() makes for a unit and their bytes, from its first param: the
    // one place their sizes and presence are decided.
    struct UnitBuffers {
        int32_t dtype = 0, grad_dtype = 0;
        bool stochastic_round = false;
        uint64_t params = 0;       // the flat params (stages 1-2) or this rank's shard (stage 3)
        uint64_t grads = 0;        // the flat gradients
        bool has_master = false;   // fp32 masters of this rank's shard ...
        uint64_t master = 0;       // ... of these bytes
        bool has_host_params = false;  // offloaded: the 16-bit params' shard on the host ...
        uint64_t host_params = 0;      // ... of these bytes
        uint64_t total() const { return params + grads + master + host_params; }
    };
    UnitBuffers buffers_of(const UnitLayout &ul) const;
    void append(std::vector<Unit> *added);
    void truncate(size_t count) { units_.resize(count); }

    // --- optimizer state ---
    // A trainable mask applied: unit flags, and optimizer state (and stage 2's gradient
    // accumulator, and the scratch of an fp32 reduction) allocated for every unit that
    // needs it under the current hyperparameters. All allocations happen before anything
    // changes.
    Status prepare(const std::vector<uint8_t> &mask, bool accumulate);
    // Unit u's state pieces (empty: fp32 state only), and the bytes and scales of one slot.
    std::vector<StatePiece> state_pieces(size_t u, uint64_t *bytes, uint64_t *scales) const;
    // Unit u's slots [state_slots, need) into state[k] and scales[k], laid out as *pieces.
    Status allocate_slots(size_t u, int need, Buffer *state, Buffer *scales, std::vector<StatePiece> *pieces) const;
    // The state slots unit u's trainable params need under `mask`.
    int required_slots(size_t u, const std::vector<uint8_t> &mask) const;
    // 16-bit units: the fp32 masters derived from the params where they are not yet, and
    // rounded into this rank's shard of the params (after someone wrote them).
    // With checkpoint set (export_shard's: a save, a load, a whole-state call), the
    // bf16_stochastic_round units too: their bf16 params widened into an fp32 copy
    // (allocated then, at every such export taken afresh), which a checkpoint stores, a
    // gather gives as "master", and a load or scatter writes into, and which
    // masters_to_params rounds to nearest into the params. The step drops these copies
    // (drop_checkpoint_copies) once no save reads them.
    Status ensure_masters(bool checkpoint = false);
    Status ensure_master(size_t u, bool checkpoint = false);  // unit u's alone
    void drop_checkpoint_copies();
    Status masters_to_params();
    // Offloaded units: the params the update wrote on the host (unit u's, its trainable
    // params' pieces alone) copied into this rank's shard of them
    // on the device. Nothing elsewhere.
    Status upload_params(size_t u);
    // Offloaded: once unit u's reduced gradients are on the host (its accumulator may be
    // read), or its updated params on the device; every copy of every unit.
    Status wait_grads(size_t u) const;
    Status wait_params(size_t u);
    Status wait_copies();
    // Unit u's shard as ShardState describes it.
    UnitShard shard(size_t u) const;
    // Its fp32 values alone (UnitShard::values), without the pieces shard() lays out.
    float *shard_values(size_t u) const;
    // This rank's shard of unit u's params, in their dtype (stage 3: `own`).
    void *own_params(size_t u) const;
    // A bf16_stochastic_round unit's values, in the state ops' memory: this rank's shard
    // of its bf16 params, or, offloaded at stages 1-2, their copy on the host.
    uint16_t *rounded_params(size_t u) const;

    // --- the step ---
    // Collective on c (the shard group's): reduces unit u's gradients into this rank's
    // shard; *shard_grad: where the reduced (summed, not averaged) fp32 shard lives.
    // into_accum: always into (or added to) the accumulator, never left in place.
    Status reduce(size_t u, comm::Communicator &c, bool into_accum, float **shard_grad);
    // Before the update: which units' gradient buffers the update zeroes as it reads them
    // (zero: the step zeroes the gradients at all); reduced: each unit's reduced shard.
    void mark_zeroed_by_update(bool zero, const std::vector<float *> &reduced);
    // Every unit's gradients zeroed (but the shards the update zeroed).
    Status zero_grads(const std::vector<float *> &reduced);
    // Unit u's segments (none if it is frozen): every trainable param's piece of this
    // rank's shard, its reduced gradient at `reduced`, its state and hyperparameters.
    void append_segments(size_t u, float *reduced, std::vector<optim::Segment> *out) const;
    // Every unit's segments but unit `except`'s; double_buffered: only those of the units
    // that double_buffered(u), else only the others.
    std::vector<optim::Segment> segments(const std::vector<float *> &reduced, int32_t except = -1,
                                         bool double_buffered = false) const;
    // Whether unit u is trainable and updates a param of a custom optimizer: its update
    // is double-buffered, and kept (commit_double_buffers) only if every rank's succeeded.
    bool double_buffered(size_t u) const;
    bool any_double_buffered() const;
    // Whether unit u updates a param of a custom optimizer (double-buffered or in place).
    bool has_custom(size_t u) const;
    // Whether unit u updates a param whose optimizer looks at the whole param (per-param
    // sums over the ranks, or the whole matrix on one rank): the step updates those params
    // in passes of their own.
    bool looks_at_whole_params(size_t u) const;
    // Whether a pass of the step reads several units' gradients at once: a unit is
    // double-buffered (custom optimizers) or looks at whole params.
    bool any_looks_beyond_a_unit() const;
    // The params the step updates whose optimizer needs `needs`, in index order (the same
    // list on every rank: the mask and the param groups agree), and this rank's segments
    // of them (their reduced gradients at `reduced`).
    std::vector<int32_t> params_needing(optim::Needs needs) const;
    std::vector<optim::Segment> segments_needing(const std::vector<float *> &reduced, optim::Needs needs) const;
    // The second slot buffers and the params' undo space of every double-buffered unit,
    // allocated where missing (nothing changes if an allocation fails).
    Status ensure_double_buffers();
    // After every rank's update succeeded: each double-buffered unit's new slots become
    // its state (the slots of params the step did not update carried over).
    void commit_double_buffers();
    // The sum of squares of unit u's reduced gradients (at `reduced`) times grad_scale.
    // The same split in two: the params that count in a norm domain's sum (*counted) and
    // the copies of replicated ones but copy 0 (*others), each in one pass over its segments.
    Status sum_of_squares(size_t u, float *reduced, float grad_scale, double *counted, double *others) const;
    Status sum_of_squares(size_t u, float *reduced, float grad_scale, double *out) const;

    // Bytes of params (this part's; stage 3's gathered ones are the gathers'), gradients
    // and optimizer state, as sx_memory_stats_t counts them.
    // *device: the bytes of all of them in the device's memory.
    void count_bytes(uint64_t *params, uint64_t *grads, uint64_t *optimizer, uint64_t *unsharded,
                     uint64_t *device) const;

  private:
    bool needs_accum(size_t u, bool accumulate) const;
    bool widens_in_update(size_t u, bool into_accum) const;
    bool reduces_in_16bit(size_t u) const;
    uint16_t *own_params16(size_t u) const { return static_cast<uint16_t *>(own_params(u)); }
    // reduce()'s offloaded path: the sum of this micro-batch's gradients into the device's
    // fp32 shard, then onto the host.
    Status reduce_on_device(size_t u, comm::Communicator &c, float **device_sum, int *slot);
    Status reduce_offloaded(size_t u, comm::Communicator &c, bool into_accum, float **shard_grad);
    // Elements [begin, end) of the host's shard of unit u's params to the device.
    Status upload(size_t u, uint64_t begin, uint64_t end);

    Settings settings_;
    DeviceOps *ops_ = nullptr;
    DeviceOps *state_ops_ = nullptr;
    trace::Tracer *tracer_ = nullptr;
    Table table_;
    std::vector<Unit> units_;
    Buffer reduce_scratch_;  // fp32 copy of one unit's 16-bit grads, for an fp32 reduction
    // Offloaded: one unit's fp32 sum of 16-bit gradients on the device, and on the host one
    // unit's micro-batch sum on its way into the accumulator.
    Buffer device_sum_[2], host_sum_;
    uint64_t device_sum_copy_[2] = {0, 0};  // the last copy out of each device sum
    int next_sum_ = 0;
    // Per unit: this rank's shard of its gradient buffer is zeroed by this step's update
    // (mark_zeroed_by_update), so that zero_grads() zeroes only the rest.
    std::vector<char> zeroed_by_update_;
};

}  // namespace core
}  // namespace sx
