"""ckptd.torch across nodes (docs/OPERATIONS.md "Checkpoints that span nodes"): 4 gloo ranks save
through two
daemons standing for two nodes (ranks 0-1 through one, 2-3 through the other; local_world_size=2)
that share a directory as their remote tier; the checkpoint commits once, on both; 2 ranks on a
third daemon with an empty state dir (a fresh node) load it with another placement, reading only
the bytes they need. The DCP backend changes by configuration only."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from conftest import Daemon, free_port, start_daemon

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from test_dcp_dist import (  # noqa: E402
    BIG_COLS,
    BIG_ROWS,
    assert_state_equal,
    big,
    cols_or_rows,
    init,
    rows,
    sharded_model,
    spawn,
)
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import Shard, distribute_tensor  # noqa: E402

import ckptd  # noqa: E402
import ckptd.torch as ct  # noqa: E402


def save_over_two_nodes(rank: int, sockets: list[str]) -> None:
    init(rank, 4)
    try:
        sock = sockets[rank // 2]  # ranks 0-1: node a, ranks 2-3: node b
        mesh = init_device_mesh("cpu", (4,))
        model, opt = sharded_model(0, mesh, rows, step=True)
        msd, osd = get_state_dict(model, opt)
        writer = ct.StorageWriter(
            "multi/model/step-1", socket=sock, tier_policy="local+remote", local_world_size=2
        )
        dcp.save({"model": msd, "optim": osd}, storage_writer=writer)
        # torchrun's LOCAL_WORLD_SIZE is the default.
        os.environ["LOCAL_WORLD_SIZE"] = "2"
        sd = {"big": distribute_tensor(big(), mesh, [Shard(0)])}
        dcp.save(
            sd,
            storage_writer=ct.StorageWriter(
                "multi/big/step-1", socket=sock, tier_policy="local+remote"
            ),
        )
    finally:
        dist.destroy_process_group()


def load_on_a_fresh_node(rank: int, sock: str) -> None:
    init(rank, 2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        model, opt = sharded_model(5, mesh, cols_or_rows, step=False)
        msd, osd = get_state_dict(model, opt)
        state: dict[str, Any] = {"model": msd, "optim": osd}
        dcp.load(state, storage_reader=ct.StorageReader("multi/model/step-1", socket=sock))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert_state_equal(model, opt)
        sd = {"big": distribute_tensor(torch.zeros(BIG_ROWS, BIG_COLS), mesh, [Shard(0)])}
        reader = ct.StorageReader("multi/big/step-1", socket=sock)
        dcp.load(sd, storage_reader=reader)
        assert torch.equal(sd["big"].full_tensor(), big())
        needed = (BIG_ROWS // 2) * BIG_COLS * 4
        moved = reader.bytes_read + reader.bytes_from_ram  # from storage or the RAM tier
        assert 0 < moved <= 1.05 * needed, (reader.bytes_read, reader.bytes_from_ram, needed)
    finally:
        dist.destroy_process_group()


def node(store: str, name: str) -> Daemon:
    return start_daemon(
        flags=[
            f"--remote_dir={store}",
            "--tier_policy=local+remote",
            f"--node_id={name}",
            "--cluster_poll_ms=50",
        ]
    )


def test_four_ranks_over_two_nodes_then_two_ranks_on_a_fresh_node(store: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    daemons = [node(store, "node-a"), node(store, "node-b")]
    try:
        spawn(save_over_two_nodes, 4, [d.socket for d in daemons])
        for d in daemons:
            c = ckptd.connect(d.socket)
            for job in ("multi.model", "multi.big"):
                info = c.status(job, 1)
                assert info["state"] == "COMMITTED" and info["world_size"] == 4, info
                assert info["tiers"]["remote"] and not info["tiers"]["local"], info
    finally:
        for d in daemons:
            d.stop()
            shutil.rmtree(d.state_dir, ignore_errors=True)

    fresh = start_daemon(flags=[f"--remote_dir={store}", "--node_id=node-c"])
    try:
        os.environ["MASTER_PORT"] = str(free_port())
        spawn(load_on_a_fresh_node, 2, fresh.socket)
    finally:
        fresh.stop()
        shutil.rmtree(fresh.state_dir, ignore_errors=True)
