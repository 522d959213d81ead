"""sx's own hyperparameters by name: the SX_HP_* key of each.

Both the group (add_param_group's keywords, set_hyperparameter's keys) and the custom
optimizers (which of a registration's hyperparameters are sx's, and which the optimizer's
own) read this table; it lives here, below both, so that neither imports the other for it.
"""
from . import _lib

HYPERPARAMETERS = {"lr": _lib.SX_HP_LR, "weight_decay": _lib.SX_HP_WEIGHT_DECAY,
                   "beta1": _lib.SX_HP_BETA1, "beta2": _lib.SX_HP_BETA2, "eps": _lib.SX_HP_EPS,
                   "momentum": _lib.SX_HP_MOMENTUM, "dampening": _lib.SX_HP_DAMPENING,
                   "nesterov": _lib.SX_HP_NESTEROV, "maximize": _lib.SX_HP_MAXIMIZE,
                   "amsgrad": _lib.SX_HP_AMSGRAD, "lr_decay": _lib.SX_HP_LR_DECAY,
                   "initial_accumulator_value": _lib.SX_HP_INITIAL_ACCUMULATOR_VALUE,
                   "alpha": _lib.SX_HP_ALPHA, "centered": _lib.SX_HP_CENTERED,
                   "momentum_decay": _lib.SX_HP_MOMENTUM_DECAY,
                   "decoupled_weight_decay": _lib.SX_HP_DECOUPLED_WEIGHT_DECAY,
                   "ns_a": _lib.SX_HP_NS_A, "ns_b": _lib.SX_HP_NS_B, "ns_c": _lib.SX_HP_NS_C,
                   "ns_steps": _lib.SX_HP_NS_STEPS, "adjust_lr": _lib.SX_HP_ADJUST_LR,
                   "beta2_decay": _lib.SX_HP_BETA2_DECAY, "eps2": _lib.SX_HP_EPS2, "d": _lib.SX_HP_D,
                   "beta3": _lib.SX_HP_BETA3, "t_alpha_beta3": _lib.SX_HP_T_ALPHA_BETA3,
                   "state_dtype": _lib.SX_HP_STATE_DTYPE,
                   "bf16_stochastic_round": _lib.SX_HP_BF16_STOCHASTIC_ROUND}
