// The step (docs/design.md, "The step"): reduce-scatter the gradients, clip by the
// global norm, update this rank's shard segment by segment, all-gather the params.
#include <cmath>
#include <cstring>

#include "core/group.h"

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

}  // namespace

std::vector<uint8_t> ShardGroup::candidate_mask() const {
    const std::vector<uint8_t> &src =
        (config_.flags & SX_GROUP_NO_TRAINABLE_AUTODETECT) ? applied_mask_ : mask_;
    std::vector<uint8_t> m(src.size());
    for (size_t i = 0; i < src.size(); ++i) m[i] = src[i] ? 1 : 0;
    return m;
}

uint64_t ShardGroup::agreement_hash(const char *what, const std::vector<uint8_t> &mask, double max_grad_norm,
                                    const std::vector<uint8_t> &extra) const {
    uint64_t h = fnv1a(what, std::strlen(what));
    h = fnv1a(mask.data(), mask.size(), h);
    for (const ParamGroup &g : groups_) h = hyper_fingerprint(g.hyper, h);
    h = fnv1a(&max_grad_norm, sizeof max_grad_norm, h);
    const double scaling[5] = {static_cast<double>(scaling_.mode), scaler_.scale, scaling_.growth_factor,
                               scaling_.backoff_factor, static_cast<double>(scaling_.growth_interval)};
    h = fnv1a(scaling, sizeof scaling, h);
    h = fnv1a(&micro_batches_, sizeof micro_batches_, h);
    return fnv1a(extra.data(), extra.size(), h);
}

Status ShardGroup::disagreement() {
    return SX_ERROR(SX_ERR_MISMATCH,
                    "ranks disagree: the trainable masks, hyperparameters, max_grad_norm, loss scaling, the number of "
                    "sx_accumulate_grads calls, the units signalled ready or gathered, defer_gather, or the call itself "
                    "(sx_step, sx_accumulate_grads or sx_unit_grads_ready) differ between ranks");
}

Status ShardGroup::check_ranks_agree(const char *what, const std::vector<uint8_t> &mask, double max_grad_norm,
                                     const std::vector<uint8_t> &extra) {
    if (world_size_ == 1) return Status::Ok();
    const uint64_t h = agreement_hash(what, mask, max_grad_norm, extra);
    uint64_t v[2] = {h, ~h};
    Status s = comm_->all_reduce_max(v, 2);
    if (!s.ok()) return fail(s);
    if (v[0] != h || v[1] != ~h) return disagreement();
    return Status::Ok();
}

Status ShardGroup::sum_over_ranks(double local, double *total) {
    if (world_size_ == 1) {
        *total = local;
        return Status::Ok();
    }
    std::vector<double> all(static_cast<size_t>(world_size_), 0.0);
    all[static_cast<size_t>(rank_)] = local;
    Status s = comm_->all_gather(all.data(), sizeof(double));
    if (!s.ok()) return fail(s);
    double sum = 0.0;
    for (double v : all) sum += v;  // in rank order: the same bits on every rank
    *total = sum;
    return Status::Ok();
}

