// Entry points: views, trainability, the step.
#include "api/guard.h"
#include "api/handles.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;

namespace {

sx_status_t view(const char *fn, const sx_shard_group_t *group, int32_t param, sx_view_t *out,
                 bool grad) {
    return guard(fn, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_TRY(sx::api::check_output(out, "out"));
        SX_TRY(g->table().check_laid_out(param));
        if (!grad) SX_TRY(g->pipeline().check_param_present(param));
        sx_view_t v;
        std::memset(&v, 0, sizeof v);
        v.struct_size = sizeof v;
        v.data = grad ? g->grad_data(param) : g->param_data(param);
        v.numel = g->param(param).numel;
        v.dtype = grad ? g->grad_dtype(param) : g->param(param).dtype;
        v.device = g->ops().device();
        sx::api::write_output(out, v);
        return Status::Ok();
    });
}

}  // namespace

extern "C" {

SX_API sx_status_t sx_view_init(sx_view_t *view, size_t size) {
    return guard(__func__, [&] {
        sx_view_t v;
        std::memset(&v, 0, sizeof v);
        return sx::api::init_struct(view, size, v, "view");
    });
}

SX_API sx_status_t sx_param_view(const sx_shard_group_t *group, int32_t param, sx_view_t *out) {
    return view(__func__, group, param, out, false);
}

SX_API sx_status_t sx_grad_view(const sx_shard_group_t *group, int32_t param, sx_view_t *out) {
    return view(__func__, group, param, out, true);
}

SX_API sx_status_t sx_unit_view(const sx_shard_group_t *group, int32_t unit, int32_t grad, sx_view_t *out) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_TRY(sx::api::check_output(out, "out"));
        SX_CHECK_ARG(grad == 0 || grad == 1, "grad is %d; it must be 0 (the params) or 1 (the gradients)", grad);
        sx_view_t v;
        std::memset(&v, 0, sizeof v);
        v.struct_size = sizeof v;
        SX_TRY(g->unit_buffer(unit, grad != 0, &v.data, &v.numel, &v.dtype));
        v.device = g->ops().device();
        sx::api::write_output(out, v);
        return Status::Ok();
    });
}

SX_API sx_status_t sx_find_param(const sx_shard_group_t *group, const char *name, int32_t *index) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(index != nullptr, "index is NULL");
        return g->table().find(name, index);
    });
}

SX_API sx_status_t sx_set_trainable(sx_shard_group_t *group, int32_t param, int32_t trainable) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(trainable == 0 || trainable == 1, "trainable is %d; it must be 0 or 1", trainable);
        SX_TRY(g->check_usable());
        return g->table().set_trainable(param, trainable != 0);
    });
}

SX_API sx_status_t sx_get_trainable(const sx_shard_group_t *group, int32_t param, int32_t *trainable) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(trainable != nullptr, "trainable is NULL");
        SX_TRY(g->table().check_param(param));
        *trainable = g->table().trainable(param) ? 1 : 0;
        return Status::Ok();
    });
}

SX_API sx_status_t sx_trainable_mask(sx_shard_group_t *group, uint8_t **mask, int32_t *count) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(mask != nullptr, "mask is NULL");
        SX_CHECK_ARG(count != nullptr, "count is NULL");
        SX_CHECK(g->table().finalized(), SX_ERR_INVALID_STATE,
                 "the trainable mask is handed out after sx_finalize (params may still be added "
                 "before, which would move it)");
        *mask = g->table().mask();
        *count = g->num_params();
        return Status::Ok();
    });
}

SX_API sx_status_t sx_refresh_trainable(sx_shard_group_t *group) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        return g->refresh_trainable();
    });
}

SX_API sx_status_t sx_accumulate_grads(sx_shard_group_t *group) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        return g->accumulate_grads();
    });
}

SX_API sx_status_t sx_step_options_init(sx_step_options_t *options, size_t size) {
    return guard(__func__, [&] {
        sx_step_options_t o;
        std::memset(&o, 0, sizeof o);
        return sx::api::init_struct(options, size, o, "options");
    });
}

SX_API sx_status_t sx_step_result_init(sx_step_result_t *result, size_t size) {
    return guard(__func__, [&] {
        sx_step_result_t r;
        std::memset(&r, 0, sizeof r);
        return sx::api::init_struct(result, size, r, "result");
    });
}

