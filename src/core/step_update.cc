// The step's update of this rank's shard, in the passes update_shard (step.cc) runs: the
// segments updated in place and the double-buffered units of custom optimizers; and the
// global norm of the gradients where the step needs it before the update.
#include <algorithm>
#include <cmath>

#include "core/stepper.h"

namespace sx {
namespace core {
namespace {

// Every rank of a norm domain steps with the same loss scale (word 3), max_grad_norm (4),
// loss scaling mode (5) and nonfinite policy (6); else SX_ERR_MISMATCH naming the first
// rank that differs from rank 0.
Status same_step_settings(const std::vector<double> &all, int me) {
    static const char *const kWhat[] = {"", "", "", "loss scale", "options->max_grad_norm", "loss scaling mode",
                                        "options->nonfinite"};
    const size_t K = NormDomain::kWords;
    for (size_t r = K; r < all.size(); r += K)
        for (size_t w = 3; w <= 6; ++w)
            SX_CHECK(all[r + w] == all[w] || (std::isnan(all[r + w]) && std::isnan(all[w])), SX_ERR_MISMATCH,
                     "norm domain: the groups' steps differ: %s is %g on domain rank %zu and %g on domain rank 0 "
                     "(this is domain rank %d); every group of a norm domain steps with the same max_grad_norm, "
                     "nonfinite policy and loss scaling. The step was skipped on every rank of the domain",
                     kWhat[w], all[r + w], r / K, all[w], me);
    return Status::Ok();
}

}  // namespace

// Segments updated in place: sx's kernels, and the functions of custom optimizers
// registered SX_OPTIMIZER_IN_PLACE, whose failure fails the group (the step is half done),
// as inf or NaN they write do where the nonfinite policy would skip the step (it cannot
// be undone); SX_NONFINITE_DEFAULT keeps them, and the step reports them.
Status Stepper::update_in_place(const std::vector<optim::Segment> &segs, float grad_scale, int nonfinite,
                                double *sumsq) {
    const auto is_custom = [](const optim::Segment &seg) { return optim::is_custom(seg.hyper->kind); };
    if (std::none_of(segs.begin(), segs.end(), is_custom))
        return units_.state_ops().fused_update(segs.data(), segs.size(), grad_scale, sumsq);
    std::vector<optim::Segment> builtin, custom;
    for (const optim::Segment &seg : segs) (is_custom(seg) ? custom : builtin).push_back(seg);
    double a = 0.0, b = 0.0;
    DeviceOps &ops = units_.state_ops();  // where the state lives (offloaded: the host)
    SX_TRY(ops.fused_update(builtin.data(), builtin.size(), grad_scale, sumsq ? &a : nullptr));
    optim::CustomFailure failure;
    bool ok = true;
    SX_TRY(ops.custom_update(custom.data(), custom.size(), grad_scale, sumsq ? &b : nullptr, &failure, &ok));
    if (!ok)
        return fail(SX_ERROR(SX_ERR_OPTIMIZER,
                             "the custom optimizer '%s' returned %d updating param '%s' on rank %d%s%s; it updates in "
                             "place (SX_OPTIMIZER_IN_PLACE), so the step is half done and the group has failed",
                             failure.optimizer, failure.code, table_.params()[failure.param].name.c_str(), mesh_.rank(),
                             failure.message.empty() ? "" : ": ", failure.message.c_str()));
    if (failure.nonfinite > 0 && nonfinite != SX_NONFINITE_DEFAULT)
        return fail(SX_ERROR(SX_ERR_NONFINITE,
                             "the custom optimizer '%s' wrote inf or NaN into param '%s' (its values or its state) on "
                             "rank %d; options->nonfinite would skip the step, but the optimizer updates in place "
                             "(SX_OPTIMIZER_IN_PLACE), so the step is half done and the group has failed",
                             failure.nonfinite_optimizer, table_.params()[failure.nonfinite_param].name.c_str(),
                             mesh_.rank()));
    record_.note_nonfinite(failure.nonfinite > 0);
    if (sumsq) *sumsq = a + b;
    return Status::Ok();
}

// The double-buffered units' update (optim/custom.h), kept only if it succeeded on every
// rank, else undone on every rank: SX_ERR_OPTIMIZER, and nothing has changed. Inf or NaN
// that a custom update wrote anywhere are judged by the step's nonfinite policy, as the
// gradients' are: kept (SX_NONFINITE_DEFAULT: the step reports them), or undone on every
// rank and SX_ERR_NONFINITE returned for the step to end as a skipped one.
Status Stepper::update_double_buffered(float grad_scale, int nonfinite, double *sumsq) {
    SX_TRY(units_.ensure_double_buffers());
    const std::vector<optim::Segment> segs = units_.segments(round_->reduced(), -1, true);
    optim::CustomFailure failure;
    bool ok = true;
    SX_TRY(units_.state_ops().custom_update(segs.data(), segs.size(), grad_scale, sumsq, &failure, &ok));
    // Every rank learns how many failed and how many inf/NaN were written (replicas of a
    // mesh too: each updates its own copy).
    double failed = ok ? 0.0 : 1.0, bad = static_cast<double>(failure.nonfinite);
    if (mesh_.world_size() > 1) {
        std::vector<double> all(2 * static_cast<size_t>(mesh_.world_size()), 0.0);
        all[2 * static_cast<size_t>(mesh_.rank())] = failed;
        all[2 * static_cast<size_t>(mesh_.rank()) + 1] = bad;
        Status s = mesh_.world().all_gather(all.data(), 2 * sizeof(double));
        if (!s.ok()) return fail(s);
        failed = bad = 0.0;
        for (size_t r = 0; r < all.size(); r += 2) {
            failed += all[r];
            bad += all[r + 1];
        }
    }
    const bool skip_nonfinite = bad > 0.0 && nonfinite != SX_NONFINITE_DEFAULT;
    if (failed == 0.0 && !skip_nonfinite) {
        units_.commit_double_buffers();
        record_.note_nonfinite(bad > 0.0);
        return Status::Ok();
    }
    SX_TRY(units_.state_ops().undo_double_buffered(segs.data(), segs.size()));
    if (!ok)
        return SX_ERROR(SX_ERR_OPTIMIZER,
                        "the custom optimizer '%s' returned %d updating param '%s' on rank %d%s%s: the step changed "
                        "nothing on any rank (params and optimizer state are as before it) and dropped the gradients",
                        failure.optimizer, failure.code, table_.params()[failure.param].name.c_str(), mesh_.rank(),
                        failure.message.empty() ? "" : ": ", failure.message.c_str());
    if (failed > 0.0)
        return SX_ERROR(SX_ERR_OPTIMIZER,
                        "a custom optimizer's update reported failure on %g other rank%s (see its error there): the "
                        "step changed nothing on any rank (params and optimizer state are as before it) and dropped "
                        "the gradients",
                        failed, failed == 1.0 ? "" : "s");
    if (failure.nonfinite_param >= 0)
        return SX_ERROR(SX_ERR_NONFINITE,
                        "the custom optimizer '%s' wrote inf or NaN into param '%s' (its values or its state) on rank "
                        "%d, %g values on all ranks: the step was skipped on every rank (options->nonfinite), nothing "
                        "changed, and the gradients were dropped",
                        failure.nonfinite_optimizer, table_.params()[failure.nonfinite_param].name.c_str(),
                        mesh_.rank(), bad);
    return SX_ERROR(SX_ERR_NONFINITE,
                    "a custom optimizer wrote %g inf or NaN values on other ranks (see the error there): the step was "
                    "skipped on every rank (options->nonfinite), nothing changed, and the gradients were dropped",
                    bad);
}

// The gradient scale of the norm: the average over the ranks and the loss scale (1 /
// (world_size x scale)), as torch takes the norm of the averaged gradients.
float Stepper::norm_scale() const {
    return static_cast<float>(1.0 / (static_cast<double>(mesh_.world_size()) * scaler_.scale()));
}

// Collective: the sum of squares of the reduced gradients times norm_scale() over every
// rank's segments (inf or NaN where one is), unit by unit as an overlapped step sums
// them.
Status Stepper::global_norm(double *sumsq) {
    SX_TRACE_SPAN(tracer(), "step", "grad_norm");
    // Unit by unit, added in unit order, then over the ranks in rank order: the same sum,
    // bit for bit, as the reduction channel's per-unit sums give an overlapped step.
    double local = 0.0;
    for (size_t u = 0; u < units_.size(); ++u) {
        double part = 0.0;
        Status s = units_.sum_of_squares(u, round_->reduced(u), norm_scale(), &part);
        if (!s.ok()) return fail(s);
        local += part;
    }
    return sum_over_ranks(local, sumsq);
}

// Collective over the norm domain (norm_domain.h): the sum of squares of every group's
// reduced gradients (times each group's norm_scale()), each replicated param's on its copy
// 0 alone, added in domain rank order on every rank; inf or NaN where any gradient of any
// rank is, counted or not. The groups' options and loss scales are compared in the same
// exchange: where they differ, the step is skipped on every rank of the domain (nothing
// changes, the gradients go) and SX_ERR_MISMATCH says what differs.
Status Stepper::domain_norm(const StepOptions &options, double *sumsq, StepResult *result) {
    SX_TRACE_SPAN(tracer(), "step", "domain_norm");
    double counted = 0.0, others = 0.0;
    for (size_t u = 0; u < units_.size(); ++u) {
        double c = 0.0, o = 0.0;
        Status s = units_.sum_of_squares(u, round_->reduced(u), norm_scale(), &c, &o);
        if (!s.ok()) return fail(s);
        counted += c;
        others += o;
    }
    // A mesh's replica groups hold the same shards: the first one's ranks count them.
    const bool counts = mesh_.replica_rank() == 0;
    const NormDomain::Words mine = {NormDomain::kStep, counts ? counted : 0.0,
                                    counts && !std::isfinite(others) ? others : 0.0, scaler_.scale(),
                                    options.max_grad_norm, static_cast<double>(scaler_.settings().mode),
                                    static_cast<double>(options.nonfinite), static_cast<double>(slice_)};
    std::vector<double> all;
    Status s = domain_->exchange(mine, &all);
    if (!s.ok()) return fail(s);
    Status agreed = domain_->same_call(all, NormDomain::kStep, "sx_step");
    if (agreed.ok()) agreed = same_step_settings(all, domain_->rank());
    if (!agreed.ok()) {
        SX_TRY(skip_step(options, 0.0, result));
        return agreed;
    }
    double sum = 0.0;
    for (size_t r = 0; r < all.size(); r += NormDomain::kWords) {
        sum += all[r + 1];
        sum += all[r + 2];  // 0 (exact) unless a replica's gradient was inf or NaN
    }
    *sumsq = sum;
    return Status::Ok();
}

// Whether the step's gradient norm (when the update computed it) can ride on the params'
// all-gather: gathered now, over a transport that carries riders, a unit to gather.
bool Stepper::norm_rides_gather(bool defer_gather) const {
    if (config_.stage == 3 || defer_gather || mesh_.shard_size() == 1 || !mesh_.shard().carries_riders())
        return false;
    for (size_t u = 0; u < units_.size(); ++u)
        if (units_[u].trainable && layout_.units()[u].shard_numel > 0) return true;
    return false;
}

}  // namespace core
}  // namespace sx
