"""An import: a source's pieces saved as an ordinary ckptd checkpoint, one batch per rank.

The checkpoint JOB/STEP is saved by this one process as ranks 0..N-1 of N, rank r holding batch r
(at most limit_bytes of whole pieces, no item twice); rank 0 also saves the objects. A rank is
staged once, so N is planned from the source's description before anything is read. Each batch is
read, handed to the daemon (client.save copies it once into the staging arena) and dropped before
the next is read: the importer holds one batch, and the daemon flushes a rank while the next is
read. A failure after the first rank was saved aborts the checkpoint, so nothing half-imported is
left STAGING. A PartedSource (a DeepSpeed checkpoint: one part per data-parallel rank, read from
that rank's files) is planned part by part, so no batch holds pieces of two parts: rank r is DP
rank r whenever each DP rank's bytes fit one batch, and the importer maps one part's files at a
time. Its FlatPieces are saved as Flat regions (a ZeRO partition's piece of a parameter is a
range of its row-major elements, not a box).

Flow control. A staged rank holds its arena pages until the daemon has flushed it (after the
daemon's flush gate, flush_gate_ms). Before staging the next rank the importer waits until at most
one batch is staged but not yet persisted (status: bytes_staged - bytes_persisted), and batches
are at most half the arena: so a rank's reservation never waits on pages that only a flush of
this same import would free. (A reservation that finds the arena full of persisted ranks — kept
as the RAM tier's copy-to-be — evicts them and goes on; one that waits for unflushed ranks is not
woken when they are persisted into the RAM tier and fails after reserve_timeout_ms.)"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import Box, CkptdError, Client, Flat, Shard, _arrays
from ._common import (
    ALIGNMENT_BYTES,
    RESERVED_PREFIX,
    WORLD_SIZE_MAX,
    Piece,
    RefusedInputError,
    Source,
    UsageError,
    object_bytes,
    plan_batches,
)
from ._progress import Progress

FORMATS = ("dcp", "deepspeed", "safetensors", "torch")
BATCH_BYTES_MIN = 2 * ALIGNMENT_BYTES  # split() needs 2 pages
FLOW_POLL_S = 0.01  # how often the importer asks whether the previous ranks are persisted


@dataclass(frozen=True)
class FlatPiece(Piece):
    """Elements [offsets[0], offsets[0] + lengths[0]) of item `item` in row-major order, saved as
    Flat(start, count) of a tensor of `item_shape`. `shape` is (numel,): the planner and split()
    see the item as 1-D, so a piece larger than a batch is cut into shorter element ranges.
    read() returns a 1-D tensor."""

    item_shape: tuple[int, ...] = ()


@dataclass
class PartedSource(Source):
    """A source read in parts, each from files of its own (a DeepSpeed checkpoint's DP ranks):
    `pieces` is the parts one after another, and each part is planned into batches of its own."""

    parts: list[list[Piece]] = field(default_factory=list)


@dataclass
class ImportResult:
    job: str
    step: int
    format: str
    path: str
    tensors: int
    objects: int  # object items, not counting ckptd's own (__ckptd__/...)
    bytes: int  # tensor bytes imported
    world_size: int  # ranks (batches) the checkpoint was saved as
    batch_bytes: int  # the limit each rank stayed within
    rank_bytes: list[int] = field(default_factory=list)  # tensor bytes of each rank
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)


def open_source(
    fmt: str, path: str | os.PathLike[str], padded: Mapping[str, int] | None = None
) -> Source:
    """The source reader of a format: RefusedInputError for unsafe or malformed input. padded
    (deepspeed only): parameters padded along dim 0 and their logical rows, stored without the
    padding (see ckptd.deepspeed's layouts=)."""
    if padded and fmt != "deepspeed":
        raise UsageError(f"--padded is for --format deepspeed, not {fmt}")
    if fmt == "safetensors":
        from ._safetensors import open_safetensors

        return open_safetensors(path)
    if fmt == "torch":
        from ._torch_save import open_torch_save

        return open_torch_save(path)
    if fmt == "dcp":
        from ._dcp_import import open_dcp

        return open_dcp(path)
    if fmt == "deepspeed":
        from ._deepspeed import open_deepspeed

        return open_deepspeed(path, padded)
    raise UsageError(f"unknown format {fmt!r} (one of {', '.join(FORMATS)})")


def batch_limit(client: Client, batch_bytes: int) -> int:
    """batch_bytes, but at most half the staging arena (less a page): a rank's save must fit in
    the arena at once, and one rank can then be staged while the previous one is being flushed."""
    if batch_bytes < BATCH_BYTES_MIN:
        raise UsageError(f"--batch_bytes {batch_bytes} is below {BATCH_BYTES_MIN}")
    arena = int(client._native.arena_bytes())  # the package's own binding: not public API
    half = (arena // 2 // ALIGNMENT_BYTES - 1) * ALIGNMENT_BYTES
    return max(BATCH_BYTES_MIN, min(batch_bytes, half)) if arena else batch_bytes


def _read_batch(batch: list[Any]) -> dict[str, Shard]:
    tensors: dict[str, Shard] = {}
    for p in batch:
        try:
            data = p.read(p.offsets, p.lengths)
        except (RefusedInputError, OSError):
            raise
        except Exception as e:  # a reader's own error for data it cannot decode
            raise RefusedInputError(
                p.origin, f"tensor {p.item!r}: {type(e).__name__}: {e}"
            ) from None
        got = tuple(int(d) for d in data.shape)
        if got != p.lengths or _arrays.dtype_name(data) != p.dtype:
            raise RefusedInputError(
                p.origin,
                f"tensor {p.item!r}: read {_arrays.dtype_name(data)} {list(got)}, but the file "
                f"describes {p.dtype} {list(p.lengths)}",
            )
        if isinstance(p, FlatPiece):
            tensors[p.item] = Shard(data, p.item_shape, Flat(p.offsets[0], p.lengths[0]))
            continue
        region = None if p.whole else Box(p.offsets, p.lengths)
        tensors[p.item] = Shard(data, p.shape, region)
    return tensors


def _plan(source: Source, limit_bytes: int, first_bytes: int) -> list[list[Piece]]:
    """The source's pieces in batches (the first starting with first_bytes taken); a
    PartedSource's parts each in batches of their own."""
    if not isinstance(source, PartedSource):
        return plan_batches(source.pieces, limit_bytes, first_bytes=first_bytes)
    batches: list[list[Piece]] = []
    for i, part in enumerate(source.parts):
        batches += plan_batches(part, limit_bytes, first_bytes=0 if i else first_bytes)
    return batches or [[]]


def _wait_for_flushes(client: Client, job: str, step: int, limit_bytes: int) -> None:
    """Returns once at most limit_bytes of the checkpoint are staged but not yet persisted (see
    the module docstring's flow control)."""
    while True:
        st = client.status(job, step)
        if st["state"] != "STAGING" or st["bytes_staged"] - st["bytes_persisted"] <= limit_bytes:
            return
        time.sleep(FLOW_POLL_S)


def run_import(
    client: Client,
    job: str,
    step: int,
    source: Source,
    limit_bytes: int,
    progress: Callable[[int], Progress],
) -> ImportResult:
    """Saves `source` as checkpoint job/step and waits for COMMITTED. progress(total) makes the
    progress line."""
    objects_bytes = sum(object_bytes(v) for v in source.objects.values())
    batches = _plan(source, limit_bytes, objects_bytes)
    world = len(batches)
    if world > WORLD_SIZE_MAX:
        raise UsageError(
            f"{source.path}: {world} batches of {limit_bytes} bytes, more ranks than the "
            f"daemon's {WORLD_SIZE_MAX}: raise --batch_bytes"
        )
    rank_bytes = [sum(p.nbytes for p in b) for b in batches]
    bar = progress(sum(rank_bytes))
    saved = False
    try:
        for rank in range(world):
            tensors = _read_batch(batches[rank])
            objects = source.objects if rank == 0 else None
            if saved:
                _wait_for_flushes(client, job, step, limit_bytes)
            client.save(job, step, tensors, objects, rank=rank, world_size=world)
            saved = True
            del tensors
            bar.advance(rank_bytes[rank])
        client.wait(job, step)
    except BaseException as e:
        bar.finish()  # how far it got, and the end of a line redrawn in place
        if saved:
            try:
                client.abort(job, step, f"import of {source.path} failed: {e}"[:1000])
            except CkptdError:
                pass
        raise
    bar.finish()
    return ImportResult(
        job=job,
        step=step,
        format=source.format,
        path=source.path,
        tensors=len({p.item for p in source.pieces}),
        objects=sum(not n.startswith(RESERVED_PREFIX) for n in source.objects),
        bytes=sum(rank_bytes),
        world_size=world,
        batch_bytes=limit_bytes,
        rank_bytes=rank_bytes,
        elapsed_s=bar.elapsed_s,
        notes=list(source.notes),
    )
