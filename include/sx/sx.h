/*
 * sx: a training runtime with ZeRO-style sharded optimizer state, flat parameter
 * and gradient buffers, fused optimizer steps and collectives, behind a stable C ABI.
 *
 * Conventions that hold for every function below unless its comment says otherwise:
 *
 *  - Every function returns an sx_status_t. SX_OK is 0; on any other value
 *    sx_last_error_message() (thread-local) says in words what was wrong.
 *  - An invalid call has no effect: arguments and state are checked before anything
 *    changes.
 *  - Pointers passed in are borrowed for the duration of the call and copied if kept.
 *    Pointers handed out (views, names) are owned by the group and stay valid until
 *    the group is destroyed.
 *  - Thread safety: one thread uses a group at a time. Functions marked "any thread"
 *    may be called concurrently with anything.
 *  - Input structs begin with `size_t struct_size`. Fill them with their sx_*_init
 *    function, which sets struct_size and every default. A struct from an older
 *    caller (smaller struct_size) gets the defaults for the fields it lacks; a larger
 *    one is accepted only if its unknown tail is all zero. Output structs also carry
 *    struct_size: the library fills at most struct_size bytes of them.
 *  - Collective functions (marked "collective") must be called by every rank of the
 *    group in the same order with compatible arguments.
 */
#ifndef SX_SX_H
#define SX_SX_H

#include <stddef.h>
#include <stdint.h>

#if defined(_WIN32)
#define SX_API __declspec(dllexport)
#elif defined(__GNUC__)
#define SX_API __attribute__((visibility("default")))
#else
#define SX_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------------------
 * Versions
 * ------------------------------------------------------------------------------- */

#define SX_VERSION_MAJOR 1
#define SX_VERSION_MINOR 5
#define SX_VERSION_PATCH 0
#define SX_VERSION_NUMBER (SX_VERSION_MAJOR * 10000 + SX_VERSION_MINOR * 100 + SX_VERSION_PATCH)

/* The runtime's version as MAJOR*10000 + MINOR*100 + PATCH. Any thread. */
SX_API uint32_t sx_version(void);

/* ---------------------------------------------------------------------------------
 * Status codes: fixed values, never reused.
 * ------------------------------------------------------------------------------- */

typedef int32_t sx_status_t;

#define SX_OK 0
#define SX_ERR_INVALID_ARGUMENT 1 /* an argument is NULL, out of range or malformed */
#define SX_ERR_INVALID_HANDLE 2   /* a handle is NULL, destroyed or not an sx handle */
#define SX_ERR_INVALID_STATE 3    /* the call is not allowed at this point of the group's life */
#define SX_ERR_OUT_OF_MEMORY 4    /* an allocation failed; nothing was changed */
#define SX_ERR_NOT_FOUND 5        /* a named thing does not exist */
#define SX_ERR_ALREADY_EXISTS 6   /* a name is already taken */
#define SX_ERR_UNSUPPORTED 7      /* valid but not supported by this build or backend */
#define SX_ERR_TIMEOUT 8          /* a peer did not answer within the configured timeout */
#define SX_ERR_COMM 9             /* a collective or the rendezvous failed (peer died, socket error) */
#define SX_ERR_GROUP_FAILED 10    /* the group failed earlier; only destroy is allowed */
#define SX_ERR_IO 11              /* a file operation failed */
#define SX_ERR_CORRUPT 12         /* data failed verification */
#define SX_ERR_VERSION 13         /* a format or library version is not supported */
#define SX_ERR_ABORTED 14         /* sx_abort() was called on the group */
#define SX_ERR_MISMATCH 15        /* ranks disagree (param tables, trainable masks, arguments) */
#define SX_ERR_INTERNAL 16        /* a bug in sx; please report it with the message */
#define SX_ERR_CANCELLED 17       /* the operation was cancelled */
#define SX_ERR_NONFINITE 18       /* gradients hold inf or NaN (sx_step with SX_NONFINITE_ERROR) (1.5) */
#define SX_ERR_OPTIMIZER 19       /* a custom optimizer's update reported failure; the step changed nothing (1.5) */

/* Static text naming a status ("SX_ERR_TIMEOUT: ..."). Never NULL. Any thread. */
SX_API const char *sx_status_string(sx_status_t status);

/* The message of the last failed call on this thread, or "" if none. The pointer is
 * valid until the next sx call on this thread. Any thread. */
SX_API const char *sx_last_error_message(void);

/* ---------------------------------------------------------------------------------
 * Logging. The library never prints; it hands messages to this callback.
 * ------------------------------------------------------------------------------- */

#define SX_LOG_ERROR 1
#define SX_LOG_WARN 2
#define SX_LOG_INFO 3
#define SX_LOG_DEBUG 4

/* Called with a level, a NUL-terminated message (borrowed for the call) and `user`.
 * It may be called from any thread, including sx's internal threads, concurrently. */
typedef void (*sx_log_fn)(int32_t level, const char *message, void *user);

/* Sets the process-wide log callback and the most verbose level passed to it
 * (SX_LOG_ERROR..SX_LOG_DEBUG). fn NULL turns logging off (max_level is then ignored).
 * Until a program calls this, the environment variable SX_LOG_LEVEL (OFF, ERROR, WARN,
 * INFO, DEBUG or TRACE in any case, or 0-4; read once) sends messages up to that level to
 * stderr; a call replaces that, whatever its level. A bad SX_LOG_LEVEL is reported at
 * SX_LOG_ERROR to the first sink there is (stderr, or the callback set first).
 * Any thread. */
SX_API sx_status_t sx_set_log_callback(sx_log_fn fn, void *user, int32_t max_level);

/* ---------------------------------------------------------------------------------
 * Enumerations
 * ------------------------------------------------------------------------------- */

#define SX_DTYPE_F32 1
#define SX_DTYPE_F16 2
#define SX_DTYPE_BF16 3

#define SX_BACKEND_AUTO 0 /* SX_BACKEND_CUDA where this build has CUDA and a device is found, else SX_BACKEND_CPU */
#define SX_BACKEND_CPU 1  /* host memory, Gloo collectives */
#define SX_BACKEND_CUDA 2 /* device memory, NCCL collectives */

/* ---- The CUDA backend: what has run on a device, and what has not ------------------
 * SX_BACKEND_CUDA with one rank per group (world_size 1, or shard groups of one: no NCCL)
 * has run on a device (an H200: the optimizers fused, mixed precision with fp32 masters,
 * dynamic loss scaling, stages 1-3, checkpoints moved between device and CPU) and is
 * covered by the rules of docs/versioning.md like the rest of this header.
 * NOT YET RUN ON A DEVICE: SX_BACKEND_CUDA with more than one rank, that is NCCL's
 * collectives between devices (its reduce-scatter, all-gather, the pipeline's channels
 * on NCCL, HSDP meshes on NCCL) and AUTO on a host with several GPUs (each rank needs
 * its own device_ordinal). It compiles and its tests skip without devices; until a
 * release says it has run, its behaviour may change in a minor release
 * (docs/versioning.md, "Not yet run on a device").
 * ------------------------------------------------------------------------------- */

