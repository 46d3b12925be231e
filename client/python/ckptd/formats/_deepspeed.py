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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import Raw
from ._common import Piece, RefusedInputError, UsageError, check_name, dtype_of
from ._deepspeed_files import (
    CLIENT_STATE_ITEM,
    DP_SIZE_MAX,
    ENGINE_KEYS,
    FORMAT,
    META_ITEM,
    MODEL_FILE,
    OPTIM_FILE,
    ZERO3_MODEL_FILE,
    _apply_alignment,
    _check_coverage,
    _check_files,
    _check_states,
    _Files,
    _flat_tensor,
    _json,
    _load,
    _LossScaler,
    _need,
    _Param,
    _params,
    _partitions,
    _Rank,
    _read_rank,
    _shape,
    _tag_dir,
)
from ._importer import FlatPiece, PartedSource


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
    padded: Mapping[str, int] = field(default_factory=dict)  # parameter -> its logical rows

    def shape(self, p: _Param) -> tuple[int, ...]:
        """The parameter's shape as stored: without the rows past a declared padding."""
        rows = self.padded.get(p.name)
        return p.shape if rows is None else (rows, *p.shape[1:])

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
            shape = self.shape(p)
            count = max(0, min(start + count, math.prod(shape)) - start)  # padding rows: the tail
            if count == 0:
                continue
            for key in [None, *self.keys]:
                item = f"fp32/{p.name}" if key is None else f"optim/{key}/{p.name}"
                fetch = self.fetcher(rank, g, key)
                out.append(_flat(item, "float32", shape, start, count, local, r.file, fetch))
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
            {"name": p.name, "shape": list(plan.shape(p)), "group": owner[p.group]}
            for p in plan.params
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


def _check_padded(padded: Mapping[str, int], params: list[_Param], file: Path) -> None:
    """Each declared padding names a trainable parameter and at most its rows (a UsageError)."""
    shapes = {p.name: p.shape for p in params}
    for name, rows in padded.items():
        if name not in shapes:
            raise UsageError(f"--padded {name}: {file} has no trainable parameter of that name")
        if not shapes[name] or not 1 <= rows <= shapes[name][0]:
            raise UsageError(
                f"--padded {name}={rows}: its shape is {list(shapes[name])}; the logical rows "
                "must be between 1 and its first dimension"
            )


def open_deepspeed(
    path: str | os.PathLike[str], padded: Mapping[str, int] | None = None
) -> PartedSource:
    """A DeepSpeed ZeRO checkpoint's pieces, one part per DP rank, and its objects. padded: the
    parameters padded along dim 0 (a vocabulary) and their logical rows: stored without the
    padding rows, as ckptd.deepspeed saves a parameter declared Padded(0, rows)."""
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
    _check_padded(padded or {}, params, model_file)
    plan = _Plan(directory, stage, dp, params, ranks, strides, keys, files, dict(padded or {}))
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
