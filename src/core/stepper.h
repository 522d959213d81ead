// The step (docs/design.md, "The step"): a shard group's part that reduces the
// gradients into this rank's shards (or accumulates a micro-batch), takes their global
// norm, updates the shards, gathers the params, and ends the step (its counts, its
// skips, the memory copy due at its boundary). It also holds what the ranks agree on for
// the step's family of calls (agreement.h) and the trainable mask they apply.
//
// It works on the group's parts, which the group hands it by reference (StepParts) and
// owns together with it; the group's failure, checks and trace it reaches through
// ShardAccess (PartRefs).
// step.cc has the step's order of work, step_update.cc the update and the norm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/trace.h"
#include "core/agreement.h"
#include "core/device.h"
#include "core/gathers.h"
#include "core/group_config.h"
#include "core/layout.h"
#include "core/lineage.h"
#include "core/loss_scaler.h"
#include "core/memory_copies.h"
#include "core/mesh.h"
#include "core/norm_domain.h"
#include "core/param_table.h"
#include "core/part_refs.h"
#include "core/round.h"
#include "core/shard_state.h"
#include "core/step_passes.h"
#include "core/step_record.h"
#include "core/units.h"

namespace sx {
namespace core {

class Pipeline;

// The parts the step works on besides those it shares with the pipeline (PartRefs),
// held the same way: references to the group's own.
struct StepParts : PartRefs {
    StepRecord &record_;
    Lineage &lineage_;
    LossScaler &scaler_;
    ShardFence &fence_;
    Pipeline &pipeline_;
    std::unique_ptr<MemoryCopies> &copies_;
};

class Stepper : private StepParts {
  public:
    explicit Stepper(const StepParts &parts) : StepParts(parts) {}
    Stepper(const Stepper &) = delete;
    Stepper &operator=(const Stepper &) = delete;

    // --- the group's calls (sx_step.h: sx_step, sx_accumulate_grads); collective ---
    Status step(const StepOptions &options, StepResult *result);
    Status accumulate_grads();
    // No reduction round open and no micro-batch accumulated.
    bool between_steps() const;
    // The norm domain (norm_domain.h) joined as slice `slice`; null: none.
    const std::shared_ptr<NormDomain> &norm_domain() const { return domain_; }
    void join_norm_domain(std::shared_ptr<NormDomain> domain, int32_t slice) {
        domain_ = std::move(domain);
        slice_ = slice;
    }
    // Copies the live shard into the memory copies (sent to the peers where `send`).
    Status keep_copy(bool send);
    // What a memory copy or a checkpoint holds besides the tensors.
    ShardProgress progress() const;

    // --- what the ranks agree on, and the mask they apply (also the pipeline's and the
    // whole-state calls'); each one's contract is at its definition ---
    std::vector<uint8_t> candidate_mask() const;
    Status prepare(const std::vector<uint8_t> &mask, bool accumulate = false);
    Agreement step_agreement(const char *call, std::vector<uint8_t> mask, double max_grad_norm, int defer_gather,
                             bool weighted) const;
    Status agree(const Agreement &a, double weight, double *weight_sum);

    // --- the reductions and gathers the pipeline runs for the step ---
    Status reduce_agreeing(size_t u, const Agreement &a, bool accumulate, double weight, double *weight_sum,
                           float **shard);
    Status reduce_replicas(size_t u, float *shard);
    float norm_scale() const;
    Status finish_step(bool keep_grads);
    Status gather_trainable_units(const double *local_sumsq = nullptr, double *sumsq = nullptr);

  private:
    // --- the reduction and the update's order (step.cc) ---
    Status reduce_for_step(const StepOptions &options, double *weight_sum, bool *have_sumsq, double *sumsq);
    Status reduce_here(const Agreement &a, bool accumulate, double weight, double *weight_sum);
    int32_t agreement_rider_unit(const Agreement &a, bool accumulate) const;
    Status sum_over_ranks(double local, double *total);
    Status prepare_shard_for_update();
    Status update_shard(float grad_scale, int32_t head, int nonfinite, double *sumsq);
    Status upload_params(size_t u);
    Status update_offloaded_units(float grad_scale, int32_t head, int nonfinite, double *sumsq, uint64_t *updated);
    StepPasses step_passes();  // step_passes.cc: what the passes over whole params see
    // --- the update's passes and the norm (step_update.cc) ---
    bool norm_rides_gather(bool defer_gather) const;
    Status update_double_buffered(float grad_scale, int nonfinite, double *sumsq);
    Status update_in_place(const std::vector<optim::Segment> &segs, float grad_scale, int nonfinite, double *sumsq);
    Status global_norm(double *sumsq);
    Status domain_norm(const StepOptions &options, double *sumsq, StepResult *result);
    // --- the step's end, taken or skipped (step.cc) ---
    Status end_step(const StepOptions &options, bool dynamic, double norm, StepResult *result);
    Status keep_due_copy();
    Status skip_step(const StepOptions &options, double norm, StepResult *result);
    Status skip_nonfinite(const StepOptions &options, double norm, StepResult *result);
    Status skip_custom(const Status &why, const StepOptions &options, double norm, StepResult *result);

    using Unit = Units::Unit;
    int micro_batches_ = 0;  // accumulate_grads calls since the last step
    std::shared_ptr<NormDomain> domain_;  // the norm domain joined (norm_domain.h), or null
    int32_t slice_ = -1;                  // this group's model-parallel slice in it
};

}  // namespace core
}  // namespace sx
