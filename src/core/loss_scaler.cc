#include "core/loss_scaler.h"

#include <cmath>

namespace sx {
namespace core {

Status LossScaler::validate(const LossScaling &s) {
    SX_CHECK_ARG(s.mode == SX_LOSS_SCALING_NONE || s.mode == SX_LOSS_SCALING_DYNAMIC || s.mode == SX_LOSS_SCALING_STATIC,
                 "loss scaling mode %d is not SX_LOSS_SCALING_NONE, _DYNAMIC or _STATIC", s.mode);
    SX_CHECK_ARG(std::isfinite(s.init_scale) && s.init_scale > 0, "init_scale = %g; it must be finite and > 0",
                 s.init_scale);
    SX_CHECK_ARG(std::isfinite(s.growth_factor) && s.growth_factor > 1, "growth_factor = %g; it must be finite and > 1",
                 s.growth_factor);
    SX_CHECK_ARG(s.backoff_factor > 0 && s.backoff_factor < 1, "backoff_factor = %g; it must be in (0, 1)",
                 s.backoff_factor);
    SX_CHECK_ARG(s.growth_interval > 0, "growth_interval = %lld; it must be > 0",
                 static_cast<long long>(s.growth_interval));
    return Status::Ok();
}

void LossScaler::configure(const LossScaling &s) {
    settings_ = s;
    state_ = LossScalerState();
    state_.scale = s.mode == SX_LOSS_SCALING_NONE ? 1.0 : s.init_scale;
}

void LossScaler::on_finite_step() {
    // torch.cuda.amp.GradScaler.update: growth after growth_interval finite steps in a row.
    if (dynamic() && ++state_.growth_tracker >= settings_.growth_interval) {
        state_.scale *= settings_.growth_factor;
        state_.growth_tracker = 0;
    }
}

void LossScaler::on_nonfinite_step() {
    if (!dynamic()) return;
    state_.scale *= settings_.backoff_factor;
    state_.growth_tracker = 0;
}

}  // namespace core
}  // namespace sx
