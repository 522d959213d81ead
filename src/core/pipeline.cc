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

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace sx {
namespace core {
namespace {

// Debug builds mark the memory of a released stage-3 unit, so that a view kept past
// sx_unit_release fails loudly: filled with 0xff bytes (NaN in every float dtype) and,
// under AddressSanitizer, poisoned (a read or write is reported where it happens).
#if defined(__SANITIZE_ADDRESS__) || !defined(NDEBUG)
constexpr bool kMarkReleased = true;
#else
constexpr bool kMarkReleased = false;
#endif

void mark_released(void *p, size_t bytes) {
    std::memset(p, 0xff, bytes);
#if defined(__SANITIZE_ADDRESS__)
    ASAN_POISON_MEMORY_REGION(p, bytes);
#endif
}

void unmark_released(void *p, size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(p, bytes);
#else
    (void)p;
    (void)bytes;
#endif
}

}  // namespace

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

Status ShardGroup::open_gather_channel() {
    if (gather_channel_) return Status::Ok();
    std::unique_ptr<comm::Communicator> c;
    // Gathers run inside the shard group.
    if (shard_size_ > 1)
        SX_TRY(connect(comm::make_prefix_store(store_, format("gather/%d/", replica_rank_)), shard_rank_, shard_size_,
                       &c));
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

Status ShardGroup::submit_gather(size_t u, uint64_t *header) {
    Unit &unit = units_[u];
    const uint64_t S = layout_.units()[u].shard_numel;
    const size_t es = dtype_size(unit.dtype);
    if (config_.stage == 3 && !unit.resident) {
        const size_t bytes = layout_.units()[u].padded_numel * es;
        // A buffer this step freed, of the same size, if there is one: the gather writes
        // every byte of it. Otherwise the spares go before a new buffer comes, so that
        // the buffers held never outnumber the most units resident at once.
        auto spare = std::find_if(spare_params_.begin(), spare_params_.end(),
                                  [&](const Spare &b) { return b.buffer.size() == bytes; });
        if (spare != spare_params_.end()) {
            // Its copy back into the shard it came from (if still queued) runs before this
            // gather, on the same channel.
            unit.params = std::move(spare->buffer);
            spare_params_.erase(spare);
        } else {
            SX_TRY(drop_spares());
            Buffer full;
            SX_TRY(ops_->allocate(bytes, "a gathered unit's params", &full, true));
            unit.params = std::move(full);
            count_param_bytes(static_cast<int64_t>(unit.params.size()));
        }
        unit.resident = true;
    }
    if (shard_size_ == 1 && config_.stage != 3) return Status::Ok();  // the params are whole already
    char *full = unit.params.as<char>();
    const void *own = unit.own.data();
    const bool unmark = kMarkReleased && config_.stage == 3 && ops_->device() == SX_DEVICE_CPU;
    const size_t bytes = unit.params.size();
    const int32_t id = layout_.units()[u].unit_id;
    if (header && shard_size_ > 1)
        *header = gather_channel_->submit(
            [this, u] { return gather_header("sx_unit_gather", {{"the unit gathered", std::to_string(u)}}); });
    unit.gather_ticket = gather_channel_->submit([this, full, own, S, es, unmark, bytes, id]() -> Status {
        SX_TRACE_SPAN(tracer(), "step", "all_gather", id, bytes);
        if (unmark) unmark_released(full, bytes);  // a spare's, marked when its unit was released
        char *mine = full + static_cast<uint64_t>(shard_rank_) * S * es;
        Status s = config_.stage == 3 ? ops_->copy(mine, own, S * es) : Status::Ok();
        if (s.ok() && shard_size_ > 1) s = gather_comm_->all_gather(full, S * es);
        return s.ok() ? s : fail(s);
    });
    return Status::Ok();
}

Status ShardGroup::wait_gather(size_t u) {
    Unit &unit = units_[u];
    if (!unit.gather_ticket) return Status::Ok();
    SX_TRACE_SPAN(tracer(), "step", "wait_gather", layout_.units()[u].unit_id);
    Status s = gather_channel_->wait(unit.gather_ticket);
    if (!s.ok()) return fail(s);
    unit.gather_ticket = 0;
    return Status::Ok();
}

Status ShardGroup::gather_header(const char *call, std::vector<Fact> facts) {
    facts.insert(facts.begin(), Fact{"the call", call});
    CallHeader mine;
    mine.fingerprint = facts_fingerprint(facts);
    return headers_->exchange(*gather_comm_, call, mine, [&] { return facts; }, nullptr);
}

Status ShardGroup::meet_gathers(const char *call) {
    if (config_.stage != 3 || !gather_channel_ || shard_size_ == 1) return Status::Ok();
    Status s = gather_channel_->wait(gather_channel_->submit([this, call] { return gather_header(call, {}); }));
    if (s.code() == SX_ERR_MISMATCH && check_usable().ok()) {
        recover_gather_channel();
        return s;
    }
    return s.ok() ? s : fail(s);
}

void ShardGroup::recover_gather_channel() {
    // Every job behind the header that disagreed ends with its failure, unrun; the ones
    // before it ran.
    (void)gather_channel_->drain();
    const uint64_t failed_at = gather_channel_->failed_at();
    gather_channel_->clear_failure();
    for (size_t u = 0; u < units_.size(); ++u)
        if (units_[u].gather_ticket >= failed_at) {
            units_[u].gather_ticket = 0;
            evict(u);
        }
}

void ShardGroup::evict(size_t u) {
    Unit &unit = units_[u];
    if (!unit.resident) return;
    // Kept for the step's next gathers (fresh memory faults in slower than a gather
    // fills it), with the copy back of its last release, which may still be queued;
    // param_bytes still counts it.
    uint64_t pending = unit.copy_back_ticket;
    if (kMarkReleased && ops_->device() == SX_DEVICE_CPU) {
        // After the copy back, on the same channel; a later gather into the buffer unmarks it.
        void *p = unit.params.data();
        const size_t bytes = unit.params.size();
        pending = gather_channel_->submit([p, bytes]() -> Status {
            mark_released(p, bytes);
            return Status::Ok();
        });
    }
    spare_params_.push_back({std::move(unit.params), pending});
    unit.copy_back_ticket = 0;
    unit.params = Buffer();
    unit.resident = false;
}

void ShardGroup::unmark_spares() {
    if (!kMarkReleased || !ops_ || ops_->device() != SX_DEVICE_CPU) return;
    for (Spare &b : spare_params_) unmark_released(b.buffer.data(), b.buffer.size());
}

Status ShardGroup::drop_spares() {
    Status s;
    for (Spare &b : spare_params_) {
        // A copy back still reading the buffer ends first.
        if (b.pending) {
            Status w = gather_channel_->wait(b.pending);
            if (s.ok() && !w.ok()) s = fail(w);
        }
        if (kMarkReleased && ops_->device() == SX_DEVICE_CPU) unmark_released(b.buffer.data(), b.buffer.size());
        count_param_bytes(-static_cast<int64_t>(b.buffer.size()));
    }
    spare_params_.clear();
    return s;
}

int32_t ShardGroup::first_deferred_gather() const {
    if (config_.stage == 3 || shard_size_ == 1) return -1;
    for (size_t k = reduce_order_.size(); k-- > 0;)
        if (units_[reduce_order_[k]].trainable) return reduce_order_[k];
    return -1;
}

Status ShardGroup::gather_after_update(bool defer, int32_t submitted) {
    if (config_.stage != 3) {
        if (!defer) return gather_trainable_units();
        if (shard_size_ == 1) return Status::Ok();
        SX_TRY(open_gather_channel());
        // The forward reads the units in the reverse of the backward's order, which the
        // ranks agreed on for the reductions: gathered in that order, the unit the next
        // forward reads first is gathered first (first_deferred_gather(), which the step
        // may have submitted already).
        deferred_order_.clear();
        for (size_t k = reduce_order_.size(); k-- > 0;) {
            const int32_t u = reduce_order_[k];
            if (!units_[u].trainable) continue;
            if (u != submitted) SX_TRY(submit_gather(static_cast<size_t>(u)));
            deferred_order_.push_back(u);
        }
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
    return Status::Ok();  // the spares go at the step's end (or the load's), after its prefetch
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
    SX_TRACE_SPAN(tracer(), "step", "sx_unit_gather", layout_.units()[unit].unit_id);
    if (config_.stage != 3) return wait_gather(static_cast<size_t>(unit));
    // A gather that communicates meets the peers' calls first (meet_gathers), before
    // anything else here changes: its header, then its data, and this call waits for the
    // header. One of a unit already resident (prefetched) has nothing to meet them on,
    // and changes nothing they see: the step's agreement names the units gathered.
    if (!u.resident) {
        uint64_t header = 0;
        SX_TRY(submit_gather(static_cast<size_t>(unit), &header));
        if (header) {
            Status h = gather_channel_->wait(header);
            if (h.code() == SX_ERR_MISMATCH && check_usable().ok()) {
                recover_gather_channel();  // the unit's gather did not run: no longer resident
                return h;
            }
            if (!h.ok()) return fail(h);
        }
    }
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
    // it (initial values) are kept. The copy runs on the gather channel, ahead of any
    // later gather of this unit or reuse of its buffer (both queued behind it there), and
    // of the update, which drains the channel first.
    const uint64_t S = layout_.units()[unit].shard_numel;
    const size_t es = dtype_size(u.dtype);
    void *own = u.own.data();
    const void *mine = u.params.as<char>() + static_cast<uint64_t>(shard_rank_) * S * es;
    u.copy_back_ticket = gather_channel_->submit([this, own, mine, S, es]() -> Status {
        Status s = ops_->copy(own, mine, S * es);
        return s.ok() ? s : fail(s);
    });
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
