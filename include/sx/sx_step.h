/*
 * sx_step.h: The step: accumulating micro-batches, stepping, mixed precision and loss
 * scaling.
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_STEP_H
#define SX_SX_STEP_H

#include "sx_group.h"

#ifdef __cplusplus
extern "C" {
#endif

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
 * Norm domains (1.7; docs/model-parallel.md)
 *
 * A trainer that splits its model itself (tensor-parallel ranks, pipeline stages) runs one
 * group per model-parallel slice: the data-parallel ranks of that slice. Each group's
 * gradient norm would then be its slice's alone. A norm domain joins the groups of every
 * slice so that sx_step's gradient norm (clipping and result->grad_norm), its non-finite
 * check and the loss scale's skip and backoff are decided over all of them: every rank
 * of every group gets the same bits, and skips the same steps.
 *
 * Every process of the domain (all slices' ranks: TP x PP x DP of them) makes the domain,
 * collectively, as it makes a group: from an sx_group_config_t whose rendezvous, rank,
 * world_size, timeout_ms, transport (or context and name) say how the domain's ranks meet
 * (only the fields that say how ranks meet are read; a context must hold all of them).
 * Then each joins its group (sx_join_norm_domain, collective over the domain) with the
 * index of its slice. From then on each sx_step of the group sums its shard's squares
 * (a param declared SX_PLACEMENT_REPLICATED counts on its copy 0 only, so a replicated
 * param counts once) and makes one exchange over the domain (an all-gather of a few
 * values per rank, in place of the group's own sum): the sum is taken in domain rank
 * order on every rank. The norm is then always taken before the update (as
 * SX_NONFINITE_SKIP does; without clipping, loss scaling or a non-finite policy a
 * non-finite norm is still reported and not acted upon).
 *
 * Every group of the domain calls sx_step the same number of times, with the same
 * max_grad_norm, nonfinite policy and loss scaling (mode and current scale); the exchange
 * compares them and on a difference every rank of the domain skips the step (nothing
 * changes, the gradients are dropped) and returns SX_ERR_MISMATCH naming the value and
 * the ranks. A step that fails in one group before the exchange (a mismatch inside the
 * group, a refused option) leaves the other groups waiting in it until the domain's
 * timeout. options->weighted is refused (SX_ERR_UNSUPPORTED) in a domain. Why a domain
 * and not a step that takes an outside sum: see docs/model-parallel.md.
 * ------------------------------------------------------------------------------- */

typedef struct sx_norm_domain sx_norm_domain_t;

/* Creates this rank's handle of a norm domain over config's ranks and connects them.
 * Collective over the domain's ranks: blocks until every rank has joined or
 * config->timeout_ms passes. config is borrowed for the call. On success *out owns the
 * handle; on failure *out is set to NULL. Errors as sx_create_shard_group's. */
SX_API sx_status_t sx_create_norm_domain(const sx_group_config_t *config, sx_norm_domain_t **out);

/* Releases the caller's handle; the domain lives on while a group joined to it does.
 * Accepts NULL. Not collective. In a forked child the inherited handle is inert. */
SX_API sx_status_t sx_destroy_norm_domain(sx_norm_domain_t *domain);

/* Collective over the domain (every rank of it, each with its own group): joins `group`
 * to `domain` as a part of model-parallel slice `slice` (0, 1, ...). Between steps (no
 * micro-batch accumulated). The ranks check together that every slice 0..S-1 is joined
 * by exactly its group's world size of ranks, each with a distinct rank in its group;
 * else every rank returns SX_ERR_MISMATCH naming what differs and nothing is joined.
 * Errors (on every rank, nothing joined): a group already in a domain, a domain that
 * already has a group on this rank, slice < 0 (SX_ERR_INVALID_ARGUMENT or
 * SX_ERR_INVALID_STATE, naming the rank). The group holds the domain until it is
 * destroyed. One thread uses the group and the domain at a time. */
SX_API sx_status_t sx_join_norm_domain(sx_shard_group_t *group, sx_norm_domain_t *domain, int32_t slice);

/* ---------------------------------------------------------------------------------
 * Mixed precision
 *
 * A param registered with dtype SX_DTYPE_BF16 or SX_DTYPE_F16 has a 16-bit param view
 * (the trainer's compute copy) and, on the rank whose shard covers it, fp32 master
 * weights (none for a param group with bf16_stochastic_round, sx_params.h: its bf16
 * params are updated in fp32 and rounded back stochastically); its optimizer state is
 * fp32 unless its group's state_dtype says otherwise. All params of one unit share a dtype. The step
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

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_STEP_H */
