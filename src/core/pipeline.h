// Units as a pipeline (docs/design.md, "Units as a pipeline"): the trainer's signals
// that a unit's gradients are ready, its gathers and releases of a unit at stage 3, and
// the step's use of them (the round's end, the gathers after the update). The parts that
// run the collectives are the round (round.h) and the gathers (gathers.h); this is what
// joins them to a shard group's parts (PartRefs) and its step (stepper.h), and what the
// round asks of the group (ReductionRound::Work).
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "core/agreement.h"
#include "core/part_refs.h"
#include "core/round.h"

namespace sx {
namespace core {

class Stepper;

class Pipeline : public ReductionRound::Work, private PartRefs {
  public:
    // The pipeline of the group whose parts these are, and of its step: the group owns
    // them and this, and they outlive it.
    Pipeline(const PartRefs &parts, Stepper &stepper) : PartRefs(parts), stepper_(stepper) {}
    Pipeline(const Pipeline &) = delete;
    Pipeline &operator=(const Pipeline &) = delete;

    // --- the trainer's calls (sx_step.h: sx_unit_grads_ready, sx_unit_gather, sx_unit_release) ---
    Status unit_grads_ready(int32_t unit, bool accumulate, void *stream);
    Status unit_gather(int32_t unit);  // collective at stage 3
    Status unit_release(int32_t unit);
    // At stage 3 a param's values may be viewed only while its unit is gathered.
    Status check_param_present(int32_t param) const;

    // --- the step's ---
    // Waits for every collective in flight on both channels; their failure.
    Status settle();
    Status close_round(Agreement a, double weight, double *sumsq, double *weight_sum);
    Status gather_after_update(bool defer, int32_t submitted = -1);
    int32_t first_deferred_gather() const;

  private:
    // --- what the round asks of the group (ReductionRound::Work: round.h) ---
    Status agree_round(const Agreement &a) override;
    Status reduce_unit_grads(size_t u, bool accumulate, float **shard) override;
    bool agreement_rides(bool accumulate) const override;
    Status reduce_unit_grads_agreeing(size_t u, bool accumulate, const Agreement &a, float **shard) override;
    Status reduce_unit_replicas(size_t u, float *shard) override;
    Status unit_sum_of_squares(size_t u, float *shard, float grad_scale, double *out) override;
    Status fail_group(Status s) override;
    bool usable() const override;

    Status check_unit(int32_t unit) const;  // usable, finalized, and unit in range
    Stepper &stepper_;  // the agreement, the reductions and the gathers it runs for the step
};

}  // namespace core
}  // namespace sx
