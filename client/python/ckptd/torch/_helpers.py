"""ckptd.torch.save / ckptd.torch.load: model + optimizer + extra state in one call.

The state dicts come from torch.distributed.checkpoint.state_dict (get_state_dict /
set_state_dict), so plain modules, DDP, FSDP2 (fully_shard) and DTensor-parallel models all work
and each rank saves and loads only its own shards. Checkpoint ids are f"{job}/step-{step}".
"""

from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import ckptd

from . import _ids
from ._connection import connect
from ._reader import StorageReader
from ._storage import StorageWriter

EXTRA_ITEM = "extra"


@dataclass
class Loaded:
    step: int
    extra: Any  # what was passed as extra= to save(), or None


def _job(job: str | None) -> str:
    job = job or os.environ.get("CKPTD_JOB")
    if not job:
        raise ValueError("ckptd.torch: pass job= (a path such as 'runs/llama') or set CKPTD_JOB")
    return job.strip("/")


def save(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    step: int,
    *,
    job: str | None = None,
    extra: Any = None,
    socket: str | None = None,
    async_save: bool = False,
    process_group: Any = None,
) -> Any:
    """Saves model (and optimizer, and a picklable `extra`) as checkpoint step `step` of `job`.
    Blocking: returns the DCP Metadata once COMMITTED. async_save=True: returns dcp.async_save's
    future once the state is staged (copied into the daemon's arena); it completes at COMMITTED."""
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    if extra is not None:
        state[EXTRA_ITEM] = pickle.dumps(extra, protocol=pickle.HIGHEST_PROTOCOL)
    writer = StorageWriter(f"{_job(job)}/step-{int(step)}", socket=socket)
    if async_save:
        return dcp.async_save(state, storage_writer=writer, process_group=process_group)
    return dcp.save(state, storage_writer=writer, process_group=process_group)


def load(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int | str = "latest",
    *,
    job: str | None = None,
    socket: str | None = None,
    process_group: Any = None,
    prefetch: bool = False,
) -> Loaded:
    """Loads a checkpoint saved by save() (or by any DCP program with the same keys) into model
    and optimizer, in their current layout, and returns its step and extra. prefetch: the
    daemon's load hint (StorageReader's prefetch): the checkpoint comes into its RAM tier once
    for all local ranks restoring it."""
    path = _job(job)
    client = connect(socket)  # the process-wide client the reader below uses too
    if step == "latest":
        latest = client.latest(_ids.encode_job(path))
        if latest is None:
            raise ckptd.NotFoundError(f"ckptd.torch.load: job {path} has no committed checkpoint")
        step = latest
    reader = StorageReader(f"{path}/step-{int(step)}", socket=socket, prefetch=prefetch)
    names = {i["name"] for i in client.inspect(_ids.encode_job(path), int(step))}
    model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
    state: dict[str, Any] = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    if EXTRA_ITEM in names:
        state[EXTRA_ITEM] = b""
    dcp.load(state, storage_reader=reader, process_group=process_group)
    set_state_dict(
        model,
        optimizer if optimizer is not None else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}),
    )
    extra = pickle.loads(state[EXTRA_ITEM]) if EXTRA_ITEM in state else None
    return Loaded(step=int(step), extra=extra)
