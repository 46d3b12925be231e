"""Hugging Face safetensors as an import source: one file, or a sharded model through its
`*.safetensors.index.json` (`weight_map`: tensor name -> file name). Read only with the
`safetensors` library (safe_open, which validates each header: dtypes, shapes, offsets that cover
the file exactly), tensor by tensor, row blocks through get_slice: nothing is unpickled."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .. import _arrays
from ._common import (
    SAFETENSORS_METADATA_ITEM,
    Piece,
    RefusedInputError,
    Source,
    box_slices,
    check_name,
    read_index,
)

INDEX_SUFFIX = ".safetensors.index.json"
# safetensors dtype name -> ckptd dtype name (the SAFETENSORS column of the one dtype table)
_DTYPES = {st: name for name, _, _, st, _ in _arrays.DTYPES}


def _resolve(path: Path) -> tuple[list[tuple[Path, list[str] | None]], Path]:
    """([(file, its tensor names per the index, or None: all)], the path to name in messages)."""
    if path.is_dir():
        indexes = sorted(path.glob("*" + INDEX_SUFFIX))
        preferred = path / ("model" + INDEX_SUFFIX)
        if preferred.is_file() or len(indexes) == 1:
            return _resolve(preferred if preferred.is_file() else indexes[0])
        single = sorted(path.glob("*.safetensors"))
        if (path / "model.safetensors").is_file():
            single = [path / "model.safetensors"]
        if len(single) != 1:
            raise RefusedInputError(
                str(path),
                f"holds {len(single)} .safetensors files and no {INDEX_SUFFIX}: name a file "
                "or the index",
            )
        return [(single[0], None)], single[0]
    if path.name.endswith(".json"):
        return [(path.parent / f, names) for f, names in sorted(read_index(path).items())], path
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    return [(path, None)], path


def open_safetensors(path: str | os.PathLike[str]) -> Source:
    """The tensors of a safetensors file or sharded model, in file then name order."""
    from safetensors import SafetensorError, safe_open

    files, shown = _resolve(Path(path))
    handles: list[Any] = []

    def close() -> None:
        for h in handles:
            h.__exit__(None, None, None)

    source = Source("safetensors", str(shown), [], close=close)
    seen: dict[str, str] = {}
    metadata: dict[str, dict[str, str]] = {}
    try:
        for file, listed in files:
            if not file.is_file():
                raise RefusedInputError(str(shown), f"names {file.name}, which does not exist")
            try:
                handle = safe_open(str(file), framework="pt")
                handles.append(handle)
                f = handle.__enter__()
                names = sorted(f.keys())
                meta = f.metadata()
            except SafetensorError as e:
                raise RefusedInputError(str(file), f"not a valid safetensors file: {e}") from None
            if meta:
                metadata[file.name] = dict(meta)
            wanted = listed if listed is not None else names
            missing = sorted(set(wanted) - set(names))
            if missing:
                raise RefusedInputError(
                    str(file), f"the index maps {missing[:5]} here, but the file lacks them"
                )
            extra = sorted(set(names) - set(wanted))
            if extra:
                source.notes.append(f"{file.name}: {len(extra)} tensors not in the index, skipped")
            for name in sorted(wanted):
                if name in seen:
                    raise RefusedInputError(str(file), f"tensor {name!r} is also in {seen[name]}")
                seen[name] = file.name
                source.pieces.append(_piece(f, name, str(file)))
    except BaseException:
        close()
        raise
    if metadata:
        source.objects[SAFETENSORS_METADATA_ITEM] = metadata
    return source


def _piece(f: Any, name: str, origin: str) -> Piece:
    check_name(name, origin)
    sl = f.get_slice(name)
    st_dtype = sl.get_dtype()
    dtype = _DTYPES.get(st_dtype)
    if dtype is None:
        raise RefusedInputError(
            origin, f"tensor {name!r}: dtype {st_dtype} is not one ckptd stores ({sorted(_DTYPES)})"
        )
    shape = tuple(int(d) for d in sl.get_shape())

    def read(offsets: tuple[int, ...], lengths: tuple[int, ...]) -> Any:
        if not shape:
            return f.get_tensor(name)
        return f.get_slice(name)[box_slices((0,) * len(shape), offsets, lengths)]

    return Piece(name, dtype, shape, (0,) * len(shape), shape, origin, read)
