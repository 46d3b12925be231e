"""Hugging Face Accelerate's save_state / load_state through ckptd.

    from accelerate import Accelerator
    import ckptd.accelerate as cka
    accelerator = Accelerator()
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    cka.load_state(accelerator, "runs/llama", missing_ok=True)   # every rank; any world size
    ...
    cka.save_state(accelerator, "runs/llama", step)              # every rank, collectively

Accelerate writes its checkpoints itself: for FSDP it calls torch.distributed.checkpoint with a
hard-coded FileSystemWriter, and otherwise torch.save / safetensors files per rank, so no option
of Accelerator points it elsewhere. These two functions are the documented replacement of
accelerator.save_state / load_state: they save and load the same state (every prepared model
and optimizer, the LR schedulers, the registered custom objects (register_for_checkpointing),
the step counter and each rank's RNG states) as one DCP checkpoint through ckptd.torch's
StorageWriter / StorageReader, with torch's own state_dict helpers, so plain modules, DDP and
FSDP2 models each save only their own shards and load at another world size (DCP reshards; the
daemon commits, with no rank-0 gather of the data).

Saves are planless (ckptd.torch.LocalPlanner with no_dist: no collective, no rank-0 gather of
plans): DTensor replicas are written by the rank at coordinate 0 of their Replicate mesh dims,
each rank's RNG item by that rank, and every other value (DDP's replicated parameters, the
schedulers, custom objects, the step) by rank 0, as DCP's dedup would keep one rank's copy of
them. save_state returns this rank's DCP Metadata (its own items).

Async: async_save=True returns dcp.async_save's future once this rank's state is staged in the
daemon's arena; it completes when the checkpoint is COMMITTED. Retention: Accelerate's
ProjectConfiguration(total_limit=N) is honoured: once a save is COMMITTED, rank 0 deletes the
job's oldest committed steps beyond N. Checkpoint ids are f"{job}/step-{step}" (ckptd.torch's),
step default: accelerator.save_iteration. Accelerate is needed only by this module.

Failures: the daemon down raises ckptd.UnavailableError naming its socket on every rank; a job
without a committed checkpoint raises ckptd.NotFoundError (missing_ok=True: returns None, the
"no checkpoint" path, for a job that has none at all); a corrupt checkpoint raises
ckptd.DataLossError naming the item; a checkpoint some rank never staged is never COMMITTED, so
"latest" never names it. Loading unpickles the non-tensor state (schedulers, custom objects,
RNG), as accelerator.load_state does: load only checkpoints you trust.
"""

from __future__ import annotations

import contextlib
import pickle
import random
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import ckptd

from .torch import _ids
from .torch._connection import connect
from .torch._errors import ckptd_errors as _ckptd_errors
from .torch._planner import LocalPlanner
from .torch._reader import StorageReader
from .torch._storage import StorageWriter

__all__ = ["load_state", "save_state"]

EXTRA = "accelerate"  # the replicated non-tensor state (pickled)


def _job(job: str) -> str:
    job = job.strip("/")
    if not job:
        raise ValueError("ckptd.accelerate: job must name the run, e.g. 'runs/llama'")
    return job


def _rank() -> tuple[int, int]:
    if tdist.is_available() and tdist.is_initialized():
        return tdist.get_rank(), tdist.get_world_size()
    return 0, 1


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "random": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _state(accelerator: Any) -> dict[str, Any]:
    """model<i> / optim<i>: the state dicts of the prepared models and optimizers, each
    optimizer paired with the model of its index (as Accelerate pairs them for FSDP)."""
    state: dict[str, Any] = {}
    models, optimizers = list(accelerator._models), list(accelerator._optimizers)
    for i, model in enumerate(models):
        optim = optimizers[i] if i < len(optimizers) else []
        model_sd, optim_sd = get_state_dict(model, optim)
        state[f"model{i}"] = model_sd
        if optim:
            state[f"optim{i}"] = optim_sd
    return state


def _extra(accelerator: Any) -> dict[str, Any]:
    return {
        "step": int(accelerator.step),
        "iteration": int(accelerator.project_configuration.iteration),
        "schedulers": [s.state_dict() for s in accelerator._schedulers],
        "custom": [o.state_dict() for o in accelerator._custom_objects],
    }


