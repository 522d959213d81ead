/*
 * sx_group.h: Creating, destroying and aborting a shard group: the backends, transports and
 * flags of its config, and meshes (HSDP).
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_GROUP_H
#define SX_SX_GROUP_H

#include "sx_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* sx_group_config_t.backend. */
#define SX_BACKEND_AUTO 0 /* SX_BACKEND_CUDA where this build has CUDA and a device is found, else SX_BACKEND_CPU */
#define SX_BACKEND_CPU 1  /* host memory, Gloo collectives */
#define SX_BACKEND_CUDA 2 /* device memory, NCCL collectives */

/* sx_group_config_t.transport. */
#define SX_TRANSPORT_AUTO 0 /* shared memory between the ranks of one host, else TCP */
#define SX_TRANSPORT_TCP 1  /* Gloo's TCP between every pair of ranks */

/* sx_group_config_t.offload (1.7). */
#define SX_OFFLOAD_NONE 0  /* a CUDA group's masters and optimizer state on its device */
#define SX_OFFLOAD_STATE 1 /* ... in pinned host memory, updated by the CPU kernels */

/* The most ranks a group may have (sx_group_config_t.world_size, and the launchers'
 * WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS); more is SX_ERR_INVALID_ARGUMENT at once.
 * A CPU group's rendezvous is quadratic in the world size (Gloo's full mesh: each rank
 * stores 136 bytes per peer) and meets the TCP store's 1 GiB limit near 2,800 ranks, where
 * it fails naming that limit (docs/rendezvous.md). */
#define SX_MAX_WORLD_SIZE 65536

/* Group flags (sx_group_config_t.flags). */
#define SX_GROUP_NO_TRAINABLE_AUTODETECT 0x1 /* trainability changes need sx_refresh_trainable() */
/* sx_finalize reserves (allocates and faults in) the checkpoint staging of this rank's
 * shard file, as if the group were saved with every optimizer state it may keep, so that
 * the first sx_save_optim_state blocks no longer than the later ones, which reuse it. The
 * memory is then held from sx_finalize on (sx_get_memory_stats: staging_bytes). (1.5) */
#define SX_GROUP_RESERVE_CHECKPOINT_STAGING 0x2
/* A process that joins a running group (docs/recovery.md, "Growing"): sx_create_shard_group
 * connects to nobody (rank and world_size are ignored); the params and param groups are
 * registered and sx_finalize'd as the members have them, then sx_regroup waits until the
 * members admit it (sx_poll_joiners, then their sx_regroup with options->admit) and makes
 * it a rank of their next group, after theirs, with its state. Until then every other
 * collective call is SX_ERR_INVALID_STATE. The rendezvous must be the members' (tcp:// on a
 * store that outlives rank 0, file://, local://); the members' first group on it, or, with
 * `name`, the live group of that name in the context made on it (the process makes its
 * group without a context: it is not one of the context's ranks, and the group it enters
 * is out of the context, as any regroup's). (1.7) */
#define SX_GROUP_JOIN 0x4
/* With memory_copy_interval: a step that takes a copy returns only once the next rank holds
 * it, so that a step that returned on any rank is never taken again after a loss (without
 * it the copy is sent while the trainer goes on, and a loss within that time costs the
 * step before the one in flight too). The step then costs the copy's sending. */
#define SX_GROUP_MEMORY_COPY_WAIT 0x8
/* For a program that runs an OpenMP runtime of its own (PyTorch: libgomp), in the same
 * process: the optimizer work that this group's calls do on the calling thread runs on
 * that thread's OpenMP team (num_threads of its threads, the caller one of them) instead
 * of on the group's own pool. The host's workers are awake (by default libgomp's spin for
 * a while after each of the host's parallel regions), so they start at once, and no pool
 * thread competes with them for the processors. Work that sx does on its own threads (a
 * pipeline's, a save's) and calls from inside a parallel region keep the pool. sx loads no
 * OpenMP runtime: one must be loaded already (libgomp.so.1, libomp.so.5, libomp.so or
 * libiomp5.so), else sx_create_shard_group fails with SX_ERR_UNSUPPORTED saying so. Results
 * are the same bits either way. sx.torch sets it where torch's parallel backend is OpenMP
 * (docs/threads.md). (1.7) */
