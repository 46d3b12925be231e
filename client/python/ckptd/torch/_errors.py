"""ckptd's own errors out of DCP's CheckpointException, for the framework integrations that call
dcp.save / dcp.load (ckptd.accelerate, ckptd.megatron, ckptd.torchtitan)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.distributed.checkpoint.api import CheckpointException

import ckptd


@contextlib.contextmanager
def ckptd_errors() -> Iterator[None]:
    """DCP reports a rank's failure as CheckpointException (a BaseException, which `except
    Exception` does not catch): the ckptd error inside it (UnavailableError naming the socket,
    DataLossError naming the item, ...) is raised instead, chained to it."""
    try:
        yield
    except CheckpointException as e:
        for failure in e.failures.values():
            error = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(error, ckptd.CkptdError):
                raise error from e
        raise
