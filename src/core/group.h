// A shard group: this rank's view of the ranks training one model together, its
// param table and param groups, the flat buffers, the optimizer state of its shard,
// and the step (docs/design.md, "The step"). Its parts and what they answer of the
// interfaces checkpoints and recovery see are in group_parts.h, the step in stepper.h,
// units as a pipeline in pipeline.h.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/memory.h"
#include "base/status.h"
#include "base/trace.h"
#include "comm/communicator.h"
#include "rdzv/store.h"
#include "core/agreement.h"
#include "core/channel.h"
#include "core/gathers.h"
#include "core/device.h"
#include "core/failure.h"
#include "core/group_parts.h"
#include "core/group_config.h"
#include "core/layout.h"
#include "core/lineage.h"
#include "core/loss_scaler.h"
#include "core/memory_copies.h"
#include "core/mesh.h"
#include "core/param_table.h"
#include "core/params.h"
#include "core/pipeline.h"
#include "core/round.h"
#include "core/units.h"
#include "core/whole_state.h"
#include "core/whole_values.h"
#include "core/shard_state.h"
#include "core/step_record.h"
#include "core/stepper.h"
#include "optim/optimizer.h"
#include "optim/thread_pool.h"

namespace sx {
namespace core {


// FSDP's gradient pre-divide factor for a 16-bit sum over n ranks: f doubled from 1
// while it divides n and n / f > f (2 for 4 ranks, 4 for 8 or 16, 32 for 1024).
int fsdp_predivide_factor(int n);

struct MemoryStats {
    uint64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;  // staging is the checkpointer's
    uint64_t unsharded_optimizer_bytes = 0;
    uint64_t peak_param_bytes = 0;  // the most param_bytes held at once since finalize
    uint64_t memory_copy_bytes = 0;  // memory_copies.h
    uint64_t device_bytes = 0;       // of the above, those in the device's memory
};

// The group proper: it assembles its parts (group_parts.h), completes ShardAccess and
// RecoveryAccess with what needs its step and its pipeline, and holds the trainer's
// operations. Thread safety as sx.h says of each call.
class ShardGroup : public GroupParts {
  public:
    // Each public operation is one of sx.h's, whose contract is there ("collective": every rank, in order).
    static Status create(const GroupConfig &config, std::unique_ptr<ShardGroup> *out);
    ~ShardGroup();
    // --- what checkpoints and recovery see besides the parts' answers (ShardAccess:
    // shard_state.h; RecoveryAccess: lineage.h) ---
    Status export_shard(ShardState *out) override;
    Status gather_params() override;
    Status agree_call(const char *call, std::vector<Fact> facts, const Status &local = Status::Ok(),
                      const char *intro = "ranks disagree") override;
    bool between_steps() const override { return stepper_.between_steps(); }
    Status settle() override { return pipeline_.settle(); }
    Status keep_copy(bool send) override { return stepper_.keep_copy(send); }
    Status form(const GroupConfig &c, const std::string &trace_path, Clock::time_point deadline,
                std::shared_ptr<rdzv::Store> store, std::unique_ptr<RecoveryAccess> *out) const override;

    // --- the group ---
    MemoryStats memory_stats() const;
    Status flush_trace();  // the step timeline's file written now (docs/tracing.md)

    // --- the param table (param_table.h: registration, trainable flags, what is laid out) ---
    Status finalize() override;  // collective: lays out what was added; laid-out units stay as they are
    Status set_hyperparameter(int32_t group, int32_t key, double value);  // amsgrad: before the first step
    Status refresh_trainable();

    // --- params and views ---
    void *param_data(int32_t param) const;  // of the param's dtype
    void *grad_data(int32_t param) const;   // of grad_dtype(param)
    int32_t grad_dtype(int32_t param) const;
    // Unit u's whole flat buffer of params or gradients (sx_unit_view). Stage 3: params
    // only while u is gathered.
    Status unit_buffer(int32_t u, bool grad, void **data, uint64_t *numel, int32_t *dtype) const;
    Status broadcast_params(int root);                             // collective
    Status all_reduce(double *values, int32_t count, int32_t op);  // collective