#define SX_DEVICE_CPU 0
#define SX_DEVICE_CUDA 1

#define SX_OPTIM_SGD 1   /* torch.optim.SGD */
#define SX_OPTIM_ADAM 2  /* torch.optim.Adam (weight_decay is L2 added to the gradient) */
#define SX_OPTIM_ADAMW 3 /* torch.optim.AdamW (decoupled weight decay) */
#define SX_OPTIM_ADAGRAD 4 /* torch.optim.Adagrad */
#define SX_OPTIM_RMSPROP 5 /* torch.optim.RMSprop */
#define SX_OPTIM_ADAMAX 6  /* torch.optim.Adamax */
#define SX_OPTIM_NADAM 7   /* torch.optim.NAdam */
#define SX_OPTIM_RADAM 8   /* torch.optim.RAdam */
#define SX_OPTIM_LION 9    /* Lion (Chen et al. 2023), as the lion-pytorch package's Lion */
/* LAMB (You et al. 2020), as the pytorch-optimizer package's Lamb (4.1.0): Adam's
 * direction scaled per param by a trust ratio from the norms of the whole param and of
 * its update, which sx sums over every rank's piece. CPU groups only (1.5). */
#define SX_OPTIM_LAMB 10
/* Muon, as torch.optim.Muon: momentum, then each 2-D param's whole matrix orthogonalised
 * by Newton-Schulz iterations (in bf16 arithmetic, as torch's) on one rank, which returns
 * each rank its piece of the update. 2-D params only (sx_finalize refuses others: give
 * them a param group of another optimizer, AdamW as usual). CPU groups only (1.5). */
#define SX_OPTIM_MUON 11
/* Adafactor, as torch.optim.Adafactor: a param of two or more dimensions keeps the means
 * of its squared gradient over its rows and over its columns (factored second moments,
 * far less state than Adam's), a 0-D or 1-D one a second moment per element; each
 * update is scaled by the param's RMS and clipped by its own RMS, sums that sx takes
 * over every rank's piece. CPU groups only (1.5). */
#define SX_OPTIM_ADAFACTOR 12

/* sx_group_config_t.transport. */
#define SX_TRANSPORT_AUTO 0 /* shared memory between the ranks of one host, else TCP */
#define SX_TRANSPORT_TCP 1  /* Gloo's TCP between every pair of ranks */

/* Hyperparameter keys for sx_set_hyperparameter / sx_get_hyperparameter. */
#define SX_HP_LR 1
#define SX_HP_WEIGHT_DECAY 2
#define SX_HP_BETA1 3
#define SX_HP_BETA2 4
#define SX_HP_EPS 5
#define SX_HP_MOMENTUM 6
#define SX_HP_DAMPENING 7
#define SX_HP_NESTEROV 8 /* 0 or 1 */
#define SX_HP_MAXIMIZE 9 /* 0 or 1 */
#define SX_HP_AMSGRAD 10 /* 0 or 1; may only change before the first step */
#define SX_HP_LR_DECAY 11                  /* Adagrad */
#define SX_HP_INITIAL_ACCUMULATOR_VALUE 12 /* Adagrad; used at a param's first update */
#define SX_HP_ALPHA 13                     /* RMSprop's smoothing constant */
#define SX_HP_CENTERED 14 /* RMSprop: 0 or 1; may only change before the first step */
#define SX_HP_MOMENTUM_DECAY 15            /* NAdam */
#define SX_HP_DECOUPLED_WEIGHT_DECAY 16    /* NAdam, RAdam: 0 or 1 (AdamW-style decay) */
#define SX_HP_NS_A 17     /* Muon: Newton-Schulz coefficients (a, b, c), torch's ns_coefficients */
#define SX_HP_NS_B 18
#define SX_HP_NS_C 19
#define SX_HP_NS_STEPS 20 /* Muon: Newton-Schulz iterations, 1 to 99 */
#define SX_HP_ADJUST_LR 21 /* Muon: SX_MUON_ADJUST_LR_* */
#define SX_HP_BETA2_DECAY 22 /* Adafactor: the second moments' decay, (1 - beta2_t) = step^beta2_decay, <= 0 */
#define SX_HP_EPS2 23        /* Adafactor: the floor of a param's RMS in its step size (eps's second) */
#define SX_HP_D 24           /* Adafactor: the update's RMS is clipped to d, >= 1 */

/* Muon's adjust_lr_fn: the lr a param of shape [A, B] is updated with. */
#define SX_MUON_ADJUST_LR_ORIGINAL 0             /* lr * sqrt(max(1, A / B)) (torch's None or "original") */
#define SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW 1      /* lr * 0.2 * sqrt(max(A, B)) */
#define SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED 2   /* lr * sqrt(A / B) */

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
 * store that outlives rank 0, file://, local://); the members' first group on it. */
#define SX_GROUP_JOIN 0x4
/* With memory_copy_interval: a step that takes a copy returns only once the next rank holds
 * it, so that a step that returned on any rank is never taken again after a loss (without
 * it the copy is sent while the trainer goes on, and a loss within that time costs the
 * step before the one in flight too). The step then costs the copy's sending. */
#define SX_GROUP_MEMORY_COPY_WAIT 0x8

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
    /* How CPU ranks exchange (1.5): SX_TRANSPORT_AUTO (0) = through shared memory where
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
     * scatter), each rank copies its shard of the state (fp32 values or masters, optimizer
     * state, step counts) into host memory at the step boundary, and in a flat group
     * sends that copy to the next rank (rank r's to rank (r + 1) % world_size) in the
     * background, on a connection of its own. A mesh needs no peer's copy: another
     * replica holds each shard. Each rank then holds its last two copies and, in a flat
     * group, its predecessor's two (sx_memory_stats_t.memory_copy_bytes): up to four
     * times its shard of the state. The step waits for a copy only where the next one is
     * due before the last was sent, and its update for the moment its shard is copied.
     * sx_regroup restores the survivors from the newest copy that every shard has. 0 =
     * none. CPU groups only (a CUDA group refuses it: SX_ERR_UNSUPPORTED). Every rank
     * passes the same. */
    int32_t memory_copy_interval;
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

/* ---------------------------------------------------------------------------------
 * Param groups: optimizer kind and hyperparameters shared by a set of params.
 * ------------------------------------------------------------------------------- */

