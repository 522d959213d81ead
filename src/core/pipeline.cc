// Units as a pipeline (docs/design.md, "Units as a pipeline"): a unit's gradients are
// reduced on the reduction channel while the trainer's backward goes on with earlier
// units, and its params gathered on the gather channel while its forward goes on with
// earlier ones; at stage 3 a unit's full params exist only while it is gathered.
//
// Ranks may signal units in different orders, and interleave their gathers and
// reductions differently; what every rank keeps the same is the order of the
// collectives on each channel: reductions in the round's order (agreed by all ranks),
// gathers in the order of the trainer's calls (collective, so the same everywhere) or,
// for the deferred gathers of stages 1 and 2, in the reverse of the reductions' order
// (the backward's order reversed: the forward's).
#include <algorithm>
#include <cstring>

#include "core/pipeline.h"

#include "core/stepper.h"

namespace sx {
namespace core {

// Waits for every collective in flight on both channels; their failure.
Status Pipeline::settle() {
    Status s = round_->drain();
    if (!s.ok()) return fail(s);
    // The gathers report their own failures (a disagreement on a header changes nothing).
    return gathers_->drain();
}

// ---------------------------------------------------------------------------------
// Reductions: the round (round.h) and what it asks of the group

Status Pipeline::agree_round(const Agreement &a) { return stepper_.agree(a, 0.0, nullptr); }

Status Pipeline::reduce_unit_grads(size_t u, bool accumulate, float **shard) {
    Status s = units_.reduce(u, mesh_.shard(), accumulate, shard);
    if (s.ok() && accumulate) {
        units_[u].accum_live = true;
        s = ops_->zero(units_[u].grads.data(), units_[u].grads.size());
    }
    return s.ok() ? s : fail(s);
}

// The round's agreement rides on its first reduction where the step's would
// (agreement_rider_unit's conditions, with the mask the round has applied already).
bool Pipeline::agreement_rides(bool accumulate) const {
    return !(accumulate && config_.stage == 1) && mesh_.world_size() > 1 && mesh_.replicas() == 1 &&
           mesh_.shard().carries_riders();
}

Status Pipeline::reduce_unit_grads_agreeing(size_t u, bool accumulate, const Agreement &a, float **shard) {
    SX_TRY(stepper_.reduce_agreeing(u, a, accumulate, 0.0, nullptr, shard));
    if (!accumulate) return Status::Ok();
    units_[u].accum_live = true;
    Status s = ops_->zero(units_[u].grads.data(), units_[u].grads.size());
    return s.ok() ? s : fail(s);
}

Status Pipeline::reduce_unit_replicas(size_t u, float *shard) { return stepper_.reduce_replicas(u, shard); }

Status Pipeline::fail_group(Status s) { return fail(s); }

bool Pipeline::usable() const { return check_usable().ok(); }

Status Pipeline::unit_sum_of_squares(size_t u, float *shard, float grad_scale, double *out) {
    Status s = units_.sum_of_squares(u, shard, grad_scale, out);
    return s.ok() ? s : fail(s);
}

// The checks every trainer's call on a unit starts with.
Status Pipeline::check_unit(int32_t unit) const {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    const int32_t n = static_cast<int32_t>(units_.size());
    SX_CHECK_ARG(unit >= 0 && unit < n, "unit index %d is out of range (%d units)", unit, n);
    return Status::Ok();
}

Status Pipeline::unit_grads_ready(int32_t unit, bool accumulate, void *stream) {
    SX_TRY(check_unit(unit));
    SX_TRY(round_->check_signal(unit, accumulate));
    // The trainer's writes into the unit's gradients first (a device: its stream).
    SX_TRY(ops_->wait_for(stream));
    if (!round_->open()) {
        // The round's mask, its allocations, and the ranks' agreement, which runs on the
        // reduction channel ahead of the reductions.
        std::vector<uint8_t> mask = stepper_.candidate_mask();
        SX_TRY(stepper_.prepare(mask, accumulate));
        std::vector<uint8_t> trainable(units_.size());
        for (size_t u = 0; u < units_.size(); ++u) trainable[u] = units_[u].trainable ? 1 : 0;
        const char *what = accumulate ? "sx_unit_grads_ready (accumulate)" : "sx_unit_grads_ready";
        Agreement a = stepper_.step_agreement(what, mask, 0.0, -1, false);
        round_->begin(accumulate, std::move(mask), std::move(trainable), std::move(a), stepper_.norm_scale());
    }
    round_->signal(unit);
    return Status::Ok();
}

// Ends the round (for step, or accumulate_grads): reduces what was
// not signalled, waits for every reduction, and checks that the ranks signalled the
// same units (SX_ERR_MISMATCH on every rank otherwise, the step's gradients then
// dropped); rank 0's order of signals becomes the order of the next rounds' reductions.
// The round then knows where unit u's reduced shard is, and *sumsq (step rounds; null
// for accumulate) the sum of squares of the reduced gradients over every rank, as
// global_norm gives it. a: what the ranks agree on (its mask and signals come from the
// round); weight: this rank's, summed over the ranks into *weight_sum (step rounds).
Status Pipeline::close_round(Agreement a, double weight, double *sumsq, double *weight_sum) {
    ReductionRound::World w;
    w.comm = &mesh_.world();
    w.rank = mesh_.rank();
    w.size = mesh_.world_size();
    w.shard_size = mesh_.shard_size();
    w.headers = headers_.get();
    w.params = &table_.params();
    bool dropped = false;
    Status s = round_->end(w, std::move(a), weight, sumsq, weight_sum, &dropped);
    if (dropped) {
        Status d = stepper_.finish_step(false);  // the ranks disagreed: this step's gradients go
        if (!d.ok()) return d;
    }
    return s;
}

// ---------------------------------------------------------------------------------
// Gathers

int32_t Pipeline::first_deferred_gather() const {
    if (config_.stage == 3 || mesh_.shard_size() == 1) return -1;
    const std::vector<int32_t> &order = round_->order();
    for (size_t k = order.size(); k-- > 0;)
        if (units_[order[k]].trainable) return order[k];
    return -1;
}

// After the update: the params of every trainable unit gathered (stages 1 and 2, now or
// deferred; `submitted`: a unit whose deferred gather is queued already), or (stage 3)
// the gathered units gathered again.
Status Pipeline::gather_after_update(bool defer, int32_t submitted) {
    if (config_.stage == 3) return gathers_->regather_held();  // the held units get the new values
    if (!defer) return stepper_.gather_trainable_units();
    // The forward reads the units in the reverse of the backward's order, which the ranks
    // agreed on for the reductions: gathered in that order, the unit the next forward
    // reads first is gathered first (first_deferred_gather(), which the step may have
    // submitted already).
    std::vector<int32_t> order;
    const std::vector<int32_t> &reductions = round_->order();
    for (size_t k = reductions.size(); k-- > 0;)
        if (units_[reductions[k]].trainable) order.push_back(reductions[k]);
    return gathers_->deferred(order, submitted);
}

Status Pipeline::unit_gather(int32_t unit) {
    SX_TRY(check_unit(unit));
    SX_TRACE_SPAN(tracer(), "step", "sx_unit_gather", layout_.units()[unit].unit_id);
    if (config_.stage != 3) return gathers_->wait(static_cast<size_t>(unit));
    return gathers_->gather(static_cast<size_t>(unit));
}

Status Pipeline::unit_release(int32_t unit) {
    SX_TRY(check_unit(unit));
    if (config_.stage != 3) return Status::Ok();
    return gathers_->release(static_cast<size_t>(unit));
}

Status Pipeline::check_param_present(int32_t param) const {
    if (config_.stage != 3 || !table_.finalized()) return Status::Ok();
    const int32_t u = layout_.placement(param).unit_index;
    SX_CHECK(gathers_->pins(static_cast<size_t>(u)) > 0, SX_ERR_INVALID_STATE,
             "param '%s' is in unit %d, which is not gathered: at stage 3 a param's values exist only between "
             "sx_unit_gather and sx_unit_release of its unit",
             table_.params()[param].name.c_str(), u);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
