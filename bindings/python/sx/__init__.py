"""Python bindings of sx, a training runtime with ZeRO-sharded optimizer state, flat
parameter/gradient buffers, fused optimizers and resharding checkpoints.

The binding uses ctypes over libsx.so (set SX_LIBRARY to its path, or install it where
the dynamic loader finds it) and include/sx/sx.h's C ABI only. Example::

    import sx
    with sx.ShardGroup("local://demo", rank, 4, stage=2, backend="cpu") as g:
        g.add_param_group("adamw", lr=0.05)
        g.add_param("w", [8, 16])
        g.finalize()
        w, dw = g.param_view("w"), g.grad_view("w")   # zero-copy numpy arrays
        dw[...] += compute_grad(w)
        print(g.step(max_grad_norm=1.0).grad_norm)
        g.save("/ckpt/step-1", user_blob=b"...").wait()
"""
import ctypes
import threading

from . import _lib
from ._lib import BINDING_VERSION, LibraryError
from ._lib import *  # noqa: F401,F403  the SX_* constants
from ._views import HAVE_NUMPY
from .errors import *  # noqa: F401,F403  SxError and its subclasses
from .errors import SxError, check, status_string
from .group import MemoryStats, ParamInfo, ParamState, RegroupResult, ShardGroup, StepResult, UnitInfo
from .checkpoint import Future, read_user_blob
from .context import Context, ContextStats
from .norm_domain import NormDomain
from .optimizers import CustomOptimizer, Hyperparameter, Piece, register_optimizer
from .interop import ImportReport, export_hf, export_peft, import_hf

from ._version import __version__  # noqa: E402


def version():
    """The runtime's version as (major, minor, patch)."""
    number = _lib.lib.sx_version()
    return number // 10000, number // 100 % 100, number % 100


# Every log callback ever installed stays referenced: sx may still be calling an old
# one on another thread at the moment a new one replaces it.
_log_callbacks = []
_log_lock = threading.Lock()

LOG_LEVELS = {"error": _lib.SX_LOG_ERROR, "warn": _lib.SX_LOG_WARN, "info": _lib.SX_LOG_INFO,
              "debug": _lib.SX_LOG_DEBUG}


def set_log_callback(fn, max_level=_lib.SX_LOG_INFO):
    """Routes sx's log messages to ``fn(level, message)`` (level an SX_LOG_* int, message
    a str), for levels up to `max_level` ("error".."debug" or SX_LOG_*). fn None turns
    logging off. fn may be called from any thread, concurrently; exceptions it raises
    are printed and dropped."""
    from .group import _choice
    level = _choice("max_level", max_level, LOG_LEVELS)
    if fn is None:
        check(_lib.lib.sx_set_log_callback(ctypes.cast(None, _lib.sx_log_fn), None, level))
        return

    def trampoline(lvl, message, _user):
        try:
            fn(int(lvl), message.decode("utf-8", "replace"))
        except BaseException:  # nothing may unwind into C
            import traceback
            traceback.print_exc()

    c_fn = _lib.sx_log_fn(trampoline)
    with _log_lock:
        _log_callbacks.append(c_fn)
        check(_lib.lib.sx_set_log_callback(c_fn, None, level))
