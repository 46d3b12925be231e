"""The ZeRO optimizer of a DeepSpeed engine (stages 1, 2 and 3) seen as this rank's pieces of
each trainable parameter: where its fp32 master and optimizer state live in the rank's partition,
which elements of the flattened parameter they are, and how the model's weights are refreshed from
them. ckptd.deepspeed saves and loads through it; DeepSpeed's internals it relies on (the
`_hp_mapping` fragments of ZeRO-1/2, ZeRO-3's `ds_tensor` partitions and `get_local_fp32_param`)
are read here only."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import deepspeed.comm as dist
import torch

from .layouts import Fused, Layouts, Padded, Replicated, Split


@dataclass
class Piece:
    """One rank's piece of one trainable parameter: elements [start, start + count) of its
    flattened global tensor, the fp32 master's view and each optimizer state's view."""

    name: str
    shape: list[int]  # the logical shape (without vocabulary padding)
    group: int
    start: int
    count: int  # of logical elements; the piece's elements past them are padding
    fp32: torch.Tensor  # the piece's views, padding included
    optim: dict[str, torch.Tensor]
    lp: torch.Tensor | None  # the low-precision partition to refresh after a load (stage 3)

    def logical(self, view: torch.Tensor) -> torch.Tensor:
        return view.narrow(0, 0, self.count)

    def padding(self, view: torch.Tensor) -> torch.Tensor:
        return view.narrow(0, self.count, view.numel() - self.count)


class Zero:
    """The ZeRO optimizer of an engine, seen as this rank's pieces of every trainable parameter."""

    def __init__(self, engine: Any, layouts: Layouts | None = None) -> None:
        self.engine = engine
        self.layouts = layouts
        self.zo = engine.optimizer
        self.stage = int(engine.zero_optimization_stage())
        if self.stage not in (1, 2, 3):
            raise ValueError(
                f"ckptd.deepspeed: the engine runs ZeRO stage {self.stage}; stages 1, 2 and 3 "
                "are supported"
            )
        mp = engine.mpu.get_model_parallel_world_size() if engine.mpu is not None else 1
        if mp != 1:
            raise ValueError(
                f"ckptd.deepspeed: the engine's model-parallel size is {mp}; only data "
                "parallelism is supported (see ckptd.layouts for tensor-parallel layouts)"
            )
        self.names = {id(p): n for n, p in engine.module.named_parameters()}
        if self.stage == 3:
            self.group = self.zo.dp_process_group
            self.fp32_groups = list(self.zo.fp32_partitioned_groups_flat)
            self.lp_groups = self.zo.fp16_groups
        else:
            self.group = self.zo.real_dp_process_group[0]
            if any(g is not self.group for g in self.zo.real_dp_process_group):
                raise ValueError("ckptd.deepspeed: param groups with their own DP groups (MoE)")
            self.fp32_groups = list(self.zo.single_partition_of_fp32_groups)
            self.lp_groups = self.zo.bit16_groups
        self.dp_rank = dist.get_rank(group=self.group)
        self.dp_size = dist.get_world_size(group=self.group)

    def name(self, p: torch.nn.Parameter) -> str:
        name = self.names.get(id(p))
        if name is None:
            raise ValueError("ckptd.deepspeed: an optimizer parameter is not in module")
        return name

    def state(self, group: int) -> dict[str, Any]:
        return self.zo.optimizer.state[self.fp32_groups[group]]

    def optim_keys(self) -> list[str]:
        """The optimizer state tensors sized like the fp32 partition (Adam: exp_avg, exp_avg_sq)."""
        keys: set[str] = set()
        for i, flat in enumerate(self.fp32_groups):
            for k, v in self.state(i).items():
                if torch.is_tensor(v) and v.shape == flat.shape and flat.numel() > 0:
                    keys.add(k)
        return sorted(keys)

    def params(self) -> Iterator[tuple[int, torch.nn.Parameter]]:
        for i, group in enumerate(self.lp_groups):
            for p in group:
                yield i, p

    def physical_shape(self, p: torch.nn.Parameter) -> list[int]:
        return [int(d) for d in (p.ds_shape if self.stage == 3 else p.shape)]

    def shape(self, p: torch.nn.Parameter) -> list[int]:
        """The parameter's logical shape: without the rows a Padded layout declares padding."""
        shape = self.physical_shape(p)
        layout = self.layouts.find(self.name(p)) if self.layouts is not None else None
        if layout is None or isinstance(layout, (Replicated, Split, Fused)):
            return shape  # at model-parallel size 1 these are the whole tensor
        if not isinstance(layout, Padded) or layout.dim != 0:
            raise ValueError(
                f"ckptd.deepspeed: parameter {self.name(p)}: {layout} is not supported here (a "
                "ZeRO partition is a flat range: only padding along dim 0 is)"
            )
        if not shape or layout.logical > shape[0]:
            raise ValueError(
                f"ckptd.deepspeed: parameter {self.name(p)} of shape {shape} is declared "
                f"padded past {layout.logical} rows"
            )
        return [layout.logical, *shape[1:]]

    def _clip(self, p: torch.nn.Parameter, start: int, count: int) -> int:
        """Of elements [start, start + count) of the flattened parameter, how many are logical
        (padding rows are the tail of the flattened tensor)."""
        logical = 1
        for d in self.shape(p):
            logical *= d
        return max(0, min(start + count, logical) - start)

    def pieces(self, keys: list[str]) -> list[Piece]:
        out = []
        for i, p in self.params():
            piece = self._piece3(i, p, keys) if self.stage == 3 else self._piece12(i, p, keys)
            if piece is not None:
                out.append(piece)
        return out

    def _piece12(self, group: int, p: torch.nn.Parameter, keys: list[str]) -> Piece | None:
        hp = p._hp_mapping  # DeepSpeed's link of this parameter to the rank's fp32 partition
        if hp is None:
            return None
        start, count = int(hp.lp_fragment_address.start), int(hp.lp_fragment_address.numel)
        at = int(hp.hp_fragment_address.start)
        state = self.state(group)
        optim = {k: state[k].narrow(0, at, count) for k in keys if k in state}
        fp32 = self.fp32_groups[group].narrow(0, at, count)
        valid = self._clip(p, start, count)
        return Piece(self.name(p), self.shape(p), group, start, valid, fp32, optim, None)

    def _piece3(self, group: int, p: torch.nn.Parameter, keys: list[str]) -> Piece | None:
        size = int(p.ds_tensor.ds_numel)  # each rank's partition, padded at the last rank
        start = self.dp_rank * size
        count = max(0, min(size, int(p.ds_numel) - start))
        if count == 0:
            return None
        fp32 = self.zo.get_local_fp32_param(p)
        optim = {k: self.zo.get_local_fp32_param(p, optim_state_key=k) for k in keys}
        views = [fp32, *optim.values()]
        if any(v.device.type != "cpu" for v in views):
            raise ValueError("ckptd.deepspeed: ZeRO-3 partitions on a device need a host copy")
        return Piece(
            self.name(p),
            self.shape(p),
            group,
            start,
            self._clip(p, start, count),
            fp32.narrow(0, 0, count),
            {k: v.narrow(0, 0, count) for k, v in optim.items()},
            p.ds_tensor.data.narrow(0, 0, count),
        )

    def ensure_state(self, keys: list[str]) -> None:
        """Creates the optimizer's state tensors a fresh engine does not have yet (torch's Adam
        makes them at its first step): zeros sized like each fp32 partition, and the step, so
        that a load has somewhere to write them and the next step continues from them."""
        for i, flat in enumerate(self.fp32_groups):
            if flat.numel() == 0:
                continue
            state = self.state(i)
            for k in keys:
                if k not in state:
                    state[k] = torch.zeros_like(flat)
            if keys and "step" not in state:
                state["step"] = torch.tensor(0.0)

    def param_group(self, i: int) -> int:
        """The optimizer's param group of fp32 group i (ZeRO-3 splits a group into sub-groups)."""
        return int(self.zo.sub_group_to_group_id[i]) if self.stage == 3 else i

    def steps(self) -> list[float | None]:
        """The optimizer's step of each param group (that of its first sub-group with one)."""
        out: list[float | None] = [None] * len(self.zo.optimizer.param_groups)
        for i in range(len(self.fp32_groups)):
            step = self.state(i).get("step")
            g = self.param_group(i)
            if step is not None and out[g] is None:
                out[g] = float(step)
        return out

    def set_step(self, group: int, value: float) -> None:
        """Sets the step of every fp32 group (sub-group) of param group `group`."""
        for i in range(len(self.fp32_groups)):
            if self.param_group(i) != group:
                continue
            state = self.state(i)
            if torch.is_tensor(state.get("step")):
                state["step"].fill_(value)
            elif "step" in state:
                state["step"] = type(state["step"])(value)

    def refresh_lp(self, pieces: list[Piece]) -> None:
        """The model's (low-precision) weights from the loaded fp32 masters, on every rank."""
        if self.stage == 3:
            for piece in pieces:
                if piece.lp is not None:
                    piece.lp.copy_(piece.fp32)
        else:
            self.zo.update_lp_params()  # copies this rank's partition, then all-gathers
            # DeepSpeed links each parameter to its optimizer state at the first step; linked
            # now, its safe_get_*_optimizer_state work right after a load, as after its own
            link = getattr(self.zo, "_lazy_init_hp_params_optimizer_state", None)
            if link is not None:
                link()