#define SX_GROUP_OPENMP_THREADS 0x10

/* ---------------------------------------------------------------------------------
 * Creating a shard group
 *
 * Life of a group:
 *   sx_create_shard_group          (collective: rendezvous, connect)
 *   sx_add_param_group ...         (local; same on every rank)
 *   sx_add_param ...               (local; same on every rank, same order)
 *   sx_finalize                    (collective: checks all ranks agree, allocates)
 *   views, set initial values, sx_broadcast_params (optional)
 *   loop: write grads; sx_accumulate_grads per extra micro-batch; sx_step
 *         (between steps, more param groups and params may be added, and laid out by
 *         another sx_finalize: torch's add_param_group)
 *   sx_destroy_shard_group
 *
 * Every collective call begins with the same small header, exchanged in one round trip:
 * which call it is and what must agree for it (the param
 * tables at sx_finalize; masks, hyperparameters and options at a step; the path of a
 * save; the checkpoint of a load; the root of a broadcast). Ranks in different calls, or
 * that disagree, all get SX_ERR_MISMATCH at once (not at the timeout) with a message
 * naming the first thing that differs and each rank's value, e.g.
 * "the call: sx_step on rank 0, sx_save_optim_state on rank 1" or
 * "param 'w' shape: [4, 4] on rank 0, [4, 5] on rank 1", and nothing changes. A rank
 * whose own arguments fail the call (a bad path, an unreadable checkpoint) returns its
 * error, and its peers the same code, saying which rank failed. At stage 3, where gathers
 * run on a communicator of their own, every call but sx_unit_grads_ready also meets the
 * shard group's gathers there first (one more small round trip), so that a rank in
 * sx_unit_gather and a rank in any other call are told too (see sx_unit_gather).
 * ------------------------------------------------------------------------------- */

typedef struct sx_shard_group sx_shard_group_t;
/* A context (sx_context.h): what groups on the same ranks share. (1.7) */
typedef struct sx_context sx_context_t;

