"""sx for PyTorch: a sharded optimizer for an existing ``torch.nn.Module``.

``ShardedOptimizer`` is a ``torch.optim.Optimizer`` whose params live in sx's flat
buffers: each ``param.data`` and ``param.grad`` becomes a zero-copy torch view of sx's
memory, so the model's forward and backward read and write sx's buffers directly. A
step averages the gradients over the ranks, clips them, updates this rank's shard of
the optimizer state (ZeRO stage 1 or 2) and gathers the params, as
``DistributedDataParallel`` with ``ZeroRedundancyOptimizer`` do together; the model
itself is not wrapped. Launch it under ``torchrun`` (the default rendezvous "env://"
joins torchrun's store)::

    import torch, sx.torch
    model = Net()
    opt = sx.torch.ShardedOptimizer(model, torch.optim.AdamW, lr=1e-3, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, 10, 0.5)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        sched.step()

Importing this module imports torch; ``import sx`` does not. CPU tensors only (fp32, and
bf16/fp16 with fp32 master weights). At stage 3 the params are sharded too, gathered
around each module's forward and backward from hooks on the modules (as FSDP).
"""
import contextlib
import functools
import inspect
import itertools
import logging
import threading
import warnings
import weakref

import numpy as np
import torch

from . import _lib
from .errors import InvalidArgumentError, UnsupportedError
from .group import _DTYPES as _SX_DTYPES
from .group import ShardGroup
from .optimizers import register_optimizer

__all__ = ["ShardedOptimizer"]

_log = logging.getLogger("sx.torch")

# Every live ShardedOptimizer (what the clip_grad_norm_ check looks at).
_live = weakref.WeakSet()


