/* torch.optim.AdamW as a custom optimizer written in C (custom_adamw.c). */
#ifndef SX_TESTS_CUSTOM_ADAMW_H
#define SX_TESTS_CUSTOM_ADAMW_H

#include "sx/sx.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Its hyperparameters, in registration order (all sx's own). */
enum { HP_LR, HP_BETA1, HP_BETA2, HP_EPS, HP_WEIGHT_DECAY, HP_MAXIMIZE, HP_COUNT };

/* Registers it as "CAdamW" (again: the same id). */
sx_status_t custom_adamw_register(int32_t *id);

/* The same update registered SX_OPTIMIZER_IN_PLACE, as "CAdamWInPlace". */
sx_status_t custom_adamw_register_in_place(int32_t *id);

/* From now on its update fails (returns 42) for param `param` (-1: never). */
void custom_adamw_fail_on(int32_t param);

/* From now on its update fails (returns 43) for the piece of param `param` that holds
 * element `offset` of it, and only that piece (param -1: never). */
void custom_adamw_fail_at(int32_t param, uint64_t offset);

#ifdef __cplusplus
}
#endif

#endif
