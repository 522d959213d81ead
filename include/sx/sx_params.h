/*
 * sx_params.h: Params and units: dtypes, optimizer ids and hyperparameter keys, param groups,
 * params, trainability and units as a pipeline. A new built-in optimizer is added here
 * (its SX_OPTIM_* id, its SX_HP_* keys, its defaults in sx_param_group_desc_init's
 * comment); the bindings' constants are checked against these headers.
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_PARAMS_H
#define SX_SX_PARAMS_H

#include "sx_group.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (sx_param_desc_t.dtype: F32, F16 or BF16). */
#define SX_DTYPE_F32 1
#define SX_DTYPE_F16 2
#define SX_DTYPE_BF16 3
/* Unsigned bytes: the codes of 8-bit optimizer state as sx_state_view shows them (not
 * a param's dtype). (1.7) */
#define SX_DTYPE_U8 4

/* Built-in optimizers (sx_param_group_desc_t.optimizer, sx_param_group_desc_init). */
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
 * its update, which sx sums over every rank's piece. CPU groups, and CUDA groups with
 * offload = SX_OFFLOAD_STATE (1.7). */
#define SX_OPTIM_LAMB 10
/* Muon, as torch.optim.Muon: momentum, then each 2-D param's whole matrix orthogonalised
 * by Newton-Schulz iterations (in bf16 arithmetic, as torch's) on one rank, which returns
 * each rank its piece of the update. 2-D params only (sx_finalize refuses others: give
 * them a param group of another optimizer, AdamW as usual). CPU groups, and CUDA groups with
 * offload = SX_OFFLOAD_STATE (1.7). */
#define SX_OPTIM_MUON 11
/* Adafactor, as torch.optim.Adafactor: a param of two or more dimensions keeps the means
 * of its squared gradient over its rows and over its columns (factored second moments,
 * far less state than Adam's), a 0-D or 1-D one a second moment per element; each
 * update is scaled by the param's RMS and clipped by its own RMS, sums that sx takes
 * over every rank's piece. CPU groups, and CUDA groups with
 * offload = SX_OFFLOAD_STATE (1.7). */
#define SX_OPTIM_ADAFACTOR 12
/* AdEMAMix (Pagliardini et al. 2024), as the pytorch-optimizer package's AdEMAMix
 * (4.1.0): Adam's fast moment plus alpha times a slow one (beta3), with its optional
 * warmup of alpha and beta3 over t_alpha_beta3 steps; three state slots. */
#define SX_OPTIM_ADEMAMIX 13

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
#define SX_HP_BETA3 25         /* AdEMAMix: the slow moment's decay, in [0, 1) */
#define SX_HP_T_ALPHA_BETA3 26 /* AdEMAMix: steps alpha and beta3 warm up over; 0: none */
#define SX_HP_STATE_DTYPE 27   /* SX_STATE_*; may only change before sx_finalize lays its group out */
#define SX_HP_BF16_STOCHASTIC_ROUND 28 /* 0 or 1; may only change before sx_finalize lays its group out */

/* How a param group keeps its optimizer state slots (sx_param_group_desc_t::state_dtype).
 * Every update is computed in fp32 whatever the slots hold. SX_STATE_BF16 and
 * SX_STATE_8BIT apply to the elementwise optimizers (SGD, Adam, AdamW, Adagrad, RMSprop,
 * Adamax, NAdam, RAdam, Lion, AdEMAMix); LAMB's, Muon's, Adafactor's and custom
 * optimizers' slots stay fp32. They run on CPU groups, on CUDA groups with
 * SX_OFFLOAD_STATE (in host memory, with the CPU kernels) and on CUDA groups that keep
 * their state on the device (with its kernels), with the same bits everywhere.
 * docs/optimizers.md says more. */
#define SX_STATE_FP32 0 /* fp32 slots (the default) */
#define SX_STATE_BF16 1 /* bf16 slots, rounded to nearest even after each update */
#define SX_STATE_8BIT 2 /* 8-bit block-wise slots: torchao's AdamW8bit (0.18) quantization:
                         * blocks of 256 elements of a param, each a scale (its absmax)
                         * and 256 codes of its dynamic map, signed for moments that can
                         * be negative; a param of fewer than 4096 elements, or not a
                         * multiple of 256, keeps fp32 slots as torchao's does. Adam and
                         * AdamW then compute as torchao's AdamW8bit does. */

/* Muon's adjust_lr_fn: the lr a param of shape [A, B] is updated with. */
#define SX_MUON_ADJUST_LR_ORIGINAL 0             /* lr * sqrt(max(1, A / B)) (torch's None or "original") */
#define SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW 1      /* lr * 0.2 * sqrt(max(A, B)) */
#define SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED 2   /* lr * sqrt(A / B) */

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
    /* Appended in 1.6: Muon's (defaults 3.4445, -4.7750, 2.0315; 5; ORIGINAL). */
    double ns_a, ns_b, ns_c;        /* Muon: Newton-Schulz coefficients */
    int32_t ns_steps;               /* Muon: Newton-Schulz iterations, 1 to 99 */
    int32_t adjust_lr;              /* Muon: SX_MUON_ADJUST_LR_* */
    /* Appended in 1.6: Adafactor's (defaults -0.8, 1e-3, 1.0); its eps1 is eps. */
    double beta2_decay, eps2, d;
    /* Appended in 1.6: AdEMAMix's (defaults 0.9999 and 0: no warmup); its alpha is alpha. */
    double beta3, t_alpha_beta3;
    /* Appended in 1.7: SX_STATE_* (0 = SX_STATE_FP32). */
    int32_t state_dtype;
    /* Appended in 1.7: 0 or 1 (torchao's bf16_stochastic_round). 1: the group's params,
     * every one SX_DTYPE_BF16, keep no fp32 master weights; each update is computed in
     * fp32 from the bf16 param and written back rounded stochastically (16 random bits
     * added below the bf16's last bit, then truncated; NaN stays NaN), the bits drawn
     * from a hash of (param index, the param's step count, element index), so that a run
     * gives the same bits at any world size and stage, on CPU and CUDA groups alike (a
     * CUDA group's device kernel or, offloaded, the host's update of the params' shard
     * copied to the host give the CPU's bits). Elementwise optimizers (those that take
     * state_dtype); a unit may not mix params of groups with and without it. Checkpoints store its params widened to fp32 (exact), and a load
     * rounds a checkpoint's values to nearest into them; the group keeps its own setting
     * across a load. The whole-state calls carry the params as "master" likewise (widened
     * by a gather, rounded to nearest even by a scatter); a state view of "master" is the
     * bf16 params in place (SX_DTYPE_BF16; offloaded, their shard's copy on the host, which
     * the step updates and copies to the device); memory copies hold the bf16 params, and
     * sx_regroup restores them exactly. docs/optimizers.md. */
    int32_t bf16_stochastic_round;
} sx_param_group_desc_t;

