"""Reading a DeepSpeed ZeRO checkpoint's files for the importer (_deepspeed.py): the safe
torch.load with DeepSpeed's four allowlisted globals bound to data-only stand-ins, the files a tag
directory must hold, and each DP rank's partitions checked against the parameter shapes. Every
failure is a RefusedInputError naming the file; see _deepspeed.py's docstring for the layout."""

from __future__ import annotations

import math
import pickle
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._common import RefusedInputError, dtype_of
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