typedef struct sx_param_group_desc {
    size_t struct_size;
    int32_t optimizer; /* SX_OPTIM_*; 0 = SX_OPTIM_ADAMW */
    int32_t nesterov;  /* SGD: 0 or 1 */
    int32_t maximize;  /* 0 or 1 */
    int32_t amsgrad;   /* Adam/AdamW: 0 or 1 */
    double lr;
    double weight_decay;
    double beta1, beta2, eps; /* Adam, AdamW, Adamax, NAdam, RAdam, Lion (betas); eps: Adagrad, RMSprop too */
    double momentum, dampening; /* SGD; momentum: RMSprop too */
    /* Appended in 1.x (an older caller's struct gets its optimizer's defaults for these). */
    int32_t centered;               /* RMSprop: 0 or 1 */
    int32_t decoupled_weight_decay; /* NAdam, RAdam, LAMB: 0 or 1 (LAMB's default 1) */
    double lr_decay;                /* Adagrad */
    double initial_accumulator_value; /* Adagrad */
    double alpha;                   /* RMSprop */
    double momentum_decay;          /* NAdam */
    /* Appended in 1.5: Muon's (defaults 3.4445, -4.7750, 2.0315; 5; ORIGINAL). */
    double ns_a, ns_b, ns_c;        /* Muon: Newton-Schulz coefficients */
    int32_t ns_steps;               /* Muon: Newton-Schulz iterations, 1 to 99 */
    int32_t adjust_lr;              /* Muon: SX_MUON_ADJUST_LR_* */
    /* Appended in 1.5: Adafactor's (defaults -0.8, 1e-3, 1.0); its eps1 is eps. */
    double beta2_decay, eps2, d;
} sx_param_group_desc_t;

/* Fills *desc with the defaults of `optimizer` (SX_OPTIM_*; 0 = AdamW), torch.optim's
 * (lion-pytorch's for Lion): SGD lr 1e-3; Adam, RAdam lr 1e-3, betas (0.9, 0.999),
 * eps 1e-8; AdamW the same with weight_decay 1e-2; Adagrad lr 1e-2, eps 1e-10; RMSprop
 * lr 1e-2, alpha 0.99, eps 1e-8; Adamax lr 2e-3, betas (0.9, 0.999), eps 1e-8; NAdam
 * the same with momentum_decay 4e-3; Lion lr 1e-4, betas (0.9, 0.99); LAMB lr 1e-3,
 * betas (0.9, 0.999), eps 1e-6, decoupled_weight_decay 1 (pytorch-optimizer's Lamb);
 * Muon lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov 1, eps 1e-7; Adafactor lr
 * 1e-2, eps 2^-23 (torch's eps1 of None: fp32's machine epsilon); ns_a, ns_b, ns_c
 * 3.4445, -4.7750, 2.0315 and ns_steps 5, beta2_decay -0.8, eps2 1e-3 and d 1 for every
 * optimizer (Muon's and Adafactor's); every other value 0. Because zero is a meaningful value for several hyperparameters, the defaults come
 * from this function (and, for an older caller's shorter struct, from the optimizer's
 * defaults), not from zero. Which hyperparameters apply to which optimizer, and the
 * range each must lie in, are in docs/optimizers.md; a value set for a hyperparameter
 * that does not apply (other than its default) is SX_ERR_INVALID_ARGUMENT. */
SX_API sx_status_t sx_param_group_desc_init(sx_param_group_desc_t *desc, size_t size,
                                            int32_t optimizer);

/* ---- Custom optimizers (1.5) ---------------------------------------------------------
 * A trainer brings its own elementwise optimizer: its name, its state slots and its
 * hyperparameters, and an update function that sx calls on its worker threads with one
 * contiguous piece of this rank's shard at a time. sx allocates, shards, steps,
 * checkpoints (by slot name), reshards on load and gathers its state whole exactly as it
 * does a built-in optimizer's. Registration is per process; the id it returns is used
 * where an SX_OPTIM_* value is (sx_param_group_desc_init, sx_param_group_desc_t.optimizer).
 * Every rank registers the same optimizers (name, slots, hyperparameters) before adding
 * the param groups that use them; the ranks' agreement compares them.
 * CPU groups only (a CUDA group's param group with a custom optimizer is
 * SX_ERR_UNSUPPORTED). docs/optimizers.md, "Custom optimizers", has the details.
 * ------------------------------------------------------------------------------- */

#define SX_OPTIM_CUSTOM_FIRST 1000      /* the first id sx_register_optimizer returns */
#define SX_HP_CUSTOM 1000               /* key of a custom optimizer's own hyperparameter i: SX_HP_CUSTOM + i */
#define SX_MAX_CUSTOM_SLOTS 3           /* state slots a custom optimizer may keep */
#define SX_MAX_CUSTOM_HYPERPARAMETERS 8 /* hyperparameters of its own (besides SX_HP_* ones) */
#define SX_MAX_CUSTOM_OPTIMIZERS 64     /* registrations per process */
#define SX_OPTIMIZER_ERROR_BYTES 256    /* sx_optimizer_piece_t.error_size */

/* One piece of a param's elements in this rank's shard, as sx hands it to a custom
 * optimizer's update. Everything is borrowed for the call. */
typedef struct sx_optimizer_piece {
    size_t struct_size;   /* sizeof(sx_optimizer_piece_t) of the library: fields are only appended */
    float *param;         /* n fp32 values (the fp32 masters of 16-bit params), updated in place */
    const float *grad;    /* n reduced gradients, summed over the ranks: use grad[i] * grad_scale */
    float *state[SX_MAX_CUSTOM_SLOTS]; /* the slots, n each, updated in place (NULL past num_slots) */
    size_t n;             /* elements in this piece (>= 1) */
    float grad_scale;     /* the average over ranks, the loss scale and the clipping coefficient */
    int32_t param_index;  /* the param the elements belong to (sx_add_param's index) */
    int32_t param_group;  /* its param group */
    uint64_t offset;      /* param[0]'s element offset in that param (row-major) */
    int64_t step;         /* the param's step count including this update (1 for its first) */
    const double *hyperparameters; /* the group's values, in registration order (num_hyperparameters) */
    void *user_data;      /* sx_optimizer_desc_t.user_data */
    int32_t num_slots;    /* the optimizer's slots (state[0..num_slots)) */
    int32_t num_hyperparameters; /* values in hyperparameters */
    /* An update that fails may write a NUL-terminated message here (error_size bytes,
     * empty on entry); sx puts it in the step's SX_ERR_OPTIMIZER message. */
    char *error;
    size_t error_size;
} sx_optimizer_piece_t;

/* A custom optimizer's update of one piece. Returns 0, or any other value to report
 * failure: then the step fails on every rank with SX_ERR_OPTIMIZER naming the optimizer,
 * the param and the value, and every param and state slot is as it was before the step
 * (unless the optimizer was registered SX_OPTIMIZER_IN_PLACE, below).
 * Called concurrently from sx's worker threads (pieces never overlap), never after
 * the last group using the optimizer is destroyed; it must not call into sx. */
typedef int32_t (*sx_optimizer_update_fn)(const sx_optimizer_piece_t *piece);

/* One hyperparameter of a custom optimizer. A name of sx's own hyperparameters ("lr",
 * "weight_decay", "beta1", "beta2", "eps", "momentum", ..., as sx_param_group_desc_t
 * names them) is that hyperparameter, with its key (SX_HP_*), its descriptor field, its
 * range and sx_set_lr; any other name is one of the optimizer's own, with key
 * SX_HP_CUSTOM + i (i counting its own in order). Used in arrays: never grows. */
typedef struct sx_optimizer_hyperparameter {
    const char *name;     /* copied */
    double default_value; /* the value a new param group starts with */
    double min, max;      /* an inclusive range the value must lie in; both 0: any finite value */
} sx_optimizer_hyperparameter_t;

