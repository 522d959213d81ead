"""Custom optimizers (sx 1.5): an elementwise optimizer written in Python, which sx
allocates, shards, steps, checkpoints (by slot name), reshards and gathers exactly as it
does its own.

Example, Lion (the built-in "lion" does the same, in C)::

    import numpy as np, sx

    def lion(piece):
        hp = piece.hyperparameters                      # by name, in registration order
        lr, wd = hp["lr"], hp["weight_decay"]
        b1, b2 = np.float32(hp["beta1"]), np.float32(hp["beta2"])
        g = piece.grad * np.float32(piece.grad_scale)
        m, = piece.state
        c = m * b1 + np.float32(1.0 - hp["beta1"]) * g
        piece.param[:] = piece.param * np.float32(1.0 - lr * wd) + np.float32(-lr) * np.sign(c)
        m[:] = m * b2 + np.float32(1.0 - hp["beta2"]) * g

    LION = sx.register_optimizer("py_lion", ["exp_avg"], lion,
                                 hyperparameters={"lr": 1e-4, "beta1": 0.9, "beta2": 0.99,
                                                  "weight_decay": 0.0})
    g.add_param_group(LION, lr=3e-4)      # or g.add_param_group("py_lion", ...)

Registration is per process and lasts as long as the process: the C callback, and
everything the registration made, stay referenced here forever (sx may call the update
for as long as a group uses it). Registering the same name again with the same update
function, slots and hyperparameters returns the same optimizer, so ranks that are threads
of one process may each register it; another description under a taken name raises
AlreadyExistsError.

``in_place=True`` registers it SX_OPTIMIZER_IN_PLACE: sx updates the params and slots in
place, without the second slot buffers and the copy of the params that let a failed update
change nothing (half the update's memory traffic, no extra memory). A failing update then
leaves the step half done and fails the group (only close() is left), so it is for an
update that cannot fail.

sx calls the update on its worker threads, several pieces at once; ctypes takes the GIL
for each call, so Python updates run one at a time (numpy releases the GIL inside large
array operations). The update must not call sx. CPU groups, and CUDA groups that offload
their state (``offload=True``).
"""
import ctypes
import dataclasses
import numbers
import threading

from . import _lib, _views
from ._hyperparameters import HYPERPARAMETERS as _STANDARD_HYPERPARAMETERS
from .errors import InvalidArgumentError, check
from ._lib import lib

# The status an update that raised reports to sx (its exception is kept: see
# CustomOptimizer.last_failure, and OptimizerError.__cause__ after ShardGroup.step).
EXCEPTION_STATUS = -1


@dataclasses.dataclass(frozen=True)
class Hyperparameter:
    """One hyperparameter of a custom optimizer: its name, the value a new param group
    starts with, and the inclusive range a value must lie in (both 0: any finite value).
    A name of sx's own ("lr", "weight_decay", "beta1", "beta2", "eps", "momentum", ...)
    is that hyperparameter (its SX_HP_* key, its add_param_group keyword, its range,
    set_lr); any other name is the optimizer's own (key SX_HP_CUSTOM + i, counting its
    own in order), set through add_param_group's keywords or set_hyperparameter by name."""
    name: str
    default: float
    min: float = 0.0
    max: float = 0.0


class Piece:
    """One contiguous piece of a param's elements in this rank's shard, lent to an update
    for the call (keep nothing of it: the arrays are sx's memory).

    ``param``: the n fp32 values (the fp32 masters of 16-bit params), to update in place;
    ``grad``: the n reduced gradients, summed over the ranks (read-only: use
    ``grad * grad_scale``); ``state``: one array per slot, in registration order, to
    update in place; ``grad_scale``: the average over ranks, the loss scale and the
    clipping coefficient in one factor; ``hyperparameters``: the param group's values by
    name, in registration order; ``param_index``, ``param_group``; ``offset``: param[0]'s
    element offset in the param (row-major); ``step``: the param's step count including
    this update (1 for its first); ``optimizer``: the CustomOptimizer. With numpy the
    arrays are numpy float32 arrays, else memoryviews of format "f"."""
    __slots__ = ("param", "grad", "state", "n", "grad_scale", "param_index", "param_group", "offset",
                 "step", "hyperparameters", "optimizer")

    def __len__(self):
        return self.n

    def __repr__(self):
        return (f"<sx.Piece of {self.optimizer.name!r}: param {self.param_index} "
                f"[{self.offset}, {self.offset + self.n}) step {self.step}>")


