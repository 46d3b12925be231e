"""ckptd.torch: PyTorch integration of ckptd.

- StorageWriter / StorageReader: a torch.distributed.checkpoint backend. Switch a DCP program to
  ckptd by passing storage_writer=ckptd.torch.StorageWriter("runs/llama/step-100") (and the
  matching StorageReader) to dcp.save / dcp.async_save / dcp.load.
- save(model, optimizer, step, extra=...) / load(model, optimizer, ...): the common case in one
  call, through torch's own state_dict helpers (plain modules, DDP, FSDP2 and DTensor models).
"""

from __future__ import annotations

from ._helpers import load, save
from ._ids import CheckpointId, decode_job, encode_job, parse
from ._reader import StorageReader
from ._storage import DCP_VERSION, StorageWriter

__all__ = [
    "DCP_VERSION",
    "CheckpointId",
    "StorageReader",
    "StorageWriter",
    "decode_job",
    "encode_job",
    "load",
    "parse",
    "save",
]
