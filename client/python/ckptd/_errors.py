"""Exceptions raised by ckptd: one class per canonical status code, each carrying the daemon's
message (which names the job, step, item and region)."""

from __future__ import annotations


class CkptdError(Exception):
    """Base class of every error answered by ckptd or its client library. Each canonical status
    code has its own subclass (error_class); `code` names it."""

    code: str = "UNKNOWN"


class CancelledError(CkptdError):
    """The call was cancelled (the caller went away or interrupted it)."""

    code = "CANCELLED"


class UnknownError(CkptdError):
    code = "UNKNOWN"


class InvalidArgumentError(CkptdError, ValueError):
    code = "INVALID_ARGUMENT"


class OutOfRangeError(InvalidArgumentError):
    """OUT_OF_RANGE: also an InvalidArgumentError (and a ValueError)."""

    code = "OUT_OF_RANGE"


class NotFoundError(CkptdError, LookupError):
    code = "NOT_FOUND"


class AlreadyExistsError(CkptdError):
    code = "ALREADY_EXISTS"


class PermissionDeniedError(CkptdError, PermissionError):
    code = "PERMISSION_DENIED"


class UnauthenticatedError(PermissionDeniedError):
    """UNAUTHENTICATED: also a PermissionDeniedError (and a PermissionError)."""

    code = "UNAUTHENTICATED"


class ResourceExhaustedError(CkptdError, MemoryError):
    code = "RESOURCE_EXHAUSTED"


class FailedPreconditionError(CkptdError):
    code = "FAILED_PRECONDITION"


class AbortedError(CkptdError):
    code = "ABORTED"


class DeadlineExceededError(CkptdError, TimeoutError):
    code = "DEADLINE_EXCEEDED"


class UnavailableError(CkptdError, ConnectionError):
    """The daemon is not reachable; the message names the socket."""

    code = "UNAVAILABLE"


class UnimplementedError(CkptdError, NotImplementedError):
    code = "UNIMPLEMENTED"


class InternalError(CkptdError):
    code = "INTERNAL"


class DataLossError(CkptdError):
    """Bytes that did not verify (a checksum mismatch, a short or missing blob): the message
    names the checkpoint, item and block."""

    code = "DATA_LOSS"


# absl::StatusCode values: one class per code (0, OK, is never raised).
_BY_CODE: dict[int, type[CkptdError]] = {
    1: CancelledError,
    2: UnknownError,
    3: InvalidArgumentError,
    4: DeadlineExceededError,
    5: NotFoundError,
    6: AlreadyExistsError,
    7: PermissionDeniedError,
    8: ResourceExhaustedError,
    9: FailedPreconditionError,
    10: AbortedError,
    11: OutOfRangeError,
    12: UnimplementedError,
    13: InternalError,
    14: UnavailableError,
    15: DataLossError,
    16: UnauthenticatedError,
}


def error_class(code: int) -> type[CkptdError]:
    """The exception class for an absl::StatusCode (used by the binding); UnknownError for a
    code outside the canonical set."""
    return _BY_CODE.get(code, UnknownError)
