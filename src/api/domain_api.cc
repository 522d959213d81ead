// Entry points: norm domains (sx_step.h), whose groups' steps take one gradient norm.
#include <unistd.h>

#include "api/guard.h"
#include "api/handles.h"

using sx::Status;
using sx::api::guard;
using sx::api::resolve;

extern "C" {

SX_API sx_status_t sx_create_norm_domain(const sx_group_config_t *config, sx_norm_domain_t **out) {
    if (out) *out = nullptr;
    return guard(__func__, [&]() -> Status {
        SX_CHECK_ARG(out != nullptr, "out is NULL");
        std::unique_ptr<sx::core::ShardGroup> group;
        SX_TRY(sx::api::create_core_group(config, &group));
        std::unique_ptr<sx_norm_domain> h(new sx_norm_domain());
        h->magic = sx::api::kDomainMagic;
        h->owner = ::getpid();
        h->impl = std::make_shared<sx::core::NormDomain>(std::move(group));
        sx::api::register_handle(h.get());
        *out = h.release();
        return Status::Ok();
    });
}

SX_API sx_status_t sx_destroy_norm_domain(sx_norm_domain_t *domain) {
    return guard(__func__, [&]() -> Status {
        if (domain == nullptr) return Status::Ok();
        SX_CHECK(sx::api::handle_live(domain) && domain->magic == sx::api::kDomainMagic && domain->impl,
                 SX_ERR_INVALID_HANDLE,
                 "domain %p is not a live sx norm domain (destroyed, or not from sx_create_norm_domain)",
                 static_cast<const void *>(domain));
        sx::api::unregister_handle(domain);
        // In a fork of its owner: forgotten, nothing released (handles.h).
        if (sx::api::forked_from(domain->owner)) sx::api::forget_in_fork(std::move(domain->impl));
        domain->magic = 0;
        delete domain;
        return Status::Ok();
    });
}

SX_API sx_status_t sx_join_norm_domain(sx_shard_group_t *group, sx_norm_domain_t *domain, int32_t slice) {
    return guard(__func__, [&]() -> Status {
        sx::core::ShardGroup *g;
        SX_TRY(resolve(group, &g));
        std::shared_ptr<sx::core::NormDomain> d;
        SX_TRY(sx::api::resolve_domain(domain, &d));
        return g->join_norm_domain(std::move(d), slice);
    });
}

}  // extern "C"