    // --- the step (stepper.h), units as a pipeline (pipeline.h: the trainer's calls on a unit), loss scaling ---
    Pipeline &pipeline() { return pipeline_; }
    const Pipeline &pipeline() const { return pipeline_; }
    Status accumulate_grads() { return stepper_.accumulate_grads(); }  // collective
    Status step(const StepOptions &options, StepResult *result) { return stepper_.step(options, result); }  // collective
    uint64_t reductions_run() const { return round_->reductions_run(); }  // any thread
    const std::vector<int32_t> &deferred_gather_order() const { return gathers_->deferred_order(); }
    Status set_loss_scaling(const LossScaling &s);  // resets the scale to s.init_scale
    // Collective over the domain: joins it as model-parallel slice `slice` (norm_domain.cc).
    Status join_norm_domain(std::shared_ptr<NormDomain> domain, int32_t slice);

    // --- whole params' optimizer state (whole_state.h), and this rank's part of it ---
    Status gather_state(int root, const StateFn &fn);   // collective
    Status scatter_state(int root, const StateFn &fn);  // collective
    // --- whole params' values (whole_values.h): the interop calls' exchange ---
    // Collective: `name` and `what` (the path, which every rank must give alike) are the
    // call's header the ranks agree on first. *note: the root plan's note, on every rank.
    Status values_call(const char *name, const std::string &what, int root, bool gather, const ValuesCall &call,
                       std::string *note);
    // sx_state_view: where this rank's piece of a state tensor is, and in which SX_DTYPE_*
    // (packed state in its own: bf16, or 8-bit codes, and "<slot>.scale" their scales).
    struct StateViewOut {
        void *data = nullptr;
        uint64_t numel = 0;
        int32_t dtype = SX_DTYPE_F32;
    };
    Status state_view(int32_t param, const char *tensor, StateViewOut *out);
    // The same where the caller takes fp32 only (SX_ERR_UNSUPPORTED for packed state).
    Status state_view(int32_t param, const char *tensor, void **data, uint64_t *numel) {
        StateViewOut out;
        SX_TRY(state_view(param, tensor, &out));
        SX_CHECK(out.dtype == SX_DTYPE_F32, SX_ERR_UNSUPPORTED, "the state '%s' of param %d is not fp32", tensor, param);
        *data = out.data;
        *numel = out.numel;
        return Status::Ok();
    }

  private:
    using Unit = Units::Unit;
    ShardGroup() = default;
    // A group of `config`'s rank and world size (resolved) on the store `open_store`
    // opens: the device, the mesh's communicators, the units' machinery. create's and
    // regroup's common part.
    static Status assemble(const GroupConfig &config, const std::string &trace_path, Clock::time_point deadline,
                           const std::function<Status(std::shared_ptr<rdzv::Store> *)> &open_store,
                           std::unique_ptr<ShardGroup> *out);
    // create's for a group of config.context (context.h): the context's rendezvous, ranks,
    // pool and transport, in a key space of the group's own.
    static Status create_in_context(const GroupConfig &config, std::unique_ptr<ShardGroup> *out);
    // Each private function's contract is at its definition.
    Status broadcast_gathered(int root);
    Status fits_budget();
    Status make_device();
    char *params_base(size_t u) const;  // unit u's whole params (stage 3: the gathers')
    Status whole_call_header(const std::string &call, int root, WholeState::Mesh *mesh);  // full_state.cc
    Status whole_state_call(const char *name, int root, bool gather, const StateFn &fn);  // full_state.cc

    // Units as a pipeline (pipeline.h) and the step (stepper.h), on the parts.
    Pipeline pipeline_{part_refs(), stepper_};
    Stepper stepper_{{part_refs(), record_, lineage_, scaler_, fence_, pipeline_, copies_}};
};

}  // namespace core
}  // namespace sx
