// The step (docs/design.md, "The step"): reduce-scatter the gradients, clip by the
// global norm, update this rank's shard segment by segment, all-gather the params; the
// ranks' agreement on it, and its end (stepper.h). The update's passes and the norm are
// in step_update.cc.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/log.h"
#include "core/pipeline.h"
#include "core/stepper.h"

namespace sx {
namespace core {
namespace {

// torch.nn.utils.clip_grad_norm_: clip_coef = max_norm / (total_norm + 1e-6), clamped
// to 1 (so gradients are never scaled up).
double clip_coefficient(double norm, double max_norm) {
    if (max_norm <= 0) return 1.0;
    const double coef = max_norm / (norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

// segs without the segments of optimizers that look at whole params (updated before).
std::vector<optim::Segment> elementwise_only(std::vector<optim::Segment> segs) {
    segs.erase(std::remove_if(segs.begin(), segs.end(),
                              [](const optim::Segment &s) {
                                  return optim::spec_of(s.hyper->kind).needs != optim::Needs::kElementwise;
                              }),
               segs.end());
    return segs;
}

// The tag of the rider that carries a rank's sum of squares on the params' all-gather.
constexpr uint64_t kNormRider = 0x6e6f726d5f737173ULL;  // "norm_sqs"

// The sum of the riders' values in rank order (as sum_over_ranks adds): the same bits on
// every rank.
double sum_in_rank_order(const std::vector<comm::Rider> &riders) {
    double sum = 0.0;
    for (const comm::Rider &r : riders) sum += r.value;
    return sum;
}

}  // namespace

bool Stepper::between_steps() const { return !round_->open() && micro_batches_ == 0; }

// ---------------------------------------------------------------------------------
// What the ranks agree on (the agreement part: agreement.h), and the mask they apply

// The current mask with every byte 0 or 1 (autodetection reads the trainer's bytes).
std::vector<uint8_t> Stepper::candidate_mask() const {
    const std::vector<uint8_t> &src =
        (config_.flags & SX_GROUP_NO_TRAINABLE_AUTODETECT) ? table_.applied() : table_.flags();
    std::vector<uint8_t> m(src.size());
    for (size_t i = 0; i < src.size(); ++i) m[i] = src[i] ? 1 : 0;
    return m;
}

// Applies a trainable mask: unit flags, and optimizer state (and stage 2's gradient
// accumulator) allocated for every unit that needs it under the current
// hyperparameters. All allocations happen before anything changes.
Status Stepper::prepare(const std::vector<uint8_t> &mask, bool accumulate) {
    SX_TRY(units_.prepare(mask, accumulate));
    for (size_t i = 0; i < mask.size(); ++i) table_.applied()[i] = mask[i] ? 1 : 0;
    return Status::Ok();
}

// What the ranks agree on for `call`, one of the step's family (agreement.h): the mask
// to apply, the step's options, the param groups' hyperparameters, the loss scaling, the
// micro-batches so far, and at stage 3 (defer_gather >= 0) the units each holds gathered.
Agreement Stepper::step_agreement(const char *call, std::vector<uint8_t> mask, double max_grad_norm,
                                  int defer_gather, bool weighted) const {
    Agreement a;
    a.call = call;
    a.mask = std::move(mask);
    a.max_grad_norm = max_grad_norm;
    a.defer_gather = defer_gather;
    a.weighted = weighted;
    if (config_.stage == 3 && defer_gather >= 0)
        for (size_t u = 0; u < units_.size(); ++u) a.gathered.push_back(gathers_->pins(u) > 0 ? 1 : 0);
    for (const ParamGroup &g : table_.groups()) a.hypers.push_back(g.hyper);
    const LossScaling &ls = scaler_.settings();
    a.loss_scaling_mode = ls.mode;
    a.loss_scale = scaler_.scale();
    a.growth_factor = ls.growth_factor;
    a.backoff_factor = ls.backoff_factor;
    a.growth_interval = ls.growth_interval;
    a.micro_batches = micro_batches_;
    return a;
}

// Collective: every rank must be in the same call with the same agreement
// (SX_ERR_MISMATCH naming what differs otherwise, on every rank); *weight_sum (may be
// null) receives the sum of every rank's `weight`, added in rank order.
Status Stepper::agree(const Agreement &a, double weight, double *weight_sum) {
    CallHeader mine;
    mine.fingerprint = agreement_fingerprint(a);
    mine.weight = weight;
    std::vector<CallHeader> all;
    SX_TRY(headers_->exchange(mesh_.world(), a.call, mine, [&] { return agreement_facts(a, table_.params()); }, &all));
    double sum = 0.0;
    for (const CallHeader &h : all) sum += h.weight;  // in rank order: the same bits on every rank
    if (weight_sum) *weight_sum = sum;
    return Status::Ok();
}

// Collective: the sum of every shard's `local` (over the shard group's ranks: every
// replica group holds the same shards), added in shard order (the same bits on every
// rank, whatever the collective's own order of additions).
Status Stepper::sum_over_ranks(double local, double *total) {
    // Every replica group holds the same shards: the sum is over the shard group's ranks.
    if (mesh_.shard_size() == 1) {
        *total = local;
        return Status::Ok();
    }
    std::vector<double> all(static_cast<size_t>(mesh_.shard_size()), 0.0);
    all[static_cast<size_t>(mesh_.shard_rank())] = local;
    Status s = mesh_.shard().all_gather(all.data(), sizeof(double));
    if (!s.ok()) return fail(s);
    double sum = 0.0;
    for (double v : all) sum += v;  // in rank order: the same bits on every rank
    *total = sum;
    return Status::Ok();
}

// ---------------------------------------------------------------------------------
// The reduction

// The replicas' all-reduce of unit u's reduced fp32 shard `shard` (a step's last
// micro-batch), where the mesh has more than one replica. A failure fails the group.
Status Stepper::reduce_replicas(size_t u, float *shard) {
    if (mesh_.replicas() == 1) return Status::Ok();
    SX_TRACE_SPAN(tracer(), "step", "replica_all_reduce", layout_.units()[u].unit_id,
                  layout_.units()[u].shard_numel * sizeof(float));
    Status s = units_.wait_grads(u);  // offloaded: the shard on its way to the host
    if (s.ok()) s = mesh_.replica()->all_reduce_sum_f32(shard, layout_.units()[u].shard_numel);
    return s.ok() ? s : fail(s);
}

// Without a round: the ranks agree (on a, with their weights: *weight_sum), the mask is
// applied, and every trainable unit is reduced here (accumulate: into the accumulator;
// the round gets where each reduced shard lives). Where it can, the agreement rides on
// the first unit's reduce-scatter (agreement_rider_unit) instead of an exchange of its own.
Status Stepper::reduce_here(const Agreement &a, bool accumulate, double weight, double *weight_sum) {
    const int32_t rider = agreement_rider_unit(a, accumulate);
    if (rider < 0) SX_TRY(agree(a, weight, weight_sum));
    SX_TRY(prepare(a.mask, accumulate));
    // Stage 1 keeps a micro-batch's gradients in place until the step.
    if (accumulate && config_.stage == 1) return Status::Ok();
    for (size_t u = 0; u < units_.size(); ++u) {
        Unit &unit = units_[u];
        if (!unit.trainable) continue;
        float *shard = nullptr;
        if (static_cast<int32_t>(u) == rider) {
            SX_TRY(reduce_agreeing(u, a, accumulate, weight, weight_sum, &shard));
        } else {
            Status s = units_.reduce(u, mesh_.shard(), accumulate, &shard);
            if (!s.ok()) return fail(s);
        }
        round_->set_reduced(u, shard);
        if (accumulate) unit.accum_live = true;
        // A mesh's replicas sum their shard groups' sums once, at the step: the
        // accumulator holds this shard group's micro-batches until then.
        if (!accumulate) SX_TRY(reduce_replicas(u, shard));
    }
    return Status::Ok();
}

// The unit whose reduce-scatter carries a step's agreement, or -1 where the ranks agree in
// an exchange of its own: a step or a micro-batch that reduces now (not stage 1's) in a
// flat group over a transport that carries riders, under the mask already applied (the
// call changes no unit's trainability before the ranks have agreed), with a trainable
// unit. Ranks that choose differently meet in different calls, which the transport tells
// them (reduce_agreeing).
int32_t Stepper::agreement_rider_unit(const Agreement &a, bool accumulate) const {
    if ((accumulate && config_.stage == 1) || mesh_.world_size() == 1 || mesh_.replicas() != 1 ||
        !mesh_.shard().carries_riders())
        return -1;
    if (a.mask != table_.applied()) return -1;
    for (size_t u = 0; u < units_.size(); ++u)
        if (units_[u].trainable) return static_cast<int32_t>(u);
    return -1;
}

// Unit u's reduce-scatter with the ranks' agreement riding on it: its fingerprint as the
// tag, which the ranks compare before any data moves, and the rank's weight as the value
// (summed in rank order, as agree() does). Where the ranks differ, or are in other calls
// (a peer in an exchange of its own, which the transport also turns back), they meet in
// agree(), which says what differs on every rank; should they agree there after all, the
// unit is reduced as usual. A failed reduction fails the group; a disagreement does not.
Status Stepper::reduce_agreeing(size_t u, const Agreement &a, bool accumulate, double weight, double *weight_sum,
                                float **shard) {
    std::vector<comm::Rider> riders;
    const uint64_t fingerprint = agreement_fingerprint(a);
    Status s = mesh_.shard().attach_rider({fingerprint ? fingerprint : 1, weight}, &riders);
    if (s.ok()) s = units_.reduce(u, mesh_.shard(), accumulate, shard);
    if (s.code() == SX_ERR_MISMATCH) {
        SX_TRY(agree(a, weight, weight_sum));
        s = units_.reduce(u, mesh_.shard(), accumulate, shard);
        riders.clear();
    }
    if (!s.ok()) return fail(s);
    if (!riders.empty() && weight_sum) *weight_sum = sum_in_rank_order(riders);
    return Status::Ok();
}

Status Stepper::accumulate_grads() {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_TRACE_SPAN(tracer(), "step", "sx_accumulate_grads");
    SX_TRY(gathers_->meet("sx_accumulate_grads"));
    const bool overlapped = round_->open();  // the reductions zeroed their units' gradients
    if (overlapped) {
        SX_CHECK(round_->accumulating(), SX_ERR_INVALID_STATE,
                 "the units signalled ready in this micro-batch said that sx_step ends it (accumulate = 0), "
                 "not sx_accumulate_grads");
        SX_TRY(pipeline_.close_round(step_agreement("sx_accumulate_grads", {}, 0.0, 0, false), 0.0, nullptr, nullptr));
    } else {
        {
            Status s = ops_->wait_for(nullptr);  // the legacy default stream
            if (!s.ok()) return fail(s);
        }
        SX_TRY(reduce_here(step_agreement("sx_accumulate_grads", candidate_mask(), 0.0, 0, false), true, 0.0, nullptr));
    }
    ++micro_batches_;
    if (config_.stage == 1) return Status::Ok();  // the next micro-batch adds to the gradients
    for (Unit &unit : units_) {
        if (overlapped && unit.trainable) continue;
        Status s = ops_->zero(unit.grads.data(), unit.grads.size());
        if (!s.ok()) return fail(s);
    }
    return Status::Ok();
}

// Ends a step (taken or skipped): drops accumulated gradients, zeroes grads.
Status Stepper::finish_step(bool keep_grads) {
    for (Unit &unit : units_) unit.accum_live = false;
    micro_batches_ = 0;
    // Offloaded: no copy reads the gradients or writes the params once the step returns.
    Status s = keep_grads ? units_.wait_copies() : units_.zero_grads(round_->reduced());
    if (!s.ok()) return fail(s);
    // Stage 3: this step's gathers are the order the next one prefetches in, and the
    // next forward's first units are gathered while the trainer goes on.
    return gathers_->end_step();
}

// sx_step's reduction: the gradients into this rank's shards (closing a round of units
// signalled ready, or reducing them all now); the ranks' weights summed into
// *weight_sum; where the round summed the squares too, *sumsq and *have_sumsq = true.
Status Stepper::reduce_for_step(const StepOptions &options, double *weight_sum, bool *have_sumsq,
                                double *sumsq) {
    // Units signalled ready are on their way (or done), the rest go now. With signals, the
    // reduction channel also summed each unit's squares, and the ranks exchanged them with
    // their agreement, so the norm is known here. The ranks' weights are summed either way.
    const double weight = options.weighted ? options.weight : 1.0;
    const int defer = options.defer_gather ? 1 : 0;
    Agreement a = step_agreement("sx_step", round_->open() ? std::vector<uint8_t>{} : candidate_mask(),
                                 options.max_grad_norm, defer, options.weighted);
    a.nonfinite = options.nonfinite;
    if (!round_->open()) return reduce_here(a, false, weight, weight_sum);
    SX_CHECK(!round_->accumulating(), SX_ERR_INVALID_STATE,
             "the units signalled ready in this micro-batch said that sx_accumulate_grads ends it "
             "(accumulate = 1), not sx_step");
    SX_TRY(pipeline_.close_round(std::move(a), weight, sumsq,
                       weight_sum));
    *have_sumsq = true;
    return Status::Ok();
}

Status Stepper::step(const StepOptions &options, StepResult *result) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_TRY(check_step_options(options));
    SX_CHECK(!(domain_ && options.weighted), SX_ERR_UNSUPPORTED,
             "options->weighted: a group joined to a norm domain takes no weighted steps");
    SX_TRACE_SPAN(tracer(), "step", "sx_step");
    // The trainer's backward wrote the gradients on its stream. Waited for before anything
    // collective, so that a bad stream is this call's error alone and the group stays usable.
    SX_TRY(ops_->wait_for(options.stream));
    SX_TRY(gathers_->meet("sx_step"));

    // 1. Every trainable unit's gradients reduced into this rank's shard.
    double weight_sum = static_cast<double>(mesh_.world_size());
    bool have_sumsq = false;
    double sumsq = 0.0;
    SX_TRY(reduce_for_step(options, &weight_sum, &have_sumsq, &sumsq));
    SX_TRY(prepare_shard_for_update());
    // Uneven inputs: no rank had data, so there is nothing to average; the step is
    // skipped as a dynamic loss scaling skip is (nothing changes, the gradients go).
    if (options.weighted && !(weight_sum > 0)) return skip_step(options, 0.0, result);

    // 2. Global norm of the averaged, unscaled gradients, and the clipping coefficient.
    //    Dynamic loss scaling needs it (for its inf/NaN check) before the update,
    //    clipping too; otherwise it comes out of the update's own pass. The average is
    //    over the ranks, or over the ranks' weights (the gradients are then sums).
    const bool dynamic = scaler_.dynamic();
    const double divisor = weight_sum * scaler_.scale();  // the scale is 1 without scaling
    // Non-finite gradients are checked where the norm comes first: clipping and dynamic
    // loss scaling need it, and options.nonfinite may ask for it (docs: SX_NONFINITE_*).
    const bool checked = options.max_grad_norm > 0 || dynamic || options.nonfinite != SX_NONFINITE_DEFAULT;
    const bool norm_first = have_sumsq || checked || domain_;  // a norm domain's norm comes first
    double norm = 0.0, coef = 1.0;
    if (norm_first) {
        if (domain_) SX_TRY(domain_norm(options, &sumsq, result));  // docs/model-parallel.md
        else if (!have_sumsq) SX_TRY(global_norm(&sumsq));
        // The sums are of the gradients times norm_scale(), as torch's norm of the averaged
        // gradients; a weighted step's average has the weights' sum for the rank count.
        norm = std::sqrt(sumsq);
        if (options.weighted) norm *= static_cast<double>(mesh_.world_size()) / weight_sum;
        if (checked && !std::isfinite(norm)) return skip_nonfinite(options, norm, result);  // the same sum everywhere
        coef = clip_coefficient(norm, options.max_grad_norm);
    }

    // 3. The fused update of this rank's shard (the norm comes out of the same pass when
    //    it was not needed first), once a checkpoint's snapshot has been copied out of
    //    it: the reduction above overlapped that copy. 16-bit units update their fp32
    //    masters, which the same pass rounds into the params. With defer_gather, the
    //    unit the next forward reads first is updated first, and its gather starts while
    //    the others are updated.
    const float grad_scale = static_cast<float>(coef / divisor);
    double update_sumsq = 0.0;
    // A double-buffered unit (a custom optimizer's) is not gathered before every rank's
    // update is known to have succeeded.
    int32_t head = options.defer_gather ? pipeline_.first_deferred_gather() : -1;
    if (head >= 0 && units_.double_buffered(static_cast<size_t>(head))) head = -1;
    units_.mark_zeroed_by_update(!options.keep_grads, round_->reduced());
    record_.begin_update();
    Status s = update_shard(grad_scale, head, options.nonfinite, norm_first ? nullptr : &update_sumsq);
    if ((s.code() == SX_ERR_OPTIMIZER || s.code() == SX_ERR_NONFINITE) && check_usable().ok())
        return skip_custom(s, options, norm, result);
    // The norm's sum over the ranks rides on the params' all-gather where it can.
    const bool norm_rides = !norm_first && norm_rides_gather(options.defer_gather);
    if (s.ok() && !norm_first && !norm_rides) {
        SX_TRACE_SPAN(tracer(), "step", "grad_norm");
        s = sum_over_ranks(update_sumsq, &sumsq);
    }
    if (!s.ok()) return fail(s);

    // 4. The updated params: gathered now, or in the background (defer_gather), or at
    //    stage 3 only where a unit is gathered.
    if (norm_rides)
        SX_TRY(gather_trainable_units(&update_sumsq, &sumsq));
    else
        SX_TRY(pipeline_.gather_after_update(options.defer_gather, head));
    if (!norm_first) norm = std::sqrt(sumsq);

    // 5. Per-param step counts, the loss scale's growth, and a clean slate.
    return end_step(options, dynamic, norm, result);
}

// Before the update writes the shards: the gathers still in flight (deferred, or
// prefetched) that read them end, and where the state was replaced since the last
// memory copy (a load, a broadcast, the first step), this boundary's is kept first.
Status Stepper::prepare_shard_for_update() {
    {
        SX_TRACE_SPAN(tracer(), "step", "wait_gathers");
        SX_TRY(pipeline_.settle());
    }
    if (copies_ && copies_->dirty()) SX_TRY(keep_copy(true));
    return Status::Ok();
}

// The end of a step taken on every rank (the update and the gathers done): the warning
// for all-zero gradients, the counts, a clean slate for the next step's gradients, the
// memory copy due at this boundary, and the result.
Status Stepper::end_step(const StepOptions &options, bool dynamic, double norm, StepResult *result) {
    bool any_trainable = false;
    for (const Unit &unit : units_) any_trainable |= unit.trainable;
    record_.warn_if_no_gradient(norm, any_trainable);
    record_.count(table_, scaler_, dynamic);
    SX_TRY(finish_step(options.keep_grads));
    record_.advance();
    if (!copies_) lineage_.kept.clear();  // the copies of the groups before: only a group keeping its own waits for them
    // Memory copies: this boundary's, every memory_copy_interval steps, copied and sent
    // in the background (the next update waits only for the copy out of the shard).
    if (copies_ && copies_->due(record_.steps())) SX_TRY(keep_due_copy());
    record_.report(norm, false, scaler_.scale(), result);
    return Status::Ok();
}

// The memory copy of the boundary a step reached; with SX_GROUP_MEMORY_COPY_WAIT the step
// returns once the next rank holds it.
Status Stepper::keep_due_copy() {
    SX_TRY(keep_copy(true));
    if (!(config_.flags & SX_GROUP_MEMORY_COPY_WAIT) || !copies_->settings().peers) return Status::Ok();
    SX_TRACE_SPAN(tracer(), "step", "wait_memory_copy");
    Status s = copies_->wait_sent();
    return s.ok() ? s : fail(s);
}

// Copies out of the live shard at a step boundary (memory_copies.h), holding the fence
// until they are out, so that the next update waits for them. The copies of the groups
// before this one go once this group's own are held by every rank.
Status Stepper::keep_copy(bool send) {
    SX_TRACE_SPAN(tracer(), "step", "memory_copy");
    SX_TRY(ops_->wait_for(nullptr));
    {
        Status s = units_.ensure_masters();
        if (!s.ok()) return fail(s);
    }
    if (!lineage_.kept.empty() && copies_->settled()) lineage_.kept.clear();
    std::vector<UnitShard> shards;
    for (size_t u = 0; u < units_.size(); ++u) shards.push_back(units_.shard(u));
    std::unique_ptr<ShardFence::Hold> hold(new ShardFence::Hold(fence_));
    copies_->take(std::move(shards), progress(), std::move(hold), send);
    return Status::Ok();
}

// What a memory copy or a checkpoint holds besides the tensors: the counts of steps and
// updates, the hyperparameters, and the loss scale.
ShardProgress Stepper::progress() const {
    ShardProgress pr;
    pr.steps_taken = record_.steps();
    for (const ParamSpec &spec : table_.params())
        pr.params.push_back({spec.step, spec.momentum_steps, spec.mu_product, spec.row_var, spec.col_var});
    for (const ParamGroup &g : table_.groups()) {
        pr.hypers.push_back(g.hyper);
        pr.group_steps.push_back(g.steps);
    }
    pr.scaler = scaler_.state();
    return pr;
}

// A step skipped on every rank: nothing changes, the gradients go, the result says so.
Status Stepper::skip_step(const StepOptions &options, double norm, StepResult *result) {
    SX_TRY(finish_step(options.keep_grads));
    record_.report(norm, true, scaler_.scale(), result);
    return Status::Ok();
}

// A step whose custom updates failed on some rank (`why`: SX_ERR_OPTIMIZER), or wrote inf
// or NaN that the nonfinite policy skips (SX_ERR_NONFINITE): nothing changed on any rank,
// and the step ends as a skipped one does (the gradients go); SX_NONFINITE_SKIP then
// returns success.
Status Stepper::skip_custom(const Status &why, const StepOptions &options, double norm, StepResult *result) {
    record_.set_nonfinite(why.code() == SX_ERR_NONFINITE);
    SX_TRY(skip_step(options, norm, result));
    return StepRecord::after_custom_skip(why, options.nonfinite);
}

// A step skipped for gradients whose global norm is inf or NaN: dynamic loss scaling
// backs off, and SX_NONFINITE_ERROR makes it SX_ERR_NONFINITE.
Status Stepper::skip_nonfinite(const StepOptions &options, double norm, StepResult *result) {
    // Dynamic loss scaling, as torch.cuda.amp.GradScaler: back off, restart the growth count.
    scaler_.on_nonfinite_step();
    SX_TRY(skip_step(options, norm, result));
    return StepRecord::after_nonfinite_norm(norm, options.nonfinite);
}

// The step's fused update of this rank's shard of every trainable unit, unit `head` (>=
// 0) first with its gather started right after it; *sumsq (if not null) gets the sum of
// squares of the scaled gradients, which the same pass computes.
Status Stepper::update_shard(float grad_scale, int32_t head, int nonfinite, double *sumsq) {
    // Once a checkpoint's snapshot has been copied out of the shard.
    {
        SX_TRACE_SPAN(tracer(), "step", "wait_checkpoint_staging");
        fence_.wait_readers();
    }
    // ... and so no checkpoint reads the fp32 copies of bf16_stochastic_round units now.
    units_.drop_checkpoint_copies();
    // Its bytes: the fp32 elements of this rank's shard that the pass updated, x 4.
    trace::Span span(tracer(), "step", "update");
    uint64_t updated = 0;
    double head_sumsq = 0.0, rest = 0.0;
    SX_TRY(units_.ensure_masters());
    // The units of custom optimizers first: if an update fails anywhere, nothing else
    // has been touched yet. (Offloaded, the passes over several units read their gradients
    // on the host: every unit's copy is waited for first.)
    double kept_sumsq = 0.0, reduced_sumsq = 0.0, whole_sumsq = 0.0;
    if (units_.offloaded() && units_.any_looks_beyond_a_unit()) SX_TRY(units_.wait_copies());
    if (units_.any_double_buffered())
        SX_TRY(update_double_buffered(grad_scale, nonfinite, sumsq ? &kept_sumsq : nullptr));
    // Then the params whose update needs sums over the ranks, or their whole matrix on one
    // rank (the head unit's too).
    const StepPasses passes = step_passes();
    SX_TRY(update_param_reductions(passes, grad_scale, sumsq ? &reduced_sumsq : nullptr));
    SX_TRY(update_whole_params(passes, grad_scale, sumsq ? &whole_sumsq : nullptr));
    if (head >= 0) {
        std::vector<optim::Segment> first;
        units_.append_segments(static_cast<size_t>(head), round_->reduced(static_cast<size_t>(head)), &first);
        first = elementwise_only(std::move(first));
        SX_TRY(units_.wait_grads(static_cast<size_t>(head)));
        SX_TRY(update_in_place(first, grad_scale, nonfinite, sumsq ? &head_sumsq : nullptr));
        if (span.on()) updated += optim::total_elements(first);
        SX_TRY(upload_params(static_cast<size_t>(head)));
        SX_TRY(units_.wait_params(static_cast<size_t>(head)));
        SX_TRY(gathers_->open());
        SX_TRY(gathers_->submit(static_cast<size_t>(head)));
    }
    if (units_.offloaded()) {
        SX_TRY(update_offloaded_units(grad_scale, head, nonfinite, sumsq ? &rest : nullptr, &updated));
    } else {
        const std::vector<optim::Segment> segs = elementwise_only(units_.segments(round_->reduced(), head));
        SX_TRY(update_in_place(segs, grad_scale, nonfinite, sumsq ? &rest : nullptr));
        if (span.on()) updated += optim::total_elements(segs);
    }
    span.set_bytes(updated * sizeof(float));
    if (sumsq) *sumsq = kept_sumsq + reduced_sumsq + whole_sumsq + head_sumsq + rest;
    return Status::Ok();
}


// An offloaded unit's params, updated on the host, queued for the device (nothing for the
// others). A failure fails the group: the update is done, and the params would not follow.
Status Stepper::upload_params(size_t u) {
    if (!units_.offloaded()) return Status::Ok();
    SX_TRACE_SPAN(tracer(), "step", "params_to_device", layout_.units()[u].unit_id);
    Status s = units_.upload_params(u);
    return s.ok() ? s : fail(s);
}

// The offloaded units but `head` (and the double-buffered ones, updated before), unit by
// unit: each waits for its gradients' copy to the host alone, and its params' copy to the
// device runs while the next unit is updated (and the next units' gradients still come
// down). Returns once every copy up is done, for the gathers. *sumsq (if not null): the
// units' sums of squares, added in unit order.
Status Stepper::update_offloaded_units(float grad_scale, int32_t head, int nonfinite, double *sumsq,
                                       uint64_t *updated) {
    double total = 0.0;
    for (size_t u = 0; u < units_.size(); ++u) {
        if (static_cast<int32_t>(u) == head || !units_[u].trainable) continue;
        if (!units_.double_buffered(u)) {
            std::vector<optim::Segment> segs;
            units_.append_segments(u, round_->reduced(u), &segs);
            segs = elementwise_only(std::move(segs));
            double part = 0.0;
            SX_TRY(units_.wait_grads(u));
            SX_TRY(update_in_place(segs, grad_scale, nonfinite, sumsq ? &part : nullptr));
            total += part;
            *updated += optim::total_elements(segs);
        }
        SX_TRY(upload_params(u));
    }
    for (size_t u = 0; u < units_.size(); ++u) {
        Status s = units_.wait_params(u);
        if (!s.ok()) return fail(s);
    }
    if (sumsq) *sumsq = total;
    return Status::Ok();
}

// Collective: all-gathers the params of every trainable unit.
// Where local_sumsq is given (norm_rides_gather), the first all-gather carries it, and
// *sumsq = the shard group's sum of them, in rank order (as sum_over_ranks).
Status Stepper::gather_trainable_units(const double *local_sumsq, double *sumsq) {
    if (mesh_.shard_size() == 1) return Status::Ok();
    std::vector<comm::Rider> riders;
    for (size_t u = 0; u < units_.size(); ++u) {
        if (!units_[u].trainable) continue;
        SX_TRACE_SPAN(tracer(), "step", "all_gather", layout_.units()[u].unit_id, units_[u].params.size());
        const uint64_t S = layout_.units()[u].shard_numel;
        Status s;
        const bool ride = local_sumsq != nullptr && S > 0;
        if (ride) s = mesh_.shard().attach_rider({kNormRider, *local_sumsq}, &riders);
        if (s.ok()) s = mesh_.shard().all_gather(units_[u].params.data(), S * dtype_size(units_[u].dtype));
        if (!s.ok()) return fail(s);
        if (ride) {
            *sumsq = sum_in_rank_order(riders);
            local_sumsq = nullptr;
        }
    }
    return Status::Ok();
}

}  // namespace core
}  // namespace sx
