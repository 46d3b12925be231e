"""A DeepSpeed ZeRO checkpoint (`engine.save_checkpoint(dir)`, stage 1, 2 or 3) as an import
source, read directly from DeepSpeed's files (no zero_to_fp32 or ds_to_universal step) and
written in ckptd's DeepSpeed convention (ckptd/deepspeed.py's docstring), so it loads through
ckptd.deepspeed at any DP size and ZeRO stage, or whole through client.load:

- `fp32/<param>`: the fp32 master of each trainable parameter (float32, its full shape), as the
  Flat pieces the DP ranks' partitions hold; `optim/<key>/<param>` likewise for each optimizer
  state tensor of the partition's size (Adam's exp_avg, exp_avg_sq). A zero-length piece is not
  saved.
- `frozen/<param>`, `buffer/<name>`: whole, from the model-states file, in their own dtypes. At
  ZeRO-3 a frozen parameter is itself partitioned (each rank's model-states file holds its
  fragment): each DP rank's fragment is saved as a Flat piece with that rank, not gathered.
- the object `deepspeed` (JSON): stage, DP size, parameters in the optimizer's order, groups'
  hyperparameters and steps, the engine's counters, the LR scheduler's state, the loss scaler's
  numbers; and `client_state` (pickled) holding the keys `save_checkpoint(client_state=...)` added
  to the model-states file, when there are any.

The layout (DeepSpeed 0.19; its zero_to_fp32.py and ds_to_universal.py read the same):
`mp_rank_00_model_states.pt` (ZeRO-3: `zero_pp_rank_R_mp_rank_00_model_states.pt` for each rank)
holds `param_shapes` (per group, in flat order), `buffer_names`, `frozen_param_shapes` and
`frozen_param_fragments` (stages 2 and 3; at stage 1 the frozen parameters are the module's
other entries), `module` and the engine's counters; `zero_pp_rank_R_mp_rank_00_optim_states.pt`
holds rank R's flat fp32 partition per group and the torch optimizer's state of it. Stages 1/2:
a group's flat buffer is its parameters back to back (each followed by its
`param_alignment_paddings` entry), rank R holding [R*P, (R+1)*P), saved without the padding at
its end (`group_paddings`: so P is a rank's length plus its padding). Stage 3: each rank holds
ceil(numel / dp) elements of every parameter of a sub-group, starting at R*ceil(numel / dp), back
to back; the last ranks' pieces are short or empty.

Streaming: the files are opened with torch.load(mmap=True), first one by one to check them and
plan (nothing is read but each pickle), then once more part by part: part R is DP rank R's
pieces (rank 0's also the frozen parameters and buffers), planned into batches of its own
(_importer.PartedSource), and only rank R's files are mapped while its part is read.

Safety: torch.load(weights_only=True) with an explicit allowlist of the four DeepSpeed globals
these files pickle, each bound to a stand-in here that keeps the pickled attributes as data:
LossScaler and DynamicLossScaler, fragment_address (ZeRO-1/2's param_slice_mappings) and
ZeroStageEnum (its value). DeepSpeed is not imported, and nothing of it runs. Anything else in a
pickle is refused by torch's restricted unpickler; input that does not add up (a missing or extra
rank file, partitions that do not cover the parameter shapes, a truncated file) is refused
naming the file. Not supported, and refused: tensor, pipeline or expert parallelism (mp_rank_01,
layer_* files, groups of another partition count), and the bf16 optimizer without ZeRO."""

from __future__ import annotations

import json
import math
import os
import pickle
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import Raw
from ._common import Piece, RefusedInputError, check_name, dtype_of
from ._importer import FlatPiece, PartedSource
from ._torch_save import load_state

FORMAT = 1  # the `deepspeed` object's format (ckptd/deepspeed.py's FORMAT)
META_ITEM = "deepspeed"
CLIENT_STATE_ITEM = "client_state"
MODEL_FILE = "mp_rank_00_model_states.pt"  # ZeRO-1/2
ZERO3_MODEL_FILE = "zero_pp_rank_{}_mp_rank_00_model_states.pt"
OPTIM_FILE = "zero_pp_rank_{}_mp_rank_00_optim_states.pt"
DP_SIZE_MAX = 65536  # ckptd's world size limit: one part per DP rank at least
TAG_BYTES_MAX = 255
# The model-states keys DeepSpeed writes itself; any other key is the client_state it was given.
ENGINE_KEYS = frozenset(
    {
        "module",
        "buffer_names",
        "optimizer",
        "param_shapes",
        "frozen_param_shapes",
        "shared_params",
        "frozen_param_fragments",
        "lr_scheduler",
        "data_sampler",
        "random_ltd",
        "skipped_steps",
        "global_steps",
        "global_samples",
        "dp_world_size",
        "mp_world_size",
        "checkpoint_parallel_dimensions",
        "ds_config",
        "ds_version",
        "universal_checkpoint_info",
        "ds_autoep_layers",
        "autoep_layers",
    }
)