typedef struct sx_optimizer_desc {
    size_t struct_size;
    const char *name;                /* unique, 1-63 of [A-Za-z0-9_.-]; copied */
    int32_t num_slots;               /* 0..SX_MAX_CUSTOM_SLOTS */
    const char *const *slot_names;   /* num_slots distinct names of [A-Za-z0-9_]; copied */
    const float *slot_initial_values; /* num_slots values each slot holds before a param's first
                                         update (NULL: 0); copied */
    int32_t num_hyperparameters;     /* 0..SX_MAX_CUSTOM_HYPERPARAMETERS own + any of sx's */
    const sx_optimizer_hyperparameter_t *hyperparameters; /* copied */
    sx_optimizer_update_fn update;   /* required */
    void *user_data;                 /* passed to update; must stay valid while a group uses it */
    uint32_t flags;                  /* SX_OPTIMIZER_* */
    int32_t reserved0;               /* must be 0 */
} sx_optimizer_desc_t;

/* sx_optimizer_desc_t.flags. IN_PLACE: update the params and slots in place, without the
 * second slot buffers and the copy of the params that let a failed update change nothing
 * (half the memory traffic of the update, and no extra memory); an update that reports
 * failure then leaves the step half done, and the group fails (only destroy is allowed
 * after, as after a lost peer). For an update that cannot fail. */
#define SX_OPTIMIZER_IN_PLACE 0x1

SX_API sx_status_t sx_optimizer_desc_init(sx_optimizer_desc_t *desc, size_t size);

/* Registers a custom optimizer for this process; *optimizer receives its id
 * (>= SX_OPTIM_CUSTOM_FIRST). Registering an equal description again (same name, slots,
 * initial values, hyperparameters, update and user_data) returns the same id; another
 * one under a taken name is SX_ERR_ALREADY_EXISTS. Errors (nothing registered): a wrong
 * struct_size, a missing update or name, a bad or repeated slot or hyperparameter name,
 * a default outside its range, more than SX_MAX_CUSTOM_OPTIMIZERS. Any thread. */
SX_API sx_status_t sx_register_optimizer(const sx_optimizer_desc_t *desc, int32_t *optimizer);

/* Adds a param group; *index_out (may be NULL) receives its index (0, 1, ...). Before
 * sx_finalize, or between steps after it: then the group (and the params added with it)
 * wait for the next sx_finalize, which every rank calls after adding the same groups and
 * params in the same order. */
SX_API sx_status_t sx_add_param_group(sx_shard_group_t *group, const sx_param_group_desc_t *desc,
                                      int32_t *index_out);

/* Sets one hyperparameter (SX_HP_*) of a param group; it takes effect at the next
 * step. Errors: unknown key, a value out of range (lr < 0, beta outside [0,1), eps < 0,
 * a key that does not apply to the group's optimizer), amsgrad after the first step. */
SX_API sx_status_t sx_set_hyperparameter(sx_shard_group_t *group, int32_t param_group, int32_t key,
                                         double value);
SX_API sx_status_t sx_get_hyperparameter(const sx_shard_group_t *group, int32_t param_group,
                                         int32_t key, double *value);
/* Shorthand for sx_set_hyperparameter(group, param_group, SX_HP_LR, lr). */
SX_API sx_status_t sx_set_lr(sx_shard_group_t *group, int32_t param_group, double lr);

/* ---------------------------------------------------------------------------------
 * Params
 * ------------------------------------------------------------------------------- */

#define SX_MAX_NDIM 8
#define SX_MAX_NAME_BYTES 1024

typedef struct sx_param_desc {
    size_t struct_size;
    const char *name;      /* unique, non-empty UTF-8, at most SX_MAX_NAME_BYTES; copied */
    int32_t ndim;          /* 0..SX_MAX_NDIM (0 = scalar) */
    int32_t dtype;         /* SX_DTYPE_*; 0 = SX_DTYPE_F32 (F16, BF16: see Mixed precision) */
    const int64_t *shape;  /* ndim positive extents; copied */
    int32_t param_group;   /* index from sx_add_param_group */
    int32_t unit;          /* >= 0; params of one unit share one flat buffer */
    int32_t frozen;        /* 0 = trainable (default), 1 = frozen */
    int32_t reserved0;
} sx_param_desc_t;

SX_API sx_status_t sx_param_desc_init(sx_param_desc_t *desc, size_t size);

/* Registers a param; *index_out (may be NULL) receives its index (0, 1, ...). After
 * sx_finalize (between steps), a param goes in a new unit, whose id is above every unit
 * laid out so far, and has no views until the next sx_finalize lays it out. Errors:
 * empty, overlong, non-UTF-8 or duplicate name, bad shape, unknown param group, negative
 * unit, after sx_finalize a unit id not above every laid-out one. */
SX_API sx_status_t sx_add_param(sx_shard_group_t *group, const sx_param_desc_t *desc,
                                int32_t *index_out);

/* Collective. Checks that every rank registered the same param groups and params,
 * lays out the flat buffers and allocates them. Params and gradients start at zero.
 * Called again after params or param groups were added (between steps, with no
 * micro-batch accumulated), it lays out and allocates what was added, in new units after
 * the others: the params laid out before, their views, units, unit indices, optimizer
 * state and step counts are untouched, and the next step updates the new params too
 * (from step count 0, with fresh optimizer state, as torch's add_param_group). Until then
 * every collective call of the group fails with SX_ERR_INVALID_STATE saying so. A failed
 * sx_finalize changes nothing. */
SX_API sx_status_t sx_finalize(sx_shard_group_t *group);

/* Collective. Copies every param of rank `root` to all ranks (for initial values
 * made on one rank). After sx_finalize. */
SX_API sx_status_t sx_broadcast_params(sx_shard_group_t *group, int32_t root);

/* sx_all_reduce's op. */
#define SX_REDUCE_SUM 1
#define SX_REDUCE_MEAN 2 /* the sum divided by the world size */
#define SX_REDUCE_MAX 3
#define SX_REDUCE_MIN 4
#define SX_MAX_ALL_REDUCE 64 /* values per sx_all_reduce call */

/* Collective (1.5). Combines the trainer's own numbers over the ranks, for what it needs
 * besides the gradients (the loss, token counts, a flag one rank raised) without a
 * communicator of its own: values[i] becomes the sum, mean, max or min (`op`,
 * SX_REDUCE_*) of every rank's values[i], for i < count (1 <= count <=
 * SX_MAX_ALL_REDUCE). Sums are added in rank order, so every rank gets the same bits;
 * any NaN makes the result NaN, for every op. values is borrowed for the call; on failure
 * it is left as it was. Every rank passes the same op and count (the call's header
 * compares them: SX_ERR_MISMATCH otherwise), at the same point of its sequence of
 * collective calls. Any time after sx_create_shard_group. */
SX_API sx_status_t sx_all_reduce(sx_shard_group_t *group, double *values, int32_t count, int32_t op);

/* ---------------------------------------------------------------------------------
 * Views: zero-copy windows into the flat buffers, valid for the group's lifetime.
 * ------------------------------------------------------------------------------- */

