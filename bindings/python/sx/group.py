"""ShardGroup: one rank's handle of a group of ranks that train one model together."""
import contextlib
import ctypes
import dataclasses
import math
import numbers
import os

from . import _lib, _views
from . import optimizers as _optimizers
from ._hyperparameters import HYPERPARAMETERS as _HYPERPARAMETERS
from .errors import InvalidArgumentError, OptimizerError, UnsupportedError, check
from ._handle import Handle
from ._lib import lib

_OPTIMIZERS = {"sgd": _lib.SX_OPTIM_SGD, "adam": _lib.SX_OPTIM_ADAM, "adamw": _lib.SX_OPTIM_ADAMW,
               "adagrad": _lib.SX_OPTIM_ADAGRAD, "rmsprop": _lib.SX_OPTIM_RMSPROP,
               "adamax": _lib.SX_OPTIM_ADAMAX, "nadam": _lib.SX_OPTIM_NADAM,
               "radam": _lib.SX_OPTIM_RADAM, "lion": _lib.SX_OPTIM_LION, "lamb": _lib.SX_OPTIM_LAMB,
               "muon": _lib.SX_OPTIM_MUON, "adafactor": _lib.SX_OPTIM_ADAFACTOR,
               "ademamix": _lib.SX_OPTIM_ADEMAMIX}
_REDUCE_OPS = {"sum": _lib.SX_REDUCE_SUM, "mean": _lib.SX_REDUCE_MEAN, "max": _lib.SX_REDUCE_MAX,
               "min": _lib.SX_REDUCE_MIN}
_NONFINITE = {"default": _lib.SX_NONFINITE_DEFAULT, "skip": _lib.SX_NONFINITE_SKIP,
              "error": _lib.SX_NONFINITE_ERROR}
_BACKENDS = {"auto": _lib.SX_BACKEND_AUTO, "cpu": _lib.SX_BACKEND_CPU, "cuda": _lib.SX_BACKEND_CUDA}
_TRANSPORTS = {"auto": _lib.SX_TRANSPORT_AUTO, "tcp": _lib.SX_TRANSPORT_TCP}
_DTYPES = {"f32": _lib.SX_DTYPE_F32, "float32": _lib.SX_DTYPE_F32, "f16": _lib.SX_DTYPE_F16,
           "float16": _lib.SX_DTYPE_F16, "bf16": _lib.SX_DTYPE_BF16, "bfloat16": _lib.SX_DTYPE_BF16}
# Muon's adjust_lr, by torch's adjust_lr_fn names (its None is "original").
_ADJUST_LR = {"original": _lib.SX_MUON_ADJUST_LR_ORIGINAL,
              "match_rms_adamw": _lib.SX_MUON_ADJUST_LR_MATCH_RMS_ADAMW,
              "spectral_unclamped": _lib.SX_MUON_ADJUST_LR_SPECTRAL_UNCLAMPED}
# How a param group keeps its optimizer state (SX_STATE_*).
_STATE_DTYPES = {"fp32": _lib.SX_STATE_FP32, "float32": _lib.SX_STATE_FP32,
                 "bf16": _lib.SX_STATE_BF16, "bfloat16": _lib.SX_STATE_BF16, "8bit": _lib.SX_STATE_8BIT}
_LOSS_SCALING_MODES = {"none": _lib.SX_LOSS_SCALING_NONE, "dynamic": _lib.SX_LOSS_SCALING_DYNAMIC,
                       "static": _lib.SX_LOSS_SCALING_STATIC}
# Keyword arguments of add_param_group that are flags (int fields of the descriptor).
_FLAG_FIELDS = ("nesterov", "maximize", "amsgrad", "centered", "decoupled_weight_decay", "bf16_stochastic_round")
_FLOAT_FIELDS = ("lr", "weight_decay", "beta1", "beta2", "eps", "momentum", "dampening",
                 "lr_decay", "initial_accumulator_value", "alpha", "momentum_decay",
                 "ns_a", "ns_b", "ns_c", "beta2_decay", "eps2", "d", "beta3", "t_alpha_beta3")
# ... that are ints, Muon's adjust_lr (an _ADJUST_LR name or an SX_MUON_ADJUST_LR_* value)
# and the state dtype (a _STATE_DTYPES name or an SX_STATE_* value).
_INT_FIELDS = ("ns_steps",)
_ENUM_FIELDS = ("adjust_lr", "state_dtype")
# Adafactor's eps1 where torch's is None: fp32's machine epsilon (sx's masters are fp32).
_ADAFACTOR_EPS1 = 2.0 ** -23


def _choice(what, value, table):
    """`value` as an sx enum: one of `table`'s names, or one of its integer values."""
    if isinstance(value, str):
        key = value.lower()
        if key in table:
            return table[key]
    elif isinstance(value, int) and value in table.values():
        return value
    raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                               f"{what} must be one of {sorted(table)} (or their SX_* values), "
                               f"not {value!r}")


def _adjust_lr(value):
    """Muon's adjust_lr: torch's adjust_lr_fn (None, "original", "match_rms_adamw" or
    "spectral_unclamped") or an SX_MUON_ADJUST_LR_* value."""
    return _lib.SX_MUON_ADJUST_LR_ORIGINAL if value is None else _choice("adjust_lr", value, _ADJUST_LR)


def _optimizer_kind(optimizer):
    """An optimizer as its sx id: a built-in's name or SX_OPTIM_* value, or a custom
    optimizer (sx.register_optimizer's result, its id or its name)."""
    if isinstance(optimizer, str) and optimizer.lower() in _OPTIMIZERS:
        return _OPTIMIZERS[optimizer.lower()]  # a built-in's name wins over a custom one's
    custom = _optimizers.lookup(optimizer)
    if custom is not None:
        return int(custom)
    if isinstance(optimizer, int) and not isinstance(optimizer, bool) and optimizer in _OPTIMIZERS.values():
        return int(optimizer)
    custom_names = sorted(o.name for o in _optimizers.registered_optimizers().values())
    raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                               f"optimizer must be one of {sorted(_OPTIMIZERS)} (or their SX_* values)"
                               + (f", or a registered custom optimizer {custom_names}" if custom_names else
                                  ", or a custom optimizer from sx.register_optimizer")
                               + f", not {optimizer!r}")


def _encode(what, text):
    if not isinstance(text, str):
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"{what} must be a str, not {type(text).__name__}")
    if "\0" in text:
        # C would read it only up to the NUL: another name than the one given.
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"{what} {text!r} holds a NUL character, which sx cannot take")
    return text.encode("utf-8")


