"""What every importer shares: pieces (boxes of tensor items, read lazily), sources (a format's
pieces and objects), the refusal error, and the planner that packs pieces into ranks.

An import saves the checkpoint as several "ranks" of one process, each a batch of at most
`limit_bytes` of pieces: every rank saves whole pieces (a box of one item) and no item twice, so
the daemon's checks (every tensor covered exactly once) hold, and the importer never holds more
than one batch. A piece larger than the limit is cut into row blocks (boxes along its first axis
longer than 1; a single row still too large along the next axis, and so on)."""

from __future__ import annotations

import errno
import json
import math
import pickle
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Any

from .. import Raw, _arrays

# The daemon's limits (daemon/src/common/limits.h) an import must stay within.
WORLD_SIZE_MAX = 65536
ITEM_NAME_BYTES_MAX = 1024
ALIGNMENT_BYTES = 4096  # each staged shard takes whole pages of the arena
RESERVED_PREFIX = "__ckptd__/"  # ckptd.torch's own items (ckptd/torch/_ids.py)
# Where an import keeps the safetensors files' __metadata__ ({file name: {key: value}}).
SAFETENSORS_METADATA_ITEM = RESERVED_PREFIX + "safetensors_metadata"

Reader = Callable[[tuple[int, ...], tuple[int, ...]], Any]


