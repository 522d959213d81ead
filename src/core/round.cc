// The reduction round part (round.h).
#include "core/round.h"


namespace sx {
namespace core {

ReductionRound::ReductionRound(Work &work, trace::Tracer *tracer, int stage, bool replicated)
    : work_(work), tracer_(tracer), stage_(stage) {
    if (replicated) replica_channel_.reset(new CommChannel("the replicas' gradient all-reduces"));
}

ReductionRound::~ReductionRound() {
    channel_.reset();
    replica_channel_.reset();
}

CommChannel &ReductionRound::channel() {
    if (!channel_) channel_.reset(new CommChannel("the gradient reductions"));
    return *channel_;
}

void ReductionRound::add_units(const std::vector<int32_t> &unit_ids) {
    const size_t old_units = unit_ids_.size();
    unit_ids_.insert(unit_ids_.end(), unit_ids.begin(), unit_ids.end());
    // Added units come first, being last.
    std::vector<int32_t> order;
    for (size_t u = unit_ids_.size(); u-- > old_units;) order.push_back(static_cast<int32_t>(u));
    order.insert(order.end(), order_.begin(), order_.end());
    order_ = std::move(order);
    reduced_.resize(unit_ids_.size(), nullptr);
    unit_sumsq_.resize(unit_ids_.size(), 0.0);
}

Status ReductionRound::drain() {
    Status s;
    if (channel_) s = channel_->drain();
    if (replica_channel_) {
        Status r = replica_channel_->drain();
        if (s.ok()) s = r;
    }
    return s;
}

bool ReductionRound::busy() {
    return (channel_ && channel_->busy()) || (replica_channel_ && replica_channel_->busy());
}

Status ReductionRound::check_signal(int32_t unit, bool accumulate) const {
    if (!round_.open) return Status::Ok();
    SX_CHECK_ARG(round_.accumulate == accumulate,
                 "unit %d is signalled with accumulate = %d, but this micro-batch's first signal said %d", unit,
                 accumulate ? 1 : 0, round_.accumulate ? 1 : 0);
    SX_CHECK(!round_.signalled[unit], SX_ERR_INVALID_STATE,
             "unit %d's gradients were already signalled ready in this micro-batch", unit);
    return Status::Ok();
}

void ReductionRound::begin(bool accumulate, std::vector<uint8_t> mask, std::vector<uint8_t> trainable, Agreement a,
                           float grad_scale) {
    unit_sumsq_.assign(unit_ids_.size(), 0.0);
    Round r;
    r.open = true;
    r.accumulate = accumulate;
    r.mask = std::move(mask);
    r.trainable = std::move(trainable);
    r.signalled.assign(unit_ids_.size(), 0);
    r.grad_scale = grad_scale;
    round_ = std::move(r);
    // The ranks agree on the mask (and all else the step's agreement covers) before any
    // reduction: a disagreement then changes nothing. It runs on the channel, ahead of
    // the reductions, so that the trainer's call does not wait for the other ranks. (What
    // they agree on was taken on the trainer's thread: by the time the job runs, the
    // trainer may be changing a hyperparameter for the step.)
    // Where the transport carries riders, it rides on the first reduction instead (the
    // first unit of the agreed order that is reduced: the same on every rank whose mask
    // agrees, and the agreement's tag tells the others).
    if (work_.agreement_rides(accumulate))
        round_.riding.reset(new Agreement(std::move(a)));
    else
        submit_agreement(std::move(a));
}

void ReductionRound::submit_agreement(Agreement a) {
    channel().submit([this, a = std::move(a)] { return work_.agree_round(a); });
}

void ReductionRound::signal(int32_t unit) {
    round_.signalled[unit] = 1;
    round_.order.push_back(unit);
    submit(false);
}

void ReductionRound::submit(bool all) {
    while (round_.next < order_.size()) {
        const int32_t u = order_[round_.next];
        if (!all && !round_.signalled[u]) return;
        ++round_.next;
        // Frozen units are not communicated; stage 1 keeps a micro-batch's gradients in
        // place until the step.
        if (!round_.trainable[u] || (round_.accumulate && stage_ == 1)) continue;
        const bool accumulate = round_.accumulate;
        const float grad_scale = round_.grad_scale;
        std::shared_ptr<Agreement> riding(round_.riding.release());
        channel().submit([this, u, accumulate, grad_scale, riding]() -> Status {
            float *shard = nullptr;
            if (riding)
                SX_TRY(work_.reduce_unit_grads_agreeing(static_cast<size_t>(u), accumulate, *riding, &shard));
            else
                SX_TRY(work_.reduce_unit_grads(static_cast<size_t>(u), accumulate, &shard));
            reduced_[u] = shard;
            // The last micro-batch: the replicas' all-reduce of the shard (on a channel of
            // its own, so that it overlaps the next unit's reduce-scatter), then the
            // unit's part of the step's norm, while the backward goes on.
            auto finish = [this, u, shard, grad_scale, accumulate]() -> Status {
                if (!accumulate) {
                    SX_TRY(work_.reduce_unit_replicas(static_cast<size_t>(u), shard));
                    SX_TRACE_SPAN(tracer_, "step", "grad_norm", unit_ids_[u]);
                    SX_TRY(work_.unit_sum_of_squares(static_cast<size_t>(u), shard, grad_scale, &unit_sumsq_[u]));
                }
                ++reductions_run_;
                return Status::Ok();
            };
            if (accumulate || !replica_channel_) return finish();
            replica_channel_->submit(finish);
            return Status::Ok();
        });
    }
}

Status ReductionRound::end(const World &w, Agreement a, double weight, double *sumsq, double *weight_sum,
                           bool *dropped) {
    *dropped = false;
    submit(true);
    // Nothing was reduced for the agreement to ride on: it goes alone.
    if (round_.riding) submit_agreement(std::move(*round_.riding));
    Round round = std::move(round_);
    round_ = Round();
    Status s;
    {
        // What the backward did not hide: the reductions still running when it ended.
        SX_TRACE_SPAN(tracer_, "step", "wait_reductions");
        s = channel().drain();
        // Every replica all-reduce was queued by a reduction, all of which have ended.
        if (s.ok() && replica_channel_) s = replica_channel_->drain();
    }
    if (!s.ok()) {
        // The ranks disagreed before anything was reduced: the channel ran nothing
        // after its agreement, on every rank. Anything else failed the group.
        if (s.code() == SX_ERR_MISMATCH && work_.usable()) channel().clear_failure();
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
    const size_t n = unit_ids_.size();
    std::vector<int32_t> next;
    if (w.rank == 0) {
        std::vector<uint8_t> seen(n, 0);
        for (int32_t u : round.order) next.push_back(u), seen[u] = 1;
        for (int32_t u : order_)
            if (!seen[u]) next.push_back(u);
    }
    CallHeader mine;
    mine.fingerprint = agreement_fingerprint(a);
    mine.weight = weight;
    for (size_t u = 0; u < n && sumsq; ++u) mine.value += unit_sumsq_[u];
    mine.flags = w.rank == 0 && next != order_ ? 1 : 0;
    std::vector<CallHeader> all;
    s = w.headers->exchange(*w.comm, a.call, mine, [&] { return agreement_facts(a, *w.params); }, &all);
    if (s.code() == SX_ERR_MISMATCH && work_.usable()) *dropped = true;
    SX_TRY(s);
    if (all[0].flags & 1) {
        std::vector<uint64_t> order(n, 0);
        for (size_t k = 0; k < next.size(); ++k) order[k] = static_cast<uint64_t>(next[k]);
        if (w.size > 1) {
            s = w.comm->broadcast(order.data(), n * sizeof(uint64_t), 0);
            if (!s.ok()) return work_.fail_group(s);
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
        order_ = std::move(next);
    }
    // Sums in rank order: the same bits on every rank. Every replica group holds the same
    // reduced shards, so the squares are those of one: the first's (ranks [0, shard_size)).
    double total = 0.0, weights = 0.0;
    for (int r = 0; r < w.size; ++r) {
        if (r < w.shard_size) total += all[static_cast<size_t>(r)].value;
        weights += all[static_cast<size_t>(r)].weight;
    }
    if (sumsq) *sumsq = total;
    if (weight_sum) *weight_sum = weights;
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
