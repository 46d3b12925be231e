"""A DCP checkpoint directory's `.metadata`, read without an unrestricted unpickle.

FileSystemWriter pickles the Metadata dataclass into `.metadata`, and FileSystemReader reads it
back with pickle.load: anything the file names would be imported and called. Here it is read by an
Unpickler whose find_class allows only what that pickle holds — the DCP metadata dataclasses,
_StorageInfo, torch.Size, torch dtypes / layouts / memory formats, pathlib paths (a checkpoint id)
and plain containers — so a `.metadata` naming anything else (os.system, builtins.eval, ...) is
refused before any of it runs. The result is then checked as data: every chunk inside its tensor,
the chunks' elements adding up to the tensor's, every chunk and object stored at a byte range
inside a file of the directory (no absolute or `..` paths). SafeFileSystemReader is DCP's own
FileSystemReader with that read_metadata; its read_data decodes each chunk with
torch.load(weights_only=True) as stock."""

from __future__ import annotations

import math
import os
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)

from ._common import RefusedInputError, check_name, dtype_of
from ._safe_pickle import RestrictedUnpickler

METADATA_FILE = ".metadata"

_ALLOWED: dict[str, frozenset[str]] = {
    "torch.distributed.checkpoint.metadata": frozenset(
        {
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        }
    ),
    "torch.distributed.checkpoint.filesystem": frozenset({"_StorageInfo"}),
    "torch.serialization": frozenset({"_get_layout"}),
    "torch": frozenset({"Size"}),
    "pathlib": frozenset({"PosixPath", "PurePosixPath", "Path"}),
    "collections": frozenset({"OrderedDict"}),
    "builtins": frozenset({"set", "frozenset", "tuple", "list", "dict"}),
}


def load_metadata(directory: str | os.PathLike[str]) -> Metadata:
    """The Metadata of a DCP FileSystemWriter directory, unpickled with the allowlist and
    validated against the directory's files."""
    path = Path(directory) / METADATA_FILE
    if not path.is_file():
        raise RefusedInputError(
            str(directory), f"no {METADATA_FILE}: not a DCP FileSystemWriter directory"
        )
    with open(path, "rb") as f:
        try:
            md = RestrictedUnpickler(f, str(path), _ALLOWED).load()
        except RefusedInputError:
            raise
        except Exception as e:  # truncated or corrupt pickle, wrong arguments to a class
            raise RefusedInputError(
                str(path), f"not a DCP metadata pickle ({type(e).__name__}: {e})"
            ) from None
    if not isinstance(md, Metadata):
        raise RefusedInputError(str(path), f"holds a {type(md).__name__}, not DCP Metadata")
    try:
        _validate(md, Path(directory), str(path))
    except (AttributeError, TypeError, ValueError) as e:
        if isinstance(e, RefusedInputError):
            raise
        # Allowed classes built with the wrong fields (a BUILD of arbitrary state).
        raise RefusedInputError(str(path), f"malformed DCP metadata ({e})") from None
    if not isinstance(getattr(md, "storage_meta", None), StorageMeta):
        md.storage_meta = StorageMeta()
    return md


def _ints(value: Any) -> bool:
    return isinstance(value, torch.Size | tuple | list) and all(
        isinstance(v, int) and v >= 0 for v in value
    )


def _validate(md: Metadata, directory: Path, where: str) -> None:
    if not isinstance(md.state_dict_metadata, dict) or not isinstance(md.storage_data, dict):
        raise RefusedInputError(where, "state_dict_metadata or storage_data is not a dict")
    sizes: dict[str, int] = {}
    for index, info in md.storage_data.items():
        if not isinstance(index, MetadataIndex) or not isinstance(info, _StorageInfo):
            raise RefusedInputError(where, f"storage_data entry {index!r}: not DCP's types")
        rel = info.relative_path
        parts = PurePosixPath(rel).parts if isinstance(rel, str) else ()
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise RefusedInputError(where, f"{index.fqn}: stored at {rel!r}, outside the directory")
        if rel not in sizes:
            file = directory / rel
            if not file.is_file():
                raise RefusedInputError(where, f"{index.fqn}: its file {rel} does not exist")
            sizes[rel] = file.stat().st_size
        offset, length = info.offset, info.length
        if not _ints((offset, length)) or offset + length > sizes[rel]:
            raise RefusedInputError(
                str(directory / rel),
                f"{index.fqn}: bytes [{offset}, {offset}+{length}) are not inside the file "
                f"({sizes[rel]} bytes): truncated or a lying .metadata",
            )
    for fqn, meta in md.state_dict_metadata.items():
        if not isinstance(fqn, str):
            raise RefusedInputError(where, f"a state-dict key {fqn!r} that is not a string")
        check_name(fqn, where)
        if isinstance(meta, BytesStorageMetadata):
            if MetadataIndex(fqn) not in md.storage_data:
                raise RefusedInputError(where, f"object {fqn!r} has no storage entry")
        elif isinstance(meta, TensorStorageMetadata):
            _validate_tensor(md, fqn, meta, where)
        else:
            raise RefusedInputError(where, f"{fqn!r}: a {type(meta).__name__}, not DCP's types")


def _validate_tensor(md: Metadata, fqn: str, meta: TensorStorageMetadata, where: str) -> None:
    dtype_of(meta.properties.dtype, where, fqn)
    size = meta.size
    if not _ints(size) or not isinstance(meta.chunks, list):
        raise RefusedInputError(where, f"tensor {fqn!r}: a malformed size or chunk list")
    covered = 0
    for chunk in meta.chunks:
        off, n = chunk.offsets, chunk.sizes
        if not (_ints(off) and _ints(n) and len(off) == len(n) == len(size)) or any(
            o + k > s for o, k, s in zip(off, n, size, strict=True)
        ):
            raise RefusedInputError(
                where, f"tensor {fqn!r} {list(size)}: chunk at {off} of {n} is not inside it"
            )
        if MetadataIndex(fqn, off) not in md.storage_data:
            raise RefusedInputError(where, f"tensor {fqn!r}: chunk at {list(off)} is not stored")
        covered += math.prod(n)
    if covered != math.prod(size):
        raise RefusedInputError(
            where,
            f"tensor {fqn!r} {list(size)}: its chunks hold {covered} elements, the tensor "
            f"{math.prod(size)} (overlapping or missing chunks)",
        )


class SafeFileSystemReader(FileSystemReader):
    """DCP's FileSystemReader, reading `.metadata` with load_metadata (allowlisted, validated)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            raise RefusedInputError(
                str(self.path), "rank-local metadata (__N.metadata) is not supported"
            )
        md = load_metadata(self.path)
        assert md.storage_meta is not None
        md.storage_meta.load_id = self.load_id
        return md
