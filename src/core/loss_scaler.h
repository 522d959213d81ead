// The loss scaler of a shard group: torch.cuda.amp.GradScaler's rule on the step's global
// gradient norm. Its settings (LossScaling: none, static or dynamic, with GradScaler's
// parameters) and its state (the scale, and the finite steps since it last changed) are
// its own; the step tells it what happened, and reads the scale.
#pragma once

#include "base/status.h"
#include "core/shard_state.h"

namespace sx {
namespace core {

class LossScaler {
  public:
    // SX_ERR_INVALID_ARGUMENT naming the field, or ok: a known mode, init_scale finite and
    // > 0, growth_factor finite and > 1, backoff_factor in (0, 1), growth_interval > 0.
    static Status validate(const LossScaling &s);

    // New settings (validated by the caller); the scale restarts at s.init_scale (1
    // without scaling) and the growth count at 0.
    void configure(const LossScaling &s);
    const LossScaling &settings() const { return settings_; }
    bool dynamic() const { return settings_.mode == SX_LOSS_SCALING_DYNAMIC; }
    // What the trainer multiplied its loss by: the gradients are divided by it. 1 without
    // scaling.
    double scale() const { return state_.scale; }
    // The state a checkpoint keeps, and its restoration (a load, a scatter of the state).
    const LossScalerState &state() const { return state_; }
    void restore(const LossScalerState &s) { state_ = s; }

    // A step was taken with finite gradients: dynamic scaling counts it, and multiplies
    // the scale by growth_factor after growth_interval of them in a row.
    void on_finite_step();
    // The gradients were not finite (the step skipped): dynamic scaling multiplies the
    // scale by backoff_factor and restarts the count.
    void on_nonfinite_step();

  private:
    LossScaling settings_;
    LossScalerState state_;
};

}  // namespace core
}  // namespace sx