typedef struct sx_view {
    size_t struct_size;
    void *data;       /* first element; aligned to the group's alignment */
    uint64_t numel;   /* number of elements */
    int32_t dtype;    /* SX_DTYPE_* */
    int32_t device;   /* SX_DEVICE_*: where data lives */
} sx_view_t;

SX_API sx_status_t sx_view_init(sx_view_t *view, size_t size);

/* The param's values. The trainer reads them in forward and may write them only
 * between steps (initial values, loading its own weights). After sx_finalize. Stage 3:
 * only while the param's unit is gathered (SX_ERR_INVALID_STATE otherwise), and valid
 * until it is released. */
SX_API sx_status_t sx_param_view(const sx_shard_group_t *group, int32_t param, sx_view_t *out);

/* The param's gradient. The trainer ADDS its gradient into it (as torch accumulates
 * into .grad); sx zeroes it after sx_accumulate_grads (stage 2) and after sx_step.
 * After sx_finalize. */
SX_API sx_status_t sx_grad_view(const sx_shard_group_t *group, int32_t param, sx_view_t *out);

/* The whole flat buffer of unit `unit` (an index, as sx_unit_gather's) (1.5): its params
 * (grad = 0) or its gradients (grad = 1), padded_numel elements (sx_get_unit_info) of
 * the unit's dtype (the gradients': its grad dtype), each param at its
 * offset_in_unit (sx_get_param_info) in registration order, the padding after the last
 * (zero; ignored by the step). For a trainer that keeps all its params, or all its
 * gradients, behind one pointer: with a packed layout (config->alignment 1) and one unit
 * they are exactly its array. The rules of the params' and gradients' own views hold
 * (the trainer adds into the gradients; at stage 3 the params only while the unit is
 * gathered). After sx_finalize. */
SX_API sx_status_t sx_unit_view(const sx_shard_group_t *group, int32_t unit, int32_t grad, sx_view_t *out);

/* Index of the param named `name` (borrowed), or SX_ERR_NOT_FOUND. */
SX_API sx_status_t sx_find_param(const sx_shard_group_t *group, const char *name, int32_t *index);

/* ---------------------------------------------------------------------------------
 * Trainability
 *
 * The group owns one byte per param (1 = trainable, 0 = frozen). The trainer may
 * flip bytes directly through the pointer from sx_trainable_mask, or call
 * sx_set_trainable; either way the next sx_step notices the change by itself (unless
 * SX_GROUP_NO_TRAINABLE_AUTODETECT is set, then sx_refresh_trainable applies it).
 * Frozen params get no update and their gradients are ignored; their optimizer state
 * is kept, so unfreezing resumes where it stopped. Every rank must hold the same mask
 * at each step; if not, sx_step fails with SX_ERR_MISMATCH on every rank.
 * ------------------------------------------------------------------------------- */

SX_API sx_status_t sx_set_trainable(sx_shard_group_t *group, int32_t param, int32_t trainable);
SX_API sx_status_t sx_get_trainable(const sx_shard_group_t *group, int32_t param,
                                    int32_t *trainable);
/* *mask receives the group-owned byte array of *count entries. After sx_finalize.
 * Adding params after sx_finalize may move it: take it again after sx_add_param. */
SX_API sx_status_t sx_trainable_mask(sx_shard_group_t *group, uint8_t **mask, int32_t *count);
/* Applies the current mask now (local; the next step checks ranks agree). */
SX_API sx_status_t sx_refresh_trainable(sx_shard_group_t *group);

/* ---------------------------------------------------------------------------------
 * The step
 * ------------------------------------------------------------------------------- */

/* Collective. Call after the backward of every micro-batch but the last of a step:
 * folds the gradients now in the grad views into the step's accumulation and zeroes
 * the grad views. Stage 2 reduce-scatters them into the sharded accumulator, so
 * full-size gradients live for one micro-batch only; stage 1 keeps them in place
 * (the grad views are then not zeroed: the next micro-batch adds to them). */
SX_API sx_status_t sx_accumulate_grads(sx_shard_group_t *group);

typedef struct sx_step_options {
    size_t struct_size;
    /* Clip the global L2 norm of the (rank-averaged) gradients of trainable params to
     * this value, as torch.nn.utils.clip_grad_norm_; 0 = no clipping. */
    double max_grad_norm;
    /* SX_BACKEND_CUDA: the trainer's CUDA stream (cudaStream_t); the step follows the
     * work enqueued on it so far (NULL = the legacy default stream), and its own device
     * work has finished when sx_step returns. Must be NULL on the CPU backend. */
    void *stream;
    /* 0 (default): zero the grad views after the step, so the next backward can add
     * into them. 1: do not zero them (a trainer whose backward overwrites its
     * gradients, or zeroes them itself, saves a pass over memory); their contents after
     * the step are then unspecified, as the reduction may use them as scratch. */
    int32_t keep_grads;
    /* Stages 1 and 2: 0 (default): every param is gathered before sx_step returns. 1:
     * sx_step returns after the update and the updated params are all-gathered in the
     * background, unit by unit, while the trainer goes on; the trainer calls
     * sx_unit_gather(u) before it reads unit u's params (see "Units as a pipeline"). The
     * units are gathered in the reverse of the reductions' order (with units signalled
     * ready, the reverse of rank 0's backward at the previous step, so the forward's
     * order; without, increasing unit index). Every rank passes the same value. Stage 3
     * ignores it. */
    int32_t defer_gather;
    /* Uneven inputs (ZeroRedundancyOptimizer's Join, in one call): 1 = this step's
     * gradients are sums over this rank's `weight` samples (or tokens), and the step
     * divides their sum over the ranks by the sum of every rank's weight, so that the
     * update equals one process over the union of the data. A rank whose data ran out
     * passes weight 0 and leaves its gradients at zero (as sx left them): it only takes
     * part in the collectives. If every rank's weight is 0 there is nothing to average:
     * the step is skipped (result->skipped = 1, nothing changes). 0 (default): the
     * gradients are each rank's mean, averaged over the ranks. Every rank passes the same
     * `weighted`. */
    int32_t weighted;
    int32_t reserved0;
    /* With weighted: this rank's weight, finite and >= 0. */
    double weight;
    /* What gradients holding inf or NaN do, SX_NONFINITE_* (1.5). Every rank passes the
     * same value. */
    int32_t nonfinite;
    int32_t reserved1;
} sx_step_options_t;

/* sx_step_options_t.nonfinite. The gradients are checked through their global L2 norm
 * (over every rank, after the reduction): inf or NaN anywhere makes it inf or NaN. What a
 * custom optimizer's update writes (a param's values and its state) is checked too, on
 * every rank, and judged the same way: by default kept and reported (result->nonfinite);
 * with SX_NONFINITE_SKIP or _ERROR the step is undone on every rank and skipped, as for
 * gradients (loss scaling does not back off for it), and _ERROR's SX_ERR_NONFINITE names
 * the optimizer and the param. An optimizer registered SX_OPTIMIZER_IN_PLACE cannot be
 * undone: there the skip fails the group instead. */
