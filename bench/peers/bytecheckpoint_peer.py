"""ByteCheckpoint (PyPI ``bytecheckpoint`` 0.0.2) as a benchmark peer.

Call ``save``/``load`` on every rank of an initialised (gloo) process group. No patch is applied
to the package; see bench/peers/BYTECHECKPOINT.md for what was checked on torch 2.13 CPU.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

OPTIONS: str = (
    "bytecheckpoint 0.0.2, unpatched. framework: 'fsdp' for an FSDP1-wrapped model, 'fsdp2' for "
    "fully_shard, else 'ddp' (plain replicated module; ranks split the deduplicated tensors). "
    "save: bytecheckpoint.save(path, {'model', 'optimizer'}, framework, fast_saving=async_save, "
    "global_steps=None, save_decomposed_model_optimizer=False); engine defaults (1 store worker "
    "per rank, single file per rank, fsync of every data and .metadata file, CPU 'pinned pool' "
    "copy = clone on CPU). In 0.0.2 fast_saving does not overlap the data writes: the plan cache "
    "never hits, so every save takes the first-save path that writes synchronously; only the "
    "tracker/persist step runs on the background thread (see BYTECHECKPOINT.md). stall = time "
    "inside bytecheckpoint.save; committed = stall + wait for the background persist queues. "
    "The one-time gRPC coordinator start (rank 0 spawns a server process, ~2 s) is done before "
    "the clock starts. load: bytecheckpoint.load(..., fast_loading=True, strict=True) "
    "(per-file parallel reads, 8 load workers). Logging: BYTECHECKPOINT_LOGGING_LEVEL=ERROR "
    "unless set."
)

VERSION: str = "0.0.2"

os.environ.setdefault("BYTECHECKPOINT_LOGGING_LEVEL", "ERROR")

_bcp: Any = None
_import_error: str | None = None
try:
    import bytecheckpoint as _bcp  # type: ignore[no-redef]
except Exception as e:  # any import failure means "not available"
    _import_error = f"{type(e).__name__}: {e}"


def available() -> tuple[bool, str]:
    """Whether ByteCheckpoint can run here, and why not."""
    if _bcp is None:
        return False, f"import bytecheckpoint failed ({_import_error}); run bench/setup_peers.sh"
    version = getattr(_bcp, "__version__", "?")
    if version != VERSION:
        return False, f"bytecheckpoint {version} installed, adapter checked against {VERSION}"
    if not dist.is_available():
        return False, "torch.distributed is not available"
    return True, ""


def _framework(model: torch.nn.Module) -> str:
    from torch.distributed.fsdp import FullyShardedDataParallel

    if isinstance(model, FullyShardedDataParallel):
        return "fsdp"
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return "ddp"
    return "fsdp2" if isinstance(model, FSDPModule) else "ddp"


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model, "optimizer": optimizer}


def _wait_persisted(framework: str) -> None:
    """Block until the background persist step of the last save finished on this rank."""
    from bytecheckpoint.storage._storage import _local_storage_writer as writer

    for name in ("model", "optimizer"):
        queue = writer._sync_queues.get(f"{framework}_{name}")
        if queue is not None:
            queue.join()


def save(
    path: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    async_save: bool,
) -> tuple[float, float]:
    """Save model + optimizer to ``path``; returns (stall_seconds, committed_seconds)."""
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    from bytecheckpoint.distributed.rpc_context import setup_rpc_service

    setup_rpc_service()  # collective, one-time; idempotent afterwards
    framework = _framework(model)
    t0 = time.perf_counter()
    _bcp.save(path, _state(model, optimizer), framework=framework, fast_saving=async_save)
    stall = time.perf_counter() - t0
    _wait_persisted(framework)
    committed = time.perf_counter() - t0
    return stall, committed


def load(path: str, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
    """Load model + optimizer in place from ``path``; returns seconds."""
    ok, why = available()
    if not ok:
        raise RuntimeError(why)
    framework = _framework(model)
    t0 = time.perf_counter()
    _bcp.load(path, _state(model, optimizer), framework=framework, fast_loading=True, strict=True)
    return time.perf_counter() - t0