# --- the allowlisted DeepSpeed globals ----------------------------------------------------------
class _Pickled:
    """A DeepSpeed object of the files, read as data: the attributes its pickle sets (BUILD's
    state) in `fields`. torch's unpickler makes it with __new__ and calls __setstate__."""

    fields: dict[str, Any]

    def __setstate__(self, state: Any) -> None:
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            raise pickle.UnpicklingError(f"{type(self).__name__}: the state is not attributes")
        self.fields = dict(state)


class _LossScaler(_Pickled):
    pass


class _FragmentAddress(_Pickled):
    pass


def _zero_stage(value: Any) -> int:
    """ZeroStageEnum(value), pickled as a call of the enum class: its value."""
    if type(value) is not int or not 0 <= value <= 3:
        raise pickle.UnpicklingError(f"ZeroStageEnum({value!r}) is not a ZeRO stage")
    return value


SAFE_GLOBALS: list[tuple[Callable[..., Any], str]] = [
    (_LossScaler, "deepspeed.runtime.fp16.loss_scaler.LossScaler"),
    (_LossScaler, "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler"),
    (_FragmentAddress, "deepspeed.utils.tensor_fragment.fragment_address"),
    (_zero_stage, "deepspeed.runtime.zero.config.ZeroStageEnum"),
]


def _load(file: Path) -> dict[str, Any]:
    """A DeepSpeed file read by torch.load(weights_only=True, mmap=True) with SAFE_GLOBALS;
    RefusedInputError naming the file for anything that is not a safe, readable torch.save zip
    of a dict. A missing or unreadable file is an I/O error (OSError)."""
    state, mapped = load_state(file, SAFE_GLOBALS)
    if not mapped:
        raise RefusedInputError(str(file), "not a torch.save zip (DeepSpeed writes zips)")
    if not isinstance(state, dict):
        raise RefusedInputError(str(file), f"holds a {type(state).__name__}, not a dict")
    return state


class _Files:
    """The loaded files of one DP rank at a time: asking for another rank's drops the others, so
    the import maps one rank's files (and, at rank 0, the model states) at once."""

    def __init__(self) -> None:
        self._rank = -1
        self._loaded: dict[Path, dict[str, Any]] = {}

    def get(self, rank: int, file: Path) -> dict[str, Any]:
        if rank != self._rank:
            self._loaded.clear()
            self._rank = rank
        if file not in self._loaded:
            self._loaded[file] = _load(file)
        return self._loaded[file]

    def close(self) -> None:
        self._loaded.clear()


# --- checked access to the files' contents ------------------------------------------------------
def _need(d: Mapping[str, Any], key: str, kind: type | tuple[type, ...], file: Path) -> Any:
    value = d.get(key)
    if not isinstance(value, kind):
        raise RefusedInputError(
            str(file), f"{key!r} is a {type(value).__name__}, not what DeepSpeed writes"
        )
    return value


def _shape(value: Any, file: Path, name: str) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not all(type(d) is int and d >= 0 for d in value):
        raise RefusedInputError(str(file), f"parameter {name!r}: shape {value!r} is not a shape")
    return tuple(value)


def _flat_tensor(value: Any, file: Path, what: str, dtype: str | None = "float32") -> Any:
    """A dense 1-D CPU tensor (of `dtype` when given)."""
    import torch

    if not isinstance(value, torch.Tensor) or value.layout != torch.strided or value.dim() != 1:
        raise RefusedInputError(str(file), f"{what} is not a 1-D tensor")
    if value.device.type != "cpu" or value.is_quantized:
        raise RefusedInputError(str(file), f"{what} is not a dense CPU tensor")
    if dtype is not None and dtype_of(value.dtype, str(file), what) != dtype:
        raise RefusedInputError(str(file), f"{what} is {value.dtype}, not {dtype}")
    return value


