"""Zero-copy arrays over memory that sx owns.

With numpy (and unless SX_PYTHON_NO_NUMPY is set to a non-empty value), a view is a
numpy array; without it, a memoryview with the same shape and item format. Either
way it reads and writes sx's buffer directly, and keeps the owning Python object
(the ShardGroup) alive, so garbage collection cannot free the memory under it; an
explicit close() of the group releases the group only once every view (and every
array or tensor sharing its memory) is gone.
"""
import ctypes
import os

from . import _lib

if os.environ.get("SX_PYTHON_NO_NUMPY"):
    np = None
else:
    try:
        import numpy as np
    except ImportError:  # the memoryview fallback below
        np = None

HAVE_NUMPY = np is not None

# SX_DTYPE_* -> (bytes per element, memoryview format, numpy dtype name). numpy has no
# bfloat16: bf16 elements appear as their raw uint16 bits. memoryview casts to fp16
# ("e") only from Python 3.12 on, so without numpy fp16 elements are raw bits too (the
# struct module's "e" converts them).
DTYPES = {
    _lib.SX_DTYPE_F32: (4, "f", "float32"),
    _lib.SX_DTYPE_F16: (2, "H", "float16"),
    _lib.SX_DTYPE_BF16: (2, "H", "uint16"),
    _lib.SX_DTYPE_U8: (1, "B", "uint8"),  # 8-bit optimizer state's codes
}


def wrap(address, count, itemsize, fmt, npdtype, shape, owner):
    """An array of `count` elements at `address`, shaped `shape`, kept alive by `owner`."""
    shape = tuple(int(d) for d in shape)
    raw = (ctypes.c_char * (count * itemsize)).from_address(address)
    raw._sx_owner = owner  # the buffer (and so every array over it) keeps the owner alive
    owner._lend(raw)       # ... and its memory, past an explicit close()
    if np is not None:
        return np.frombuffer(raw, dtype=npdtype, count=count).reshape(shape)
    return memoryview(raw).cast("B").cast(fmt, list(shape))
