// Units as a pipeline (docs/design.md, "Units as a pipeline"): a unit's gradients are
// reduced on the reduction channel while the trainer's backward goes on with earlier
// units, and its params gathered on the gather channel while its forward goes on with
// earlier ones; at stage 3 a unit's full params exist only while it is gathered.
//
// Ranks may signal units in different orders, and interleave their gathers and
// reductions differently; what every rank keeps the same is the order of the
// collectives on each channel: reductions in reduce_order_ (agreed by all ranks),
// gathers in the order of the trainer's calls (collective, so the same everywhere) or,
// for the deferred gathers of stages 1 and 2, in the reverse of the reductions' order
// (the backward's order reversed: the forward's).
#include <algorithm>
#include <cstring>

#include "core/group.h"

namespace sx {
namespace core {

CommChannel &ShardGroup::reduce_channel() {
    if (!reduce_channel_) reduce_channel_.reset(new CommChannel("the gradient reductions"));
    return *reduce_channel_;
}

Status ShardGroup::settle() {
    Status s;
    if (reduce_channel_) s = reduce_channel_->drain();
    if (replica_channel_) {
        Status r = replica_channel_->drain();
        if (s.ok()) s = r;
    }
    if (!s.ok()) return fail(s);
    // The gathers report their own failures (a disagreement on a header changes nothing).
    return gathers_ ? gathers_->drain() : s;
}

// ---------------------------------------------------------------------------------
// Reductions

Status ShardGroup::open_round(bool accumulate) {
    std::vector<uint8_t> mask = candidate_mask();
    SX_TRY(prepare(mask, accumulate));
    unit_sumsq_.assign(units_.size(), 0.0);
    Round r;
    r.open = true;
    r.accumulate = accumulate;
    r.mask = mask;
    r.signalled.assign(units_.size(), 0);
    round_ = std::move(r);
    // The ranks agree on the mask (and all else the step's agreement covers) before any
    // reduction: a disagreement then changes nothing. It runs on the channel, ahead of
    // the reductions, so that this call does not wait for the other ranks.
    const char *what = accumulate ? "sx_unit_grads_ready (accumulate)" : "sx_unit_grads_ready";
    // What the ranks agree on is taken now, on the trainer's thread: by the time the job
    // runs, the trainer may be changing a hyperparameter for the step.
    reduce_channel().submit([this, a = step_agreement(what, mask, 0.0, -1, false)] { return agree(a, 0.0, nullptr); });
    return Status::Ok();
}

void ShardGroup::submit_reductions(bool all) {
    while (round_.next < reduce_order_.size()) {
        const int32_t u = reduce_order_[round_.next];
        if (!all && !round_.signalled[u]) return;
        ++round_.next;
        // Frozen units are not communicated; stage 1 keeps a micro-batch's gradients in
        // place until the step.
        if (!units_[u].trainable || (round_.accumulate && config_.stage == 1)) continue;
        const bool accumulate = round_.accumulate;
        const float grad_scale = norm_scale();
        reduce_channel().submit([this, u, accumulate, grad_scale]() -> Status {
            float *shard = nullptr;
            Status s = reduce_unit(static_cast<size_t>(u), accumulate, &shard);
            if (s.ok() && accumulate) {
                units_[u].accum_live = true;
                s = ops_->zero(units_[u].grads.data(), units_[u].grads.size());
            }
            if (!s.ok()) return fail(s);
            reduced_[u] = shard;
            // The last micro-batch: the replicas' all-reduce of the shard (on a channel of
            // its own, so that it overlaps the next unit's reduce-scatter), then the
            // unit's part of the step's norm, while the backward goes on.
            auto finish = [this, u, shard, grad_scale, accumulate]() -> Status {
                Status f = accumulate ? Status::Ok() : reduce_replicas(static_cast<size_t>(u), shard);
                if (f.ok() && !accumulate) {
                    SX_TRACE_SPAN(tracer(), "step", "grad_norm", layout_.units()[u].unit_id);
                    f = unit_sumsq(static_cast<size_t>(u), grad_scale, &unit_sumsq_[u]);
                }
                if (!f.ok()) return fail(f);
                ++reductions_run_;
                return Status::Ok();
            };
            if (accumulate || replicas_ == 1) return finish();
            replica_channel_->submit(finish);
            return Status::Ok();
        });
    }
}

Status ShardGroup::unit_grads_ready(int32_t unit, bool accumulate, void *stream) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    const int32_t n = static_cast<int32_t>(units_.size());
    SX_CHECK_ARG(unit >= 0 && unit < n, "unit index %d is out of range (%d units)", unit, n);
    if (round_.open) {
        SX_CHECK_ARG(round_.accumulate == accumulate,
                     "unit %d is signalled with accumulate = %d, but this micro-batch's first signal said %d",
                     unit, accumulate ? 1 : 0, round_.accumulate ? 1 : 0);
        SX_CHECK(!round_.signalled[unit], SX_ERR_INVALID_STATE,
                 "unit %d's gradients were already signalled ready in this micro-batch", unit);
    }
    // The trainer's writes into the unit's gradients first (a device: its stream).
    SX_TRY(ops_->wait_for(stream));
    if (!round_.open) SX_TRY(open_round(accumulate));
    round_.signalled[unit] = 1;
    round_.order.push_back(unit);
    submit_reductions(false);
    return Status::Ok();
}

Status ShardGroup::close_round(Agreement a, double weight, double *sumsq, double *weight_sum) {
    submit_reductions(true);
    Round round = std::move(round_);
    round_ = Round();
    Status s;
    {
        // What the backward did not hide: the reductions still running when it ended.
        SX_TRACE_SPAN(tracer(), "step", "wait_reductions");
        s = reduce_channel().drain();
        // Every replica all-reduce was queued by a reduction, all of which have ended.
        if (s.ok() && replica_channel_) s = replica_channel_->drain();
    }
    if (!s.ok()) {
        // The ranks disagreed before anything was reduced: the channel ran nothing
        // after its agreement, on every rank. Anything else failed the group.
        if (s.code() == SX_ERR_MISMATCH && check_usable().ok()) reduce_channel().clear_failure();
        return s;
    }
    // One exchange, the call's header, ends the round. Each rank sends the fingerprint of
    // what it agrees on (the units signalled are part of it: a unit signalled on some
    // ranks only is a trainer's mistake that every rank reports; its gradients are reduced
    // by now, as the ranks reduced every unit in one order, so the step's gradients are
    // dropped), its weight, its sum of squares (the units' parts added in unit order),
    // and rank 0 whether the order of the next rounds' reductions changes: its signals in
    // its order, then the units it did not signal in the old order. Rank 0 then sends the
    // new order, which after the first steps it seldom does.
    a.mask = round.mask;
    a.signalled = round.signalled;
    const size_t n = units_.size();
    std::vector<int32_t> next;
    if (rank_ == 0) {
        std::vector<uint8_t> seen(n, 0);
        for (int32_t u : round.order) next.push_back(u), seen[u] = 1;
        for (int32_t u : reduce_order_)
            if (!seen[u]) next.push_back(u);
    }
    CallHeader mine;
    mine.fingerprint = agreement_fingerprint(a);
    mine.weight = weight;
    for (size_t u = 0; u < n && sumsq; ++u) mine.value += unit_sumsq_[u];
    mine.flags = rank_ == 0 && next != reduce_order_ ? 1 : 0;
    std::vector<CallHeader> all;
    s = exchange_header(a.call, mine, [&] { return agreement_facts(a, params_); }, &all);
    if (s.code() == SX_ERR_MISMATCH && check_usable().ok()) {
        Status d = finish_step(false);
        if (!d.ok()) return d;
    }
    SX_TRY(s);
    if (all[0].flags & 1) {
        std::vector<uint64_t> order(n, 0);
        for (size_t k = 0; k < next.size(); ++k) order[k] = static_cast<uint64_t>(next[k]);
        if (world_size_ > 1) {
            s = comm_->broadcast(order.data(), n * sizeof(uint64_t), 0);
            if (!s.ok()) return fail(s);
        }
        std::vector<uint8_t> seen(n, 0);
        next.assign(n, 0);
        for (size_t k = 0; k < n; ++k) {
            const uint64_t u = order[k];
            SX_CHECK(u < n && !seen[u], SX_ERR_INTERNAL,
                     "rank 0 sent a reduction order that is not a permutation of the units");
            seen[u] = 1;
            next[k] = static_cast<int32_t>(u);
        }
        reduce_order_ = std::move(next);
    }
    // Sums in rank order: the same bits on every rank. Every replica group holds the same
    // reduced shards, so the squares are those of one: the first's (ranks [0, shard_size)).
    double total = 0.0, weights = 0.0;
    for (int r = 0; r < world_size_; ++r) {
        if (r < shard_size_) total += all[static_cast<size_t>(r)].value;
        weights += all[static_cast<size_t>(r)].weight;
    }
    if (sumsq) *sumsq = total;
    if (weight_sum) *weight_sum = weights;
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// Gathers

int32_t ShardGroup::first_deferred_gather() const {
    if (config_.stage == 3 || shard_size_ == 1) return -1;
    for (size_t k = reduce_order_.size(); k-- > 0;)
        if (units_[reduce_order_[k]].trainable) return reduce_order_[k];
    return -1;
}

Status ShardGroup::gather_after_update(bool defer, int32_t submitted) {
    if (config_.stage == 3) return gathers_->regather_held();  // the held units get the new values
    if (!defer) return gather_trainable_units();
    // The forward reads the units in the reverse of the backward's order, which the ranks
    // agreed on for the reductions: gathered in that order, the unit the next forward
    // reads first is gathered first (first_deferred_gather(), which the step may have
    // submitted already).
    std::vector<int32_t> order;
    for (size_t k = reduce_order_.size(); k-- > 0;)
        if (units_[reduce_order_[k]].trainable) order.push_back(reduce_order_[k]);
    return gathers_->deferred(order, submitted);
}

Status ShardGroup::unit_gather(int32_t unit) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    const int32_t n = static_cast<int32_t>(units_.size());
    SX_CHECK_ARG(unit >= 0 && unit < n, "unit index %d is out of range (%d units)", unit, n);
    SX_TRACE_SPAN(tracer(), "step", "sx_unit_gather", layout_.units()[unit].unit_id);
    if (config_.stage != 3) return gathers_->wait(static_cast<size_t>(unit));
    return gathers_->gather(static_cast<size_t>(unit));
}

Status ShardGroup::unit_release(int32_t unit) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    const int32_t n = static_cast<int32_t>(units_.size());
    SX_CHECK_ARG(unit >= 0 && unit < n, "unit index %d is out of range (%d units)", unit, n);
    if (config_.stage != 3) return Status::Ok();
    return gathers_->release(static_cast<size_t>(unit));
}

Status ShardGroup::check_param_present(int32_t param) const {
    if (config_.stage != 3 || !finalized_) return Status::Ok();
    const int32_t u = layout_.placement(param).unit_index;
    SX_CHECK(gathers_->pins(static_cast<size_t>(u)) > 0, SX_ERR_INVALID_STATE,
             "param '%s' is in unit %d, which is not gathered: at stage 3 a param's values exist only between "
             "sx_unit_gather and sx_unit_release of its unit",
             params_[param].name.c_str(), u);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