class CustomOptimizer(int):
    """A registered custom optimizer: its id (this int, >= SX_OPTIM_CUSTOM_FIRST), usable
    wherever an optimizer kind is (``add_param_group(opt, ...)``), with its ``name``,
    ``slots``, ``slot_initial_values``, ``hyperparameters`` (Hyperparameter tuples),
    ``update`` and ``in_place``."""

    def __new__(cls, id_, name, slots, slot_initial_values, hyperparameters, update, in_place, shared, c_objects):
        self = super().__new__(cls, id_)
        self.name, self.slots = name, tuple(slots)
        self.slot_initial_values = slot_initial_values
        self.hyperparameters = tuple(hyperparameters)
        self.update = update
        self.in_place = in_place
        self._shared = shared
        self._c_objects = c_objects  # the C callback and what it was registered with: kept for the process
        return self

    def __repr__(self):
        return f"<sx.CustomOptimizer {self.name!r} id {int(self)}>"

    @property
    def id(self):
        return int(self)

    @property
    def own_hyperparameters(self):
        """The names of the optimizer's own hyperparameters (not sx's), in key order:
        the i-th has key SX_HP_CUSTOM + i."""
        return tuple(h.name for h in self.hyperparameters if h.name not in _STANDARD_HYPERPARAMETERS)

    def hyperparameter_key(self, name):
        """The key (SX_HP_*, or SX_HP_CUSTOM + i for its own) of hyperparameter `name`."""
        if name in _STANDARD_HYPERPARAMETERS:
            return _STANDARD_HYPERPARAMETERS[name]
        own = self.own_hyperparameters
        if name in own:
            return _lib.SX_HP_CUSTOM + own.index(name)
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"custom optimizer {self.name!r} has no hyperparameter {name!r}; "
                                   f"it has {[h.name for h in self.hyperparameters]}")

    def last_failure(self):
        """The exception the update last raised (None if it never did)."""
        return self._shared.failure

    def _take_failure(self):
        failure, self._shared.failure = self._shared.failure, None
        return failure


class _Shared:
    """What the C callback and its CustomOptimizer share: the optimizer (set once sx gave
    it an id) and the last exception the update raised."""
    __slots__ = ("optimizer", "failure")

    def __init__(self):
        self.optimizer, self.failure = None, None


_lock = threading.Lock()
_by_name = {}   # name -> CustomOptimizer
_by_id = {}     # id -> CustomOptimizer


def _bad(message):
    return InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT, f"register_optimizer: {message}")


def _name_bytes(what, text):
    if not isinstance(text, str):
        raise _bad(f"{what} must be a str, not {type(text).__name__}")
    if "\0" in text:
        raise _bad(f"{what} {text!r} holds a NUL character")
    return text.encode("utf-8")


def _hyperparameters(spec):
    """Hyperparameter tuples from a mapping name -> default, or a sequence of
    Hyperparameter objects or (name, default[, min, max]) tuples."""
    if spec is None:
        return []
    items = list(spec.items()) if hasattr(spec, "items") else list(spec)
    out = []
    for item in items:
        if isinstance(item, Hyperparameter):
            out.append(item)
            continue
        if isinstance(item, (str, bytes)) or not hasattr(item, "__len__") or len(item) not in (2, 4):
            raise _bad(f"each hyperparameter is a Hyperparameter or (name, default[, min, max]), not {item!r}")
        values = list(item[1:])
        for v in values:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise _bad(f"hyperparameter {item[0]!r}: {v!r} is not a number")
        out.append(Hyperparameter(item[0], *[float(v) for v in values]))
    return out