/* Where the step needs the norm before the update (max_grad_norm > 0, or dynamic loss
 * scaling), a non-finite norm skips the step on every rank: no param, optimizer state or
 * step count changes, the gradients are dropped, result->skipped and result->nonfinite are
 * 1 (loss scaling also backs off). Without clipping or loss scaling nothing checks first:
 * the update runs, as torch's optimizers do, and inf/NaN reach the params (the norm, taken
 * in the same pass, sets result->nonfinite afterwards). */
#define SX_NONFINITE_DEFAULT 0
/* The norm is always taken before the update (without clipping: one more pass over the
 * gradients) and a non-finite one skips the step, as above. */
#define SX_NONFINITE_SKIP 1
/* As SX_NONFINITE_SKIP, and sx_step then returns SX_ERR_NONFINITE (torch's
 * clip_grad_norm_(error_if_nonfinite=True)); the group stays usable. */
#define SX_NONFINITE_ERROR 2

SX_API sx_status_t sx_step_options_init(sx_step_options_t *options, size_t size);

typedef struct sx_step_result {
    size_t struct_size;
    double grad_norm;  /* global L2 norm of the averaged gradients before clipping */
    uint64_t step;     /* number of steps taken by the group, this one included */
    /* 1 if the step was skipped: non-finite gradients (see SX_NONFINITE_DEFAULT), or no
     * rank had data (options->weighted). */
    int32_t skipped;
    int32_t reserved0;
    /* The loss scale to multiply the next losses by (1 without loss scaling). */
    double loss_scale;
    /* 1 if the gradients' global norm was inf or NaN, or a custom optimizer's update wrote
     * inf or NaN (1.5). */
    int32_t nonfinite;
    int32_t reserved1;
} sx_step_result_t;

SX_API sx_status_t sx_step_result_init(sx_step_result_t *result, size_t size);

/* Collective. Reduces the gradients over ranks (average) (waiting for the reductions of
 * units signalled ready with sx_unit_grads_ready), clips, updates this rank's shard of
 * every trainable param with its param group's optimizer, and gathers the updated params
 * into every rank's param views (in the background with options->defer_gather; at stage
 * 3 only into the units gathered now); then zeroes the grads (unless options->keep_grads). The first thing it does is check that every rank is in
 * sx_step with the same trainable mask, hyperparameters and options (else
 * SX_ERR_MISMATCH on every rank, and nothing changes). options may be
 * NULL (defaults); result may be NULL. On a communication error or timeout the group
 * is marked failed and the call returns within the configured timeout. */
SX_API sx_status_t sx_step(sx_shard_group_t *group, const sx_step_options_t *options,
                           sx_step_result_t *result);

/* ---------------------------------------------------------------------------------
 * Units as a pipeline
 *
 * A unit (the params registered with one unit id; the units are numbered by index,
 * 0 .. sx_get_num_units() - 1, in increasing unit id, as sx_get_unit_info) is the grain
 * of communication. Its gradients can be reduced while the trainer's backward goes on
 * with the units before it, and its params gathered while its forward goes on with the
 * units before it:
 *
 *   backward:  ... unit u's gradients written -> sx_unit_grads_ready(group, u, NULL) ...
 *   sx_step:   waits only for the reductions still in flight, then updates
 *   forward:   sx_unit_gather(group, u) -> unit u's forward -> sx_unit_release(group, u)
 *
 * Reductions run on a thread of sx's own, gathers on another (each with its own
 * connections), so that a rank may interleave them differently from its peers; on each,
 * every rank runs the same collectives in the same order. A trainer that calls none of
 * these functions gets today's behaviour: sx_step reduces and gathers everything.
 *
 * Stage 3 shards the params themselves: a rank keeps its 1/world_size shard of every
 * unit, and a unit's full params are present for the trainer only between sx_unit_gather
 * and sx_unit_release (around its forward, and again around its backward). sx gathers
 * config->prefetch_depth units ahead of the trainer's calls, in the previous step's order
 * (sx_step itself starts the next forward's first ones). A rank so holds param bytes of
 * its shards plus at most (the units the trainer holds gathered at once +
 * config->prefetch_depth) gathered units (sx_memory_stats_t.peak_param_bytes shows it);
 * between steps, its shards and the units prefetched for the next forward.
 * Gradient buffers stay whole at every stage. sx_param_view of a param whose unit is not
 * gathered fails with SX_ERR_INVALID_STATE; a view taken earlier is invalid once its unit
 * is released. sx_broadcast_params at stage 3 sends the units that root holds gathered
 * (each rank keeps its shard of them). Checkpoints hold the same values at every stage
 * and load into any stage.
 * ------------------------------------------------------------------------------- */

typedef struct sx_unit_ready_options {
    size_t struct_size;
    /* 1: an intermediate micro-batch (sx_accumulate_grads ends it); 0 (default): the
     * last one (sx_step ends it). Every signal of one micro-batch says the same. */
    int32_t accumulate;
    int32_t reserved0;
    /* SX_BACKEND_CUDA: the trainer's CUDA stream (cudaStream_t) the gradients were
     * written on; the reduction follows the work enqueued on it so far (NULL = the legacy
     * default stream). Must be NULL on the CPU backend. */
    void *stream;
} sx_unit_ready_options_t;

SX_API sx_status_t sx_unit_ready_options_init(sx_unit_ready_options_t *options, size_t size);

/* Says that unit `unit`'s gradients are complete for this micro-batch: the trainer writes
 * them no more until the sx_step (or sx_accumulate_grads) that ends the micro-batch
 * returns. Returns at once; sx reduces them on its own thread. Units may be signalled in
 * any order, and ranks may signal in different orders: the reductions run in one order
 * that every rank keeps (the order rank 0 signalled in at the previous step; before that,
 * decreasing unit index). Units not signalled are reduced by the call that ends the
 * micro-batch, as without these signals. options may be NULL (defaults).
 *
 * The trainable mask in force at the first signal of a micro-batch holds for the whole
 * micro-batch; the first signal also checks (on sx's thread) that every rank agrees on
 * it. Every rank must signal the same units in a micro-batch: otherwise the call that
 * ends it fails with SX_ERR_MISMATCH on every rank, and the step's gradients are dropped
 * (params, optimizer state and step counts do not change). Errors here: a unit signalled
 * twice in one micro-batch (SX_ERR_INVALID_STATE), an accumulate flag unlike the
 * micro-batch's first (SX_ERR_INVALID_ARGUMENT); a reduction that fails on sx's thread
 * (a dead peer, a timeout) fails the group, and the next call says so. */
SX_API sx_status_t sx_unit_grads_ready(sx_shard_group_t *group, int32_t unit,
                                       const sx_unit_ready_options_t *options);

/* Stage 3, collective (every rank gathers the same units in the same order): makes unit
 * `unit`'s full params present on this rank and returns once they are: it waits for the
 * unit's prefetched gather, or gathers it now. Then it prefetches the next
 * config->prefetch_depth units of the order of the previous step's calls. Calls nest:
 * each needs its sx_unit_release. A gather that communicates (its unit not prefetched)
 * sends the call's header ahead of its data, in the same job: ranks gathering different
 * units, or a rank gathering while another is in another collective call, all return
 * SX_ERR_MISMATCH ("the call: sx_unit_gather on rank 0, sx_step on rank 1"; "the unit
 * gathered: 1 on rank 0, 0 on rank 1") at once, and the unit is not gathered. A gather of
 * a prefetched unit exchanges nothing: a rank whose calls went astray is told at its next
 * call that communicates (the step's header names the units gathered).
 * Stages 1 and 2: waits for the unit's all-gather after a step with defer_gather, and
 * returns at once otherwise (local). */
