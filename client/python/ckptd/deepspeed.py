"""Saves a DeepSpeed engine's ZeRO state through ckptd and loads it at another data-parallel size
and another ZeRO stage, reading only each rank's bytes.

    import ckptd, ckptd.deepspeed as ckds
    client = ckptd.connect()
    ckds.save(engine, client, "run42", step)                  # every rank, collectively
    ...
    state = ckds.load(engine, client, "run42")                # any DP size, ZeRO stage 1, 2 or 3

No gather and no consolidation: a ZeRO partition is a contiguous range of the flattened
parameters, so each rank's piece of each parameter is saved as a Flat region of that parameter's
global fp32 master (and of each Adam moment); a load at another layout reads the Flat regions its
own partition covers. What a checkpoint holds (the convention `ckptd-import --format deepspeed`
writes too, so an imported DeepSpeed checkpoint loads here):

- `fp32/<param>`: the fp32 master of each trainable parameter, its full shape, saved as the DP
  ranks' Flat pieces (checkpoint rank = DP rank, world size = DP size);
- `optim/<key>/<param>`: every optimizer state tensor with the parameter's size (Adam's `exp_avg`
  and `exp_avg_sq`), the same regions;
- `frozen/<param>` (parameters without gradients) and `buffer/<name>` (the module's persistent
  buffers): whole, saved by rank 0, in their own dtypes;
- the object `deepspeed`: JSON (never pickle) with the ZeRO stage and DP size it was saved at, the
  parameters in the optimizer's order with their shapes and groups, the optimizer keys, each
  group's hyperparameters and step, the engine's counters (global_steps, global_samples,
  skipped_steps), the LR scheduler's state and the loss scaler's numbers;
- the object `client_state` (pickled, as torch.save would) when save() is given one.

Load refreshes the low-precision model weights from the loaded fp32 masters, as DeepSpeed's own
load does. The model must have the same parameter names and shapes (tensor, pipeline and expert
parallelism are not supported: the engine's model-parallel size must be 1; ckptd.layouts covers
tensor-parallel layouts outside DeepSpeed). DeepSpeed is needed only by this module.
"""

from __future__ import annotations

import json
import pickle
import time
from dataclasses import dataclass, field
from typing import Any

import deepspeed.comm as dist
import torch

from . import _arrays
from ._client import Client, Flat, Raw, SaveHandle, Shard
from ._zero import Zero
from .layouts import Layouts

META = "deepspeed"
CLIENT_STATE = "client_state"
FORMAT = 1

__all__ = ["CLIENT_STATE", "META", "LoadedState", "load", "save"]


@dataclass
class LoadedState:
    """What load() restored besides the tensors."""

    step: int  # the ckptd step loaded
    client_state: Any  # save()'s client_state, or None
    saved_zero_stage: int
    saved_dp_world_size: int
    bytes_read: int  # bytes this rank's loads read from the daemon's storage
    # where this rank's load went: "check" (the step, the metadata, the model check), "read"
    # (the tensors, into the optimizer's own memory), "refresh" (the model's weights from the fp32
    # masters: DeepSpeed's all-gather at ZeRO 1/2), "rest" (counters, client_state, the barrier)
    seconds: dict[str, float] = field(default_factory=dict)


def _json_safe(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    if torch.is_tensor(value) and value.numel() == 1:
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"ckptd.deepspeed: {type(value).__name__} in the optimizer or scheduler state")


def _hyperparameters(group: dict[str, Any]) -> dict[str, Any]:
    return {k: _json_safe(v) for k, v in group.items() if k != "params"}


def _loss_scaler(zo: Any) -> dict[str, Any] | None:
    scaler = getattr(zo, "loss_scaler", None)
    if scaler is None:
        return None
    return {
        k: v for k, v in vars(scaler).items() if isinstance(v, (bool, int, float)) and v is not None
    }


