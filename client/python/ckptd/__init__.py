"""ckptd: Python client of the node-local checkpoint daemon.

    import ckptd
    client = ckptd.connect()                      # socket: argument or $CKPTD_SOCKET
    h = client.save("run42", 100, {"w": array}, {"meta": {"lr": 0.1}})
    h.committed().result()
    out = client.load("run42", "latest")

torch is not needed; ckptd.torch (the PyTorch DCP backend) imports it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._client import (
    DEFAULT_SOCKET,
    Box,
    Client,
    Flat,
    LoadResult,
    Raw,
    Region,
    SaveHandle,
    Shard,
    copy_stats,
    reset_copy_stats,
)
from ._errors import (
    AbortedError,
    AlreadyExistsError,
    CancelledError,
    CkptdError,
    DataLossError,
    DeadlineExceededError,
    FailedPreconditionError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    UnknownError,
)

__all__ = [
    "DEFAULT_SOCKET",
    "AbortedError",
    "AlreadyExistsError",
    "Box",
    "CancelledError",
    "CkptdError",
    "Client",
    "DataLossError",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "Flat",
    "InternalError",
    "InvalidArgumentError",
    "LoadResult",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "Raw",
    "Region",
    "ResourceExhaustedError",
    "SaveHandle",
    "Shard",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "UnknownError",
    "connect",
    "copy_stats",
    "default_client",
    "empty",
    "reset_copy_stats",
]

_default: Client | None = None
_default_lock = threading.Lock()


def _reset_default_in_child() -> None:
    # A forked child: the lock may have been held by another thread of the parent, and the
    # parent's client is not usable here (ckptd._fork).
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_default_in_child)


def connect(socket: str | os.PathLike[str] | None = None, **options: Any) -> Client:
    """A new session with the local daemon. socket: a path, else $CKPTD_SOCKET, else the
    default. UnavailableError (a ConnectionError) naming the socket when nobody answers."""
    return Client(socket, **options)


def default_client() -> Client:
    """A process-wide client on $CKPTD_SOCKET, connected on first use (in a forked child: its
    own, or FailedPreconditionError when the parent had connected before the fork)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Client()
        return _default


def empty(
    shape: Sequence[int] | int, dtype: Any = np.float32, *, client: Client | None = None
) -> Any:
    """An array (torch dtype: a tensor) in memory the daemon reads in place; see Client.empty."""
    return (client or default_client()).empty(shape, dtype)
