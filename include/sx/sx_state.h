/*
 * sx_state.h: State and views: zero-copy views into the flat buffers, the whole optimizer
 * state gathered or scattered, and queries of a group.
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_STATE_H
#define SX_SX_STATE_H

#include "sx_cuda.h"
#include "sx_params.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * Whole optimizer state
 *
 * ZeroRedundancyOptimizer's consolidate_state_dict and load_state_dict, without a
 * checkpoint directory: the whole, unsharded, unpadded optimizer state of every param
 * gathered onto one rank, param by param, or scattered from one rank into every rank's
 * shard, at any world size and stage. A param's state tensors carry torch's names:
 * "exp_avg", "exp_avg_sq" and (amsgrad) "max_exp_avg_sq" for Adam and AdamW,
 * "momentum_buffer" for SGD with momentum, "variance" (0-D and 1-D params) or "row_var"
 * and "col_var" (others) for Adafactor, each optimizer's as docs/optimizers.md lists
 * them, and "master" (the fp32 master weights) for 16-bit params. Hyperparameters are
 * read and set as always (sx_get_hyperparameter, sx_set_hyperparameter).
 *
 * Packed state (sx_param_group_desc_t.state_dtype SX_STATE_BF16 or SX_STATE_8BIT) travels
 * as fp32 too (1.7). A gather gives bf16 slots widened to fp32 (exact) and 8-bit slots
 * decoded as the step decodes them: each code's map value times its block's scale. A
 * scatter stores the fp32 values in the group's state dtype as the step stores its
 * results: bf16 rounded to nearest even, 8-bit quantized block by block (each block of
 * 256 elements of the param takes its largest magnitude as its scale, and each element
 * the nearest code of the map: torchao's AdamW8bit quantization), but that a block of
 * values a decoding gave (every value a map entry times one scale) takes back the codes
 * and scale it was decoded from. A param that keeps fp32 slots in an 8-bit group (fewer
 * than 4096 elements, or not a whole number of blocks) carries them unchanged. So
 * scattering what a gather gave stores the same bytes again (codes, scales, bf16
 * values), at any world size and stage, and so does scattering torchao's dequantized
 * state.
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
    /* Appended in 1.6. NAdam: torch's state["mu_product"], the product of the param's
     * momentum coefficients (a float32 value, in (0, 1]); 0 for other optimizers. A
     * scatter's callback may leave it 0 (as sx presets it): sx then derives it from step
     * with the group's beta1 and momentum_decay, which is torch's value unless those
     * changed during training. */
    double mu_product;
    /* Appended in 1.6: each tensor's element count, num_tensors of them (owned by sx).
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
 * every rank, rounded to nearest even (bf16 params of a group with bf16_stochastic_round,
 * which have no masters, take "master" so: what a gather gave, the params widened,
 * comes back exactly). Nothing changes unless every rank and every call of fn succeeded: each rank
 * receives into a copy of its shard's state, which replaces the shard at the end (so a
 * rank holds its optimizer state twice meanwhile). Views from sx_state_view are invalid
 * afterwards. fn may be NULL on the ranks that are not root (NULL on the root fails the
 * call on every rank, with SX_ERR_INVALID_ARGUMENT). */
SX_API sx_status_t sx_scatter_optim_state(sx_shard_group_t *group, int32_t root, sx_param_state_fn fn,
                                          void *user);

/* This rank's own part of one of a param's optimizer-state tensors (`tensor`, a name as
 * above, borrowed), in place: zero copy, out->numel elements, which are the param's
 * elements [shard_begin, shard_end) of sx_param_info_t (numel 0 and data NULL where this
 * rank's shard holds none of it). out->dtype says what they hold (1.7): SX_DTYPE_F32 for
 * fp32 state and "master" (SX_DTYPE_BF16 for a param of a group with
 * bf16_stochastic_round, which keeps no fp32 masters: "master" is its bf16 params, in
 * place, or offloaded, their copy on the host that the step updates); a bf16 slot's SX_DTYPE_BF16 values; an 8-bit slot's codes,
 * SX_DTYPE_U8 (one byte per element: an index into torchao's map, signed for exp_avg and
 * the like, unsigned for slots never negative such as exp_avg_sq). An 8-bit slot's block
 * scales are the tensor "<slot>.scale" (e.g. "exp_avg.scale", torchao's name), fp32, one
 * per 256 elements of the rank's part in order (element i's value is map[code i] *
 * scale[i / 256]; every rank's part starts on a block boundary). A param that keeps fp32
 * slots in an 8-bit group has fp32 views and no ".scale". Writing packed views seeds the
 * state as written: codes and scales are not checked. An embedding service may read it, or write it between
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
    /* Of the bytes above (but staging and memory copies, always host memory), those in a
     * CUDA device's memory: all of the buffers of a CUDA group but for the masters,
     * optimizer state and reduced gradient shards that SX_OFFLOAD_STATE keeps on the host;
     * 0 for a CPU group. (1.7) */
    uint64_t device_bytes;
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

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_STATE_H */
