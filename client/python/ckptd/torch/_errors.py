"""ckptd's own errors out of DCP's CheckpointException, for the framework integrations that call
dcp.save / dcp.load (ckptd.accelerate, ckptd.megatron, ckptd.torchtitan)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch.distributed.checkpoint.api import CheckpointException

import ckptd


class MetadataError(BaseException):
    """A ckptd error of StorageReader.read_metadata, carried through DCP's load (which catches
    Exception there and would report only "metadata is None"): a BaseException, as DCP's own
    CheckpointException is. `error`: the ckptd error (NotFoundError, DataLossError naming the
    item, UnavailableError naming the socket, ...); str() is its message."""

    def __init__(self, error: ckptd.CkptdError) -> None:
        super().__init__(error)
        self.error = error

    def __str__(self) -> str:
        return f"{type(self.error).__name__}: {self.error}"


@contextlib.contextmanager
def ckptd_errors() -> Iterator[None]:
    """DCP reports a rank's failure as CheckpointException (a BaseException, which `except
    Exception` does not catch): the ckptd error inside it (UnavailableError naming the socket,
    DataLossError naming the item, ...) is raised instead, chained to it. A MetadataError (the
    reader's, see _reader.py) is unwrapped to its ckptd error too."""
    try:
        yield
    except MetadataError as e:
        raise e.error from e
    except CheckpointException as e:
        for failure in e.failures.values():
            error = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(error, MetadataError):
                error = error.error
            if isinstance(error, ckptd.CkptdError):
                raise error from e
        raise
