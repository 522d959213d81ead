// Entry points: contexts (sx_context.h).
#include <unistd.h>

#include <cstddef>
#include <cstring>

#include "api/guard.h"
#include "api/handles.h"

using sx::Status;
using sx::api::guard;

namespace {

sx_context_config_t context_defaults() {
    sx_context_config_t c;
    std::memset(&c, 0, sizeof c);
    c.struct_size = sizeof c;
    return c;
}

// The group settings a context takes from its config (as sx_create_shard_group reads them).
Status context_base(const sx_context_config_t &c, sx::core::GroupConfig *g) {
    SX_CHECK_ARG(c.rendezvous != nullptr && c.rendezvous[0] != '\0',
                 "config->rendezvous is empty; expected local://NAME, tcp://HOST:PORT, file:///DIR or env://");
    SX_CHECK_ARG(c.backend == SX_BACKEND_AUTO || c.backend == SX_BACKEND_CPU || c.backend == SX_BACKEND_CUDA,
                 "config->backend %d is not SX_BACKEND_AUTO, SX_BACKEND_CPU or SX_BACKEND_CUDA", c.backend);
    SX_CHECK_ARG(c.num_threads >= 0 && c.num_threads <= 1024, "config->num_threads %d is not in [0, 1024]",
                 c.num_threads);
    SX_CHECK_ARG(c.timeout_ms >= 0, "config->timeout_ms %d must be >= 0 (0 = 300000)", c.timeout_ms);
    SX_CHECK_ARG(c.world_size >= 0 && c.world_size <= SX_MAX_WORLD_SIZE,
                 "config->world_size %d is not in [0, SX_MAX_WORLD_SIZE = %d] (0 = from the environment)",
                 c.world_size, SX_MAX_WORLD_SIZE);
    SX_CHECK_ARG(c.transport == SX_TRANSPORT_AUTO || c.transport == SX_TRANSPORT_TCP,
                 "config->transport is %d; it must be SX_TRANSPORT_AUTO (0) or SX_TRANSPORT_TCP (1)", c.transport);
    SX_CHECK_ARG(c.reserved0 == 0, "config->reserved0 is %d; it must be 0", c.reserved0);
    g->rendezvous = c.rendezvous;
    g->rank = c.rank;
    g->world_size = c.world_size;
    g->backend = c.backend;
    g->num_threads = c.num_threads;
    g->timeout_ms = c.timeout_ms == 0 ? 300000 : c.timeout_ms;
    g->transport = c.transport;
    g->bind_address = c.bind_address ? c.bind_address : "";
    g->rendezvous_token = c.rendezvous_token ? c.rendezvous_token : "";
    g->rendezvous_bind = c.rendezvous_bind ? c.rendezvous_bind : "";
    g->device_ordinal = c.device_ordinal;
    return Status::Ok();
}

}  // namespace

extern "C" {

SX_API sx_status_t sx_context_config_init(sx_context_config_t *config, size_t size) {
    return guard(__func__, [&] {
        SX_TRY(sx::api::check_struct_size(size, offsetof(sx_context_config_t, rendezvous) + sizeof(char *), "config",
                                          sizeof(sx_context_config_t)));
        return sx::api::init_struct(config, size, context_defaults(), "config");
    });
}

SX_API sx_status_t sx_context_stats_init(sx_context_stats_t *stats, size_t size) {
    return guard(__func__, [&] {
        sx_context_stats_t d;
        std::memset(&d, 0, sizeof d);
        d.struct_size = sizeof d;
        return sx::api::init_struct(stats, size, d, "stats");
    });
}

SX_API sx_status_t sx_create_context(const sx_context_config_t *config, sx_context_t **out) {
    if (out) *out = nullptr;
    return guard(__func__, [&]() -> Status {
        SX_CHECK_ARG(out != nullptr, "out is NULL");
        sx_context_config_t c = context_defaults();
        SX_TRY(sx::api::read_input(config, "config", offsetof(sx_context_config_t, rendezvous) + sizeof(char *), &c));
        sx::core::GroupConfig base;
        SX_TRY(context_base(c, &base));
        std::shared_ptr<sx::core::Context> impl;
        SX_TRY(sx::core::Context::create(base, c.memory_budget_bytes, &impl));
        std::unique_ptr<sx_context> h(new sx_context());
        h->magic = sx::api::kContextMagic;
        h->owner = ::getpid();
        h->impl = std::move(impl);
        sx::api::register_handle(h.get());
        *out = h.release();
        return Status::Ok();
    });
}

SX_API sx_status_t sx_destroy_context(sx_context_t *context) {
    return guard(__func__, [&]() -> Status {
        if (context == nullptr) return Status::Ok();
        SX_CHECK(sx::api::handle_live(context) && context->magic == sx::api::kContextMagic && context->impl,
                 SX_ERR_INVALID_HANDLE, "context %p is not a live sx context (destroyed, or not from sx_create_context)",
                 static_cast<const void *>(context));
        sx::api::unregister_handle(context);
        // In a fork of its owner: forgotten, nothing released (handles.h).
        if (sx::api::forked_from(context->owner))
            sx::api::forget_in_fork(std::move(context->impl));
        else
            context->impl->close();
        context->magic = 0;
        delete context;
        return Status::Ok();
    });
}

SX_API sx_status_t sx_get_context_stats(const sx_context_t *context, sx_context_stats_t *out) {
    return guard(__func__, [&]() -> Status {
        std::shared_ptr<sx::core::Context> impl;
        SX_TRY(sx::api::resolve_context(context, &impl));
        SX_TRY(sx::api::check_output(out, "out"));
        const sx::core::Context::Stats s = impl->stats();
        sx_context_stats_t m;
        std::memset(&m, 0, sizeof m);
        m.struct_size = sizeof m;
        m.groups = s.groups;
        m.groups_created = s.groups_created;
        m.channels = s.channels;
        m.memory_bytes = s.memory_bytes;
        m.memory_budget_bytes = s.memory_budget_bytes;
        m.shared_memory = s.shared_memory;
        m.transport_bytes = s.transport_bytes;
        sx::api::write_output(out, m);
        return Status::Ok();
    });
}

}  // extern "C"