def _persistent_buffers(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    keys = set(module.state_dict().keys())
    return {n: b for n, b in module.named_buffers() if n in keys}


def _frozen(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in module.named_parameters() if not p.requires_grad}


def _meta(z: Zero, keys: list[str], frozen: list[str], buffers: list[str]) -> dict[str, Any]:
    engine = z.engine
    scheduler = engine.lr_scheduler
    return {
        "format": FORMAT,
        "source": "adapter",
        "zero_stage": z.stage,
        "dp_world_size": z.dp_size,
        "ds_version": _ds_version(),
        "params": [
            {"name": z.name(p), "shape": z.shape(p), "group": z.param_group(i)}
            for i, p in z.params()
        ],
        "frozen": sorted(frozen),
        "buffers": sorted(buffers),
        "optim_keys": keys,
        "param_groups": [_hyperparameters(g) for g in z.zo.optimizer.param_groups],
        "optim_steps": z.steps(),
        "global_steps": int(engine.global_steps),
        "global_samples": int(engine.global_samples),
        "skipped_steps": int(engine.skipped_steps),
        "lr_scheduler": None if scheduler is None else _json_safe(scheduler.state_dict()),
        "loss_scaler": _loss_scaler(z.zo),
    }


def _ds_version() -> str:
    import deepspeed

    return str(deepspeed.__version__)


def _gathered(params: list[torch.nn.Parameter], modifier: int | None) -> Any:
    """ZeRO-3's partitioned parameters gathered for the block (modifier_rank: its changes are
    broadcast from that rank and partitioned again); nothing for an empty list."""
    import deepspeed

    return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier, enabled=bool(params))


def save(
    engine: Any,
    client: Client,
    job: str,
    step: int,
    *,
    client_state: Any = None,
    blocking: bool = True,
    layouts: Layouts | None = None,
) -> SaveHandle:
    """Saves the engine's fp32 masters, optimizer state and counters as checkpoint (job, step).
    Every DP rank calls it (collectively); each saves only its own ZeRO partition, copied once
    into the daemon's staging arena. Returns once this rank's part is staged (blocking) or at
    once; training may go on once handle.staged() resolved. handle.committed() resolves when the
    checkpoint is durable. layouts: the parameters padded along dim 0 (a vocabulary:
    ckptd.layouts.Padded(0, logical)) are saved without their padding rows, so a model padded to
    another multiple loads them."""
    z = Zero(engine, layouts)
    keys = z.optim_keys()
    tensors: dict[str, Any] = {}
    for piece in z.pieces(keys):
        if piece.count == 0:
            continue  # all padding
        region = Flat(piece.start, piece.count)
        tensors[f"fp32/{piece.name}"] = Shard(piece.logical(piece.fp32), piece.shape, region)
        for k, view in piece.optim.items():
            tensors[f"optim/{k}/{piece.name}"] = Shard(piece.logical(view), piece.shape, region)
    frozen = _frozen(engine.module)
    objects: dict[str, Any] = {}
    with _gathered(list(frozen.values()) if z.stage == 3 else [], None):
        error: BaseException | None = None
        if z.dp_rank == 0:
            try:
                for name, p in frozen.items():
                    tensors[f"frozen/{name}"] = p.detach().contiguous()
                buffers = _persistent_buffers(engine.module)
                for name, b in buffers.items():
                    tensors[f"buffer/{name}"] = b.detach().contiguous()
                meta = _meta(z, keys, list(frozen), list(buffers))
                meta["client_state"] = client_state is not None
                objects[META] = Raw(json.dumps(meta).encode())
                if client_state is not None:
                    objects[CLIENT_STATE] = client_state
            except Exception as e:  # e.g. a scheduler state JSON cannot hold
                error = e
        _agree(z.group, error)  # no rank stages a checkpoint that rank 0 cannot complete
        # ZeRO-3's gathered frozen parameters are freed when the block ends: staged before that
        handle = client.save(
            job,
            step,
            tensors,
            objects,
            rank=z.dp_rank,
            world_size=z.dp_size,
            blocking=blocking or (z.stage == 3 and bool(frozen)),
        )
    return handle


def _agree_on_step(client: Client, job: str, step: int | str, group: Any) -> int:
    """The step every rank loads: "latest" is resolved by DP rank 0 and broadcast, so a commit
    between two ranks' calls cannot split them."""
    box: list[Any] = [None]
    if dist.get_rank(group=group) == 0:
        try:
            box[0] = client._resolve_step(job, step)
        except Exception as e:  # every rank raises the same error
            box[0] = e
    dist.broadcast_object_list(box, src=dist.get_global_rank(group, 0), group=group)
    if isinstance(box[0], BaseException):
        raise box[0]
    return int(box[0])


def _agree(group: Any, error: BaseException | None) -> None:
    """Every DP rank learns whether any rank failed since the last collective: this rank's own
    error is raised again, and a rank that did not fail raises RuntimeError naming the ranks that
    did. Without it, a failure on one rank (a read error, rank 0's metadata) would leave the
    others waiting in the next collective until the process group's timeout."""
    outcomes: list[Any] = [None] * dist.get_world_size(group=group)
    dist.all_gather_object(outcomes, None if error is None else str(error), group=group)
    if error is not None:
        raise error
    failed = {r: why for r, why in enumerate(outcomes) if why is not None}
    if failed:
        first = next(iter(failed))
        raise RuntimeError(
            f"ckptd.deepspeed: DP ranks {sorted(failed)} failed (rank {first}: {failed[first]})"
        )


