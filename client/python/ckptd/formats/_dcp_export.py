"""A ckptd checkpoint exported as a PyTorch DCP FileSystemWriter directory: stock
torch.distributed.checkpoint loads it (FileSystemReader; dcp.load into a plain state dict of
tensors, in one process, no process group), whatever layout the ranks saved it in.

The directory is written by DCP's own FileSystemWriter, driven by a SavePlanner whose write items
are the checkpoint's tensors in row blocks of at most chunk_bytes (one chunk, TENSOR, when the
whole tensor fits; SHARD chunks otherwise, as a sharded save writes) and its objects. Each chunk
is loaded from the daemon only when the writer asks for it (resolve_data: a flat element range,
resharded by the daemon), so memory holds one chunk. The writer puts each item in a file of its own
(single_file_per_rank=False): torch 2.13's writer keeps every tensor of one file referenced until
the file is complete, so one file per rank would hold the whole checkpoint in memory.

Objects: torch.save bytes (what ckptd.torch and DCP imports store) are kept as they are, pickles
of plain values (client.save objects) are re-encoded with torch.save; either must load with
torch.load(weights_only=True), because stock dcp.load unpickles byte items with
weights_only=False. Anything else is skipped and listed. ckptd.torch's own items (__ckptd__/...)
are not exported; its flattening mappings become the metadata's planner_data (a planless save's
rank 0 mappings, completed for the names only later ranks wrote from those ranks' own mappings,
__ckptd__/dcp_planner_data.rank<r>, as ckptd.torch.StorageReader does).

The export is written into a temporary directory next to DIR (each file fsync'd by the writer) and
renamed into place once complete, so DIR never holds a partial export."""

from __future__ import annotations

import dataclasses
import io
import math
import os
import shutil
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
)
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

from .. import Client, Flat, _arrays
from ..torch._ids import PLANNER_DATA_ITEM, RANK_MAPPINGS_PREFIX, RESERVED_PREFIX
from ._common import Piece, flat_start, split
from ._dcp_metadata import METADATA_FILE
from ._progress import Progress
from ._safe_pickle import loads_plain

_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format


@dataclass
class ExportResult:
    job: str
    step: int
    directory: str
    tensors: int
    objects: int
    bytes: int
    files: int
    skipped: list[str] = field(default_factory=list)  # object items not exported, with why
    elapsed_s: float = 0.0


def _object_bytes(raw: bytes, where: str) -> bytes:
    """torch.save bytes of an object item that torch.load(weights_only=True) accepts."""
    if raw.startswith(_ZIP_MAGIC):
        torch.load(io.BytesIO(raw), weights_only=True)  # raises for anything unsafe
        return raw
    value = loads_plain(raw, where)
    buf = io.BytesIO()
    torch.save(value, buf)
    torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
    return buf.getvalue()


class _ExportPlanner(SavePlanner):
    """Write items fixed up front; resolve_data loads each chunk from the daemon when asked."""

    def __init__(
        self,
        client: Client,
        job: str,
        step: int,
        items: list[WriteItem],
        objects: dict[str, bytes],
        planner_data: dict[str, tuple[Any, ...]],
        bar: Progress,
    ) -> None:
        self._client = client
        self._job = job
        self._step = step
        self._items = items
        self._objects = objects
        self._planner_data = planner_data
        self._bar = bar

    def set_up_planner(
        self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False
    ) -> None:
        pass

    def create_local_plan(self) -> SavePlan:
        return SavePlan(list(self._items))

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        plans, md = create_default_global_save_plan(all_plans)
        return plans, dataclasses.replace(md, planner_data=self._planner_data)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor | io.BytesIO:
        fqn = write_item.index.fqn
        if write_item.type == WriteItemType.BYTE_IO:
            return io.BytesIO(self._objects[fqn])
        td = write_item.tensor_data
        assert td is not None and td.chunk is not None
        size = [int(d) for d in td.size]
        offsets = [int(o) for o in td.chunk.offsets]
        lengths = [int(n) for n in td.chunk.sizes]
        dest = torch.empty(lengths, dtype=td.properties.dtype)
        if dest.numel() > 0:
            region = None if lengths == size else Flat(flat_start(size, offsets), dest.numel())
            self._client.load_into(self._job, self._step, [(fqn, region, dest.view(-1))])
        self._bar.advance(dest.numel() * dest.element_size())
        return dest


def _tensor_items(rows: list[dict[str, Any]], chunk_bytes: int) -> list[WriteItem]:
    items: list[WriteItem] = []
    for row in rows:
        shape = tuple(int(d) for d in row["shape"])
        whole = Piece(row["name"], row["dtype"], shape, (0,) * len(shape), shape, "", _no_read)
        chunks = list(split(whole, chunk_bytes))
        kind = WriteItemType.TENSOR if len(chunks) == 1 else WriteItemType.SHARD
        props = TensorProperties(dtype=_arrays.torch_dtype(row["dtype"]))
        for c in chunks:
            offsets, sizes = torch.Size(c.offsets), torch.Size(c.lengths)
            items.append(
                WriteItem(
                    index=MetadataIndex(row["name"], offsets),
                    type=kind,
                    tensor_data=TensorWriteData(
                        chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                        properties=props,
                        size=torch.Size(shape),
                    ),
                )
            )
    return items


def _no_read(offsets: tuple[int, ...], lengths: tuple[int, ...]) -> Any:
    raise AssertionError("export pieces are loaded by resolve_data")