typedef struct sx_group_config {
    size_t struct_size;
    /* How ranks find each other, copied: "local://NAME" (ranks are threads of this
     * process), "tcp://HOST:PORT" (rank 0 serves a store there), "file:///DIR"
     * (a directory every rank can reach), "env://" (RANK, WORLD_SIZE, MASTER_ADDR,
     * MASTER_PORT as torchrun sets them; or OMPI_COMM_WORLD_RANK/SIZE, or
     * SLURM_PROCID/SLURM_NTASKS, with MASTER_ADDR/MASTER_PORT). With env://, every
     * rank joins the torch TCPStore at MASTER_ADDR:MASTER_PORT when
     * TORCHELASTIC_USE_AGENT_STORE is "True" (torchrun's agent serves it there);
     * otherwise rank 0 serves sx's own store on MASTER_PORT (mpirun, srun).
     * SX_ENV_STORE=join or SX_ENV_STORE=serve decides instead. Required. */
    const char *rendezvous;
    /* This process's rank in [0, world_size). Ignored when world_size is 0. */
    int32_t rank;
    /* Number of ranks, at most SX_MAX_WORLD_SIZE; 0 = take rank and world size from the
     * environment (env://). */
    int32_t world_size;
    /* ZeRO stage: 1 (optimizer state sharded), 2 (gradients sharded too) or 3 (params
     * sharded too: see "Units as a pipeline"). 0 = 2. */
    int32_t stage;
    /* SX_BACKEND_*; 0 = SX_BACKEND_AUTO: the CUDA backend (device_ordinal's device)
     * where this build has CUDA and the CUDA runtime finds a device, else the CPU. A
     * trainer that computes on the host into the views asks for SX_BACKEND_CPU, or reads
     * sx_view_t.device: on a machine with a GPU, AUTO's views are device memory. Every
     * rank of a group must end on the same backend. */
    int32_t backend;
    /* Threads of the group's own pool for optimizer kernels; 0 = the cores of this
     * machine divided by the ranks on it (local://) or all of them. */
    int32_t num_threads;
    /* Start of every param in the flat buffers is aligned to this many bytes: a power
     * of two in [1, 2^20]; 0 = 64. An alignment below a param's element size (1: for
     * every dtype) packs the params: each starts where the one before ends, so a unit's
     * flat buffer (sx_unit_view) holds them as one block, as a trainer that keeps all its
     * params in one array (llm.c) has them. Its cost: shards and params start anywhere,
     * so neighbouring shards may share a cache line; a CPU step over a packed layout
     * measured as fast as over the default (bench/README.md, "The packed layout's
     * cost"). (Alignments below 64: 1.5.) */
    int32_t alignment;
    /* Every collective and rendezvous wait fails after this many milliseconds. The phases
     * of sx_create_shard_group (the store, the ranks' arrival, the transport, a mesh's
     * communicators) share one such deadline, so a missing rank fails the others within
     * it; 0 = 300000 (5 minutes). */
    int32_t timeout_ms;
    /* SX_GROUP_* flags. */
    uint32_t flags;
    /* Address the CPU transport binds to and advertises, copied; NULL = 127.0.0.1 for
     * local:// and a loopback store; for a store on another host (tcp://, env://), the
     * address this host reaches it from (its route's source: the interface its peers on
     * other hosts reach it through too); else this host's name. */
    const char *bind_address;
    /* CUDA device ordinal for SX_BACKEND_CUDA (and AUTO on a machine with a GPU): with
     * several ranks on one host, each its own device (torchrun: LOCAL_RANK). */
    int32_t device_ordinal;
    int32_t reserved0;
    /* Mixed precision (see "Mixed precision" below). Gradient dtype: 0 = each param's
     * own dtype; SX_DTYPE_F32 = fp32 gradients for every param, whatever its dtype. */
    int32_t grad_dtype;
    /* Dtype the gradients are summed over ranks in: 0 = their own dtype (fp16 and bf16
     * gradients are divided by grad_predivide_factor before the sum and the sum
     * multiplied back in fp32, so that it neither overflows nor underflows);
     * SX_DTYPE_F32 = converted to fp32 first. */
    int32_t reduce_dtype;
    /* Stage 3: how many units sx gathers ahead of the trainer's sx_unit_gather calls, in
     * the order of the previous step's calls (registration order during the first
     * forward). 0 = 1; SX_PREFETCH_NONE = none; at most 64. */
    int32_t prefetch_depth;
    /* HSDP (a 2-D mesh, see "Meshes" below): ranks per shard group, a divisor of the
     * world size; ranks [k * shard_size, (k + 1) * shard_size) shard the model among
     * themselves, and the world_size / shard_size groups replicate it. 0 = the world size
     * (one shard group: plain ZeRO). Every rank passes the same. */
    int32_t shard_size;
    /* 16-bit gradient reductions divide the gradients by this before their sum and
     * multiply the sum back by it in fp32 after, so that the sum neither overflows nor the
     * divided gradients underflow: >= 1; 0 = FSDP's factor for the n ranks summed in 16
     * bits (a shard group's): f doubled from 1 while it divides n and n / f > f, so 2 for
     * 4 ranks, 4 for 8 or 16, 32 for 1024. The other 1 / (world size) of the average is
     * applied in fp32 with the update. */
    double grad_predivide_factor;
    /* The step timeline (docs/tracing.md): the file this rank writes its Chrome
     * trace-event JSON to (ui.perfetto.dev, chrome://tracing), copied. Every "%r" becomes
     * the rank; without one, ".rank<N>" goes before a trailing ".json", or ".rank<N>.json"
     * is appended. NULL or "" = the environment variable SX_TRACE's value, and no trace
     * where that is unset or empty. The file is written (atomically, replaced) by
     * sx_trace_flush and by sx_destroy_shard_group; a failure to write it is logged and
     * fails nothing else. */
    const char *trace_path;
    /* The most events the trace keeps: a ring, whose oldest events go first (the file
     * says how many went). 0 = 65536; at most 16777216 (2^24). */
    int32_t trace_events;
    /* How CPU ranks exchange (1.6): SX_TRANSPORT_AUTO (0) = through shared memory where
     * every rank of a communicator runs on this host (processes or threads; the ranks
     * compare their hosts' identities), else Gloo's TCP; SX_TRANSPORT_TCP = Gloo's TCP
     * always. The environment variable SX_SHARED_MEMORY=0 has AUTO act as TCP. Every rank
     * passes the same. CUDA groups use NCCL whatever it says. */
    int32_t transport;
    /* The shared secret of sx's own TCP rendezvous server (tcp://, and env:// where rank 0
     * serves sx's store), copied; at most 4096 bytes; NULL or "" = SX_RENDEZVOUS_TOKEN from
     * the environment, and none if that is unset or empty. With a token, every rank proves
     * it holds it (challenge-response with HMAC-SHA256; the token never crosses the wire and
     * is never logged) before it may read or write a key, and rank 0's server proves it
     * back. A rank with a wrong token, or none, fails with SX_ERR_INVALID_ARGUMENT saying so,
     * and the server goes on serving the others. Every rank passes the same. local:// and
     * file:// ignore it; env:// joining torchrun's store cannot use it (torch's store asks
     * for none: a warning is logged). See docs/rendezvous.md. (1.5) */
    const char *rendezvous_token;
    /* Where rank 0's rendezvous server listens, copied: NULL or "" = SX_RENDEZVOUS_BIND
     * from the environment, or else the address that the host of tcp://HOST:PORT (env://:
     * MASTER_ADDR) resolves to on rank 0; "*" = every interface; otherwise an address or
     * name of rank 0's host. Other ranks ignore it. (bind_address is the CPU transport's,
     * not this.) (1.5) */
    const char *rendezvous_bind;
    /* Copies of the state in memory, for sx_regroup (docs/recovery.md): every this many
     * steps (and at the first step after the state was replaced: a load, a broadcast, a
     * scatter), each rank copies its shard of the state (fp32 values or masters, or the
     * bf16 params of a param group with bf16_stochastic_round, which has no masters;
     * optimizer state, step counts) into host memory at the step boundary, and in a flat group
     * sends that copy to the next rank (rank r's to rank (r + 1) % world_size) in the
     * background, on a connection of its own. A mesh needs no peer's copy: another
     * replica holds each shard. Each rank then holds its last two copies and, in a flat
     * group, its predecessor's two (sx_memory_stats_t.memory_copy_bytes): up to four
     * times its shard of the state. The step waits for a copy only where the next one is
     * due before the last was sent, and its update for the moment its shard is copied.
     * sx_regroup restores the survivors from the newest copy that every shard has. 0 =
     * none. The copies are in host memory for every backend (a CUDA group's state is copied
     * down on the device's copy engine, apart from the step's work) (CUDA groups: 1.7). Every
     * rank passes the same. */
    int32_t memory_copy_interval;
    /* Where a CUDA group keeps its fp32 masters and optimizer state (docs/offload.md) (1.7):
     * SX_OFFLOAD_NONE (0) = on its device; SX_OFFLOAD_STATE = in pinned host memory, with the
     * reduced gradient shard of each unit, where sx's CPU kernels update them (the thread
     * pool's num_threads then count). The params and gradients stay on the device: each
     * unit's reduced gradients are copied to the host as its reduction ends (overlapping
     * the backward where units are signalled ready), and its updated params back before its
     * gather. Every fp32 param gets an fp32 master on the host too; as 16-bit params' masters,
     * they are taken from the params at the first step (and after sx_broadcast_params or a
     * load), and later writes into the params do not reach them. Offloaded, every optimizer
     * runs on a CUDA group (custom ones, LAMB, Adafactor and Muon too). A CPU group's state
     * is on the host already: it ignores the setting. Every rank passes the same. */
    int32_t offload;
    int32_t reserved1;
    /* The context to make the group in (sx_context.h), borrowed for the call; NULL = none:
     * the group opens its own rendezvous, transport and pool. In a context, rendezvous,
     * rank, world_size, backend, num_threads, timeout_ms, transport, bind_address,
     * rendezvous_token, rendezvous_bind and device_ordinal are the context's: leave them
     * NULL or 0 (or equal to the context's). (1.7) */
    sx_context_t *context;
    /* The group's name in its context, copied: every rank passes the same, and no two live
     * groups of a context share one. Required with a context; at most 128 bytes of
     * letters, digits and "-_.". Without a context, only with SX_GROUP_JOIN: the context's
     * group that the process joins. (1.7) */
    const char *name;
} sx_group_config_t;

