"""torch's optimizer classes as sx's optimizers: the kind sx runs for a class (its own
fused kernels, or the class itself on each rank's shard through an sx custom optimizer),
and a torch param group's options as sx's hyperparameters."""
import itertools
import threading
import weakref

import numpy as np
import torch

from .. import _lib
from ..errors import InvalidArgumentError, UnsupportedError
from ..optimizers import register_optimizer

# torch's optimizer classes sx runs with its own fused kernels, by the name sx gives them
# (lion-pytorch's Lion where it is installed).
_KINDS = {torch.optim.SGD: "sgd", torch.optim.Adam: "adam", torch.optim.AdamW: "adamw",
          torch.optim.Adagrad: "adagrad", torch.optim.RMSprop: "rmsprop", torch.optim.Adamax: "adamax",
          torch.optim.NAdam: "nadam", torch.optim.RAdam: "radam"}
if hasattr(torch.optim, "Muon"):  # each matrix orthogonalised whole on one rank
    _KINDS[torch.optim.Muon] = "muon"
if hasattr(torch.optim, "Adafactor"):  # its factored moments' sums taken over every rank's piece
    _KINDS[torch.optim.Adafactor] = "adafactor"
try:
    from lion_pytorch import Lion as _Lion
    _KINDS[_Lion] = "lion"
except ImportError:
    _Lion = None
# pytorch-optimizer's Lamb and AdEMAMix, where it is installed: run on pieces of a shard,
# as other classes are, each piece would take its own trust ratio (a norm over the whole
# param) and its own step count (theirs is the param group's).
try:
    from pytorch_optimizer import AdEMAMix as _AdEMAMix, Lamb as _Lamb
    _KINDS[_Lamb], _KINDS[_AdEMAMix] = "lamb", "ademamix"
except ImportError:
    _Lamb = _AdEMAMix = None
# torchao's 8-bit Adam and AdamW, where it is installed: sx's Adam and AdamW with their
# state in torchao's 8-bit blocks (state_dtype "8bit"), computed as torchao computes them.
_STATE_DTYPE_OF = {}
try:
    from torchao.optim import Adam8bit as _Adam8bit, AdamW8bit as _AdamW8bit
    _KINDS[_Adam8bit], _KINDS[_AdamW8bit] = "adam", "adamw"
    _STATE_DTYPE_OF[_Adam8bit] = _STATE_DTYPE_OF[_AdamW8bit] = "8bit"
except ImportError:
    pass
# torchao's options that sx follows at one value. (bf16_stochastic_round passes through:
# the param group's, whose params must then be bf16, kept without fp32 masters.)
_TORCHAO_FIXED = {"block_size": (256, "sx's 8-bit blocks are torchao's default, 256 elements")}
# Each kind's param group keys besides lr, weight_decay and maximize, as torch names them
# ("betas" is sx's beta1 and beta2; Adafactor's "eps" its eps and eps2).
_KEYS = {"sgd": ("momentum", "dampening", "nesterov"), "adam": ("betas", "eps", "amsgrad"),
         "adamw": ("betas", "eps", "amsgrad"), "adagrad": ("lr_decay", "eps", "initial_accumulator_value"),
         "rmsprop": ("alpha", "eps", "momentum", "centered"), "adamax": ("betas", "eps"),
         "nadam": ("betas", "eps", "momentum_decay", "decoupled_weight_decay"),
         "radam": ("betas", "eps", "decoupled_weight_decay"), "lion": ("betas",),
         "muon": ("momentum", "nesterov", "eps", "ns_coefficients", "ns_steps", "adjust_lr_fn"),
         "adafactor": ("beta2_decay", "eps", "d"), "lamb": ("betas", "eps", "weight_decouple"),
         "ademamix": ("betas", "eps", "alpha", "t_alpha_beta3", "weight_decouple")}