def _check_whole(
    client: Client, job: str, step: int, meta: dict[str, Any], wanted: dict[str, torch.Tensor]
) -> None:
    """The frozen parameters and buffers a load reads whole: each in the checkpoint with the
    engine's dtype and shape (a whole load checks only the byte count). A frozen parameter the
    checkpoint does not hold is an error; a buffer it does not hold keeps its value."""
    where = f"ckptd.deepspeed: job {job} step {step}"
    frozen = [k.split("/", 1)[1] for k in wanted if k.startswith("frozen/")]
    missing = sorted(set(frozen) - set(meta.get("frozen") or []))
    if missing:
        raise ValueError(f"{where} holds no frozen parameters {missing[:8]}")
    items = {row["name"]: row for row in client.inspect(job, step)}
    for item, t in wanted.items():
        row = items.get(item)
        if row is None:
            continue  # a buffer the checkpoint does not hold (checked by name above for frozen)
        mine = (_arrays.dtype_name(t), [int(d) for d in t.shape])
        theirs = (str(row["dtype"]), [int(d) for d in row["shape"]])
        if mine != theirs:
            raise ValueError(
                f"{where}: {item} was saved as {theirs[0]} {theirs[1]}, the engine's is "
                f"{mine[0]} {mine[1]}"
            )


def _check_params(meta: dict[str, Any], z: Zero, job: str, step: int) -> None:
    saved = {p["name"]: [int(d) for d in p["shape"]] for p in meta["params"]}
    mine = {z.name(p): z.shape(p) for _, p in z.params()}
    where = f"ckptd.deepspeed: job {job} step {step}"
    missing = sorted(set(mine) - set(saved))
    if missing:
        raise ValueError(f"{where} has no fp32 master for the engine's parameters {missing[:8]}")
    extra = sorted(set(saved) - set(mine))
    if extra:
        raise ValueError(f"{where} holds parameters the engine does not have: {extra[:8]}")
    for name, shape in mine.items():
        if saved[name] != shape:
            hint = ""
            if len(shape) == len(saved[name]) and shape[1:] == saved[name][1:]:
                hint = (
                    f" (if its rows past {saved[name][0]} are padding, declare it: "
                    f"layouts=Layouts({{{name!r}: Padded(0, {saved[name][0]})}}))"
                )
            raise ValueError(
                f"{where}: parameter {name} was saved with shape {saved[name]}, the engine's is "
                f"{shape}{hint}"
            )