def _float32_array(address, n, writable):
    buf = (ctypes.c_float * n).from_address(address)
    np = _views.np
    if np is not None:
        a = np.frombuffer(buf, dtype=np.float32)
        if not writable:
            a.flags.writeable = False
        return a
    view = memoryview(buf).cast("B").cast("f")
    return view if writable else view.toreadonly()


def _report_error(raw, text):
    """Writes `text` into the piece's error buffer (sx puts it in the step's
    SX_ERR_OPTIMIZER message): at most error_size - 1 bytes of UTF-8, cut at a character
    boundary, and a NUL. Never raises."""
    try:
        pc = raw.contents
        if pc.struct_size < ctypes.sizeof(_lib.sx_optimizer_piece_t) or not pc.error or pc.error_size < 1:
            return  # a library without the error buffer
        data = text.encode("utf-8", "replace")
        if len(data) > pc.error_size - 1:
            data = data[:pc.error_size - 1].decode("utf-8", "ignore").encode("utf-8")
        ctypes.memmove(pc.error, data + b"\0", len(data) + 1)
    except BaseException:  # noqa: B036  (nothing may unwind into C)
        pass


def _describe(e):
    """An exception as "Type: message" (or just "Type" when its str is empty)."""
    try:
        text = str(e)
    except BaseException:  # noqa: B036  (a broken __str__)
        text = ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _trampoline_for(shared, update, num_slots, names):
    """The C update: builds a Piece and calls `update`. Nothing unwinds into C: an
    exception is kept (CustomOptimizer.last_failure()), described in the piece's error
    buffer ("Type: message") and reported as EXCEPTION_STATUS; a nonzero int return is
    described as "update returned N"."""
    num_hp = len(names)

    def trampoline(raw):
        try:
            pc = raw.contents
            n = pc.n
            piece = Piece()
            piece.optimizer, piece.n = shared.optimizer, n
            piece.param = _float32_array(pc.param, n, True)
            piece.grad = _float32_array(pc.grad, n, False)
            piece.state = [_float32_array(pc.state[k], n, True) for k in range(num_slots)]
            piece.grad_scale = pc.grad_scale
            piece.param_index, piece.param_group = pc.param_index, pc.param_group
            piece.offset, piece.step = pc.offset, pc.step
            if num_hp:
                values = (ctypes.c_double * num_hp).from_address(pc.hyperparameters)
                piece.hyperparameters = dict(zip(names, values))
            else:
                piece.hyperparameters = {}
            result = update(piece)
            if isinstance(result, numbers.Integral) and not isinstance(result, bool) and result != 0:
                code = int(result)
                _report_error(raw, f"update returned {code}")
                return code if -2 ** 31 <= code < 2 ** 31 else EXCEPTION_STATUS
            return 0
        except BaseException as e:  # noqa: B036  (nothing may unwind into C)
            shared.failure = e
            _report_error(raw, _describe(e))
            return EXCEPTION_STATUS

    return _lib.sx_optimizer_update_fn(trampoline)


