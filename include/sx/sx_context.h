/*
 * sx_context.h: Contexts (1.7): many groups on one rendezvous, one transport and one
 * thread pool, as a fine-tune service runs many tenants' jobs on the same ranks.
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 *
 * A context is made once by every rank (sx_create_context, collective): it opens the
 * rendezvous, connects the ranks' transport and starts the thread pool. A group made in
 * it (sx_group_config_t.context and .name) then takes its own key space in the context's
 * store and its own channels on the context's transport, and makes no new connection:
 * where the context's ranks all run on one host, a channel is a region of the context's
 * shared memory, handed out through the store; elsewhere (a CPU context whose ranks span
 * hosts, or whose transport is SX_TRANSPORT_TCP) the context connects one Gloo full mesh
 * and a channel is a slot space of its own on those connections, its id handed out
 * through the store. The groups of a context keep everything
 * else to themselves: their agreement checks, their failures (a mismatch, a custom
 * optimizer's failure, a non-finite policy error or a bad load fails its group alone; the
 * context and its other groups go on), their checkpoints and their memory. A peer's
 * death, which every channel to it sees, fails every group of the context at its next
 * collective; each can regroup on its own (docs/recovery.md), out of the context.
 *
 * A context can carry a memory budget per rank: a group's sx_finalize (and
 * sx_add_param_group after it) that would lay out more than the budget leaves is refused
 * before anything is allocated, with SX_ERR_OUT_OF_MEMORY naming the budget, the request
 * and what the context's groups hold. sx_get_context_stats says what each rank holds.
 *
 * Groups made without a context are unchanged: each has a rendezvous, a transport and a
 * pool of its own.
 */
#ifndef SX_SX_CONTEXT_H
#define SX_SX_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "sx_group.h"
#include "sx_status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct sx_context_config {
    size_t struct_size;
    /* As sx_group_config_t's fields of the same names, which the context's groups then
     * leave empty (or set to the same values): how the ranks find each other (required),
     * this process's rank and the number of ranks (0 = from the environment, env://), the
     * backend of every group in it (SX_BACKEND_*; 0 = AUTO), the threads of the pool the
     * groups share (0 = the cores divided by the ranks in this process), the timeout of
     * the context's creation and of its groups' collectives (0 = 300000 ms), the CPU
     * transport (SX_TRANSPORT_*), the address it binds to, the rendezvous server's token
     * and bind address, and the CUDA device. All copied. */
    const char *rendezvous;
    int32_t rank;
    int32_t world_size;
    int32_t backend;
    int32_t num_threads;
    int32_t timeout_ms;
    int32_t transport;
    const char *bind_address;
    const char *rendezvous_token;
    const char *rendezvous_bind;
    int32_t device_ordinal;
    int32_t reserved0;
    /* The most bytes the context's groups may hold on this rank (sx_memory_stats_t's
     * param, grad, optimizer, staging and memory-copy bytes, summed over its groups);
     * 0 = no budget. Each rank has its own. */
    uint64_t memory_budget_bytes;
} sx_context_config_t;

typedef struct sx_context_stats {
    size_t struct_size;
    int64_t groups;              /* groups of the context alive on this rank now */
    int64_t groups_created;      /* groups made in it since its creation */
    int64_t channels;            /* channels open on its transport now (a group has 1 or more) */
    uint64_t memory_bytes;       /* what its groups hold on this rank, as the budget counts */
    uint64_t memory_budget_bytes;/* the budget (0 = none) */
    /* Where its transport is shared memory (every rank on this host): 1. Where its ranks
     * run on several hosts of the same number of ranks (two or more) each: 2, shared memory
     * within each host and its one Gloo mesh between the hosts (a group's channel is one of
     * each, and a Gloo channel among every rank for small calls: all counted in channels).
     * Else 0: a CPU context's channels are on its one Gloo mesh (counted in channels), a
     * CUDA context's groups connect their own NCCL communicators as groups without a
     * context do. */
    int32_t shared_memory;
    int32_t reserved0;
    /* Memory its Gloo channels keep on this rank between their calls (1.7): each channel's
     * calls send from and receive into blocks of their own, kept for its next calls (about
     * its largest call's payload), and a call that ended early leaves its blocks until the
     * context goes. Not counted in memory_bytes or the budget. 0 where the context has no
     * Gloo channels. */
    uint64_t transport_bytes;
} sx_context_stats_t;

/* Fills *config with defaults and sets struct_size = size. */
SX_API sx_status_t sx_context_config_init(sx_context_config_t *config, size_t size);
SX_API sx_status_t sx_context_stats_init(sx_context_stats_t *stats, size_t size);

/* Creates this rank's handle of a context and connects to the other ranks. Collective:
 * blocks until every rank has joined or config->timeout_ms passes. config is borrowed for
 * the call. On success *out owns the handle; on failure *out is set to NULL. */
SX_API sx_status_t sx_create_context(const sx_context_config_t *config, sx_context_t **out);

/* Releases the caller's handle. The context itself lives on while any group made in it
 * does, and closes its transport, pool and store with the last of them; a group made in
 * it after this call is refused. Accepts NULL. Not collective. In a forked child (see
 * sx_destroy_shard_group) the inherited handle is inert and releases nothing. */
SX_API sx_status_t sx_destroy_context(sx_context_t *context);

/* What the context holds on this rank now. Any thread. */
SX_API sx_status_t sx_get_context_stats(const sx_context_t *context, sx_context_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_CONTEXT_H */
