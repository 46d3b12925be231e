"""Tensor-parallel layouts: fused and vocabulary-padded parameters saved as their LOGICAL tensors.

A checkpoint holds every item as one logical global tensor, whatever the tensor-parallel (TP)
size that saved it; each TP rank saves the boxes of it that its local (physical) tensor holds and
loads the boxes that its local tensor needs at the new TP size. Three parameter shapes make the
naive "concatenate the TP shards on dim 0" wrong, and each gets a descriptor:

* `Fused(dim, parts)`: sub-parameters stacked along `dim` ([Q;K;V], SwiGLU's [W;V]), each split
  across TP ranks, so TP rank k holds [Q_k; K_k; V_k]. Saved as the logical [Q;K;V].
* `Padded(dim, logical, split=True)`: a vocabulary padded to a multiple that depends on the TP
  size. Rows from `logical` on are padding: never saved, zero-filled on load.
* `Replicated()`: the same whole tensor on every TP rank (saved by TP rank 0 only).
* `Split(dim)`: the plain even split along `dim`.

`Layouts` maps item names to descriptors, explicit names first, then glob patterns (fnmatch,
case-sensitive) in declaration order: the first matching pattern wins. It is strict: at a TP size
above 1 an item that matches nothing is an error naming it (declare `"*": Replicated()` last to
opt out knowingly); at TP size 1 an undeclared item is saved and loaded whole.

`save_shards` / `load_targets` / `padding_views` are the pure planning functions; `save_tp` /
`load_tp` run them against a Client and record / check the descriptors in the object item
`ckptd.layouts` (JSON). Changing how a logical tensor is distributed (Split <-> Replicated, the
split dim, Padded's split flag) between save and load is resharding and allowed; changing what it
means (other Fused parts, another padded logical size) is refused.

Views: every planned piece is a basic slice of the local tensor, so a real view (no copy). A piece
along dim 0 of a contiguous tensor is contiguous; a piece along another dim is strided, and the
client library gathers it into the staging arena on save and scatters into it on load, in the
one copy it makes anyway (CUDA tensors: the client saves a contiguous copy on the device and loads
through a contiguous temporary, see Client._load_into). numpy arrays and torch tensors both work;
torch is not imported here.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import _arrays
from ._client import Box, Client, Raw, SaveHandle, Shard

LAYOUTS_ITEM = "ckptd.layouts"  # the replicated object item recording the descriptors
RECORD_FORMAT = "ckptd.layouts"
RECORD_VERSION = 1


class LayoutError(ValueError):
    """A layout cannot be applied: an undeclared item at TP size > 1, an uneven split, a local
    tensor of the wrong shape, a declared layout that disagrees with the recorded one, or a
    malformed record. The message names the item."""


def _check_dim(kind: str, dim: object) -> None:
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 0:
        raise LayoutError(f"{kind}: dim must be an int >= 0, not {dim!r}")


@dataclass(frozen=True)
class Replicated:
    """Every TP rank holds the whole tensor; TP rank 0 saves it, every TP rank loads it whole."""

    def to_json(self) -> dict[str, Any]:
        return {"kind": "replicated"}


@dataclass(frozen=True)
class Split:
    """TP rank k holds the k-th of tp_size equal slices along `dim`."""

    dim: int

    def __post_init__(self) -> None:
        _check_dim("Split", self.dim)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "split", "dim": self.dim}


@dataclass(frozen=True)
class Fused:
    """Sub-parameters of logical widths `parts` stacked along `dim` ((H, H, H) for QKV, (H, kv,
    kv) for grouped-query attention, (F, F) for SwiGLU), each split evenly across TP ranks: TP
    rank k holds the k-th slice of every part, in order. Every width must divide by the TP size."""

    dim: int
    parts: tuple[int, ...]

    def __post_init__(self) -> None:
        _check_dim("Fused", self.dim)
        parts = tuple(self.parts)
        if not parts or any(not isinstance(p, int) or isinstance(p, bool) or p <= 0 for p in parts):
            raise LayoutError(f"Fused: parts must be positive ints, not {self.parts!r}")
        object.__setattr__(self, "parts", parts)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "fused", "dim": self.dim, "parts": list(self.parts)}


@dataclass(frozen=True)
class Padded:
    """A tensor padded along `dim` past its `logical` size (a vocabulary padded to a multiple
    that depends on the TP size). Only the logical rows are saved; padding is zero-filled on load.
    split=True: the padded tensor is split evenly across TP ranks along `dim`; False: every TP rank
    holds all of it (saved by TP rank 0)."""

    dim: int
    logical: int
    split: bool = True

    def __post_init__(self) -> None:
        _check_dim("Padded", self.dim)
        if not isinstance(self.logical, int) or isinstance(self.logical, bool) or self.logical < 1:
            raise LayoutError(f"Padded: logical must be an int >= 1, not {self.logical!r}")
        if not isinstance(self.split, bool):
            raise LayoutError(f"Padded: split must be a bool, not {self.split!r}")

    def to_json(self) -> dict[str, Any]:
        return {"kind": "padded", "dim": self.dim, "logical": self.logical, "split": self.split}


Layout = Replicated | Split | Fused | Padded


def layout_from_json(value: object) -> Layout:
    """The descriptor a to_json() dict stands for; LayoutError for anything else."""
    if not isinstance(value, dict) or not isinstance(value.get("kind"), str):
        raise LayoutError(f"a layout is an object with a 'kind', not {value!r}")
    kind = value["kind"]
    fields = {k: v for k, v in value.items() if k != "kind"}
    known: dict[str, tuple[type[Any], set[str], set[str]]] = {  # class, required, optional fields
        "replicated": (Replicated, set(), set()),
        "split": (Split, {"dim"}, set()),
        "fused": (Fused, {"dim", "parts"}, set()),
        "padded": (Padded, {"dim", "logical"}, {"split"}),
    }
    if kind not in known:
        raise LayoutError(f"unknown layout kind {kind!r} (known: {sorted(known)})")
    cls, required, optional = known[kind]
    if not required <= set(fields) <= required | optional:
        raise LayoutError(
            f"layout {value!r}: {kind} takes the fields {sorted(required | optional)}"
        )
    if kind == "fused":
        if not isinstance(fields["parts"], list):
            raise LayoutError(f"layout {value!r}: parts must be a list")
        fields["parts"] = tuple(fields["parts"])
    layout: Layout = cls(**fields)
    return layout


class Layouts:
    """Item name -> layout: exact names first, then glob patterns (fnmatch.fnmatchcase; a key with
    *, ? or [ is a pattern) in the order declared, the first match winning. Strict: at TP size
    > 1 an item that matches nothing is a LayoutError naming it; at TP size 1 it is whole."""

    def __init__(self, layouts: Mapping[str, Layout] | None = None) -> None:
        self._exact: dict[str, Layout] = {}
        self._patterns: list[tuple[str, Layout]] = []
        for key, layout in (layouts or {}).items():
            self.add(key, layout)

    def add(self, key: str, layout: Layout) -> Layouts:
        """Declares `key` (a name or a glob pattern); returns self, for chaining."""
        if not isinstance(layout, Layout):
            raise LayoutError(f"{key}: {layout!r} is not a layout")
        if any(c in key for c in "*?["):
            self._patterns.append((key, layout))
        else:
            self._exact[key] = layout
        return self

    def find(self, name: str) -> Layout | None:
        """The declared layout of `name`, or None."""
        if name in self._exact:
            return self._exact[name]
        for pattern, layout in self._patterns:
            if fnmatch.fnmatchcase(name, pattern):
                return layout
        return None

    def resolve(self, name: str, tp_size: int) -> Layout | None:
        """find(name), enforcing strictness: None (whole) only at tp_size 1."""
        layout = self.find(name)
        if layout is None and tp_size > 1:
            raise LayoutError(
                f"item {name}: no layout declared for it at tensor-parallel size {tp_size} "
                "(declare Split, Fused, Padded or Replicated; undeclared items are only "
                "saved whole at TP size 1)"
            )
        return layout

    def rules(self) -> list[tuple[str, Layout]]:
        """Every declaration, exact names first, then the patterns in order."""
        return [*self._exact.items(), *self._patterns]


# --- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """Rows [local_start, local_start + length) of the local tensor along `dim` are rows
    [global_start, ...) of the logical tensor."""

    dim: int
    local_start: int
    global_start: int
    length: int


def _check_tp(name: str, tp_rank: int, tp_size: int) -> None:
    if tp_size < 1 or not 0 <= tp_rank < tp_size:
        raise LayoutError(f"item {name}: tp_rank {tp_rank} is not in [0, tp_size {tp_size})")


def _plan(
    name: str, shape: list[int], layout: Layout | None, tp_rank: int, tp_size: int, saving: bool
) -> tuple[list[int], list[_Piece]]:
    """The logical global shape a local tensor of `shape` implies, and the pieces of it that TP
    rank tp_rank saves (saving) or loads. A 0-d tensor's one piece has dim -1."""
    _check_tp(name, tp_rank, tp_size)
    if layout is None and tp_size > 1:
        raise LayoutError(f"item {name}: no layout at tensor-parallel size {tp_size}")
    if layout is None or isinstance(layout, Replicated):
        first = not saving or tp_rank == 0
        if not shape:
            return [], [_Piece(-1, 0, 0, 0)] if first else []
        return list(shape), [_Piece(0, 0, 0, shape[0])] if first else []
    if layout.dim >= len(shape):
        raise LayoutError(f"item {name}: {layout} on a tensor of shape {shape}")
    dim, n = layout.dim, shape[layout.dim]
    glob = list(shape)
    if isinstance(layout, Split):
        glob[dim] = n * tp_size
        return glob, [_Piece(dim, 0, tp_rank * n, n)]
    if isinstance(layout, Fused):
        uneven = [p for p in layout.parts if p % tp_size]
        if uneven:
            raise LayoutError(
                f"item {name}: {layout}: part widths {uneven} do not divide by the "
                f"tensor-parallel size {tp_size}"
            )
        if n * tp_size != sum(layout.parts):
            raise LayoutError(
                f"item {name}: {layout} at tensor-parallel size {tp_size} wants "
                f"{sum(layout.parts) // tp_size} along dim {dim} of the local tensor, which has "
                f"shape {shape}"
            )
        glob[dim] = sum(layout.parts)
        pieces, local, logical = [], 0, 0
        for width in layout.parts:
            w = width // tp_size
            pieces.append(_Piece(dim, local, logical + tp_rank * w, w))
            local, logical = local + w, logical + width
        return glob, pieces
    # Padded: this rank holds physical rows [start, start + n) of the padded tensor
    start, physical = (tp_rank * n, n * tp_size) if layout.split else (0, n)
    if physical < layout.logical:
        raise LayoutError(
            f"item {name}: {layout}: the local tensor of shape {shape} at tensor-parallel size "
            f"{tp_size} holds {physical} rows along dim {dim}, fewer than the {layout.logical} "
            "logical ones"
        )
    glob[dim] = layout.logical
    keep = max(0, min(n, layout.logical - start))
    if keep == 0 or (saving and not layout.split and tp_rank != 0):
        return glob, []
    return glob, [_Piece(dim, 0, start, keep)]


def _slice(t: Any, dim: int, start: int, length: int) -> Any:
    """A view of t: indices [start, start + length) along dim (basic slicing never copies)."""
    if dim < 0:
        return t
    return t[(slice(None),) * dim + (slice(start, start + length),)]


def _box(glob: list[int], shape: list[int], piece: _Piece) -> Box:
    offsets = [0] * len(glob)
    lengths = list(shape)
    if piece.dim >= 0:
        offsets[piece.dim] = piece.global_start
        lengths[piece.dim] = piece.length
    return Box(offsets, lengths)


def save_shards(
    name: str, local_tensor: Any, layout: Layout | None, tp_rank: int, tp_size: int
) -> list[tuple[Any, list[int], Box]]:
    """The regions of the logical tensor `name` that TP rank tp_rank's local tensor holds, as
    (view of local_tensor, logical global shape, Box): padding left out, nothing for a replicated
    tensor on TP ranks other than 0. layout None: the whole tensor (TP size 1 only)."""
    shape = _arrays.shape_of(local_tensor)
    glob, pieces = _plan(name, shape, layout, tp_rank, tp_size, saving=True)
    return [
        (_slice(local_tensor, p.dim, p.local_start, p.length), glob, _box(glob, shape, p))
        for p in pieces
    ]


def load_targets(
    name: str,
    local_tensor: Any,
    layout: Layout | None,
    tp_rank: int,
    tp_size: int,
    *,
    global_shape: Iterable[int] | None = None,
) -> list[tuple[Box, Any]]:
    """What TP rank tp_rank reads into its local tensor at TP size tp_size: (Box of the logical
    tensor, view of local_tensor) pairs. The padding rows (padding_views) are not among them.
    global_shape: the item's logical shape in the checkpoint; when given, a local tensor that does
    not fit it (an uneven split, another padded size) is a LayoutError naming the item."""
    shape = _arrays.shape_of(local_tensor)
    glob, pieces = _plan(name, shape, layout, tp_rank, tp_size, saving=False)
    if global_shape is not None:
        _check_global(name, shape, layout, tp_size, glob, [int(d) for d in global_shape])
    return [
        (_box(glob, shape, p), _slice(local_tensor, p.dim, p.local_start, p.length)) for p in pieces
    ]


def _check_global(
    name: str,
    shape: list[int],
    layout: Layout | None,
    tp_size: int,
    want: list[int],
    got: list[int],
) -> None:
    if want == got:
        return
    if isinstance(layout, Split) and len(got) == len(shape) and got[layout.dim] % tp_size:
        raise LayoutError(
            f"item {name}: {layout}: dim {layout.dim} of the checkpoint's shape {got} does not "
            f"split evenly over tensor-parallel size {tp_size}"
        )
    raise LayoutError(
        f"item {name}: the checkpoint holds logical shape {got}, but {layout or 'whole'} at "
        f"tensor-parallel size {tp_size} with a local tensor of shape {shape} means {want}"
    )


def padding_views(
    name: str, local_tensor: Any, layout: Layout | None, tp_rank: int, tp_size: int
) -> list[Any]:
    """Views of the padding rows of TP rank tp_rank's local tensor (Padded layouts only), which a
    load zero-fills: padding is never stored."""
    if not isinstance(layout, Padded):
        return []
    shape = _arrays.shape_of(local_tensor)
    _, pieces = _plan(name, shape, layout, tp_rank, tp_size, saving=False)
    n = shape[layout.dim]
    keep = pieces[0].length if pieces else 0
    return [_slice(local_tensor, layout.dim, keep, n - keep)] if keep < n else []


# --- the record ----------------------------------------------------------------------------------


def _layout_json(layout: Layout | None) -> dict[str, Any]:
    return {"kind": "whole"} if layout is None else layout.to_json()


def record_json(layouts: Layouts, resolved: Mapping[str, Layout | None], tp_size: int) -> bytes:
    """The `ckptd.layouts` object: the TP size, the layout each item saved here was saved with
    ("whole": undeclared at TP size 1), and the declarations, so that items saved by other ranks
    (other pipeline stages) resolve the same way."""
    record = {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "tp_size": tp_size,
        "items": {name: _layout_json(layout) for name, layout in resolved.items()},
        "rules": [[key, layout.to_json()] for key, layout in layouts.rules()],
    }
    return json.dumps(record, sort_keys=True).encode()


@dataclass(frozen=True)
class Record:
    """A parsed `ckptd.layouts` object."""

    tp_size: int
    items: dict[str, Layout | None]  # None: saved whole at TP size 1
    rules: Layouts

    def layout_of(self, name: str) -> tuple[bool, Layout | None]:
        """(known, layout) of an item: its own entry, else the recorded declarations, else whole
        where the checkpoint was saved at TP size 1; known False otherwise."""
        if name in self.items:
            return True, self.items[name]
        layout = self.rules.find(name)
        return layout is not None or self.tp_size == 1, layout


def parse_record(data: bytes, where: str = LAYOUTS_ITEM) -> Record:
    """The record save_tp wrote; LayoutError naming `where` for malformed JSON, another format or
    version, or unknown layout kinds."""
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LayoutError(f"{where}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != RECORD_FORMAT:
        raise LayoutError(f"{where}: not a {RECORD_FORMAT} record")
    if doc.get("version") != RECORD_VERSION:
        raise LayoutError(f"{where}: version {doc.get('version')!r}, this client reads 1")
    tp_size, items, rules = doc.get("tp_size"), doc.get("items"), doc.get("rules")
    if not isinstance(tp_size, int) or isinstance(tp_size, bool) or tp_size < 1:
        raise LayoutError(f"{where}: tp_size {tp_size!r} is not an int >= 1")
    if not isinstance(items, dict) or not isinstance(rules, list):
        raise LayoutError(f"{where}: 'items' must be an object and 'rules' a list")
    parsed: dict[str, Layout | None] = {}
    declared = Layouts()
    try:
        for name, value in items.items():
            whole = isinstance(value, dict) and value.get("kind") == "whole" and len(value) == 1
            parsed[name] = None if whole else layout_from_json(value)
        for rule in rules:
            if not isinstance(rule, list) or len(rule) != 2 or not isinstance(rule[0], str):
                raise LayoutError(f"a rule is [name or pattern, layout], not {rule!r}")
            declared.add(rule[0], layout_from_json(rule[1]))
    except LayoutError as e:
        raise LayoutError(f"{where}: {e}") from None
    return Record(tp_size, parsed, declared)


def _meaning(layout: Layout | None) -> tuple[Any, Any]:
    """What a layout says about the logical tensor itself, beyond how it is distributed."""
    fused = (layout.dim, layout.parts) if isinstance(layout, Fused) else None
    padded = (layout.dim, layout.logical) if isinstance(layout, Padded) else None
    return fused, padded


def check_compatible(name: str, recorded: Layout | None, declared: Layout | None) -> None:
    """LayoutError naming the item and both layouts when loading with `declared` would give the
    checkpoint's logical tensor another meaning: Fused parts (or Fused vs not) differ, or both are
    Padded with other logical sizes or dims. None (whole, at TP size 1) on either side agrees with
    any layout: the local tensor is then the logical one (the shape check catches padding); how a
    tensor is distributed (Split, Replicated, Padded.split) may change."""
    if recorded is None or declared is None:
        return
    (r_fused, r_pad), (d_fused, d_pad) = _meaning(recorded), _meaning(declared)
    if r_fused != d_fused or (r_pad is not None and d_pad is not None and r_pad != d_pad):
        raise LayoutError(
            f"item {name}: declared {declared} but the checkpoint was saved as "
            f"{recorded}: that changes what its logical tensor means"
        )


# --- against a client ----------------------------------------------------------------------------


def save_tp(
    client: Client,
    job: str,
    step: int,
    tensors: Mapping[str, Any],
    layouts: Layouts,
    tp_rank: int,
    tp_size: int,
    *,
    rank: int = 0,
    world_size: int = 1,
    objects: Mapping[str, Any] | None = None,
    per_rank_objects: Iterable[str] = (),
    blocking: bool = True,
) -> SaveHandle:
    """Saves this rank's local tensors by their layouts: one Client.save of the logical regions
    they hold (several per fused item). Rank 0 also saves the `ckptd.layouts` record (with the
    declarations of `layouts`, which every rank must share). With data parallelism, let one
    replica save the tensors and the others pass tensors={} (identical regions would be stored
    once anyway)."""
    if objects is not None and LAYOUTS_ITEM in objects:
        raise LayoutError(f"the object name {LAYOUTS_ITEM} is save_tp's own")
    resolved: dict[str, Layout | None] = {}
    shards: dict[str, list[Shard]] = {}
    for name, local in tensors.items():
        try:
            resolved[name] = layouts.resolve(name, tp_size)
            planned = save_shards(name, local, resolved[name], tp_rank, tp_size)
        except LayoutError as e:
            raise LayoutError(f"job {job} step {step} rank {rank}: {e}") from None
        if planned:
            shards[name] = [Shard(view, glob, box) for view, glob, box in planned]
    objs = dict(objects or {})
    if rank == 0:
        objs[LAYOUTS_ITEM] = Raw(record_json(layouts, resolved, tp_size))
    return client.save(
        job,
        step,
        shards,
        objs,
        rank=rank,
        world_size=world_size,
        per_rank_objects=per_rank_objects,
        blocking=blocking,
    )


def load_tp(
    client: Client,
    job: str,
    step: int | str,
    tensors: Mapping[str, Any],
    layouts: Layouts,
    tp_rank: int,
    tp_size: int,
    *,
    rank: int = 0,
    require_record: bool = True,
) -> int:
    """Loads every item of `tensors` into this TP rank's local tensor at TP size tp_size (any TP
    size, whatever the checkpoint was saved with) and zero-fills padding; returns the bytes the
    daemon read from storage. Checks, before reading anything: the declared layout of each item
    against the one recorded in `ckptd.layouts` (check_compatible), and the local tensor's shape
    and dtype against the checkpoint's. require_record=False loads a checkpoint saved without
    save_tp, trusting the declared layouts (its logical tensors must be the unsharded ones).
    step "latest" is resolved by this call alone: ranks loading at once should agree on an
    integer step first (one resolves it and broadcasts it), or a commit between their calls
    gives them different steps."""
    resolved = client._resolve_step(job, step)
    where = f"job {job} step {resolved}"
    catalog = {row["name"]: row for row in client.inspect(job, resolved)}
    record: Record | None = None
    if LAYOUTS_ITEM in catalog:
        raw = client.load_object(job, resolved, LAYOUTS_ITEM, raw=True)
        record = parse_record(raw, f"{where}: object {LAYOUTS_ITEM}")
    elif require_record:
        raise LayoutError(
            f"{where}: no {LAYOUTS_ITEM} object (not saved by save_tp); pass "
            "require_record=False to trust the declared layouts"
        )
    targets: list[tuple[str, Any, Any]] = []
    padding: list[Any] = []
    for name, local in tensors.items():
        try:
            declared = layouts.resolve(name, tp_size)
            row = catalog.get(name)
            if row is None or row["kind"] != "tensor":
                raise LayoutError(f"no tensor item {name}")
            if _arrays.dtype_name(local) != row["dtype"]:
                raise LayoutError(
                    f"item {name}: the checkpoint holds {row['dtype']}, the local tensor is "
                    f"{_arrays.dtype_name(local)}"
                )
            if record is not None:
                known, recorded = record.layout_of(name)
                if not known:
                    raise LayoutError(f"{LAYOUTS_ITEM} does not describe item {name}")
                check_compatible(name, recorded, declared)
            planned = load_targets(
                name, local, declared, tp_rank, tp_size, global_shape=row["shape"]
            )
            padding += padding_views(name, local, declared, tp_rank, tp_size)
        except LayoutError as e:
            raise LayoutError(f"{where}: {e}") from None
        targets += [(name, box, view) for box, view in planned]
    read = client.load_into(job, resolved, targets, rank=rank)
    for view in padding:
        view[...] = 0
    return read
