// A shard group's parts, and what they answer by themselves of ShardAccess and
// RecoveryAccess (group_parts.h).
#include "core/group_parts.h"

#include <algorithm>

namespace sx {
namespace core {

Status GroupParts::check_finalized() const {
    SX_CHECK(!lineage_.joining, SX_ERR_INVALID_STATE,
             "the group is joining (SX_GROUP_JOIN): it takes part in nothing until sx_regroup admits it");
    SX_CHECK(table_.finalized(), SX_ERR_INVALID_STATE, "the group is not finalized yet; call sx_finalize first");
    SX_CHECK(!table_.pending(), SX_ERR_INVALID_STATE,
             "%zu param(s) and %zu param group(s) were added after sx_finalize: call sx_finalize again (on every "
             "rank) to lay them out before the group goes on",
             table_.pending_params(), table_.pending_groups());
    return Status::Ok();
}

// The layout of every param registered, in `shard_size` shards.
Status GroupParts::build_layout(int shard_size, Layout *out) const {
    std::vector<ParamShape> shapes(table_.params().size());
    for (size_t i = 0; i < table_.params().size(); ++i) {
        const ParamSpec &spec = table_.params()[i];
        shapes[i] = {spec.unit, spec.numel, static_cast<uint32_t>(dtype_size(spec.dtype))};
        // 8-bit state's blocks never straddle a shard boundary (optim/state_codec.h).
        if (param_state_dtype(spec, table_.groups()[spec.group]) == SX_STATE_8BIT) shapes[i].block = static_cast<uint32_t>(optim::kQuantBlock);
    }
    return Layout::build(shapes, shard_size, static_cast<uint64_t>(config_.alignment), out);
}

Status GroupParts::restore_shard(const ShardRestore &r) {
    // Everything is checked before anything changes.
    SX_CHECK(r.state && r.state->size() == units_.size() && r.slots.size() == units_.size() &&
                 (!r.scales || r.scales->size() == units_.size()),
             SX_ERR_INTERNAL, "restoring the shard: state for %zu units, the group has %zu", r.slots.size(),
             units_.size());
    std::vector<std::vector<StatePiece>> pieces(units_.size());
    for (size_t u = 0; u < units_.size(); ++u) {
        uint64_t bytes = 0, scales = 0;
        pieces[u] = units_.state_pieces(u, &bytes, &scales);
        SX_CHECK(r.slots[u] >= 0 && r.slots[u] <= 3, SX_ERR_INTERNAL, "restoring %d state slots of unit %zu",
                 r.slots[u], u);
        for (int k = 0; k < r.slots[u]; ++k) {
            const size_t scale_bytes = r.scales ? (*r.scales)[u][k].size() : 0;
            SX_CHECK((*r.state)[u][k].size() == bytes && scale_bytes == scales * sizeof(float), SX_ERR_INTERNAL,
                     "restoring state slot %d of unit %zu: %zu bytes and %zu of scales for a slot of %llu and %llu",
                     k, u, (*r.state)[u][k].size(), scale_bytes, static_cast<unsigned long long>(bytes),
                     static_cast<unsigned long long>(scales * sizeof(float)));
        }
    }
    if (r.masters) {
        SX_CHECK(r.masters->size() == units_.size(), SX_ERR_INTERNAL, "restoring the masters of %zu units into %zu",
                 r.masters->size(), units_.size());
        for (size_t u = 0; u < units_.size(); ++u) {
            const Buffer &m = (*r.masters)[u];
            SX_CHECK(m.empty() || m.size() == units_[u].master.size(), SX_ERR_INTERNAL,
                     "restoring the masters of unit %zu: %zu bytes for %zu", u, m.size(), units_[u].master.size());
        }
    }
    if (r.progress)
        SX_CHECK(r.progress->params.size() == table_.params().size() && r.progress->hypers.size() == table_.groups().size(),
                 SX_ERR_INTERNAL, "restoring the progress of %zu params and %zu param groups into %zu and %zu",
                 r.progress->params.size(), r.progress->hypers.size(), table_.params().size(), table_.groups().size());
    for (size_t u = 0; u < units_.size(); ++u) {
        Units::Unit &unit = units_[u];
        for (int k = 0; k < r.slots[u]; ++k) {
            std::swap(unit.state[k], (*r.state)[u][k]);
            if (r.scales) std::swap(unit.scales[k], (*r.scales)[u][k]);
        }
        if (r.slots[u] > 0) unit.state_pieces = std::move(pieces[u]);
        unit.state_slots = std::max(unit.state_slots, r.slots[u]);
        if (r.masters && !(*r.masters)[u].empty()) std::swap(unit.master, (*r.masters)[u]);
    }
    if (!r.progress) return Status::Ok();
    const ShardProgress &pr = *r.progress;
    for (size_t p = 0; p < table_.params().size(); ++p) {
        table_.params()[p].step = pr.params[p].step;
        table_.params()[p].momentum_steps = pr.params[p].momentum_steps;
        table_.params()[p].mu_product = pr.params[p].mu_product;
        table_.params()[p].row_var = pr.params[p].row_var;
        table_.params()[p].col_var = pr.params[p].col_var;
    }
    for (size_t g = 0; g < table_.groups().size(); ++g) {
        table_.groups()[g].hyper = pr.hypers[g];
        if (g < pr.group_steps.size()) table_.groups()[g].steps = pr.group_steps[g];
    }
    // The group has taken at least as many steps as any param has had updates (what a
    // checkpoint records and checks): params a load left as they were, or counts
    // scattered from another optimizer, may bring more than the steps restored.
    uint64_t steps = pr.steps_taken;
    for (const ParamSpec &ps : table_.params()) steps = std::max(steps, static_cast<uint64_t>(std::max<int64_t>(ps.step, 0)));
    record_.set_steps(steps);
    scaler_.restore(pr.scaler);
    if (copies_) copies_->mark_dirty();  // the next step keeps a copy of the new state
    return Status::Ok();
}

// A regroup's new group goes on from where `from`'s counters were (after its finalize).
void GroupParts::continue_counters(uint64_t steps, const LossScaling &settings, const LossScalerState &state) {
    record_.set_steps(steps);
    scaler_.configure(settings);
    scaler_.restore(state);
}

Status GroupParts::collective(const std::function<Status(comm::Communicator &)> &fn) {
    SX_TRY(check_usable());
    Status s = fn(mesh_.world());
    return s.ok() ? s : fail(s);
}

Status GroupParts::fail(Status s) {
    // A failed group can only be destroyed, so its peers would wait for this rank in their
    // next collective until their timeout: closing its connections fails those at once.
    // Not under abort_mu_: a channel's thread may fail the group while the destructor,
    // holding it, joins that thread (the communicators outlive the channels).
    if (failure_.record(s)) {
        abort_communicators(s);
        return s;
    }
    // A call that the first failure's abort cut short (another thread's, a channel's)
    // says what failed, not that it was aborted: nobody called sx_abort.
    if (s.code() == SX_ERR_ABORTED && !failure_.aborted()) return failure_.check();
    return s;
}

Status GroupParts::check_usable() const { return failure_.check(); }

void GroupParts::abort() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    failure_.set_aborted();
    abort_communicators(SX_ERROR(SX_ERR_ABORTED, "sx_abort was called on that rank"));
}

void GroupParts::abort_communicators(const Status &why) {
    mesh_.abort(why);
    if (gathers_) gathers_->abort(why);
    // Not the memory copies' sending: it has a communicator of its own, and a copy whose
    // sending still completes is one more the survivors may restore from (regroup waits
    // for it, a moment at most; a lost peer fails it at once).
}

void ShardFence::hold() {
    std::lock_guard<std::mutex> lock(mu_);
    ++holds_;
}

void ShardFence::release() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        --holds_;
    }
    cv_.notify_all();
}

void ShardFence::wait_readers() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return holds_ == 0; });
}

}  // namespace core
}  // namespace sx
