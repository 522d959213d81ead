"""The lifetime shared by the binding's handle classes (ShardGroup, Future)."""
import weakref

from . import _lib
from .errors import InvalidHandleError


class Handle:
    """Owns one sx handle: released by close() (idempotent), a ``with`` block, or, as a
    safety net, a finalizer when the object is garbage-collected.

    Subclasses call ``_own(handle, destroy, *keep)``: ``destroy(handle, *keep)`` runs
    exactly once; ``keep`` stays referenced until it has returned.

    Memory the handle owns may be lent out (``_lend(obj)``, for arrays over it): while
    any borrower is alive, close() makes the object unusable at once but releases the
    handle only when the last borrower has been garbage-collected, so that no array
    ever points into freed memory."""

    _handle = None
    _finalizer = None
    _loans = 0
    _release_pending = False

    def _own(self, handle, destroy, *keep):
        self._handle = handle
        self._finalizer = weakref.finalize(self, destroy, handle, *keep)

    def _lend(self, borrower):
        """Keeps the handle (not the object's usability) until `borrower` is collected."""
        self._loans += 1
        weakref.finalize(borrower, self._returned)

    def _returned(self):
        self._loans -= 1
        if self._loans == 0 and self._release_pending:
            self._release_pending = False
            self._finalizer()

    @property
    def loans(self):
        """How many arrays over the handle's memory are alive."""
        return self._loans

    @property
    def handle(self):
        """The raw sx handle (for calls this binding does not wrap)."""
        if self._handle is None:
            raise InvalidHandleError(_lib.SX_ERR_INVALID_HANDLE,
                                     f"the {type(self).__name__} is closed")
        return self._handle

    def close(self):
        """Releases the handle (once no array over its memory is alive). Idempotent; any
        use afterwards raises InvalidHandleError."""
        if self._handle is not None:
            self._handle = None
            if self._loans > 0:
                self._release_pending = True
            else:
                self._finalizer()  # runs destroy once, and detaches

    @property
    def closed(self):
        return self._handle is None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
