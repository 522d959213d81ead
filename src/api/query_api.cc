// Entry points: versions, status text, logging, and the queries.
#include "api/guard.h"
#include "api/handles.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;

namespace sx {
namespace api {
const char *last_error();
}  // namespace api
}  // namespace sx

namespace {

// `what` names the output parameter in the error text.
template <typename F>
sx_status_t query_int(const char *fn, const sx_shard_group_t *group, int32_t *out, const char *what,
                      F get) {
    return guard(fn, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(out != nullptr, "%s is NULL", what);
        *out = get(*g);
        return Status::Ok();
    });
}

}  // namespace

extern "C" {

SX_API uint32_t sx_version(void) { return SX_VERSION_NUMBER; }

SX_API const char *sx_status_string(sx_status_t status) {
    switch (status) {
        case SX_OK: return "SX_OK: success";
        case SX_ERR_INVALID_ARGUMENT: return "SX_ERR_INVALID_ARGUMENT: an argument is invalid";
        case SX_ERR_INVALID_HANDLE: return "SX_ERR_INVALID_HANDLE: not a live sx handle";
        case SX_ERR_INVALID_STATE: return "SX_ERR_INVALID_STATE: the call is not allowed now";
        case SX_ERR_OUT_OF_MEMORY: return "SX_ERR_OUT_OF_MEMORY: an allocation failed";
        case SX_ERR_NOT_FOUND: return "SX_ERR_NOT_FOUND: not found";
        case SX_ERR_ALREADY_EXISTS: return "SX_ERR_ALREADY_EXISTS: already exists";
        case SX_ERR_UNSUPPORTED: return "SX_ERR_UNSUPPORTED: not supported by this build or backend";
        case SX_ERR_TIMEOUT: return "SX_ERR_TIMEOUT: a peer did not answer in time";
        case SX_ERR_COMM: return "SX_ERR_COMM: communication failed";
        case SX_ERR_GROUP_FAILED: return "SX_ERR_GROUP_FAILED: the group failed earlier";
        case SX_ERR_IO: return "SX_ERR_IO: a file operation failed";
        case SX_ERR_CORRUPT: return "SX_ERR_CORRUPT: data failed verification";
        case SX_ERR_VERSION: return "SX_ERR_VERSION: unsupported version";
        case SX_ERR_ABORTED: return "SX_ERR_ABORTED: the group was aborted";
        case SX_ERR_MISMATCH: return "SX_ERR_MISMATCH: ranks disagree";
        case SX_ERR_INTERNAL: return "SX_ERR_INTERNAL: internal error";
        case SX_ERR_CANCELLED: return "SX_ERR_CANCELLED: the operation was cancelled";
        case SX_ERR_NONFINITE: return "SX_ERR_NONFINITE: the gradients hold inf or NaN";
        case SX_ERR_OPTIMIZER: return "SX_ERR_OPTIMIZER: a custom optimizer's update reported failure";
        default: return "unknown sx status";
    }
}

SX_API const char *sx_last_error_message(void) { return sx::api::last_error(); }

SX_API sx_status_t sx_set_log_callback(sx_log_fn fn, void *user, int32_t max_level) {
    return guard(__func__, [&]() -> Status {
        SX_CHECK_ARG(fn == nullptr || (max_level >= SX_LOG_ERROR && max_level <= SX_LOG_DEBUG),
                     "max_level %d is not in [SX_LOG_ERROR, SX_LOG_DEBUG]", max_level);
        sx::set_log_callback(fn, user, max_level);
        return Status::Ok();
    });
}

SX_API sx_status_t sx_get_rank(const sx_shard_group_t *group, int32_t *rank) {
    return query_int(__func__, group, rank, "rank", [](const sx::core::ShardGroup &g) { return g.rank(); });
}

SX_API sx_status_t sx_get_world_size(const sx_shard_group_t *group, int32_t *world_size) {
    return query_int(__func__, group, world_size, "world_size",
                     [](const sx::core::ShardGroup &g) { return g.world_size(); });
}

SX_API sx_status_t sx_get_stage(const sx_shard_group_t *group, int32_t *stage) {
    return query_int(__func__, group, stage, "stage", [](const sx::core::ShardGroup &g) { return g.stage(); });
}

SX_API sx_status_t sx_get_num_params(const sx_shard_group_t *group, int32_t *count) {
    return query_int(__func__, group, count, "count",
                     [](const sx::core::ShardGroup &g) { return g.num_params(); });
}

SX_API sx_status_t sx_get_num_param_groups(const sx_shard_group_t *group, int32_t *count) {
    return query_int(__func__, group, count, "count",
                     [](const sx::core::ShardGroup &g) { return g.table().num_groups(); });
}

SX_API sx_status_t sx_get_num_units(const sx_shard_group_t *group, int32_t *count) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_CHECK_ARG(count != nullptr, "count is NULL");
        SX_CHECK(g->table().finalized(), SX_ERR_INVALID_STATE, "units are laid out by sx_finalize");
        *count = static_cast<int32_t>(g->layout().units().size());
        return Status::Ok();
    });
}

