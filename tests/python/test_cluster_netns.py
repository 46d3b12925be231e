"""A cluster that looks like one (issue 35 §6; docs/PEERS.md "Committing at the peer tier"): four
daemons, each in a network namespace of its own with its own address on a bridge, the peer
channel over mutual TLS with certificates made by openssl, SeaweedFS as the store
(netns_cluster.py builds it all, as root). 4 nodes x 2 gloo ranks save with ckptd.torch every
step under tier_policy=local+peer; node 2 is lost (its daemon killed -9, its state dir deleted)
and a replacement daemon (same node id, empty state dir) starts in its namespace; the job
resumes from the newest step at world size 8 in the same layout and at world size 4 in another
mesh: bit-exact, the lost node's shards read from peers, no blob on the store and not one byte
read from it (the replacement reads only the store's control files: parts, decision, manifest)."""

from __future__ import annotations

import datetime
import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

import netns_cluster
import pytest

from conftest import daemon_binary, free_port, run_rank

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402

import ckptd  # noqa: E402
import ckptd.torch as ct  # noqa: E402

NODES = 4
RANKS_PER_NODE = 2
WORLD = NODES * RANKS_PER_NODE
STEPS = 3
LOST = 2  # the node lost after the last step (its ranks were 4 and 5)
ID = "cluster/model"  # checkpoint ids ID/step-N: the daemon's job "cluster.model"
JOB = "cluster.model"
JOB_TIMEOUT_S = 180  # one job of ranks (a save of 3 steps, a resume), ASan daemons included


# --- the state every process computes alike ----------------------------------------------------
def values(step: int) -> dict[str, torch.Tensor]:
    """The training state at `step`: other values at every step, three dtypes."""
    g = torch.Generator().manual_seed(1000 + step)
    return {
        "w": torch.randn(48, 20, generator=g),
        "b": torch.randn(40, generator=g).to(torch.bfloat16),
        "e": torch.randint(-(2**40), 2**40, (16, 8), generator=g, dtype=torch.int64),
    }


