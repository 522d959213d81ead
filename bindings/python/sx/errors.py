"""sx's status codes as Python exceptions.

Every failed call raises an :class:`SxError` (or the subclass for its status) that
carries the numeric ``status``, its name (``status_name``, e.g. ``"SX_ERR_TIMEOUT"``)
and sx's ``message`` (which names the function, the argument and the value).
"""
from . import _lib


class SxError(Exception):
    """A failed sx call: ``status`` (an SX_ERR_* value), ``status_name`` and ``message``."""

    def __init__(self, status, message):
        self.status = int(status)
        self.message = message
        self.status_name = _status_name(self.status)
        super().__init__(f"{self.status_name}: {message}" if message else self.status_name)


class InvalidArgumentError(SxError, ValueError):
    """SX_ERR_INVALID_ARGUMENT: an argument is missing, out of range or malformed."""


class InvalidHandleError(SxError):
    """SX_ERR_INVALID_HANDLE: the handle is closed or not an sx handle."""


class InvalidStateError(SxError):
    """SX_ERR_INVALID_STATE: the call is not allowed at this point of the group's life."""


class OutOfMemoryError(SxError, MemoryError):
    """SX_ERR_OUT_OF_MEMORY: an allocation failed; nothing was changed."""


class NotFoundError(SxError, LookupError):
    """SX_ERR_NOT_FOUND: a named thing does not exist."""


class AlreadyExistsError(SxError):
    """SX_ERR_ALREADY_EXISTS: a name is already taken."""


class UnsupportedError(SxError):
    """SX_ERR_UNSUPPORTED: valid, but not supported by this build or backend."""


class SxTimeoutError(SxError):
    """SX_ERR_TIMEOUT: a peer (or a future) did not finish in time."""


class CommError(SxError):
    """SX_ERR_COMM: a collective or the rendezvous failed."""


class GroupFailedError(SxError):
    """SX_ERR_GROUP_FAILED: the group failed earlier; only close() is allowed."""


class SxIOError(SxError):
    """SX_ERR_IO: a file operation failed."""


class CorruptError(SxError):
    """SX_ERR_CORRUPT: data failed verification."""


class VersionError(SxError):
    """SX_ERR_VERSION: a format or library version is not supported."""


class AbortedError(SxError):
    """SX_ERR_ABORTED: abort() was called on the group."""


class MismatchError(SxError):
    """SX_ERR_MISMATCH: ranks disagree (param tables, trainable masks, arguments)."""


class InternalError(SxError):
    """SX_ERR_INTERNAL: a bug in sx."""


class CancelledError(SxError):
    """SX_ERR_CANCELLED: the operation was cancelled."""


class NonFiniteError(SxError):
    """SX_ERR_NONFINITE: the gradients hold inf or NaN (step(nonfinite="error"))."""


class OptimizerError(SxError):
    """SX_ERR_OPTIMIZER: a custom optimizer's update reported failure; the step changed
    nothing. When the update was Python code that raised, the exception it raised is this
    error's ``__cause__``."""


ERROR_CLASSES = {
    _lib.SX_ERR_INVALID_ARGUMENT: InvalidArgumentError,
    _lib.SX_ERR_INVALID_HANDLE: InvalidHandleError,
    _lib.SX_ERR_INVALID_STATE: InvalidStateError,
    _lib.SX_ERR_OUT_OF_MEMORY: OutOfMemoryError,
    _lib.SX_ERR_NOT_FOUND: NotFoundError,
    _lib.SX_ERR_ALREADY_EXISTS: AlreadyExistsError,
    _lib.SX_ERR_UNSUPPORTED: UnsupportedError,
    _lib.SX_ERR_TIMEOUT: SxTimeoutError,
    _lib.SX_ERR_COMM: CommError,
    _lib.SX_ERR_GROUP_FAILED: GroupFailedError,
    _lib.SX_ERR_IO: SxIOError,
    _lib.SX_ERR_CORRUPT: CorruptError,
    _lib.SX_ERR_VERSION: VersionError,
    _lib.SX_ERR_ABORTED: AbortedError,
    _lib.SX_ERR_MISMATCH: MismatchError,
    _lib.SX_ERR_INTERNAL: InternalError,
    _lib.SX_ERR_CANCELLED: CancelledError,
    _lib.SX_ERR_NONFINITE: NonFiniteError,
    _lib.SX_ERR_OPTIMIZER: OptimizerError,
}


def status_string(status):
    """sx's static text for a status ("SX_ERR_TIMEOUT: ...")."""
    return _lib.lib.sx_status_string(status).decode("utf-8", "replace")


def _status_name(status):
    return status_string(status).split(":", 1)[0].strip()


def error(status, message):
    """The exception for `status` with `message`."""
    return ERROR_CLASSES.get(status, SxError)(status, message)


def check(status):
    """Raises the exception for a failed call, with sx's thread-local message.

    Must run on the thread that made the call, before any other sx call."""
    if status != _lib.SX_OK:
        raise error(status, _lib.lib.sx_last_error_message().decode("utf-8", "replace"))