_FLAGS = ("nesterov", "amsgrad", "centered", "decoupled_weight_decay", "maximize", "weight_decouple")
# Keys a class names otherwise than sx (pytorch-optimizer's decoupled weight decay).
_SX_NAMES = {"weight_decouple": "decoupled_weight_decay"}
# Kinds that count steps per param group, not per param (pytorch-optimizer's: the group's
# "step" is their bias corrections' t, and AdEMAMix's warmup's).
_GROUP_STEP = ("lamb", "ademamix")
# The class's constructor arguments it keeps as attributes, not in its param groups
# (ShardedOptimizer's groups hold them, as every constructor argument; its state dicts
# leave them out, as the class's do).
_CONSTRUCTOR_ONLY = {"lamb": ("maximize", "pre_norm", "degenerated_to_sgd", "n_sma_threshold"),
                     "ademamix": ("maximize",)}
# Options of pytorch-optimizer's classes that sx follows at one value (docs/optimizers.md):
# a constructor or a param group that sets another is refused, with what to do instead.
# Lamb's adam_debias and adanorm and AdEMAMix's cautious and stable_adamw come through the
# classes' **kwargs into their param groups.
_FIXED = {
    "lamb": {"grad_averaging": (True, "sx's LAMB weighs each gradient by 1 - beta1 in exp_avg; leave it True"),
             "fixed_decay": (False, "for a weight decay that does not scale with the lr, pass weight_decay / lr "
                                    "(the same while the lr stays the constructor's)"),
             "rectify": (False, "sx's LAMB has no RAdam rectification; leave it False"),
             "adam": (False, "sx's LAMB scales every update by its trust ratio; leave it False"),
             "adam_debias": (False, "sx's LAMB divides the step size by 1 - beta1^t; leave it False"),
             "adanorm": (False, "sx's LAMB has no AdaNorm; leave it False"),
             "pre_norm": (False, "clip the gradients with ShardedOptimizer's max_grad_norm instead")},
    "ademamix": {"fixed_decay": (False, "for a weight decay that does not scale with the lr, pass weight_decay / lr "
                                        "with weight_decouple=True (the same while the lr stays the constructor's)"),
                 "cautious": (False, "sx's AdEMAMix has no cautious masking; leave it False"),
                 "stable_adamw": (False, "sx's AdEMAMix has no StableAdamW scaling; leave it False")}}
_CLASS_NAMES = {"lamb": "Lamb", "ademamix": "AdEMAMix"}
# torch classes that need a whole param at once in a way sx does not run (Muon and
# Adafactor it does).
_WHOLE_PARAM = tuple(getattr(torch.optim, n) for n in ("LBFGS", "SparseAdam")
                     if hasattr(torch.optim, n))
# Group keys torch keeps that change nothing in sx (kernels and execution choices).
_IGNORED = ("foreach", "capturable", "differentiable", "fused", "param_names", "initial_lr")
# Muon's adjust_lr_fn as sx's adjust_lr (SX_MUON_ADJUST_LR_*).
_ADJUST_LR_FN = {None: 0, "original": 0, "match_rms_adamw": 1, "spectral_unclamped": 2}
# Adafactor's eps1 where torch's is None: torch takes the param dtype's machine epsilon,
# sx fp32's (its masters are fp32).
_ADAFACTOR_EPS1 = 2.0 ** -23


def _check_torchao(options):
    """Refuses an option of torchao's 8-bit classes that sx does not follow at the value given."""
    for key, (fixed, instead) in _TORCHAO_FIXED.items():
        if key in options and options[key] != fixed:
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED, f"{key}={options[key]!r}: sx runs torchao's 8-bit "
                                   f"optimizers with {key}={fixed!r} only; {instead}")


def _state_dtype(optimizer_class, state_dtype):
    """The state dtype sx keeps a class's state in: the class's own (torchao's 8-bit classes'
    "8bit"), or `state_dtype` ("fp32", "bf16" or "8bit"; None: the class's)."""
    own = _STATE_DTYPE_OF.get(optimizer_class)
    if state_dtype is None:
        return own or "fp32"
    if state_dtype not in ("fp32", "bf16", "8bit"):
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"state_dtype {state_dtype!r}: it is \"fp32\", \"bf16\" or \"8bit\"")
    if own is not None and state_dtype != own:
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"state_dtype {state_dtype!r}: "
                                   f"{optimizer_class.__name__} keeps its state in {own}")
    return state_dtype


