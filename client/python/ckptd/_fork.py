"""Clients and fork(): which process owns gRPC's state, and the error a forked child gets.

gRPC's C++ core is not fork-safe: a process forked after its parent used a client inherits that
client's channel and threads half-alive, and any gRPC call in it — the inherited client's, a new
client's, even the inherited client's destructor at the child's exit — hangs or crashes. So in
such a child every client raises FailedPreconditionError saying so (a worker started with "spawn"
or "forkserver", or one that connects before its parent did, works), and the inherited native
clients are never destroyed there (their state is the parent's; the child's copy is freed by its
exit).

ckptd.Client calls check_can_connect() before it makes its native client and track() after; a
client the child inherited has `_forked` set (by the at-fork hook below), and each of its calls
raises error() then.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Any

from ._errors import FailedPreconditionError

_grpc_pid: int | None = None  # the process whose clients own gRPC's state, once one was made
# The clients made in this process (Client objects: they carry `_forked` and `_native_client`).
_live: weakref.WeakSet[Any] = weakref.WeakSet()


def error() -> FailedPreconditionError:
    """What a call raises in a process forked after its parent connected."""
    return FailedPreconditionError(
        f"ckptd: process {os.getpid()} was forked from process {_grpc_pid}, which had already "
        "connected to ckptd, and gRPC cannot run in such a child; start workers with "
        "multiprocessing's 'spawn' or 'forkserver' method (torch.multiprocessing."
        "set_start_method('spawn')), or connect in the parent only after forking them"
    )


def check_can_connect() -> None:
    """FailedPreconditionError if this process was forked from one that had made a client."""
    if _grpc_pid is not None and _grpc_pid != os.getpid():
        raise error()


def track(client: Any) -> None:
    """Records a client just made in this process (its `_native_client` exists): this process
    now owns gRPC's state, and a child forked from here marks the client forked."""
    global _grpc_pid
    _grpc_pid = os.getpid()
    _live.add(client)


def _after_fork_in_child() -> None:
    if _grpc_pid is None:
        return  # no client was made before the fork: the child may make its own
    for client in list(_live):
        client._forked = True
        # One reference the child never drops: the destructor (gRPC calls) never runs here.
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(client._native_client))


os.register_at_fork(after_in_child=_after_fork_in_child)
