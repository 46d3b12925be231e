"""ckptd.torch with several processes (gloo on CPU, loopback only): 4 ranks save DTensor-sharded
models, Adam state and 2-D-mesh tensors; 2 ranks and 1 rank load them with other placements;
DCP's FileSystemWriter saves the same and both agree; async_save stages then commits."""

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
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402

import ckptd  # noqa: E402
import ckptd.torch as ct  # noqa: E402

BIG_ROWS, BIG_COLS = 1024, 512  # 2 MiB of float32; a 4->2 load reads 1 MiB per rank


# --- deterministic inputs, the same in every process -------------------------------------------
def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def fake_grads(model: nn.Module) -> list[torch.Tensor]:
    return [
        torch.linspace(-1, 1, p.numel()).reshape(p.shape) * (i + 1)
        for i, p in enumerate(model.parameters())
    ]


def reference() -> tuple[nn.Module, torch.optim.Optimizer]:
    """The model and Adam state every layout must load: plain full tensors."""
    model = make_model(0)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for p, g in zip(model.parameters(), fake_grads(model), strict=True):
        p.grad = g
    opt.step()
    return model, opt


def two_d() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "a": torch.arange(8 * 12, dtype=torch.float32).reshape(8, 12),
        "b": torch.randn(16, 6, generator=g).to(torch.bfloat16),
    }


def big() -> torch.Tensor:
    return torch.randn(BIG_ROWS, BIG_COLS, generator=torch.Generator().manual_seed(3))


def sharded_model(
    seed: int, mesh: Any, placement: Callable[[torch.Tensor], Any], step: bool
) -> tuple[nn.Module, torch.optim.Optimizer]:
    model = make_model(seed)
    for name, p in list(model.named_parameters()):
        owner, _, attr = name.rpartition(".")
        dt = distribute_tensor(p.detach(), mesh, [placement(p)])
        setattr(model.get_submodule(owner), attr, nn.Parameter(dt))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    if step:
        for p, g in zip(model.parameters(), fake_grads(make_model(seed)), strict=True):
            p.grad = distribute_tensor(g, mesh, p.placements)
        opt.step()
    return model, opt


def full(x: Any) -> Any:
    return x.full_tensor() if isinstance(x, DTensor) else x