def _objects(
    client: Client, job: str, step: int, rows: list[dict[str, Any]]
) -> tuple[dict[str, bytes], dict[str, tuple[Any, ...]], list[str]]:
    """(name -> torch.save bytes, the saved flattening mappings, skipped items with why)."""
    objects: dict[str, bytes] = {}
    mappings: dict[str, tuple[Any, ...]] = {}
    skipped: list[str] = []
    for row in rows:
        name = row["name"]
        where = f"job {job} step {step} object {name!r}"
        raw = client.load_object(job, step, name, raw=True)
        if name == PLANNER_DATA_ITEM:
            try:
                data = loads_plain(raw, where)
            except Exception:  # not plain data: the export falls back to flat names
                continue
            if isinstance(data, dict):
                mappings = {str(k): tuple(v) for k, v in data.items() if isinstance(v, tuple)}
            continue
        if name.startswith(RESERVED_PREFIX):
            continue
        try:
            objects[name] = _object_bytes(raw, where)
        except Exception as e:  # not plain data: stock dcp.load could not load it safely
            skipped.append(f"{name} ({type(e).__name__}: {str(e).splitlines()[0][:200]})")
    return objects, mappings, skipped


def _merge_rank_mappings(
    client: Client,
    job: str,
    step: int,
    rank_items: list[str],
    mappings: dict[str, tuple[Any, ...]],
    missing: set[str],
) -> None:
    """Adds to `mappings` those of the names in `missing` that later ranks of a planless save
    wrote, from their own mappings (rank order, read only while a name is missing). A mapping
    object that is not plain data is passed over: its names fall back to flat ones."""
    prefix = len(RANK_MAPPINGS_PREFIX)

    def rank_of(name: str) -> int:
        return int(name[prefix:]) if name[prefix:].isdigit() else 0

    for name in sorted(rank_items, key=rank_of):
        if not missing:
            return
        raw = client.load_object(job, step, name, raw=True)
        try:
            own = loads_plain(raw, f"job {job} step {step} object {name!r}")
        except Exception:
            continue
        if isinstance(own, dict):
            for fqn in missing & own.keys():
                if isinstance(own[fqn], tuple):
                    mappings[fqn] = tuple(own[fqn])
            missing -= own.keys()


def _check_target(target: Path, force: bool) -> None:
    if not target.exists():
        return
    if not target.is_dir():
        raise FileExistsError(f"{target}: exists and is not a directory")
    if not any(target.iterdir()):
        return
    if not force:
        raise FileExistsError(f"{target}: not empty (--force replaces an earlier DCP export)")
    if not (target / METADATA_FILE).exists():
        raise FileExistsError(f"{target}: holds no DCP export (no {METADATA_FILE}): not replaced")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _swap_in(tmp: Path, target: Path) -> None:
    """Renames the complete export `tmp` to `target` (replacing an earlier export there)."""
    old = None
    if target.exists():
        if any(target.iterdir()):
            old = target.with_name(f".{target.name}.ckptd-old-{os.getpid()}")
            os.rename(target, old)
        else:
            os.rmdir(target)
    os.rename(tmp, target)
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def export_dcp(
    client: Client,
    job: str,
    step: int,
    directory: str | os.PathLike[str],
    *,
    chunk_bytes: int,
    force: bool = False,
    progress: Any = None,
) -> ExportResult:
    """Writes checkpoint job/step (COMMITTED) as a DCP directory; see the module docstring.
    progress(total_bytes) makes the progress line."""
    target = Path(directory).absolute()
    _check_target(target, force)
    rows = client.inspect(job, step)
    ours = [r for r in rows if not r["name"].startswith(RESERVED_PREFIX)]
    tensors = [r for r in ours if r["kind"] == "tensor"]
    objects, mappings, skipped = _objects(
        client, job, step, [r for r in rows if r["kind"] == "object"]
    )
    items = _tensor_items(tensors, chunk_bytes)
    items += [WriteItem(index=MetadataIndex(n), type=WriteItemType.BYTE_IO) for n in objects]
    names = [r["name"] for r in tensors] + list(objects)
    missing = {n for n in names if n not in mappings}
    if missing:
        ranks = [r["name"] for r in rows if r["name"].startswith(RANK_MAPPINGS_PREFIX)]
        _merge_rank_mappings(client, job, step, ranks, mappings, missing)
    planner_data = {n: mappings.get(n, (n,)) for n in names}
    total = sum(math.prod(r["shape"]) * _arrays.ITEMSIZE[r["dtype"]] for r in tensors)
    bar = progress(total) if progress is not None else Progress("export dcp", total, quiet=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.ckptd-export-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        writer = dcp.FileSystemWriter(tmp, single_file_per_rank=False, sync_files=True)
        planner = _ExportPlanner(client, job, step, items, objects, planner_data, bar)
        with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
            warnings.simplefilter("ignore", UserWarning)
            dcp.save({}, storage_writer=writer, planner=planner, no_dist=True)
        _fsync_dir(tmp)
        _swap_in(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    bar.finish()
    return ExportResult(
        job=job,
        step=step,
        directory=str(target),
        tensors=len(tensors),
        objects=len(objects),
        bytes=total,
        files=sum(1 for _ in target.iterdir()),
        skipped=skipped,
        elapsed_s=bar.elapsed_s,
    )