def dist_ready():
    """Whether torch.distributed has a process group this process may use."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


# torch.nn.utils.clip_grad_norm_ over params whose gradients sx holds, with several
# processes, clips each process's own gradients before sx averages them: not the global
# norm DDP clips. It still runs as torch's, but warns once (names imported from torch
# before sx.torch was are not wrapped).
_torch_clip_grad_norm_ = torch.nn.utils.clip_grad_norm_
_clip_warned = False


@functools.wraps(_torch_clip_grad_norm_)
def _clip_grad_norm_(parameters, *args, **kwargs):
    global _clip_warned
    if not _clip_warned:
        parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        held = {id(g) for opt in list(_live) if opt._world > 1 for g in opt._grads}
        if held and any(p.grad is not None and id(p.grad) in held for p in parameters):
            _clip_warned = True
            warnings.warn("torch.nn.utils.clip_grad_norm_ over params of an sx.torch.ShardedOptimizer clips this "
                          "process's own gradients, before sx averages them over the processes (DDP clips the "
                          "averaged ones): pass max_grad_norm to the optimizer, or call opt.clip_grad_norm_(...), "
                          "which clips the global norm at the step", stacklevel=2)
    return _torch_clip_grad_norm_(parameters, *args, **kwargs)


torch.nn.utils.clip_grad_norm_ = _clip_grad_norm_
torch.nn.utils.clip_grad.clip_grad_norm_ = _clip_grad_norm_

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
# Each kind's param group keys besides lr, weight_decay and maximize, as torch names them
# ("betas" is sx's beta1 and beta2; Adafactor's "eps" its eps and eps2).
_KEYS = {"sgd": ("momentum", "dampening", "nesterov"), "adam": ("betas", "eps", "amsgrad"),
         "adamw": ("betas", "eps", "amsgrad"), "adagrad": ("lr_decay", "eps", "initial_accumulator_value"),
         "rmsprop": ("alpha", "eps", "momentum", "centered"), "adamax": ("betas", "eps"),
         "nadam": ("betas", "eps", "momentum_decay", "decoupled_weight_decay"),
         "radam": ("betas", "eps", "decoupled_weight_decay"), "lion": ("betas",),
         "muon": ("momentum", "nesterov", "eps", "ns_coefficients", "ns_steps", "adjust_lr_fn"),
         "adafactor": ("beta2_decay", "eps", "d")}
_FLAGS = ("nesterov", "amsgrad", "centered", "decoupled_weight_decay", "maximize")
# torch classes that need a whole param at once in a way sx does not run (Muon and
# Adafactor it does).
_WHOLE_PARAM = tuple(getattr(torch.optim, n) for n in ("LBFGS", "SparseAdam")
                     if hasattr(torch.optim, n))
_DTYPES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
# Group keys torch keeps that change nothing in sx (kernels and execution choices).
_IGNORED = ("foreach", "capturable", "differentiable", "fused", "param_names", "initial_lr")
# Muon's adjust_lr_fn as sx's adjust_lr (SX_MUON_ADJUST_LR_*).
_ADJUST_LR_FN = {None: 0, "original": 0, "match_rms_adamw": 1, "spectral_unclamped": 2}
# Adafactor's eps1 where torch's is None: torch takes the param dtype's machine epsilon,
# sx fp32's (its masters are fp32).
_ADAFACTOR_EPS1 = 2.0 ** -23


def _hyper(kind, group):
    """sx's hyperparameters of a torch param group (every key sx's optimizer takes; a
    key the group lacks, as lion-pytorch's lacks maximize, keeps sx's default)."""
    h = {"lr": float(group["lr"]), "weight_decay": float(group.get("weight_decay", 0.0)),
         "maximize": bool(group.get("maximize", False))}
    for key in _KEYS[kind]:
        if key == "betas":
            if "betas" in group:
                h["beta1"], h["beta2"] = (float(b) for b in group["betas"])
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
            h[key] = bool(group[key]) if key in _FLAGS else float(group[key])
    return h


def _supported():
    def where(c):
        return "torch.optim" if c.__module__.startswith("torch.optim") else c.__module__.rsplit(".", 1)[0]
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
    if kind == "adam" and defaults.get("decoupled_weight_decay"):
        kind = "adamw"  # torch's Adam with decoupled weight decay is AdamW
    if kind == "lion" and defaults.get("decoupled_weight_decay"):
        raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                               "Lion's decoupled_weight_decay=True divides weight_decay by the constructor's lr; "
                               "pass weight_decay / lr and decoupled_weight_decay=False")
    return kind


def _state_shape(name, shape):
    """The shape torch keeps a param's state tensor in: the param's, but Adafactor's
    factored moments of a param of two or more dimensions (torch.optim.Adafactor's
    row_var [..., R, 1] and col_var [..., 1, C])."""
    shape = tuple(shape)
    if name == "row_var":
        return shape[:-1] + (1,)
    if name == "col_var":
        return shape[:-2] + (1, shape[-1])
    return shape


def _wrap_units(module, policy):
    """FSDP's auto-wrap as units: every module for which policy(module) is true, innermost
    first, makes a unit of its params that no module inside it took; the params left make
    the root's unit. Units are numbered 0.. in the order of their first param in
    module.parameters(). Returns id(param) -> unit, and unit -> the module that owns it."""
    owner = {}
    owners = []  # per group, its module
    for m in reversed(list(module.modules())):  # every module after the ones inside it
        if m is module or not policy(m):
            continue
        mine = [p for p in m.parameters() if id(p) not in owner]
        for p in mine:
            owner[id(p)] = len(owners)
        if mine:
            owners.append(m)
    rest = [p for p in module.parameters() if id(p) not in owner]
    for p in rest:
        owner[id(p)] = len(owners)
    if rest:
        owners.append(module)
    order = {}
    for p in module.parameters():
        order.setdefault(owner[id(p)], len(order))
    return {pid: order[g] for pid, g in owner.items()}, {order[g]: m for g, m in enumerate(owners)}


def _dtype_choice(what, value):
    """grad_dtype's or reduce_dtype's name for ShardGroup, given as a torch dtype or a name."""
    if value is None or isinstance(value, str):
        return value
    if value not in _DTYPES:
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"{what} {value}: one of "
                                   f"{sorted(str(d) for d in _DTYPES)}")
    return _DTYPES[value]


def _cast_inputs(dtype, _module, args, kwargs):
    """param_dtype: the root module's floating-point tensor inputs in the params' dtype,
    as FSDP's MixedPrecisionPolicy(cast_forward_inputs=True) casts them."""
    def cast(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            return x.to(dtype)
        if isinstance(x, (list, tuple)):
            return type(x)(cast(v) for v in x)
        if isinstance(x, dict):
            return {k: cast(v) for k, v in x.items()}
        return x
    return cast(args), cast(kwargs)


def _as_array(t):
    """A contiguous float32 numpy array of a tensor (or number) of any float dtype."""
    if isinstance(t, torch.Tensor):
        return t.detach().to(torch.float32).reshape(-1).cpu().numpy()
    return np.asarray(t, dtype=np.float32).reshape(-1)


class ShardedOptimizer(torch.optim.Optimizer):
    """A torch optimizer whose params, gradients and sharded state live in sx.

    ``params``: an ``nn.Module`` (its named parameters), an iterable of tensors, of
    ``(name, tensor)`` pairs, or of param group dicts, as torch's optimizers take them.
    Names key sx's checkpoints; unnamed params are called "param.<i>". Every rank must
    give the same params in the same order. ``optimizer_class``: torch.optim.SGD, Adam,
    AdamW, Adagrad, RMSprop, Adamax, NAdam, RAdam, Muon, Adafactor (where torch has them)
    or lion_pytorch.Lion, each run by sx's own kernels (docs/optimizers.md: what each
    takes, and where sx and the class differ); ``defaults``: its keyword arguments (lr,
    betas, eps, weight_decay, momentum, ...), with the class's own defaults for the rest.
    Other elementwise torch.optim.Optimizer classes run on each rank's shard; one that
    needs each param whole otherwise (LBFGS, SparseAdam) is refused.

    sx options: ``rendezvous`` ("env://": torchrun's, mpirun's or srun's environment),
    ``rank`` and ``world_size`` (taken from the environment when None), ``stage`` (1, 2,
    or 3: ``params`` a module, each unit's params present only around its modules'
    forward and backward, and inside :meth:`full_params`), ``shard_size``,
    ``prefetch_depth`` (as ShardGroup's), ``param_dtype`` (torch.bfloat16 or
    torch.float16: fp32 params compute in it, as FSDP's MixedPrecisionPolicy: the model's
    params become 16-bit, sx keeps their fp32 values as master weights, which the step
    updates and rounds into them, and a module's floating-point inputs are cast to it;
    the masters are in sx's checkpoints and in :meth:`state_dict`'s "master" entries),
    ``reduce_dtype`` (torch.float32: 16-bit gradients summed over ranks in fp32),
    ``grad_dtype`` (the params' own: torch keeps a .grad in its param's dtype),
    ``auto_wrap_policy`` (``params`` a module: each module for which ``policy(module)`` is
    true makes a unit of the params no module inside it took, and the rest a unit of the
    root's, as FSDP's auto-wrap; ``bucket_mb`` is then not used), ``max_grad_norm`` (clip the global norm of the averaged gradients; 0: none),
    ``bucket_mb`` (params are laid out in units of about this many MiB, in order: the
    grain of communication), ``overlap`` (each unit's gradients are reduced as soon as the
    backward has accumulated them, while the backward goes on with earlier layers; then
    every step must follow exactly one backward: accumulate micro-batches in the loss or
    inside :meth:`no_sync`), ``timeout_ms``, ``num_threads`` (threads of this process's
    step; None: torch's own count, ``torch.get_num_threads()``, which under torchrun is
    its OMP_NUM_THREADS), ``transport`` ("auto": processes on one host exchange through
    shared memory; "tcp": always over TCP), ``sync_module_states`` (every rank starts from
    rank 0's params and, given a module, its buffers, as DDP does; False: every rank keeps
    its own, which it must then have made the same). The settings chosen are logged
    (logger "sx.torch", INFO).

    ``with opt.no_sync():`` accumulates micro-batches' gradients without reducing them,
    as DDP's no_sync; with ``overlap`` the first backward after it starts the reductions.

    Differences from torch worth knowing: ``zero_grad()`` zeroes the gradients in place
    (a ``.grad`` set to None would no longer be sx's memory); a param whose ``.grad`` is
    None at a step (requires_grad False, or set to None by hand) is frozen for that step,
    as torch skips it, and so is, with one process, a param no backward reached since
    ``zero_grad(set_to_none=True)``; one whose ``.grad`` was replaced by another tensor
    has it copied into sx's memory (with a warning). Params without elements are refused;
    the optimizer cannot be pickled or copied.
    Clip with ``max_grad_norm`` (or :meth:`clip_grad_norm_`, which returns the norm as a
    tensor the step fills), not with ``torch.nn.utils.clip_grad_norm_``: before the step a
    rank holds its own gradients, not yet averaged (torch's then warns, once). The norm is
    ``grad_norm`` after the step.
    """

    def __init__(self, params, optimizer_class=torch.optim.AdamW, *, rendezvous="env://", rank=None,
                 world_size=None, stage=2, max_grad_norm=0.0, bucket_mb=25.0, overlap=False, timeout_ms=0,
                 num_threads=None, transport="auto", sync_module_states=True, shard_size=0, grad_dtype=None,
                 reduce_dtype=None, prefetch_depth=1, auto_wrap_policy=None, param_dtype=None, **defaults):
        if stage not in (1, 2, 3):
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"stage {stage}: sx.torch runs stages 1-3")
        if stage == 3 and not isinstance(params, torch.nn.Module):
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       "stage 3 takes an nn.Module: its params exist only while gathered, around "
                                       "each module's forward and backward, which sx.torch does from the module's "
                                       "hooks")
        param_dtype = None if param_dtype == torch.float32 else param_dtype
        if param_dtype not in (None, torch.bfloat16, torch.float16):
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"param_dtype {param_dtype}: sx.torch computes in "
                                       "torch.bfloat16, torch.float16 or the params' own dtype (None)")
        grad_dtype, reduce_dtype = _dtype_choice("grad_dtype", grad_dtype), _dtype_choice("reduce_dtype", reduce_dtype)
        signature = inspect.signature(optimizer_class.__init__)
        full = {k: p.default for k, p in signature.parameters.items()
                if k not in ("self", "params") and p.default is not inspect.Parameter.empty}
        unknown = sorted(set(defaults) - set(full))
        if unknown:
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"{optimizer_class.__name__} has no argument(s) {unknown}")
        full.update(defaults)
        self._kind = _kind_of(optimizer_class, full)
        self.optimizer_class = optimizer_class
        self._class_args = tuple(full)  # the constructor's keywords, which its param groups hold
        self._instance = None
        self._runners = {}  # per worker thread: its instance of the class (_run_torch_class)
        if not isinstance(self._kind, str):  # a class run on the shards: see _run_torch_class
            self._instance = next(_instance_counter)
            _instances[self._instance] = self
        self.max_grad_norm = float(max_grad_norm)
        self.grad_norm = None
        self._bucket_bytes = max(1, int(bucket_mb * (1 << 20)))
        self._unit, self._unit_bytes = -1, self._bucket_bytes
        self._params = []      # every param, in sx's order (torch's flattening of the groups)
        self._names = []
        self._grads = []       # per param: the grad tensor over sx's memory
        self._pushed = []      # per group: the hyperparameters sx has
        self._consolidated = None
        self._clean = False    # the grads are known to be zero (after a step or zero_grad)
        self._finalized = False
        self._overlap = bool(overlap)
        self._unit_params = {}  # stage 3: per unit, its params' indices
        self._gathered = {}     # stage 3: per unit gathered by this optimizer, how many times
        self._backward = {}     # stage 3: per unit gathered for the backward, its params still to come
        self._peak = 0
        self._whole = False     # stage 3: inside full_params()
        self._no_sync = False  # inside no_sync(): the hooks signal nothing
        self._nonfinite = "default"
        self._param_dtype = param_dtype
        self._grad_dtype = grad_dtype
        self._masters = {}     # param_dtype: per param converted, its fp32 values until they seed its masters
        self._norms_due = []   # clip_grad_norm_'s tensors, filled by the next step
        self._units = []       # per param: its unit's index
        self._waiting = {}     # overlap: per unit, its params whose gradients are still to come
        # Per param: a backward has written its gradient since zero_grad(set_to_none=True)
        # (torch's .grad would be a tensor, not None), known through the hooks.
        self._touched = []
        self._unhooked = set()  # bound params without a post-accumulate-grad hook yet
        self._hooks = hasattr(torch.Tensor, "register_post_accumulate_grad_hook")
        if (self._overlap or stage == 3) and not self._hooks:
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED, "overlap and stage 3 need torch's post-accumulate-grad "
                                   "hooks (torch 2.1 or newer)")
        # torch's own thread count (OMP_NUM_THREADS, which torchrun sets to 1 for several
        # processes per host, or torch.set_num_threads) unless told otherwise.
        threads_from = "num_threads"
        if num_threads is None:
            num_threads, threads_from = torch.get_num_threads(), "torch.get_num_threads()"
        self.num_threads = int(num_threads)
        kw = {"stage": stage, "backend": "cpu", "timeout_ms": timeout_ms, "num_threads": int(num_threads),
              "transport": transport, "shard_size": shard_size, "grad_dtype": grad_dtype,
              "reduce_dtype": reduce_dtype, "prefetch_depth": prefetch_depth}
        self._stage = stage
        if rendezvous == "env://" and rank is None and world_size is None:
            self.group = ShardGroup(rendezvous, 0, 0, **kw)
        else:
            self.group = ShardGroup(rendezvous, rank or 0, world_size or 1, **kw)
        # A param no backward reached since zero_grad() is skipped, as torch skips a .grad
        # of None, where this process alone decides it: with one process. Across several,
        # the ranks must agree on the params a step updates, and a param that one rank's
        # batch did not reach is still averaged with the others' gradients.
        self._skip_unreached = self._hooks and self.group.world_size == 1
        module = params if isinstance(params, torch.nn.Module) else None
        self._wrapped = None  # auto_wrap_policy's units: id(param) -> unit
        if auto_wrap_policy is not None:
            if module is None:
                raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                           "auto_wrap_policy needs params to be an nn.Module")
            self._wrapped, self._wrap_owners = _wrap_units(module, auto_wrap_policy)
        if module is not None:
            params = list(params.named_parameters())
        super().__init__(params, full)
        self.group.finalize()
        self._finalized = True
        self._bind(0, sync=sync_module_states and self.group.world_size > 1)
        if sync_module_states and self.group.world_size > 1:
            self._sync_states(module)
        self._seed_masters(sync_module_states and self.group.world_size > 1)
        if param_dtype is not None and module is not None:
            module.register_forward_pre_hook(functools.partial(_cast_inputs, param_dtype), with_kwargs=True)
        if stage == 3:
            self._hook_modules(module)
        self._world = self.group.world_size
        _live.add(self)
        _log.info("sx.torch: rank %d of %d, stage %d, %d params in %d units, %d thread%s (%s)",
                  self.group.rank, self.group.world_size, stage, len(self._params), self.group.num_units,
                  int(num_threads), "" if int(num_threads) == 1 else "s", threads_from)

    def _sync_states(self, module):
        """Collective: every rank takes rank 0's params (in sx's memory) and, given a
        module, its buffers (BatchNorm's running statistics), as DDP and FSDP's
        sync_module_states do (stage 3: the params were broadcast while bound)."""
        if self._stage != 3:
            self.group.broadcast_params(0)
        if module is None:
            return
        buffers = [b for b in module.buffers() if b.numel() > 0]
        if dist_ready():
            for b in buffers:
                torch.distributed.broadcast(b.data, src=0)
            return
        # Without torch.distributed: rank 0's values summed with every other rank's zeros,
        # a call per SX_MAX_ALL_REDUCE values (doubles hold every fp32, fp16, bf16 and
        # integer below 2^53 exactly).
        mine = self.group.rank == 0
        for b in buffers:
            flat = b.data.contiguous().view(-1)  # the buffer itself, or a copy of a strided one
            for at in range(0, flat.numel(), _lib.SX_MAX_ALL_REDUCE):
                part = flat[at:at + _lib.SX_MAX_ALL_REDUCE]
                values = part.to(torch.float64).tolist() if mine else [0.0] * part.numel()
                part.copy_(torch.tensor(self.group.all_reduce(values, "sum"), dtype=torch.float64))
            if flat.data_ptr() != b.data.data_ptr():
                b.data.copy_(flat.view(b.shape))

    # -- torch's Optimizer interface -------------------------------------------------
    def add_param_group(self, param_group):
        """Adds a param group, as torch's; after construction it is a collective (every
        rank adds the same group), and the new params join sx's buffers while the others
        keep theirs, their state and their step counts."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, not {type(param_group).__name__}")
        if self._finalized and self._stage == 3:
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED, "add_param_group after construction at stage 3: the "
                                   "new params' modules would need hooks; pass every param group at first")
        params = param_group["params"]
        params = [params] if isinstance(params, (torch.Tensor, tuple)) else list(params)
        names = []
        plain = []
        for p in params:
            if isinstance(p, tuple):
                names.append(str(p[0]))
                plain.append(p[1])
            else:
                names.append(None)
                plain.append(p)
        group = dict(param_group)
        group["params"] = plain
        first = len(self._params)
        # What sx would refuse, refused before anything changes.
        for k, p in enumerate(plain):
            what = names[k] if names[k] is not None else f"param.{first + k}"
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"{what} is a {type(p).__name__}, not a tensor")
            if p.device.type != "cpu" or p.dtype not in _DTYPES:
                raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                       f"{what} has dtype {p.dtype} on {p.device}: sx.torch takes CPU tensors of "
                                       f"dtype {sorted(str(d) for d in _DTYPES)}")
            if p.numel() == 0:
                raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                       f"{what} has shape {tuple(p.shape)}: sx holds no param without elements "
                                       "(leave it out of the optimizer)")
            if self._grad_dtype is not None and (_SX_DTYPES[_DTYPES[self._compute_dtype(p)]]
                                                 != _SX_DTYPES.get(self._grad_dtype)):
                raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                       f"grad_dtype {self._grad_dtype} for {what}, which computes in "
                                       f"{self._compute_dtype(p)}: torch's autograd keeps a .grad in its param's "
                                       "dtype (reduce_dtype=torch.float32 reduces 16-bit gradients in fp32)")
        for key in group:
            if key not in _IGNORED and key != "params" and key not in self.defaults:
                raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"unknown param group key {key!r}")
        super().add_param_group(group)  # torch's checks and defaults
        try:
            self._add_to_sx(self.param_groups[-1], names, first)
        except BaseException:
            if len(self._pushed) < len(self.param_groups):
                self.param_groups.pop()  # sx did not take the group: torch's view of it goes too
            for i in [i for i in self._masters if i >= first]:  # param_dtype's conversions undone
                plain[i - first].data = self._masters.pop(i)
            raise
        self._consolidated = None

    def _add_to_sx(self, group, names, first):
        extra = {} if self._instance is None else {_INSTANCE_KEY: float(self._instance)}
        index = self.group.add_param_group(self._kind, **_hyper(self._kind, group), **extra)
        self._pushed.append(_hyper(self._kind, group))
        if self._finalized:
            # The units laid out already are closed: the new params start a unit of their own.
            self._unit, self._unit_bytes = self._unit + 1, 0
        for k, p in enumerate(group["params"]):
            name = names[k] if names[k] is not None else f"param.{first + k}"
            nbytes = p.numel() * p.element_size()
            if self._wrapped is not None and not self._finalized:
                unit = self._wrapped[id(p)]  # the policy's units, numbered 0.. in param order
                self._unit = max(self._unit, unit)
            else:
                if self._unit_bytes + nbytes > self._bucket_bytes and self._unit_bytes > 0:
                    self._unit, self._unit_bytes = self._unit + 1, 0
                self._unit_bytes += nbytes
                unit = self._unit
            if self._compute_dtype(p) != p.dtype:  # param_dtype: the fp32 values seed the masters
                self._masters[first + k] = p.data
                p.data = p.data.to(self._param_dtype)
            self.group.add_param(name, tuple(p.shape), param_group=index, unit=unit,
                                 dtype=_DTYPES[p.dtype], frozen=not p.requires_grad)
            self._params.append(p)
            self._names.append(name)
            self._units.append(unit)  # unit ids are 0..n-1: a unit's index is its id
        if self._finalized:
            self.group.finalize()
            self._bind(first)
            self._seed_masters(False)

    def _compute_dtype(self, p):
        """The dtype param p has in sx and in the model: param_dtype's for an fp32 one."""
        return self._param_dtype if self._param_dtype is not None and p.dtype == torch.float32 else p.dtype

    def _seed_masters(self, from_rank0):
        """param_dtype: the converted params' fp32 values become their masters (exactly:
        the step updates them, and the 16-bit params are their rounding). `from_rank0`: a
        collective; every rank takes rank 0's values (construction with
        sync_module_states). Else each rank writes its own into its shard in place."""
        if not self._masters:
            return
        masters, self._masters = self._masters, {}
        if from_rank0:
            def fill(st):
                if st.index in masters:
                    st.tensors["master"][...] = _as_array(masters[st.index])
            self.group.scatter_optim_state(fill if self.group.rank == 0 else None, root=0)
            return
        for i, values in masters.items():
            info = self.group.param_info(i)
            if info.shard_end > info.shard_begin:
                view = self.group.state_view(i, "master")
                view[...] = _as_array(values)[info.shard_begin:info.shard_end]

    def _bind(self, first, sync=False):
        """Params `first`.. take sx's memory: their values are copied in, then .data and
        .grad become views of sx's buffers. Stage 3: their units are gathered for it (and
        broadcast from rank 0 where `sync`), then released: .data is empty until a
        module's hooks gather its units again."""
        if self._stage == 3:
            self._bind_sharded(first, sync)
        else:
            self._bind_views(first)
        self._hook_new()
        self._expect()

    # -- stage 3 -------------------------------------------------------------------------
    # A param keeps a storage of its own, of full size only while one of its modules runs
    # (forward or backward): gathering its unit copies sx's gathered values into it, then
    # sx releases the unit at once; releasing the param resizes its storage to nothing, as
    # FSDP does (views taken in the forward, which the backward reads, share the storage).
    # Its .grad is a view of sx's gradient buffer, which stays whole.
    def _bind_sharded(self, first, sync):
        """Unit by unit (so that no rank holds more than its shards and one unit): gathered,
        the params' values written in (and broadcast from rank 0 where `sync`: the units
        rank 0 holds gathered, this one), released."""
        by_unit = {}
        for i in range(first, len(self._params)):
            by_unit.setdefault(self._units[i], []).append(i)
        # Units in id order, which need not be the params' (an auto-wrap policy's root unit
        # holds params of the start and of the end): the lists by param index.
        self._grads.extend([None] * (len(self._params) - first))
        self._touched.extend([not self._skip_unreached] * (len(self._params) - first))
        for u in sorted(by_unit):
            self.group.gather_unit(u)
            for i in by_unit[u]:
                p = self._params[i]
                with torch.no_grad():
                    self._tensor(self.group.param_view(i), p).copy_(p.data)
                    if p.untyped_storage().nbytes() != p.numel() * p.element_size() or p.storage_offset() != 0:
                        p.data = p.data.clone()  # a storage of its own, to resize
                    grad = self._tensor(self.group.grad_view(i), p)
                    grad.zero_()
                p.grad = grad
                self._grads[i] = grad
                self._unhooked.add(i)
                self._unit_params.setdefault(u, []).append(i)
            if sync:
                self.group.broadcast_params(0)
            self.group.release_unit(u)
            self._free(u)

    def _gather(self, u):
        """Unit u's params present (nested: each needs its _release)."""
        self._gathered[u] = self._gathered.get(u, 0) + 1
        if self._gathered[u] > 1:
            return
        self.group.gather_unit(u)
        try:
            with torch.no_grad():
                for i in self._unit_params[u]:
                    p = self._params[i]
                    p.untyped_storage().resize_(p.numel() * p.element_size())
                    # Through an alias of the storage: the param's version stays, so that
                    # autograd still takes what its forward saved of it.
                    alias = torch.empty(0, dtype=p.dtype).set_(p.untyped_storage(), 0, p.shape, p.stride())
                    alias.copy_(self._tensor(self.group.param_view(i), p))
        finally:
            self.group.release_unit(u)
        if not self._whole:
            self._peak = max(self._peak, sum(self._unit_bytes_of(v) for v in self._gathered))

    def _release(self, u):
        self._gathered[u] -= 1
        if self._gathered[u] == 0:
            del self._gathered[u]
            self._free(u)

    def _free(self, u):
        for i in self._unit_params[u]:
            self._params[i].untyped_storage().resize_(0)

    def _unit_bytes_of(self, u):
        return sum(self._params[i].numel() * self._params[i].element_size() for i in self._unit_params[u])

    @property
    def peak_param_bytes(self):
        """Stage 3: the most bytes of full params this process held at once in its
        modules' storages for their forwards and backwards (not inside full_params(); sx's
        own shards and gathers are in group.memory_stats())."""
        return self._peak

    @contextlib.contextmanager
    def full_params(self):
        """Stage 3: every param present (whole) inside the block, e.g. to read or save the
        model; writes into them are not kept. Collective. Elsewhere nothing to do."""
        if self._stage != 3:
            yield
            return
        units = sorted(self._unit_params)
        self._whole = True
        try:
            for u in units:
                self._gather(u)
            yield
        finally:
            for u in units:
                if u in self._gathered:
                    self._release(u)
            self._whole = False

    def _hook_modules(self, module):
        """Stage 3: each module that holds params gathers their units before its forward
        and its backward, and releases them after (the backward's as each unit's
        gradients are all accumulated)."""
        index = {id(p): i for i, p in enumerate(self._params)}
        if self._wrapped is not None:  # the modules that own the policy's units
            hooked = [(m, [u]) for u, m in sorted(self._wrap_owners.items())]
        else:  # every module holding params directly
            hooked = []
            for m in module.modules():
                units = sorted({self._units[index[id(p)]] for p in m.parameters(recurse=False) if id(p) in index})
                if units:
                    hooked.append((m, units))
        for m, units in hooked:

            def pre(_m, _args, units=units):
                for u in units:
                    self._gather(u)

            def post(_m, _args, _out, units=units):
                for u in units:
                    self._release(u)

            def backward_pre(_m, _grad_out, units=units):
                for u in units:
                    if u in self._backward:
                        continue
                    waiting = {i for i in self._unit_params[u] if self._params[i].requires_grad}
                    if waiting:
                        self._backward[u] = waiting
                        self._gather(u)

            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)
            m.register_full_backward_pre_hook(backward_pre)

    def _backward_done(self, i):
        """Stage 3: param i's gradient is accumulated; its unit is released once all its
        params' are."""
        u = self._units[i]
        waiting = self._backward.get(u)
        if waiting is None:
            return
        waiting.discard(i)
        if not waiting:
            del self._backward[u]
            self._release(u)

    def _release_backward(self):
        """Stage 3: units gathered for a backward that did not reach all their params."""
        for u in list(self._backward):
            del self._backward[u]
            self._release(u)

    def _bind_views(self, first):
        for i in range(first, len(self._params)):
            p = self._params[i]
            with torch.no_grad():
                values = self._tensor(self.group.param_view(i), p)
                values.copy_(p.data)
                p.data = values
                grad = self._tensor(self.group.grad_view(i), p)
                grad.zero_()
            p.grad = grad
            self._grads.append(grad)
            self._touched.append(not self._skip_unreached)
            self._unhooked.add(i)

    def _hook_new(self):
        """Hooks the params that require a gradient and have no hook yet (a param frozen
        when it was bound has none until it is unfrozen: torch refuses hooks on tensors that
        do not require gradients). True if there was one."""
        if not self._hooks:
            return False
        now = [i for i in self._unhooked if self._params[i].requires_grad]
        for i in now:
            self._params[i].register_post_accumulate_grad_hook(lambda _p, i=i: self._accumulated(i))
            self._unhooked.discard(i)
        return bool(now)

    def _expect(self):
        """Overlap: the params whose gradients each unit waits for in the next backward."""
        self._waiting = {}
        for i, p in enumerate(self._params):
            if p.requires_grad:
                self._waiting.setdefault(self._units[i], set()).add(i)

    def _accumulated(self, i):
        self._clean = False
        self._touched[i] = True
        if self._stage == 3:
            self._backward_done(i)
        if not self._overlap or self._no_sync:
            return
        unit = self._units[i]
        waiting = self._waiting.get(unit)
        if waiting is None or i not in waiting:
            # sx is reducing this unit already: a second backward would race with it.
            raise RuntimeError(f"sx.torch: a second gradient of {self._names[i]} before step(); with overlap=True "
                               "every backward must be followed by step() (a step skipped, as GradScaler skips "
                               "one after an overflow, leaves the reduction of the first backward open)")
        waiting.discard(i)
        if not waiting:
            del self._waiting[unit]
            self.group.unit_grads_ready(unit)

    @staticmethod
    def _tensor(array, like):
        t = torch.from_numpy(array)  # shares the memory, and keeps the array (and sx's) alive
        if like.dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)  # numpy has no bf16: the view holds its raw bits
        return t.view(like.shape)

    def zero_grad(self, set_to_none=True):
        """Zeroes every gradient in sx's memory. ``.grad`` stays a view of it; with
        ``set_to_none`` (torch's default) and one process, a param that no backward then
        reaches is skipped by the next step, as torch skips a param whose .grad is None.
        Cheap right after a step, which zeroes them already."""
        if self._hook_new():
            self._clean = False  # a param unfrozen since: its gradient may hold a backward's
        for i, (p, grad) in enumerate(zip(self._params, self._grads)):
            if p.grad is not grad:
                p.grad = grad
                self._clean = False
            self._touched[i] = not (set_to_none and self._skip_unreached)
        if not self._clean:
            with torch.no_grad():
                for grad in self._grads:
                    grad.zero_()
        self._clean = True

    @torch.no_grad()
    def step(self, closure=None, *, weight=None):
        """Collective: averages the gradients over the ranks (or, with ``weight``, divides
        their sum by the sum of every rank's weight: gradients of summed losses, for
        uneven inputs), clips them to ``max_grad_norm``, updates this rank's shard and
        gathers every param. Returns the closure's loss, if a closure was given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._push_hyperparameters()
        self._hook_new()
        mask = self.group.trainable_mask()
        for i, (p, grad) in enumerate(zip(self._params, self._grads)):
            replaced = p.grad is not None and p.grad is not grad
            mask[i] = 1 if (p.requires_grad and p.grad is not None and (self._touched[i] or replaced)) else 0
            if replaced:
                if p.grad.data_ptr() != grad.data_ptr():
                    warnings.warn(f"sx.torch: the .grad of {self._names[i]} was replaced by another tensor; it is "
                                  "copied into sx's memory (zero_grad keeps .grad in place)", stacklevel=2)
                    grad.copy_(p.grad)
                p.grad = grad
        if self._stage == 3:
            self._release_backward()
        if self._no_sync:
            raise RuntimeError("sx.torch: step() inside no_sync(): the gradients of the micro-batches inside are "
                               "reduced by the first backward outside it, or by a step outside it")
        result = self.group.step(max_grad_norm=self.max_grad_norm, weight=weight, nonfinite=self._nonfinite)
        self.grad_norm = result.grad_norm
        for norm in self._norms_due:
            norm.fill_(result.grad_norm)
        self._norms_due = []
        self._clean = True
        self._consolidated = None  # the state moved on
        self._expect()
        return loss

    def _push_hyperparameters(self):
        """Tells sx the hyperparameters of the param groups that changed since."""
        for gi, group in enumerate(self.param_groups):
            wanted = _hyper(self._kind, group)
            for key, value in wanted.items():
                if self._pushed[gi].get(key) != value:
                    self.group.set_hyperparameter(gi, key, value)
                    self._pushed[gi][key] = value

    def clip_grad_norm_(self, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None):
        """Clips at the next step(s) to ``max_norm`` the global L2 norm of the averaged
        gradients (which exists only once the step has reduced them); with
        ``error_if_nonfinite``, a step whose gradients hold inf or NaN is skipped on every
        rank and raises NonFiniteError, as torch's. Returns a 0-d tensor, as torch's
        clip_grad_norm_, which the next step fills with the norm before clipping (NaN
        until then; also ``grad_norm`` after the step)."""
        del foreach  # sx clips in its own step
        if float(norm_type) != 2.0:
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                   f"clip_grad_norm_: norm_type {norm_type}: sx clips the L2 norm (2.0)")
        self.max_grad_norm = float(max_norm)
        self._nonfinite = "error" if error_if_nonfinite else "default"
        norm = torch.full((), float("nan"), dtype=torch.float32)
        self._norms_due.append(norm)
        return norm

    @contextlib.contextmanager
    def no_sync(self):
        """Backwards inside accumulate their gradients in sx's memory without reducing
        them (as DDP's and FSDP's no_sync): with ``overlap=True`` the units are not
        signalled; the first backward outside then signals each unit as its gradients
        (the sum of every micro-batch's) are complete, and step() reduces them once.
        Without overlap nothing is reduced before step() anyway."""
        before, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = before

    # -- whole state, in torch's format ------------------------------------------------
    def consolidate_state_dict(self, to=0):
        """Collective: gathers the whole optimizer state onto rank ``to``, one param at a
        time, as ZeroRedundancyOptimizer.consolidate_state_dict; that rank's
        :meth:`state_dict` then returns it in torch's format."""
        states = self.group.gather_optim_state(root=to)
        self._consolidated = None if states is None else self._torch_state_dict(states)

    def state_dict(self):
        """The consolidated optimizer state in torch's format (a dict that
        ``torch.optim.<class>.load_state_dict`` accepts), on the rank it was consolidated
        to (with one rank, consolidated here if needed)."""
        if self._consolidated is None and self.group.world_size == 1:
            self.consolidate_state_dict(to=0)
        if self._consolidated is None:
            raise RuntimeError("the optimizer state has not been consolidated on this rank since the last step: "
                               "call consolidate_state_dict(to=rank) on every rank first")
        return self._consolidated

    def _torch_state_dict(self, states):
        state = {}
        for i, st in enumerate(states):
            p = self._params[i]
            entry = {}
            if self._kind == "sgd":
                if "momentum_buffer" in st.tensors and st.momentum_steps > 0:
                    entry["momentum_buffer"] = torch.from_numpy(st.tensors["momentum_buffer"]).view(p.shape).clone()
            elif st.step > 0:
                if self._kind not in ("lion", "muon"):  # lion-pytorch and torch's Muon keep no step
                    entry["step"] = torch.tensor(float(st.step), dtype=torch.float32)
                for name, values in st.tensors.items():
                    if name != "master":
                        entry[name] = torch.from_numpy(values).view(_state_shape(name, p.shape)).clone()
                if self._kind == "nadam":
                    entry["mu_product"] = torch.tensor(st.mu_product, dtype=torch.float32)
            if self._param_dtype is not None and "master" in st.tensors:
                entry["master"] = torch.from_numpy(st.tensors["master"]).view(p.shape).clone()
            if entry:
                state[i] = entry
        groups, index = [], 0
        for group in self.param_groups:
            g = {k: v for k, v in group.items() if k != "params"}
            g["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(g)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        """Collective (every rank passes the same dict, as to ZeroRedundancyOptimizer):
        loads a torch-format optimizer state dict, e.g. one saved by
        ``torch.optim.AdamW``, into every rank's shard. Hyperparameters come from its
        param groups; the params' values stay (16-bit params keep theirs as masters)."""
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(groups)} param groups, this optimizer "
                             f"{len(self.param_groups)}")
        for mine, theirs in zip(self.param_groups, groups):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError("a param group of the state dict has another number of params")
        # torch's indices in the dict's groups, in our order
        order = [i for g in groups for i in g["params"]]
        for mine, theirs in zip(self.param_groups, groups):
            for key, value in theirs.items():
                if key != "params":
                    mine[key] = value
        # sx keeps the state tensors its hyperparameters need (a momentum buffer, the
        # running max of amsgrad): they take the dict's before its state is scattered.
        self._push_hyperparameters()
        saved = state_dict["state"]
        kind = self._kind

        def fill(st):
            entry = saved.get(order[st.index], {})
            p = self._params[st.index]
            for name in st.tensors:
                if name == "master":  # the dict's (param_dtype's state dicts hold them), or the current values
                    master = entry.get("master")
                    st.tensors[name][...] = _as_array(p.data if master is None else master)
                elif name in entry and entry[name] is not None:
                    values = _as_array(entry[name])
                    if values.size != st.tensors[name].size:
                        raise ValueError(f"param {order[st.index]}: state '{name}' has {values.size} values; "
                                         f"torch keeps it in shape {list(_state_shape(name, p.shape))}")
                    st.tensors[name][...] = values
            if kind == "sgd":
                st.momentum_steps = 1 if entry.get("momentum_buffer") is not None else 0
                st.step = st.momentum_steps
            else:
                step = entry.get("step", 0)
                st.step = int(step.item() if isinstance(step, torch.Tensor) else step)
                mu = entry.get("mu_product", 0.0)  # NAdam's; 0: sx derives it from the step
                st.mu_product = float(mu.item() if isinstance(mu, torch.Tensor) else mu)

        with self.full_params():  # stage 3: the masters' values are read from the params
            self.group.scatter_optim_state(fill if self.group.rank == 0 else None, root=0)
        self._consolidated = None

    def __reduce_ex__(self, protocol):  # pickle and copy.copy
        raise TypeError("a ShardedOptimizer cannot be pickled or copied: its params and state live in sx's "
                        "memory, shared by every process of the group; save it with state_dict() after "
                        "consolidate_state_dict(), or with save()")

    __deepcopy__ = __reduce_ex__  # copy.deepcopy(opt) calls it with the memo

    # -- sx checkpoints -------------------------------------------------------------
    def save(self, path, user_blob=b"", **options):
        """Collective: an sx checkpoint of the params and the optimizer state (see
        ShardGroup.save; returns its Future)."""
        return self.group.save(path, user_blob, **options)

    def load(self, path, **options):
        """Collective: loads an sx checkpoint saved at any world size into the params and
        the state; the param groups' hyperparameters follow it."""
        self.group.load(path, **options)
        for gi, group in enumerate(self.param_groups):
            def get(key, gi=gi):
                return self.group.get_hyperparameter(gi, key)
            for key in ("lr", "weight_decay", "maximize") + _KEYS[self._kind]:
                if key not in group:
                    continue
                if key == "betas":
                    group["betas"] = (get("beta1"), get("beta2"))
                elif key == "ns_coefficients":
                    group[key] = (get("ns_a"), get("ns_b"), get("ns_c"))
                elif key == "ns_steps":
                    group[key] = int(get(key))
                elif key == "adjust_lr_fn":  # the group's own name while it means the same
                    value = int(get("adjust_lr"))
                    if _ADJUST_LR_FN.get(group[key]) != value:
                        group[key] = next(n for n, v in _ADJUST_LR_FN.items() if n is not None and v == value)
                elif key == "eps" and self._kind == "adafactor":  # torch's (eps1, eps2); None while it means the same
                    eps1 = get("eps")
                    group[key] = (None if group[key][0] is None and eps1 == _ADAFACTOR_EPS1 else eps1, get("eps2"))
                else:
                    value = get(key)
                    group[key] = bool(value) if key in _FLAGS else value
            self._pushed[gi] = _hyper(self._kind, group)
            if self._instance is not None:  # the checkpoint holds the saving optimizer's number
                self.group.set_hyperparameter(gi, _INSTANCE_KEY, float(self._instance))

    def close(self):
        """Releases the sx group (once no tensor over its memory is alive: the model's
        params keep it)."""
        _live.discard(self)
        self.group.close()
