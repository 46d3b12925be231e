"""ckptd as a torch.distributed.checkpoint (DCP) backend: StorageWriter and StorageReader.

Mapping. Each DCP write item becomes one ckptd shard of item `fqn` (the flattened state-dict key)
covering the chunk's box of the global tensor; byte items (non-tensor objects) become replicated
object items. The reader's metadata describes every tensor as one chunk covering the whole
tensor, so DCP asks for exactly the boxes each rank needs and the daemon's load planner finds the
saved shards and reads only the needed byte runs: any layout loads any other.

Commit. dcp.save returns once the checkpoint is COMMITTED (finish() waits for it on the
coordinator, and every rank waits for finish()). The daemon itself commits once all ranks staged.

async_save. The writer is DCP's AsyncStager: stage() copies each local tensor once, straight into
the staging arena, and - when the checkpoint_id names a step - hands the shards to the daemon right
away, so async_save returns with the checkpoint staged (it completes even if the trainer dies) and
the tensors free to change; the background dcp.save then only plans and waits for COMMITTED.
Without a step in the id the step is chosen during planning, so the shards are handed over then.
"""

from __future__ import annotations

import copy
import dataclasses
import io
import os
from collections.abc import Iterator
from typing import Any, cast

import ckptd
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader as _DcpReader
from torch.distributed.checkpoint.storage import StorageWriter as _DcpWriter
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future

from . import _ids

__all__ = ["StorageReader", "StorageWriter"]


@dataclasses.dataclass(frozen=True)
class _PlanData:
    """What the coordinator tells every rank in prepare_global_plan."""

    step: int
    planner_data: Any = None  # rank 0 saves it (for loads without a template)


def _connect(socket: str | None) -> ckptd.Client:
    return ckptd.connect(socket) if socket else ckptd.default_client()


class _LazyClient:
    """Connects on first use; pickles without the connection (for process-based async_save)."""

    socket: str | None
    _client: ckptd.Client | None

    @property
    def client(self) -> ckptd.Client:
        if self._client is None:
            self._client = _connect(self.socket)
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state


def _rank_world(rank: int | None = None) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return (dist.get_rank() if rank is None else rank), dist.get_world_size()
    return 0, 1


def _tensor_item(item: WriteItem, tensor: torch.Tensor) -> tuple[str, ckptd.Shard]:
    td = item.tensor_data
    assert td is not None
    size = [int(d) for d in td.size]
    offsets = [int(o) for o in td.chunk.offsets]
    lengths = [int(n) for n in td.chunk.sizes]
    tensor = tensor.detach()  # a GPU tensor is copied device to arena by Client.save
    if list(tensor.shape) != lengths:
        tensor = tensor.reshape(lengths)
    whole = lengths == size and not any(offsets)
    region = None if whole else ckptd.Box(offsets, lengths)
    return item.index.fqn, ckptd.Shard(tensor, size, region)


def _index_key(index: MetadataIndex) -> tuple[str, tuple[int, ...] | None]:
    return index.fqn, None if index.offset is None else tuple(int(o) for o in index.offset)


def _write_results(items: list[WriteItem], staged: dict[Any, int]) -> list[WriteResult]:
    return [
        WriteResult(
            index=i.index, size_in_bytes=staged.get(_index_key(i.index), 0), storage_data=None
        )
        for i in items
    ]