def _dims(name, shape):
    """A param's shape as ints: each dimension an int (numpy's integers too), never a
    bool, a float or a string, which int() would quietly turn into another shape."""
    bad = InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                               f"add_param: shape of {name!r} must be a sequence of ints, not {shape!r}")
    if isinstance(shape, (str, bytes)):
        raise bad
    try:
        dims = list(shape)
    except TypeError:
        raise bad from None
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise bad
    return [int(d) for d in dims]


def _whole(what, value):
    """An int field of a descriptor: an int (numpy's integers too), never a bool or a
    float, which int() would quietly turn into another number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not -2**31 <= value < 2**31:
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"{what} must be an int, not {value!r}")
    return int(value)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one step reports: the global gradient norm before clipping, the number of
    steps the group has taken (this one included), whether it was skipped (inf/NaN
    gradients where they were checked, or no rank had data), the loss scale to multiply
    the next losses by (1 without loss scaling), and whether the norm was inf or NaN."""
    grad_norm: float
    step: int
    skipped: bool
    loss_scale: float
    nonfinite: bool = False


@dataclasses.dataclass(frozen=True)
class MemoryStats:
    """Bytes this rank holds, per category (sx_memory_stats_t). ``device_bytes``: of those
    (but staging and memory copies), the ones in a CUDA device's memory; 0 for CPU groups."""
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    staging_bytes: int
    unsharded_optimizer_bytes: int
    peak_param_bytes: int
    memory_copy_bytes: int = 0
    device_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ParamInfo:
    """A registered param, and (after finalize) where it lies: ``offset_in_unit`` in its
    unit's flat buffer, and ``[shard_begin, shard_end)`` of its own elements that this
    rank's shard covers."""
    index: int
    name: str
    shape: tuple
    dtype: int
    numel: int
    param_group: int
    unit: int
    trainable: bool
    offset_in_unit: int
    shard_begin: int
    shard_end: int


@dataclasses.dataclass
class ParamState:
    """One param's whole optimizer state (see gather_optim_state): its index, name, param
    group and step counts (``step``: torch's state["step"] of Adam/AdamW;
    ``momentum_steps``: SGD's updates that used momentum_buffer, 0 = never initialised;
    ``mu_product``: NAdam's torch state["mu_product"], 0 for other optimizers, and in a
    scatter 0 = derived from ``step``), and its tensors by torch's names ("exp_avg",
    "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer", "sum", "square_avg", "grad_avg",
    "exp_inf", "variance"; "master" for 16-bit params), each a 1-D float32 array of the
    param's numel elements, but Adafactor's factored moments of a param of shape
    [..., R, C]: "row_var", prod(shape[:-1]) values (torch's shape [..., R, 1]), and
    "col_var", prod(shape[:-2]) * C (torch's [..., 1, C])."""
    index: int
    name: str
    param_group: int
    step: int
    momentum_steps: int
    tensors: dict
    mu_product: float = 0.0


@dataclasses.dataclass(frozen=True)
class UnitInfo:
    """A unit's flat buffer: its length with and without padding, and this rank's shard."""
    unit: int
    num_params: int
    numel: int
    padded_numel: int
    shard_numel: int
    shard_begin: int
    trainable: bool
    has_optimizer_state: bool
    shard_size: int = 0
    shard_rank: int = 0
    replicas: int = 1
    replica_rank: int = 0


@dataclasses.dataclass(frozen=True)
class RegroupResult:
    """What ShardGroup.regroup decided: the new epoch, this rank's place before and
    after, the new mesh's shard size, the step the restored state is at, and whether it
    came from the ranks' memory copies (else from the checkpoint)."""
    epoch: int
    rank: int
    world_size: int
    shard_size: int
    previous_rank: int
    previous_world_size: int
    step: int
    from_memory: bool = False