def assert_state_equal(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    ref_model, ref_opt = reference()
    want_m, want_o = get_state_dict(ref_model, ref_opt)
    got_m, got_o = get_state_dict(model, opt)
    for k, v in want_m.items():
        assert torch.equal(full(got_m[k]), v), k
    for fqn, st in want_o["state"].items():
        for k, v in st.items():
            assert torch.equal(full(got_o["state"][fqn][k]), v), (fqn, k)


# --- process bodies ------------------------------------------------------------------------------
def init(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def rows(p: torch.Tensor) -> Any:
    return Shard(0)


def cols_or_rows(p: torch.Tensor) -> Any:
    return Shard(1) if p.dim() == 2 else Shard(0)


def save_4(rank: int, sock: str, fsdir: str) -> None:
    init(rank, 4)
    try:
        mesh = init_device_mesh("cpu", (4,))
        model, opt = sharded_model(0, mesh, rows, step=True)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.save(state, storage_writer=ct.StorageWriter("dist/model/step-1", socket=sock))
        dcp.save(state, storage_writer=dcp.FileSystemWriter(fsdir))
        mesh2 = init_device_mesh("cpu", (2, 2))
        t = two_d()
        sd2 = {
            "a": distribute_tensor(t["a"], mesh2, [Shard(0), Shard(1)]),
            "b": distribute_tensor(t["b"], mesh2, [Replicate(), Shard(0)]),
        }
        dcp.save(sd2, storage_writer=ct.StorageWriter("dist/mesh2d/step-1", socket=sock))
        sd3 = {"big": distribute_tensor(big(), mesh, [Shard(0)])}
        dcp.save(sd3, storage_writer=ct.StorageWriter("dist/big/step-1", socket=sock))
        async_4(rank, sock, mesh)
    finally:
        dist.destroy_process_group()


def async_4(rank: int, sock: str, mesh: Any) -> None:
    want = torch.arange(64 * 8, dtype=torch.float32).reshape(64, 8)
    sd = {"w": distribute_tensor(want.clone(), mesh, [Shard(0)])}
    if rank == 3:
        time.sleep(2.0)  # the checkpoint cannot commit before rank 3 stages
    fut = dcp.async_save(sd, storage_writer=ct.StorageWriter("dist/async/step-5", socket=sock))
    client = ckptd.connect(sock)
    if rank == 0:
        assert client.status("dist.async", 5)["state"] == "STAGING"
        assert not fut.done()
    sd["w"].to_local().fill_(-1)  # after async_save returned: not in the checkpoint
    fut.result(timeout=120)
    assert client.status("dist.async", 5)["state"] == "COMMITTED"
    out = {"w": distribute_tensor(torch.zeros(64, 8), mesh, [Shard(0)])}
    dcp.load(out, storage_reader=ct.StorageReader("dist/async/step-5", socket=sock))
    assert torch.equal(out["w"].full_tensor(), want)


def load_2(rank: int, sock: str, fsdir: str) -> None:
    init(rank, 2)
    try:
        mesh = init_device_mesh("cpu", (2,))
        # Another placement: columns of the matrices, over 2 ranks instead of 4.
        model, opt = sharded_model(5, mesh, cols_or_rows, step=False)
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd}
        dcp.load(state, storage_reader=ct.StorageReader("dist/model/step-1", socket=sock))
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert_state_equal(model, opt)
        # The FileSystemWriter copy, loaded into yet another model, equals it.
        model_fs, opt_fs = sharded_model(6, mesh, cols_or_rows, step=False)
        msd2, osd2 = get_state_dict(model_fs, opt_fs)
        state2 = {"model": msd2, "optim": osd2}
        dcp.load(state2, storage_reader=dcp.FileSystemReader(fsdir))
        set_state_dict(
            model_fs, opt_fs, model_state_dict=state2["model"], optim_state_dict=state2["optim"]
        )
        assert_state_equal(model_fs, opt_fs)
        # 2-D mesh checkpoint into a 1-D mesh.
        t = two_d()
        sd2 = {
            "a": distribute_tensor(torch.zeros(8, 12), mesh, [Shard(1)]),
            "b": distribute_tensor(torch.zeros(16, 6, dtype=torch.bfloat16), mesh, [Replicate()]),
        }
        dcp.load(sd2, storage_reader=ct.StorageReader("dist/mesh2d/step-1", socket=sock))
        assert torch.equal(sd2["a"].full_tensor(), t["a"])
        assert torch.equal(sd2["b"].full_tensor(), t["b"])
        # 4 -> 2: only the needed bytes are read.
        sd3 = {"big": distribute_tensor(torch.zeros(BIG_ROWS, BIG_COLS), mesh, [Shard(0)])}
        reader = ct.StorageReader("dist/big/step-1", socket=sock)
        dcp.load(sd3, storage_reader=reader)
        assert torch.equal(sd3["big"].full_tensor(), big())
        needed = (BIG_ROWS // 2) * BIG_COLS * 4  # a multiple of 4 KiB already
        moved = reader.bytes_read + reader.bytes_from_ram  # from storage or the RAM tier
        assert 0 < moved <= 1.05 * needed, (reader.bytes_read, reader.bytes_from_ram, needed)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., None], world: int, *args: Any) -> None:
    mp.start_processes(run_rank, args=(fn, *args), nprocs=world, join=True, start_method="spawn")


@pytest.fixture(scope="module")
def saved(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> tuple[Daemon, str]:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    fsdir = str(tmp_path_factory.mktemp("fs") / "dcp")
    spawn(save_4, 4, daemon.socket, fsdir)
    return daemon, fsdir


def test_four_ranks_saved_committed_checkpoints(saved: tuple[Daemon, str]) -> None:
    client = ckptd.connect(saved[0].socket)
    for job in ("dist.model", "dist.mesh2d", "dist.big", "dist.async"):
        (info,) = client.list(job)
        assert info["state"] == "COMMITTED" and info["world_size"] == 4, info
    names = {i["name"] for i in client.inspect("dist.model", 1)}
    assert "model.0.weight" in names and "optim.state.0.weight.exp_avg" in names


def test_two_ranks_load_another_placement(saved: tuple[Daemon, str]) -> None:
    os.environ["MASTER_PORT"] = str(free_port())
    spawn(load_2, 2, saved[0].socket, saved[1])


def test_one_rank_loads_full_tensors(saved: tuple[Daemon, str]) -> None:
    sock = saved[0].socket
    model = make_model(9)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=ct.StorageReader("dist/model/step-1", socket=sock))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    assert_state_equal(model, opt)
    t = two_d()
    out = {"a": torch.zeros(8, 12), "b": torch.zeros(16, 6, dtype=torch.bfloat16)}
    dcp.load(out, storage_reader=ct.StorageReader("dist/mesh2d/step-1", socket=sock))
    assert torch.equal(out["a"], t["a"]) and torch.equal(out["b"], t["b"])
    # And from the FileSystemWriter copy: the same values.
    fs = {"a": torch.zeros(1)}  # unrelated keys are not needed; load the model instead
    del fs
    model_fs = make_model(10)
    opt_fs = torch.optim.Adam(model_fs.parameters(), lr=0.1)
    m2, o2 = get_state_dict(model_fs, opt_fs)
    state_fs = {"model": m2, "optim": o2}
    dcp.load(state_fs, storage_reader=dcp.FileSystemReader(saved[1]))
    for k, v in state["model"].items():
        assert torch.equal(state_fs["model"][k], v), k
    assert Path(saved[1]).is_dir()
