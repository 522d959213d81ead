/*
 * sx_checkpoint.h: Checkpoints: futures for background work, saving and loading optimizer state,
 * and reading a checkpoint's user blob.
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_CHECKPOINT_H
#define SX_SX_CHECKPOINT_H

#include "sx_group.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------
 * Checkpoints
 *
 * A checkpoint is a directory: MANIFEST (format, step, world size, the param table,
 * param groups, the user blob, and where every stored tensor's chunks are) and one
 * shard-RRRRR-of-WWWWW.bin file per rank. It loads into any world size, stage or unit
 * split. Every rank must be able to reach the directory (a shared file system).
 * ------------------------------------------------------------------------------- */

typedef struct sx_future sx_future_t;

/* Called once when a save completes, with its status: on sx's I/O thread for an
 * asynchronous save, on the caller's thread before sx_save_optim_state returns for a
 * synchronous one. It must return quickly and must not call sx functions on the group. */
typedef void (*sx_future_callback)(sx_future_t *future, sx_status_t status, void *user);

typedef struct sx_save_options {
    size_t struct_size;
    /* The checkpoint directory to create, copied. It must not exist; its parent must (sx
     * creates the checkpoint's own directory only): a missing parent fails the call itself
     * with SX_ERR_NOT_FOUND naming it, a parent that is no directory with
     * SX_ERR_INVALID_ARGUMENT, before anything is written. The parent also receives `latest` (the name of the newest committed checkpoint)
     * and holds the ones keep_last considers. Its last component may not be `latest`,
     * begin with `latest.tmp` or end in `.sx-partial` (an unfinished save's directory,
     * which the next save removes once no live process holds it). Saves of other
     * groups or processes may share the parent at the same time; retention and `latest`
     * then count their checkpoints too. Every rank passes the same path. Required. */
    const char *path;
    /* Opaque bytes stored in the manifest (a data-loader position, RNG state), copied
     * during the call; at most 64 MiB. May be NULL with size 0. */
    const void *user_blob;
    uint64_t user_blob_size;
    /* > 0: after this checkpoint commits, keep only the newest keep_last checkpoints
     * (by step) among the directories beside it; 0 keeps everything. */
    int32_t keep_last;
    /* 1: do all the work in the call (the future is complete on return). */
    int32_t synchronous;
    sx_future_callback callback; /* may be NULL */
    void *callback_user;
} sx_save_options_t;

SX_API sx_status_t sx_save_options_init(sx_save_options_t *options, size_t size);

/* Collective. Saves the group's state at this step boundary and returns at once: the
 * copy of this rank's shard into staging memory (allocated by the first save, then
 * reused), the writes, the fsyncs and the commit all run in the background. *out
 * receives the future (release it with sx_future_destroy).
 *
 * The checkpoint holds the values of the moment of the call. sx's own calls that
 * change them (sx_step's update, sx_broadcast_params, sx_load_optim_state) first wait
 * until the shard has been copied out, which usually happened during the forward and
 * backward in between. The trainer itself must not write params through their views
 * until sx_future_wait_staged() returns SX_OK (reading them is always fine).
 *
 * A save while an earlier one is still in flight first waits for that one. The new
 * checkpoint appears, complete, only when every rank's files are durable: a crash at any
 * moment leaves the previous checkpoint or the new one, never a torn one that loads.
 * With options->synchronous, everything happens in the call. Every rank passes the same
 * path (the call's header compares them: SX_ERR_MISMATCH naming each rank's otherwise). */
SX_API sx_status_t sx_save_optim_state(sx_shard_group_t *group, const sx_save_options_t *options,
                                       sx_future_t **out);

/* Waits at most timeout_ms (< 0: forever) until the save's snapshot has been copied out
 * of the group's memory, after which the trainer may write params through views again.
 * Returns SX_OK once it has (also when the save has completed, successfully or not), or
 * SX_ERR_TIMEOUT. Any thread. */
SX_API sx_status_t sx_future_wait_staged(sx_future_t *future, int64_t timeout_ms);