def _read_meta(client: Client, job: str, step: int) -> dict[str, Any]:
    raw = client.load_object(job, step, META, raw=True)
    try:
        meta = json.loads(raw)
    except ValueError as e:
        raise ValueError(
            f"ckptd.deepspeed: job {job} step {step}: the {META} object is not JSON ({e})"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(
            f"ckptd.deepspeed: job {job} step {step} is not a DeepSpeed checkpoint of format "
            f"{FORMAT} (its {META} object says {str(meta)[:80]})"
        )
    return meta


def _restore_scalars(z: Zero, meta: dict[str, Any], optimizer: bool, scheduler: bool) -> None:
    engine = z.engine
    engine.global_steps = int(meta.get("global_steps") or 0)
    engine.global_samples = int(meta.get("global_samples") or 0)
    engine.skipped_steps = int(meta.get("skipped_steps") or 0)
    if scheduler and engine.lr_scheduler is not None and meta.get("lr_scheduler"):
        engine.lr_scheduler.load_state_dict(meta["lr_scheduler"])
    if not optimizer:
        return
    groups = z.zo.optimizer.param_groups
    saved_groups = meta.get("param_groups") or []
    if len(saved_groups) != len(groups):
        raise ValueError(
            f"ckptd.deepspeed: the checkpoint has {len(saved_groups)} parameter groups, the "
            f"engine's optimizer {len(groups)}"
        )
    for group, saved in zip(groups, saved_groups, strict=True):
        for k, v in saved.items():
            if k in group and k != "params":
                group[k] = tuple(v) if isinstance(group[k], tuple) else v
    for g, step in enumerate(meta.get("optim_steps") or []):
        if step is not None and g < len(groups):
            z.set_step(g, step)
    scaler = getattr(z.zo, "loss_scaler", None)
    for k, v in (meta.get("loss_scaler") or {}).items():
        if scaler is not None and hasattr(scaler, k):
            setattr(scaler, k, v)


def load(
    engine: Any,
    client: Client,
    job: str,
    step: int | str = "latest",
    *,
    load_optimizer_states: bool = True,
    load_lr_scheduler: bool = True,
    load_client_state: bool = True,
    layouts: Layouts | None = None,
) -> LoadedState:
    """Loads checkpoint (job, step) into the engine, whatever DP size and ZeRO stage it was saved
    at: each rank reads only the Flat regions its own partition covers, straight into the fp32
    master and optimizer state (one copy, out of the daemon's arena). Every DP rank calls it
    (collectively). Then the model's weights are refreshed from the masters, and the optimizer's
    steps and hyperparameters, the engine's counters, the LR scheduler and the loss scaler are
    restored. Raises ValueError naming the difference when the model does not match (before
    anything is read), on every rank. A failure of one rank's reads is raised on every rank (a
    RuntimeError naming it elsewhere) before the next collective, never left waiting in it; the
    engine's tensors then hold a partial load and must not be trained on. layouts: as for save
    (the padding rows of the engine's parameters are zero-filled). load_client_state: save()'s
    client_state is unpickled, as torch.load(weights_only=False) would: load only checkpoints
    you trust with it, or pass False."""
    clock = [time.monotonic()]
    seconds: dict[str, float] = {}

    def lap(phase: str) -> None:
        now = time.monotonic()
        seconds[phase] = now - clock[0]
        clock[0] = now

    z = Zero(engine, layouts)
    resolved = _agree_on_step(client, job, step, z.group)
    try:
        meta = _read_meta(client, job, resolved)
        _check_params(meta, z, job, resolved)
        frozen = _frozen(engine.module)
        whole = {f"frozen/{n}": p for n, p in frozen.items()}
        if z.stage == 3:  # partitioned: their full shapes
            whole = {
                k: torch.empty(getattr(p, "ds_shape", p.shape), dtype=p.dtype, device="meta")
                for k, p in whole.items()
            }
        buffers = {
            f"buffer/{n}": b
            for n, b in _persistent_buffers(engine.module).items()
            if n in (meta.get("buffers") or [])
        }
        _check_whole(client, job, resolved, meta, {**whole, **buffers})
        saved_keys = sorted(meta.get("optim_keys") or [])
        keys: list[str] = []
        if load_optimizer_states:
            missing = sorted(set(z.optim_keys()) - set(saved_keys))
            if missing:
                raise ValueError(
                    f"ckptd.deepspeed: job {job} step {resolved} has no optimizer state "
                    f"{missing} (it holds {saved_keys}); load with load_optimizer_states=False"
                )
            z.ensure_state(saved_keys)
            keys = z.optim_keys()
        pieces = z.pieces(keys)
    except Exception as e:
        _agree(z.group, e)  # raises e here, and on the other ranks an error naming this one
        raise
    _agree(z.group, None)
    lap("check")
    targets: list[tuple[str, Any, Any]] = []
    for piece in pieces:
        with torch.no_grad():  # the fp32 partition is a leaf that requires grad
            for view in (piece.fp32, *piece.optim.values()):
                piece.padding(view).zero_()  # padding rows are never stored
        if piece.count == 0:
            continue
        region = Flat(piece.start, piece.count)
        targets.append((f"fp32/{piece.name}", region, piece.logical(piece.fp32)))
        targets.extend(
            (f"optim/{k}/{piece.name}", region, piece.logical(v)) for k, v in piece.optim.items()
        )
    targets.extend((item, None, b.data) for item, b in buffers.items())
    error: BaseException | None = None
    read = 0
    try:
        read = client.load_into(job, resolved, targets, rank=z.dp_rank)
    except Exception as e:
        error = e
    with _gathered(list(frozen.values()) if z.stage == 3 else [], 0):
        if error is None and (z.stage != 3 or z.dp_rank == 0):
            wanted = [(f"frozen/{n}", None, p.data) for n, p in frozen.items()]
            try:
                read += client.load_into(job, resolved, wanted, rank=z.dp_rank)
            except Exception as e:  # the block's exit still broadcasts, as on every rank
                error = e
    _agree(z.group, error)  # before the refresh's all-gather
    lap("read")
    z.refresh_lp(pieces)
    lap("refresh")
    _restore_scalars(z, meta, load_optimizer_states, load_lr_scheduler)
    state = None
    if meta.get("client_state") and load_client_state:
        state = pickle.loads(client.load_object(job, resolved, CLIENT_STATE, raw=True))
    dist.barrier(group=z.group)
    lap("rest")
    return LoadedState(
        step=resolved,
        client_state=state,
        saved_zero_stage=int(meta["zero_stage"]),
        saved_dp_world_size=int(meta["dp_world_size"]),
        bytes_read=read,
        seconds=seconds,
    )
