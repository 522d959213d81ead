// Entry points: whole optimizer state gathered and scattered, and in-place views of this
// rank's part of it.
#include <cmath>

#include "api/guard.h"
#include "api/handles.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;

namespace {

// The trainer's callback over sx_param_state_t; its status becomes a Status naming it.
sx::core::StateFn state_fn(sx_param_state_fn fn, void *user) {
    return [fn, user](sx::core::ParamState &st) -> Status {
        sx_param_state_t out;
        std::memset(&out, 0, sizeof out);
        out.struct_size = sizeof out;
        out.param = st.param;
        out.param_group = st.group;
        out.name = st.name;
        out.numel = st.numel;
        out.step = st.step;
        out.momentum_steps = st.momentum_steps;
        out.mu_product = static_cast<double>(st.mu_product);
        out.num_tensors = static_cast<int32_t>(st.tensors.size());
        out.tensor_names = st.names.data();
        out.tensors = st.tensors.data();
        out.tensor_numels = st.numels.data();
        const sx_status_t code = fn(&out, user);
        st.step = out.step;
        st.momentum_steps = out.momentum_steps;
        st.mu_product = static_cast<float>(out.mu_product);
        if (code == SX_OK) {
            SX_CHECK(std::isfinite(out.mu_product) && out.mu_product >= 0.0 && out.mu_product <= 1.0,
                     SX_ERR_INVALID_ARGUMENT, "param '%s': mu_product is %g; it must be in [0, 1] (0: from the step)",
                     st.name, out.mu_product);
            return Status::Ok();
        }
        return SX_ERROR(code, "the callback returned %s for param '%s'", sx_status_string(code), st.name);
    };
}

sx_status_t whole_state(const char *function, sx_shard_group_t *group, int32_t root, sx_param_state_fn fn,
                        void *user, bool gather) {
    return guard(function, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(root >= 0 && root < g->world_size(), "root rank %d is outside [0, %d)", root, g->world_size());
        // A root without fn still takes part (the others are already in the collective):
        // its first call fails, and every rank gets that failure.
        const sx::core::StateFn f =
            fn != nullptr ? state_fn(fn, user) : [](sx::core::ParamState &) -> Status {
                return SX_ERROR(SX_ERR_INVALID_ARGUMENT, "fn is NULL on the root");
            };
        return gather ? g->gather_state(root, f) : g->scatter_state(root, f);
    });
}

}  // namespace

extern "C" {

SX_API sx_status_t sx_gather_optim_state(sx_shard_group_t *group, int32_t root, sx_param_state_fn fn, void *user) {
    return whole_state(__func__, group, root, fn, user, true);
}

SX_API sx_status_t sx_scatter_optim_state(sx_shard_group_t *group, int32_t root, sx_param_state_fn fn,
                                          void *user) {
    return whole_state(__func__, group, root, fn, user, false);
}

SX_API sx_status_t sx_state_view(const sx_shard_group_t *group, int32_t param, const char *tensor, sx_view_t *out) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_TRY(sx::api::check_output(out, "out"));
        sx::core::ShardGroup::StateViewOut where;
        SX_TRY(g->state_view(param, tensor, &where));
        sx_view_t v;
        std::memset(&v, 0, sizeof v);
        v.struct_size = sizeof v;
        v.data = where.data;
        v.numel = where.numel;
        v.dtype = where.dtype;
        v.device = g->state_ops().device();  // offloaded state is on the host
        sx::api::write_output(out, v);
        return Status::Ok();
    });
}

}  // extern "C"
