#include "api/handles.h"

#include <pthread.h>
#include <unistd.h>

#include <mutex>
#include <unordered_set>
#include <vector>

#include "optim/openmp_team.h"

namespace sx {
namespace api {
namespace {

struct Registry {
    std::mutex mu;
    std::unordered_set<const void *> live;
};

// What handles held in a fork of their owner, kept reachable (not leaked, to a leak
// checker) and never released.
struct Forgotten {
    std::mutex mu;
    std::vector<std::unique_ptr<core::ShardGroup>> groups;
    std::vector<std::unique_ptr<ckpt::Checkpointer>> checkpointers;
    std::vector<std::shared_ptr<ckpt::SaveFuture>> futures;
    std::vector<std::shared_ptr<core::Context>> contexts;
    std::vector<std::shared_ptr<core::NormDomain>> domains;
};

Registry *g_registry = nullptr;
Forgotten *g_forgotten = nullptr;

// A fork copies only the thread that calls it: a lock another thread of the trainer held
// in an sx call at that moment would stay held in the child forever, and the child's
// first call (destroying an inherited handle, which is allowed there) would wait on it.
// So the forking thread takes both locks, always in this order, across the fork.
void lock_before_fork() {
    g_registry->mu.lock();
    g_forgotten->mu.lock();
}

void unlock_after_fork() {
    g_forgotten->mu.unlock();
    g_registry->mu.unlock();
}

// Both made at once, never destroyed (usable from atexit handlers; nothing a fork
// forgot may be released), the fork handlers registered with them.
void make_tables() {
    g_registry = new Registry();
    g_forgotten = new Forgotten();
    ::pthread_atfork(lock_before_fork, unlock_after_fork, unlock_after_fork);
}

Registry &registry() {
    static std::once_flag once;
    std::call_once(once, make_tables);
    return *g_registry;
}

Forgotten &forgotten() {
    registry();
    return *g_forgotten;
}

}  // namespace

void register_handle(const void *h) {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().live.insert(h);
}

void unregister_handle(const void *h) {
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().live.erase(h);
}

bool handle_live(const void *h) {
    std::lock_guard<std::mutex> lock(registry().mu);
    return registry().live.count(h) != 0;
}

bool forked_from(pid_t owner) { return owner != ::getpid(); }

namespace {

Status inert(const char *what, const void *h, pid_t owner) {
    return SX_ERROR(SX_ERR_INVALID_STATE,
                    "%s %p belongs to process %d, which created it; this process (%d) is a fork of it, where it "
                    "cannot be used (its peers, threads and connections are the other process's): create a group "
                    "of this process's own; destroying this one here is allowed and releases nothing the other "
                    "process uses",
                    what, h, static_cast<int>(owner), static_cast<int>(::getpid()));
}

}  // namespace

void forget_in_fork(std::unique_ptr<core::ShardGroup> group, std::unique_ptr<ckpt::Checkpointer> checkpointer) {
    Forgotten &f = forgotten();
    std::lock_guard<std::mutex> lock(f.mu);
    if (group) f.groups.push_back(std::move(group));
    if (checkpointer) f.checkpointers.push_back(std::move(checkpointer));
}

void forget_in_fork(std::shared_ptr<ckpt::SaveFuture> future) {
    Forgotten &f = forgotten();
    std::lock_guard<std::mutex> lock(f.mu);
    if (future) f.futures.push_back(std::move(future));
}

void forget_in_fork(std::shared_ptr<core::Context> context) {
    Forgotten &f = forgotten();
    std::lock_guard<std::mutex> lock(f.mu);
    if (context) f.contexts.push_back(std::move(context));
}

void forget_in_fork(std::shared_ptr<core::NormDomain> domain) {
    Forgotten &f = forgotten();
    std::lock_guard<std::mutex> lock(f.mu);
    if (domain) f.domains.push_back(std::move(domain));
}

Status resolve_domain(const sx_norm_domain *h, std::shared_ptr<core::NormDomain> *out) {
    SX_CHECK(h != nullptr, SX_ERR_INVALID_HANDLE, "domain is NULL");
    SX_CHECK(handle_live(h) && h->magic == kDomainMagic && h->impl, SX_ERR_INVALID_HANDLE,
             "domain %p is not a live sx norm domain (destroyed, or not from sx_create_norm_domain)",
             static_cast<const void *>(h));
    if (forked_from(h->owner)) return inert("norm domain", h, h->owner);
    *out = h->impl;
    return Status::Ok();
}

Status resolve_context(const sx_context *h, std::shared_ptr<core::Context> *out) {
    SX_CHECK(h != nullptr, SX_ERR_INVALID_HANDLE, "context is NULL");
    SX_CHECK(handle_live(h) && h->magic == kContextMagic && h->impl, SX_ERR_INVALID_HANDLE,
             "context %p is not a live sx context (destroyed, or not from sx_create_context)",
             static_cast<const void *>(h));
    if (forked_from(h->owner)) return inert("context", h, h->owner);
    *out = h->impl;
    return Status::Ok();
}

Status resolve(const sx_shard_group *h, core::ShardGroup **out) {
    SX_CHECK(h != nullptr, SX_ERR_INVALID_HANDLE, "group is NULL");
    SX_CHECK(handle_live(h) && h->magic == kGroupMagic && h->impl, SX_ERR_INVALID_HANDLE,
             "group %p is not a live sx group (destroyed, or not from sx_create_shard_group)",
             static_cast<const void *>(h));
    if (forked_from(h->owner)) return inert("group", h, h->owner);
    *out = h->impl.get();
    // Until the call returns (guard clears it), the pool's jobs started on this thread run
    // where the group asked (SX_GROUP_OPENMP_THREADS).
    optim::set_caller_openmp_team((*out)->config().openmp_team);
    return Status::Ok();
}

Status resolve_future(const sx_future *f) {
    SX_CHECK(f != nullptr, SX_ERR_INVALID_HANDLE, "future is NULL");
    SX_CHECK(handle_live(f) && f->magic == kFutureMagic && f->impl, SX_ERR_INVALID_HANDLE,
             "future %p is not a live sx future (destroyed, or not from sx_save_optim_state)",
             static_cast<const void *>(f));
    if (forked_from(f->owner)) return inert("future", f, f->owner);
    return Status::Ok();
}

}  // namespace api
}  // namespace sx
