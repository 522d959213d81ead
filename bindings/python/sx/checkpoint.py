"""Checkpoints: save (returning a Future), load, and reading a checkpoint's user blob."""
import ctypes
import os
import sys
import traceback
import weakref

from . import _lib
from ._handle import Handle
from .errors import InvalidArgumentError, check, error
from ._lib import lib


def _path(what, path):
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"{what}: path must be a str or os.PathLike, not {path!r}")
    encoded = os.fsencode(path)
    if b"\0" in encoded:
        # C would read it only up to the NUL: another path than the one given.
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"{what}: the path {os.fsdecode(encoded)!r} holds a NUL character")
    return encoded


def _blob(user_blob):
    """The user blob's bytes: a bytes-like object (bytes, bytearray, memoryview, a
    buffer), never an int, which bytes() would turn into that many zero bytes, or a str."""
    if isinstance(user_blob, (bytes, bytearray)):
        return bytes(user_blob)
    try:
        return memoryview(user_blob).tobytes()
    except TypeError:
        raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                   f"save: user_blob must be bytes-like (bytes, bytearray, a buffer), "
                                   f"not {type(user_blob).__name__}") from None


class Future(Handle):
    """A save in progress. Release it with :meth:`close` or a ``with`` block (close
    waits for the save to finish); a finalizer closes a forgotten one."""

    def __init__(self, c_callback=None):
        self._callback_error = None
        # The C callback must outlive every call sx may make to it: it stays here, and
        # in the finalizer's arguments, until sx_future_destroy has returned.
        self._c_callback = c_callback

    def _attach(self, handle):
        self._own(handle, _destroy, self._c_callback)

    def poll(self):
        """True once the save has completed (successfully or not). Any thread."""
        done = ctypes.c_int32()
        check(lib.sx_future_poll(self.handle, ctypes.byref(done)))
        return bool(done.value)

    def wait(self, timeout=None):
        """Waits for the save; `timeout` in seconds (None: forever). Raises
        SxTimeoutError if it is still running then, or the save's own error."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        status = lib.sx_future_wait(self.handle, ms)
        if status == _lib.SX_ERR_TIMEOUT and not self.poll():
            raise error(status, f"the save did not complete within {timeout} s")
        if status != _lib.SX_OK:
            message = lib.sx_future_error_message(self.handle).decode("utf-8", "replace")
            raise error(status, message or lib.sx_last_error_message().decode("utf-8", "replace"))

    def wait_staged(self, timeout=None):
        """Waits until the snapshot has been copied out of the group's memory; after
        that, params may be written through views without reaching this checkpoint.
        `timeout` in seconds (None: forever); raises SxTimeoutError if not staged by then."""
        ms = -1 if timeout is None else max(0, int(timeout * 1000))
        check(lib.sx_future_wait_staged(self.handle, ms))

    def cancel(self):
        """Asks a running save to stop (it then fails with CancelledError and commits
        nothing). No effect on a completed one. Any thread."""
        check(lib.sx_future_cancel(self.handle))

    def progress(self):
        """(bytes of this rank's files written so far, bytes in all)."""
        done, total = ctypes.c_uint64(), ctypes.c_uint64()
        check(lib.sx_future_progress(self.handle, ctypes.byref(done), ctypes.byref(total)))
        return done.value, total.value

    @property
    def error_message(self):
        """The error text of a completed, failed save ("" otherwise)."""
        return lib.sx_future_error_message(self.handle).decode("utf-8", "replace")

    @property
    def callback_error(self):
        """The exception the Python callback raised, if it raised one."""
        return self._callback_error

    def close(self):
        """Releases the future, waiting for the save if it still runs. Idempotent."""
        super().close()
        self._c_callback = None  # sx can no longer call it


def _destroy(handle, _c_callback):
    # _c_callback is an argument only to be kept alive until destroy returns.
    lib.sx_future_destroy(handle)


def _c_callback_for(callback, future_ref):
    """A C callback that calls `callback(future, status)` on sx's I/O thread."""
    def trampoline(_future, status, _user):
        future = future_ref()
        try:
            callback(future, int(status))
        except BaseException as e:  # nothing may unwind into C
            if future is not None:
                future._callback_error = e
            print("sx: exception in a save callback:", file=sys.stderr)
            traceback.print_exc()
    return _lib.sx_future_callback(trampoline)


def save(group, path, user_blob=b"", *, keep_last=0, synchronous=False, callback=None):
    """See ShardGroup.save."""
    options = _lib.init_struct(_lib.sx_save_options_t)
    options.path = _path("save", path)
    blob = _blob(user_blob)  # copied by sx during the call
    options.user_blob = ctypes.cast(ctypes.c_char_p(blob), ctypes.c_void_p) if blob else None
    options.user_blob_size = len(blob)
    options.keep_last = keep_last
    options.synchronous = 1 if synchronous else 0
    future = Future()
    if callback is not None:
        if not callable(callback):
            raise InvalidArgumentError(_lib.SX_ERR_INVALID_ARGUMENT,
                                       f"save: callback must be callable, not {callback!r}")
        # A weak reference: the callback must not keep a dropped Future alive.
        future._c_callback = _c_callback_for(callback, weakref.ref(future))
        options.callback = future._c_callback
    handle = _lib.sx_future_p()
    check(lib.sx_save_optim_state(group.handle, ctypes.byref(options), ctypes.byref(handle)))
    future._attach(handle)
    return future


def load(group, path, *, params_only=False, allow_missing=False, allow_extra=False):
    """See ShardGroup.load."""
    options = _lib.init_struct(_lib.sx_load_options_t)
    options.path = _path("load", path)
    options.flags = ((_lib.SX_LOAD_PARAMS_ONLY if params_only else 0)
                     | (_lib.SX_LOAD_ALLOW_MISSING if allow_missing else 0)
                     | (_lib.SX_LOAD_ALLOW_EXTRA if allow_extra else 0))
    check(lib.sx_load_optim_state(group.handle, ctypes.byref(options)))


def read_user_blob(path):
    """The user blob (bytes) stored in the checkpoint at `path`, after verifying its
    manifest."""
    c_path = _path("read_user_blob", path)
    size = ctypes.c_uint64()
    capacity = 4096  # most blobs fit at once; a larger one is read again at its size
    while True:
        buf = ctypes.create_string_buffer(capacity)
        status = lib.sx_read_user_blob(c_path, buf, capacity, ctypes.byref(size))
        if status == _lib.SX_ERR_INVALID_ARGUMENT and size.value > capacity:
            capacity = size.value  # too small: sx reported the size and copied nothing
            continue
        check(status)
        return buf.raw[:size.value]
