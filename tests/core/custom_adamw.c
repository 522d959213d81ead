/* torch.optim.AdamW written as a custom optimizer in C, against include/sx/sx.h only:
 * the update sx's own AdamW makes, operation for operation in float32 (built without
 * contraction of a*b + c), so that the two agree bit for bit. The hyperparameters are
 * registered in the order HP_* below; the slots are exp_avg and exp_avg_sq. */
#include "custom_adamw.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>

static atomic_int fail_param = -1;
static atomic_int fail_rank_call = 0;

static atomic_int fail_piece_param = -1;
static _Atomic uint64_t fail_piece_offset = 0;

void custom_adamw_fail_on(int32_t param) { atomic_store(&fail_param, param); }

void custom_adamw_fail_at(int32_t param, uint64_t offset) {
    atomic_store(&fail_piece_offset, offset);
    atomic_store(&fail_piece_param, param);
}

static int32_t adamw_update(const sx_optimizer_piece_t *piece) {
    const double lr = piece->hyperparameters[HP_LR], beta1 = piece->hyperparameters[HP_BETA1],
                 beta2 = piece->hyperparameters[HP_BETA2], eps_d = piece->hyperparameters[HP_EPS],
                 wd = piece->hyperparameters[HP_WEIGHT_DECAY];
    const int maximize = piece->hyperparameters[HP_MAXIMIZE] != 0.0;
    if (piece->num_slots != 2 || piece->num_hyperparameters != HP_COUNT) return 7;
    if (piece->param_index == atomic_load(&fail_param)) {
        atomic_fetch_add(&fail_rank_call, 1);
        snprintf(piece->error, piece->error_size, "param %d told to fail", piece->param_index);
        return 42;
    }
    if (piece->param_index == atomic_load(&fail_piece_param)) {
        const uint64_t at = atomic_load(&fail_piece_offset);
        if (at >= piece->offset && at - piece->offset < piece->n) {
            snprintf(piece->error, piece->error_size, "piece at %llu told to fail", (unsigned long long)piece->offset);
            return 43;
        }
    }
    /* torch: bias corrections in double, step sizes rounded to float once. */
    const double step = (double)piece->step;
    const double bias_correction1 = 1.0 - pow(beta1, step);
    const double bias_correction2 = 1.0 - pow(beta2, step);
    const float neg_step_size = (float)(-(lr / bias_correction1));
    const float bc2_sqrt = (float)pow(bias_correction2, 0.5);
    const float decay = (float)(1.0 - lr * wd);
    const float w = (float)(1.0 - beta1);
    const float b2 = (float)beta2;
    const float one_minus_beta2 = (float)(1.0 - beta2);
    const float eps = (float)eps_d;
    float *m = piece->state[0], *v = piece->state[1];
    for (size_t i = 0; i < piece->n; ++i) {
        float g = piece->grad[i] * piece->grad_scale;
        if (maximize) g = -g;
        float p = piece->param[i];
        if (wd != 0.0) p = p * decay;
        /* exp_avg.lerp_(grad, 1 - beta1) as torch evaluates it */
        m[i] = fabsf(w) < 0.5f ? m[i] + w * (g - m[i]) : g - (g - m[i]) * (1.0f - w);
        v[i] = v[i] * b2 + (one_minus_beta2 * g) * g;
        const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
        piece->param[i] = p + (neg_step_size * m[i]) / denom;
    }
    return 0;
}

static sx_status_t register_as(const char *name, uint32_t flags, int32_t *id) {
    static const char *const slots[] = {"exp_avg", "exp_avg_sq"};
    static const sx_optimizer_hyperparameter_t hypers[HP_COUNT] = {
        {"lr", 1e-3, 0, 0},      {"beta1", 0.9, 0, 0},         {"beta2", 0.999, 0, 0},
        {"eps", 1e-8, 0, 0},     {"weight_decay", 1e-2, 0, 0}, {"maximize", 0, 0, 0},
    };
    sx_optimizer_desc_t d;
    sx_status_t s = sx_optimizer_desc_init(&d, sizeof d);
    if (s != SX_OK) return s;
    d.name = name;
    d.flags = flags;
    d.num_slots = 2;
    d.slot_names = slots;
    d.num_hyperparameters = HP_COUNT;
    d.hyperparameters = hypers;
    d.update = adamw_update;
    return sx_register_optimizer(&d, id);
}

sx_status_t custom_adamw_register(int32_t *id) { return register_as("CAdamW", 0, id); }

sx_status_t custom_adamw_register_in_place(int32_t *id) {
    return register_as("CAdamWInPlace", SX_OPTIMIZER_IN_PLACE, id);
}
