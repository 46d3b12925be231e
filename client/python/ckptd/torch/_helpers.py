"""ckptd.torch.save / ckptd.torch.load: model + optimizer + extra state in one call.

The state dicts come from torch.distributed.checkpoint.state_dict (get_state_dict /
set_state_dict), so plain modules, DDP, FSDP2 (fully_shard) and DTensor-parallel models all work
and each rank saves and loads only its own shards. Checkpoint ids are f"{job}/step-{step}".

save() is planless by default: dcp.save(..., planner=LocalPlanner(), no_dist=True), so no rank
gathers plans or results and none receives a Metadata of every chunk; each rank hands its own
part to the daemon as rank r of N and waits for the commit (_planner.py says who writes what).
planless=False runs DCP's collective planning instead (its rank-0 gather), for state dicts whose
non-DTensor values differ between ranks (e.g. a pipeline stage's plain parameters).
"""

from __future__ import annotations

import os
import pickle
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import ckptd

from . import _ids
from ._connection import connect
from ._planner import LocalPlanner
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
    model: torch.nn.Module | Mapping[str, Any],
    optimizer: torch.optim.Optimizer | None = None,
    step: int | None = None,
    *,
    job: str | None = None,
    extra: Any = None,
    socket: str | None = None,
    async_save: bool = False,
    overlap: bool = False,
    process_group: Any = None,
    planless: bool = True,
    owns: Callable[[str], bool] | None = None,
    tier_policy: str = "default",
    commit_timeout_ms: int = 3600 * 1000,
) -> Any:
    """Saves a model (and optimizer, and a picklable `extra`) or a DCP state dict as checkpoint
    step `step` of `job`: save(model, optimizer, step, job=...) or save(state_dict, step=...,
    job=...). Every rank of `process_group` (default: the default group) calls it.

    planless (the default): no collective at all (module docstring); DTensor replicas are
    written by the rank at coordinate 0 of their Replicate mesh dims, other values by rank 0 of
    the group, or by the ranks `owns(fqn)` names (ckptd.torch.LocalPlanner). planless=False: DCP's
    collective planning. Blocking: returns once COMMITTED, with DCP's Metadata (planless: of
    this rank's own items). async_save=True: returns dcp.async_save's future once the state is
    staged (copied into the daemon's arena); it completes at COMMITTED. overlap=True (the
    overlapped save; call it right after optimizer.step()): returns at once DCP's
    AsyncSaveResponse — the state is staged on a background thread while forward and backward
    run. The next optimizer.step() of `optimizer` waits for .staging_completion by itself (a
    one-shot step pre-hook); anything else that changes the state before then (a state dict
    passed instead of a model, a manual write) must wait for it first. .upload_completion
    resolves at COMMITTED."""
    if step is None:
        raise TypeError("ckptd.torch.save: step is required")
    if isinstance(model, Mapping):
        if optimizer is not None:
            raise TypeError("ckptd.torch.save: a state dict is saved without an optimizer")
        state: dict[str, Any] = dict(model)
    else:
        model_sd, optim_sd = get_state_dict(model, optimizer if optimizer is not None else [])
        state = {"model": model_sd}
        if optimizer is not None:
            state["optim"] = optim_sd
    if extra is not None:
        state[EXTRA_ITEM] = pickle.dumps(extra, protocol=pickle.HIGHEST_PROTOCOL)
    planner = LocalPlanner(process_group=process_group, owns=owns) if planless else None
    writer = StorageWriter(
        f"{_job(job)}/step-{int(step)}",
        socket=socket,
        planner=planner,
        tier_policy=tier_policy,
        commit_timeout_ms=commit_timeout_ms,
        async_staging=overlap,
    )
    kwargs: dict[str, Any] = {"storage_writer": writer, "process_group": process_group}
    if planless:
        kwargs.update(planner=planner, no_dist=True)
    with warnings.catch_warnings():
        # no_dist=True warns that it assumes one process: here it is every rank's own part
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        if overlap:
            resp = dcp.async_save(state, **kwargs)
            if optimizer is not None:
                _wait_before_next_step(optimizer, resp.staging_completion)
            return resp
        if async_save:
            return dcp.async_save(state, **kwargs)
        return dcp.save(state, **kwargs)


def _wait_before_next_step(optimizer: torch.optim.Optimizer, staged: Any) -> None:
    """The overlapped save's safety: the optimizer's next step() first waits until the save is
    staged (raising its error), since that step is the first change to the state it copies; the
    hook then removes itself."""
    hook: Any = None

    def wait(*_: Any) -> None:
        try:
            staged.result()
        finally:
            hook.remove()

    hook = optimizer.register_step_pre_hook(wait)


def load(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    step: int | str = "latest",
    *,
    job: str | None = None,
    socket: str | None = None,
    process_group: Any = None,
    prefetch: bool = False,
    planless: bool = True,
) -> Loaded:
    """Loads a checkpoint saved by save() (or by any DCP program with the same keys) into model
    and optimizer, in their current layout, and returns its step and extra. prefetch: the
    daemon's load hint (StorageReader's prefetch): the checkpoint comes into its RAM tier once
    for all local ranks restoring it. planless (the default): no collective at all — each rank
    plans its own reads against the checkpoint's one manifest (dcp.load(..., no_dist=True));
    planless=False: DCP's collective load planning (rank 0 gathers and scatters N plans)."""
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
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, process_group=process_group, no_dist=planless)
    set_state_dict(
        model,
        optimizer if optimizer is not None else [],
        model_state_dict=state["model"],
        optim_state_dict=state.get("optim", {}),
    )
    extra = pickle.loads(state[EXTRA_ITEM]) if EXTRA_ITEM in state else None
    return Loaded(step=int(step), extra=extra)