class RefusedInputError(ValueError):
    """Input that cannot be read safely or is malformed: the message names the file (exit 3)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path


@dataclass(frozen=True)
class Piece:
    """A box of tensor item `item`; read(offsets, lengths) returns a box inside it (global
    coordinates) as a CPU torch tensor of shape `lengths` and dtype `dtype`."""

    item: str
    dtype: str  # ckptd dtype name
    shape: tuple[int, ...]  # the item's global shape
    offsets: tuple[int, ...]
    lengths: tuple[int, ...]
    origin: str  # the file it comes from, for messages
    read: Reader = field(compare=False, repr=False)

    @property
    def nbytes(self) -> int:
        return math.prod(self.lengths) * _arrays.ITEMSIZE[self.dtype]

    @property
    def cost(self) -> int:
        """Staging-arena bytes: the daemon's extents are whole 4 KiB pages."""
        return -(-self.nbytes // ALIGNMENT_BYTES) * ALIGNMENT_BYTES

    @property
    def whole(self) -> bool:
        return self.lengths == self.shape and not any(self.offsets)


@dataclass
class Source:
    """One input, described before anything is read: its tensor pieces in the order to read them
    and its object items (values the client pickles, or ckptd.Raw bytes)."""

    format: str
    path: str
    pieces: list[Piece]
    objects: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    close: Callable[[], None] = lambda: None


def check_name(name: str, origin: str) -> None:
    """Refuses item names the daemon or ckptd.torch would reject or misread."""
    if not name:
        raise RefusedInputError(origin, "an empty tensor or object name")
    if name.startswith(RESERVED_PREFIX):
        raise RefusedInputError(origin, f"name {name!r}: the prefix {RESERVED_PREFIX} is ckptd's")
    if len(name.encode("utf-8", "surrogatepass")) > ITEM_NAME_BYTES_MAX:
        raise RefusedInputError(
            origin, f"name {name[:60]!r}...: longer than {ITEM_NAME_BYTES_MAX} bytes"
        )


def dtype_of(torch_dtype: Any, origin: str, name: str) -> str:
    """ckptd's dtype name for a torch dtype; refused when ckptd has no such dtype."""
    try:
        return _arrays.dtype_name(torch_dtype)
    except (ValueError, TypeError):
        supported = ", ".join(sorted(_arrays.ITEMSIZE))
        raise RefusedInputError(
            origin, f"tensor {name!r}: dtype {torch_dtype} is not one ckptd stores ({supported})"
        ) from None


def split(piece: Piece, limit_bytes: int) -> Iterator[Piece]:
    """`piece` cut into boxes of at most limit_bytes (counted in whole pages, as Piece.cost): row
    blocks along its first axis longer than 1, a row still too large cut along the next such axis.
    Each box is contiguous in row-major order of the item when the piece is the whole item.
    limit_bytes is at least 2 pages."""
    if piece.cost <= limit_bytes:
        yield piece
        return
    axis = next(a for a, n in enumerate(piece.lengths) if n > 1)
    slab_bytes = piece.nbytes // piece.lengths[axis]
    step = max(1, (limit_bytes - ALIGNMENT_BYTES) // slab_bytes)
    for lo in range(0, piece.lengths[axis], step):
        n = min(step, piece.lengths[axis] - lo)
        offsets = list(piece.offsets)
        lengths = list(piece.lengths)
        offsets[axis] += lo
        lengths[axis] = n
        sub = replace(piece, offsets=tuple(offsets), lengths=tuple(lengths))
        yield from split(sub, limit_bytes) if sub.cost > limit_bytes else (sub,)


def plan_batches(
    pieces: Sequence[Piece], limit_bytes: int, first_bytes: int = 0
) -> list[list[Piece]]:
    """Pieces packed in order into batches of at most limit_bytes of arena pages (Piece.cost), none
    holding two pieces of one item (a rank saves each item once); the first batch starts with
    first_bytes taken (rank 0's objects). Empty pieces weigh nothing. At least one batch."""
    batches: list[list[Piece]] = []
    current: list[Piece] = []
    current_bytes = first_bytes
    names: set[str] = set()
    for whole in pieces:
        for p in split(whole, limit_bytes):
            full = current_bytes + p.cost > limit_bytes and (current or current_bytes)
            if full or p.item in names:
                batches.append(current)
                current, current_bytes, names = [], 0, set()
            current.append(p)
            current_bytes += p.cost
            names.add(p.item)
    batches.append(current)
    return batches


def object_bytes(value: Any) -> int:
    """Arena pages an object item takes (ckptd.Raw bytes as they are, anything else pickled, as
    client.save stores them)."""
    if isinstance(value, Raw):
        n = len(value.data)
    else:
        n = len(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    return -(-n // ALIGNMENT_BYTES) * ALIGNMENT_BYTES


def flat_start(shape: Sequence[int], offsets: Sequence[int]) -> int:
    """Row-major element index of `offsets` in a tensor of `shape`."""
    start = 0
    for n, o in zip(shape, offsets, strict=True):
        start = start * n + o
    return start


def box_slices(
    base: Sequence[int], offsets: Sequence[int], lengths: Sequence[int]
) -> tuple[slice, ...]:
    """Index of the box (offsets, lengths) in a tensor whose element 0 is at `base`."""
    return tuple(slice(o - b, o - b + n) for b, o, n in zip(base, offsets, lengths, strict=True))


def read_index(index: Path) -> dict[str, list[str]]:
    """File name -> tensor names of a sharded model's index (`weight_map`: tensor name -> file
    name, as Hugging Face writes for safetensors and torch.save shards), validated."""
    try:
        doc = json.loads(index.read_bytes())
    except (ValueError, UnicodeDecodeError) as e:
        raise RefusedInputError(str(index), f"not a JSON index: {e}") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise RefusedInputError(str(index), 'no "weight_map" object of tensor name -> file')
    files: dict[str, list[str]] = {}
    for name, file in weight_map.items():
        parts = PurePosixPath(file).parts if isinstance(file, str) else ()
        if not parts or PurePosixPath(file).is_absolute() or ".." in parts or "\\" in file:
            raise RefusedInputError(
                str(index), f"tensor {name!r} maps to {file!r}: not a file name inside the model"
            )
        files.setdefault(file, []).append(name)
    return files


def io_failure(e: OSError) -> bool:
    """An OSError the system gave (EIO, ENOENT, EACCES, ...: exit 1), as opposed to EINVAL, which
    readers raise for a seek or mmap past the end of a truncated file (refused input)."""
    return e.errno not in (errno.EINVAL, None)


class UsageError(ValueError):
    """An argument that cannot work (a batch too small for the input, ...): exit 2."""
