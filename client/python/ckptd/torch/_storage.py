"""ckptd as a torch.distributed.checkpoint (DCP) backend: the StorageWriter (and AsyncStager).

Mapping. Each DCP write item becomes one ckptd shard of item `fqn` (the flattened state-dict key)
covering the chunk's box of the global tensor; byte items (non-tensor objects) become replicated
object items. The reader (_reader.py) describes every tensor as one chunk covering the whole
tensor, so DCP asks for exactly the boxes each rank needs and the daemon's load planner finds the
saved shards and reads only the needed byte runs: any layout loads any other.

Per-save state. DCP 2.13 may hand write_data a plan from an earlier save (plan caching:
DefaultSavePlanner(enable_plan_caching=True) replaces an unchanged plan by the cached one, with
that save's storage_data) and calls reset() only when dcp.save gets a checkpoint_id. So the step
and everything else that names this save is set in set_up_storage_writer, which DCP calls on every
rank of every save, and never read from plan.storage_data; the storage_data the coordinator
attaches (_PlanData) holds only what a cached plan keeps valid: the number of ranks planning
together and the flattening mappings.

Commit. With collectives (the default), every rank of the save stages its shards as rank r of
world_size ranks and the daemon commits once all have; finish() (the coordinator) waits for
COMMITTED, and DCP's closing all_reduce makes every rank wait for it. Planless (write_data is
handed a ckptd.torch.LocalPlanner and DCP planned this rank alone: no_dist=True): the rank and
world size come from the planner, every rank stages its part of the one checkpoint as rank r of
N with no gather, scatter or broadcast, and every rank's finish() waits for COMMITTED. Rank 0
records its flattening mappings (PLANNER_DATA_ITEM); every other rank those of the nested items it
writes (rank_mappings_item(r)), for the names rank 0 lacks (the reader merges them). stage() must
plan the same way: a planless write_data after a stage() planned by DCP's planner (a writer built
without planner=) is refused.
With use_collectives=False (and DCP's planner) each rank plans alone and saves its part as a
checkpoint of its own (job part_job(job, rank), rank 0 of 1) which commits on its own; each
rank's finish() waits for its part. The reader serves a part with read_metadata(rank=r) and all
parts together with read_metadata().

async_save. The writer is DCP's AsyncStager: stage() copies each local tensor once, straight into
the staging arena, and - when the checkpoint_id names a step - hands the shards to the daemon right
away, so the checkpoint is staged (it completes even if the trainer dies) and the tensors are free
to change. It then returns a reference state dict: the same structure with meta tensors (no bytes),
which is all DCP's planning needs, so a process-based async_save sends no tensor bytes to its
checkpoint process. With async_staging=True stage() does that in a background thread and returns
a Future, and async_save returns AsyncSaveResponse(staging_completion, upload_completion).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future as _ConcurrentFuture
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

# The format version FileSystemWriter records; finish() records the same.
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION as DCP_VERSION
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageWriter as _DcpWriter
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future

import ckptd

from . import _ids
from ._connection import LazyClient, rank_world
from ._planner import LocalPlanner

__all__ = ["DCP_VERSION", "StorageWriter", "refuse_extensions"]


@dataclasses.dataclass(frozen=True)
class _PlanData:
    """What the coordinator attaches to every rank's global plan. Only what stays true while DCP
    reuses a cached plan: never the step (see the module docstring)."""

    world_size: int  # ranks that planned together (1 with no_dist or use_collectives=False)
    planner_data: Any = None  # the merged flattening mappings: rank 0 saves them


@dataclasses.dataclass(frozen=True)
class _StagedSave:
    """Shards stage() already handed to the daemon: (job, step) as rank/world_size."""

    job: str
    step: int
    rank: int
    world_size: int
    sizes: dict[Any, int]  # _index_key -> bytes
    planless: bool  # planned with the writer's LocalPlanner (this rank's items only)


def refuse_extensions(extensions: Sequence[Any] | None, what: str) -> None:
    """ValueError naming each DCP _extensions entry (StreamTransformExtension, e.g. ZStandard):
    ckptd stores every shard's bytes as given, checksummed, and serves loads by byte range of the
    global tensor (resharding), which a byte-stream transform would break."""
    if not extensions:
        return
    names = []
    for ext in extensions:
        try:
            names.append(str(ext.get_descriptor()))
        except Exception:  # not an Extension at all: name its type
            names.append(type(ext).__name__)
    raise ValueError(
        f"ckptd {what}: _extensions {names} are not supported: ckptd stores each shard's bytes "
        "as saved (checksummed, read back by byte range for resharding), so DCP stream "
        "transforms such as compression cannot be applied; remove _extensions"
    )


def _tensor_item(item: WriteItem, tensor: torch.Tensor) -> tuple[str, ckptd.Shard]:
    td = item.tensor_data
    assert td is not None
    size = [int(d) for d in td.size]
    offsets = [int(o) for o in td.chunk.offsets]
    lengths = [int(n) for n in td.chunk.sizes]
    tensor = tensor.detach()  # a GPU tensor is copied device to arena by Client.save
    if tensor.device.type == "meta":
        raise RuntimeError(
            f"ckptd: item {item.index.fqn} is a reference (meta tensor) from stage(), not data: "
            "save the state dict that stage() was given, or give the writer a checkpoint_id with "
            "a step before async_save"
        )
    if list(tensor.shape) != lengths:
        tensor = tensor.reshape(lengths)
    whole = lengths == size and not any(offsets)
    region = None if whole else ckptd.Box(offsets, lengths)
    return item.index.fqn, ckptd.Shard(tensor, size, region)


def _index_key(index: MetadataIndex) -> tuple[str, tuple[int, ...] | None]:
    return index.fqn, None if index.offset is None else tuple(int(o) for o in index.offset)


def _write_results(items: list[WriteItem], sizes: dict[Any, int]) -> list[WriteResult]:
    return [
        WriteResult(
            index=i.index, size_in_bytes=sizes.get(_index_key(i.index), 0), storage_data=None
        )
        for i in items
    ]


def _own_mappings(planner: SavePlanner, items: list[WriteItem]) -> dict[str, Any]:
    """A planless rank's extra object: {rank_mappings_item(r): the flattening mappings of the
    items it writes}, nested ones only (a flat key needs none), or {} when there are none. Rank 0
    records all of its mappings anyway; the reader takes a name rank 0 lacks from the rank that
    wrote it (e.g. "optim.state.5.step" -> ("optim", "state", 5, "step"), which the name alone
    does not tell)."""
    mappings = getattr(planner, "mappings", None) or {}
    written = {i.index.fqn for i in items}
    own = {k: v for k, v in mappings.items() if k in written and tuple(v) != (k,)}
    rank = int(getattr(planner, "rank", 0))
    return {_ids.rank_mappings_item(rank): own} if own and rank > 0 else {}


def _chunks(items: list[WriteItem]) -> dict[str, dict[str, Any]]:
    """A rank-local part's record of its chunks, by item: {"size": global size, "chunks":
    [(offsets, sizes)]}. The part stores each chunk as a whole tensor of that name (a daemon
    checkpoint covers every item it holds), so this is where the global layout lives."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        td = item.tensor_data
        if item.type != WriteItemType.BYTE_IO and td is not None:
            box = ([int(o) for o in td.chunk.offsets], [int(n) for n in td.chunk.sizes])
            rec = out.setdefault(item.index.fqn, {"size": [int(d) for d in td.size], "chunks": []})
            rec["chunks"].append(box)
    return out