/* *done = 1 if the operation has completed (successfully or not). Any thread. */
SX_API sx_status_t sx_future_poll(const sx_future_t *future, int32_t *done);
/* Waits at most timeout_ms (< 0: forever). Returns SX_ERR_TIMEOUT if it is still
 * running, else the operation's own status (its text: sx_future_error_message). */
SX_API sx_status_t sx_future_wait(sx_future_t *future, int64_t timeout_ms);
/* Asks a running save to stop; it ends within a fraction of a second (also while it
 * waits for a stalled peer), fails with SX_ERR_CANCELLED on every rank that reaches the
 * point where it hears of it, and commits nothing (the next save in that directory
 * removes what it left). No effect on a completed one. Any thread. */
SX_API sx_status_t sx_future_cancel(sx_future_t *future);
/* The error text of a completed, failed operation ("" otherwise). Valid until the
 * future is destroyed. */
SX_API const char *sx_future_error_message(const sx_future_t *future);
/* Bytes of this rank's files written so far, and in all. Any thread. */
SX_API sx_status_t sx_future_progress(const sx_future_t *future, uint64_t *done_bytes,
                                      uint64_t *total_bytes);
/* Releases the future (waiting for the operation if it is still running). Accepts NULL. */
SX_API sx_status_t sx_future_destroy(sx_future_t *future);

#define SX_LOAD_PARAMS_ONLY 0x1   /* values only: no optimizer state, steps or hyperparameters */
#define SX_LOAD_ALLOW_MISSING 0x2 /* group params absent from the checkpoint keep their values */
#define SX_LOAD_ALLOW_EXTRA 0x4   /* checkpoint params absent from the group are ignored */

typedef struct sx_load_options {
    size_t struct_size;
    const char *path; /* the checkpoint directory; copied. Required. */
    uint32_t flags;   /* SX_LOAD_* */
    int32_t reserved0;
} sx_load_options_t;

SX_API sx_status_t sx_load_optim_state_options_init(sx_load_options_t *options, size_t size);

/* Collective. Loads a checkpoint saved at any world size into this group: params are
 * matched by name, and each rank reads only the chunks its own shard needs, verifying
 * each by its CRC32C. Unless SX_LOAD_PARAMS_ONLY, the optimizer state, per-param step
 * counts, the step count and the param groups' hyperparameters are restored too. All
 * ranks succeed or all fail. A failed load leaves every rank's shard (values, masters,
 * optimizer state) as it was; if it failed after the ranks exchanged their new values,
 * the params are gathered again from those shards, as the next step would do (a value
 * written into another rank's part of a param view is then gone). Errors
 * name the param (missing, extra, shape or optimizer mismatch) or the file and chunk
 * (SX_ERR_CORRUPT), or both format versions (SX_ERR_VERSION). Every rank must load the
 * same checkpoint: before anything changes the ranks compare the path as given, the
 * MANIFEST's CRC32C and its step, and the flags; ranks that differ all get
 * SX_ERR_MISMATCH naming each rank's checkpoint and step. A path whose last component
 * ends in ".sx-partial" (a save that has not committed, or was cut short) or is "latest"
 * (the file naming the newest checkpoint) is refused with SX_ERR_INVALID_ARGUMENT saying
 * so. While it runs it uses
 * threads of its own (one per file it reads, up to 4, one that places the chunks and, on
 * the host, one that gathers the params), all ended before it returns. */
SX_API sx_status_t sx_load_optim_state(sx_shard_group_t *group, const sx_load_options_t *options);

/* Reads the user blob of the checkpoint at `path` (after verifying its manifest).
 * *size receives its length; if capacity is smaller, nothing is copied and
 * SX_ERR_INVALID_ARGUMENT says how much is needed. buf may be NULL with capacity 0. A
 * path the load refuses by its name (".sx-partial", "latest") is refused here too. */
SX_API sx_status_t sx_read_user_blob(const char *path, void *buf, uint64_t capacity, uint64_t *size);

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_CHECKPOINT_H */
