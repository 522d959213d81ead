// Units as a pipeline (docs/design.md, "Units as a pipeline"): a unit's gradients are
// reduced on the reduction channel while the trainer's backward goes on with earlier
// units, and its params gathered on the gather channel while its forward goes on with
// earlier ones; at stage 3 a unit's full params exist only while it is gathered.
//
// Ranks may signal units in different orders, and interleave their gathers and
// reductions differently; what every rank keeps the same is the order of the
// collectives on each channel: reductions in reduce_order_ (agreed by all ranks),
// gathers in the order of the trainer's calls (collective, so the same everywhere) or,
// for the deferred gathers of stages 1 and 2, in increasing unit index.
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
    if (gather_channel_) {
        Status g = gather_channel_->drain();
        if (s.ok()) s = g;
    }
    if (s.ok()) {
        for (Unit &unit : units_) unit.gather_ticket = 0;
        return s;
    }
    return fail(s);
}

// ---------------------------------------------------------------------------------
// Reductions

Status ShardGroup::open_round(bool accumulate) {
    std::vector<uint8_t> mask = candidate_mask();
    SX_TRY(prepare(mask));
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
    reduce_channel().submit([this, what, mask] { return check_ranks_agree(what, mask, 0.0); });
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
        reduce_channel().submit([this, u, accumulate]() -> Status {
            float *shard = nullptr;
            Status s = reduce_unit(static_cast<size_t>(u), accumulate, &shard);
            if (s.ok() && accumulate) {
                units_[u].accum_live = true;
                s = ops_->zero(units_[u].grads.data(), units_[u].grads.size());
            }
            if (!s.ok()) return fail(s);
            reduced_[u] = shard;
            ++reductions_run_;
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

Status ShardGroup::close_round(const char *what, double max_grad_norm, const std::vector<uint8_t> &facts) {
    submit_reductions(true);
    Round round = std::move(round_);
    round_ = Round();
    Status s = reduce_channel().drain();
    if (!s.ok()) {
        // The ranks disagreed before anything was reduced: the channel ran nothing
        // after its agreement, on every rank. Anything else failed the group.
        if (s.code() == SX_ERR_MISMATCH && check_usable().ok()) reduce_channel().clear_failure();
        return s;
    }
    // The units signalled are part of the agreement: a unit signalled on some ranks only
    // is a trainer's mistake that every rank reports. Its gradients are reduced by now
    // (the ranks reduced every unit, in one order), so the step's gradients are dropped.
    std::vector<uint8_t> extra = round.signalled;
    extra.insert(extra.end(), facts.begin(), facts.end());
    s = check_ranks_agree(what, round.mask, max_grad_norm, extra);
    if (!s.ok()) {
        if (check_usable().ok()) {
            Status d = finish_step(false);
            if (!d.ok()) return d;
        }
        return s;
    }
    return learn_reduce_order(round);
}

Status ShardGroup::learn_reduce_order(const Round &round) {
    if (round.order.empty()) return Status::Ok();  // on every rank: the ranks agreed on the units signalled
    // Rank 0's signals in its order, then the units it did not signal in the old order.
    std::vector<int32_t> next(units_.size(), -1);
    if (rank_ == 0) {
        std::vector<uint8_t> seen(units_.size(), 0);
        size_t k = 0;
        for (int32_t u : round.order) next[k++] = u, seen[u] = 1;
        for (int32_t u : reduce_order_)
            if (!seen[u]) next[k++] = u;
    }
    if (world_size_ > 1) {
        Status s = comm_->broadcast(next.data(), next.size() * sizeof(int32_t), 0);
        if (!s.ok()) return fail(s);
    }
    std::vector<uint8_t> seen(units_.size(), 0);
    for (int32_t u : next) {
        SX_CHECK(u >= 0 && static_cast<size_t>(u) < units_.size() && !seen[u], SX_ERR_INTERNAL,
                 "rank 0 sent a reduction order that is not a permutation of the units");
        seen[u] = 1;
    }
    reduce_order_ = std::move(next);
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// Gathers

Status ShardGroup::open_gather_channel() {
    if (gather_channel_) return Status::Ok();
    std::unique_ptr<comm::Communicator> c;
    if (world_size_ > 1) SX_TRY(connect(comm::make_prefix_store(store_, "gather/"), &c));
    {
        std::lock_guard<std::mutex> lock(abort_mu_);  // abort() may read it from another thread
        gather_comm_ = std::move(c);
    }
    gather_channel_.reset(new CommChannel("the param gathers"));
    return Status::Ok();
}

void ShardGroup::count_param_bytes(int64_t delta) {
    param_bytes_ = static_cast<uint64_t>(static_cast<int64_t>(param_bytes_) + delta);
    peak_param_bytes_ = std::max(peak_param_bytes_, param_bytes_);
}

Status ShardGroup::submit_gather(size_t u) {
    Unit &unit = units_[u];
    const uint64_t S = layout_.units()[u].shard_numel;
    const size_t es = dtype_size(unit.dtype);
    if (config_.stage == 3 && !unit.resident) {
        Buffer full;
        SX_TRY(ops_->allocate(layout_.units()[u].padded_numel * es, "a gathered unit's params", &full, true));
        unit.params = std::move(full);
        unit.resident = true;
        count_param_bytes(static_cast<int64_t>(unit.params.size()));
    }
    if (world_size_ == 1 && config_.stage != 3) return Status::Ok();  // the params are whole already
    unit.gather_ticket = gather_channel_->submit([this, u, S, es]() -> Status {
        Unit &un = units_[u];
        char *mine = un.params.as<char>() + static_cast<uint64_t>(rank_) * S * es;
        Status s = config_.stage == 3 ? ops_->copy(mine, un.own.data(), S * es) : Status::Ok();
        if (s.ok() && world_size_ > 1) s = gather_comm_->all_gather(un.params.data(), S * es);
        return s.ok() ? s : fail(s);
    });
    return Status::Ok();
}

Status ShardGroup::wait_gather(size_t u) {
    Unit &unit = units_[u];
    if (!unit.gather_ticket) return Status::Ok();
    Status s = gather_channel_->wait(unit.gather_ticket);
    if (!s.ok()) return fail(s);
    unit.gather_ticket = 0;
    return Status::Ok();
}

void ShardGroup::evict(size_t u) {
    Unit &unit = units_[u];
    if (!unit.resident) return;
    count_param_bytes(-static_cast<int64_t>(unit.params.size()));
    unit.params.reset();
    unit.resident = false;
}

Status ShardGroup::gather_after_update(bool defer) {
    if (config_.stage != 3) {
        if (!defer) return gather_trainable_units();
        if (world_size_ == 1) return Status::Ok();
        SX_TRY(open_gather_channel());
        for (size_t u = 0; u < units_.size(); ++u)
            if (units_[u].trainable) SX_TRY(submit_gather(u));
        return Status::Ok();
    }
    // Stage 3: the units the trainer holds gathered get the new values; prefetched ones
    // are stale, and go.
    for (size_t u = 0; u < units_.size(); ++u) {
        if (units_[u].pins == 0) {
            evict(u);
        } else {
            SX_TRY(submit_gather(u));
        }
    }
    for (size_t u = 0; u < units_.size(); ++u) SX_TRY(wait_gather(u));
    return Status::Ok();
}

std::vector<int32_t> ShardGroup::prefetch_window() const {
    std::vector<int32_t> window;
    const size_t depth = static_cast<size_t>(config_.prefetch_depth);
    if (depth == 0) return window;
    if (gather_order_.empty()) {
        // The first step: registration order after the unit last gathered, as long as the
        // trainer has gone up that order (a forward); nothing once it turns (a backward).
        const size_t n = gather_log_.size();
        if (n >= 2 && gather_log_[n - 1] < gather_log_[n - 2]) return window;
        const int32_t last = n ? gather_log_.back() : -1;
        for (int32_t u = last + 1; u < static_cast<int32_t>(units_.size()) && window.size() < depth; ++u)
            window.push_back(u);
        return window;
    }
    for (size_t k = gather_pos_; k < gather_order_.size() && window.size() < depth; ++k) {
        const int32_t u = gather_order_[k];
        if (units_[u].pins == 0 && std::find(window.begin(), window.end(), u) == window.end()) window.push_back(u);
    }
    return window;
}

void ShardGroup::prefetch() {
    const std::vector<int32_t> window = prefetch_window();
    // Units gathered ahead that the order no longer reaches soon go first (bounded memory).
    for (size_t u = 0; u < units_.size(); ++u)
        if (units_[u].resident && units_[u].pins == 0 &&
            std::find(window.begin(), window.end(), static_cast<int32_t>(u)) == window.end()) {
            if (wait_gather(u).ok()) evict(u);
        }
    for (int32_t u : window)
        if (!units_[u].resident && !submit_gather(static_cast<size_t>(u)).ok()) return;  // a hint only
}

Status ShardGroup::unit_gather(int32_t unit) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    const int32_t n = static_cast<int32_t>(units_.size());
    SX_CHECK_ARG(unit >= 0 && unit < n, "unit index %d is out of range (%d units)", unit, n);
    Unit &u = units_[unit];
    if (config_.stage != 3) return wait_gather(static_cast<size_t>(unit));
    if (!u.resident) SX_TRY(submit_gather(static_cast<size_t>(unit)));
    ++u.pins;
    gather_log_.push_back(unit);
    // Where this call stands in the last step's order of gathers.
    for (size_t k = gather_pos_; k < gather_order_.size(); ++k)
        if (gather_order_[k] == unit) {
            gather_pos_ = k + 1;
            break;
        }
    prefetch();
    Status s = wait_gather(static_cast<size_t>(unit));
    if (!s.ok()) --u.pins;
    return s;
}

Status ShardGroup::unit_release(int32_t unit) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    const int32_t n = static_cast<int32_t>(units_.size());
    SX_CHECK_ARG(unit >= 0 && unit < n, "unit index %d is out of range (%d units)", unit, n);
    if (config_.stage != 3) return Status::Ok();
    Unit &u = units_[unit];
    SX_CHECK(u.pins > 0, SX_ERR_INVALID_STATE, "unit %d is not gathered (sx_unit_release without sx_unit_gather)",
             unit);
    if (--u.pins > 0) return Status::Ok();
    // This rank keeps its shard of what the buffer holds: values the trainer wrote into
    // it (initial values) are kept.
    const uint64_t S = layout_.units()[unit].shard_numel;
    const size_t es = dtype_size(u.dtype);
    SX_TRY(ops_->copy(u.own.data(), u.params.as<char>() + static_cast<uint64_t>(rank_) * S * es, S * es));
    const std::vector<int32_t> window = prefetch_window();
    if (std::find(window.begin(), window.end(), unit) == window.end()) evict(static_cast<size_t>(unit));
    return Status::Ok();
}

Status ShardGroup::check_param_present(int32_t param) const {
    if (config_.stage != 3 || !finalized_) return Status::Ok();
    const int32_t u = layout_.placement(param).unit_index;
    SX_CHECK(units_[u].pins > 0, SX_ERR_INVALID_STATE,
             "param '%s' is in unit %d, which is not gathered: at stage 3 a param's values exist only between "
             "sx_unit_gather and sx_unit_release of its unit",
             params_[param].name.c_str(), u);
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