class StorageWriter(LazyClient, _DcpWriter, AsyncStager):
    """DCP StorageWriter (and AsyncStager) over ckptd.

    StorageWriter("runs/llama/step-100") or StorageWriter(checkpoint_id=...): see _ids for the
    id rules. socket: the daemon's socket (default $CKPTD_SOCKET). async_staging: stage() runs in
    a background thread and returns a Future (DCP's StagingOptions.use_async_staging), so
    dcp.async_save returns AsyncSaveResponse. _extensions (DCP's stream transforms) are refused
    with ValueError. planner: the LocalPlanner stage() plans with when async_save hands over the
    shards at once (a step in the id); pass the same one to dcp.async_save (planless saves, see
    ckptd.torch.save). Picklable: the connection is made again on first use in another
    process."""

    _synchronize_after_execute: bool = False  # stage() returns with the copy done

    def __init__(
        self,
        checkpoint_id: str | os.PathLike[str] | None = None,
        *,
        socket: str | None = None,
        commit_timeout_ms: int = 3600 * 1000,
        async_staging: bool = False,
        tier_policy: str = "default",
        local_world_size: int | None = None,
        planner: LocalPlanner | None = None,
        _extensions: Sequence[Any] | None = None,
    ) -> None:
        super().__init__()
        self.planner = planner
        refuse_extensions(_extensions, "StorageWriter")
        self.socket = socket
        # The tiers the checkpoints this writer saves are made durable on: "default" (the
        # daemon's tier_policy), "local", "local+remote", "remote" (docs/OPERATIONS.md "Tiers")
        # or "local+peer" (docs/PEERS.md "Committing at the peer tier").
        self.tier_policy = tier_policy
        # The ranks saving through this node's daemon (None: torchrun's LOCAL_WORLD_SIZE). Below
        # the world size, each node's daemon takes its ranks and they commit together through
        # the shared tier (docs/OPERATIONS.md "Checkpoints that span nodes"; needs a remote tier).
        self.local_world_size = local_world_size
        self.commit_timeout_ms = commit_timeout_ms
        self.async_staging = async_staging
        self._client: ckptd.Client | None = None
        self._id: _ids.CheckpointId | None = None
        self.checkpoint_id: str | None = None
        self._lock = threading.Lock()  # the staging thread against the trainer thread
        self._pool: ThreadPoolExecutor | None = None
        self._staging: _ConcurrentFuture[dict[str, Any]] | None = None
        self._saved_at_stage: _StagedSave | None = None
        self._staged_views: list[torch.Tensor] = []
        self._clear()
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    def _clear(self) -> None:
        """Per-save state; stage()'s handover (_saved_at_stage) is kept by its own rules."""
        self.step: int | None = None
        self.rank = 0
        self.world_size = 1  # ranks of the daemon checkpoint this save writes (set by write_data)
        self.is_coordinator = False
        self.use_collectives = True
        self.job: str | None = None  # where this save's shards go (a part job without collectives)

    def __getstate__(self) -> dict[str, Any]:
        """Without the connection, thread or views. stage()'s handover travels with the copy:
        a process-based async_save pickles the writer to run dcp.save in its checkpoint process,
        which then finishes that checkpoint, so this writer forgets it (a later reset() to
        another id must not abort it). Refused while the writer holds staged views that were
        not handed over (an id without a step): the copy would need those tensors' bytes, which
        torch would move to new shared memory and the other process copy again."""
        self._wait_staging()
        if self._staged_views:
            what = "no checkpoint_id" if self._id is None else f"checkpoint_id {self._id.raw!r}"
            raise RuntimeError(
                f"ckptd StorageWriter: stage() ran with {what} and no step, so it kept the "
                "tensors for planning; a process-based async_save would copy their bytes to the "
                "checkpoint process twice more. Give the writer an id with a step (e.g. "
                "'runs/llama/step-100') before async_save, or use the thread executor"
            )
        state = super().__getstate__()
        state.update(_staged_views=[], _pool=None, _staging=None, _lock=None)
        self._saved_at_stage = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # --- StorageWriter ----------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new save: replaces the checkpoint id (when given) and clears per-save state."""
        self._wait_staging()
        pending = self._saved_at_stage
        if checkpoint_id is not None:
            new_id = _ids.parse(checkpoint_id)
            if pending is not None and self._id is not None and new_id.raw != self._id.raw:
                # stage() already handed shards to the daemon under the old id: abort that one
                # (it may have committed already: a one-rank checkpoint commits once staged).
                self._saved_at_stage = None
                try:
                    self.client.abort(
                        pending.job, pending.step, "checkpoint_id changed after stage()"
                    )
                    fate = "aborted"
                except ckptd.CkptdError as e:
                    fate = f"not aborted ({e})"
                self._id = new_id
                self.checkpoint_id = new_id.raw
                self._clear()
                raise ValueError(
                    "ckptd StorageWriter: with async_save, give the checkpoint_id to the writer "
                    f"(constructor or reset()), not to async_save: stage() ran with the old id "
                    f"and saved job {pending.job} step {pending.step}, now {fate}"
                )
            self._id = new_id
            self.checkpoint_id = new_id.raw
        self._clear()
        if self._id is not None:
            self.step = self._id.step

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            _ids.parse(checkpoint_id)
        except ValueError:
            return False
        return True

    def storage_meta(self) -> StorageMeta | None:
        """What DCP hands the planner before set_up_storage_writer: the checkpoint_id as given.
        finish() records the full one (with save_id) in the Metadata DCP returns."""
        return StorageMeta(checkpoint_id=self.checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Called by DCP on every rank of every save (reset() is not): per-save state starts here.
        A checkpoint_id without a step takes the job's next free step, which every rank reads from
        the daemon here, before DCP's plan exchange lets any rank of this save write."""
        if self._id is None:
            raise ValueError(
                "ckptd StorageWriter: no checkpoint_id (pass one to the constructor, "
                "to dcp.save, or to reset())"
            )
        self._wait_staging()
        self._clear()
        self.is_coordinator = is_coordinator
        self.rank = int(kwargs["rank"]) if kwargs.get("rank") is not None else rank_world()[0]
        self.use_collectives = bool(kwargs.get("use_collectives", True))
        staged = self._saved_at_stage
        if staged is not None and staged.job == self._id.job and staged.step == self._id.step:
            # stage() handed the shards over as rank r of the default group's ranks: that
            # checkpoint (also with use_collectives=False) is the one to finish.
            self.step, self.job = staged.step, staged.job
            return
        if self._id.step is not None:
            self.step = self._id.step
        elif not self.use_collectives:
            raise ValueError(
                f"ckptd StorageWriter: checkpoint_id {self._id.raw!r} has no step; with "
                "use_collectives=False the ranks cannot agree on the next free step, so put the "
                "step in the id (e.g. 'runs/llama/step-100')"
            )
        else:
            existing = self._existing_steps()
            self.step = max(existing) + 1 if existing else 0
        self.job = self._id.job if self.use_collectives else _ids.part_job(self._id.job, self.rank)

    def _existing_steps(self) -> list[int]:
        assert self._id is not None
        try:
            return [int(c["step"]) for c in self.client.list(self._id.job)]
        except ckptd.NotFoundError:
            return []

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan  # unchanged, usable=False (a cached plan) included

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        merged: dict[Any, Any] = {}
        for p in plans:
            if isinstance(p.planner_data, dict):
                merged.update(p.planner_data)
        # usable=False plans (DCP's plan cache) keep that flag: DCP swaps in the cached plan.
        return [
            dataclasses.replace(
                p, storage_data=_PlanData(len(plans), merged if i == 0 and merged else None)
            )
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        fut: Future[list[WriteResult]] = Future()
        try:
            fut.set_result(self._write(plan, planner))
        except BaseException as e:  # handed to DCP through the future
            fut.set_exception(e)  # type: ignore[arg-type]
        finally:
            self._release_staged()
        return fut

    def _write(self, plan: SavePlan, planner: SavePlanner) -> list[WriteResult]:
        if self._id is None or self.step is None or self.job is None:
            raise RuntimeError("ckptd StorageWriter: write_data before set_up_storage_writer")
        pdata = plan.storage_data if isinstance(plan.storage_data, _PlanData) else _PlanData(1)
        staged, self._saved_at_stage = self._saved_at_stage, None
        if staged is not None and (staged.job, staged.step) == (self.job, self.step):
            problem = None
            missing = [i.index.fqn for i in plan.items if _index_key(i.index) not in staged.sizes]
            planless = isinstance(planner, LocalPlanner) and pdata.world_size == 1
            if planless and not staged.planless:
                fate = self._abort_staged(staged, "planless save staged with DCP's planner")
                raise ValueError(
                    f"ckptd StorageWriter: job {staged.job} step {staged.step}: dcp.async_save "
                    "was given a LocalPlanner but this writer was built without planner=, so "
                    "stage() planned with DCP's default planner and handed over every item "
                    f"from every rank (duplicate writes); that checkpoint is {fate}. Pass the "
                    "same planner to the writer: StorageWriter(id, planner=p) with "
                    "dcp.async_save(..., planner=p, no_dist=True), or use "
                    "ckptd.torch.save(..., async_save=True)"
                )
            if planless and (planner.rank, planner.world_size) != (staged.rank, staged.world_size):
                problem = (
                    f"stage() saved as rank {staged.rank} of {staged.world_size} but the "
                    f"planner saves as rank {planner.rank} of {planner.world_size}"
                )
            elif self.use_collectives and not planless and pdata.world_size != staged.world_size:
                problem = (
                    f"stage() saved as rank {staged.rank} of {staged.world_size} (the default "
                    f"process group) but DCP planned with {pdata.world_size} rank(s); with a "
                    "process_group or no_dist, give the writer a checkpoint_id without a step"
                )
            elif missing:
                problem = (
                    f"items {missing[:5]} were not staged by stage(); a custom SavePlanner with "
                    "async_save needs a checkpoint_id without a step"
                )
            if problem is not None:
                self._abort_staged(staged, problem)
                raise RuntimeError(f"ckptd: job {staged.job} step {staged.step}: {problem}")
            return _write_results(plan.items, staged.sizes)
        if isinstance(planner, LocalPlanner) and pdata.world_size == 1:
            return self._write_planless(plan, planner, pdata)
        rank, world = (self.rank, pdata.world_size) if self.use_collectives else (0, 1)
        self.world_size = world
        if rank >= world:
            raise RuntimeError(
                f"ckptd: job {self.job} step {self.step}: rank {rank} of a save planned by "
                f"{world} rank(s)"
            )
        extra: dict[str, Any] = {}
        if not self.use_collectives:
            extra[_ids.DCP_CHUNKS_ITEM] = _chunks(plan.items)
        sizes = self._save(plan.items, planner.resolve_data, pdata, (rank, world), extra)
        return _write_results(plan.items, sizes)

    def _abort_staged(self, staged: _StagedSave, why: str) -> str:
        """Aborts what stage() handed over, which can never commit as planned (a one-rank
        checkpoint may have committed already: then it stays). Returns its fate, in words."""
        try:
            self.client.abort(staged.job, staged.step, why[:200])
            return "aborted"
        except ckptd.CkptdError as e:
            return f"not aborted ({e})"

    def _write_planless(
        self, plan: SavePlan, planner: LocalPlanner, pdata: _PlanData
    ) -> list[WriteResult]:
        """This rank's part of the one checkpoint (job, step), as the planner's rank r of N."""
        assert self._id is not None
        if self._id.step is None:
            raise ValueError(
                f"ckptd StorageWriter: checkpoint_id {self._id.raw!r} has no step; a planless "
                "save (LocalPlanner, no_dist) cannot agree on the next free step without "
                "communication, so put the step in the id (e.g. 'runs/llama/step-100')"
            )
        self.job, self.step = self._id.job, self._id.step
        self.world_size = planner.world_size
        as_rank = (planner.rank, planner.world_size)
        extra = _own_mappings(planner, plan.items)
        sizes = self._save(plan.items, planner.resolve_data, pdata, as_rank, extra)
        return _write_results(plan.items, sizes)

    def _save(
        self,
        items: list[WriteItem],
        resolve: Any,
        pdata: _PlanData,
        as_rank: tuple[int, int],
        extra: dict[str, Any],
    ) -> dict[Any, int]:
        """Saves `items` as rank `as_rank` of (self.job, self.step). `extra` (object items saved by
        rank 0) holds DCP_CHUNKS_ITEM exactly when this is a rank-local part: then each chunk is
        stored as a whole item. Its rank_mappings_item(r) (a planless rank's own mappings) is
        saved by that rank r > 0 alone: rank 0's are PLANNER_DATA_ITEM."""
        assert self._id is not None and self.job is not None and self.step is not None
        rank, world = as_rank  # (rank, world size) in the daemon's checkpoint
        rank_local = _ids.DCP_CHUNKS_ITEM in extra
        tensors: dict[str, list[ckptd.Shard]] = {}  # a rank may hold several chunks of an item
        objects: dict[str, Any] = {}
        sizes: dict[Any, int] = {}
        for item in items:
            data = resolve(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                objects[item.index.fqn] = ckptd.Raw(raw)
                sizes[_index_key(item.index)] = len(raw)
                continue
            fqn, shard = _tensor_item(item, data)
            if rank_local:  # the chunk is a whole item of the part
                shard = ckptd.Shard(shard.data, list(shard.data.shape), None)
            if rank_local and fqn in tensors:  # a part stores each chunk as the whole item
                raise RuntimeError(f"ckptd: item {fqn} has two chunks on rank {rank}")
            # Several chunks of one item on this rank (e.g. Megatron's layers stacked on a
            # prepended axis, several per pipeline stage): disjoint regions of one item.
            tensors.setdefault(fqn, []).append(shard)
            sizes[_index_key(item.index)] = shard.data.numel() * shard.data.element_size()
        own = _ids.rank_mappings_item(rank)
        if rank > 0 and own in extra:
            objects[own] = extra[own]
        if rank == 0:
            objects.update((k, v) for k, v in extra.items() if k != own)
            if pdata.planner_data is not None:
                objects[_ids.PLANNER_DATA_ITEM] = pdata.planner_data
            if self._id.step is None:
                objects[_ids.NAME_ITEM] = ckptd.Raw(self._id.name.encode())
        self.client.save(self.job, self.step, tensors, objects, rank=rank, world_size=world)
        return sizes

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Records this save in the (possibly cached and reused) Metadata DCP returns, then waits
        for COMMITTED: the whole checkpoint, or this rank's part without collectives."""
        assert self.job is not None and self.step is not None
        metadata.version = DCP_VERSION
        # save_id names the daemon's checkpoint this save wrote: "job/step".
        metadata.storage_meta = StorageMeta(
            checkpoint_id=self.checkpoint_id, save_id=f"{self.job}/{self.step}"
        )
        self.client.wait(self.job, self.step, committed=True, timeout_ms=self.commit_timeout_ms)

    # --- AsyncStager ------------------------------------------------------------------------
    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any] | _ConcurrentFuture[Any]:
        """One copy of every local tensor into the staging arena; when the step is known, the
        shards are also handed to the daemon and a reference state dict (meta tensors) comes
        back. async_staging: the same in a background thread, returning its Future."""
        self._wait_staging()
        self._release_staged()
        if not self.async_staging:
            return self._stage_now(state_dict)
        if self._pool is None or getattr(self, "_pool_pid", None) != os.getpid():
            # A forked child's copy of the pool has none of its thread (and believes it has one
            # idle): work queued there would never run. The child gets its own, whose stage()
            # fails as any ckptd call there does (ckptd._client, fork) instead of hanging.
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptd-stage")
            self._pool_pid = os.getpid()
        self._staging = self._pool.submit(self._stage_now, state_dict)
        return self._staging

    def _stage_now(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        tensors: list[torch.Tensor] = []
        _collect_tensors(state_dict, tensors)
        known_step = self._id is not None and self._id.step is not None
        if known_step and any(t.device.type == "cuda" for t in tensors):
            # The shards go to the daemon now, GPU tensors as they are: the daemon copies them
            # device → arena over CUDA IPC (Client.save returns once it has), so this process
            # copies nothing and keeps no staged views.
            self._save_at_stage(state_dict)
            return _rebuild(state_dict, iter([_meta(t) for t in tensors]))
        views = self.client.stage(tensors) if tensors else []  # GPU tensors: device to arena
        with self._lock:
            self._staged_views = views
        staged = _rebuild(state_dict, iter(views))
        if self._id is None or self._id.step is None:
            return staged  # the step is chosen at planning: write_data hands the views over
        self._save_at_stage(staged)
        return _rebuild(state_dict, iter([_meta(t) for t in tensors]))

    def _save_at_stage(self, staged: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        assert self._id is not None and self._id.step is not None
        planner: DefaultSavePlanner
        if self.planner is not None:  # planless: this rank's items only, as rank r of N
            planner = copy.copy(self.planner)
            planner._enable_plan_caching = False  # every item now, not an unchanged-plan marker
            planner.set_up_planner(staged, storage_meta=None, is_coordinator=True)
            rank, world = planner.rank, planner.world_size
        else:
            rank, world = rank_world()
            planner = DefaultSavePlanner()
            planner.set_up_planner(staged, storage_meta=None, is_coordinator=rank == 0)
        plan = planner.create_local_plan()
        self.job, self.step = self._id.job, self._id.step
        try:
            pdata = _PlanData(world, plan.planner_data)
            extra = _own_mappings(planner, plan.items) if self.planner is not None else {}
            sizes = self._save(plan.items, planner.resolve_data, pdata, (rank, world), extra)
        finally:
            self._release_staged()
        self._saved_at_stage = _StagedSave(
            self._id.job, self._id.step, rank, world, sizes, self.planner is not None
        )

    def synchronize_staging(self) -> None:
        """Waits for a background stage() (async_staging); nothing to wait for otherwise."""
        self._wait_staging()

    def close(self) -> None:
        """Waits for a background stage(), gives back arena buffers stage() still holds (views
        not handed to the daemon) and stops the staging thread. The writer stays usable."""
        self._wait_staging()
        self._release_staged()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    @property
    def arena_buffers_held(self) -> int:
        """Staged views this writer holds that were not handed to the daemon (0 after close())."""
        return len(self._staged_views)

    def _wait_staging(self) -> None:
        fut = getattr(self, "_staging", None)
        if fut is not None:
            try:
                fut.result()
            except BaseException:  # reported through the Future DCP holds
                pass
            self._staging = None

    def _release_staged(self) -> None:
        lock = getattr(self, "_lock", None)
        if lock is None:
            return
        with lock:
            views, self._staged_views = self._staged_views, []
        if views and self._client is not None:
            self._client.release(views)


def _meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="meta")


def _collect_tensors(obj: Any, out: list[torch.Tensor]) -> None:
    if isinstance(obj, DTensor):
        out.append(obj.to_local())
    elif isinstance(obj, torch.Tensor):
        out.append(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _collect_tensors(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _collect_tensors(v, out)


def _rebuild(obj: Any, staged: Iterator[torch.Tensor]) -> Any:
    """The state dict with tensors replaced by their staged copies (or meta references), taken in
    _collect_tensors' order (DTensors re-wrapped around theirs); other values deep-copied."""
    if isinstance(obj, DTensor):
        return DTensor.from_local(
            next(staged),
            obj.device_mesh,
            obj.placements,
            run_check=False,
            shape=obj.shape,
            stride=obj.stride(),
        )
    if isinstance(obj, torch.Tensor):
        return next(staged)
    if isinstance(obj, dict):
        return {k: _rebuild(v, staged) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rebuild(v, staged) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_rebuild(v, staged) for v in obj)
    return copy.deepcopy(obj)
