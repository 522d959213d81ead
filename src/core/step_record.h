// The step's options and result (sx_step in sx.h), and what the steps leave behind: the
// count of steps taken, a taken step's per-param and per-group counts and the dynamic
// loss scale's growth, the warning for steps whose gradients were all zero, whether a
// step's custom updates wrote inf or NaN, each step's result, and what the nonfinite
// policy makes of a skipped step (core/step.cc has the step's order of work).
#pragma once

#include <cstdint>

#include "base/status.h"
#include "core/loss_scaler.h"
#include "core/param_table.h"
#include "sx/sx.h"

namespace sx {
namespace core {

struct StepOptions {
    double max_grad_norm = 0.0;
    // Uneven inputs: the gradients are sums over this rank's `weight` samples, and the
    // step divides their sum over the ranks by the sum of the weights.
    bool weighted = false;
    double weight = 0.0;
    bool keep_grads = false;
    void *stream = nullptr;  // CUDA: the trainer's stream, whose work the step follows
    // Stages 1 and 2: return after the update; the params are all-gathered in the
    // background, unit by unit (unit_gather waits for one).
    bool defer_gather = false;
    int nonfinite = SX_NONFINITE_DEFAULT;  // SX_NONFINITE_*
};

// SX_ERR_INVALID_ARGUMENT naming the option, or ok: max_grad_norm finite and >= 0, a
// weighted step's weight finite and >= 0.
Status check_step_options(const StepOptions &options);

struct StepResult {
    double grad_norm = 0.0;
    uint64_t step = 0;
    bool skipped = false;
    double loss_scale = 1.0;  // for the next losses
    bool nonfinite = false;   // the norm was inf or NaN
};

// The group's record of its steps. Used by the group's owner thread only.
class StepRecord {
  public:
    uint64_t steps() const { return steps_; }
    void set_steps(uint64_t steps) { steps_ = steps; }  // a load's, a regroup's
    // A step was taken (every rank took it): torch's per-param step counts (SGD's
    // momentum buffer has its own) and NAdam's mu product for the params `table` applied
    // the update to, every param group's count, and the dynamic loss scale's growth.
    void count(ParamTable &table, LossScaler &scaler, bool dynamic) const;
    void advance() { ++steps_; }  // the step is over
    // What the step's custom updates wrote: nothing inf or NaN yet, and then as they say.
    void begin_update() { wrote_nonfinite_ = false; }
    void note_nonfinite(bool wrote) { wrote_nonfinite_ = wrote_nonfinite_ || wrote; }
    void set_nonfinite(bool wrote) { wrote_nonfinite_ = wrote; }
    // A log warning the first, 10th, 100th... step in a row whose global norm is 0 while
    // some unit is trainable: the trainer's backward is not writing into sx's grad views.
    void warn_if_no_gradient(double norm, bool any_trainable);
    // The step's result for the caller (nothing where `result` is null).
    void report(double grad_norm, bool skipped, double loss_scale, StepResult *result) const;

    // What a step skipped for custom updates that failed on some rank (`why`:
    // SX_ERR_OPTIMIZER) or wrote inf or NaN (SX_ERR_NONFINITE) returns: success where
    // `nonfinite` (SX_NONFINITE_*) is SX_NONFINITE_SKIP and they wrote inf or NaN, else why.
    static Status after_custom_skip(const Status &why, int nonfinite);
    // What a step skipped for gradients whose global norm is inf or NaN returns:
    // SX_ERR_NONFINITE under SX_NONFINITE_ERROR, else success.
    static Status after_nonfinite_norm(double norm, int nonfinite);

  private:
    uint64_t steps_ = 0;
    uint64_t zero_grad_steps_ = 0;  // steps in a row whose gradients were all zero
    bool wrote_nonfinite_ = false;  // this step's custom updates wrote inf or NaN
};

}  // namespace core
}  // namespace sx
