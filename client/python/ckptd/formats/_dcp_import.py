"""A PyTorch DCP FileSystemWriter directory (also Megatron-core's torch_dist) as an import source.

`.metadata` is read by _dcp_metadata (an allowlisted unpickler, then validated); the data by DCP's
own FileSystemReader.read_data, which decodes each stored chunk with torch.load(weights_only=True).
Each chunk (one saving rank's box of a tensor; replicas were written once) becomes a box shard of
the item named by its flattened state-dict key, so any layout loads it afterwards. A chunk is one
torch.save record and is decoded whole: one chunk at a time is kept, and pieces of a chunk larger
than the batch are cut from it. Non-tensor values (DCP byte items) are kept as ckptd.torch's
StorageWriter keeps them — the torch.save bytes as they are (ckptd.Raw), after checking they load
with torch.load(weights_only=True) — and the flattening mappings (planner_data) as its
__ckptd__/dcp_planner_data item, so the result loads through ckptd.torch.StorageReader as if
ckptd.torch had saved it."""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any, NoReturn

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem

from .. import Raw
from ..torch._ids import PLANNER_DATA_ITEM
from ._common import Piece, RefusedInputError, Source, box_slices, dtype_of, io_failure
from ._dcp_metadata import SafeFileSystemReader


class _Capture(LoadPlanner):
    """A LoadPlanner for read_data only: tensors into new CPU tensors, byte items kept raw."""

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        self.dtype = dtype
        self.tensor: torch.Tensor | None = None
        self.raw: bytes | None = None

    def set_up_planner(
        self, state_dict: Any, metadata: Any = None, is_coordinator: bool = False
    ) -> None:
        pass

    def create_local_plan(self) -> LoadPlan:
        raise NotImplementedError

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        raise NotImplementedError

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        raise NotImplementedError

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.raw = value.read()

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        self.tensor = torch.empty(tuple(read_item.lengths), dtype=self.dtype)
        return self.tensor

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass


class _Chunks:
    """Reads chunks through the reader, keeping the last one decoded (its pieces come in a row)."""

    def __init__(self, reader: SafeFileSystemReader, md: Metadata, directory: Path) -> None:
        self._reader = reader
        self._md = md
        self._dir = directory
        self._key: MetadataIndex | None = None
        self._tensor: torch.Tensor | None = None

    def origin(self, index: MetadataIndex) -> str:
        return str(self._dir / self._md.storage_data[index].relative_path)

    def _read(self, index: MetadataIndex, item: ReadItem, capture: _Capture) -> None:
        try:
            self._reader.read_data(LoadPlan([item]), capture).wait()
        except OSError as e:
            if io_failure(e):
                raise
            self._refuse(index, e)
        except Exception as e:  # refused by weights_only, corrupt zip, wrong shape
            self._refuse(index, e)

    def _refuse(self, index: MetadataIndex, e: Exception) -> NoReturn:
        what = f"{index.fqn} at {list(index.offset)}" if index.offset else index.fqn
        text = str(e).split("\n\n")[-1 if isinstance(e, pickle.UnpicklingError) else 0]
        raise RefusedInputError(
            self.origin(index), f"{what}: not readable ({type(e).__name__}: {text[:300]})"
        ) from None

    def tensor(
        self, fqn: str, offsets: tuple[int, ...], sizes: tuple[int, ...], dtype: torch.dtype
    ) -> torch.Tensor:
        index = MetadataIndex(fqn, torch.Size(offsets))
        if self._key != index:
            self._key, self._tensor = None, None  # the previous chunk may go now
            zero = torch.Size([0] * len(sizes))
            item = ReadItem(LoadItemType.TENSOR, index, zero, index, zero, torch.Size(sizes))
            capture = _Capture(dtype)
            self._read(index, item, capture)
            self._key, self._tensor = index, capture.tensor
        assert self._tensor is not None
        return self._tensor

    def raw(self, fqn: str) -> bytes:
        index = MetadataIndex(fqn)
        item = ReadItem(
            LoadItemType.BYTE_IO, index, torch.Size([0]), index, torch.Size([0]), torch.Size([0])
        )
        capture = _Capture()
        self._read(index, item, capture)
        assert capture.raw is not None
        try:
            torch.load(io.BytesIO(capture.raw), weights_only=True)
        except Exception as e:
            text = str(e).split("\n\n")
            why = next((p for p in text if "GLOBAL" in p or "global" in p), text[0])
            raise RefusedInputError(
                self.origin(index),
                f"object {fqn!r} is refused by torch.load(weights_only=True): {why.strip()[:300]}",
            ) from None
        return capture.raw


def _planner_data(md: Metadata, names: set[str]) -> dict[str, tuple[Any, ...]] | None:
    """The flattening mappings if they are plain data for exactly these names, else None."""
    data = md.planner_data
    if not isinstance(data, dict) or set(data) != names:
        return None
    for path in data.values():
        if not isinstance(path, tuple) or not all(isinstance(p, str | int) for p in path):
            return None
    return dict(data)


def open_dcp(path: str | os.PathLike[str]) -> Source:
    """The chunks of a DCP directory's tensors in storage order, and its objects."""
    directory = Path(path)
    if not directory.is_dir():
        if not directory.exists():
            raise FileNotFoundError(f"{directory}: no such directory")
        raise RefusedInputError(str(directory), "not a directory (DCP writes a directory)")
    reader = SafeFileSystemReader(directory)
    md = reader.read_metadata()
    reader.set_up_storage_reader(md, True)
    chunks = _Chunks(reader, md, directory)
    source = Source("dcp", str(directory), [])
    located = []
    for fqn, meta in md.state_dict_metadata.items():
        if isinstance(meta, BytesStorageMetadata):
            source.objects[fqn] = Raw(chunks.raw(fqn))
            continue
        assert isinstance(meta, TensorStorageMetadata)
        dtype = dtype_of(meta.properties.dtype, str(directory), fqn)
        shape = tuple(int(d) for d in meta.size)
        for chunk in meta.chunks:
            offsets = tuple(int(o) for o in chunk.offsets)
            sizes = tuple(int(n) for n in chunk.sizes)
            info = md.storage_data[MetadataIndex(fqn, chunk.offsets)]
            piece = Piece(
                fqn,
                dtype,
                shape,
                offsets,
                sizes,
                str(directory / info.relative_path),
                _reader(chunks, fqn, offsets, sizes, meta.properties.dtype),
            )
            located.append(((info.relative_path, info.offset), piece))
    source.pieces = [p for _, p in sorted(located, key=lambda x: x[0])]
    mappings = _planner_data(md, set(md.state_dict_metadata))
    if mappings is not None:
        source.objects[PLANNER_DATA_ITEM] = mappings
    elif md.planner_data:
        source.notes.append("planner_data (the flattening mappings) not plain data: not kept")
    return source


def _reader(
    chunks: _Chunks,
    fqn: str,
    base: tuple[int, ...],
    sizes: tuple[int, ...],
    dtype: torch.dtype,
) -> Any:
    def read(offsets: tuple[int, ...], lengths: tuple[int, ...]) -> torch.Tensor:
        t = chunks.tensor(fqn, base, sizes, dtype)
        return t[box_slices(base, offsets, lengths)] if sizes else t

    return read
