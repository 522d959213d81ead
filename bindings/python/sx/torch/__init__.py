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

The package: ``ShardedOptimizer`` (here: its construction and torch's Optimizer interface)
is composed of parts, each a module: ``_params`` (param groups added to sx and bound to
its memory), ``_hooks`` (autograd and module hooks, stage 3's gathering),
``_mixed_precision`` (param_dtype and its master weights), ``_state_dicts`` (torch-format
state dicts and sx checkpoints), ``_hf`` (Hugging Face checkpoints and PEFT adapters); ``_kinds`` maps torch's optimizer classes to sx's, and
``_clip`` wraps torch's clip_grad_norm_. ``dist_ready`` stays here: the constructor looks it
up here when it runs, so that replacing ``sx.torch.dist_ready`` takes effect.
"""
import contextlib
import functools
import inspect
import logging
import warnings

import torch

from .. import _lib
from ..errors import InvalidArgumentError, UnsupportedError
from ..group import ShardGroup
from ..optimizers import register_optimizer  # noqa: F401  importable from sx.torch, as it always was
from ._clip import _live  # importing it wraps torch's clip_grad_norm_
from ._hooks import _Hooks
from ._kinds import (_GROUP_STEP, _hyper, _instance_counter, _instances, _kind_of, _kwargs_options,
                     _state_dtype)
from ._mixed_precision import _MixedPrecision, _cast_inputs, _dtype_choice
from ._params import Replicated, Split, _Params, _placement_table, _wrap_units
from ._state_dicts import _StateDicts
from ._hf import IncompatibleKeys, _HF

__all__ = ["ShardedOptimizer", "IncompatibleKeys", "Split", "Replicated"]

_log = logging.getLogger("sx.torch")


def _openmp_backend():
    """Whether torch runs its intra-op work on OpenMP (its libgomp is then loaded, and its
    workers are the ones an sx step would otherwise compete with)."""
    return "parallel backend: OpenMP" in torch.__config__.parallel_info()


def dist_ready():
    """Whether torch.distributed has a process group this process may use."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class ShardedOptimizer(_Params, _Hooks, _MixedPrecision, _StateDicts, _HF, torch.optim.Optimizer):
    """A torch optimizer whose params, gradients and sharded state live in sx.

    ``params``: an ``nn.Module`` (its named parameters), an iterable of tensors, of
    ``(name, tensor)`` pairs, or of param group dicts, as torch's optimizers take them.
    Names key sx's checkpoints; unnamed params are called "param.<i>". Every rank must
    give the same params in the same order. ``optimizer_class``: torch.optim.SGD, Adam,
    AdamW, Adagrad, RMSprop, Adamax, NAdam, RAdam, Muon, Adafactor (where torch has them),
    lion_pytorch.Lion, pytorch_optimizer.Lamb or AdEMAMix, torchao.optim.AdamW8bit or
    Adam8bit (block_size 256, no bf16_stochastic_round), each run by sx's own kernels
    (docs/optimizers.md: what each takes, and where sx and the class differ); ``defaults``:
    its keyword arguments (lr, betas, eps, weight_decay, momentum, ...), with the class's
    own defaults for the rest.
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
    ``state_dtype`` ("fp32", "bf16" or "8bit": how the optimizer state is kept, for the
    classes sx runs with its own elementwise kernels; None: fp32, and torchao's 8-bit
    classes' "8bit"; docs/optimizers.md "State in fewer bytes": sx checkpoints carry it
    exactly, and so do :meth:`state_dict` and :meth:`load_state_dict`: bf16 state as bf16
    tensors, torchao's classes' 8-bit slots as torchao's OptimState8bit),
    ``reduce_dtype`` (torch.float32: 16-bit gradients summed over ranks in fp32),
    ``grad_dtype`` (the params' own: torch keeps a .grad in its param's dtype),
    ``placements`` (a model split across tensor-parallel ranks or pipeline stages by the
    trainer, each slice's data-parallel ranks one optimizer: {param name or the param
    itself: ``sx.torch.Split(global_shape, dim, offset)`` or ``sx.torch.Replicated(index,
    count)``}, what each param is of the logical model; checkpoints record it, a norm
    domain (``self.group.join_norm_domain``) counts a replicated param once, and a
    checkpoint of whole tensors loads into the pieces; docs/model-parallel.md),
    ``auto_wrap_policy`` (``params`` a module: each module for which ``policy(module)`` is
    true makes a unit of the params no module inside it took, and the rest a unit of the
    root's, as FSDP's auto-wrap; ``bucket_mb`` is then not used), ``max_grad_norm`` (clip the global norm of the averaged gradients; 0: none),
    ``bucket_mb`` (params are laid out in units of about this many MiB, in order: the
    grain of communication), ``overlap`` (each unit's gradients are reduced as soon as the
    backward has accumulated them, while the backward goes on with earlier layers; then
    every step must follow exactly one backward: accumulate micro-batches in the loss or
    inside :meth:`no_sync`), ``timeout_ms``, ``num_threads`` (threads of this process's
    step; None: torch's own count, ``torch.get_num_threads()``, which under torchrun is
    its OMP_NUM_THREADS), ``openmp_threads`` (the step's work runs on torch's own OpenMP
    team, whose workers are awake after torch's last operation, instead of on sx's pool,
    whose threads would compete with them for the processors; None: where torch's parallel
    backend is OpenMP; docs/threads.md), ``transport`` ("auto": processes on one host exchange through
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
                 reduce_dtype=None, prefetch_depth=1, auto_wrap_policy=None, param_dtype=None, state_dtype=None,
                 placements=None, openmp_threads=None, **defaults):
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
        unknown = sorted(set(defaults) - set(full) - set(_kwargs_options(optimizer_class)))
        if unknown:
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"{optimizer_class.__name__} has no argument(s) {unknown}")
        full.update(defaults)
        self._kind = _kind_of(optimizer_class, full)
        self._state_dtype = _state_dtype(optimizer_class, state_dtype)
        if self._state_dtype != "fp32" and not isinstance(self._kind, str):
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED, f"state_dtype {self._state_dtype!r}: "
                                   f"{optimizer_class.__name__} runs on the shards through a custom optimizer, "
                                   "whose state stays fp32")
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
        if openmp_threads is None:
            openmp_threads = _openmp_backend()
        kw = {"stage": stage, "backend": "cpu", "timeout_ms": timeout_ms, "num_threads": int(num_threads),
              "openmp_threads": bool(openmp_threads), "transport": transport, "shard_size": shard_size, "grad_dtype": grad_dtype,
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
        self._placements, self._placed = _placement_table(placements, params), set()
        super().__init__(params, full)
        unused = [k for k in self._placements if k not in self._placed]
        if unused:
            self.group.close()
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"placements names {len(unused)} key(s) that are no param of the optimizer: "
                                       + ", ".join(repr(k) if isinstance(k, str) else "a tensor" for k in unused))
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
        _log.info("sx.torch: rank %d of %d, stage %d, %d params in %d units, %d thread%s (%s) of %s",
                  self.group.rank, self.group.world_size, stage, len(self._params), self.group.num_units,
                  int(num_threads), "" if int(num_threads) == 1 else "s", threads_from,
                  "torch's OpenMP team" if openmp_threads else "sx's pool")
        self.openmp_threads = bool(openmp_threads)

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
        if self._kind in _GROUP_STEP and not result.skipped:
            # The class counts a step in every param group, as sx does, whether or not its
            # params were updated: its "step", its bias corrections' t.
            for group in self.param_groups:
                group["step"] = group.get("step", 0) + 1
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

    def __reduce_ex__(self, protocol):  # pickle and copy.copy
        raise TypeError("a ShardedOptimizer cannot be pickled or copied: its params and state live in sx's "
                        "memory, shared by every process of the group; save it with state_dict() after "
                        "consolidate_state_dict(), or with save()")

    __deepcopy__ = __reduce_ex__  # copy.deepcopy(opt) calls it with the memo

    def close(self):
        """Releases the sx group (once no tensor over its memory is alive: the model's
        params keep it)."""
        _live.discard(self)
        self.group.close()