#define SX_PREFETCH_NONE (-1)

/* Fills *config with defaults and sets struct_size = size. size must be at least
 * offsetof(rendezvous) + sizeof(char*). */
SX_API sx_status_t sx_group_config_init(sx_group_config_t *config, size_t size);

/* Creates this rank's handle of a shard group and connects to the other ranks.
 * Collective: blocks until every rank has joined or config->timeout_ms passes.
 * config is borrowed for the call. On success *out owns the group; release it with
 * sx_destroy_shard_group. On failure *out is set to NULL. Ranks that pass different
 * world sizes fail at once with SX_ERR_MISMATCH naming each size. SX_BACKEND_CUDA without a
 * CUDA device or driver, or in a build without CUDA: SX_ERR_UNSUPPORTED saying which;
 * a device_ordinal that names no device: SX_ERR_INVALID_ARGUMENT. */
SX_API sx_status_t sx_create_shard_group(const sx_group_config_t *config, sx_shard_group_t **out);

/* Releases the group and everything it owns (buffers, views, threads, connections).
 * Accepts NULL. Returns even when peers are dead or stalled.
 *
 * Forks. A group (and a future) belongs to the process that created it. In a process
 * forked from it (fork(), Python's os.fork, multiprocessing's fork start method) the
 * inherited handle is inert: every call fails at once with SX_ERR_INVALID_STATE naming
 * the process that owns it, and sx_destroy_shard_group (a finalizer's, at the child's
 * exit) forgets it and returns SX_OK, releasing nothing that the owner uses: no peer is
 * told anything, no store key or shared segment is touched, no thread is waited for (the
 * owner's threads do not exist in the child). The child's copy of the group's memory
 * and the descriptors it inherited go when it exits; a child that lives on after its
 * parent died keeps the inherited sockets open, so that peers on other hosts notice the
 * parent's death only at their timeout. The owner trains on as if there were no fork. */