SX_API sx_status_t sx_memory_stats_init(sx_memory_stats_t *stats, size_t size) {
    return guard(__func__, [&] {
        sx_memory_stats_t m;
        std::memset(&m, 0, sizeof m);
        return sx::api::init_struct(stats, size, m, "stats");
    });
}

SX_API sx_status_t sx_get_memory_stats(const sx_shard_group_t *group, sx_memory_stats_t *out) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_TRY(sx::api::check_output(out, "out"));
        SX_CHECK(g->table().finalized(), SX_ERR_INVALID_STATE, "buffers are allocated by sx_finalize");
        const sx::core::MemoryStats s = g->memory_stats();
        sx_memory_stats_t m;
        std::memset(&m, 0, sizeof m);
        m.struct_size = sizeof m;
        m.param_bytes = s.param_bytes;
        m.grad_bytes = s.grad_bytes;
        m.optimizer_bytes = s.optimizer_bytes;
        m.staging_bytes = group->checkpointer ? group->checkpointer->staging_bytes() : 0;
        m.unsharded_optimizer_bytes = s.unsharded_optimizer_bytes;
        m.peak_param_bytes = s.peak_param_bytes;
        m.memory_copy_bytes = s.memory_copy_bytes;
        m.device_bytes = s.device_bytes;
        sx::api::write_output(out, m);
        return Status::Ok();
    });
}

SX_API sx_status_t sx_param_info_init(sx_param_info_t *info, size_t size) {
    return guard(__func__, [&] {
        sx_param_info_t i;
        std::memset(&i, 0, sizeof i);
        return sx::api::init_struct(info, size, i, "info");
    });
}

SX_API sx_status_t sx_get_param_info(const sx_shard_group_t *group, int32_t param, sx_param_info_t *out) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_TRY(sx::api::check_output(out, "out"));
        SX_TRY(g->table().check_param(param));
        const sx::core::ParamSpec &p = g->param(param);
        sx_param_info_t i;
        std::memset(&i, 0, sizeof i);
        i.struct_size = sizeof i;
        i.name = p.name.c_str();
        i.ndim = static_cast<int32_t>(p.shape.size());
        i.dtype = p.dtype;
        for (size_t d = 0; d < p.shape.size(); ++d) i.shape[d] = p.shape[d];
        i.numel = p.numel;
        i.param_group = p.group;
        i.unit = p.unit;
        i.trainable = g->table().trainable(param) ? 1 : 0;
        if (g->table().check_laid_out(param).ok()) {
            i.offset_in_unit = g->layout().placement(param).offset;
            const sx::core::ShardPiece piece = g->layout().piece(param, g->shard_rank());
            i.shard_begin = piece.begin;
            i.shard_end = piece.end;
        }
        sx::api::write_output(out, i);
        return Status::Ok();
    });
}

SX_API sx_status_t sx_unit_info_init(sx_unit_info_t *info, size_t size) {
    return guard(__func__, [&] {
        sx_unit_info_t i;
        std::memset(&i, 0, sizeof i);
        return sx::api::init_struct(info, size, i, "info");
    });
}

SX_API sx_status_t sx_get_unit_info(const sx_shard_group_t *group, int32_t index, sx_unit_info_t *out) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        SX_TRY(sx::api::check_output(out, "out"));
        SX_CHECK(g->table().finalized(), SX_ERR_INVALID_STATE, "units are laid out by sx_finalize");
        const auto &units = g->layout().units();
        SX_CHECK_ARG(index >= 0 && static_cast<size_t>(index) < units.size(),
                     "unit index %d is out of range (%zu units)", index, units.size());
        const sx::core::UnitLayout &u = units[index];
        sx_unit_info_t i;
        std::memset(&i, 0, sizeof i);
        i.struct_size = sizeof i;
        i.unit = u.unit_id;
        i.num_params = static_cast<int32_t>(u.params.size());
        i.numel = u.numel;
        i.padded_numel = u.padded_numel;
        i.shard_numel = u.shard_numel;
        i.shard_begin = static_cast<uint64_t>(g->shard_rank()) * u.shard_numel;
        i.trainable = g->units()[static_cast<size_t>(index)].trainable ? 1 : 0;
        i.has_optimizer_state = g->units()[static_cast<size_t>(index)].state_slots > 0 ? 1 : 0;
        i.shard_size = g->shard_size();
        i.shard_rank = g->shard_rank();
        i.replicas = g->world_size() / g->shard_size();
        i.replica_rank = g->replica_rank();
        sx::api::write_output(out, i);
        return Status::Ok();
    });
}

}  // extern "C"
