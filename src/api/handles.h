// Opaque handles: a magic word, and a registry of live handles so that a destroyed or
// garbage pointer is reported as SX_ERR_INVALID_HANDLE instead of being dereferenced.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "ckpt/checkpointer.h"
#include "ckpt/future.h"
#include "core/context.h"
#include "core/group.h"
#include "core/norm_domain.h"

struct sx_shard_group {
    uint64_t magic;
    pid_t owner;  // the process that created it: in a fork of it the handle is inert
    std::unique_ptr<sx::core::ShardGroup> impl;
    // Made at the first save or load; destroyed before impl (it waits for saves in flight).
    std::unique_ptr<sx::ckpt::Checkpointer> checkpointer;
};

struct sx_context {
    uint64_t magic;
    pid_t owner;  // as sx_shard_group's
    std::shared_ptr<sx::core::Context> impl;  // its groups hold it too
};

struct sx_norm_domain {
    uint64_t magic;
    pid_t owner;  // as sx_shard_group's
    std::shared_ptr<sx::core::NormDomain> impl;  // the groups joined to it hold it too
};

struct sx_future {
    uint64_t magic;
    pid_t owner;  // as sx_shard_group's
    std::shared_ptr<sx::ckpt::SaveFuture> impl;
    std::string message;  // what sx_future_error_message hands out
};

namespace sx {
namespace api {

constexpr uint64_t kGroupMagic = 0x5358475250303031ull;  // "SXGRP001"
constexpr uint64_t kFutureMagic = 0x5358465554303031ull; // "SXFUT001"
constexpr uint64_t kContextMagic = 0x5358435458303031ull; // "SXCTX001"
constexpr uint64_t kDomainMagic = 0x53584e444d303031ull;  // "SXNDM001"

void register_handle(const void *h);
void unregister_handle(const void *h);
bool handle_live(const void *h);

// *out = the group behind `h`, or SX_ERR_INVALID_HANDLE; SX_ERR_INVALID_STATE in a
// process forked from the one that created it (forked_from).
Status resolve(const sx_shard_group *h, core::ShardGroup **out);
Status resolve_future(const sx_future *f);
// *out = the context behind `h`, as resolve.
Status resolve_context(const sx_context *h, std::shared_ptr<core::Context> *out);

// Whether `h` (a live handle) was made by a process this one is a fork of. Such a handle
// is inert here: every call fails, and destroying it only forgets it (forget_in_fork),
// touching nothing its owner uses: no message to the peers, no store key, no segment,
// no thread (the owner's threads do not exist in a fork).
bool forked_from(pid_t owner);
// Keeps what a handle held, unreleased, for the rest of this process (the memory is a
// copy of the owner's, and goes when the fork exits).
void forget_in_fork(std::unique_ptr<core::ShardGroup> group, std::unique_ptr<ckpt::Checkpointer> checkpointer);
void forget_in_fork(std::shared_ptr<ckpt::SaveFuture> future);
void forget_in_fork(std::shared_ptr<core::Context> context);
void forget_in_fork(std::shared_ptr<core::NormDomain> domain);
// *out = the norm domain behind `h`, as resolve_context.
Status resolve_domain(const sx_norm_domain *h, std::shared_ptr<core::NormDomain> *out);
// A group's core from the trainer's config (group_api.cc): sx_create_shard_group's, and a
// norm domain's (which is a group with no params).
Status create_core_group(const sx_group_config_t *config, std::unique_ptr<core::ShardGroup> *out);

// The group's checkpointer, made at its first use (ckpt_api.cc).
sx::ckpt::Checkpointer &checkpointer_of(sx_shard_group_t *group);
// A load of `path` with SX_LOAD_* `flags` (`what` names the flags' field in errors).
Status load_options(const char *path, uint32_t flags, const char *what, sx::ckpt::LoadOptions *out);

}  // namespace api
}  // namespace sx
