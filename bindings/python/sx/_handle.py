"""The lifetime shared by the binding's handle classes (ShardGroup, Future)."""
import weakref

from . import _lib
from .errors import InvalidHandleError


class Handle:
    """Owns one sx handle: released by close() (idempotent), a ``with`` block, or, as a
    safety net, a finalizer when the object is garbage-collected.

    Subclasses call ``_own(handle, destroy, *keep)``: ``destroy(handle, *keep)`` runs
    exactly once; ``keep`` stays referenced until it has returned."""

    _handle = None
    _finalizer = None

    def _own(self, handle, destroy, *keep):
        self._handle = handle
        self._finalizer = weakref.finalize(self, destroy, handle, *keep)

    @property
    def handle(self):
        """The raw sx handle (for calls this binding does not wrap)."""
        if self._handle is None:
            raise InvalidHandleError(_lib.SX_ERR_INVALID_HANDLE,
                                     f"the {type(self).__name__} is closed")
        return self._handle

    def close(self):
        """Releases the handle. Idempotent; any use afterwards raises InvalidHandleError."""
        if self._handle is not None:
            self._handle = None
            self._finalizer()  # runs destroy once, and detaches

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
