"""ckptd.torch.LocalPlanner: a DCP SavePlanner that plans each rank's part alone (no gather).

DCP's DefaultSavePlanner plans in two steps: every rank lists what it holds (create_local_plan),
rank 0 gathers the N lists, keeps one copy of each replicated item (dedup_save_plans) and builds
the Metadata of every chunk, then scatters the plans back; at 10,000 ranks that is 15-19 s of CPU
on rank 0 and a Metadata of every chunk unpickled on every rank (bench/RESULTS.md). ckptd needs
none of it: each rank's Save names its rank and the world size, and the daemon commits once every
rank has reported, checking coverage, overlaps, dtypes and shapes itself (docs/DESIGN.md
"Commit"). So this planner decides on each rank, with no communication, which of its items it
writes:

- A DTensor's local shard is written by one of the ranks holding the same box: the ranks that
  differ only on the mesh dims the DTensor is Replicate on (all Shard-like dims keep their own
  slice). Each box of the global tensor is written by exactly one rank of the mesh. Which one
  is balanced (below): the replicas of a data-parallel group share the writes of the model they
  all hold, instead of the first replica writing it all. A rank outside the DTensor's mesh
  writes nothing of it (as DCP). Partial placements are refused: the local value is not the
  tensor's.
- A ShardedTensor's local shards are written by the rank holding them (disjoint by definition).
- Every other tensor (a plain tensor: a DDP model's parameters, replicated on every rank) is
  written by one rank of the save's process group, balanced too; with `writer_rank` given, by
  that rank. Non-tensor values are written by `writer_rank` (default 0).
- `owns(fqn)`, when given, decides for every value that is neither a DTensor nor a
  ShardedTensor instead: the ranks on which it is true write it.
- Balanced: every rank that holds the same set of replicated values (SPMD: every rank of the
  group; for a DTensor, every replica of its boxes) computes the same assignment from what it
  holds, with no communication: the values sorted by size (largest first, then by name), each
  given to the rank with the fewest bytes so far (the longest-processing-time rule). So no rank
  writes more than its share by more than one value (tests/python/test_dcp_planless.py).
  This assumes the
  value is the same on every rank and present on every rank, as in SPMD training (DCP's dedup
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

import heapq
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import STATE_DICT_TYPE, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan
from torch.distributed.tensor import DTensor

__all__ = ["LocalPlanner", "balanced_owners", "writes_dtensor_shard"]


def _mesh_key(mesh: Any, cache: dict[int, tuple] | None) -> tuple:
    """The mesh's shape and ranks: equal on every rank for the same mesh (cached by object)."""
    if cache is not None and id(mesh) in cache:
        return cache[id(mesh)]
    key = (tuple(mesh.mesh.shape), tuple(mesh.mesh.flatten().tolist()))
    if cache is not None:
        cache[id(mesh)] = key
    return key


def _replica_index(
    fqn: str, tensor: DTensor, cache: dict[int, tuple] | None = None
) -> tuple[int, int, tuple] | None:
    """(this rank's index among the replicas of its box of `tensor`, their count, the key of
    the replica group: the mesh, its Replicate dims and this rank's coordinates on the others);
    None outside the mesh. ValueError for a Partial placement."""
    mesh = tensor.device_mesh
    coordinate = mesh.get_coordinate()
    if coordinate is None:
        return None
    index, count, fixed = 0, 1, []
    for dim, placement in enumerate(tensor.placements):
        if placement.is_partial():
            raise ValueError(
                f"ckptd LocalPlanner: {fqn} is a DTensor with a Partial placement on mesh dim "
                f"{dim}: its local value is not a shard of the tensor (reduce it first)"
            )
        if placement.is_replicate():
            index = index * mesh.size(dim) + coordinate[dim]
            count *= mesh.size(dim)
        else:
            fixed.append((dim, coordinate[dim]))
    return index, count, (_mesh_key(mesh, cache), tuple(fixed))


