// Entry points: creating and destroying groups, param groups, params, finalize.
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "api/guard.h"
#include "api/handles.h"
#include "optim/custom.h"
#include "optim/openmp_team.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;

namespace {

sx_group_config_t default_config() {
    sx_group_config_t c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    return c;
}

sx_param_group_desc_t desc_defaults(int32_t optimizer) {
    sx_param_group_desc_t d;
    std::memset(&d, 0, sizeof d);
    d.struct_size = sizeof d;
    sx::core::hyper_to_desc(sx::core::default_hyper(optimizer), &d);
    return d;
}

Status check_optimizer(int32_t optimizer) {
    SX_CHECK_ARG(optimizer == 0 || sx::optim::find_optimizer(optimizer) != nullptr,
                 "optimizer %d is not one sx has (SX_OPTIM_*: %s) nor one sx_register_optimizer returned", optimizer,
                 sx::optim::optimizer_list().c_str());
    return Status::Ok();
}

Status check_flag(int32_t v, const char *what) {
    SX_CHECK_ARG(v == 0 || v == 1, "%s is %d; it must be 0 or 1", what, v);
    return Status::Ok();
}

// The core's configuration of a group from c (a context's fields are checked by
// in_context).
Status core_config(const sx_group_config_t &c, sx::core::GroupConfig *out) {
    sx::core::GroupConfig &g = *out;
    const uint32_t known = SX_GROUP_NO_TRAINABLE_AUTODETECT | SX_GROUP_RESERVE_CHECKPOINT_STAGING | SX_GROUP_JOIN |
                           SX_GROUP_MEMORY_COPY_WAIT | SX_GROUP_OPENMP_THREADS;
    SX_CHECK_ARG((c.flags & ~known) == 0, "config->flags has unknown bits 0x%x", c.flags & ~known);
    if (c.flags & SX_GROUP_OPENMP_THREADS) {
        Status found = sx::optim::OpenMpTeam::find(&g.openmp_team);
        if (!found.ok()) return found.prefix("config->flags has SX_GROUP_OPENMP_THREADS, but ");
    }
    g.rendezvous = c.rendezvous ? c.rendezvous : "";
    g.rank = c.rank;
    g.world_size = c.world_size;
    g.stage = c.stage == 0 ? 2 : c.stage;
    g.backend = c.backend;
    g.num_threads = c.num_threads;
    g.alignment = c.alignment == 0 ? 64 : c.alignment;
    g.timeout_ms = c.timeout_ms == 0 ? 300000 : c.timeout_ms;
    g.flags = c.flags;
    g.bind_address = c.bind_address ? c.bind_address : "";
    g.rendezvous_token = c.rendezvous_token ? c.rendezvous_token : "";
    g.rendezvous_bind = c.rendezvous_bind ? c.rendezvous_bind : "";
    g.device_ordinal = c.device_ordinal;
    g.grad_dtype = c.grad_dtype;
    g.reduce_dtype = c.reduce_dtype;
    SX_CHECK_ARG(c.prefetch_depth >= SX_PREFETCH_NONE, "config->prefetch_depth is %d; it must be >= 0 or "
                 "SX_PREFETCH_NONE", c.prefetch_depth);
    g.prefetch_depth = c.prefetch_depth == 0 ? 1 : c.prefetch_depth == SX_PREFETCH_NONE ? 0 : c.prefetch_depth;
    g.shard_size = c.shard_size;
    g.grad_predivide_factor = c.grad_predivide_factor;
    SX_CHECK_ARG(c.trace_events >= 0, "config->trace_events is %d; it must be >= 0 (0 = %zu)", c.trace_events,
                 sx::trace::kDefaultCapacity);
    SX_CHECK_ARG(c.reserved0 == 0, "config->reserved0 is %d; it must be 0", c.reserved0);
    SX_CHECK_ARG(c.transport == SX_TRANSPORT_AUTO || c.transport == SX_TRANSPORT_TCP,
                 "config->transport is %d; it must be SX_TRANSPORT_AUTO (0) or SX_TRANSPORT_TCP (1)", c.transport);
    g.transport = c.transport;
    SX_CHECK_ARG(c.memory_copy_interval >= 0, "config->memory_copy_interval is %d; it must be >= 0 (0 = no "
                 "memory copies)", c.memory_copy_interval);
    g.memory_copy_interval = c.memory_copy_interval;
    g.offload = c.offload;
    g.joining = (c.flags & SX_GROUP_JOIN) != 0;
    if (g.joining) {
        g.rank = 0;  // a joining process's rank comes from the members at its admission
        g.world_size = 1;
    }
    // The config's path wins over the environment's.
    const char *env_trace = std::getenv("SX_TRACE");
    if (c.trace_path && c.trace_path[0]) {
        g.trace_path = c.trace_path;
    } else if (env_trace && env_trace[0]) {
        g.trace_path = env_trace;
    }
    g.trace_capacity = static_cast<size_t>(c.trace_events);
    return Status::Ok();
}

// A group of c.context: the fields the context owns must be left empty (or equal its own).
Status in_context(const sx_group_config_t &c, sx::core::GroupConfig *g) {
    SX_TRY(sx::api::resolve_context(c.context, &g->context));
    const sx::core::GroupConfig &b = g->context->base();
    SX_CHECK_ARG(c.name != nullptr && c.name[0] != '\0', "config->name is empty: a group made in a context needs a "
                 "name (the same on every rank)");
    g->name = c.name;
    auto empty_or = [](const char *v, const std::string &ctx) { return v == nullptr || v[0] == '\0' || ctx == v; };
    SX_CHECK_ARG(empty_or(c.rendezvous, b.rendezvous),
                 "config->rendezvous is '%s', but a group made in a context takes the context's ('%s'): leave it NULL",
                 c.rendezvous, b.rendezvous.c_str());
    SX_CHECK_ARG(c.world_size == 0 || (c.world_size == b.world_size && c.rank == b.rank),
                 "config->rank %d and world_size %d are not the context's (%d of %d): leave them 0", c.rank,
                 c.world_size, b.rank, b.world_size);
    SX_CHECK_ARG(c.backend == SX_BACKEND_AUTO || c.backend == b.backend,
                 "config->backend %d is not the context's (%d): leave it 0", c.backend, b.backend);
    SX_CHECK_ARG(c.num_threads == 0 && c.transport == 0 && c.device_ordinal == 0 &&
                     empty_or(c.bind_address, "") && empty_or(c.rendezvous_token, "") &&
                     empty_or(c.rendezvous_bind, ""),
                 "config->num_threads, transport, device_ordinal, bind_address, rendezvous_token and rendezvous_bind "
                 "are the context's: a group made in a context leaves them 0 or NULL");
    SX_CHECK_ARG(c.timeout_ms == 0 || c.timeout_ms == b.timeout_ms,
                 "config->timeout_ms %d is not the context's (%d): leave it 0", c.timeout_ms, b.timeout_ms);
    return Status::Ok();
}

}  // namespace

