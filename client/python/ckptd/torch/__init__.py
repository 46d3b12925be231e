"""ckptd.torch: PyTorch integration of ckptd.

- StorageWriter / StorageReader: a torch.distributed.checkpoint backend. Switch a DCP program to
  ckptd by passing storage_writer=ckptd.torch.StorageWriter("runs/llama/step-100") (and the
  matching StorageReader) to dcp.save / dcp.async_save / dcp.load.
- save(model, optimizer, step, extra=...) or save(state_dict, step=...) / load(model, optimizer,
  ...): the common case in one call, through torch's own state_dict helpers (plain modules, DDP,
  FSDP2 and DTensor models). save() is planless: no rank gathers anything (the way to save at
  scale).
- LocalPlanner: the DCP SavePlanner behind it, for dcp.save(..., storage_writer=StorageWriter(id),
  planner=LocalPlanner(), no_dist=True): each rank plans and writes its own part, the daemon
  commits the checkpoint once every rank has.
- MetadataError: what a dcp.load through StorageReader whose checkpoint is missing, corrupt or
  unreachable holds in DCP's CheckpointException (its .error: the ckptd error), where DCP alone
  would raise AssertionError("metadata is None").
"""

from __future__ import annotations

from ._errors import MetadataError
from ._helpers import load, save
from ._ids import CheckpointId, decode_job, encode_job, parse
from ._planner import LocalPlanner, balanced_owners
from ._reader import StorageReader
from ._storage import DCP_VERSION, StorageWriter

__all__ = [
    "DCP_VERSION",
    "CheckpointId",
    "LocalPlanner",
    "MetadataError",
    "StorageReader",
    "StorageWriter",
    "balanced_owners",
    "decode_job",
    "encode_job",
    "load",
    "parse",
    "save",
]
