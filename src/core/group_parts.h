// A shard group's parts, and what they answer by themselves of the interfaces that
// checkpoints (ShardAccess: shard_state.h) and recovery (RecoveryAccess: lineage.h)
// reach a group through: the ranks, the layout, the param table, the shard's state and
// its restore, the counters, the lineage and the memory copies, and the group's failure.
//
// ShardGroup (group.h) is built on it: it assembles the parts, completes the interfaces
// with what needs its step and its pipeline (settle, keep_copy, export_shard,
// gather_params, agree_call, finalize, form), and holds the trainer's operations. The
// parts are its own: the step (stepper.h) and the pipeline (pipeline.h) get references
// to those they work on from it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/status.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "rdzv/store.h"
#include "core/agreement.h"
#include "core/device.h"
#include "core/failure.h"
#include "core/gathers.h"
#include "core/group_config.h"
#include "core/layout.h"
#include "core/lineage.h"
#include "core/loss_scaler.h"
#include "core/memory_copies.h"
#include "core/mesh.h"
#include "core/param_table.h"
#include "core/part_refs.h"
#include "core/round.h"
#include "core/shard_state.h"
#include "core/step_record.h"
#include "core/units.h"
#include "optim/thread_pool.h"

namespace sx {
namespace core {

class GroupParts : public RecoveryAccess {
  public:
    // --- the ranks, the layout and the table, as the parts hold them ---
    int rank() const override { return mesh_.rank(); }
    int world_size() const override { return mesh_.world_size(); }
    int shard_size() const override { return mesh_.shard_size(); }
    int shard_rank() const override { return mesh_.shard_rank(); }
    int replica_rank() const override { return mesh_.replica_rank(); }
    int stage() const override { return config_.stage; }
    int alignment() const override { return config_.alignment; }
    int timeout_ms() const override { return config_.timeout_ms; }
    int32_t num_params() const override { return table_.num_params(); }
    const ParamSpec &param(int32_t index) const override { return table_.params()[index]; }
    const Layout &layout() const override { return layout_; }
    const optim::Hyper &hyper(int32_t group) const override { return table_.groups()[group].hyper; }
    const LossScaling &loss_scaling() const override { return scaler_.settings(); }
    const GroupConfig &config() const override { return config_; }
    ParamTable &table() override { return table_; }
    const ParamTable &table() const override { return table_; }
    const Units &units() const { return units_; }  // each unit's memory (units.h)
    Status check_finalized() const override;
    Status build_layout(int shard_size, Layout *out) const override;

    // --- the shard and its counters ---
    Status restore_shard(const ShardRestore &r) override;
    ShardFence &shard_fence() override { return fence_; }
    DeviceOps &ops() override { return *ops_; }
    DeviceOps &state_ops() override { return state_ops_ ? *state_ops_ : *ops_; }
    UnitShard unit_shard(size_t u) const override { return units_.shard(u); }  // export_shard's, without its waits
    // (A restore writes the bf16 params of bf16_stochastic_round units themselves: a
    // checkpoint's fp32 copy of older ones, which gather_params would round over them,
    // goes first, once no save reads it.)
    Status ensure_masters() override {
        fence_.wait_readers();
        units_.drop_checkpoint_copies();
        return units_.ensure_masters();
    }
    uint64_t steps_taken() const override { return record_.steps(); }
    const LossScalerState &loss_scaler() const override { return scaler_.state(); }
    void continue_counters(uint64_t steps, const LossScaling &settings, const LossScalerState &state) override;

    // --- the lineage and the memory copies (recovery's) ---
    Lineage &lineage() override { return lineage_; }
    const Lineage &lineage() const override { return lineage_; }
    const MemoryCopies *memory_copies() const override { return copies_.get(); }
    void set_memory_copies(std::unique_ptr<MemoryCopies> copies) override { copies_ = std::move(copies); }
    std::unique_ptr<MemoryCopies> take_memory_copies() override { return std::move(copies_); }

    // --- the ranks together, and the group's failure ---
    Status collective(const std::function<Status(comm::Communicator &)> &fn) override;
    rdzv::Store &store() override { return mesh_.store(); }
    std::vector<int> exited_peers() const override { return mesh_.world().exited_peers(); }
    Status fail(Status s) override;
    Status check_usable() const override;
    bool aborted() const override { return failure_.aborted(); }
    void abort() override;  // any thread: collectives in flight fail, and later calls
    trace::Tracer *tracer() const override { return tracer_.get(); }

  protected:
    GroupParts() = default;
    // The parts the step and the pipeline share, by reference.
    PartRefs part_refs() {
        return {*this, config_, headers_, mesh_, ops_, table_, layout_, units_, round_, gathers_, pool_};
    }
    // Every communicator aborted; with a failure `why` (this rank's group failed, or
    // sx_abort), the peers' calls on a context's channels fail at once too.
    void abort_communicators(const Status &why = Status::Ok());

    GroupConfig config_;
    // First in, last out: every thread of the group (channels, pools) has ended before it goes.
    std::unique_ptr<trace::Tracer> tracer_;
    std::unique_ptr<CallHeaders> headers_;  // from the start: the mesh's agreement uses it
    Mesh mesh_;  // the ranks and their communicators (mesh.h)
    std::shared_ptr<optim::ThreadPool> pool_;  // a context's groups share its pool
    std::unique_ptr<DeviceOps> ops_;
    std::unique_ptr<DeviceOps> state_ops_;  // offloaded: the host's, where the state lives; else null

    ParamTable table_;  // the params, param groups and trainable flags (param_table.h)
    Layout layout_;
    Units units_;  // the units' memory on this rank (units.h)
    StepRecord record_;  // the steps taken, and each one's end (step_record.h)
    uint64_t checkpoints_ = 0;
    Lineage lineage_;  // the groups before this one (lineage.h)
    LossScaler scaler_;
    ShardFence fence_;
    // The parts with threads, after the communicators: the group ends them before anything
    // of it goes (~ShardGroup), as they reach its pipeline.
    std::unique_ptr<ReductionRound> round_;  // the gradient reductions (round.h)
    std::unique_ptr<Gathers> gathers_;       // the param gathers (gathers.h)
    std::unique_ptr<MemoryCopies> copies_;   // null without memory copies

    Failure failure_;  // the first failure, and sx_abort (failure.h)
    // Held by abort() while it wakes the collectives in flight, and by the destructor: the
    // owner's thread, woken by an sx_abort() from another thread, may destroy the group
    // at once, while abort() still runs in the communicator.
    std::mutex abort_mu_;
};

}  // namespace core
}  // namespace sx
