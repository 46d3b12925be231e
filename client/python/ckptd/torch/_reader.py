"""ckptd as a torch.distributed.checkpoint (DCP) backend: the StorageReader.

read_metadata() describes a checkpoint from its manifest (Inspect): every tensor as one chunk
covering the whole tensor, so DCP asks for exactly the boxes each rank needs and the daemon reads
only those byte runs, whatever layout saved them. A checkpoint saved with use_collectives=False is
a set of rank-local parts (jobs _ids.part_job(job, r), see _storage.py): read_metadata(rank=r)
describes part r alone (DCP's rank-local load), and read_metadata() all parts together, each
chunk as its part recorded it (_ids.DCP_CHUNKS_ITEM), so a load at any world size works too; each
read then goes to the part that holds its chunk.

A failed read_metadata() is the answer: it already looked for rank-local parts. DCP's load then
asks read_metadata(rank=r) and, when that fails too, raises AssertionError("metadata is None"),
losing the error. So that second call raises the first one's ckptd error wrapped in
MetadataError, a BaseException DCP passes to its CheckpointException (ckptd_errors unwraps it).
"""

from __future__ import annotations

import io
import os
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner
from torch.distributed.checkpoint.storage import StorageReader as _DcpReader
from torch.futures import Future

import ckptd

from . import _ids
from ._connection import LazyClient, rank_world
from ._errors import MetadataError
from ._storage import StorageWriter

__all__ = ["StorageReader"]

_Key = tuple[str, tuple[int, ...] | None]


def _key(index: MetadataIndex) -> _Key:
    return index.fqn, None if index.offset is None else tuple(int(o) for o in index.offset)