namespace sx {
namespace api {

Status create_core_group(const sx_group_config_t *config, std::unique_ptr<sx::core::ShardGroup> *out) {
    sx_group_config_t c = default_config();
    SX_TRY(sx::api::read_input(config, "config",
                               offsetof(sx_group_config_t, rendezvous) + sizeof(char *), &c));
    SX_CHECK_ARG(c.context != nullptr || (c.rendezvous != nullptr && c.rendezvous[0] != '\0'),
                 "config->rendezvous is empty; expected local://NAME, tcp://HOST:PORT, "
                 "file:///DIR or env://");
    const bool joining = (c.flags & SX_GROUP_JOIN) != 0;
    SX_CHECK_ARG(c.context != nullptr || joining || c.name == nullptr || c.name[0] == '\0',
                 "config->name '%s' is for a group made in a context (or one that joins such a group: "
                 "SX_GROUP_JOIN), and config->context is NULL", c.name);
    SX_CHECK_ARG(c.reserved1 == 0, "config->reserved1 is %d; it must be 0", c.reserved1);
    sx::core::GroupConfig g;
    SX_TRY(core_config(c, &g));
    if (c.context) SX_TRY(in_context(c, &g));
    if (!c.context && joining && c.name && c.name[0]) {
        SX_CHECK_ARG(sx::core::valid_group_name(c.name),
                     "config->name '%s' (the context's group to join) must be 1 to 128 letters, digits, '-', '_' or "
                     "'.'", c.name);
        g.name = c.name;
    }
    return sx::core::ShardGroup::create(g, out);
}

}  // namespace api
}  // namespace sx