class StorageWriter(_LazyClient, _DcpWriter, AsyncStager):
    """DCP StorageWriter (and AsyncStager) over ckptd.

    StorageWriter("runs/llama/step-100") or StorageWriter(checkpoint_id=...): see _ids for the
    id rules. socket: the daemon's socket (default $CKPTD_SOCKET). Picklable: the connection is
    made again on first use in the other process."""

    _synchronize_after_execute: bool = False  # stage() returns with the copy done

    def __init__(
        self,
        checkpoint_id: str | os.PathLike[str] | None = None,
        *,
        socket: str | None = None,
        commit_timeout_ms: int = 3600 * 1000,
    ) -> None:
        super().__init__()
        self.socket = socket
        self.commit_timeout_ms = commit_timeout_ms
        self._client: ckptd.Client | None = None
        self._id: _ids.CheckpointId | None = None
        self.checkpoint_id: str | None = None
        self._clear()
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    def _clear(self) -> None:
        self.step: int | None = None
        self.rank = 0
        self.world_size = 1
        self.is_coordinator = False
        # Set by stage() when it already handed this rank's shards to the daemon:
        # (job, step, {(fqn, offsets): bytes}).
        self._saved_at_stage: tuple[str, int, dict[Any, int]] | None = None
        self._staged_views: list[torch.Tensor] = []

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_staged_views"] = []
        return state

    # --- StorageWriter ----------------------------------------------------------------------
    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        """A new save: replaces the checkpoint id (when given) and clears per-save state."""
        pending = getattr(self, "_saved_at_stage", None)
        if checkpoint_id is not None:
            new_id = _ids.parse(checkpoint_id)
            if pending is not None and self._id is not None and new_id.raw != self._id.raw:
                # stage() already handed shards to the daemon under the old id: abort that one.
                self.client.abort(pending[0], pending[1], "checkpoint_id changed after stage()")
                self._id = new_id
                self.checkpoint_id = new_id.raw
                self._clear()
                raise ValueError(
                    "ckptd StorageWriter: with async_save, give the checkpoint_id to the writer "
                    "(constructor or reset()), not to async_save: stage() ran with the old id"
                )
            self._id = new_id
            self.checkpoint_id = new_id.raw
        self._clear()
        if (
            pending is not None
            and self._id is not None
            and pending[:2] == (self._id.job, self._id.step)
        ):
            self._saved_at_stage = pending  # dcp.save after our own stage(): keep its shards
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
        return StorageMeta(checkpoint_id=self.checkpoint_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if self._id is None:
            raise ValueError(
                "ckptd StorageWriter: no checkpoint_id (pass one to the constructor, "
                "to dcp.save, or to reset())"
            )
        self.is_coordinator = is_coordinator
        # Every rank of the process group saves (possibly nothing): the daemon commits once ranks
        # 0..world_size-1 have staged.
        self.rank, self.world_size = _rank_world(kwargs.get("rank"))

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        assert self._id is not None
        step = self.step
        if step is None:
            existing = self._existing_steps()
            step = max(existing) + 1 if existing else 0
        merged: dict[Any, Any] = {}
        for p in plans:
            if isinstance(p.planner_data, dict):
                merged.update(p.planner_data)
        return [
            dataclasses.replace(p, storage_data=_PlanData(step, merged if i == 0 else None))
            for i, p in enumerate(plans)
        ]

    def _existing_steps(self) -> list[int]:
        assert self._id is not None
        try:
            return [int(c["step"]) for c in self.client.list(self._id.job)]
        except ckptd.NotFoundError:
            return []

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        assert self._id is not None
        pdata = cast(_PlanData, plan.storage_data)
        self.step = pdata.step
        fut: Future[list[WriteResult]] = Future()
        try:
            saved = self._saved_at_stage
            if saved is not None and saved[:2] == (self._id.job, pdata.step):
                missing = [i.index.fqn for i in plan.items if _index_key(i.index) not in saved[2]]
                if missing:
                    raise RuntimeError(
                        f"ckptd: items {missing[:5]} were not staged by stage(); a custom "
                        "SavePlanner with async_save needs a checkpoint_id without a step"
                    )
                fut.set_result(_write_results(plan.items, saved[2]))
                return fut
            sizes = self._save(plan.items, planner.resolve_data, pdata)
            fut.set_result(_write_results(plan.items, sizes))
        except BaseException as e:  # handed to DCP through the future
            fut.set_exception(e)  # type: ignore[arg-type]
        finally:
            self._release_staged()
        return fut

    def _save(self, items: list[WriteItem], resolve: Any, pdata: _PlanData) -> dict[Any, int]:
        assert self._id is not None
        tensors: dict[str, ckptd.Shard] = {}
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
            if fqn in tensors:  # two chunks of one item on this rank: distinct names per shard
                raise RuntimeError(f"ckptd: item {fqn} has two chunks on rank {self.rank}")
            tensors[fqn] = shard
            sizes[_index_key(item.index)] = shard.data.numel() * shard.data.element_size()
        if self.rank == 0:
            if pdata.planner_data is not None:
                objects[_ids.PLANNER_DATA_ITEM] = pdata.planner_data
            if self._id.step is None:
                objects[_ids.NAME_ITEM] = ckptd.Raw(self._id.name.encode())
        self.client.save(
            self._id.job, pdata.step, tensors, objects, rank=self.rank, world_size=self.world_size
        )
        return sizes

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        assert self._id is not None and self.step is not None
        self.client.wait(self._id.job, self.step, committed=True, timeout_ms=self.commit_timeout_ms)

    # --- AsyncStager ------------------------------------------------------------------------
    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        """One copy of every local tensor into the staging arena; when the step is known, the
        shards are also handed to the daemon here (so the checkpoint is staged on return)."""
        self._release_staged()
        tensors: list[torch.Tensor] = []
        _collect_tensors(state_dict, tensors)
        views = self.client.stage(tensors) if tensors else []  # GPU tensors: device to arena
        self._staged_views = views
        staged = _rebuild(state_dict, iter(views))
        if self._id is not None and self._id.step is not None:
            self._save_at_stage(staged)
        return staged

    def _save_at_stage(self, staged: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        assert self._id is not None and self._id.step is not None
        rank, world = _rank_world()
        planner = DefaultSavePlanner()
        planner.set_up_planner(staged, storage_meta=None, is_coordinator=rank == 0)
        plan = planner.create_local_plan()
        prev = (self.rank, self.world_size)
        self.rank, self.world_size = rank, world
        try:
            sizes = self._save(
                plan.items, planner.resolve_data, _PlanData(self._id.step, plan.planner_data)
            )
        finally:
            self.rank, self.world_size = prev
        self._saved_at_stage = (self._id.job, self._id.step, sizes)
        self._release_staged()

    def synchronize_staging(self) -> None:
        """Nothing to wait for: stage() returns with the copy done."""

    def close(self) -> None:
        self._release_staged()

    def _release_staged(self) -> None:
        views, self._staged_views = getattr(self, "_staged_views", []), []
        if views and self._client is not None:
            self._client.release(views)


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
    """The state dict with tensors replaced by their staged copies, taken in _collect_tensors'
    order (DTensors re-wrapped around theirs); other values deep-copied."""
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


class StorageReader(_LazyClient, _DcpReader):
    """DCP StorageReader over ckptd: loads any ckptd checkpoint (also ones saved by the C++
    client) into any layout; tensors of another dtype are cast like FileSystemReader does.
    bytes_read: bytes the daemon read from storage for this reader's loads."""

    def __init__(
        self, checkpoint_id: str | os.PathLike[str] | None = None, *, socket: str | None = None
    ) -> None:
        super().__init__()
        self.socket = socket
        self._client: ckptd.Client | None = None
        self._id: _ids.CheckpointId | None = None
        self.checkpoint_id: str | None = None
        self.step: int | None = None
        self.rank = 0
        self.bytes_read = 0
        self._dtypes: dict[str, torch.dtype] = {}
        self._shapes: dict[str, list[int]] = {}
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self._id = _ids.parse(checkpoint_id)
            self.checkpoint_id = self._id.raw
        self.step = None if self._id is None else self._id.step
        self.bytes_read = 0
        self._dtypes = {}

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return StorageWriter.validate_checkpoint_id(checkpoint_id)

    def _resolve_step(self) -> int:
        if self._id is None:
            raise ValueError("ckptd StorageReader: no checkpoint_id")
        if self.step is not None:
            return self.step
        # A named checkpoint: the newest committed one that recorded this name.
        for info in reversed(self.client.list(self._id.job)):
            if info["state"] != "COMMITTED":
                continue
            try:
                name = self.client.load_object(self._id.job, info["step"], _ids.NAME_ITEM, raw=True)
            except ckptd.NotFoundError:
                continue
            if name == self._id.name.encode():
                self.step = int(info["step"])
                return self.step
        raise ckptd.NotFoundError(
            f"job {self._id.job}: no committed checkpoint named {self._id.name!r}"
        )

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        step = self._resolve_step()
        assert self._id is not None
        sd_meta: dict[str, Any] = {}
        planner_data: Any = None
        for info in self.client.inspect(self._id.job, step):
            name = info["name"]
            if name == _ids.PLANNER_DATA_ITEM:
                planner_data = self.client.load_object(self._id.job, step, name)
                continue
            if name.startswith(_ids.RESERVED_PREFIX):
                continue
            if info["kind"] == "object":
                sd_meta[name] = BytesStorageMetadata()
                continue
            shape = torch.Size(int(d) for d in info["shape"])
            dtype = ckptd._arrays.torch_dtype(info["dtype"])
            sd_meta[name] = TensorStorageMetadata(
                properties=TensorProperties(dtype=dtype),
                size=shape,
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=shape)],
            )
        if planner_data is None:
            planner_data = {name: (name,) for name in sd_meta}
        return Metadata(
            state_dict_metadata=sd_meta,
            planner_data=planner_data,
            storage_data={"job": self._id.job, "step": step},
            storage_meta=StorageMeta(checkpoint_id=self.checkpoint_id),
        )

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if isinstance(metadata.storage_data, dict) and "step" in metadata.storage_data:
            self.step = int(metadata.storage_data["step"])
        self.rank, _ = _rank_world(kwargs.get("rank"))
        tensors = {
            k: v
            for k, v in metadata.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata)
        }
        self._dtypes = {k: v.properties.dtype for k, v in tensors.items()}
        self._shapes = {k: [int(d) for d in v.size] for k, v in tensors.items()}

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        fut: Future[None] = Future()
        try:
            self._read(plan, planner)
            fut.set_result(None)
        except BaseException as e:
            fut.set_exception(e)  # type: ignore[arg-type]
        return fut

    def _read(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        assert self._id is not None
        step = self._resolve_step()
        job = self._id.job
        targets: list[tuple[str, Any, Any]] = []
        # (request, destination view, tensor the daemon writes into)
        pending: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
        for req in plan.items:
            fqn = req.storage_index.fqn
            if req.type == LoadItemType.BYTE_IO:
                data = self.client.load_object(job, step, fqn, rank=self.rank, raw=True)
                planner.load_bytes(req, io.BytesIO(data))
                continue
            dest = planner.resolve_tensor(req).detach()
            lengths = [int(n) for n in req.lengths]
            if list(dest.shape) != lengths:
                raise ValueError(
                    f"ckptd: {fqn}: destination {list(dest.shape)} for a read of {lengths}"
                )
            saved = self._dtypes.get(fqn, dest.dtype)
            direct = dest.dtype == saved and dest.device.type == "cpu"
            buf = dest if direct else torch.empty(lengths, dtype=saved)
            offsets = [int(o) for o in req.storage_offsets]
            full = self._full_shape(fqn)
            whole = full is not None and lengths == full and not any(offsets)
            targets.append((fqn, None if whole else ckptd.Box(offsets, lengths), buf))
            pending.append((req, dest, buf))
        self.bytes_read += self.client.load_into(job, step, targets, rank=self.rank)
        for req, dest, buf in pending:
            if buf is not dest:
                dest.copy_(buf)  # casts, and moves to the destination's device
            planner.commit_tensor(req, dest)

    def _full_shape(self, fqn: str) -> list[int] | None:
        return self._shapes.get(fqn)