Status ShardGroup::reduce_unit(size_t u, bool into_accum, float **shard_grad) {
    Unit &unit = units_[u];
    const uint64_t S = layout_.units()[u].shard_numel;
    if (unit.grad_dtype == SX_DTYPE_F32) {
        float *grads = unit.grads.as<float>();
        // One rank with nothing accumulated: the gradients are already the reduced shard.
        // (Otherwise one rank goes through the communicator too, which then copies or adds.)
        if (world_size_ == 1 && !into_accum && !unit.accum_live) {
            *shard_grad = grads;
        } else if (config_.stage == 1 && !into_accum) {
            // In place: this rank's shard of the grad buffer receives the sum.
            float *own = grads + static_cast<uint64_t>(rank_) * S;
            SX_TRY(comm_->reduce_scatter_sum(grads, S, own, false));
            *shard_grad = own;
        } else {
            SX_TRY(comm_->reduce_scatter_sum(grads, S, unit.accum.as<float>(), unit.accum_live));
            *shard_grad = unit.accum.as<float>();
        }
        return Status::Ok();
    }
    // 16-bit gradients: the reduced shard is always fp32, in the accumulator.
    uint16_t *grads = unit.grads.as<uint16_t>();
    float *out = unit.accum.as<float>();
    const uint64_t total = layout_.units()[u].padded_numel;
    if (world_size_ == 1) {
        // Nothing to sum: widen (or add) this rank's gradients into the fp32 shard.
        SX_TRY(ops_->widen(unit.grad_dtype, grads, out, S, unit.accum_live));
    } else if (reduces_in_16bit(u)) {
        // Summed in the 16-bit dtype: divided by sqrt(world_size) before, so that the sum
        // does not overflow, and multiplied back by it in fp32 after (the average's 1/N
        // comes with the update's gradient scale), so that small values do not underflow.
        const float root = std::sqrt(static_cast<float>(world_size_));
        const float inv_root = 1.0f / root;
        SX_TRY(ops_->scale16(unit.grad_dtype, grads, inv_root, total));
        SX_TRY(comm_->reduce_scatter_sum_16(grads, unit.grad_dtype, S, out, root, unit.accum_live));
    } else {
        float *wide = reduce_scratch_.as<float>();
        SX_TRY(ops_->widen(unit.grad_dtype, grads, wide, total, false));
        SX_TRY(comm_->reduce_scatter_sum(wide, S, out, unit.accum_live));
    }
    *shard_grad = out;
    return Status::Ok();
}

Status ShardGroup::zero_grads() {
    for (Unit &unit : units_) SX_TRY(ops_->zero(unit.grads.data(), unit.grads.size()));
    return Status::Ok();
}

std::vector<uint8_t> ShardGroup::step_facts(bool defer_gather) const {
    std::vector<uint8_t> facts(1, defer_gather ? 1 : 0);
    if (config_.stage == 3)
        for (const Unit &unit : units_) facts.push_back(unit.pins > 0 ? 1 : 0);
    return facts;
}

Status ShardGroup::reduce_here(const char *what, double max_grad_norm, bool accumulate, bool defer_gather) {
    std::vector<uint8_t> mask = candidate_mask();
    SX_TRY(check_ranks_agree(what, mask, max_grad_norm, step_facts(defer_gather)));
    SX_TRY(prepare(mask));
    // Stage 1 keeps a micro-batch's gradients in place until the step.
    if (accumulate && config_.stage == 1) return Status::Ok();
    for (size_t u = 0; u < units_.size(); ++u) {
        Unit &unit = units_[u];
        if (!unit.trainable) continue;
        Status s = reduce_unit(u, accumulate, &reduced_[u]);
        if (!s.ok()) return fail(s);
        if (accumulate) unit.accum_live = true;
    }
    return Status::Ok();
}