extern "C" {

SX_API sx_status_t sx_group_config_init(sx_group_config_t *config, size_t size) {
    return guard(__func__, [&] {
        SX_TRY(sx::api::check_struct_size(size, offsetof(sx_group_config_t, rendezvous) + sizeof(char *),
                                          "config", sizeof(sx_group_config_t)));
        return sx::api::init_struct(config, size, default_config(), "config");
    });
}

SX_API sx_status_t sx_create_shard_group(const sx_group_config_t *config, sx_shard_group_t **out) {
    if (out) *out = nullptr;
    return guard(__func__, [&]() -> Status {
        SX_CHECK_ARG(out != nullptr, "out is NULL");
        std::unique_ptr<sx::core::ShardGroup> impl;
        SX_TRY(sx::api::create_core_group(config, &impl));
        std::unique_ptr<sx_shard_group> h(new sx_shard_group());
        h->magic = sx::api::kGroupMagic;
        h->owner = ::getpid();
        h->impl = std::move(impl);
        sx::api::register_handle(h.get());
        *out = h.release();
        return Status::Ok();
    });
}

SX_API sx_status_t sx_destroy_shard_group(sx_shard_group_t *group) {
    return guard(__func__, [&]() -> Status {
        if (group == nullptr) return Status::Ok();
        if (sx::api::handle_live(group) && group->magic == sx::api::kGroupMagic &&
            sx::api::forked_from(group->owner)) {
            // A fork of the process that made it: forgotten, nothing released (handles.h).
            sx::api::unregister_handle(group);
            sx::api::forget_in_fork(std::move(group->impl), std::move(group->checkpointer));
            group->magic = 0;
            delete group;
            return Status::Ok();
        }
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        sx::api::unregister_handle(group);
        group->magic = 0;
        group->checkpointer.reset();
        delete group;
        return Status::Ok();
    });
}

SX_API sx_status_t sx_trace_flush(sx_shard_group_t *group) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        return g->flush_trace();
    });
}

SX_API sx_status_t sx_abort(sx_shard_group_t *group) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        g->abort();
        return Status::Ok();
    });
}

SX_API sx_status_t sx_param_group_desc_init(sx_param_group_desc_t *desc, size_t size, int32_t optimizer) {
    return guard(__func__, [&] {
        SX_TRY(check_optimizer(optimizer));
        return sx::api::init_struct(desc, size, desc_defaults(optimizer), "desc");
    });
}

SX_API sx_status_t sx_optimizer_desc_init(sx_optimizer_desc_t *desc, size_t size) {
    return guard(__func__, [&] {
        sx_optimizer_desc_t d;
        std::memset(&d, 0, sizeof d);
        return sx::api::init_struct(desc, size, d, "desc");
    });
}

SX_API sx_status_t sx_register_optimizer(const sx_optimizer_desc_t *desc, int32_t *optimizer) {
    return guard(__func__, [&]() -> Status {
        SX_CHECK_ARG(desc != nullptr, "desc is NULL");
        SX_CHECK_ARG(optimizer != nullptr, "optimizer is NULL");
        sx_optimizer_desc_t d;
        std::memset(&d, 0, sizeof d);
        SX_TRY(sx::api::read_input(desc, "desc", offsetof(sx_optimizer_desc_t, user_data) + sizeof(void *), &d));
        return sx::optim::register_custom(d, optimizer);
    });
}

SX_API sx_status_t sx_add_param_group(sx_shard_group_t *group, const sx_param_group_desc_t *desc,
                                      int32_t *index_out) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(desc != nullptr, "desc is NULL");
        const size_t min_size = offsetof(sx_param_group_desc_t, optimizer) + sizeof(int32_t);
        SX_TRY(sx::api::check_struct_size(desc->struct_size, min_size, "desc",
                                          sizeof(sx_param_group_desc_t)));
        SX_TRY(check_optimizer(desc->optimizer));
        // Fields an older caller's struct lacks take the defaults of its optimizer.
        sx_param_group_desc_t d = desc_defaults(desc->optimizer);
        SX_TRY(sx::api::read_input(desc, "desc", min_size, &d));
        SX_TRY(sx::core::check_desc_flags(d));
        if (d.optimizer == 0) d.optimizer = SX_OPTIM_ADAMW;
        SX_TRY(g->check_usable());
        // Where the state lives is where the update runs: the host for CPU groups and for
        // CUDA groups that offload it.
        const bool host = g->state_ops().device() == SX_DEVICE_CPU;
        SX_CHECK(!sx::optim::is_custom(static_cast<sx::optim::Kind>(d.optimizer)) || host, SX_ERR_UNSUPPORTED,
                 "the custom optimizer '%s' runs on the host only; this group keeps its optimizer state on a CUDA "
                 "device (config->offload = SX_OFFLOAD_STATE keeps it on the host)",
                 sx::optim::optimizer_name(d.optimizer).c_str());
        const sx::optim::OptimizerSpec *spec = sx::optim::find_optimizer(d.optimizer);
        if (spec) SX_TRY(g->state_ops().check_runs(*spec));
        return g->table().add_group(sx::core::hyper_from_desc(d), index_out);
    });
}