class StorageReader(LazyClient, _DcpReader):
    """DCP StorageReader over ckptd: loads any ckptd checkpoint (also ones saved by the C++
    client) into any layout; tensors of another dtype are cast like FileSystemReader does.
    bytes_read: bytes the daemon read from storage for this reader's loads; bytes_from_ram: bytes
    it copied from its RAM tier instead (a checkpoint still hot in the daemon's memory).
    prefetch=True: the loads carry the daemon's prefetch hint — the whole checkpoint comes into
    its RAM tier first, once however many local ranks restore it at the same time (replicated
    data-parallel ranks read it from the device once), and the loads copy from there;
    bytes_prefetched counts what this reader's hint read.
    _extension_registry (FileSystemReader's) is accepted for drop-in use: ckptd checkpoints carry
    no stream-transform descriptors, so there is never anything for it to decode."""

    def __init__(
        self,
        checkpoint_id: str | os.PathLike[str] | None = None,
        *,
        socket: str | None = None,
        prefetch: bool = False,
        _extension_registry: Any = None,
    ) -> None:
        super().__init__()
        self.socket = socket
        self.prefetch = prefetch
        self._client: ckptd.Client | None = None
        self._id: _ids.CheckpointId | None = None
        self.checkpoint_id: str | None = None
        self.step: int | None = None
        self.rank = 0
        self.bytes_read = 0
        self.bytes_from_ram = 0
        self.bytes_prefetched = 0
        self._dtypes: dict[str, torch.dtype] = {}
        self._shapes: dict[str, list[int]] = {}
        # A rank-local checkpoint: (fqn, chunk offsets | None) -> (part job, chunk sizes).
        self._routes: dict[_Key, tuple[str, list[int]]] | None = None
        self._metadata_error: ckptd.CkptdError | None = None  # of the last read_metadata()
        if checkpoint_id is not None:
            self.reset(checkpoint_id)

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id is not None:
            self._id = _ids.parse(checkpoint_id)
            self.checkpoint_id = self._id.raw
        self.step = None if self._id is None else self._id.step
        self.bytes_read = 0
        self.bytes_from_ram = 0
        self.bytes_prefetched = 0
        self._dtypes = {}
        self._routes = None
        self._metadata_error = None

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

    # --- metadata ---------------------------------------------------------------------------
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """The whole checkpoint; rank=r: rank r's rank-local part (use_collectives=False). After
        a failed read_metadata(), read_metadata(rank=r) (DCP's fallback) raises MetadataError
        holding that failure (see the module docstring)."""
        rank = kwargs.get("rank")
        if rank is not None and self._metadata_error is not None:
            error, self._metadata_error = self._metadata_error, None
            raise MetadataError(error) from error
        if rank is not None:
            step = self._resolve_step()
            assert self._id is not None
            part = _ids.part_job(self._id.job, int(rank))
            return self._part_metadata({int(rank): part}, step)
        self._metadata_error = None
        try:
            return self._read_whole_metadata()
        except ckptd.CkptdError as e:
            self._metadata_error = e
            raise

    def _read_whole_metadata(self) -> Metadata:
        step = self._resolve_step()
        assert self._id is not None
        try:
            return self._whole_metadata(self._id.job, step)
        except ckptd.NotFoundError as whole_missing:
            parts = self._parts(step)
            if not parts:
                raise ckptd.NotFoundError(
                    f"job {self._id.job} step {step}: no such checkpoint, and no rank-local parts "
                    f"(jobs {self._id.job}{_ids.PART_JOB_MARK}<rank>) at that step"
                ) from whole_missing
            return self._part_metadata(parts, step)

    def _parts(self, step: int) -> dict[int, str]:
        """Rank -> part job of every COMMITTED rank-local part of this checkpoint at `step`."""
        assert self._id is not None
        parts: dict[int, str] = {}
        for row in self.client.list():
            rank = _ids.part_rank(self._id.job, str(row["job"]))
            if rank is None:
                continue
            try:
                if self.client.status(str(row["job"]), step)["state"] == "COMMITTED":
                    parts[rank] = str(row["job"])
            except ckptd.NotFoundError:
                continue
        return dict(sorted(parts.items()))

    def _describe(
        self, job: str, step: int
    ) -> tuple[dict[str, Any], dict[str, tuple[torch.dtype, torch.Size]], Any]:
        """(object names, {tensor: (dtype, shape)}, saved planner data) of one checkpoint."""
        objects: dict[str, Any] = {}
        tensors: dict[str, tuple[torch.dtype, torch.Size]] = {}
        planner_data: Any = None
        rank_mappings: list[str] = []
        for info in self.client.inspect(job, step):
            name = info["name"]
            if name == _ids.PLANNER_DATA_ITEM:
                planner_data = self.client.load_object(job, step, name)
            elif name.startswith(_ids.RANK_MAPPINGS_PREFIX):
                rank_mappings.append(name)
            elif name.startswith(_ids.RESERVED_PREFIX):
                continue
            elif info["kind"] == "object":
                objects[name] = None
            else:
                shape = torch.Size(int(d) for d in info["shape"])
                tensors[name] = (ckptd._arrays.torch_dtype(info["dtype"]), shape)
        if isinstance(planner_data, dict) and rank_mappings:
            missing = {n for n in (*objects, *tensors) if n not in planner_data}
            planner_data = self._merge_rank_mappings(
                job, step, planner_data, missing, rank_mappings
            )
        return objects, tensors, planner_data

    def _merge_rank_mappings(
        self, job: str, step: int, mappings: dict[str, Any], missing: set[str], items: list[str]
    ) -> dict[str, Any]:
        """Rank 0's mappings plus, for the names rank 0 lacks, those of the planless ranks that
        wrote them (their _ids.rank_mappings_item objects, in rank order, read only while some
        name is still missing)."""
        out = dict(mappings)
        prefix = len(_ids.RANK_MAPPINGS_PREFIX)
        for name in sorted(items, key=lambda n: int(n[prefix:]) if n[prefix:].isdigit() else 0):
            if not missing:
                break
            own = self.client.load_object(job, step, name)
            if isinstance(own, dict):
                for fqn in missing & own.keys():
                    out[fqn] = own[fqn]
                missing -= own.keys()
        return out

    def _whole_metadata(self, job: str, step: int) -> Metadata:
        objects, tensors, planner_data = self._describe(job, step)
        sd_meta: dict[str, Any] = {name: BytesStorageMetadata() for name in objects}
        for name, (dtype, shape) in tensors.items():
            sd_meta[name] = TensorStorageMetadata(
                properties=TensorProperties(dtype=dtype),
                size=shape,
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)), sizes=shape)],
            )
        return self._metadata(sd_meta, planner_data, {"job": job, "step": step})

    def _part_metadata(self, parts: dict[int, str], step: int) -> Metadata:
        """Metadata of rank-local parts: each tensor's chunks as its parts recorded them (a part
        holds each chunk as a whole item of the same name)."""
        sd_meta: dict[str, Any] = {}
        routes: dict[_Key, tuple[str, list[int]]] = {}
        mappings: dict[Any, Any] = {}
        for _, job in sorted(parts.items(), reverse=True):  # the lowest rank serves duplicates
            objects, tensors, planner_data = self._describe(job, step)
            if isinstance(planner_data, dict):
                mappings.update(planner_data)
            for name in objects:
                sd_meta[name] = BytesStorageMetadata()
                routes[(name, None)] = (job, [])
            records = self.client.load_object(job, step, _ids.DCP_CHUNKS_ITEM)
            for name, (dtype, _) in tensors.items():
                rec = records[name]
                md = sd_meta.setdefault(
                    name,
                    TensorStorageMetadata(
                        TensorProperties(dtype=dtype), torch.Size(rec["size"]), chunks=[]
                    ),
                )
                for offsets, sizes in rec["chunks"]:
                    key: _Key = (name, tuple(offsets))
                    if key not in routes:
                        md.chunks.append(
                            ChunkStorageMetadata(torch.Size(offsets), torch.Size(sizes))
                        )
                    routes[key] = (job, list(sizes))
        storage = {"parts": parts, "step": step, "routes": routes}
        return self._metadata(sd_meta, mappings or None, storage)

    def _metadata(self, sd_meta: dict[str, Any], planner_data: Any, storage: Any) -> Metadata:
        if planner_data is None:
            planner_data = {name: (name,) for name in sd_meta}
        elif isinstance(planner_data, dict):
            planner_data = _complete_mappings(planner_data, sd_meta)
        return Metadata(
            state_dict_metadata=sd_meta,
            planner_data=planner_data,
            storage_data=storage,
            storage_meta=StorageMeta(checkpoint_id=self.checkpoint_id),
        )

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        storage = metadata.storage_data if isinstance(metadata.storage_data, dict) else {}
        if "step" in storage:
            self.step = int(storage["step"])
        self._routes = storage.get("routes")
        self.rank, _ = rank_world(kwargs.get("rank"))
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

    # --- data -------------------------------------------------------------------------------
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
        by_job: dict[tuple[str, int], list[tuple[str, Any, Any]]] = {}
        # (request, destination view, tensor the daemon writes into)
        pending: list[tuple[Any, torch.Tensor, torch.Tensor]] = []
        for req in plan.items:
            fqn = req.storage_index.fqn
            job, rank, base, full = self._source(req.storage_index)
            if req.type == LoadItemType.BYTE_IO:
                data = self.client.load_object(job, step, fqn, rank=rank, raw=True)
                planner.load_bytes(req, io.BytesIO(data))
                continue
            dest = planner.resolve_tensor(req).detach()
            lengths = [int(n) for n in req.lengths]
            if list(dest.shape) != lengths:
                raise ValueError(
                    f"ckptd: {fqn}: destination {list(dest.shape)} for a read of {lengths}"
                )
            saved = self._dtypes.get(fqn, dest.dtype)
            # CPU and CUDA destinations are written in place (CUDA ones by the daemon, over CUDA
            # IPC); others, and dtype casts, through a CPU buffer.
            direct = dest.dtype == saved and dest.device.type in ("cpu", "cuda")
            buf = dest if direct else torch.empty(lengths, dtype=saved)
            # storage_offsets are within the saved chunk: the daemon's item is the whole tensor
            # (offset by the chunk's place) or, in a rank-local part, the chunk itself.
            offsets = [int(b) + int(o) for b, o in zip(base, req.storage_offsets, strict=True)]
            whole = full is not None and lengths == full and not any(offsets)
            target = (fqn, None if whole else ckptd.Box(offsets, lengths), buf)
            by_job.setdefault((job, rank), []).append(target)
            pending.append((req, dest, buf))
        for (job, rank), targets in by_job.items():
            counts = self.client.load_into_counted(
                job, step, targets, rank=rank, prefetch=self.prefetch
            )
            self.bytes_read += counts["bytes_read"]
            self.bytes_from_ram += counts["bytes_from_ram"]
            self.bytes_prefetched += counts["bytes_prefetched"]
        for req, dest, buf in pending:
            if buf is not dest:
                dest.copy_(buf)  # casts, and moves to the destination's device
            planner.commit_tensor(req, dest)

    def _source(self, index: MetadataIndex) -> tuple[str, int, list[int], list[int] | None]:
        """(job, rank to load as, offset of the chunk in the daemon's item, the item's shape)
        for a read of the chunk `index`."""
        assert self._id is not None
        if self._routes is None:
            base = [int(o) for o in index.offset] if index.offset is not None else []
            return self._id.job, self.rank, base, self._shapes.get(index.fqn)
        route = self._routes.get(_key(index))
        if route is None:
            raise ckptd.NotFoundError(
                f"job {self._id.job} step {self.step}: no rank-local part holds {index.fqn} "
                f"at offsets {index.offset}"
            )
        job, sizes = route
        return job, 0, [0] * len(sizes), sizes


def _complete_mappings(mappings: dict[str, Any], names: Any) -> dict[str, Any]:
    """DCP's flattening mappings for every item: the saved ones (rank 0's merged with each
    planless rank's own, see _merge_rank_mappings) completed for items no saved mapping names
    (a checkpoint saved before ranks > 0 recorded theirs): the longest saved prefix's path plus
    the rest of the name, else the name itself. Template-less loads (DCP's
    _EmptyStateDictLoadPlanner) need one each."""
    missing = [n for n in names if n not in mappings]
    if not missing:
        return mappings
    prefixes: dict[str, tuple[Any, ...]] = {}
    for name, path in mappings.items():
        for i in range(1, len(path)):
            head = ".".join(str(p) for p in path[:i])
            if name.startswith(head + "."):
                prefixes.setdefault(head, tuple(path[:i]))
    out = dict(mappings)
    for name in missing:
        heads = [h for h in prefixes if name.startswith(h + ".")]
        head = max(heads, key=len, default=None)
        out[name] = (name,) if head is None else (*prefixes[head], name[len(head) + 1 :])
    return out