SX_API sx_status_t sx_destroy_shard_group(sx_shard_group_t *group);

/* Writes this rank's trace file now (see sx_group_config_t.trace_path): every event the
 * ring holds, replacing the file atomically (a reader never sees half of one). The ring
 * keeps its events, so a later flush, and the one at destroy, write them again with
 * whatever came since. SX_OK doing nothing when the group has no trace; SX_ERR_IO naming
 * the file if it cannot be written. Any thread. */
SX_API sx_status_t sx_trace_flush(sx_shard_group_t *group);

/* Makes the group fail: collectives in flight on other threads return SX_ERR_ABORTED
 * as soon as they notice, later calls return SX_ERR_GROUP_FAILED. A save in flight ends
 * within a fraction of a second with SX_ERR_ABORTED, committing nothing, so that
 * sx_destroy_shard_group does not wait for it. Any thread. */
SX_API sx_status_t sx_abort(sx_shard_group_t *group);

/* ---------------------------------------------------------------------------------
 * Meshes (HSDP: FSDP's HYBRID_SHARD, DeepSpeed's hpZ)
 *
 * With config->shard_size s < world size W, a group is a 2-D mesh: each shard group of s
 * ranks shards every unit s ways (its params, gradients and optimizer state: the layout
 * has s shards), and the W / s shard groups hold the same shards, as replicas. A step
 * reduce-scatters each unit's gradients inside the shard group (fast links), all-reduces
 * the reduced 1/s shard among the replicas (slow links: 1/s of the bytes a flat
 * all-reduce would send), updates, and all-gathers inside the shard group. With units
 * signalled ready, the replicas' all-reduce of one unit runs on a thread of its own while
 * the next unit is reduce-scattered. A checkpoint is written by the first replica group
 * alone (s files; no byte written twice), committed by every rank, and records the mesh;
 * it loads into any mesh, stage and world size. Every rank must pass the same
 * shard_size: a size that does not divide the world size, or ranks that disagree, fail
 * sx_create_shard_group on every rank.
 * ------------------------------------------------------------------------------- */

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_GROUP_H */
