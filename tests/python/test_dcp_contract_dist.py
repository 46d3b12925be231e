"""DCP 2.13's backend contract with several processes (gloo on CPU, loopback only):
use_collectives=False (rank-local parts committed on their own, read_metadata(rank=r), later loads
with and without collectives and at another world size), no_dist inside a process group, errors
travelling between ranks, a process-based async_save with two futures, and a TorchTitan-style
loop (FSDP2, async_save every k steps with plan caching, resumed at another world size)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import Daemon, free_port, run_rank

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner  # noqa: E402
from torch.distributed.checkpoint.planner import SavePlanner  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.checkpoint.state_dict_saver import (  # noqa: E402
    AsyncCheckpointerType,
    AsyncSaveResponse,
)
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402

import ckptd  # noqa: E402
import ckptd.torch as ct  # noqa: E402

ROWS, COLS = 64, 24


def full_w() -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)


def bias() -> torch.Tensor:
    return torch.linspace(-1, 1, COLS, dtype=torch.float64)


def init(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def spawn(fn: Callable[..., None], world: int, *args: Any) -> None:
    os.environ["MASTER_PORT"] = str(free_port())
    mp.start_processes(run_rank, args=(fn, *args), nprocs=world, join=True, start_method="spawn")


def wait_committed(client: ckptd.Client, job: str, step: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if client.status(job, step)["state"] == "COMMITTED":
                return
        except ckptd.NotFoundError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{job}/{step} not COMMITTED within {timeout_s} s")


# --- two ranks: rank-local saves, no_dist, errors, process-based async ---------------------------
def two_ranks(rank: int, sock: str) -> None:
    init(rank, 2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        client = ckptd.connect(sock)
        rank_local(rank, sock, mesh, client)
        no_dist_in_a_group(rank, sock, client)
        errors_between_ranks(rank, sock)
        process_async(rank, sock, mesh, client)
    finally:
        dist.destroy_process_group()


def rank_local(rank: int, sock: str, mesh: Any, client: ckptd.Client) -> None:
    sd = {
        "w": distribute_tensor(full_w(), mesh, [Shard(0)]),
        "b": distribute_tensor(bias(), mesh, [Replicate()]),
        "epoch": 3,
    }
    if rank == 1:
        # Rank 0's part commits on its own: rank 1 has not even started its save.
        wait_committed(client, "local.run._rank0", 5, 30)
        assert client.list("local.run._rank0")[0]["world_size"] == 1
    meta = dcp.save(
        sd,
        storage_writer=ct.StorageWriter("local/run/step-5", socket=sock, commit_timeout_ms=60000),
        use_collectives=False,
    )
    # Each rank's finish() saw only its own part.
    chunks = meta.state_dict_metadata["w"].chunks
    assert [list(c.offsets) for c in chunks] == [[rank * ROWS // 2, 0]]
    dist.barrier()
    # read_metadata(rank=r): rank r's part alone.
    part = ct.StorageReader("local/run/step-5", socket=sock).read_metadata(rank=rank)
    (chunk,) = part.state_dict_metadata["w"].chunks
    assert list(chunk.offsets) == [rank * ROWS // 2, 0] and list(chunk.sizes) == [ROWS // 2, COLS]
    # With collectives, into another placement: reads go to the part that holds each chunk.
    out = {
        "w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(1)]),
        "b": distribute_tensor(torch.zeros(COLS, dtype=torch.float64), mesh, [Shard(0)]),
        "epoch": 0,
    }
    dcp.load(out, storage_reader=ct.StorageReader("local/run/step-5", socket=sock))
    assert torch.equal(out["w"].full_tensor(), full_w())
    assert torch.equal(out["b"].full_tensor(), bias()) and out["epoch"] == 3
    # Without collectives: every rank reads whole tensors on its own.
    plain = {"w": torch.zeros(ROWS, COLS), "b": torch.zeros(COLS, dtype=torch.float64)}
    dcp.load(plain, storage_reader=ct.StorageReader("local/run/step-5", socket=sock), no_dist=True)
    assert torch.equal(plain["w"], full_w()) and torch.equal(plain["b"], bias())


def no_dist_in_a_group(rank: int, sock: str, client: ckptd.Client) -> None:
    # Each rank saves a checkpoint of its own, as one process: world size 1, not the group's 2.
    sd = {"w": torch.full((5,), float(rank)), "note": f"rank {rank}"}
    writer = ct.StorageWriter(f"nodist/r{rank}/step-1", socket=sock, commit_timeout_ms=30000)
    dcp.save(sd, storage_writer=writer, no_dist=True)
    info = client.status(f"nodist.r{rank}", 1)
    assert info["state"] == "COMMITTED" and info["world_size"] == 1
    out = {"w": torch.zeros(5), "note": ""}
    dcp.load(
        out, storage_reader=ct.StorageReader(f"nodist/r{rank}/step-1", socket=sock), no_dist=True
    )
    assert torch.equal(out["w"], sd["w"]) and out["note"] == sd["note"]


def errors_between_ranks(rank: int, sock: str) -> None:
    sd = {"w": torch.ones(4)}
    dcp.save(sd, storage_writer=ct.StorageWriter("errs/dist/step-1", socket=sock))
    try:
        dcp.save(sd, storage_writer=ct.StorageWriter("errs/dist/step-1", socket=sock))
    except CheckpointException as e:
        # Gathered from both ranks (pickled over gloo), each with the daemon's message.
        assert set(e.failures) == {0, 1}, e.failures
        for err, _ in e.failures.values():
            assert isinstance(err, ckptd.AlreadyExistsError), err
            assert "errs.dist" in str(err) and "COMMITTED" in str(err), str(err)
    else:
        raise AssertionError("saving over a COMMITTED checkpoint succeeded")


def process_async(rank: int, sock: str, mesh: Any, client: ckptd.Client) -> None:
    sd = {"w": distribute_tensor(full_w(), mesh, [Shard(0)]), "epoch": 9}
    writer = ct.StorageWriter("proc/run/step-2", socket=sock, async_staging=True)
    resp = dcp.async_save(
        sd, storage_writer=writer, async_checkpointer_type=AsyncCheckpointerType.PROCESS
    )
    assert isinstance(resp, AsyncSaveResponse)
    resp.staging_completion.result(timeout=120)
    sd["w"].to_local().fill_(-1)  # staged: the checkpoint keeps the old values
    resp.upload_completion.result(timeout=300)
    assert client.status("proc.run", 2)["state"] == "COMMITTED"
    writer.close()
    out = {"w": distribute_tensor(torch.zeros(ROWS, COLS), mesh, [Shard(0)]), "epoch": 0}
    dcp.load(out, storage_reader=ct.StorageReader("proc/run/step-2", socket=sock))
    assert torch.equal(out["w"].full_tensor(), full_w()) and out["epoch"] == 9


@pytest.fixture(scope="module")
def env() -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")


def test_rank_local_no_dist_errors_and_process_async(daemon: Daemon, env: None) -> None:
    spawn(two_ranks, 2, daemon.socket)
    # A later load at another world size (1) of the rank-local checkpoint.
    out = {"w": torch.zeros(ROWS, COLS), "b": torch.zeros(COLS, dtype=torch.float64), "epoch": 0}
    dcp.load(out, storage_reader=ct.StorageReader("local/run/step-5", socket=daemon.socket))
    assert torch.equal(out["w"], full_w()) and torch.equal(out["b"], bias()) and out["epoch"] == 3


# --- TorchTitan-style loop --------------------------------------------------------------------
STEPS, EVERY, DIM = 6, 2, 16


def titan_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(DIM, 2 * DIM), nn.ReLU(), nn.Linear(2 * DIM, DIM))


def full(x: Any) -> torch.Tensor:
    return x.full_tensor() if isinstance(x, DTensor) else x


def flat_full(msd: dict[str, Any], osd: dict[str, Any]) -> dict[str, torch.Tensor]:
    out = {f"model.{k}": full(v).clone() for k, v in msd.items()}
    for fqn, st in osd["state"].items():
        for k, v in st.items():
            out[f"optim.{fqn}.{k}"] = full(v).clone()
    return out


def titan_train(rank: int, world: int, sock: str, expect_file: str) -> None:
    """FSDP2 training; every EVERY steps an async_save staged before optimizer.step() (DCP's
    zero-overhead recipe), the previous upload drained first; plan caching on."""
    from torch.distributed.fsdp import fully_shard

    init(rank, world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = titan_model(0)
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        data = torch.randn(STEPS, 8, DIM, generator=torch.Generator().manual_seed(1))
        # Checkpoint collectives run in the upload thread while FSDP2's run in this one: their
        # own group, as TorchTitan does.
        ckpt_pg = dist.new_group(backend="gloo")
        upload = None
        saved: dict[str, torch.Tensor] = {}
        for step in range(1, STEPS + 1):
            staging = None
            if step % EVERY == 0:
                if upload is not None:
                    upload.result(timeout=300)
                msd, osd = get_state_dict(model, opt)
                saved = flat_full(msd, osd)
                writer = ct.StorageWriter(f"titan/run/step-{step}", socket=sock, async_staging=True)
                resp = dcp.async_save(
                    {"model": msd, "optim": osd, "train": {"step": step}},
                    storage_writer=writer,
                    planner=DefaultSavePlanner(enable_plan_caching=True),
                    process_group=ckpt_pg,
                )
                assert isinstance(resp, AsyncSaveResponse)
                staging, upload = resp.staging_completion, resp.upload_completion
            loss = model(data[step - 1]).pow(2).mean()
            loss.backward()
            if staging is not None:
                staging.result(timeout=300)  # before the optimizer changes the parameters
            opt.step()
            opt.zero_grad()
        assert upload is not None
        upload.result(timeout=300)
        if rank == 0:
            torch.save(saved, expect_file)
    finally:
        dist.destroy_process_group()


def titan_resume(rank: int, world: int, sock: str, expect_file: str) -> None:
    from torch.distributed.fsdp import fully_shard

    init(rank, world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        model = titan_model(7)  # other values: all must come from the checkpoint
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        model(torch.randn(2, DIM)).sum().backward()  # optimizer state exists to load into
        opt.step()
        msd, osd = get_state_dict(model, opt)
        sd = {"model": msd, "optim": osd, "train": {"step": 0}}
        latest = ckptd.connect(sock).latest("titan.run")
        assert latest == STEPS
        dcp.load(sd, storage_reader=ct.StorageReader(f"titan/run/step-{latest}", socket=sock))
        set_state_dict(model, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
        assert sd["train"]["step"] == STEPS
        got = flat_full(*get_state_dict(model, opt))
        want = torch.load(expect_file)
        assert set(got) == set(want), set(got) ^ set(want)
        for k, v in want.items():
            assert torch.equal(got[k], v), k
    finally:
        dist.destroy_process_group()


def test_torchtitan_style_loop_resumes_at_another_world_size(
    daemon: Daemon, env: None, tmp_path: Path
) -> None:
    for cache in [v for k, v in vars(SavePlanner).items() if k.startswith("_cached_")]:
        cache.clear()
    expect = str(tmp_path / "expect.pt")
    spawn(titan_train, 2, 2, daemon.socket, expect)
    client = ckptd.connect(daemon.socket)
    assert [c["step"] for c in client.list("titan.run")] == list(range(EVERY, STEPS + 1, EVERY))
    spawn(titan_resume, 1, 1, daemon.socket, expect)