def writes_dtensor_shard(fqn: str, tensor: DTensor) -> bool:
    """Whether this rank writes its local shard of `tensor` when the first replica writes each
    box (LocalPlanner(writer_rank=...) and the unbalanced rule): it is in the mesh and its
    coordinate is 0 on every Replicate mesh dim. ValueError for a Partial placement."""
    where = _replica_index(fqn, tensor)
    return where is not None and where[0] == 0


def balanced_owners(sizes: dict[str, int], count: int) -> dict[str, int]:
    """Which of `count` ranks writes each value of `sizes` (fqn -> bytes): largest first (ties
    by fqn), each to the rank with the fewest bytes so far (ties: the lowest rank). The same
    input gives the same answer on every rank; no rank gets more than total / count bytes plus
    one value's."""
    loads = [(0, r) for r in range(count)]  # a heap of (bytes so far, rank)
    owners: dict[str, int] = {}
    for fqn, nbytes in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        load, rank = heapq.heappop(loads)
        owners[fqn] = rank
        heapq.heappush(loads, (load + nbytes, rank))
    return owners


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class LocalPlanner(DefaultSavePlanner):
    """DCP SavePlanner planning each rank's part alone (module docstring).

    process_group: the group whose ranks save together (default: the default group); rank and
    world_size override it (both or neither; for a save without torch.distributed). writer_rank:
    the rank that writes values that are not DTensors or ShardedTensors (None, the default:
    tensors are balanced across the ranks and other values go to rank 0; an int: that rank
    writes them all, and each DTensor box is written by its first replica). owns(fqn) -> bool,
    when given, decides that instead, on each rank (flattened fqns, e.g. "optim.state.0.step").
    flatten_state_dict / enable_plan_caching: as DefaultSavePlanner's."""

    def __init__(
        self,
        *,
        process_group: Any = None,
        rank: int | None = None,
        world_size: int | None = None,
        writer_rank: int | None = None,
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
        self.balanced = writer_rank is None
        self.writer_rank = 0 if writer_rank is None else int(writer_rank)
        self.owns = owns
        self.rank = 0
        self.world_size = 1
        self._owners: dict[str, int] = {}  # balanced: the writer of each plain tensor
        self._replica_writers: dict[str, bool] = {}  # balanced: DTensors this rank writes

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
        if self.balanced:
            self._balance()

    def _balance(self) -> None:
        """The balanced writers (module docstring): plain tensors over the group's ranks, and
        each DTensor's box over its replicas (grouped by the replicas' mesh and coordinates, so
        that every member of a group assigns the same list)."""
        plain: dict[str, int] = {}
        groups: dict[tuple, tuple[int, int, dict[str, int]]] = {}
        meshes: dict[int, tuple] = {}
        for fqn, obj in self.state_dict.items():
            if isinstance(obj, DTensor):
                where = _replica_index(fqn, obj, meshes)
                if where is None:
                    continue
                index, count, key = where
                groups.setdefault(key, (index, count, {}))[2][fqn] = _nbytes(obj.to_local())
            elif isinstance(obj, torch.Tensor) and not isinstance(obj, ShardedTensor):
                if self.owns is None:
                    plain[fqn] = _nbytes(obj)
        self._owners = balanced_owners(plain, self.world_size)
        self._replica_writers = {}
        for index, count, sizes in groups.values():
            owners = balanced_owners(sizes, count)
            self._replica_writers.update({fqn: owners[fqn] == index for fqn in sizes})

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
            if self.balanced:
                if fqn not in self._replica_writers:  # outside its mesh (or not set up)
                    return writes_dtensor_shard(fqn, obj)
                return self._replica_writers[fqn]
            return writes_dtensor_shard(fqn, obj)
        if isinstance(obj, ShardedTensor):
            return True  # its local shards are this rank's alone
        if self.owns is not None:
            return bool(self.owns(fqn))
        if self.balanced and fqn in self._owners:
            return self.rank == self._owners[fqn]
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