class ShardGroup(Handle):
    """This rank's handle of a shard group.

    Creating one is collective: it blocks until every rank of ``world_size`` has joined
    through ``rendezvous`` ("local://NAME" for ranks that are threads of this process,
    "tcp://HOST:PORT", "file:///DIR" or "env://"). Then register param groups and
    params (the same on every rank, in the same order), call :meth:`finalize`, and
    train: write gradients into :meth:`grad_view` arrays and call :meth:`step`.

    ``backend``: "cpu", "cuda" or "auto" (CUDA where libsx has CUDA and finds a device,
    else the CPU). :meth:`param_view` and :meth:`grad_view` wrap host memory: a trainer
    that computes on the host asks for "cpu".

    ``transport``: how CPU ranks exchange. "auto": through shared memory where every
    rank of a communicator runs on this host (processes or threads), else Gloo's TCP
    (the environment variable SX_SHARED_MEMORY=0 has "auto" act as "tcp"); "tcp":
    Gloo's TCP always. Every rank passes the same; CUDA groups use NCCL whatever it
    says.

    Release it with :meth:`close` or a ``with`` block; a finalizer closes a forgotten
    one as a safety net. Views returned by the group point into memory it owns and must
    not be used after close. One thread uses a group at a time.

    Mixed precision: params added with dtype "bf16" or "f16" get fp32 master weights
    (none for bf16 params of a param group with bf16_stochastic_round).
    ``grad_dtype="f32"`` gives every param an fp32 gradient (default: the param's own
    dtype); ``reduce_dtype="f32"`` sums 16-bit gradients over ranks in fp32 (default: in
    their own dtype).

    Stage 3 shards the params too: a unit's params exist only between gather_unit() and
    release_unit(). ``prefetch_depth`` is how many units sx gathers ahead (0: 1; None:
    none).

    HSDP: ``shard_size`` ranks (a divisor of ``world_size``; 0: all of them) shard the
    model, and the ``world_size // shard_size`` groups of them replicate it;
    ``grad_predivide_factor`` divides 16-bit gradients before their sum (0: FSDP's
    factor for the shard group).

    The step timeline (docs/tracing.md): ``trace_path`` names the Chrome trace-event
    JSON file this rank writes ("%r" becomes the rank; without one, ".rank<N>" goes
    before ".json"); None: the SX_TRACE environment variable's, if set. ``trace_events``
    is the most events kept (0: 65536). The file is written by :meth:`flush_trace` and
    by close.

    Rendezvous security (tcp://, and env:// where rank 0 serves): ``rendezvous_token``
    is the secret every rank proves it holds before the store serves it (None: the
    SX_RENDEZVOUS_TOKEN environment variable); a wrong or missing one raises
    InvalidArgumentError. ``rendezvous_bind`` is where rank 0's server listens (None:
    SX_RENDEZVOUS_BIND, or the rendezvous host's address; "*": every interface).

    ``memory_copy_interval=N``: every N steps each rank keeps a copy of its shard of the
    state in host memory (and, in a flat group, sends it to the next rank), from which
    :meth:`regroup` restores the survivors without a checkpoint (docs/recovery.md);
    :class:`MemoryStats` ``memory_copy_bytes`` says what they hold. Any backend (a CUDA
    group's copies are in host memory too).
    ``memory_copy_wait=True``: a step that takes a copy returns once the next rank holds
    it, so that no step that returned is taken again after a loss
    (SX_GROUP_MEMORY_COPY_WAIT).

    ``offload=True`` (or SX_OFFLOAD_STATE): a CUDA group keeps its fp32 masters and optimizer
    state in pinned host memory, where sx's CPU kernels update them, so that every optimizer
    runs on it (SX_OFFLOAD_NONE or False: on its device); CPU groups ignore it.
    :class:`MemoryStats` ``device_bytes`` says what stays in the device's memory.

    ``join=True``: this process joins a running group on ``rendezvous`` (SX_GROUP_JOIN):
    it connects to nobody (``rank`` and ``world_size`` are ignored); register the params
    and param groups as the members have them, :meth:`finalize`, then :meth:`regroup`
    waits until the members admit it (their :meth:`poll_joiners` and ``regroup(admit=)``)
    and makes it a rank of their next group, with its state. With ``name`` (and no
    ``context``): it joins the group of that name made in the context on ``rendezvous``.

    ``openmp_threads=True``: in a process that runs an OpenMP runtime of its own (torch's
    libgomp), the optimizer work of this group's calls runs on the calling thread's OpenMP
    team instead of the group's own pool, whose threads would compete with the host's
    spinning workers for the processors (SX_GROUP_OPENMP_THREADS; docs/threads.md).
    Without such a runtime loaded, UnsupportedError. :mod:`sx.torch` sets it where torch's
    parallel backend is OpenMP.

    ``reserve_checkpoint_staging=True``: finalize reserves the memory the checkpoint
    saves stage this rank's shard in, so that the first save blocks no longer than the
    later ones (SX_GROUP_RESERVE_CHECKPOINT_STAGING).

    ``context=ctx, name="..."``: the group is made in an :class:`sx.Context` (see
    :meth:`sx.Context.group`), under a name every rank passes and no live group of the
    context has (InvalidStateError otherwise). It takes the context's rendezvous, ranks,
    backend, pool, timeout and transport: leave those arguments out (``rank`` and
    ``world_size`` then default to the context's; without a context, to 0 and 1). The
    group keeps the context alive: it may be closed before its groups.
    """

    def __init__(self, rendezvous=None, rank=None, world_size=None, *, stage=0, backend="auto",
                 num_threads=0, alignment=0, timeout_ms=0, trainable_autodetect=True,
                 reserve_checkpoint_staging=False,
                 bind_address=None, device_ordinal=0, grad_dtype=None, reduce_dtype=None,
                 prefetch_depth=0, shard_size=0, grad_predivide_factor=0.0, trace_path=None,
                 trace_events=0, rendezvous_token=None, rendezvous_bind=None, transport="auto",
                 memory_copy_interval=0, memory_copy_wait=False, join=False, offload=False,
                 context=None, name=None, openmp_threads=False):
        cfg = _lib.init_struct(_lib.sx_group_config_t)
        if context is None:
            if rendezvous is None:
                raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                           "rendezvous is required for a group made without a context")
            rank = 0 if rank is None else rank
            world_size = 1 if world_size is None else world_size
        else:
            # The context's: borrowed for the call (the context lives while its groups do).
            handle = context.handle if isinstance(context, Handle) else None
            if not isinstance(handle, _lib.sx_context_p):
                raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                           f"context must be an sx.Context, not {type(context).__name__}")
            cfg.context = handle
        if name is not None:
            cfg.name = _encode("name", name)
        if rendezvous is not None:
            cfg.rendezvous = _encode("rendezvous", rendezvous)
        cfg.rank, cfg.world_size, cfg.stage = rank or 0, world_size or 0, stage
        cfg.backend = _choice("backend", backend, _BACKENDS)
        cfg.transport = _choice("transport", transport, _TRANSPORTS)
        cfg.num_threads, cfg.alignment, cfg.timeout_ms = num_threads, alignment, timeout_ms
        cfg.flags = 0 if trainable_autodetect else _lib.SX_GROUP_NO_TRAINABLE_AUTODETECT
        if reserve_checkpoint_staging:
            cfg.flags |= _lib.SX_GROUP_RESERVE_CHECKPOINT_STAGING
        if join:
            cfg.flags |= _lib.SX_GROUP_JOIN
        if memory_copy_wait:
            cfg.flags |= _lib.SX_GROUP_MEMORY_COPY_WAIT
        if openmp_threads:
            cfg.flags |= _lib.SX_GROUP_OPENMP_THREADS
        if bind_address is not None:
            cfg.bind_address = _encode("bind_address", bind_address)
        cfg.device_ordinal = device_ordinal
        if grad_dtype is not None:
            cfg.grad_dtype = _choice("grad_dtype", grad_dtype, _DTYPES)
        if reduce_dtype is not None:
            cfg.reduce_dtype = _choice("reduce_dtype", reduce_dtype, _DTYPES)
        cfg.prefetch_depth = -1 if prefetch_depth is None else prefetch_depth
        cfg.shard_size, cfg.grad_predivide_factor = shard_size, grad_predivide_factor
        if trace_path is not None:
            cfg.trace_path = _encode("trace_path", os.fspath(trace_path))
        cfg.trace_events = trace_events
        if rendezvous_token is not None:
            cfg.rendezvous_token = _encode("rendezvous_token", rendezvous_token)
        if rendezvous_bind is not None:
            cfg.rendezvous_bind = _encode("rendezvous_bind", rendezvous_bind)
        cfg.memory_copy_interval = memory_copy_interval
        cfg.offload = int(offload) if isinstance(offload, bool) else _whole("offload", offload)
        self._group_optimizers = {}  # param group index -> optimizer id, as added here
        handle = _lib.sx_shard_group_p()
        check(lib.sx_create_shard_group(ctypes.byref(cfg), ctypes.byref(handle)))
        self._own(handle, lib.sx_destroy_shard_group)

    # -- lifetime (close, closed, handle, with: see Handle) ------------------------------
    def close(self):
        """Releases the group and everything it owns. Idempotent. Every view obtained
        from the group is invalid afterwards."""
        super().close()

    def __repr__(self):
        if self.closed:
            return "<sx.ShardGroup closed>"
        return f"<sx.ShardGroup rank {self.rank} of {self.world_size}>"

    def flush_trace(self):
        """Writes this rank's trace file now (replacing it atomically) with every event
        the ring holds; nothing without a trace. SxIOError naming the file
        if it cannot be written. Any thread."""
        check(lib.sx_trace_flush(self.handle))

    def abort(self):
        """Makes the group fail: collectives in flight on other threads return
        AbortedError, later calls GroupFailedError. Any thread."""
        check(lib.sx_abort(self.handle))

    def poll_joiners(self):
        """Collective: how many processes wait to join the group (``join=True`` on its
        rendezvous) and were not admitted yet, the same number on every rank. Admit them
        with ``regroup(admit=n)`` on every member at the same step."""
        waiting = ctypes.c_int32(0)
        check(lib.sx_poll_joiners(self.handle, ctypes.byref(waiting)))
        return waiting.value

    def lost_ranks(self):
        """The ranks (ascending) whose process is known to have exited: a peer on this
        host whose process has gone. Peers on other hosts are known only through the text
        of the errors their loss causes. After a failure, ``expected_world_size =
        world_size - len(lost_ranks())`` lets :meth:`regroup` close without waiting for
        its window. Any thread, a failed group too."""
        count = ctypes.c_int32(0)
        check(lib.sx_get_lost_ranks(self.handle, None, 0, ctypes.byref(count)))
        while True:  # (another may be lost between the two calls: then again, with room for it)
            capacity = count.value
            ranks = (ctypes.c_int32 * max(capacity, 1))()
            check(lib.sx_get_lost_ranks(self.handle, ranks, capacity, ctypes.byref(count)))
            if count.value <= capacity:
                return list(ranks[:count.value])

    def regroup(self, checkpoint=None, *, join_window_ms=0, expected_world_size=0, admit=0, params_only=False,
                allow_missing=False, allow_extra=False):
        """Collective over the ranks still alive, after a call failed because a peer was
        lost (CommError, TimeoutError) or after abort(): they form a new group of
        themselves at the next epoch, on the same rendezvous, and this object becomes
        it. Its state comes from the ranks' memory copies where the group keeps them
        (``memory_copy_interval``) and they still hold every shard, else from the
        checkpoint at ``checkpoint`` (resharded, as load() does; None: there is none,
        which fails where the copies cannot serve). The survivors wait for each other until
        ``expected_world_size`` of them arrived, or (0) every rank has arrived or is known to
        be lost, or ``join_window_ms`` (0: 1000) has passed; ``admit`` joining processes (what
        :meth:`poll_joiners` returned) take the ranks after theirs. A joining group's regroup
        waits to be admitted. Every view taken before is
        invalid afterwards. The rendezvous store must outlive the lost ranks (the
        sx-rendezvous command: "tcp://HOST:PORT?server=external"; file://; torchrun's).
        Returns a :class:`RegroupResult`; go on from the step after its ``step``. Where it
        raises, this object is still the broken group, and the survivors may call regroup
        again (a new epoch)."""
        from .checkpoint import _path
        options = _lib.init_struct(_lib.sx_regroup_options_t)
        if checkpoint is not None:
            options.checkpoint = _path("regroup", checkpoint)
        options.load_flags = ((_lib.SX_LOAD_PARAMS_ONLY if params_only else 0)
                              | (_lib.SX_LOAD_ALLOW_MISSING if allow_missing else 0)
                              | (_lib.SX_LOAD_ALLOW_EXTRA if allow_extra else 0))
        options.join_window_ms = join_window_ms
        options.expected_world_size = expected_world_size
        options.admit = admit
        result = _lib.init_struct(_lib.sx_regroup_result_t)
        check(lib.sx_regroup(self.handle, ctypes.byref(options), ctypes.byref(result)))
        return RegroupResult(epoch=result.epoch, rank=result.rank, world_size=result.world_size,
                             shard_size=result.shard_size, previous_rank=result.previous_rank,
                             previous_world_size=result.previous_world_size, step=result.step,
                             from_memory=bool(result.from_memory))

    # -- registration -----------------------------------------------------------------
    def add_param_group(self, optimizer="adamw", *, betas=None, ns_coefficients=None, **hyperparameters):
        """Adds a param group and returns its index. ``optimizer`` is "sgd", "adam",
        "adamw", "adagrad", "rmsprop", "adamax", "nadam", "radam", "lion", "lamb", "muon",
        "adafactor" (these three: CPU groups, or CUDA groups with ``offload``; Muon takes 2-D
        params only) or
        "ademamix", or
        a custom optimizer (what sx.register_optimizer returned, or its name); unspecified
        hyperparameters take the optimizer's defaults (torch.optim's; lion-pytorch's for
        Lion; pytorch-optimizer's for LAMB; a custom optimizer's registered ones).
        Keywords: lr, weight_decay, betas=(beta1, beta2) or beta1/beta2, eps, momentum,
        dampening, nesterov, maximize, amsgrad (Adam/AdamW), lr_decay and
        initial_accumulator_value (Adagrad), alpha and centered (RMSprop), momentum_decay
        (NAdam), decoupled_weight_decay (NAdam, RAdam, LAMB; LAMB's is on by default,
        pytorch-optimizer's weight_decouple), ns_coefficients=(a, b, c) or ns_a/ns_b/ns_c,
        ns_steps and adjust_lr_fn (Muon, as torch names them: adjust_lr_fn None,
        "original", "match_rms_adamw" or "spectral_unclamped", or adjust_lr as an
        SX_MUON_ADJUST_LR_* value), beta2_decay, eps=(eps1, eps2) or eps/eps2, and d
        (Adafactor, as torch names them; an eps1 of None is fp32's machine epsilon, 2^-23),
        betas=(beta1, beta2, beta3) or beta3, alpha and t_alpha_beta3 (AdEMAMix, as
        pytorch-optimizer names them; a t_alpha_beta3 of None or 0: no warmup),
        state_dtype ("fp32", "bf16" or "8bit", or an SX_STATE_* value: how the
        elementwise optimizers keep their state on CPU groups; "8bit" is torchao's
        AdamW8bit's block-wise quantization), bf16_stochastic_round (torchao's: the
        group's params, all bf16, keep no fp32 masters; each update is rounded
        stochastically into them), and a custom optimizer's own
        hyperparameters by name.
        One that does not apply to the optimizer must keep its default or be 0, which
        means the default (else InvalidArgumentError)."""
        kind = _optimizer_kind(optimizer)
        custom = _optimizers.lookup(kind)
        desc = _lib.init_struct(_lib.sx_param_group_desc_t, kind)
        if betas is not None:  # AdEMAMix's are (beta1, beta2, beta3)
            hyperparameters.update(zip(("beta1", "beta2", "beta3"), betas))
        if "t_alpha_beta3" in hyperparameters and hyperparameters["t_alpha_beta3"] is None:
            hyperparameters["t_alpha_beta3"] = 0.0  # pytorch-optimizer's None: no warmup
        if ns_coefficients is not None:
            hyperparameters["ns_a"], hyperparameters["ns_b"], hyperparameters["ns_c"] = ns_coefficients
        if "adjust_lr_fn" in hyperparameters:
            hyperparameters["adjust_lr"] = hyperparameters.pop("adjust_lr_fn")
        if isinstance(hyperparameters.get("eps"), (tuple, list)):  # torch.optim.Adafactor's (eps1, eps2)
            eps1, hyperparameters["eps2"] = hyperparameters["eps"]
            hyperparameters["eps"] = _ADAFACTOR_EPS1 if eps1 is None else eps1
        own = {}  # a custom optimizer's own hyperparameters: set once the group exists
        for key, value in hyperparameters.items():
            if key in _FLOAT_FIELDS:
                setattr(desc, key, float(value))
            elif key in _FLAG_FIELDS:
                setattr(desc, key, 1 if value else 0)
            elif key in _INT_FIELDS:
                setattr(desc, key, _whole(f"add_param_group: {key}", value))
            elif key == "state_dtype":
                setattr(desc, key, _choice(key, value, _STATE_DTYPES))
            elif key in _ENUM_FIELDS:
                setattr(desc, key, _adjust_lr(value))
            elif custom is not None and key in custom.own_hyperparameters:
                own[key] = self._own_value(custom, key, value)
            else:
                extra = tuple(custom.own_hyperparameters) if custom is not None else ()
                known = _FLOAT_FIELDS + _FLAG_FIELDS + _INT_FIELDS + _ENUM_FIELDS + extra
                raise InvalidArgumentError(
                    _lib.SX_ERR_INVALID_ARGUMENT,
                    f"add_param_group: unknown hyperparameter {key!r}; expected one of "
                    f"{sorted(known + ('betas', 'ns_coefficients', 'adjust_lr_fn'))}")
        index = ctypes.c_int32()
        check(lib.sx_add_param_group(self.handle, ctypes.byref(desc), ctypes.byref(index)))
        self._group_optimizers[index.value] = kind
        for key, value in own.items():
            check(lib.sx_set_hyperparameter(self.handle, index.value, custom.hyperparameter_key(key), value))
        return index.value

    @staticmethod
    def _own_value(custom, key, value):
        """A custom optimizer's own hyperparameter checked before the group is added, so
        that a refused value adds no group."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"add_param_group: {custom.name}'s {key} must be a finite number, "
                                       f"not {value!r}")
        spec = next(h for h in custom.hyperparameters if h.name == key)
        if (spec.min, spec.max) != (0.0, 0.0) and not spec.min <= value <= spec.max:
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"add_param_group: {custom.name}'s {key} is {value!r}, outside "
                                       f"[{spec.min!r}, {spec.max!r}]")
        return float(value)

    def add_param(self, name, shape, *, param_group=0, unit=0, dtype="f32", frozen=False,
                  split=None, replica=None):
        """Registers a param (same on every rank, same order) and returns its index.

        Placement (docs/model-parallel.md): ``split=(global_shape, dim, offset)`` declares
        the param the piece [offset, offset + shape[dim]) on dimension `dim` of a logical
        tensor of `global_shape`; ``replica=(index, count)`` one of `count` identical
        copies, of which copy 0 alone counts in a norm domain's gradient norm."""
        dims = _dims(name, shape)
        desc = _lib.init_struct(_lib.sx_param_desc_t)
        desc.name = _encode("name", name)
        desc.ndim = len(dims)
        c_shape = (ctypes.c_int64 * max(len(dims), 1))(*dims)  # borrowed for the call: sx copies it
        desc.shape = ctypes.cast(c_shape, ctypes.POINTER(ctypes.c_int64))
        desc.dtype = _choice("dtype", dtype, _DTYPES)
        desc.param_group, desc.unit, desc.frozen = param_group, unit, 1 if frozen else 0
        if split is not None:
            global_shape, desc.split_dim, desc.split_offset = split
            c_global = (ctypes.c_int64 * max(len(global_shape), 1))(*global_shape)
            desc.placement = _lib.SX_PLACEMENT_SPLIT
            desc.global_shape = ctypes.cast(c_global, ctypes.POINTER(ctypes.c_int64))
        if replica is not None:
            desc.placement = _lib.SX_PLACEMENT_REPLICATED
            desc.replica, desc.replicas = replica
        index = ctypes.c_int32()
        check(lib.sx_add_param(self.handle, ctypes.byref(desc), ctypes.byref(index)))
        return index.value

    def join_norm_domain(self, domain, slice):
        """Collective over the domain: joins this group to `domain` (an
        :class:`sx.NormDomain`) as model-parallel slice `slice`; from then on each step's
        gradient norm, non-finite check and loss-scale decision are taken over every
        group of the domain (docs/model-parallel.md). The group keeps the domain alive."""
        check(lib.sx_join_norm_domain(self.handle, domain.handle, slice))

    def finalize(self):
        """Collective: checks every rank registered the same table, lays out and
        allocates the flat buffers (params and grads start at zero)."""
        check(lib.sx_finalize(self.handle))

    def broadcast_params(self, root=0):
        """Collective: copies every param of rank `root` to all ranks."""
        check(lib.sx_broadcast_params(self.handle, root))

    def all_reduce(self, values, op="sum"):
        """Collective: the trainer's own numbers (a loss, token counts) combined over the
        ranks: `op` "sum", "mean", "max" or "min" of every rank's value, element by element
        (sums in rank order: the same on every rank; NaN wins). `values` is a number or a
        sequence of at most SX_MAX_ALL_REDUCE numbers; returns the same shape (a float, or
        a list of floats). Every rank passes the same op and count."""
        single = isinstance(values, numbers.Real)
        seq = [values] if single else values
        if isinstance(seq, (str, bytes)) or not all(
                isinstance(v, numbers.Real) and not isinstance(v, bool) for v in seq):
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"all_reduce: values must be numbers, not {values!r}")
        n = len(seq)
        c_values = (ctypes.c_double * max(n, 1))(*[float(v) for v in seq])
        check(lib.sx_all_reduce(self.handle, c_values, n, _choice("op", op, _REDUCE_OPS)))
        out = [c_values[i] for i in range(n)]
        return out[0] if single else out

    # -- hyperparameters --------------------------------------------------------------
    def _hp_key(self, param_group, key):
        """A hyperparameter key: sx's name or SX_HP_* value, a custom optimizer's own name
        (of the optimizer this handle added `param_group` with), or SX_HP_CUSTOM + i."""
        if isinstance(key, str) and key.lower() not in _HYPERPARAMETERS:
            custom = _optimizers.lookup(self._group_optimizers.get(param_group))
            if custom is not None and key in custom.own_hyperparameters:
                return custom.hyperparameter_key(key)
        if isinstance(key, int) and not isinstance(key, bool) and key >= _lib.SX_HP_CUSTOM:
            return key  # sx checks it against the group's optimizer
        return _choice("hyperparameter", key, _HYPERPARAMETERS)

    def set_hyperparameter(self, param_group, key, value):
        """Sets one hyperparameter ("lr", "beta1", ... or an SX_HP_* value; a custom
        optimizer's own by name or as SX_HP_CUSTOM + i) of a param group, from the next
        step on. Muon's "adjust_lr" takes torch's adjust_lr_fn names too."""
        k = self._hp_key(param_group, key)
        if k == _lib.SX_HP_ADJUST_LR and (value is None or isinstance(value, str)):
            value = _adjust_lr(value)
        check(lib.sx_set_hyperparameter(self.handle, param_group, k, float(value)))

    def get_hyperparameter(self, param_group, key):
        k = self._hp_key(param_group, key)
        value = ctypes.c_double()
        check(lib.sx_get_hyperparameter(self.handle, param_group, k, ctypes.byref(value)))
        return value.value

    def set_lr(self, param_group, lr):
        check(lib.sx_set_lr(self.handle, param_group, float(lr)))

    def param_group_steps(self, param_group):
        """The steps param group `param_group` took since it was added (LAMB's and
        AdEMAMix's bias corrections count them; a skipped step does not)."""
        steps = ctypes.c_int64()
        check(lib.sx_get_param_group_steps(self.handle, param_group, ctypes.byref(steps)))
        return steps.value

    # -- params and views -------------------------------------------------------------
    def param_index(self, name):
        """The index of the param called `name` (NotFoundError if none)."""
        index = ctypes.c_int32()
        check(lib.sx_find_param(self.handle, _encode("name", name), ctypes.byref(index)))
        return index.value

    def _index(self, param):
        if isinstance(param, str):
            return self.param_index(param)
        if isinstance(param, int) and not isinstance(param, bool):
            return param
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"param must be a name (str) or an index (int), not {param!r}")

    def raw_view(self, param, grad=False):
        """The sx_view_t of a param's values (or gradient): data pointer, numel, dtype,
        device. Use it for device memory, which param_view cannot wrap."""
        view = _lib.init_struct(_lib.sx_view_t)
        fn = lib.sx_grad_view if grad else lib.sx_param_view
        check(fn(self.handle, self._index(param), ctypes.byref(view)))
        return view

    def _array(self, param, grad):
        index = self._index(param)
        return self._host_array(self.raw_view(index, grad), self.param_info(index).shape,
                                f"param {index}", "raw_view()")

    def _host_array(self, view, shape, what, raw):
        """A zero-copy host array over `view`, shaped `shape`; device memory refused."""
        if view.device != _lib.SX_DEVICE_CPU:
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED,
                                   f"{what} lives in device memory, which cannot be "
                                   f"wrapped as a host array; use {raw}")
        itemsize, fmt, npdtype = _views.DTYPES[view.dtype]
        return _views.wrap(view.data, view.numel, itemsize, fmt, npdtype, shape, self)

    def param_view(self, param):
        """The param's values (by name or index) as a zero-copy array shaped like the
        param: a numpy array when numpy is available, else a memoryview. Read in
        forward; write only between steps. Invalid after close(). A bf16 param's
        elements are their raw uint16 bits (fp16: numpy float16, or raw bits without
        numpy); the step overwrites them with its fp32 masters rounded."""
        return self._array(param, grad=False)

    def grad_view(self, param):
        """The param's gradient as a zero-copy array: backward ADDS into it; sx zeroes
        it after each step (unless keep_grads). Invalid after close()."""
        return self._array(param, grad=True)

    def raw_unit_view(self, unit, grad=False):
        """The sx_view_t of unit `unit`'s whole flat buffer of params (or gradients)."""
        view = _lib.init_struct(_lib.sx_view_t)
        check(lib.sx_unit_view(self.handle, unit, 1 if grad else 0, ctypes.byref(view)))
        return view

    def unit_view(self, unit, grad=False):
        """Unit `unit`'s whole flat buffer (its params, or with `grad` its gradients) as
        one zero-copy 1-D array of unit_info(unit).padded_numel elements: each param at
        its param_info().offset_in_unit, in registration order. With alignment=1 the
        params are packed, so a trainer that keeps them in one array has exactly it. The
        rules of param_view and grad_view hold."""
        view = self.raw_unit_view(unit, grad)
        return self._host_array(view, (view.numel,), f"unit {unit}", "raw_unit_view()")

    def param_info(self, param):
        """A :class:`ParamInfo` for a param (by name or index)."""
        index = self._index(param)
        info = _lib.init_struct(_lib.sx_param_info_t)
        check(lib.sx_get_param_info(self.handle, index, ctypes.byref(info)))
        return ParamInfo(index=index, name=info.name.decode("utf-8"),
                         shape=tuple(info.shape[:info.ndim]), dtype=info.dtype,
                         numel=info.numel, param_group=info.param_group, unit=info.unit,
                         trainable=bool(info.trainable), offset_in_unit=info.offset_in_unit,
                         shard_begin=info.shard_begin, shard_end=info.shard_end)

    def params(self):
        """ParamInfo of every param, in registration order."""
        return [self.param_info(i) for i in range(self.num_params)]

    def unit_info(self, index):
        """A :class:`UnitInfo` for unit number `index` (0..num_units-1, by unit id)."""
        info = _lib.init_struct(_lib.sx_unit_info_t)
        check(lib.sx_get_unit_info(self.handle, index, ctypes.byref(info)))
        return UnitInfo(unit=info.unit, num_params=info.num_params, numel=info.numel,
                        padded_numel=info.padded_numel, shard_numel=info.shard_numel,
                        shard_begin=info.shard_begin, trainable=bool(info.trainable),
                        has_optimizer_state=bool(info.has_optimizer_state),
                        shard_size=info.shard_size, shard_rank=info.shard_rank,
                        replicas=info.replicas, replica_rank=info.replica_rank)

    # -- trainability -----------------------------------------------------------------
    def set_trainable(self, param, trainable=True):
        check(lib.sx_set_trainable(self.handle, self._index(param), 1 if trainable else 0))

    def is_trainable(self, param):
        value = ctypes.c_int32()
        check(lib.sx_get_trainable(self.handle, self._index(param), ctypes.byref(value)))
        return bool(value.value)

    def trainable_mask(self):
        """The group-owned mask (one uint8 per param, 1 = trainable) as a zero-copy
        array; flipping its bytes freezes or unfreezes params from the next step."""
        mask, count = ctypes.POINTER(ctypes.c_uint8)(), ctypes.c_int32()
        check(lib.sx_trainable_mask(self.handle, ctypes.byref(mask), ctypes.byref(count)))
        address = ctypes.cast(mask, ctypes.c_void_p).value
        return _views.wrap(address, count.value, 1, "B", "uint8", (count.value,), self)

    def refresh_trainable(self):
        """Applies the mask now (needed only with trainable_autodetect=False)."""
        check(lib.sx_refresh_trainable(self.handle))

    # -- the step ---------------------------------------------------------------------
    def accumulate_grads(self):
        """Collective: folds this micro-batch's gradients into the step's accumulation."""
        check(lib.sx_accumulate_grads(self.handle))

    def step(self, max_grad_norm=0.0, keep_grads=False, stream=None, defer_gather=False, weight=None,
             nonfinite="default"):
        """Collective: averages gradients over ranks, clips the global norm to
        `max_grad_norm` (0: no clipping), updates this rank's shard and gathers the
        params. Grads are zeroed afterwards unless `keep_grads`. `stream` is a CUDA
        stream as an int address (None: the group's own). `defer_gather` (stages 1 and
        2): the params are gathered in the background, and gather_unit(u) waits for
        unit u's. `weight` (uneven inputs; every rank passes one or none): the gradients
        are sums over this rank's `weight` samples, and the step divides their sum over
        the ranks by the sum of the weights; 0 = this rank had no data (its gradients
        stay zero). `nonfinite`: what inf or NaN gradients do: "default" (where the norm
        is needed first, for clipping or dynamic loss scaling, the step is skipped on
        every rank; otherwise they reach the params, as in torch), "skip" (always
        checked, and skipped) or "error" (as "skip", then raises NonFiniteError).
        Returns a StepResult."""
        options = _lib.init_struct(_lib.sx_step_options_t)
        options.max_grad_norm = float(max_grad_norm)
        options.keep_grads = 1 if keep_grads else 0
        options.defer_gather = 1 if defer_gather else 0
        options.stream = stream
        if weight is not None:
            options.weighted, options.weight = 1, float(weight)
        options.nonfinite = _choice("nonfinite", nonfinite, _NONFINITE)
        result = _lib.init_struct(_lib.sx_step_result_t)
        status = lib.sx_step(self.handle, ctypes.byref(options), ctypes.byref(result))
        try:
            check(status)
        except OptimizerError as e:  # a custom update failed: chain what it raised, if it did
            for kind in set(self._group_optimizers.values()):
                custom = _optimizers.lookup(kind)
                cause = custom._take_failure() if custom is not None else None
                if cause is not None:
                    raise e from cause
            raise
        return StepResult(grad_norm=result.grad_norm, step=result.step,
                          skipped=bool(result.skipped), loss_scale=result.loss_scale,
                          nonfinite=bool(result.nonfinite))

    # -- whole optimizer state ------------------------------------------------------------
    def gather_optim_state(self, root=0, fn=None):
        """Collective: every param's whole optimizer state onto rank `root`, one param at a
        time (ZeroRedundancyOptimizer.consolidate_state_dict). With `fn`, root calls
        ``fn(state)`` with a :class:`ParamState` whose arrays are zero-copy and valid only
        during the call (the root never holds more than one param's state); without,
        root returns the list of every param's ParamState, copied. Other ranks return
        None. An exception in fn ends the gather on every rank, and is raised on root."""
        if root == self.rank:
            kept, callback = [], fn
            if callback is None:
                def callback(state):
                    state.tensors = {k: v.copy() for k, v in state.tensors.items()}
                    kept.append(state)
            trampoline, failure = self._state_trampoline(callback, fill=False)
        else:
            kept, trampoline, failure = None, ctypes.cast(None, _lib.sx_param_state_fn), [None]
        status = lib.sx_gather_optim_state(self.handle, root, trampoline, None)
        if failure[0] is not None:
            raise failure[0]
        check(status)
        return kept if fn is None else None

    def scatter_optim_state(self, states, root=0):
        """Collective, the reverse of gather_optim_state: rank `root` gives every param's
        whole state and every rank's shard takes its part (any world size and stage);
        nothing changes unless it all succeeds. On root, `states` is either a callable
        ``fn(state)`` that fills a :class:`ParamState` (zero tensors of the param's
        optimizer, to write in place, and its step counts) or a mapping from param name
        (or index) to a ParamState-like object or a dict with "step", "momentum_steps",
        "mu_product" (NAdam; 0 or missing: derived from the step) and "tensors" (missing
        tensors and params are zero state). Other ranks pass
        None."""
        if root == self.rank:
            if states is None:
                def fill(_state):  # the others are in the collective already: fail it for all
                    raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                               "scatter_optim_state: the root gave no states")
            else:
                fill = states if callable(states) else self._filler(states)
            trampoline, failure = self._state_trampoline(fill, fill=True)
        else:
            trampoline, failure = ctypes.cast(None, _lib.sx_param_state_fn), [None]
        status = lib.sx_scatter_optim_state(self.handle, root, trampoline, None)
        if failure[0] is not None:
            raise failure[0]
        check(status)

    @staticmethod
    def _filler(states):
        def fill(state):
            given = states.get(state.name, states.get(state.index)) if hasattr(states, "get") else None
            if given is None:
                return
            get = given.get if isinstance(given, dict) else lambda k, d=None: getattr(given, k, d)
            state.step = int(get("step", 0))
            state.momentum_steps = int(get("momentum_steps", 0))
            state.mu_product = float(get("mu_product", 0.0))
            for name, values in (get("tensors", None) or {}).items():
                if name in state.tensors:
                    state.tensors[name][...] = _views.np.asarray(values, dtype="float32").reshape(-1)
        return fill

    def _state_trampoline(self, fn, fill):
        """A C callback over fn(ParamState); a Python exception is kept and ends the
        operation (its type and words are raised once sx returns)."""
        if not _views.HAVE_NUMPY:
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED, "whole optimizer state needs numpy")
        np = _views.np
        failure = [None]
        numels_end = _lib.sx_param_state_t.tensor_numels.offset + ctypes.sizeof(ctypes.c_void_p)

        def trampoline(raw, _user):
            try:
                st = raw.contents
                # Each tensor's own length (Adafactor's row_var and col_var are not the
                # param's numel); numel where sx gives none.
                numels = st.tensor_numels if st.struct_size >= numels_end and st.tensor_numels else None
                tensors = {}
                for t in range(st.num_tensors):
                    n = numels[t] if numels else st.numel
                    address = ctypes.cast(st.tensors[t], ctypes.c_void_p).value
                    buf = (ctypes.c_float * n).from_address(address)
                    tensors[st.tensor_names[t].decode("utf-8")] = np.frombuffer(buf, dtype=np.float32)
                state = ParamState(index=st.param, name=st.name.decode("utf-8"), param_group=st.param_group,
                                   step=st.step, momentum_steps=st.momentum_steps, tensors=tensors,
                                   mu_product=st.mu_product)
                fn(state)
                if fill:
                    st.step, st.momentum_steps = int(state.step), int(state.momentum_steps)
                    st.mu_product = float(state.mu_product)
                return _lib.SX_OK
            except BaseException as e:  # noqa: B036  (nothing may unwind into C)
                failure[0] = e
                return _lib.SX_ERR_CANCELLED

        c_fn = _lib.sx_param_state_fn(trampoline)
        return c_fn, failure

    def state_view(self, param, tensor):
        """This rank's own part of a param's optimizer-state tensor ("exp_avg", ...,
        "master") as a zero-copy 1-D array: the param's elements [shard_begin, shard_end)
        of param_info(). float32 for fp32 state; packed state in its own dtype: a bf16
        slot's raw bits as uint16, an 8-bit slot's codes as uint8, whose block scales are
        the float32 tensor "<slot>.scale" (one per 256 elements). Read it, or write it
        between steps to seed state. Invalid after a load or scatter_optim_state."""
        view = _lib.init_struct(_lib.sx_view_t)
        check(lib.sx_state_view(self.handle, self._index(param), _encode("tensor", tensor), ctypes.byref(view)))
        if view.device != _lib.SX_DEVICE_CPU:
            raise UnsupportedError(_lib.SX_ERR_UNSUPPORTED, "the state lives in device memory; use raw views")
        itemsize, fmt, npdtype = _views.DTYPES[view.dtype]
        if view.numel == 0:
            return _views.np.zeros(0, dtype=npdtype) if _views.HAVE_NUMPY else memoryview(b"").cast(fmt)
        return _views.wrap(view.data, view.numel, itemsize, fmt, npdtype, (view.numel,), self)

    # -- units as a pipeline -------------------------------------------------------------
    def unit_grads_ready(self, unit, *, accumulate=False, stream=None):
        """Says that unit `unit`'s gradients are complete for this micro-batch (from the
        backward, in any unit order); sx reduces them on its own thread while the
        backward goes on. `accumulate`: an intermediate micro-batch (accumulate_grads
        ends it). `stream`: the CUDA stream the gradients were written on."""
        options = _lib.init_struct(_lib.sx_unit_ready_options_t)
        options.accumulate = 1 if accumulate else 0
        options.stream = stream
        check(lib.sx_unit_grads_ready(self.handle, unit, ctypes.byref(options)))

    def gather_unit(self, unit):
        """Stage 3 (collective): makes unit `unit`'s params present until release_unit.
        Stages 1 and 2: waits for the unit's gather after a step with defer_gather."""
        check(lib.sx_unit_gather(self.handle, unit))

    def release_unit(self, unit):
        """Stage 3: ends a gather_unit; this rank keeps only its shard. Else nothing."""
        check(lib.sx_unit_release(self.handle, unit))

    @contextlib.contextmanager
    def unit(self, unit):
        """``with group.unit(u):`` gathers unit u around the block and releases it."""
        self.gather_unit(unit)
        try:
            yield
        finally:
            if not self.closed:
                self.release_unit(unit)

    def set_loss_scaling(self, mode="dynamic", *, init_scale=None, growth_factor=None,
                         backoff_factor=None, growth_interval=None):
        """Sets loss scaling, with torch.cuda.amp.GradScaler's semantics, and resets the
        scale to `init_scale`. `mode` is "dynamic" (skip steps with inf/NaN gradients,
        multiply the scale by `backoff_factor` then, and by `growth_factor` after
        `growth_interval` good steps in a row), "static" (divide by `init_scale`, never
        skip) or "none". Options left None take GradScaler's defaults: init_scale 65536,
        growth_factor 2, backoff_factor 0.5, growth_interval 2000. Between steps; every
        rank the same."""
        scaling = _lib.init_struct(_lib.sx_loss_scaling_t)
        scaling.mode = _choice("loss scaling mode", mode, _LOSS_SCALING_MODES)
        for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor),
                            ("backoff_factor", backoff_factor)):
            if value is not None:
                setattr(scaling, name, float(value))
        if growth_interval is not None:
            scaling.growth_interval = growth_interval
        check(lib.sx_set_loss_scaling(self.handle, ctypes.byref(scaling)))

    @property
    def loss_scale(self):
        """What the next losses are to be multiplied by before backward (1.0 without loss
        scaling); step() divides the gradients by it."""
        value = ctypes.c_double()
        check(lib.sx_get_loss_scale(self.handle, ctypes.byref(value)))
        return value.value

    # -- queries ----------------------------------------------------------------------
    def _int_query(self, fn):
        value = ctypes.c_int32()
        check(fn(self.handle, ctypes.byref(value)))
        return value.value

    rank = property(lambda self: self._int_query(lib.sx_get_rank), doc="This rank.")
    world_size = property(lambda self: self._int_query(lib.sx_get_world_size),
                          doc="Number of ranks.")
    stage = property(lambda self: self._int_query(lib.sx_get_stage), doc="ZeRO stage.")
    num_params = property(lambda self: self._int_query(lib.sx_get_num_params),
                          doc="Registered params.")
    num_units = property(lambda self: self._int_query(lib.sx_get_num_units), doc="Units.")
    num_param_groups = property(lambda self: self._int_query(lib.sx_get_num_param_groups),
                                doc="Param groups.")

    def memory_stats(self):
        """A :class:`MemoryStats` of this rank (after finalize)."""
        stats = _lib.init_struct(_lib.sx_memory_stats_t)
        check(lib.sx_get_memory_stats(self.handle, ctypes.byref(stats)))
        return MemoryStats(**{name: getattr(stats, name)
                              for name, _ in stats._fields_ if name != "struct_size"})

    # -- checkpoints (see checkpoint.py) ----------------------------------------------
    def save(self, path, user_blob=b"", *, keep_last=0, synchronous=False, callback=None):
        """Collective: saves this step boundary's state to the new directory `path`.
        Returns a :class:`sx.Future` once this rank's shard is snapshotted; training
        may go on while files are written. `callback(future, status)` runs once on
        sx's I/O thread when the save completes; it must be quick and must not call
        the group."""
        from .checkpoint import save
        return save(self, path, user_blob, keep_last=keep_last, synchronous=synchronous,
                    callback=callback)

    def load(self, path, *, params_only=False, allow_missing=False, allow_extra=False):
        """Collective: loads a checkpoint saved at any world size (params matched by
        name). Unless params_only, optimizer state, steps and hyperparameters too."""
        from .checkpoint import load
        load(self, path, params_only=params_only, allow_missing=allow_missing,
             allow_extra=allow_extra)