def _check_fixed(kind, options):
    """Refuses an option (a constructor's or a param group's) that sx's optimizer does not
    follow at the value given."""
    for key, (fixed, instead) in _FIXED.get(kind, {}).items():
        if key in options and bool(options[key]) != fixed:
            name = _CLASS_NAMES[kind]
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                   f"{name}'s {key}={options[key]!r}: sx runs {name} with {key}={fixed} only; "
                                   f"{instead}")


def _hyper(kind, group):
    """sx's hyperparameters of a torch param group (every key sx's optimizer takes; a
    key the group lacks, as lion-pytorch's lacks maximize, keeps sx's default)."""
    _check_fixed(kind, group)
    h = {"lr": float(group["lr"]), "weight_decay": float(group.get("weight_decay", 0.0)),
         "maximize": bool(group.get("maximize", False))}
    for key in _KEYS[kind]:
        if key == "betas" and kind == "ademamix":  # its (beta1, beta2, beta3)
            h["beta1"], h["beta2"], h["beta3"] = (float(b) for b in group["betas"])
        elif key == "betas":
            if "betas" in group:
                h["beta1"], h["beta2"] = (float(b) for b in group["betas"])
        elif key == "t_alpha_beta3":  # None: no warmup, sx's 0
            h[key] = 0.0 if group[key] is None else float(group[key])
        elif key == "ns_coefficients":
            h["ns_a"], h["ns_b"], h["ns_c"] = (float(c) for c in group[key])
        elif key == "ns_steps":
            h[key] = int(group[key])
        elif key == "adjust_lr_fn":
            h["adjust_lr"] = _ADJUST_LR_FN[group.get(key)]
        elif key == "eps" and kind == "adafactor":  # torch's (eps1, eps2)
            eps1, eps2 = group[key]
            h["eps"], h["eps2"] = _ADAFACTOR_EPS1 if eps1 is None else float(eps1), float(eps2)
        elif key in group:
            h[_SX_NAMES.get(key, key)] = bool(group[key]) if key in _FLAGS else float(group[key])
    return h


def _supported():
    def where(c):
        return "torch.optim" if c.__module__.startswith("torch.optim") else c.__module__.split(".", 1)[0]
    return ", ".join(f"{where(c)}.{c.__name__}" for c in _KINDS)


# Other elementwise classes run themselves on pieces of each rank's shard, through an sx
# custom optimizer per class (its slots: the class's per-element state, found by one step
# of it on a small tensor). Every ShardedOptimizer of such a class has a number, which its
# param groups hold as the optimizer's own hyperparameter "sx_torch_instance", so that
# the update finds the torch param group whose options (rho, etas, ...) it runs with.
_INSTANCE_KEY = "sx_torch_instance"
_instances = weakref.WeakValueDictionary()
_instance_counter = itertools.count(1)
_class_slots = {}  # class -> its slot names


def _registered_name(optimizer_class):
    """'torch.optim.adadelta.Adadelta': the custom optimizer's name (1-63 of [A-Za-z0-9_.-])."""
    name = f"{optimizer_class.__module__}.{optimizer_class.__qualname__}"
    name = "".join(c if c.isalnum() or c in "_.-" else "_" for c in name)
    return name[-63:]


def _run_torch_class(piece):
    """A piece updated by the torch class itself: a tensor over the piece's params with
    its gradient, the piece's slots as the class's state (the class creates them at a
    param's first update), one step of a fresh instance with the group's options."""
    opt = _instances[int(piece.hyperparameters[_INSTANCE_KEY])]
    group = opt.param_groups[piece.param_group]
    p = torch.from_numpy(piece.param)
    p.grad = torch.from_numpy(piece.grad * np.float32(piece.grad_scale))
    # One instance of the class per worker thread and optimizer, given each piece in turn
    # with the group's current options (constructing one per piece cost most of the time).
    # (Kept by the optimizer, by thread id: sx's threads are not Python's, and a
    # threading.local of theirs lasts one call.)
    runner = opt._runners.get(threading.get_ident())
    if runner is None:
        runner = opt._runners[threading.get_ident()] = opt.optimizer_class(
            [p], **{k: group[k] for k in opt._class_args if k in group})
    runner.state.clear()
    runner_group = runner.param_groups[0]
    runner_group.update({k: group[k] for k in opt._class_args if k in group})
    runner_group["params"] = [p]
    slots = _class_slots[opt.optimizer_class]
    if piece.step > 1:
        state = {"step": torch.tensor(float(piece.step - 1), dtype=torch.float32)}
        for name, values in zip(slots, piece.state):
            state[name] = torch.from_numpy(values)
        runner.state[p] = state
    with torch.no_grad():
        runner.step()
    state = runner.state[p]
    for name, values in zip(slots, piece.state):
        t = state[name]
        if t.data_ptr() != values.ctypes.data:  # created by the class, or rebound
            values[...] = t.detach().reshape(-1).numpy()


