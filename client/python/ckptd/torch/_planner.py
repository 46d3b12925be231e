"""ckptd.torch.LocalPlanner: a DCP SavePlanner that plans each rank's part alone (no gather).

DCP's DefaultSavePlanner plans in two steps: every rank lists what it holds (create_local_plan),
rank 0 gathers the N lists, keeps one copy of each replicated item (dedup_save_plans) and builds
the Metadata of every chunk, then scatters the plans back; at 10,000 ranks that is 15-19 s of CPU
on rank 0 and a Metadata of every chunk unpickled on every rank (bench/RESULTS.md). ckptd needs
none of it: each rank's Save names its rank and the world size, and the daemon commits once every
rank has reported, checking coverage, overlaps, dtypes and shapes itself (docs/DESIGN.md
"Commit"). So this planner decides on each rank, with no communication, which of its items it
writes:

- A DTensor's local shard is written by this rank when its coordinate is 0 on every mesh dim
  the DTensor is Replicate on (all Shard-like dims keep their own slice): each box of the global
  tensor is written by exactly one rank of the mesh. A rank outside the DTensor's mesh writes
  nothing of it (as DCP). Partial placements are refused: the local value is not the tensor's.
- A ShardedTensor's local shards are written by the rank holding them (disjoint by definition).
- Every other value (a plain tensor, a non-tensor object) is written by the ranks on which
  `owns(fqn)` is true, when given, else by rank `writer_rank` (default 0) of the save's process
  group. This assumes the
  value is the same on every rank and present on that rank, as in SPMD training (DCP's dedup
  assumes the same equality: it keeps one copy of an fqn whichever rank holds it). A value only
  some ranks hold (a pipeline stage's plain parameters, TorchTitan's per-DP-rank dataloader
  state) needs `owns`, or DCP's own planner. Where `owns` lets several ranks write a value, the
  daemon stores it once: a tensor's copies must match (the checkpoint is aborted otherwise), of
  an object's it keeps one.

The rank and world size are read from the process group (local calls, no communication) or
given. The plan and the Metadata DCP builds from it describe this rank's own items only: DCP's
create_global_plan over one plan checks bounds and overlaps of this rank's chunks and nothing
else; the daemon checks the whole at commit. StorageWriter.write_data sees this planner and
saves the plan as rank `rank` of `world_size` of one checkpoint.

Use with dcp.save(..., planner=LocalPlanner(), no_dist=True) (no_dist keeps DCP from gathering
and broadcasting), or through ckptd.torch.save, which does that.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.tensor import DTensor

__all__ = ["LocalPlanner", "writes_dtensor_shard"]


def writes_dtensor_shard(fqn: str, tensor: DTensor) -> bool:
    """Whether this rank writes its local shard of `tensor`: it is in the mesh and its
    coordinate is 0 on every Replicate mesh dim. ValueError for a Partial placement."""
    coordinate = tensor.device_mesh.get_coordinate()
    if coordinate is None:
        return False
    for dim, placement in enumerate(tensor.placements):
        if placement.is_partial():
            raise ValueError(
                f"ckptd LocalPlanner: {fqn} is a DTensor with a Partial placement on mesh dim "
                f"{dim}: its local value is not a shard of the tensor (reduce it first)"
            )
        if placement.is_replicate() and coordinate[dim] != 0:
            return False
    return True


class LocalPlanner(DefaultSavePlanner):
    """DCP SavePlanner planning each rank's part alone (module docstring).

    process_group: the group whose ranks save together (default: the default group); rank and
    world_size override it (both or neither; for a save without torch.distributed). writer_rank:
    the rank that writes values that are not DTensors or ShardedTensors. owns(fqn) -> bool,
    when given, decides that instead, on each rank (flattened fqns, e.g. "optim.state.0.step").
    flatten_state_dict / enable_plan_caching: as DefaultSavePlanner's."""

    def __init__(
        self,
        *,
        process_group: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        writer_rank: int = 0,
        owns: Callable[[str], bool] | None = None,
        flatten_state_dict: bool = True,
        enable_plan_caching: bool = False,
    ) -> None:
        super().__init__(
            flatten_state_dict=flatten_state_dict, enable_plan_caching=enable_plan_caching
        )
        if (rank is None) != (world_size is None):
            raise ValueError("ckptd LocalPlanner: give both rank and world_size, or neither")
        self.process_group = process_group
        self._given = (rank, world_size)
        self.writer_rank = int(writer_rank)
        self.owns = owns
        self.rank = 0
        self.world_size = 1

    def set_up_planner(
        self,
        state_dict: STATE_DICT_TYPE,
        storage_meta: StorageMeta | None = None,
        is_coordinator: bool = False,
    ) -> None:
        super().set_up_planner(state_dict, storage_meta, is_coordinator)
        rank, world = self._given
        if rank is None or world is None:
            if dist.is_available() and dist.is_initialized():
                rank = dist.get_rank(self.process_group)
                world = dist.get_world_size(self.process_group)
            else:
                rank, world = 0, 1
        if rank < 0 or not 0 <= rank < world:
            raise ValueError(
                f"ckptd LocalPlanner: rank {rank} is not in the save's world of {world}: call "
                "it on the ranks of its process group only"
            )
        if not 0 <= self.writer_rank < world:
            raise ValueError(
                f"ckptd LocalPlanner: writer_rank {self.writer_rank} is not below the world "
                f"size {world}"
            )
        self.rank, self.world_size = int(rank), int(world)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable for a process-based async_save: a process group travels as the rank and
        world size it gives here (owns, when given, must be picklable itself)."""
        state = self.__dict__.copy()
        group = state.get("process_group")
        if group is not None:
            if state["_given"] == (None, None) and dist.is_available() and dist.is_initialized():
                state["_given"] = (dist.get_rank(group), dist.get_world_size(group))
            state["process_group"] = None
        return state

    def _writes(self, fqn: str, obj: Any) -> bool:
        if isinstance(obj, DTensor):
            return writes_dtensor_shard(fqn, obj)
        if isinstance(obj, ShardedTensor):
            return True  # its local shards are this rank's alone
        if self.owns is not None:
            return bool(self.owns(fqn))
        return self.rank == self.writer_rank

    def create_local_plan(self) -> SavePlan:
        """DefaultSavePlanner's local plan (flattening mappings, plan caching) over the items
        this rank writes."""
        whole = self.state_dict
        self.state_dict = {fqn: obj for fqn, obj in whole.items() if self._writes(fqn, obj)}
        try:
            return super().create_local_plan()
        finally:
            self.state_dict = whole  # resolve_data looks items up here
