"""ckptd.data: the data loader's position saved with a DCP checkpoint by 4 gloo ranks and resumed
by 3 (and by 4, through torchdata's own state): every sample of the epoch is seen exactly once
across the interrupted run and the resumed one. Also: ranks that consumed different counts, a
missing and a corrupt checkpoint (errors, never a start from the epoch's beginning), the daemon
down (UnavailableError naming the socket, within a bound), and a rank killed mid-save: "latest"
stays on the previous checkpoint, whose position loads."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bounded import within

from conftest import Daemon, flip_blobs, free_port, run_rank, start_daemon

torch = pytest.importorskip("torch")
stateful = pytest.importorskip("torchdata.stateful_dataloader")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import ckptd  # noqa: E402
import ckptd.data as cdata  # noqa: E402
import ckptd.torch as ct  # noqa: E402

N = 60  # samples in the epoch
BATCH = 3
BEFORE = 3  # batches each of the 4 ranks consumes before the checkpoint (36 samples)


def loader(rank: int, world: int, plain: bool = False) -> Any:
    sampler = cdata.ReshardableSampler(N, rank=rank, world_size=world, shuffle=True, seed=5)
    sampler.set_epoch(2)
    cls = torch.utils.data.DataLoader if plain else stateful.StatefulDataLoader
    return cls(list(range(N)), batch_size=BATCH, sampler=sampler)


def save_4(rank: int, sock: str, out: str) -> None:
    """Rank `rank` of 4: consumes BEFORE batches (a StatefulDataLoader) and saves step-1; then a
    plain DataLoader where rank 3 consumes one batch more than the others, saved as step-2."""
    dist.init_process_group("gloo", rank=rank, world_size=4)
    seen: dict[str, list[int]] = {}
    for name, plain, batches in (
        ("step-1", False, BEFORE),
        ("step-2", True, BEFORE + (rank == 3)),
    ):
        dl = loader(rank, 4, plain)
        it = iter(dl)
        seen[name] = [int(i) for _ in range(batches) for i in next(it)]
        state = {"model": {"w": torch.full((4,), float(rank))}, **cdata.state_dict(dl)}
        dcp.save(state, storage_writer=ct.StorageWriter(f"runs/data/{name}", socket=sock))
    Path(out, f"before.{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def resume(rank: int, world: int, sock: str, out: str) -> None:
    """Rank `rank` of `world`: loads each checkpoint's position and reads the rest of the epoch."""
    dist.init_process_group("gloo", rank=rank, world_size=world)
    client = ckptd.connect(sock)
    seen: dict[str, Any] = {}
    for name, plain in (("step-1", False), ("step-2", True)):
        dl = loader(rank, world, plain)
        info = cdata.load_state_dict(dl, f"runs/data/{name}", client=client)
        seen[name] = {"info": info, "samples": [int(i) for b in dl for i in b]}
    Path(out, f"after{world}.{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()


def spawn(fn: Any, world: int, *args: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    mp.start_processes(run_rank, args=(fn, *args), nprocs=world, join=True, start_method="spawn")


@pytest.fixture(scope="module")
def saved(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    out = str(tmp_path_factory.mktemp("data"))
    spawn(save_4, 4, daemon.socket, out)
    yield daemon.socket, out


def _before(out: str, name: str) -> list[int]:
    return [
        i for r in range(4) for i in json.loads(Path(out, f"before.{r}.json").read_text())[name]
    ]


def test_four_ranks_resumed_by_three_see_each_sample_once(saved: tuple[str, str]) -> None:
    sock, out = saved
    spawn(resume, 3, 3, sock, out)
    for name, consumed in (("step-1", 4 * BEFORE * BATCH), ("step-2", (4 * BEFORE + 1) * BATCH)):
        before = _before(out, name)
        assert len(before) == consumed
        after: list[int] = []
        for r in range(3):
            got = json.loads(Path(out, f"after3.{r}.json").read_text())[name]
            assert got["info"]["resharded"] and got["info"]["old_world_size"] == 4
            after += got["samples"]
        counts = Counter(before + after)
        assert sorted(counts) == list(range(N)), f"{name}: skipped {set(range(N)) - set(counts)}"
        assert max(counts.values()) == 1, (
            f"{name}: seen twice {[i for i, c in counts.items() if c > 1]}"
        )
        # the three new ranks share what was left evenly (no rank idles while another works)
        sizes = [
            len(json.loads(Path(out, f"after3.{r}.json").read_text())[name]["samples"])
            for r in range(3)
        ]
        assert max(sizes) - min(sizes) <= 1, sizes


def test_same_size_resume_restores_torchdata_state(saved: tuple[str, str]) -> None:
    """At the old DP size each rank restores its StatefulDataLoader's own state (no process group
    needed to load) and continues where it stopped."""
    sock, out = saved
    client = ckptd.connect(sock)
    after: list[int] = []
    for r in range(4):
        dl = loader(r, 4)
        info = cdata.load_state_dict(dl, "runs/data/step-1", client=client)
        assert not info["resharded"]
        mine = [int(i) for b in dl for i in b]
        before = json.loads(Path(out, f"before.{r}.json").read_text())["step-1"]
        assert set(mine).isdisjoint(before)
        after += mine
    assert sorted(_before(out, "step-1") + after) == list(range(N))


def test_a_missing_checkpoint_is_an_error_not_a_fresh_start(saved: tuple[str, str]) -> None:
    client = ckptd.connect(saved[0])
    dl = loader(0, 3)
    with pytest.raises(ckptd.NotFoundError):
        cdata.load_state_dict(dl, "runs/data/step-9", client=client)
    with pytest.raises(ckptd.NotFoundError, match=r"dataloader\.rank0"):  # saved without one
        client.save("data-none", 1, {"w": torch.zeros(2)}).committed().result(60)
        cdata.load_state_dict(dl, "data-none", 1, client=client)
    with pytest.raises(ValueError, match="seed"):  # another global order would skip and repeat
        other = cdata.ReshardableSampler(N, rank=0, world_size=3, seed=6)
        cdata.load_state_dict(other, "runs/data/step-1", client=client)


def test_corrupt_and_daemon_down() -> None:
    d = start_daemon(flags=["--ram_tier_keep_per_job=0"])
    try:
        client = ckptd.connect(d.socket, connect_timeout_ms=1500)
        sampler = cdata.ReshardableSampler(N, rank=0, world_size=1, seed=5)
        for _ in zip(range(7), sampler, strict=False):
            pass
        client.save("data-corrupt", 1, objects=cdata.state_dict(sampler)).committed().result(60)
        assert cdata.load_state_dict(sampler, "data-corrupt", 1, client=client)["skipped"] == 7
        flip_blobs(list(Path(d.state_dir, "data").glob("data-corrupt/step-*/*.blob")))
        with pytest.raises(ckptd.DataLossError):
            cdata.load_state_dict(sampler, "data-corrupt", 1, client=client)
        d.stop()
        with within(30, "a load with the daemon down"), pytest.raises(ckptd.UnavailableError) as e:
            cdata.load_state_dict(sampler, "data-corrupt", 1, client=client)
        assert d.socket in str(e.value)
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)


KILLED = """
import os, signal, sys
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
import ckptd.data as cdata, ckptd.torch as ct
import ckptd.torch._storage as storage

rank, sock = int(os.environ["RANK"]), sys.argv[1]
dist.init_process_group("gloo", rank=rank, world_size=2)
sampler = cdata.ReshardableSampler({n}, rank=rank, world_size=2, shuffle=True, seed=5)
it = iter(sampler)
for step in (1, 2):
    for _ in range(3):
        next(it)
    state = {{"model": {{"w": torch.full((4,), float(rank))}}, **cdata.state_dict(sampler)}}
    if step == 2 and rank == 1:  # dies in its save of step 2, before its part is staged
        storage.StorageWriter.write_data = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
    try:
        writer = ct.StorageWriter(f"runs/data-kill/step-{{step}}", socket=sock)
        dcp.save(state, storage_writer=writer)
        print(f"step {{step}} saved", flush=True)
    except BaseException as e:
        print(f"step {{step}} failed: {{type(e).__name__}}", flush=True)
os._exit(0)
"""


def test_a_rank_killed_mid_save_leaves_latest_on_the_previous(daemon: Daemon) -> None:
    """2 ranks save step-1 (3 samples each), then step-2 (6 each) where rank 1 dies: rank 0's save
    fails (no hang), "latest" is step-1 and a resume at 1 rank skips step-1's 6 samples only."""
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    base.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", KILLED.format(n=N), daemon.socket]
    procs = [
        subprocess.Popen(cmd, env=dict(base, RANK=str(r)), stdout=subprocess.PIPE, text=True)
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, -signal.SIGKILL], outs
    assert "step 1 saved" in outs[0] and "step 2 failed" in outs[0], outs
    client = ckptd.connect(daemon.socket)
    job = ct.encode_job("runs/data-kill")
    assert client.latest(job) == 1
    sampler = cdata.ReshardableSampler(N, rank=0, world_size=1, shuffle=True, seed=5)
    info = cdata.load_state_dict(sampler, job, "latest", client=client)
    assert info == {"resharded": True, "old_world_size": 2, "skipped": 6}, info
    assert len(list(sampler)) == N - 6
