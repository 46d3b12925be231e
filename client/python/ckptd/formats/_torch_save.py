"""torch.save files of plain state dicts as an import source: one file, or a sharded model
through its `*.bin.index.json` / `*.pt.index.json` (`weight_map`). Read only with
torch.load(weights_only=True) — torch's restricted unpickler: tensors, containers and plain
values, never arbitrary globals — memory-mapped (mmap=True) for the zip format, so tensors are
views of the page cache and the import copies each once, straight into the daemon's arena.

Names: nested dicts are flattened with dots ({"model": {"w": t}} -> "model.w", int keys as their
decimal text), lists and tuples holding tensors by index ("layers.0"), as DCP flattens a state
dict. Every other leaf (ints, floats, strings, lists without tensors, empty dicts) becomes an
object item holding that value (pickled by the client, as client.save objects are)."""

from __future__ import annotations

import os
import pickle
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._common import (
    Piece,
    RefusedInputError,
    Source,
    box_slices,
    check_name,
    dtype_of,
    io_failure,
    read_index,
)

INDEX_SUFFIXES = (".bin.index.json", ".pt.index.json", ".pth.index.json")


def _files(path: Path) -> tuple[list[Path], Path]:
    if path.is_dir():
        indexes = sorted(p for s in INDEX_SUFFIXES for p in path.glob("*" + s))
        if len(indexes) != 1:
            raise RefusedInputError(
                str(path),
                f"holds {len(indexes)} state-dict indexes ({', '.join(INDEX_SUFFIXES)})"
                ": name a torch.save file or the index",
            )
        path = indexes[0]
    if path.name.endswith(".json"):
        return [path.parent / f for f in sorted(read_index(path))], path
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file or directory")
    return [path], path


def _why(e: BaseException) -> str:
    """torch's weights_only refusal without its advice to retry unsafely: the restricted
    unpickler's own reason (which global) where it gives one."""
    text = str(e)
    marker = "WeightsUnpickler error: "
    if marker in text:
        reason = text.split(marker, 1)[1].split(" Please use ")[0].split("\n")[0].strip()
        return reason[:300]
    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    kept = [
        p
        for p in paragraphs
        if not p.startswith(("Weights only load failed", "Check the documentation"))
    ]
    return " ".join(kept or paragraphs[:1]).replace("\n", " ")[:400]


def load_state(file: Path, safe_globals: Sequence[Any] = ()) -> tuple[Any, bool]:
    """(the object in `file`, whether it is memory-mapped), read by torch.load(weights_only=True),
    which may also build the `safe_globals` (torch.serialization.safe_globals' entries: a format's
    few data-only classes); RefusedInputError naming the file for anything that is not a safe,
    readable torch.save."""
    import torch

    with open(file, "rb"):  # a missing or unreadable file is an I/O error, not refused input
        pass
    mmap = zipfile.is_zipfile(file)  # the zip format maps; the legacy one is read whole
    try:
        with torch.serialization.safe_globals(list(safe_globals)):
            return torch.load(file, map_location="cpu", weights_only=True, mmap=mmap), mmap
    except OSError as e:
        if io_failure(e):
            raise
        raise RefusedInputError(str(file), f"not a readable torch.save file ({e})") from None
    except pickle.UnpicklingError as e:
        raise RefusedInputError(
            str(file), f"refused by torch.load(weights_only=True): {_why(e)}"
        ) from None
    except Exception as e:  # corrupt data: miniz, EOF, bad records
        raise RefusedInputError(
            str(file), f"not a readable torch.save file ({type(e).__name__}: {_why(e)})"
        ) from None


def _has_tensor(value: Any) -> bool:
    import torch

    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_has_tensor(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_has_tensor(v) for v in value)
    return False


def flatten(value: Any, origin: str, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted name, leaf) pairs of a state dict, as the module docstring says."""
    import torch

    children: list[tuple[Any, Any]] | None = None
    if isinstance(value, Mapping) and value:
        children = list(value.items())
    elif (
        isinstance(value, list | tuple) and not isinstance(value, torch.Size) and _has_tensor(value)
    ):
        children = list(enumerate(value))
    if children is None:
        return [(prefix, value)]
    out: list[tuple[str, Any]] = []
    for key, child in children:
        out.extend(flatten(child, origin, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _piece(name: str, t: Any, origin: str) -> Piece:
    import torch

    if t.layout != torch.strided or t.is_quantized or t.device.type != "cpu":
        raise RefusedInputError(
            origin, f"tensor {name!r}: {t.layout}, quantized or on {t.device}: not dense on CPU"
        )
    dtype = dtype_of(t.dtype, origin, name)
    shape = tuple(int(d) for d in t.shape)
    base = (0,) * len(shape)

    def read(offsets: tuple[int, ...], lengths: tuple[int, ...]) -> Any:
        return t.detach()[box_slices(base, offsets, lengths)] if shape else t.detach()

    return Piece(name, dtype, shape, base, shape, origin, read)


def open_torch_save(path: str | os.PathLike[str]) -> Source:
    """The tensors and plain values of torch.save files, tensors in file order."""
    import torch

    files, shown = _files(Path(path))
    source = Source("torch", str(shown), [])
    origin_of: dict[str, str] = {}
    for file in files:
        if not file.is_file():
            raise RefusedInputError(str(shown), f"names {file.name}, which does not exist")
        state, mapped = load_state(file)
        if not mapped:
            source.notes.append(f"{file.name}: legacy (non-zip) torch.save format, read whole")
        if not isinstance(state, Mapping):
            raise RefusedInputError(
                str(file), f"holds a {type(state).__name__}, not a state dict (a dict of tensors)"
            )
        for name, leaf in flatten(state, str(file)):
            check_name(name, str(file))
            if name in origin_of:
                raise RefusedInputError(
                    str(file), f"two entries flatten to {name!r} (also in {origin_of[name]})"
                )
            origin_of[name] = file.name
            if isinstance(leaf, torch.Tensor):
                source.pieces.append(_piece(name, leaf, str(file)))
            else:
                source.objects[name] = leaf
    return source