SX_API sx_status_t sx_step(sx_shard_group_t *group, const sx_step_options_t *options,
                           sx_step_result_t *result) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        sx_step_options_t o;
        std::memset(&o, 0, sizeof o);
        if (options) SX_TRY(sx::api::read_input(options, "options", sizeof(size_t), &o));
        if (result) SX_TRY(sx::api::check_output(result, "result"));
        SX_CHECK_ARG(o.keep_grads == 0 || o.keep_grads == 1, "options->keep_grads is %d; it must be 0 or 1",
                     o.keep_grads);
        SX_CHECK_ARG(o.defer_gather == 0 || o.defer_gather == 1, "options->defer_gather is %d; it must be 0 or 1",
                     o.defer_gather);
        SX_CHECK(o.stream == nullptr || g->ops().device() == SX_DEVICE_CUDA, SX_ERR_INVALID_ARGUMENT,
                 "options->stream is set but the group runs on the CPU backend");
        SX_CHECK_ARG(o.weighted == 0 || o.weighted == 1, "options->weighted is %d; it must be 0 or 1", o.weighted);
        SX_CHECK_ARG(o.reserved0 == 0, "options->reserved0 is %d; it must be 0", o.reserved0);
        SX_CHECK_ARG(o.weighted || o.weight == 0.0, "options->weight is %g but options->weighted is 0", o.weight);
        SX_CHECK_ARG(o.nonfinite >= SX_NONFINITE_DEFAULT && o.nonfinite <= SX_NONFINITE_ERROR,
                     "options->nonfinite is %d; it must be SX_NONFINITE_DEFAULT (0), SX_NONFINITE_SKIP (1) or "
                     "SX_NONFINITE_ERROR (2)",
                     o.nonfinite);
        SX_CHECK_ARG(o.reserved1 == 0, "options->reserved1 is %d; it must be 0", o.reserved1);
        sx::core::StepOptions so;
        so.weighted = o.weighted != 0;
        so.weight = o.weight;
        so.stream = o.stream;
        so.max_grad_norm = o.max_grad_norm;
        so.keep_grads = o.keep_grads != 0;
        so.defer_gather = o.defer_gather != 0;
        so.nonfinite = o.nonfinite;
        sx::core::StepResult r;
        const Status stepped = g->step(so, &r);
        // A step refused for non-finite gradients (SX_NONFINITE_ERROR) still reports.
        if (!stepped.ok() && stepped.code() != SX_ERR_NONFINITE) return stepped;
        if (result) {
            sx_step_result_t out;
            std::memset(&out, 0, sizeof out);
            out.struct_size = sizeof out;
            out.grad_norm = r.grad_norm;
            out.step = r.step;
            out.skipped = r.skipped ? 1 : 0;
            out.loss_scale = r.loss_scale;
            out.nonfinite = r.nonfinite ? 1 : 0;
            sx::api::write_output(result, out);
        }
        return stepped;
    });
}

SX_API sx_status_t sx_loss_scaling_init(sx_loss_scaling_t *scaling, size_t size) {
    return guard(__func__, [&] {
        sx_loss_scaling_t d;
        std::memset(&d, 0, sizeof d);
        return sx::api::init_struct(scaling, size, d, "scaling");
    });
}

SX_API sx_status_t sx_set_loss_scaling(sx_shard_group_t *group, const sx_loss_scaling_t *scaling) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(scaling != nullptr, "scaling is NULL");
        sx_loss_scaling_t in;
        std::memset(&in, 0, sizeof in);
        SX_TRY(sx::api::read_input(scaling, "scaling", sizeof(size_t), &in));
        // Zero means torch.cuda.amp.GradScaler's default.
        sx::core::LossScaling ls;
        ls.mode = in.mode;
        if (in.init_scale != 0) ls.init_scale = in.init_scale;
        if (in.growth_factor != 0) ls.growth_factor = in.growth_factor;
        if (in.backoff_factor != 0) ls.backoff_factor = in.backoff_factor;
        if (in.growth_interval != 0) ls.growth_interval = in.growth_interval;
        return g->set_loss_scaling(ls);
    });
}

SX_API sx_status_t sx_get_loss_scale(const sx_shard_group_t *group, double *scale) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(scale != nullptr, "scale is NULL");
        *scale = g->loss_scaler().scale;
        return Status::Ok();
    });
}

SX_API sx_status_t sx_unit_ready_options_init(sx_unit_ready_options_t *options, size_t size) {
    return guard(__func__, [&] {
        sx_unit_ready_options_t o;
        std::memset(&o, 0, sizeof o);
        return sx::api::init_struct(options, size, o, "options");
    });
}

SX_API sx_status_t sx_unit_grads_ready(sx_shard_group_t *group, int32_t unit, const sx_unit_ready_options_t *options) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        sx_unit_ready_options_t o;
        std::memset(&o, 0, sizeof o);
        if (options) SX_TRY(sx::api::read_input(options, "options", sizeof(size_t), &o));
        SX_CHECK_ARG(o.accumulate == 0 || o.accumulate == 1, "options->accumulate is %d; it must be 0 or 1",
                     o.accumulate);
        SX_CHECK_ARG(o.reserved0 == 0, "options->reserved0 is %d; it must be 0", o.reserved0);
        SX_CHECK(o.stream == nullptr || g->ops().device() == SX_DEVICE_CUDA, SX_ERR_INVALID_ARGUMENT,
                 "options->stream is set but the group runs on the CPU backend");
        return g->pipeline().unit_grads_ready(unit, o.accumulate != 0, o.stream);
    });
}

SX_API sx_status_t sx_unit_gather(sx_shard_group_t *group, int32_t unit) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        return g->pipeline().unit_gather(unit);
    });
}

SX_API sx_status_t sx_unit_release(sx_shard_group_t *group, int32_t unit) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        return g->pipeline().unit_release(unit);
    });
}

}  // extern "C"
