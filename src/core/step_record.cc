// The record of the steps (step_record.h): counts, the all-zero warning, the result, and
// the nonfinite policy's verdict on a skipped step.
#include "core/step_record.h"

#include <cmath>

#include "base/log.h"
#include "optim/optimizer.h"

namespace sx {
namespace core {

Status check_step_options(const StepOptions &options) {
    SX_CHECK_ARG(std::isfinite(options.max_grad_norm) && options.max_grad_norm >= 0,
                 "max_grad_norm = %g; it must be finite and >= 0 (0 = no clipping)",
                 options.max_grad_norm);
    SX_CHECK_ARG(!options.weighted || (std::isfinite(options.weight) && options.weight >= 0),
                 "weight = %g; it must be finite and >= 0 (0: this rank had no data)", options.weight);
    return Status::Ok();
}

// A step was taken: per-param step counts, and the dynamic loss scale's growth.
void StepRecord::count(ParamTable &table, LossScaler &scaler, bool dynamic) const {
    // torch keeps the step count per param; SGD's momentum buffer has its own.
    for (size_t p = 0; p < table.params().size(); ++p) {
        if (!table.applied()[p]) continue;
        ParamSpec &spec = table.params()[p];
        const optim::Hyper &h = table.groups()[spec.group].hyper;
        spec.mu_product = optim::next_mu_product(h, spec.mu_product, spec.step + 1);
        ++spec.step;
        if (optim::spec_of(h.kind).step_count == optim::StepCount::kMomentumUpdates && h.momentum != 0)
            ++spec.momentum_steps;
    }
    for (ParamGroup &g : table.groups()) ++g.steps;
    if (dynamic) scaler.on_finite_step();
}

// Logs a warning when a step found every trainable gradient zero on every rank (the
// first such step in a row, then the 10th, 100th, ...).
void StepRecord::warn_if_no_gradient(double norm, bool any_trainable) {
    if (norm != 0.0 || !any_trainable) {
        zero_grad_steps_ = 0;
        return;
    }
    // The first step, then the 10th, 100th... in a row: enough to be seen, not a flood.
    const uint64_t n = ++zero_grad_steps_;
    uint64_t p = 1;
    while (p < n) p *= 10;
    if (p != n) return;
    log(SX_LOG_WARN,
        "sx_step: the gradients of every trainable param are zero on every rank (%llu step%s in a row): the "
        "optimizer applied weight decay and momentum alone. Is the backward writing into sx's grad views? (A "
        "torch user whose zero_grad() set .grad to None, or who replaced .grad, no longer writes there.)",
        static_cast<unsigned long long>(n), n == 1 ? "" : "s");
}

void StepRecord::report(double grad_norm, bool skipped, double loss_scale, StepResult *result) const {
    if (!result) return;
    result->grad_norm = grad_norm;
    result->step = steps_;
    result->skipped = skipped;
    result->loss_scale = loss_scale;
    result->nonfinite = !std::isfinite(grad_norm) || wrote_nonfinite_;
}

Status StepRecord::after_custom_skip(const Status &why, int nonfinite) {
    return why.code() == SX_ERR_NONFINITE && nonfinite == SX_NONFINITE_SKIP ? Status::Ok() : why;
}

Status StepRecord::after_nonfinite_norm(double norm, int nonfinite) {
    if (nonfinite == SX_NONFINITE_ERROR)
        return SX_ERROR(SX_ERR_NONFINITE,
                        "the gradients' global norm is %g: they hold inf or NaN (after the reduction over "
                        "the ranks); the step was skipped on every rank, and the gradients dropped",
                        norm);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