/* Fills *desc with the defaults of `optimizer` (SX_OPTIM_*; 0 = AdamW), torch.optim's
 * (lion-pytorch's for Lion): SGD lr 1e-3; Adam, RAdam lr 1e-3, betas (0.9, 0.999),
 * eps 1e-8; AdamW the same with weight_decay 1e-2; Adagrad lr 1e-2, eps 1e-10; RMSprop
 * lr 1e-2, alpha 0.99, eps 1e-8; Adamax lr 2e-3, betas (0.9, 0.999), eps 1e-8; NAdam
 * the same with momentum_decay 4e-3; Lion lr 1e-4, betas (0.9, 0.99); LAMB lr 1e-3,
 * betas (0.9, 0.999), eps 1e-6, decoupled_weight_decay 1 (pytorch-optimizer's Lamb);
 * Muon lr 1e-3, weight_decay 0.1, momentum 0.95, nesterov 1, eps 1e-7; Adafactor lr
 * 1e-2, eps 2^-23 (torch's eps1 of None: fp32's machine epsilon); ns_a, ns_b, ns_c
 * 3.4445, -4.7750, 2.0315 and ns_steps 5, beta2_decay -0.8, eps2 1e-3 and d 1, beta3
 * 0.9999 for every optimizer (Muon's, Adafactor's and AdEMAMix's); AdEMAMix lr 1e-3,
 * betas (0.9, 0.999, 0.9999), alpha 5, eps 1e-8, t_alpha_beta3 0 (no warmup)
 * (pytorch-optimizer's); every other value 0. Because zero is a meaningful value for several hyperparameters, the defaults come
 * from this function (and, for an older caller's shorter struct, from the optimizer's
 * defaults), not from zero. Which hyperparameters apply to which optimizer, and the
 * range each must lie in, are in docs/optimizers.md; a value set for a hyperparameter
 * that does not apply (other than its default) is SX_ERR_INVALID_ARGUMENT. */
SX_API sx_status_t sx_param_group_desc_init(sx_param_group_desc_t *desc, size_t size,
                                            int32_t optimizer);


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
/* The steps param group `param_group` took since it was added, whether or not its params
 * were updated (LAMB's and AdEMAMix's bias corrections count them: pytorch-optimizer's
 * group['step']); a skipped step does not count. Restored by sx_load_optim_state; set by
 * sx_scatter_optim_state, for an optimizer that counts steps per group, to the most steps
 * any of the group's params was given. Errors: a param group index out of range
 * (SX_ERR_INVALID_ARGUMENT), steps NULL. (1.6) */
SX_API sx_status_t sx_get_param_group_steps(const sx_shard_group_t *group, int32_t param_group, int64_t *steps);

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
    /* Placement (1.7; docs/model-parallel.md): where the param sits in a model the
     * trainer splits itself across model-parallel slices (tensor-parallel ranks, pipeline
     * stages), each slice a group of its own. SX_PLACEMENT_* (0 = SX_PLACEMENT_WHOLE: the
     * param is the whole logical tensor, as before). The fields below are those of the
     * placement named; the others must be 0 (NULL). */
    int32_t placement;
    /* SX_PLACEMENT_SPLIT: the dimension the logical tensor is split on, 0..ndim-1. */
    int32_t split_dim;
    /* SX_PLACEMENT_SPLIT: the logical tensor's ndim extents (copied): those of `shape`
     * but on split_dim, where it is at least shape[split_dim]. */
    const int64_t *global_shape;
    /* SX_PLACEMENT_SPLIT: this piece's first index on split_dim; the piece
     * [split_offset, split_offset + shape[split_dim]) lies within global_shape[split_dim]. */
    int64_t split_offset;
    /* SX_PLACEMENT_REPLICATED: this copy's index among the `replicas` identical copies
     * (0..replicas-1), and their number (>= 1). In a norm domain (sx_step.h) copy 0
     * alone adds the param's gradient to the norm, so that it counts once. */
    int32_t replica;
    int32_t replicas;
} sx_param_desc_t;

/* sx_param_desc_t.placement (1.7). */
#define SX_PLACEMENT_WHOLE 0      /* the whole logical tensor (the default) */
#define SX_PLACEMENT_REPLICATED 1 /* one of `replicas` identical copies (a layer norm on every tensor-parallel rank) */
#define SX_PLACEMENT_SPLIT 2      /* a piece of a larger logical tensor (Megatron's column- or row-parallel weight) */

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

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_PARAMS_H */