SX_API sx_status_t sx_set_hyperparameter(sx_shard_group_t *group, int32_t param_group, int32_t key,
                                         double value) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        return g->set_hyperparameter(param_group, key, value);
    });
}

SX_API sx_status_t sx_get_hyperparameter(const sx_shard_group_t *group, int32_t param_group, int32_t key,
                                         double *value) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(value != nullptr, "value is NULL");
        return g->table().get_hyperparameter(param_group, key, value);
    });
}

SX_API sx_status_t sx_get_param_group_steps(const sx_shard_group_t *group, int32_t param_group, int64_t *steps) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(steps != nullptr, "steps is NULL");
        const int32_t n = g->table().num_groups();
        SX_CHECK_ARG(param_group >= 0 && param_group < n, "param_group %d is not one of this group's %d param groups",
                     param_group, n);
        *steps = g->table().groups()[static_cast<size_t>(param_group)].steps;
        return Status::Ok();
    });
}

SX_API sx_status_t sx_set_lr(sx_shard_group_t *group, int32_t param_group, double lr) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        return g->set_hyperparameter(param_group, SX_HP_LR, lr);
    });
}

SX_API sx_status_t sx_param_desc_init(sx_param_desc_t *desc, size_t size) {
    return guard(__func__, [&] {
        sx_param_desc_t d;
        std::memset(&d, 0, sizeof d);
        return sx::api::init_struct(desc, size, d, "desc");
    });
}

SX_API sx_status_t sx_add_param(sx_shard_group_t *group, const sx_param_desc_t *desc, int32_t *index_out) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        sx_param_desc_t d;
        std::memset(&d, 0, sizeof d);
        SX_TRY(sx::api::read_input(desc, "desc", offsetof(sx_param_desc_t, unit) + sizeof(int32_t), &d));
        SX_TRY(check_flag(d.frozen, "desc->frozen"));
        SX_CHECK_ARG(d.reserved0 == 0, "desc->reserved0 is %d; it must be 0", d.reserved0);
        SX_TRY(g->check_usable());
        SX_CHECK_ARG(d.global_shape == nullptr || d.placement == SX_PLACEMENT_SPLIT,
                     "desc->global_shape is for SX_PLACEMENT_SPLIT; it must be NULL for placement %d", d.placement);
        sx::core::Placement placement;
        placement.kind = d.placement;
        placement.split_dim = d.split_dim;
        // The extents are read only where the shape is sound (add_param checks it first).
        if (d.global_shape != nullptr && d.ndim > 0 && d.ndim <= SX_MAX_NDIM)
            placement.global_shape.assign(d.global_shape, d.global_shape + d.ndim);
        placement.offset = d.split_offset;
        placement.replica = d.replica;
        placement.replicas = d.replicas;
        return g->table().add_param(d.name, d.ndim, d.shape, d.dtype, d.param_group, d.unit, d.frozen != 0,
                                    index_out, placement);
    });
}

SX_API sx_status_t sx_finalize(sx_shard_group_t *group) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_TRY(g->finalize());
        if (g->config().flags & SX_GROUP_RESERVE_CHECKPOINT_STAGING) return sx::api::checkpointer_of(group).reserve_staging();
        return Status::Ok();
    });
}

SX_API sx_status_t sx_broadcast_params(sx_shard_group_t *group, int32_t root) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        return g->broadcast_params(root);
    });
}

SX_API sx_status_t sx_all_reduce(sx_shard_group_t *group, double *values, int32_t count, int32_t op) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(values != nullptr || count == 0, "values is NULL");
        return g->all_reduce(values, count, op);
    });
}

}  // extern "C"