def _retain(client: Any, job: str, limit: int | None, rank: int) -> None:
    if not limit or rank != 0:
        return
    rows = [r for r in client.list(job) if r["state"] == "COMMITTED"]
    for row in rows[: max(0, len(rows) - int(limit))]:
        client.delete(job, int(row["step"]))


@contextlib.contextmanager
def _no_dist_warning() -> Iterator[None]:
    """no_dist=True warns that it assumes one process: here it is each rank's own part."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def save_state(
    accelerator: Any,
    job: str,
    step: int | None = None,
    *,
    socket: str | None = None,
    async_save: bool = False,
) -> Any:
    """accelerator.save_state through ckptd, as checkpoint f"{job}/step-{step}" (step default:
    accelerator.save_iteration). Every rank calls it. Blocking: returns the DCP Metadata once
    COMMITTED (of this rank's own items: the save is planless, see the module docstring).
    async_save=True: returns dcp.async_save's future once staged (the training may go on); it
    completes at COMMITTED. Then ProjectConfiguration.total_limit is applied to the job."""
    path = _job(job)
    step = int(accelerator.save_iteration if step is None else step)
    rank, _ = _rank()
    state = _state(accelerator)
    state[EXTRA] = pickle.dumps(_extra(accelerator), protocol=pickle.HIGHEST_PROTOCOL)
    state[f"rng.rank{rank}"] = pickle.dumps(_rng_state())  # each rank's own item
    planner = LocalPlanner(owns=lambda fqn: fqn.startswith("rng.rank") or rank == 0)
    writer = StorageWriter(f"{path}/step-{step}", socket=socket, planner=planner)
    planless: dict[str, Any] = {"planner": planner, "no_dist": True}
    limit = accelerator.project_configuration.total_limit
    encoded = _ids.encode_job(path)
    client = connect(socket)
    accelerator.project_configuration.iteration += 1
    if async_save:
        with _ckptd_errors(), _no_dist_warning():
            future: Future[Any] = dcp.async_save(state, storage_writer=writer, **planless)
        future.add_done_callback(
            lambda f: f.exception() is None and _retain(client, encoded, limit, rank)
        )
        return future
    with _ckptd_errors(), _no_dist_warning():
        metadata = dcp.save(state, storage_writer=writer, **planless)
    _retain(client, encoded, limit, rank)
    return metadata


def load_state(
    accelerator: Any,
    job: str,
    step: int | str = "latest",
    *,
    socket: str | None = None,
    missing_ok: bool = False,
) -> int | None:
    """accelerator.load_state through ckptd: loads checkpoint f"{job}/step-{step}" ("latest": the
    newest COMMITTED one) into the prepared models, optimizers, schedulers and custom objects,
    at this run's world size and layout, and restores accelerator.step and this rank's RNG
    states (where the saving run had this rank). Every rank calls it. Returns the step loaded;
    with no committed checkpoint, NotFoundError, or None when missing_ok."""
    path = _job(job)
    client = connect(socket)
    encoded = _ids.encode_job(path)
    if step == "latest":
        latest = client.latest(encoded)
        if latest is None:
            if missing_ok:
                return None
            raise ckptd.NotFoundError(
                f"ckptd.accelerate: job {path} ({encoded}) has no committed checkpoint"
            )
        step = latest
    step = int(step)
    rank, _ = _rank()
    names = {i["name"] for i in client.inspect(encoded, step)}
    state = _state(accelerator)
    state[EXTRA] = b""
    mine = f"rng.rank{rank}"
    if mine in names:
        state[mine] = b""
    with _ckptd_errors():
        dcp.load(state, storage_reader=StorageReader(f"{path}/step-{step}", socket=socket))
    models, optimizers = list(accelerator._models), list(accelerator._optimizers)
    for i, model in enumerate(models):
        optim = optimizers[i] if i < len(optimizers) else []
        set_state_dict(
            model,
            optim,
            model_state_dict=state[f"model{i}"],
            optim_state_dict=state.get(f"optim{i}", {}),
        )
    extra = pickle.loads(state[EXTRA])
    for scheduler, sd in zip(accelerator._schedulers, extra["schedulers"], strict=True):
        scheduler.load_state_dict(sd)
    for obj, sd in zip(accelerator._custom_objects, extra["custom"], strict=True):
        obj.load_state_dict(sd)
    accelerator.step = extra["step"]
    accelerator.project_configuration.iteration = extra["iteration"] + 1
    if state.get(mine):
        _set_rng_state(pickle.loads(state[mine]))
    return step
