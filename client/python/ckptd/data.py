"""The data loader's position, saved with a checkpoint and resharded when the data-parallel size
changes: after a resume at another DP size no sample is seen twice and none is skipped.

    import ckptd.data
    sampler = ckptd.data.ReshardableSampler(len(dataset), shuffle=True, seed=0)
    loader = StatefulDataLoader(dataset, batch_size=8, sampler=sampler)    # or a DataLoader
    ...
    state = {"model": ..., **ckptd.data.state_dict(loader)}     # every DP rank, collectively
    dcp.save(state, storage_writer=ckptd.torch.StorageWriter("runs/a/step-100"))
    ...                                                           # resume, at any DP size:
    ckptd.data.load_state_dict(loader, "runs/a/step-100")        # before iterating the loader

The model: every epoch has one global order of the dataset's n indices (a permutation seeded by
(seed, epoch), or 0..n-1), and the DP ranks take that order round-robin: rank r of W takes the
r-th, (r+W)-th, ... index of what is left of the epoch. A rank's state is where its epoch began
(the positions of the global order consumed before: a prefix and a few positions past it) and how
many samples this rank has consumed since. At load, the positions consumed by every old rank are
the new origin, and the new ranks share what is left round-robin again, so the union of what the
old and new ranks see is each index of the epoch exactly once.

Counted where the samples are consumed, not where they are fetched: a torchdata
StatefulDataLoader counts the batches it has yielded (its workers' prefetching does not count); a
plain torch DataLoader is counted by the sampler, which is exact only without workers (it refuses
workers). At the same DP size the StatefulDataLoader's own state is restored as it saved it (its
workers and dataset state included); at another DP size only the sampler position carries over
(a map-style dataset's loader has nothing else to carry).

Saving costs no gather: each rank saves its own piece (an object item `dataloader.rank<r>`), and
two all-reduces (MIN and MAX of the counts: O(log N)) tell every piece whether the ranks consumed
the same count; a load then reads one piece, or every old piece when the counts differed (a rank
ahead by part of a batch at the end of an epoch).

torch is needed by this module; torchdata only by callers using its StatefulDataLoader.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

import ckptd

ITEM_PREFIX = "dataloader.rank"
FORMAT = 1

__all__ = [
    "ITEM_PREFIX",
    "ReshardableSampler",
    "item_name",
    "load_state_dict",
    "state_dict",
]


def item_name(rank: int) -> str:
    """The checkpoint item holding DP rank `rank`'s piece."""
    return f"{ITEM_PREFIX}{int(rank)}"


def _group_rank_world(process_group: Any) -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(process_group), dist.get_world_size(process_group)
    return 0, 1


class ReshardableSampler(torch.utils.data.Sampler[int]):
    """DistributedSampler's role, with a position that reshards: this rank's share of what is left
    of the epoch's global order. rank/world_size: the data-parallel rank and size (default: the
    default process group's). drop_last=False: ranks may get one sample more than others (no
    padding: padding would show a sample twice); drop_last=True: the epoch's tail that does not
    divide by the DP size is dropped."""

    def __init__(
        self,
        n: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if n < 0:
            raise ValueError(f"ReshardableSampler: n={n} is negative")
        r, w = _group_rank_world(None)
        self.n = int(n)
        self.rank = r if rank is None else int(rank)
        self.world_size = w if world_size is None else int(world_size)
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"ReshardableSampler: rank {self.rank} not in [0, {self.world_size})")
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0
        self.prefix = 0  # positions [0, prefix) of the epoch's order were consumed before
        self.skip: list[int] = []  # and these positions past the prefix
        self.yielded = 0  # indices this sampler's current iterator has handed out

    def set_epoch(self, epoch: int) -> None:
        """A new epoch starts from its beginning (as DistributedSampler.set_epoch); the epoch a
        resume restored is kept when it is set again."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.prefix, self.skip = 0, []

    def order(self) -> list[int]:
        """The epoch's global order of the dataset's indices."""
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def remaining(self) -> list[int]:
        """Positions of the epoch's order not consumed, in order (the stream the ranks share)."""
        skip = set(self.skip)
        left = [p for p in range(self.prefix, self.n) if p not in skip]
        if self.drop_last:
            left = left[: len(left) - len(left) % self.world_size]
        return left

    def positions(self) -> list[int]:
        """This rank's positions, in the order it takes them."""
        return self.remaining()[self.rank :: self.world_size]

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        self.yielded = 0
        for p in self.positions():
            self.yielded += 1
            yield order[p]

    def __len__(self) -> int:
        return len(self.positions())

    def _origin(self) -> dict[str, Any]:
        return {
            "n": self.n,
            "shuffle": self.shuffle,
            "seed": self.seed,
            "drop_last": self.drop_last,
            "epoch": self.epoch,
            "prefix": self.prefix,
            "skip": list(self.skip),
            "world_size": self.world_size,
        }

    def _restart(self, consumed: set[int]) -> None:
        """Starts this epoch after the positions `consumed` (of the epoch's global order)."""
        prefix = 0
        while prefix in consumed:
            prefix += 1
        self.prefix = prefix
        self.skip = sorted(p for p in consumed if p > prefix)