def register_optimizer(name, slots, update, hyperparameters=None, slot_initial_values=None, in_place=False):
    """Registers a custom optimizer for this process and returns it (a
    :class:`CustomOptimizer`, an int: its id).

    ``name``: unique, 1-63 of [A-Za-z0-9_.-]. ``slots``: the names of its state slots
    (at most SX_MAX_CUSTOM_SLOTS, distinct, of [A-Za-z0-9_]), which checkpoints and
    gather_optim_state use. ``update(piece)``: called with a :class:`Piece` on sx's
    worker threads, concurrently; it updates ``piece.param`` and ``piece.state`` in place
    and returns None (a nonzero int reports failure with that value; an exception reports
    EXCEPTION_STATUS and is kept). Either way a failure fails the step on every rank with
    OptimizerError, whose message ends with the exception's type and text (or "update
    returned N"), and changes nothing (unless ``in_place``). ``hyperparameters``: a
    mapping name -> default, or a sequence of :class:`Hyperparameter` or (name,
    default[, min, max]) tuples, in the order ``piece.hyperparameters`` has them (see
    Hyperparameter for sx's names). ``slot_initial_values``: what each slot holds before
    a param's first update (None: 0). ``in_place``: sx updates params and slots in place
    (SX_OPTIMIZER_IN_PLACE), without the double buffers that let a failed update change
    nothing: less memory and memory traffic, but a failure leaves the step half done and
    fails the group (only close() is allowed after); for an update that cannot fail.
    Errors (nothing registered): InvalidArgumentError for a bad description (sx's
    message names it), AlreadyExistsError for another description under a taken name."""
    name_b = _name_bytes("name", name)
    if isinstance(slots, (str, bytes)):
        raise _bad(f"slots must be a sequence of slot names, not the single string {slots!r}")
    try:
        slots = tuple(slots)
    except TypeError:
        raise _bad(f"slots must be a sequence of slot names, not {slots!r}") from None
    slot_b = [_name_bytes("slot name", s) for s in slots]
    if update is not None and not callable(update):
        raise _bad(f"update must be callable, not {type(update).__name__}")
    hps = _hyperparameters(hyperparameters)
    hp_b = [_name_bytes("hyperparameter name", h.name) for h in hps]
    if slot_initial_values is not None:
        slot_initial_values = tuple(float(v) for v in slot_initial_values)
        if len(slot_initial_values) != len(slots):
            raise _bad(f"slot_initial_values has {len(slot_initial_values)} values for {len(slots)} slot(s)")
    if not isinstance(in_place, bool):
        raise _bad(f"in_place must be a bool, not {type(in_place).__name__}")

    with _lock:
        known = _by_name.get(name)
        if (known is not None and known.update is update and known.slots == slots
                and known.slot_initial_values == slot_initial_values and known.hyperparameters == tuple(hps)
                and known.in_place == in_place):
            return known  # the same description again (another rank of this process)
        shared = _Shared()
        desc = _lib.init_struct(_lib.sx_optimizer_desc_t)
        c_name = ctypes.c_char_p(name_b)
        c_slots = (ctypes.c_char_p * max(len(slots), 1))(*slot_b)
        c_init = (ctypes.c_float * max(len(slots), 1))(*(slot_initial_values or ()))
        c_hps = (_lib.sx_optimizer_hyperparameter_t * max(len(hps), 1))()
        for k, (h, b) in enumerate(zip(hps, hp_b)):
            c_hps[k].name, c_hps[k].default_value, c_hps[k].min, c_hps[k].max = b, h.default, h.min, h.max
        if update is None:  # sx refuses it, in its own words
            c_update = ctypes.cast(None, _lib.sx_optimizer_update_fn)
        else:
            c_update = _trampoline_for(shared, update, len(slots), tuple(h.name for h in hps))
        desc.name = c_name
        desc.num_slots = len(slots)
        desc.slot_names = ctypes.cast(c_slots, ctypes.POINTER(ctypes.c_char_p))
        if slot_initial_values is not None:
            desc.slot_initial_values = ctypes.cast(c_init, ctypes.POINTER(ctypes.c_float))
        desc.num_hyperparameters = len(hps)
        desc.hyperparameters = ctypes.cast(c_hps, ctypes.POINTER(_lib.sx_optimizer_hyperparameter_t))
        desc.update = c_update
        desc.flags = _lib.SX_OPTIMIZER_IN_PLACE if in_place else 0
        out = ctypes.c_int32()
        check(lib.sx_register_optimizer(ctypes.byref(desc), ctypes.byref(out)))
        opt = CustomOptimizer(out.value, name, slots, slot_initial_values, hps, update, in_place, shared,
                              (c_update, c_name, c_slots, c_init, c_hps, desc))
        shared.optimizer = opt
        _by_name[name] = opt
        _by_id[out.value] = opt
        return opt


def registered_optimizers():
    """Every custom optimizer this process registered, by id."""
    with _lock:
        return dict(_by_id)


def lookup(key):
    """The CustomOptimizer for a registered id or name, or None."""
    if isinstance(key, str):
        return _by_name.get(key)
    if isinstance(key, numbers.Integral) and not isinstance(key, bool):
        return _by_id.get(int(key))
    return None