def save_layout(world: int, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """World 8: w and b in row blocks over a 1-D mesh; e in blocks over a 4 x 2 mesh."""
    mesh = init_device_mesh("cpu", (world,))
    grid = init_device_mesh("cpu", (world // 2, 2))
    return {
        "w": distribute_tensor(state["w"], mesh, [Shard(0)]),
        "b": distribute_tensor(state["b"], mesh, [Shard(0)]),
        "e": distribute_tensor(state["e"], grid, [Shard(0), Shard(1)]),
    }


def other_layout(world: int, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """World 4 on a 2 x 2 mesh: w in column halves, then row halves; b replicated; e in column
    blocks — no rank's box matches one saved."""
    grid = init_device_mesh("cpu", (2, world // 2))
    return {
        "w": distribute_tensor(state["w"], grid, [Shard(1), Shard(0)]),
        "b": distribute_tensor(state["b"], grid, [Replicate(), Replicate()]),
        "e": distribute_tensor(state["e"], grid, [Replicate(), Shard(1)]),
    }


def zeros_like(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: torch.zeros_like(v) for k, v in state.items()}


def assert_equal(got: dict[str, Any], want: dict[str, torch.Tensor], what: str) -> None:
    for k, v in want.items():
        g = got[k]
        full = g.full_tensor() if isinstance(g, DTensor) else g
        assert full.dtype == v.dtype and torch.equal(full, v), (what, k)


# --- rank bodies ---------------------------------------------------------------------------------
def init(rank: int, world: int, port: int) -> None:
    """gloo on the root namespace's loopback. The rendezvous is passed in, not read from the
    environment: a forkserver's children inherit the server's environment, not the test's."""
    os.environ.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=JOB_TIMEOUT_S),
    )


def train(rank: int, port: int, sockets: list[str]) -> None:
    """Rank `rank` of 8, through its node's daemon (ranks 2i and 2i+1 on node i): a save every
    step at the peer tier."""
    init(rank, WORLD, port)
    try:
        sock = sockets[rank // RANKS_PER_NODE]
        for step in range(1, STEPS + 1):
            state = {**save_layout(WORLD, values(step)), "step": step}
            writer = ct.StorageWriter(
                f"{ID}/step-{step}",
                socket=sock,
                tier_policy="local+peer",
                local_world_size=RANKS_PER_NODE,
                commit_timeout_ms=120_000,
            )
            dcp.save(state, storage_writer=writer)  # returns once committed
    finally:
        dist.destroy_process_group()


def resume(
    rank: int, port: int, world: int, sockets: list[str], same_layout: bool, lost_rank: int
) -> None:
    """Rank `rank` of `world` resuming through sockets[rank * len(sockets) // world]: the newest
    step that survives a node's loss, loaded into the save layout (same_layout) or another, must
    be the last step's values, bit for bit."""
    init(rank, world, port)
    try:
        sock = sockets[rank * len(sockets) // world]
        client = ckptd.connect(sock)
        step = client.latest(JOB, durable="peer")
        assert step == STEPS, (rank, step)
        want = values(step)
        layout = save_layout if same_layout else other_layout
        if rank == lost_rank:
            # The load answer itself, on the replacement (which holds nothing of the
            # checkpoint): the first rows of w, saved by rank 0 on node 0, all from peers.
            buf = torch.zeros(2, 20)
            counts = client.load_into_counted(JOB, step, [("w", ckptd.Box((0, 0), (2, 20)), buf)])
            assert torch.equal(buf, want["w"][:2]), rank
            assert counts["bytes_read_remote"] == 0, counts
            assert counts["bytes_read_peer"] == counts["bytes_read"] > 0, counts
        got = {**layout(world, zeros_like(want)), "step": -1}
        dcp.load(got, storage_reader=ct.StorageReader(f"{ID}/step-{step}", socket=sock))
        assert got["step"] == step, got["step"]
        assert_equal(got, want, f"world {world} rank {rank}")
    finally:
        dist.destroy_process_group()


def spawn(fn: Any, world: int, *args: Any) -> None:
    """`world` ranks running fn(rank, port, *args), forked by a forkserver that imported torch
    and this module once: 8 fresh interpreters importing torch take ~30 s of this 2-core
    machine's time per job; forking them from one takes a second. A job still running after
    JOB_TIMEOUT_S is killed and fails the test (a hang in a daemon must not hang CI)."""
    ctx = mp.start_processes(
        run_rank,
        args=(fn, free_port(), *args),
        nprocs=world,
        join=False,
        start_method="forkserver",
    )
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not ctx.join(timeout=1):  # raises when a rank failed (and ends the others)
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            raise TimeoutError(f"{fn.__name__}: {world} ranks still running at {JOB_TIMEOUT_S} s")


# --- the test ------------------------------------------------------------------------------------
@pytest.fixture()
def cluster() -> Iterator[netns_cluster.Cluster]:
    why = netns_cluster.unavailable()
    if why is not None:
        pytest.skip(why)
    multiprocessing.set_forkserver_preload(
        ["torch", "torch.distributed.checkpoint", "torch.distributed.tensor", __name__]
    )
    with netns_cluster.Cluster(NODES, daemon_binary()) as c:
        yield c


def load_bytes(c: netns_cluster.Cluster) -> dict[str, dict[str, float]]:
    """Per node: the bytes its daemon's loads of the job took per tier (local, peer, remote,
    ram), from its metrics."""
    out = {}
    for n in c.nodes:
        text = n.metrics()
        out[n.node_id] = {
            t: netns_cluster.metric_sum(text, "ckptd_load_bytes_total", ckpt_job=JOB, tier=t)
            for t in ("local", "peer", "remote", "ram")
        }
    return out


def peer_bytes(c: netns_cluster.Cluster, what: str, peer: str) -> dict[str, float]:
    """Per node: ckptd_peer_bytes_total{peer=<peer>, what=<what>} of its daemon."""
    return {
        n.node_id: netns_cluster.metric_sum(
            n.metrics(), "ckptd_peer_bytes_total", peer=peer, what=what
        )
        for n in c.nodes
    }


def assert_none_from_the_store(c: netns_cluster.Cluster, read: dict[str, dict[str, float]]) -> None:
    """Not one byte any daemon loaded came from the store, which holds no blob to read."""
    assert all(r["remote"] == 0 for r in read.values()), read
    blobs = [k for k in c.store_keys() if k.endswith(".blob")]
    assert not blobs, blobs


def test_four_nodes_lose_one_and_resume_from_peers_at_two_world_sizes(
    cluster: netns_cluster.Cluster,
) -> None:
    c = cluster
    c.start_daemons(range(NODES))
    sockets = [n.socket for n in c.nodes]
    try:
        spawn(train, WORLD, sockets)
    except Exception as e:
        raise AssertionError(f"the save job failed: {e}\n{c.logs()}") from e

    # Committed at the peer tier on every node, and no blob on the store.
    for n in c.nodes:
        # Each client closed when done: a daemon's stop waits (up to 5 s) for open sessions.
        with ckptd.connect(n.socket) as client:
            for step in range(1, STEPS + 1):
                info = client.status(JOB, step)
                tiers = info["tiers"]
                assert info["state"] == "COMMITTED" and info["world_size"] == WORLD, info
                assert tiers["local_part"] and tiers["peer_nodes"], (n.node_id, info)
                assert not tiers["remote"] and tiers["blobs_without_peer_copy"] == 0, info
    keys = c.store_keys()
    assert not [k for k in keys if k.endswith(".blob")], keys
    assert any(k.startswith(f"ckpt/{JOB}/") for k in keys), keys

    # Node 2 is lost for good; its replacement starts empty in its namespace, at its address.
    c.lose_node(LOST)
    c.start_daemon(LOST)
    with ckptd.connect(c.nodes[LOST].socket) as replacement:
        assert replacement.latest(JOB, durable="peer") == STEPS
        info = replacement.status(JOB, STEPS)
    assert info["state"] == "COMMITTED" and not info["tiers"]["local_part"], info

    # Resume at world size 8, the same layout: ranks 4 and 5 on the replacement.
    try:
        spawn(resume, WORLD, WORLD, sockets, True, LOST * RANKS_PER_NODE)
    except Exception as e:
        raise AssertionError(f"the resume at world size 8 failed: {e}\n{c.logs()}") from e
    read = load_bytes(c)
    lost = c.nodes[LOST].node_id
    # The replacement read everything from other daemons (it has nothing of its own), each byte
    # served by a surviving node: the lost node's blobs by the node holding their copy, the
    # blobs whose copies the lost node held by their own nodes.
    assert read[lost]["local"] == read[lost]["ram"] == 0 and read[lost]["peer"] > 0, read
    served = peer_bytes(c, "served", lost)
    assert sum(served.values()) == read[lost]["peer"], (served, read)
    holders = [k for k, v in peer_bytes(c, "stored", lost).items() if v > 0]
    assert len(holders) == 1 and served[holders[0]] > 0, (holders, served)
    assert_none_from_the_store(c, read)

    # Resume at world size 4 on another mesh, one rank per node (rank 2 on the replacement).
    try:
        spawn(resume, NODES, NODES, sockets, False, -1)
    except Exception as e:
        raise AssertionError(f"the resume at world size 4 failed: {e}\n{c.logs()}") from e
    again = load_bytes(c)
    assert again[lost]["peer"] > read[lost]["peer"] and again[lost]["local"] == 0, (read, again)
    assert_none_from_the_store(c, again)
