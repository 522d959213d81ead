/*
 * sx_recovery.h: Losing a rank and growing a group: the survivors regroup and go on, joiners are
 * admitted (docs/recovery.md).
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_RECOVERY_H
#define SX_SX_RECOVERY_H

#include "sx_group.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------
 * Losing a rank: the survivors regroup and go on (docs/recovery.md)
 * ------------------------------------------------------------------------------- */

typedef struct sx_regroup_options {
    size_t struct_size;
    /* The checkpoint the new group's state comes from where memory copies cannot give it
     * (copied): loaded as sx_load_optim_state loads it, resharded into the new world
     * size. Required unless the group keeps memory copies
     * (sx_group_config_t.memory_copy_interval); with them, NULL or "" fails only where
     * the lost ranks took some shard's every copy with them. */
    const char *checkpoint;
    uint32_t load_flags;         /* SX_LOAD_* for that load */
    /* How long the survivors wait for each other, from the first one's arrival, before
     * the group closes without the ranks that did not come; 0 = 1000 ms. */
    int32_t join_window_ms;
    /* The group closes as soon as this many ranks arrived; 0 = once every rank of the
     * survivors' groups arrived or is known to have exited (sx_get_lost_ranks: a process
     * on this host; ranks on other hosts are known only by arriving, or by the end of the
     * join window). */
    int32_t expected_world_size;
    /* How many joining processes (SX_GROUP_JOIN) the members admit into the new group, the
     * longest waiting first: what sx_poll_joiners returned. They take the ranks after the
     * members'. Every member passes the same (else SX_ERR_MISMATCH); a joining process
     * passes 0. (Was reserved0, which had to be 0.) */
    int32_t admit;
} sx_regroup_options_t;

SX_API sx_status_t sx_regroup_options_init(sx_regroup_options_t *options, size_t size);

typedef struct sx_regroup_result {
    size_t struct_size;
    int32_t epoch;               /* regroups since the group was created: 1, 2, ... */
    int32_t rank;                /* this rank in the new group */
    int32_t world_size;          /* of the new group */
    int32_t shard_size;          /* of its mesh (its world size if flat) */
    int32_t previous_rank;       /* this rank in the group before (-1: it joined) */
    int32_t previous_world_size; /* (a joined process: the members that admitted it) */
    /* The group's step count after the restore: the memory copy's or the checkpoint's.
     * The trainer goes on from the step after it (steps since it are taken again). */
    uint64_t step;
    /* 1: the state came from the ranks' memory copies; 0: from options->checkpoint. */
    int32_t from_memory;
    int32_t reserved0;
} sx_regroup_result_t;

SX_API sx_status_t sx_regroup_result_init(sx_regroup_result_t *result, size_t size);

/* Collective over the ranks still alive, after a call failed because a peer was lost
 * (or after sx_abort): they form a new group of themselves, at the next epoch, on the
 * same rendezvous, and `group` becomes that group. Each survivor calls it; they agree
 * through the rendezvous store on who is in (those that arrived before the group closed:
 * options->expected_world_size of them, or every rank not known to be lost, or at the
 * latest those within options->join_window_ms of the first), and take new ranks in the
 * order of their previous ones. A mesh keeps its shard size where the survivors fill
 * whole shard groups of it, else becomes flat. The new group has the same params, param
 * groups, trainable flags and settings. Its state comes from the survivors' memory
 * copies where the group keeps them (memory_copy_interval) and every shard of one copy
 * is still held by one of them (its own, a peer's copy, or another replica's): the
 * newest such copy, each survivor sent the pieces of it that it owns now. Otherwise it
 * is options->checkpoint's, loaded into the new world size. Either way it is exactly what
 * loading a checkpoint of that step into a fresh group of the survivors gives; there is
 * no third outcome. Every view, unit view and state view of the group is invalid
 * afterwards (take them again); a save in flight is aborted (it commits nothing; its
 * future reports SX_ERR_ABORTED). The store must outlive the lost ranks: the
 * sx-rendezvous command (tcp://HOST:PORT?server=external), file://, or torchrun's agent
 * store (env:// under torchrun); with tcp:// served by rank 0, losing rank 0 loses it,
 * and this fails saying so.
 *
 * Failure. `group` changes only when the regroup succeeds. Invalid options, and a
 * checkpoint whose MANIFEST cannot be read (its error names the path), change nothing.
 * Any other failure (a rank lost inside the regroup, no memory copy holding the state and
 * no checkpoint: SX_ERR_NOT_FOUND on every survivor before anything is built, a load that
 * fails) leaves `group` the broken group it was, and the survivors call sx_regroup again:
 * every try is a new epoch, and its state is again the newest that every shard of is
 * still held, or the checkpoint's. A rank that arrives after the survivors closed the
 * group gets SX_ERR_INVALID_STATE naming the ranks that formed it (it may join them with
 * SX_GROUP_JOIN). options and result (may be NULL) are borrowed for the call. Owner's
 * thread. */
SX_API sx_status_t sx_regroup(sx_shard_group_t *group, const sx_regroup_options_t *options,
                              sx_regroup_result_t *result);

/* Collective: *waiting = how many processes wait to join the group (created with
 * SX_GROUP_JOIN on its rendezvous) and were not admitted yet, the same number on every
 * rank (rank 0 reads it from the rendezvous store; one that arrives meanwhile waits for
 * the next poll). To admit them, every member calls sx_regroup with options->admit =
 * *waiting at the same step boundary. waiting is borrowed for the call. Owner's thread. */
SX_API sx_status_t sx_poll_joiners(sx_shard_group_t *group, int32_t *waiting);

/* The ranks of the group whose process is known to have exited, asked now: a peer on this
 * host whose process has gone (watched through the shared memory the ranks of a host
 * exchange through, even while its parent has not reaped it). Peers on other hosts, and
 * groups whose ranks exchange through TCP alone, are known only through the failures of
 * calls (their text names the rank), never here: a closed connection may be a live peer
 * that gave up. Where a call failed because a peer was lost, expected_world_size =
 * world size - *count is the group of sx_regroup without waiting for the join window.
 * ranks[0, min(*count, capacity)) get the ranks, ascending; ranks may be NULL with
 * capacity 0 to ask the count. Not collective; any thread (a failed or aborted group
 * too). ranks and count are borrowed for the call. */
SX_API sx_status_t sx_get_lost_ranks(const sx_shard_group_t *group, int32_t *ranks, int32_t capacity,
                                     int32_t *count);

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_RECOVERY_H */