SX_API sx_status_t sx_unit_gather(sx_shard_group_t *group, int32_t unit);

/* Stage 3 (local): ends an sx_unit_gather. When the last one ends, this rank keeps its
 * shard of what the unit's params hold (values the trainer wrote into them, such as
 * initial values, are kept: written on every rank, or broadcast) and frees the rest,
 * unless the prefetch order needs the unit again soon. SX_ERR_INVALID_STATE without a
 * gather to end. Stages 1 and 2: nothing. */
SX_API sx_status_t sx_unit_release(sx_shard_group_t *group, int32_t unit);

/* ---------------------------------------------------------------------------------
 * Mixed precision
 *
 * A param registered with dtype SX_DTYPE_BF16 or SX_DTYPE_F16 has a 16-bit param view
 * (the trainer's compute copy) and, on the rank whose shard covers it, fp32 master
 * weights; its optimizer state is fp32. All params of one unit share a dtype. The step
 * updates the fp32 masters and writes them, rounded to nearest even, into the 16-bit
 * params of every rank. The masters start from the param views at the first step (or
 * at an earlier sx_state_view of "master", which can seed them with finer values), and
 * again at the first step after sx_broadcast_params; a checkpoint stores and loads
 * them. Values written into a 16-bit param view at other times are overwritten by
 * the next step. Gradients are in the param's dtype, or fp32 with config->grad_dtype;
 * reduction in their dtype or fp32 (config->reduce_dtype). Checkpoints hold the fp32
 * masters, so they load into a group of any dtype.
 *
 * Loss scaling (torch.cuda.amp.GradScaler's semantics): the trainer multiplies its
 * loss by the scale (sx_get_loss_scale, or sx_step_result_t.loss_scale) before
 * backward; sx_step divides the gradients by it. Dynamic scaling checks the reduced
 * gradients of every rank for inf/NaN first: if any, the step is skipped (no param,
 * state or step count changes; the gradients are dropped; result->skipped = 1) and
 * the scale is multiplied by backoff_factor; after growth_interval steps in a row
 * without one, it is multiplied by growth_factor.
 * ------------------------------------------------------------------------------- */

#define SX_LOSS_SCALING_NONE 0    /* gradients are used as they are (the default) */
#define SX_LOSS_SCALING_DYNAMIC 1 /* skip steps with inf/NaN, back off and grow */
#define SX_LOSS_SCALING_STATIC 2  /* divide by init_scale, never skip */

typedef struct sx_loss_scaling {
    size_t struct_size;
    int32_t mode;            /* SX_LOSS_SCALING_* */
    int32_t growth_interval; /* > 0; 0 = 2000 */
    double init_scale;       /* finite, > 0; 0 = 65536 */
    double growth_factor;    /* > 1; 0 = 2 */
    double backoff_factor;   /* in (0, 1); 0 = 0.5 */
} sx_loss_scaling_t;

SX_API sx_status_t sx_loss_scaling_init(sx_loss_scaling_t *scaling, size_t size);

/* Sets loss scaling (scaling borrowed for the call) and resets the scale to
 * init_scale. Between steps; every rank must set the same (sx_step checks). */
SX_API sx_status_t sx_set_loss_scaling(sx_shard_group_t *group, const sx_loss_scaling_t *scaling);

/* The current loss scale: what the next losses are to be multiplied by (1 without
 * loss scaling). */
SX_API sx_status_t sx_get_loss_scale(const sx_shard_group_t *group, double *scale);

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

/* ---------------------------------------------------------------------------------
 * Whole optimizer state
 *
 * ZeroRedundancyOptimizer's consolidate_state_dict and load_state_dict, without a
 * checkpoint directory: the whole, unsharded, unpadded optimizer state of every param
 * gathered onto one rank, param by param, or scattered from one rank into every rank's
 * shard, at any world size and stage. A param's state tensors carry torch's names:
 * "exp_avg", "exp_avg_sq" and (amsgrad) "max_exp_avg_sq" for Adam and AdamW,
 * "momentum_buffer" for SGD with momentum, "variance" (0-D and 1-D params) or "row_var"
 * and "col_var" (others) for Adafactor, each optimizer's as docs/optimizers.md lists
 * them, and "master" (the fp32 master weights) for 16-bit params. Hyperparameters are read and set as always (sx_get_hyperparameter,
 * sx_set_hyperparameter).
 * ------------------------------------------------------------------------------- */

typedef struct sx_param_state {
    size_t struct_size;
    int32_t param;       /* its index */
    int32_t param_group;
    const char *name;    /* owned by the group */
    uint64_t numel;      /* elements of each tensor: the param's, in its own index space */
    /* Updates applied to the param (torch's state["step"] of Adam and AdamW). */
    int64_t step;
    /* SGD with momentum: updates that used momentum_buffer; 0 means it was never
     * initialised (torch: no momentum_buffer), and the next update starts it from the
     * gradient. */
    int64_t momentum_steps;
    int32_t num_tensors;
    int32_t reserved0;
    const char *const *tensor_names; /* num_tensors names, owned by sx */
    float *const *tensors;           /* num_tensors arrays of numel fp32 in host memory, owned
                                      * by sx, valid for the call */
    /* Appended in 1.5. NAdam: torch's state["mu_product"], the product of the param's
     * momentum coefficients (a float32 value, in (0, 1]); 0 for other optimizers. A
     * scatter's callback may leave it 0 (as sx presets it): sx then derives it from step
     * with the group's beta1 and momentum_decay, which is torch's value unless those
     * changed during training. */
    double mu_product;
    /* Appended in 1.5: each tensor's element count, num_tensors of them (owned by sx).
     * numel for every tensor but Adafactor's factored moments of a param of shape
     * [..., R, C] (two or more dimensions), which are not param-shaped: "row_var",
     * prod(shape[:-1]) values (torch's shape [..., R, 1]), and "col_var",
     * prod(shape[:-2]) * C (torch's [..., 1, C]). Every rank keeps them whole. */
    const uint64_t *tensor_numels;
} sx_param_state_t;

/* Called once per param, in index order, on the root of a gather (the tensors hold the
 * param's state) or of a scatter (the tensors are zero; the callback fills them and sets
 * step and momentum_steps), on the calling thread. A status other than SX_OK ends the
 * operation with that status (no more calls; a scatter then changes nothing). It must not
 * call sx functions on the group. */
typedef sx_status_t (*sx_param_state_fn)(sx_param_state_t *state, void *user);

