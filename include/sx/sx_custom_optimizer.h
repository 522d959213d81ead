/*
 * sx_custom_optimizer.h: Custom optimizers: a trainer's own elementwise update, registered once per
 * process and run by sx on its worker threads (docs/optimizers.md, "Custom optimizers").
 *
 * Part of sx's public C API. Include <sx/sx.h>, which includes every topic header; the
 * conventions stated at the top of sx.h hold for every function here.
 */
#ifndef SX_SX_CUSTOM_OPTIMIZER_H
#define SX_SX_CUSTOM_OPTIMIZER_H

#include "sx_status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Custom optimizers (1.6) ---------------------------------------------------------
 * A trainer brings its own elementwise optimizer: its name, its state slots and its
 * hyperparameters, and an update function that sx calls on its worker threads with one
 * contiguous piece of this rank's shard at a time. sx allocates, shards, steps,
 * checkpoints (by slot name), reshards on load and gathers its state whole exactly as it
 * does a built-in optimizer's. Registration is per process; the id it returns is used
 * where an SX_OPTIM_* value is (sx_param_group_desc_init, sx_param_group_desc_t.optimizer).
 * Every rank registers the same optimizers (name, slots, hyperparameters) before adding
 * the param groups that use them; the ranks' agreement compares them.
 * CPU groups, and CUDA groups that keep their state on the host (sx_group_config_t.offload
 * = SX_OFFLOAD_STATE, 1.7); another CUDA group's param group with a custom optimizer is
 * SX_ERR_UNSUPPORTED. docs/optimizers.md, "Custom optimizers", has the details.
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

#ifdef __cplusplus
}
#endif

#endif /* SX_SX_CUSTOM_OPTIMIZER_H */