def _json(value: Any, file: Path, what: str) -> Any:
    """JSON data of a plain value (tuples become lists, 1-element tensors numbers, dtypes their
    names); refused for anything else."""
    import torch

    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, Mapping):
        return {str(k): _json(v, file, f"{what}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v, file, f"{what}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return value.item()
    if isinstance(value, torch.dtype):
        return str(value)
    raise RefusedInputError(str(file), f"{what} is a {type(value).__name__}, not JSON data")


def _partitions(optim: dict[str, Any], stage: int, file: Path) -> tuple[list[Any], list[Any]]:
    """(the flat fp32 partition of each group, the optimizer state of each) of a rank's file:
    ZeRO-1/2's single_partition_of_fp32_groups and base_optimizer_state (torch's state_dict, or
    elastic checkpoints' list of per-group states); ZeRO-3's fp32_flat_groups (its sub-groups)
    and optimizer_state_dict."""
    key, base_key = (
        ("single_partition_of_fp32_groups", "base_optimizer_state")
        if stage < 3
        else ("fp32_flat_groups", "optimizer_state_dict")
    )
    flat = _need(optim, key, list, file)
    for g, t in enumerate(flat):
        _flat_tensor(t, file, f"{key}[{g}]")
    base = optim.get(base_key)
    if isinstance(base, list):
        states = base
    elif isinstance(base, dict) and isinstance(base.get("state"), dict):
        states = [base["state"].get(g, {}) for g in range(len(flat))]
    else:
        raise RefusedInputError(str(file), f"{base_key!r} is not an optimizer state")
    if len(states) != len(flat) or not all(isinstance(s, dict) for s in states):
        raise RefusedInputError(
            str(file), f"{base_key!r} has no state per group of {len(flat)} groups"
        )
    return flat, states


@dataclass
class _Param:
    name: str
    shape: tuple[int, ...]
    group: int  # the flat group (ZeRO-3: sub-group) it lies in
    offset: int  # ZeRO-1/2: its start in the group's flat buffer; ZeRO-3: in each rank's piece
    pad: int | None = None  # ZeRO-1/2: its param_alignment_paddings entry

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass
class _Rank:
    """What the plan needs of a rank's optimizer file."""

    file: Path
    lengths: list[int]  # of its fp32 partition per group
    paddings: list[int]  # ZeRO-1/2's group_paddings (the stripped end of its partition)
    state_lengths: list[dict[str, int]]  # per group: state key -> numel of 1-D state tensors
    steps: list[float | None] = field(default_factory=list)  # per group: the optimizer's step


# --- locating the files -------------------------------------------------------------------------
def _tag_dir(path: Path) -> Path:
    """The checkpoint's tag directory: PATH itself, or the tag its `latest` file names."""
    if not path.is_dir():
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such directory")
        raise RefusedInputError(str(path), "not a directory (DeepSpeed saves a directory)")
    if any(path.glob("*_model_states.pt")) or not (path / "latest").is_file():
        return path
    latest = path / "latest"
    raw = latest.read_bytes()[: TAG_BYTES_MAX + 1]
    tag = raw.decode("utf-8", "replace").strip()
    if not tag or len(raw) > TAG_BYTES_MAX or "/" in tag or "\\" in tag or tag in (".", ".."):
        raise RefusedInputError(str(latest), f"names {tag[:60]!r}, not a tag directory's name")
    if not (path / tag).is_dir():
        raise RefusedInputError(str(latest), f"names tag {tag!r}, which is not a directory")
    return path / tag


def _check_files(directory: Path, stage3: bool, dp: int) -> None:
    """Refuses a missing rank file and any rank file beyond dp (another run's, or tensor,
    pipeline or expert parallelism's)."""
    expected = {OPTIM_FILE.format(r) for r in range(dp)}
    expected |= {ZERO3_MODEL_FILE.format(r) for r in range(dp)} if stage3 else {MODEL_FILE}
    for name in sorted(
        expected, key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]
    ):
        if not (directory / name).is_file():
            raise RefusedInputError(
                str(directory / name), f"missing: the checkpoint was saved by {dp} DP ranks"
            )
    for file in sorted(directory.glob("*_states.pt")):
        if file.name not in expected:
            raise RefusedInputError(
                str(file),
                f"not a file of a {dp}-rank ZeRO checkpoint without tensor, pipeline or expert "
                "parallelism (the only kind this importer reads)",
            )


# --- the plan -----------------------------------------------------------------------------------
def _params(model: dict[str, Any], file: Path, stage: int, dp: int) -> list[_Param]:
    """The trainable parameters of param_shapes, each with its group and flat offset."""
    shapes = _need(model, "param_shapes", list, file)
    out: list[_Param] = []
    for g, group in enumerate(shapes):
        if not isinstance(group, dict):
            raise RefusedInputError(str(file), f"param_shapes[{g}] is not a dict of shapes")
        offset = 0
        for name, shape in group.items():
            p = _Param(str(name), _shape(shape, file, str(name)), g, offset)
            offset += p.numel if stage < 3 else -(-p.numel // dp)
            out.append(p)
    names = [p.name for p in out]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise RefusedInputError(str(file), f"param_shapes names {twice} more than once")
    return out


def _apply_alignment(params: list[_Param], optim: dict[str, Any], file: Path) -> None:
    """ZeRO-1/2: offsets moved by param_alignment_paddings (each after its parameter)."""
    paddings = optim.get("param_alignment_paddings")
    if paddings is None:
        return
    by_group: dict[int, list[_Param]] = {}
    for p in params:
        by_group.setdefault(p.group, []).append(p)
    for g, group in by_group.items():
        pads = paddings[g] if isinstance(paddings, list) and g < len(paddings) else None
        if not isinstance(pads, list) or len(pads) != len(group):
            raise RefusedInputError(
                str(file), f"param_alignment_paddings[{g}] does not match the group's parameters"
            )
        offset = 0
        for p, pad in zip(group, pads, strict=True):
            if type(pad) is not int or pad < 0:
                raise RefusedInputError(str(file), f"param_alignment_paddings[{g}]: {pad!r}")
            p.offset, p.pad = offset, pad
            offset += p.numel + pad


def _read_rank(file: Path, stage: int, dp: int, groups: int) -> tuple[_Rank, dict[str, Any]]:
    optim = _need(_load(file), "optimizer_state_dict", dict, file)
    got = optim.get("zero_stage")
    if got != stage and not (stage < 3 and got in (1, 2)):
        raise RefusedInputError(str(file), f"zero_stage {got!r}, expected {stage}")
    count = optim.get("partition_count")
    counts = count if isinstance(count, list) else [count] * groups
    if any(c != dp for c in counts):
        raise RefusedInputError(
            str(file),
            f"partition_count {count!r}, not the {dp} DP ranks (expert-parallel groups are not "
            "supported)",
        )
    for g, pg in enumerate(optim.get("ds_zero_partition_groups") or []):
        if isinstance(pg, dict) and pg.get("partition_count", dp) != dp:
            raise RefusedInputError(str(file), f"ds_zero_partition_groups[{g}]: {pg!r}")
    flat, states = _partitions(optim, stage, file)
    if len(flat) != groups:
        raise RefusedInputError(
            str(file), f"{len(flat)} flat groups, but param_shapes has {groups}"
        )
    paddings = optim.get("group_paddings") if stage < 3 else None
    if paddings is None:
        paddings = [0] * groups
    if (
        not isinstance(paddings, list)
        or len(paddings) != groups
        or not all(type(p) is int and p >= 0 for p in paddings)
    ):
        raise RefusedInputError(str(file), f"group_paddings {paddings!r}")
    rank = _Rank(
        file,
        [int(t.numel()) for t in flat],
        paddings,
        [{k: int(v.numel()) for k, v in s.items() if _is_vector(v)} for s in states],
        [_step(s.get("step", optim.get("base_optimizer_state_step")), file) for s in states],
    )
    return rank, optim


def _step(value: Any, file: Path) -> float | None:
    """An optimizer step (a number or a 1-element tensor) as a number: kept apart from the file,
    so no tensor of it outlives the rank's turn."""
    step = _json(value, file, "the optimizer's step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int | float)):
        raise RefusedInputError(str(file), f"the optimizer's step {step!r} is not a number")
    return None if step is None else float(step)


def _is_vector(value: Any) -> bool:
    import torch

    return isinstance(value, torch.Tensor) and value.dim() == 1


def _check_coverage(
    params: list[_Param], ranks: list[_Rank], stage: int, dp: int, model_file: Path
) -> list[int]:
    """Refuses partitions that do not add up to the parameters; the stride P of each ZeRO-1/2
    group (ZeRO-3: each rank's length)."""
    groups = len(ranks[0].lengths)
    strides: list[int] = []
    for g in range(groups):
        members = [p for p in params if p.group == g]
        if stage == 3:
            need = sum(-(-p.numel // dp) for p in members)
            for r in ranks:
                if r.lengths[g] != need:
                    raise RefusedInputError(
                        str(r.file),
                        f"group {g}: {r.lengths[g]} fp32 elements, but its parameters' "
                        f"partitions at {dp} ranks take {need}",
                    )
            strides.append(need)
            continue
        stride = ranks[0].lengths[g] + ranks[0].paddings[g]
        held = sum(r.lengths[g] for r in ranks)
        span = sum(p.numel + (p.pad or 0) for p in members)
        end = max((p.offset + p.numel for p in members), default=0)
        for i, r in enumerate(ranks):  # the flat buffer's first `held` elements, in order
            if r.lengths[g] + r.paddings[g] != stride or r.lengths[g] != min(
                stride, max(0, held - i * stride)
            ):
                raise RefusedInputError(
                    str(r.file),
                    f"group {g}: a partition of {r.lengths[g]} elements and {r.paddings[g]} "
                    f"padding, which is not rank {i}'s of {held} elements in partitions of "
                    f"{stride}",
                )
        if not end <= held <= span:
            raise RefusedInputError(
                str(model_file),
                f"group {g}: param_shapes take {end} elements, but the {dp} ranks' partitions "
                f"hold {held}",
            )
        strides.append(stride)
    return strides


def _check_states(ranks: list[_Rank], strides: list[int], stage: int) -> list[str]:
    """The optimizer state keys with one value per element of the partition (rank 0's group 0
    order), present in every group of every rank with a length that fits."""
    first = ranks[0].state_lengths[0] if ranks[0].state_lengths else {}
    keys = [k for k, n in first.items() if n in (ranks[0].lengths[0], strides[0])]
    for r in ranks:
        for g, lengths in enumerate(r.state_lengths):
            fits = (r.lengths[g], strides[g] if stage < 3 else r.lengths[g])
            for k in keys:
                if lengths.get(k) not in fits:
                    raise RefusedInputError(
                        str(r.file),
                        f"group {g}: optimizer state {k!r} has {lengths.get(k)} elements, the "
                        f"partition {r.lengths[g]}",
                    )
    return keys


# --- pieces -------------------------------------------------------------------------------------
def _whole(item: str, t: Any, file: Path, fetch: Callable[[], Any]) -> Piece:
    """A whole tensor of the model states, read again through fetch() when its batch is read."""
    import torch

    if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.device.type != "cpu":
        raise RefusedInputError(str(file), f"{item}: not a dense CPU tensor")
    check_name(item, str(file))
    shape = tuple(int(d) for d in t.shape)
    base = (0,) * len(shape)

    def read(offsets: tuple[int, ...], lengths: tuple[int, ...]) -> Any:
        src = fetch()
        if not shape:
            return src.detach()
        return src.detach()[tuple(slice(o, o + n) for o, n in zip(offsets, lengths, strict=True))]

    return Piece(item, dtype_of(t.dtype, str(file), item), shape, base, shape, str(file), read)


def _flat(
    item: str,
    dtype: str,
    shape: tuple[int, ...],
    start: int,
    count: int,
    local: int,
    file: Path,
    fetch: Callable[[], Any],
) -> FlatPiece:
    """Elements [start, start + count) of item (of `shape`), element `local` of fetch()'s 1-D
    tensor onwards."""
    check_name(item, str(file))

    def read(offsets: tuple[int, ...], lengths: tuple[int, ...]) -> Any:
        lo = local + offsets[0] - start
        return fetch()[lo : lo + lengths[0]]

    numel = (math.prod(shape),)
    return FlatPiece(item, dtype, numel, (start,), (count,), str(file), read, item_shape=shape)


def _range(
    p: _Param, rank: int, stride: int, held: int, stage: int, dp: int
) -> tuple[int, int, int]:
    """(start, count, offset in the rank's partition) of the parameter's piece at `rank`."""
    if stage == 3:
        chunk = -(-p.numel // dp)
        start = rank * chunk
        return start, max(0, min(chunk, p.numel - start)), p.offset
    lo = max(p.offset, rank * stride)
    hi = min(p.offset + p.numel, rank * stride + held)
    return lo - p.offset, max(0, hi - lo), lo - rank * stride


@dataclass
class _Plan:
    directory: Path
    stage: int
    dp: int
    params: list[_Param]
    ranks: list[_Rank]
    strides: list[int]
    keys: list[str]
    files: _Files

    def optim(self, rank: int) -> tuple[list[Any], list[Any]]:
        file = self.ranks[rank].file
        optim = _need(self.files.get(rank, file), "optimizer_state_dict", dict, file)
        return _partitions(optim, self.stage, file)

    def fetcher(self, rank: int, group: int, key: str | None) -> Callable[[], Any]:
        def fetch() -> Any:
            flat, states = self.optim(rank)
            value = flat[group] if key is None else states[group].get(key)
            what = f"group {group}'s " + ("fp32 partition" if key is None else f"state {key!r}")
            return _flat_tensor(value, self.ranks[rank].file, what)

        return fetch

    def rank_pieces(self, rank: int) -> list[Piece]:
        """Rank `rank`'s pieces of fp32/ and optim/ (none of zero length)."""
        out: list[Piece] = []
        r = self.ranks[rank]
        for p in self.params:
            g = p.group
            start, count, local = _range(
                p, rank, self.strides[g], r.lengths[g], self.stage, self.dp
            )
            if count == 0:
                continue
            for key in [None, *self.keys]:
                item = f"fp32/{p.name}" if key is None else f"optim/{key}/{p.name}"
                fetch = self.fetcher(rank, g, key)
                out.append(_flat(item, "float32", p.shape, start, count, local, r.file, fetch))
        return out


def _module_extras(
    model: dict[str, Any], file: Path, files: _Files, params: list[_Param], stage: int
) -> tuple[list[Piece], list[str], list[str], list[str]]:
    """(rank 0's pieces of the buffers and — ZeRO-1/2 — frozen parameters, the buffer names,
    the frozen names, notes)."""
    module = _need(model, "module", dict, file)
    names = _need(model, "buffer_names", list, file)
    pieces: list[Piece] = []
    notes: list[str] = []
    buffers = [n for n in names if isinstance(n, str) and n in module]
    missing = sorted(set(map(str, names)) - set(buffers))
    if missing:
        notes.append(f"buffers named but not in the module's state: {missing}")
    for name in buffers:
        fetch = _getter(files, 0, file, ("module", name))
        pieces.append(_whole(f"buffer/{name}", module[name], file, fetch))
    shapes = model.get("frozen_param_shapes")
    fragments = model.get("frozen_param_fragments")
    shared = model.get("shared_params") or {}
    if shapes is None and stage == 3:
        notes.append("no frozen_param_shapes: frozen parameters not imported")
        return pieces, buffers, [], notes
    if shapes is None:  # ZeRO-1 saves none: the module's entries that are no parameter of ZeRO's
        trainable = {p.name for p in params}
        frozen = [n for n in module if n not in trainable and n not in buffers and n not in shared]
        source = "module"
    else:
        if not isinstance(shapes, dict) or not isinstance(fragments, dict):
            raise RefusedInputError(str(file), "frozen_param_shapes/fragments are not dicts")
        frozen = [str(n) for n in shapes]
        source = "frozen_param_fragments"
    if stage == 3:
        return pieces, buffers, frozen, notes
    for name in frozen:
        t = (module if source == "module" else fragments).get(name)
        piece = _whole(f"frozen/{name}", t, file, _getter(files, 0, file, (source, name)))
        if shapes is not None and piece.shape != _shape(shapes[name], file, name):
            raise RefusedInputError(
                str(file), f"frozen parameter {name!r}: {list(piece.shape)}, not its shape"
            )
        pieces.append(piece)
    if shared:
        notes.append(f"tied parameters stored once, under the name they alias: {dict(shared)}")
    return pieces, buffers, frozen, notes


def _getter(files: _Files, rank: int, file: Path, path: tuple[str, ...]) -> Callable[[], Any]:
    def fetch() -> Any:
        value: Any = files.get(rank, file)
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            raise RefusedInputError(str(file), f"{'.'.join(path)} is gone")
        return value

    return fetch


def _zero3_frozen(plan: _Plan, model0: dict[str, Any], frozen: list[str]) -> list[list[Piece]]:
    """ZeRO-3: each rank's fragment of each frozen parameter, from its model-states file, as
    Flat pieces of that rank."""
    shapes = model0.get("frozen_param_shapes") or {}
    dtypes: dict[str, str] = {}  # every rank's fragment of a parameter in one dtype
    parts: list[list[Piece]] = []
    for rank in range(plan.dp):
        file = plan.directory / ZERO3_MODEL_FILE.format(rank)
        model = model0 if rank == 0 else _load(file)
        fragments = _need(model, "frozen_param_fragments", dict, file) if frozen else {}
        part: list[Piece] = []
        for name in frozen:
            shape = _shape(shapes[name], file, name)
            numel = math.prod(shape)
            chunk = -(-numel // plan.dp)
            start = rank * chunk
            count = max(0, min(chunk, numel - start))
            t = _flat_tensor(fragments.get(name), file, f"frozen fragment {name!r}", None)
            if t.numel() < count:
                raise RefusedInputError(
                    str(file),
                    f"frozen parameter {name!r}: a fragment of {t.numel()} elements, rank "
                    f"{rank}'s holds {count}",
                )
            dtype = dtypes.setdefault(name, dtype_of(t.dtype, str(file), name))
            if dtype_of(t.dtype, str(file), name) != dtype:
                raise RefusedInputError(
                    str(file), f"frozen parameter {name!r}: {t.dtype}, rank 0's is {dtype}"
                )
            if count:
                fetch = _getter(plan.files, rank, file, ("frozen_param_fragments", name))
                part.append(_flat(f"frozen/{name}", dtype, shape, start, count, 0, file, fetch))
        parts.append(part)
        del model
    return parts


# --- the meta object ----------------------------------------------------------------------------
def _meta(
    plan: _Plan,
    model: dict[str, Any],
    optim0: dict[str, Any],
    frozen: list[str],
    buffers: list[str],
    client_state: bool,
) -> dict[str, Any]:
    file0 = plan.ranks[0].file
    base = optim0.get("base_optimizer_state" if plan.stage < 3 else "optimizer_state_dict")
    groups = base.get("param_groups") if isinstance(base, dict) else None
    owner = list(range(len(plan.strides)))  # flat group -> param group
    if isinstance(groups, list) and plan.stage == 3:
        for i, g in enumerate(groups):
            for s in g.get("params", []) if isinstance(g, dict) else []:
                if type(s) is int and 0 <= s < len(owner):
                    owner[s] = i
    hyper = None
    if isinstance(groups, list):
        hyper = [
            {k: _json(v, file0, f"param_groups[{i}].{k}") for k, v in g.items() if k != "params"}
            for i, g in enumerate(groups)
            if isinstance(g, dict)
        ]
    steps: list[float | None] = []
    for i in range(len(hyper) if hyper is not None else len(owner)):
        s = next((j for j, o in enumerate(owner) if o == i), None)  # its first flat group
        steps.append(plan.ranks[0].steps[s] if s is not None else None)
    scaler = optim0.get("loss_scaler")
    mfile = plan.directory / (MODEL_FILE if plan.stage < 3 else ZERO3_MODEL_FILE.format(0))
    scheduler = model.get("lr_scheduler")

    def count(key: str) -> int | None:
        v = model.get(key)
        return v if type(v) is int else None

    return {
        "format": FORMAT,
        "source": "import",
        "zero_stage": plan.stage,
        "dp_world_size": plan.dp,
        "ds_version": str(model.get("ds_version") or optim0.get("ds_version") or "") or None,
        "params": [
            {"name": p.name, "shape": list(p.shape), "group": owner[p.group]} for p in plan.params
        ],
        "frozen": sorted(frozen),
        "buffers": sorted(buffers),
        "optim_keys": plan.keys,
        "param_groups": hyper,
        "optim_steps": steps,
        "global_steps": count("global_steps"),
        "global_samples": count("global_samples"),
        "skipped_steps": count("skipped_steps"),
        "lr_scheduler": None if scheduler is None else _json(scheduler, mfile, "lr_scheduler"),
        "loss_scaler": None
        if not isinstance(scaler, _LossScaler)
        else {k: v for k, v in scaler.fields.items() if isinstance(v, bool | int | float)},
        "client_state": client_state,
    }


# --- the source ---------------------------------------------------------------------------------
def _engine_checks(model: dict[str, Any], file: Path) -> int:
    """The DP size; refused for what this importer does not read."""
    if not isinstance(model.get("param_shapes"), list):
        raise RefusedInputError(
            str(file), "no param_shapes: not a ZeRO checkpoint (stage 0 is not supported)"
        )
    dims = model.get("checkpoint_parallel_dimensions") or {}
    if model.get("mp_world_size", 1) != 1 or any(
        dims.get(k, 1) != 1 for k in ("tp_degree", "pp_degree") if isinstance(dims, dict)
    ):
        raise RefusedInputError(
            str(file), "saved with tensor or pipeline parallelism, which is not supported"
        )
    dp = model.get("dp_world_size")
    if type(dp) is not int or not 1 <= dp <= DP_SIZE_MAX:
        raise RefusedInputError(str(file), f"dp_world_size {dp!r} is not a DP size")
    return dp


def _model_file(directory: Path) -> tuple[Path, bool]:
    """(the rank-0 model-states file, whether it is ZeRO-3's)."""
    bf16 = sorted(directory.glob("bf16_zero_pp_rank_*"))
    if bf16:
        raise RefusedInputError(
            str(bf16[0]), "the bf16 optimizer's file (ZeRO stage 0): not supported"
        )
    if (directory / MODEL_FILE).is_file():
        return directory / MODEL_FILE, False
    if (directory / ZERO3_MODEL_FILE.format(0)).is_file():
        return directory / ZERO3_MODEL_FILE.format(0), True
    raise RefusedInputError(
        str(directory),
        f"holds neither {MODEL_FILE} nor {ZERO3_MODEL_FILE.format(0)}: not a DeepSpeed "
        "checkpoint tag directory (name it, or the directory whose `latest` file names it)",
    )


def open_deepspeed(path: str | os.PathLike[str]) -> PartedSource:
    """A DeepSpeed ZeRO checkpoint's pieces, one part per DP rank, and its objects."""
    directory = _tag_dir(Path(path))
    model_file, stage3 = _model_file(directory)
    model = _load(model_file)
    dp = _engine_checks(model, model_file)
    _check_files(directory, stage3, dp)
    params = _params(model, model_file, 3 if stage3 else 1, dp)
    groups = len(_need(model, "param_shapes", list, model_file))
    first = directory / OPTIM_FILE.format(0)
    stage = _need(
        _need(_load(first), "optimizer_state_dict", dict, first), "zero_stage", int, first
    )
    if (stage == 3) != stage3:
        raise RefusedInputError(str(first), f"zero_stage {stage}, but the model states are not")
    ranks: list[_Rank] = []
    optim0: dict[str, Any] = {}
    for r in range(dp):
        rank, optim = _read_rank(directory / OPTIM_FILE.format(r), stage, dp, groups)
        ranks.append(rank)
        if r == 0:
            if stage < 3:
                _apply_alignment(params, optim, model_file)
            optim0 = optim
        del optim
    strides = _check_coverage(params, ranks, stage, dp, model_file)
    keys = _check_states(ranks, strides, stage)
    files = _Files()
    plan = _Plan(directory, stage, dp, params, ranks, strides, keys, files)
    extras, buffers, frozen, notes = _module_extras(model, model_file, files, params, stage)
    parts = [plan.rank_pieces(r) for r in range(dp)]
    if stage == 3:
        parts = [f + p for f, p in zip(_zero3_frozen(plan, model, frozen), parts, strict=True)]
    parts[0] = extras + parts[0]
    client_state = {str(k): v for k, v in model.items() if k not in ENGINE_KEYS}
    objects: dict[str, Any] = {}
    meta = _meta(plan, model, optim0, frozen, buffers, bool(client_state))
    objects[META_ITEM] = Raw(json.dumps(meta).encode())
    if client_state:
        objects[CLIENT_STATE_ITEM] = client_state
        notes.append(f"client_state (pickled): {sorted(client_state)}")
    notes.insert(
        0,
        f"ZeRO-{stage} at {dp} DP ranks, DeepSpeed {meta['ds_version']}: {len(params)} "
        f"parameters' fp32 masters and optimizer states {keys} as Flat pieces",
    )
    return PartedSource(
        "deepspeed",
        str(directory),
        [p for part in parts for p in part],
        objects,
        notes,
        files.close,
        parts=parts,
    )