Status ShardGroup::accumulate_grads() {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    const bool overlapped = round_.open;  // the reductions zeroed their units' gradients
    if (overlapped) {
        SX_CHECK(round_.accumulate, SX_ERR_INVALID_STATE,
                 "the units signalled ready in this micro-batch said that sx_step ends it (accumulate = 0), "
                 "not sx_accumulate_grads");
        SX_TRY(close_round("sx_accumulate_grads", 0.0, step_facts(false)));
    } else {
        {
            Status s = ops_->wait_for(nullptr);  // the legacy default stream
            if (!s.ok()) return fail(s);
        }
        SX_TRY(reduce_here("sx_accumulate_grads", 0.0, true, false));
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

Status ShardGroup::finish_step(bool keep_grads) {
    for (Unit &unit : units_) unit.accum_live = false;
    micro_batches_ = 0;
    // Stage 3: this step's gathers are the order the next one prefetches in.
    if (!gather_log_.empty()) gather_order_ = std::move(gather_log_);
    gather_log_.clear();
    gather_pos_ = 0;
    Status s = keep_grads ? Status::Ok() : zero_grads();
    if (!s.ok()) return fail(s);
    if (config_.stage != 3) return s;
    // The next forward's first units are gathered while the trainer goes on (in the
    // buffers this step freed, if they fit); the other spares go.
    if (!gather_order_.empty()) prefetch();
    return drop_spares();
}

Status ShardGroup::step(const StepOptions &options, StepResult *result) {
    SX_TRY(check_usable());
    SX_TRY(check_finalized());
    SX_CHECK_ARG(std::isfinite(options.max_grad_norm) && options.max_grad_norm >= 0,
                 "max_grad_norm = %g; it must be finite and >= 0 (0 = no clipping)",
                 options.max_grad_norm);
    // The trainer's backward wrote the gradients on its stream. Waited for before anything
    // collective, so that a bad stream is this call's error alone and the group stays usable.
    SX_TRY(ops_->wait_for(options.stream));

    // 1. Every trainable unit's gradients reduced into this rank's shard: those signalled
    //    ready are on their way (or done), the rest go now. With signals, the reduction
    //    channel also summed each unit's squares, and the ranks exchanged them with their
    //    agreement, so the norm is known here.
    bool have_sumsq = false;
    double sumsq = 0.0;
    if (round_.open) {
        SX_CHECK(!round_.accumulate, SX_ERR_INVALID_STATE,
                 "the units signalled ready in this micro-batch said that sx_accumulate_grads ends it "
                 "(accumulate = 1), not sx_step");
        SX_TRY(close_round("sx_step", options.max_grad_norm, step_facts(options.defer_gather), &sumsq));
        have_sumsq = true;
    } else {
        SX_TRY(reduce_here("sx_step", options.max_grad_norm, false, options.defer_gather));
    }
    // The gathers still in flight (deferred, or prefetched) end before the update
    // writes the shards they read.
    SX_TRY(settle());

    // 2. Global norm of the rank-averaged, unscaled gradients, and the clipping
    //    coefficient. Dynamic loss scaling needs it (for its inf/NaN check) before the
    //    update, clipping too; otherwise it comes out of the update's own pass.
    const bool dynamic = scaling_.mode == SX_LOSS_SCALING_DYNAMIC;
    const double divisor = static_cast<double>(world_size_) * scaler_.scale;  // the scale is 1 without scaling
    const bool norm_first = have_sumsq || options.max_grad_norm > 0 || dynamic;
    double norm = 0.0, coef = 1.0;
    if (norm_first) {
        if (!have_sumsq) SX_TRY(global_norm(static_cast<float>(1.0 / divisor), &sumsq));
        norm = std::sqrt(sumsq);
        if (dynamic && !std::isfinite(norm)) {
            // torch.cuda.amp.GradScaler: skip the step, back off, restart the growth count.
            // Every rank saw the same sum, so every rank skips.
            scaler_.scale *= scaling_.backoff_factor;
            scaler_.growth_tracker = 0;
            SX_TRY(finish_step(options.keep_grads));
            report_step(norm, true, result);
            return Status::Ok();
        }
        coef = clip_coefficient(norm, options.max_grad_norm);
    }

    // 3. The fused update of this rank's shard (the norm comes out of the same pass when
    //    it was not needed first), once a checkpoint's snapshot has been copied out of
    //    it: the reduction above overlapped that copy. 16-bit units update their fp32
    //    masters, which the same pass rounds into the params. With defer_gather, the
    //    unit the next forward reads first is updated first, and its gather starts while
    //    the others are updated.
    fence_.wait_readers();
    const float grad_scale = static_cast<float>(coef / divisor);
    double update_sumsq = 0.0;
    Status s = ensure_masters();
    const int32_t head = options.defer_gather ? first_deferred_gather() : -1;
    if (s.ok() && head >= 0) {
        std::vector<optim::Segment> first;
        append_unit_segments(static_cast<size_t>(head), reduced_[head], &first);
        s = ops_->fused_update(first.data(), first.size(), grad_scale, norm_first ? nullptr : &update_sumsq);
        if (s.ok()) s = open_gather_channel();
        if (s.ok()) s = submit_gather(static_cast<size_t>(head));
    }
    if (s.ok()) {
        const std::vector<optim::Segment> segs = segments(reduced_, head);
        double rest = 0.0;
        s = ops_->fused_update(segs.data(), segs.size(), grad_scale, norm_first ? nullptr : &rest);
        update_sumsq += rest;
    }
    if (s.ok() && !norm_first) s = sum_over_ranks(update_sumsq, &sumsq);
    if (!s.ok()) return fail(s);
    if (!norm_first) norm = std::sqrt(sumsq);

    // 4. The updated params: gathered now, or in the background (defer_gather), or at
    //    stage 3 only where a unit is gathered.
    SX_TRY(gather_after_update(options.defer_gather, head));

    // 5. Per-param step counts, the loss scale's growth, and a clean slate.
    count_step(dynamic);
    SX_TRY(finish_step(options.keep_grads));
    ++steps_;
    report_step(norm, false, result);
    return Status::Ok();
}

void ShardGroup::append_unit_segments(size_t u, float *reduced, std::vector<optim::Segment> *out) const {
    const Unit &unit = units_[u];
    if (!unit.trainable) return;
    const UnitShard v = unit_shard(u);
    for (int32_t p : layout_.units()[u].params) {
        if (!applied_mask_[p]) continue;
        const ShardPiece piece = layout_.piece(p, rank_);
        if (piece.begin == piece.end) continue;
        const ParamSpec &spec = params_[p];
        optim::Segment seg;
        seg.param = v.values + piece.shard_offset;  // fp32: the params, or the masters
        if (!unit.master.empty()) {  // ... rounded into the 16-bit params in the same pass
            seg.compute_out = own_params16(u) + piece.shard_offset;
            seg.compute_dtype = unit.dtype;
        }
        seg.grad = reduced + piece.shard_offset;
        for (int k = 0; k < unit.state_slots; ++k) seg.state[k] = v.state[k] + piece.shard_offset;
        seg.n = piece.end - piece.begin;
        seg.hyper = &groups_[spec.group].hyper;
        seg.step = (seg.hyper->kind == optim::Kind::kSgd ? spec.momentum_steps : spec.step) + 1;
        out->push_back(seg);
    }
}

std::vector<optim::Segment> ShardGroup::segments(const std::vector<float *> &reduced, int32_t except) const {
    std::vector<optim::Segment> segs;
    for (size_t u = 0; u < units_.size(); ++u)
        if (static_cast<int32_t>(u) != except) append_unit_segments(u, reduced[u], &segs);
    return segs;
}

Status ShardGroup::unit_sumsq(size_t u, float grad_scale, double *out) {
    std::vector<optim::Segment> segs;
    append_unit_segments(u, reduced_[u], &segs);
    *out = 0.0;
    return segs.empty() ? Status::Ok() : ops_->sum_of_squares(segs.data(), segs.size(), grad_scale, out);
}

Status ShardGroup::global_norm(float grad_scale, double *sumsq) {
    // Unit by unit, added in unit order, then over the ranks in rank order: the same sum,
    // bit for bit, as the reduction channel's per-unit sums give an overlapped step.
    double local = 0.0;
    for (size_t u = 0; u < units_.size(); ++u) {
        double part = 0.0;
        Status s = unit_sumsq(u, grad_scale, &part);
        if (!s.ok()) return fail(s);
        local += part;
    }
    return sum_over_ranks(local, sumsq);
}

Status ShardGroup::gather_trainable_units() {
    if (world_size_ == 1) return Status::Ok();
    for (size_t u = 0; u < units_.size(); ++u) {
        if (!units_[u].trainable) continue;
        const uint64_t S = layout_.units()[u].shard_numel;
        Status s = comm_->all_gather(units_[u].params.data(), S * dtype_size(units_[u].dtype));
        if (!s.ok()) return fail(s);
    }
    return Status::Ok();
}

void ShardGroup::count_step(bool dynamic) {
    // torch keeps the step count per param; SGD's momentum buffer has its own.
    for (size_t p = 0; p < params_.size(); ++p) {
        if (!applied_mask_[p]) continue;
        ParamSpec &spec = params_[p];
        ++spec.step;
        const optim::Hyper &h = groups_[spec.group].hyper;
        if (h.kind == optim::Kind::kSgd && h.momentum != 0) ++spec.momentum_steps;
    }
    if (dynamic && ++scaler_.growth_tracker >= scaling_.growth_interval) {
        scaler_.scale *= scaling_.growth_factor;
        scaler_.growth_tracker = 0;
    }
}

void ShardGroup::report_step(double grad_norm, bool skipped, StepResult *result) const {
    if (!result) return;
    result->grad_norm = grad_norm;
    result->step = steps_;
    result->skipped = skipped;
    result->loss_scale = scaler_.scale;
}

}  // namespace core
}  // namespace sx