def _find_sampler(loader: Any) -> ReshardableSampler:
    sampler = getattr(loader, "sampler", None)
    if isinstance(loader, ReshardableSampler):
        return loader
    if not isinstance(sampler, ReshardableSampler):
        raise TypeError(
            "ckptd.data: the loader's sampler must be a ckptd.data.ReshardableSampler (pass "
            f"sampler=ReshardableSampler(len(dataset), ...) to the loader), not {type(sampler)}"
        )
    return sampler


def _is_stateful_loader(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def _consumed(loader: Any, sampler: ReshardableSampler) -> tuple[int, Any]:
    """(samples this rank consumed since its origin, the loader's own state or None)."""
    if loader is sampler:
        return sampler.yielded, None
    if _is_stateful_loader(loader):  # torchdata's StatefulDataLoader
        state = loader.state_dict()
        if "_num_yielded" in state:
            batches = int(state["_num_yielded"])
        else:  # with workers: the last snapshot and the batches yielded since
            batches = int(state["_snapshot"]["_snapshot_step"]) + int(
                state.get("_steps_since_snapshot", 0)
            )
        batch_size = loader.batch_size or 1
        return min(batches * batch_size, len(sampler)), state
    if getattr(loader, "num_workers", 0):
        raise ValueError(
            "ckptd.data: a torch DataLoader with workers fetches ahead of what the loop consumed; "
            "use torchdata's StatefulDataLoader (it counts the batches it yielded) or no workers"
        )
    return sampler.yielded, None


def state_dict(loader: Any, *, process_group: Any = None) -> dict[str, bytes]:
    """This DP rank's piece, {item_name(rank): bytes}, to add to the state dict it saves (DCP,
    ckptd.torch.save's callers, the plain client's objects=). Collective over the DP group
    (process_group, default: the default group), as the save itself is. `loader`: a
    StatefulDataLoader or DataLoader whose sampler is a ReshardableSampler, or the sampler."""
    sampler = _find_sampler(loader)
    consumed, loader_state = _consumed(loader, sampler)
    lo = hi = consumed
    if dist.is_available() and dist.is_initialized():
        t = torch.tensor([consumed, -consumed], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=process_group)
        lo, hi = int(t[0]), -int(t[1])
    piece = {
        "format": FORMAT,
        "origin": sampler._origin(),
        "rank": sampler.rank,
        "consumed": consumed,
        "consumed_min": lo,
        "consumed_max": hi,
        "loader": loader_state,
    }
    return {item_name(sampler.rank): pickle.dumps(piece, protocol=pickle.HIGHEST_PROTOCOL)}


def _decode(raw: bytes) -> dict[str, Any]:
    """A piece as DCP stored it (torch.save of the bytes) or as the plain client did (the bytes,
    pickled as its objects are)."""
    if raw[:2] == b"PK":  # torch.save's zip container
        raw = torch.load(io.BytesIO(raw), weights_only=False)
    piece = pickle.loads(raw)
    if isinstance(piece, bytes):
        piece = pickle.loads(piece)
    if not isinstance(piece, dict) or piece.get("format") != FORMAT:
        raise ValueError(f"ckptd.data: not a data-loader piece of format {FORMAT}")
    return piece


def _job_step(checkpoint: Any, step: int | str | None) -> tuple[str, int | str]:
    if step is not None:
        return str(checkpoint), step
    from .torch import _ids  # a DCP checkpoint id: "<job path>/step-<N>"

    cid = _ids.parse(checkpoint)
    if cid.step is None:
        raise ValueError(f"ckptd.data: checkpoint id {checkpoint!r} names no step")
    return cid.job, cid.step


def load_state_dict(
    loader: Any,
    checkpoint: Any,
    step: int | str | None = None,
    *,
    client: ckptd.Client | None = None,
) -> dict[str, Any]:
    """Positions `loader` (as state_dict() took it: its sampler a ReshardableSampler) where the
    checkpoint's data-parallel ranks left off, at this DP size, before the loader is iterated.
    checkpoint: a DCP checkpoint id ("runs/a/step-100") of ckptd.torch, or a ckptd job with
    `step` (an int or "latest"). Raises ckptd.NotFoundError when the checkpoint is missing or
    holds no data-loader state, ckptd.DataLossError when it is corrupt: never a silent start from
    the beginning. Returns {"resharded": bool, "old_world_size": int, "skipped": count}."""
    sampler = _find_sampler(loader)
    client = client or ckptd.default_client()
    job, step = _job_step(checkpoint, step)
    step = client._resolve_step(job, step)
    names = {row["name"] for row in client.inspect(job, step)}
    if item_name(0) not in names:
        raise ckptd.NotFoundError(
            f"ckptd.data: checkpoint {job} step {step} holds no {item_name(0)}"
        )
    own = item_name(sampler.rank)
    first = _decode(client.load_object(job, step, own if own in names else item_name(0), raw=True))
    origin = first["origin"]
    old_world = int(origin["world_size"])
    for key in ("n", "shuffle", "seed", "drop_last"):
        if origin[key] != getattr(sampler, key):
            raise ValueError(
                f"ckptd.data: the checkpoint's sampler had {key}={origin[key]!r}, this one "
                f"{getattr(sampler, key)!r}: the global order would differ"
            )
    if first["consumed_min"] == first["consumed_max"]:
        counts = [int(first["consumed"])] * old_world
        pieces = {int(first["rank"]): first}
    else:  # the ranks consumed different counts: every old rank's piece
        pieces = {
            r: _decode(client.load_object(job, step, item_name(r), raw=True))
            for r in range(old_world)
        }
        counts = [int(pieces[r]["consumed"]) for r in range(old_world)]
    same = old_world == sampler.world_size and sampler.rank in pieces
    sampler.epoch = int(origin["epoch"])
    sampler.prefix, sampler.skip = int(origin["prefix"]), list(origin["skip"])
    loader_state = pieces[sampler.rank]["loader"] if same else None
    if same and loader_state is not None and loader is not sampler:
        # the same DP size: torchdata restores its own state (workers, dataset) from the origin
        loader.load_state_dict(loader_state)
        return {"resharded": False, "old_world_size": old_world, "skipped": counts[sampler.rank]}
    old = ReshardableSampler(
        sampler.n,
        rank=0,
        world_size=old_world,
        shuffle=sampler.shuffle,
        seed=sampler.seed,
        drop_last=sampler.drop_last,
    )
    old.epoch, old.prefix, old.skip = sampler.epoch, sampler.prefix, list(sampler.skip)
    left = old.remaining()
    consumed = set(range(old.prefix)) | set(old.skip)
    for r, count in enumerate(counts):
        consumed.update(left[r::old_world][:count])
    sampler._restart(consumed)
    return {
        "resharded": old_world != sampler.world_size,
        "old_world_size": old_world,
        "skipped": len(consumed),
    }