/* Collective (every rank, the same root). Gathers every param's whole optimizer state
 * onto `root`, whose fn (user passed back) sees one param at a time; fn may be NULL on
 * the other ranks (NULL on the root fails the call on every rank, with
 * SX_ERR_INVALID_ARGUMENT). Every param is delivered: one without optimizer state yet (never
 * trainable at a step) has only its "master" (16-bit) or no tensor. Memory: the root
 * holds, besides its shard, one buffer for the largest param's state (its tensors x
 * numel x 4 bytes; on a CUDA group one in device and one in host memory); no rank holds
 * more than its shard otherwise. If fn fails, every rank returns the failure (the root
 * fn's status and words). */
SX_API sx_status_t sx_gather_optim_state(sx_shard_group_t *group, int32_t root, sx_param_state_fn fn,
                                         void *user);

/* Collective (every rank, the same root). The reverse: root's fn fills each param's whole
 * state (every tensor its optimizer keeps, and "master" for 16-bit params; a tensor left
 * zero is zero state, as torch's when it has none) and its step counts, and every rank's
 * shard takes its part; 16-bit params then take their values from the new masters on
 * every rank. Nothing changes unless every rank and every call of fn succeeded: each rank
 * receives into a copy of its shard's state, which replaces the shard at the end (so a
 * rank holds its optimizer state twice meanwhile). Views from sx_state_view are invalid
 * afterwards. fn may be NULL on the ranks that are not root (NULL on the root fails the
 * call on every rank, with SX_ERR_INVALID_ARGUMENT). */
SX_API sx_status_t sx_scatter_optim_state(sx_shard_group_t *group, int32_t root, sx_param_state_fn fn,
                                          void *user);

/* This rank's own part of one of a param's optimizer-state tensors (`tensor`, a name as
 * above, borrowed), in place: zero copy, fp32, out->numel elements, which are the param's
 * elements [shard_begin, shard_end) of sx_param_info_t (numel 0 and data NULL where this
 * rank's shard holds none of it). An embedding service may read it, or write it between
 * steps to seed the state. A view of "master" before the first step fixes the masters
 * then, from the 16-bit params (as the first step would otherwise): it shows them, and
 * what is written into it is what the step updates (e.g. fp32 values finer than the
 * params'); params written after it do not reach the masters. Valid until the next
 * sx_load_optim_state or sx_scatter_optim_state, which replace the state. Errors: a
 * name the param's optimizer does not keep (SX_ERR_INVALID_ARGUMENT, listing those it
 * keeps), a param without optimizer state yet (SX_ERR_INVALID_STATE: a unit gets its
 * state, zero, at sx_finalize if one of its params is trainable then, else at the first
 * step at which one is). */
SX_API sx_status_t sx_state_view(const sx_shard_group_t *group, int32_t param, const char *tensor,
                                 sx_view_t *out);

/* ---------------------------------------------------------------------------------
 * Queries
 * ------------------------------------------------------------------------------- */

SX_API sx_status_t sx_get_rank(const sx_shard_group_t *group, int32_t *rank);
SX_API sx_status_t sx_get_world_size(const sx_shard_group_t *group, int32_t *world_size);
SX_API sx_status_t sx_get_stage(const sx_shard_group_t *group, int32_t *stage);
SX_API sx_status_t sx_get_num_params(const sx_shard_group_t *group, int32_t *count);
SX_API sx_status_t sx_get_num_units(const sx_shard_group_t *group, int32_t *count);
SX_API sx_status_t sx_get_num_param_groups(const sx_shard_group_t *group, int32_t *count);

typedef struct sx_memory_stats {
    size_t struct_size;
    uint64_t param_bytes;     /* full flat param buffers on this rank (stage 3: its shard of
                               * every unit, plus the units gathered now) */
    uint64_t grad_bytes;      /* full flat grad buffers + sharded grad accumulators */
    uint64_t optimizer_bytes; /* this rank's shard of optimizer state */
    /* Checkpoint staging: one shard, kept for the next save; after a second load in a
     * row, the optimizer state it replaced, kept for the next load until a save. */
    uint64_t staging_bytes;
    /* Optimizer state that one unsharded process would hold for the same params. */
    uint64_t unsharded_optimizer_bytes;
    /* The most param_bytes this rank held at once since sx_finalize (stage 3: its shards
     * plus the units gathered at that moment). */
    uint64_t peak_param_bytes;
    /* Memory copies (sx_group_config_t.memory_copy_interval) held in host memory: this
     * rank's copies of its shard and, in a flat group, its predecessor's. */
    uint64_t memory_copy_bytes;
} sx_memory_stats_t;

SX_API sx_status_t sx_memory_stats_init(sx_memory_stats_t *stats, size_t size);
/* Bytes held by this rank, per category. After sx_finalize. */
SX_API sx_status_t sx_get_memory_stats(const sx_shard_group_t *group, sx_memory_stats_t *out);

typedef struct sx_param_info {
    size_t struct_size;
    const char *name;    /* owned by the group */
    int32_t ndim;
    int32_t dtype;
    int64_t shape[SX_MAX_NDIM];
    uint64_t numel;
    int32_t param_group;
    int32_t unit;
    int32_t trainable;
    int32_t reserved0;
    /* Layout (after sx_finalize): element offset of the param in its unit's flat
     * buffer, and the part of the param, in its own index space [0, numel), that this
     * rank's shard covers ([0, 0) if none). */
    uint64_t offset_in_unit;
    uint64_t shard_begin;
    uint64_t shard_end;
} sx_param_info_t;

SX_API sx_status_t sx_param_info_init(sx_param_info_t *info, size_t size);
SX_API sx_status_t sx_get_param_info(const sx_shard_group_t *group, int32_t param,
                                     sx_param_info_t *out);

typedef struct sx_unit_info {
    size_t struct_size;
    int32_t unit;        /* the unit id given in sx_param_desc_t */
    int32_t num_params;
    uint64_t numel;      /* elements of its params, without padding */
    uint64_t padded_numel; /* flat buffer length: a multiple of world_size * alignment */
    uint64_t shard_numel;  /* S = padded_numel / shard_size */
    uint64_t shard_begin;  /* this rank's shard: [shard_rank*S, (shard_rank+1)*S) */
    int32_t trainable;     /* 1 if any of its params is trainable */
    int32_t has_optimizer_state;
    /* The mesh: this rank is shard_rank of its shard group's shard_size ranks, and
     * replica_rank of the replicas groups that hold the same shards (flat: shard_size =
     * world size, shard_rank = rank, replicas = 1, replica_rank = 0). */
    int32_t shard_size;
    int32_t shard_rank;
    int32_t replicas;
    int32_t replica_rank;
} sx_unit_info_t;

SX_API sx_status_t sx_unit_info_init(sx_unit_info_t *info, size_t size);
/* index is 0..num_units-1, in increasing order of unit id. After sx_finalize. */
SX_API sx_status_t sx_get_unit_info(const sx_shard_group_t *group, int32_t index,
                                    sx_unit_info_t *out);


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
    /* The checkpoint directory to create, copied. It must not exist; its parent must.
     * The parent also receives `latest` (the name of the newest committed checkpoint)
     * and holds the ones keep_last considers. Its last component may not be `latest`,
     * `latest.tmp` or end in `.sx-partial` (an unfinished save's directory, which the
     * next save removes). Every rank passes the same path. Required. */
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

#endif /* SX_SX_H */
