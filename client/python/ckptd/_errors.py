"""Exceptions raised by ckptd: one class per canonical status code, each carrying the daemon's
message (which names the job, step, item and region)."""

from __future__ import annotations


class CkptdError(Exception):
    """Base class of every error answered by ckptd or its client library."""

    code: str = "UNKNOWN"


class InvalidArgumentError(CkptdError, ValueError):
    code = "INVALID_ARGUMENT"


class NotFoundError(CkptdError, LookupError):
    code = "NOT_FOUND"


class AlreadyExistsError(CkptdError):
    code = "ALREADY_EXISTS"


class PermissionDeniedError(CkptdError, PermissionError):
    code = "PERMISSION_DENIED"


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


class InternalError(CkptdError):
    code = "INTERNAL"


# absl::StatusCode values.
_BY_CODE: dict[int, type[CkptdError]] = {
    3: InvalidArgumentError,
    4: DeadlineExceededError,
    5: NotFoundError,
    6: AlreadyExistsError,
    7: PermissionDeniedError,
    8: ResourceExhaustedError,
    9: FailedPreconditionError,
    10: AbortedError,
    11: InvalidArgumentError,  # OUT_OF_RANGE
    13: InternalError,
    14: UnavailableError,
    15: InternalError,  # DATA_LOSS
    16: PermissionDeniedError,  # UNAUTHENTICATED
}


def error_class(code: int) -> type[CkptdError]:
    """The exception class for an absl::StatusCode (used by the binding)."""
    return _BY_CODE.get(code, CkptdError)
