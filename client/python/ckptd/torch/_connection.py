"""The connection of ckptd.torch's writers and readers: one client per (socket, tier policy,
local world size) per process, shared by every writer and reader (its session, arena mapping and
registered GPU allocations survive from one checkpoint to the next), and the process group's
rank and world size."""

from __future__ import annotations

import os
import threading
from typing import Any

import torch.distributed as dist

import ckptd

_clients: dict[tuple[str, str, int], ckptd.Client] = {}
_clients_lock = threading.Lock()
_clients_pid = os.getpid()
_inherited: list[ckptd.Client] = []  # a forked child's copies: never used, never destroyed


def connect(
    socket: str | None, tier_policy: str = "default", local_world_size: int = 0
) -> ckptd.Client:
    """The process-wide client for these settings, connected on first use: every writer and
    reader of a process shares its session, arena mapping and registered GPU allocations, so a
    new writer per checkpoint connects nothing (the default socket: ckptd.default_client())."""
    global _clients_pid
    if not socket and tier_policy == "default" and not local_world_size:
        return ckptd.default_client()
    key = (socket or "", tier_policy, local_world_size)
    with _clients_lock:
        if _clients_pid != os.getpid():  # a forked child: the parent's connections are not ours
            _inherited.extend(_clients.values())
            _clients.clear()
            _clients_pid = os.getpid()
        client = _clients.get(key)
        if client is None:
            client = ckptd.connect(
                socket, tier_policy=tier_policy, local_world_size=local_world_size
            )
            _clients[key] = client
        return client


def spanning_local_world_size(explicit: int | None) -> int:
    """The local_world_size to save with: `explicit`, else torchrun's LOCAL_WORLD_SIZE; 0 (one
    daemon for every rank) unless it is below the world size of the default process group."""
    local = explicit if explicit is not None else int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    if local < 0:
        raise ValueError(f"local_world_size {local} is negative")
    _, world = rank_world()
    return local if 0 < local < world else 0


class LazyClient:
    """Connects on first use; pickles without the connection (for process-based async_save)."""

    socket: str | None
    _client: ckptd.Client | None

    @property
    def client(self) -> ckptd.Client:
        if self._client is None:
            self._client = connect(
                self.socket,
                getattr(self, "tier_policy", "default"),
                spanning_local_world_size(getattr(self, "local_world_size", 0)),
            )
        return self._client

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        return state


def rank_world(rank: int | None = None) -> tuple[int, int]:
    """(rank, world size) in the default process group, (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return (dist.get_rank() if rank is None else rank), dist.get_world_size()
    return (0 if rank is None else rank), 1