def _torch_class_kind(optimizer_class, defaults):
    """The custom optimizer that runs `optimizer_class` on shards (registered once per
    class), after checking that the class's state is per element."""
    p = torch.zeros(4, requires_grad=True)
    p.grad = torch.ones(4)
    probe_args = {k: v for k, v in defaults.items() if k not in ("foreach", "fused")}
    probe = optimizer_class([p], **probe_args)
    with torch.no_grad():
        probe.step()
    slots, others = [], []
    for key, value in probe.state[p].items():
        if key == "step":
            continue
        (slots if isinstance(value, torch.Tensor) and value.shape == p.shape else others).append(key)
    if others or len(slots) > _lib.SX_MAX_CUSTOM_SLOTS:
        raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                               f"optimizer_class {optimizer_class.__name__} keeps per-param state sx cannot shard "
                               f"by elements ({', '.join(others) or f'{len(slots)} tensors'}); the classes sx "
                               f"runs itself: {_supported()}")
    hyperparameters = [("lr", float(defaults.get("lr", 1e-3)))]
    for key in ("weight_decay", "maximize"):
        if key in defaults:
            hyperparameters.append((key, float(defaults[key])))
    hyperparameters.append((_INSTANCE_KEY, 0.0, 0.0, float(2 ** 31)))
    kind = register_optimizer(_registered_name(optimizer_class), slots, _run_torch_class,
                              hyperparameters=hyperparameters)
    _class_slots[optimizer_class] = tuple(slots)
    _KEYS[kind] = ()
    return kind


def _kind_of(optimizer_class, defaults):
    if optimizer_class in _WHOLE_PARAM:
        raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                               f"optimizer_class {optimizer_class.__name__} needs each param whole (a line "
                               "search, or sparse gradients) in a way sx does not run yet; the classes it runs: "
                               f"{_supported()}, and other torch.optim.Optimizer classes whose state is per "
                               "element")
    if optimizer_class not in _KINDS:
        if isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer):
            return _torch_class_kind(optimizer_class, defaults)
        raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                               f"optimizer_class {getattr(optimizer_class, '__name__', optimizer_class)} is not a "
                               f"torch.optim.Optimizer class (sx runs {_supported()} itself, and runs any other "
                               "elementwise Optimizer class on each rank's shard)")
    kind = _KINDS[optimizer_class]
    if optimizer_class in _STATE_DTYPE_OF:
        _check_torchao(defaults)
    if kind == "adam" and defaults.get("decoupled_weight_decay"):
        kind = "adamw"  # torch's Adam with decoupled weight decay is AdamW
    if kind == "lion" and defaults.get("decoupled_weight_decay"):
        raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                               "Lion's decoupled_weight_decay=True divides weight_decay by the constructor's lr; "
                               "pass weight_decay / lr and decoupled_weight_decay=False")
    _check_fixed(kind, defaults)
    return kind


def _kwargs_options(optimizer_class):
    """The options of `optimizer_class` that sx checks (_FIXED), which a class may take
    through its **kwargs rather than by name."""
    return tuple(_FIXED.get(_KINDS.get(optimizer_class), ()))


def _fixed_keys(optimizer_class, kind):
    """Param group keys sx checks rather than takes (_FIXED's, torchao's)."""
    return tuple(_FIXED.get(kind, ())) + (tuple(_TORCHAO_FIXED) if optimizer_class in _STATE_DTYPE_OF else ())
