"""Planless saves (ckptd.torch.save, LocalPlanner with no_dist): 2 and 4 ranks (gloo on loopback)
save DTensors (sharded, replicated and 2-D placements), plain tensors and objects with every
collective of torch.distributed made to raise; each replicated item reaches the daemon from
exactly one rank; the checkpoint loads bit-exact at the same and at the other world size with
dcp.load and ckptd's reader, and in one process; a rank killed mid-save leaves the previous step
as latest."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from conftest import Daemon, free_port, run_rank

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor  # noqa: E402

import ckptd  # noqa: E402
import ckptd.torch as ct  # noqa: E402

COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "irecv",
    "isend",
    "monitored_barrier",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
)
PG_METHODS = (
    "allgather",
    "allgather_coalesced",
    "allgather_into_tensor_coalesced",
    "allreduce",
    "allreduce_coalesced",
    "alltoall",
    "alltoall_base",
    "barrier",
    "broadcast",
    "gather",
    "recv",
    "recv_anysource",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor_coalesced",
    "scatter",
    "send",
    "_allgather_base",
    "_reduce_scatter_base",
)


class CollectiveCalled(RuntimeError):
    pass


@contextmanager
def no_collectives() -> Iterator[list[str]]:
    """Every collective of torch.distributed (the module's functions, distributed_c10d's and the
    ProcessGroup's methods) raises CollectiveCalled while inside; yields the names called."""
    import torch.distributed.distributed_c10d as c10d

    called: list[str] = []
    saved: list[tuple[Any, str, Any]] = []

    def raiser(name: str) -> Callable[..., Any]:
        def fn(*args: Any, **kwargs: Any) -> Any:
            called.append(name)
            raise CollectiveCalled(f"collective {name} called during a planless save")

        return fn

    targets = [(dist, n) for n in COLLECTIVES] + [(c10d, n) for n in COLLECTIVES]
    targets += [(dist.ProcessGroup, n) for n in PG_METHODS]
    for owner, name in targets:
        if name in vars(owner):  # a pybind method's own descriptor (instancemethod) goes back
            saved.append((owner, name, vars(owner)[name]))
            setattr(owner, name, raiser(name))
    try:
        yield called
    finally:
        for owner, name, orig in reversed(saved):
            setattr(owner, name, orig)


# --- the state every world size saves: deterministic full tensors ------------------------------
def full_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return {
        "model.rows": torch.randn(8, 6, generator=g),  # Shard(0) on the 1-D mesh
        "model.bias": torch.randn(6, generator=g),  # Replicate on the 1-D mesh
        "model.hsdp": torch.randn(4, 6, generator=g).to(torch.bfloat16),  # (Replicate, Shard(0))
        "model.grid": torch.arange(8 * 4, dtype=torch.float32).reshape(8, 4),  # (Shard, Shard)
        "plain": torch.randn(3, 5, generator=g),  # a plain tensor, the same on every rank
        "step": torch.tensor(7, dtype=torch.int64),  # 0-d, as optimizers keep their step
    }


def meshes(world: int) -> tuple[Any, Any]:
    return init_device_mesh("cpu", (world,)), init_device_mesh("cpu", (2, world // 2))


def state(world: int, fill: bool, transposed: bool = False) -> dict[str, Any]:
    """The state dict at `world` ranks (zeros unless `fill`); `transposed`: other placements."""
    full = full_tensors()
    if not fill:
        full = {k: torch.zeros_like(v) for k, v in full.items()}
    m1, m2 = meshes(world)
    rows = [Shard(1)] if transposed else [Shard(0)]
    hsdp = [Shard(1), Replicate()] if transposed else [Replicate(), Shard(0)]
    grid = [Shard(1), Shard(0)] if transposed else [Shard(0), Shard(1)]
    return {
        "model": {
            "rows": distribute_tensor(full["model.rows"], m1, rows),
            "bias": distribute_tensor(full["model.bias"], m1, [Replicate()]),
            "hsdp": distribute_tensor(full["model.hsdp"], m2, hsdp),
            "grid": distribute_tensor(full["model.grid"], m2, grid),
        },
        "plain": full["plain"],
        "step": full["step"],
        "meta": {"epoch": 3 if fill else 0, "name": "run" if fill else ""},
    }


def check_loaded(sd: dict[str, Any]) -> None:
    want = full_tensors()
    for k, v in sd["model"].items():
        got = v.full_tensor() if isinstance(v, DTensor) else v
        assert torch.equal(got, want[f"model.{k}"]), k
        assert got.dtype == want[f"model.{k}"].dtype, k
    assert torch.equal(sd["plain"], want["plain"])
    assert torch.equal(sd["step"], want["step"])
    assert sd["meta"] == {"epoch": 3, "name": "run"}, sd["meta"]


@contextmanager
def recorded_sends(path: Path) -> Iterator[None]:
    """Writes every (item, region) this process's Client.save sends to `path` (JSON lines)."""
    orig = ckptd.Client.save

    def save(
        self: Any, job: str, step: int, tensors: Any = None, objects: Any = None, **kw: Any
    ) -> Any:
        sent = []
        for name, value in (tensors or {}).items():
            for shard in value if isinstance(value, list) else [value]:
                region = getattr(shard, "region", None)
                box = None if region is None else [list(region.offsets), list(region.lengths)]
                sent.append([name, box])
        sent += [[name, "object"] for name in objects or {}]
        with open(path, "a") as f:
            f.write(json.dumps({"job": job, "step": step, "rank": kw.get("rank"), "sent": sent}))
            f.write("\n")
        return orig(self, job, step, tensors, objects, **kw)

    ckptd.Client.save = save  # type: ignore[method-assign]
    try:
        yield
    finally:
        ckptd.Client.save = orig  # type: ignore[method-assign]


# --- process bodies ------------------------------------------------------------------------------
def init(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)


def save_body(rank: int, world: int, sock: str, out: str) -> None:
    init(rank, world)
    try:
        sd = state(world, fill=True)
        job = f"planless/w{world}"
        with recorded_sends(Path(out) / f"sent-{world}-{rank}.jsonl"), no_collectives() as called:
            ct.save(sd, step=1, job=job, socket=sock)  # the convenience call
            writer = ct.StorageWriter(f"{job}/step-2", socket=sock)
            md = dcp.save(sd, storage_writer=writer, planner=ct.LocalPlanner(), no_dist=True)
            fut = ct.save(sd, step=3, job=job, socket=sock, async_save=True)
            fut.result(timeout=120)
            # The control: DCP's own planning gathers, so it trips the same guard.
            with pytest.raises(BaseException, match="collective gather_object called"):
                dcp.save(sd, storage_writer=ct.StorageWriter(f"{job}/step-99", socket=sock))
        assert called == ["gather_object"], called
        assert md.storage_meta is not None and md.storage_meta.save_id == f"planless.w{world}/2"
        client = ckptd.connect(sock)
        for step in (1, 2, 3):
            assert client.status(f"planless.w{world}", step)["state"] == "COMMITTED"
        # The same world size, the same placements, through DCP's load and ckptd's reader.
        for step in (1, 2, 3):
            got = state(world, fill=False)
            dcp.load(got, storage_reader=ct.StorageReader(f"{job}/step-{step}", socket=sock))
            check_loaded(got)
    finally:
        dist.destroy_process_group()


def load_other_body(rank: int, world: int, sock: str, saved_world: int) -> None:
    """Loads what `saved_world` ranks saved at `world` ranks with other placements."""
    init(rank, world)
    try:
        got = state(world, fill=False, transposed=True)
        reader = ct.StorageReader(f"planless/w{saved_world}/step-1", socket=sock)
        dcp.load(got, storage_reader=reader)
        check_loaded(got)
    finally:
        dist.destroy_process_group()


def dies_body(rank: int, world: int, sock: str) -> None:
    init(rank, world)
    try:
        sd = state(world, fill=True)
        ct.save(sd, step=1, job="planless/dies", socket=sock)
        if rank == 1:  # killed while its part of step 2 is on its way to the daemon

            def die(*args: Any, **kwargs: Any) -> None:
                os.kill(os.getpid(), signal.SIGKILL)

            ckptd.Client.save = die  # type: ignore[method-assign]
        ct.save(sd, step=2, job="planless/dies", socket=sock, commit_timeout_ms=60_000)
        raise AssertionError("step 2 committed without rank 1")
    finally:
        dist.destroy_process_group()


def fsdp_load_body(rank: int, world: int, sock: str) -> None:
    """ckptd.torch.save then ckptd.torch.load of an FSDP2 model and its Adam state; the load
    (planless, the default) calls no collective: each rank plans its own reads."""
    from torch.distributed.fsdp import fully_shard

    init(rank, world)
    try:
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(0)
        model = torch.nn.Sequential(
            torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)
        )
        fully_shard(model, mesh=mesh)
        opt = torch.optim.Adam(model.parameters(), lr=0.1)
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        ct.save(model, opt, step=1, job="planless/fsdp", socket=sock)
        want = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
        want_moments = [opt.state[p]["exp_avg"].full_tensor().clone() for p in model.parameters()]
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)
        model(torch.randn(4, 16)).sum().backward()
        opt.step()  # the optimizer state moves on too
        with no_collectives() as called:
            loaded = ct.load(model, opt, step=1, job="planless/fsdp", socket=sock)
        assert called == [], called
        assert loaded.step == 1
        for k, v in model.state_dict().items():
            assert torch.equal(v.full_tensor(), want[k]), k
        for p, m in zip(model.parameters(), want_moments, strict=True):
            assert torch.equal(opt.state[p]["exp_avg"].full_tensor(), m)
    finally:
        dist.destroy_process_group()


def optim_state(rank: int) -> dict[str, Any]:
    """Optimizer-like state: rank 0 holds param 0's, rank 1 param 5's (as a pipeline stage)."""
    param = 5 * rank
    return {
        "optim": {"state": {param: {"step": torch.tensor(float(10 + param))}}},
        "meta": {"ranks": [0, 1]},
    }


def nested_body(rank: int, world: int, sock: str) -> None:
    """Each rank writes its own nested state (owns= everything it holds): step 1 through
    dcp.save, step 2 through dcp.async_save (the writer's stage() hands it over)."""
    init(rank, world)
    try:
        owns = lambda fqn: fqn.startswith("optim.") or rank == 0  # noqa: E731
        planner = ct.LocalPlanner(owns=owns)
        writer = ct.StorageWriter("planless/nested/step-1", socket=sock)
        dcp.save(optim_state(rank), storage_writer=writer, planner=planner, no_dist=True)
        writer = ct.StorageWriter("planless/nested/step-2", socket=sock, planner=planner)
        fut = dcp.async_save(
            optim_state(rank), storage_writer=writer, planner=planner, no_dist=True
        )
        fut.result(timeout=120)
    finally:
        dist.destroy_process_group()


def unplanned_stage_body(rank: int, world: int, sock: str) -> None:
    """dcp.async_save with a LocalPlanner through a writer built without planner=. The first
    rank to plan aborts the checkpoint naming the fix; a rank still staging then finds it
    ABORTED (the one-process case below checks the message alone)."""
    init(rank, world)
    try:
        sd = {"w": torch.ones(4), "b": torch.full((2,), 3.0)}
        writer = ct.StorageWriter("planless/unplanned/step-1", socket=sock)
        fix = (
            r"built without planner=.*StorageWriter\(id, "
            r"|unplanned/1 is (already ABORTED|being aborted)"
        )
        with pytest.raises(BaseException, match=fix):
            fut = dcp.async_save(sd, storage_writer=writer, planner=ct.LocalPlanner(), no_dist=True)
            fut.result(timeout=120)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable[..., None], world: int, *args: Any) -> None:
    os.environ["MASTER_PORT"] = str(free_port())
    mp.start_processes(
        run_rank, args=(fn, world, *args), nprocs=world, join=True, start_method="spawn"
    )


@pytest.fixture(scope="module")
def saved(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> tuple[Daemon, Path]:
    os.environ.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    out = tmp_path_factory.mktemp("planless")
    for world in (2, 4):
        spawn(save_body, world, daemon.socket, str(out))
    return daemon, out


@pytest.mark.parametrize("world", [2, 4])
def test_each_item_written_once(saved: tuple[Daemon, Path], world: int) -> None:
    daemon, out = saved
    client = ckptd.connect(daemon.socket)
    job = f"planless.w{world}"
    for step in (1, 2, 3):
        sends: dict[tuple[str, str], list[int]] = {}
        for rank in range(world):
            for line in (out / f"sent-{world}-{rank}.jsonl").read_text().splitlines():
                rec = json.loads(line)
                if (rec["job"], rec["step"]) != (job, step):
                    continue
                assert rec["rank"] == rank
                for name, region in rec["sent"]:
                    sends.setdefault((name, json.dumps(region)), []).append(rank)
        twice = {k: v for k, v in sends.items() if len(v) != 1}
        assert not twice, twice
        names = {name for name, _ in sends}
        info = {i["name"]: i for i in client.inspect(job, step)}
        assert set(info) == names, set(info) ^ names
        assert info["model.bias"]["shard_count"] == 1
        assert info["model.hsdp"]["shard_count"] == world // 2  # its Shard(0) dim, once
        assert info["model.grid"]["shard_count"] == world
        assert info["model.rows"]["shard_count"] == world
        assert info["plain"]["shard_count"] == 1 and info["step"]["shard_count"] == 1
        # Replicated plain tensors are balanced across the ranks, not all written by rank 0:
        # "plain" (60 bytes) goes to rank 0, then "step" (8 bytes) to the least loaded, rank 1.
        by_name = {name: ranks for (name, _), ranks in sends.items()}
        assert by_name["plain"] == [0] and by_name["step"] == [1], by_name
        for name in ("meta.epoch", "meta.name"):  # replicated objects, sent by rank 0 alone
            assert info[name]["kind"] == "object" and not info[name]["per_rank"]
            assert sends[(name, json.dumps("object"))] == [0]
        assert client.list(job)[step - 1]["world_size"] == world


@pytest.mark.parametrize(("world", "saved_world"), [(2, 4), (4, 2)])
def test_loads_at_another_world_size(
    saved: tuple[Daemon, Path], world: int, saved_world: int
) -> None:
    spawn(load_other_body, world, saved[0].socket, saved_world)


def test_planless_load_calls_no_collective(daemon: Daemon) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    spawn(fsdp_load_body, 2, daemon.socket)


@pytest.mark.parametrize("saved_world", [2, 4])
def test_loads_in_one_process(saved: tuple[Daemon, Path], saved_world: int) -> None:
    full = full_tensors()
    got: dict[str, Any] = {
        "model": {k.split(".", 1)[1]: torch.zeros_like(v) for k, v in full.items() if "." in k},
        "plain": torch.zeros(3, 5),
        "step": torch.tensor(0),
        "meta": {"epoch": 0, "name": ""},
    }
    reader = ct.StorageReader(f"planless/w{saved_world}/step-2", socket=saved[0].socket)
    dcp.load(got, storage_reader=reader, no_dist=True)
    check_loaded(got)


def test_rank_killed_mid_save_leaves_the_previous_step_latest(daemon: Daemon) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    with pytest.raises(mp.ProcessExitedException):
        spawn(dies_body, 2, daemon.socket)
    client = ckptd.connect(daemon.socket)
    assert client.latest("planless.dies") == 1
    states = {int(r["step"]): r["state"] for r in client.list("planless.dies")}
    assert states[1] == "COMMITTED" and states.get(2) != "COMMITTED", states
    with pytest.raises(ckptd.CkptdError):
        client.load("planless.dies", 2)


def test_planless_refuses_an_id_without_a_step(daemon: Daemon) -> None:
    sd = {"w": torch.ones(2)}
    writer = ct.StorageWriter("planless/named/best", socket=daemon.socket)
    with pytest.raises(BaseException, match="has no step"):
        dcp.save(sd, storage_writer=writer, planner=ct.LocalPlanner(), no_dist=True)


def test_local_planner_rules_without_a_process_group() -> None:
    sd = {"w": torch.ones(2), "obj": {"a": 1}}
    for rank, want in ((0, {"w", "obj.a"}), (1, set())):
        p = ct.LocalPlanner(rank=rank, world_size=2)
        p.set_up_planner(sd, is_coordinator=True)
        assert {i.index.fqn for i in p.create_local_plan().items} == want
    p = ct.LocalPlanner(rank=1, world_size=2, owns=lambda fqn: fqn == "obj.a")
    p.set_up_planner(sd, is_coordinator=True)
    assert [i.index.fqn for i in p.create_local_plan().items] == ["obj.a"]
    with pytest.raises(ValueError, match="not in the save's world"):
        ct.LocalPlanner(rank=2, world_size=2).set_up_planner(sd)
    with pytest.raises(ValueError, match="both rank and world_size"):
        ct.LocalPlanner(rank=1)


def test_balanced_owners_share_the_writes() -> None:
    """Every value is written by exactly one rank, the same assignment on every rank, and no rank
    writes more than its share by more than one value (the longest-processing-time rule)."""
    sizes = {f"layer.{i}.w": (i % 7 + 1) * 1000 + i for i in range(50)}
    for count in (1, 2, 3, 8, 64):
        owners = ct.balanced_owners(sizes, count)
        assert set(owners) == set(sizes) and owners == ct.balanced_owners(dict(sizes), count)
        loads = [0] * count
        for fqn, rank in owners.items():
            loads[rank] += sizes[fqn]
        assert max(loads) <= sum(sizes.values()) / count + max(sizes.values()), (count, loads)
    assert ct.balanced_owners({}, 4) == {}
    # Through the planner: 8 ranks, a DDP-like model of plain tensors and one object.
    sd = {f"w{i}": torch.ones(100 + i) for i in range(16)}
    sd["obj"] = {"a": 1}
    written: dict[str, list[int]] = {}
    for rank in range(8):
        p = ct.LocalPlanner(rank=rank, world_size=8)
        p.set_up_planner(sd, is_coordinator=True)
        for item in p.create_local_plan().items:
            written.setdefault(item.index.fqn, []).append(rank)
    assert all(len(r) == 1 for r in written.values()) and set(written) == set(sd) - {"obj"} | {
        "obj.a"
    }
    assert {r[0] for fqn, r in written.items() if fqn.startswith("w")} == set(range(8))
    assert written["obj.a"] == [0]  # non-tensor values: rank 0
    # writer_rank given: that rank writes every plain value, as before.
    p = ct.LocalPlanner(rank=0, world_size=8, writer_rank=0)
    p.set_up_planner(sd, is_coordinator=True)
    assert len(p.create_local_plan().items) == 17


def test_plan_caching_saves_each_step(daemon: Daemon) -> None:
    """LocalPlanner(enable_plan_caching=True): the unchanged plan is swapped for the cached one
    and each save still writes its own values."""
    planner = ct.LocalPlanner(rank=0, world_size=1, enable_plan_caching=True)
    for step in (1, 2, 3):
        sd = {"w": torch.full((4, 3), float(step)), "meta": {"step": step}}
        writer = ct.StorageWriter(f"planless/cached/step-{step}", socket=daemon.socket)
        dcp.save(sd, storage_writer=writer, planner=planner, no_dist=True)
    for step in (1, 2, 3):
        got = {"w": torch.zeros(4, 3), "meta": {"step": 0}}
        reader = ct.StorageReader(f"planless/cached/step-{step}", socket=daemon.socket)
        dcp.load(got, storage_reader=reader, no_dist=True)
        assert (
            torch.equal(got["w"], torch.full((4, 3), float(step))) and got["meta"]["step"] == step
        )


def test_keys_only_other_ranks_hold_load_without_a_template(daemon: Daemon) -> None:
    """Two ranks (threads, rank/world_size given) each write a key the other lacks (as
    TorchTitan's dataloader.dp_rank_<r>); a template-less load nests both, though only rank 0's
    flattening mappings are saved."""
    from concurrent.futures import ThreadPoolExecutor

    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    def save(rank: int) -> None:
        sd = {"dl": {f"dp_rank_{rank}": f"pos{rank}"}, "w": torch.full((2,), float(rank))}
        planner = ct.LocalPlanner(
            rank=rank, world_size=2, owns=lambda fqn: fqn.startswith("dl.") or rank == 0
        )
        if rank == 1:
            sd.pop("w")
        writer = ct.StorageWriter("planless/keys/step-1", socket=daemon.socket)
        dcp.save(sd, storage_writer=writer, planner=planner, no_dist=True)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(save, [0, 1]))
    reader = ct.StorageReader("planless/keys/step-1", socket=daemon.socket)
    got = _load_state_dict_from_keys(keys={"dl"}, storage_reader=reader)
    assert got == {"dl": {"dp_rank_0": "pos0", "dp_rank_1": "pos1"}}, got


def test_nested_items_only_a_later_rank_holds_load_without_a_template(daemon: Daemon) -> None:
    """Rank 1 writes optim.state.5.step, rank 0 only optim.state.0.step: the template-less load
    (as format_utils.dcp_to_torch_save does) nests "5" under state as DCP's own save would (its
    flattening makes dict keys str), from rank 1's own flattening mappings (rank 0's cannot tell
    that "5.step" is two keys; DCP's unflatten then raised TypeError)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    os.environ.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    spawn(nested_body, 2, daemon.socket)
    steps = {"0": torch.tensor(10.0), "5": torch.tensor(15.0)}
    for step in (1, 2):
        reader = ct.StorageReader(f"planless/nested/step-{step}", socket=daemon.socket)
        got = _load_state_dict_from_keys(storage_reader=reader)
        assert got.keys() == {"optim", "meta"} and got["meta"] == {"ranks": [0, 1]}, got
        assert got["optim"].keys() == {"state"}, got
        state = got["optim"]["state"]
        assert state.keys() == steps.keys(), got
        for param, step_value in steps.items():
            assert state[param].keys() == {"step"}, got
            assert torch.equal(state[param]["step"], step_value), got
    # The DCP export nests the same way (its planner_data merges rank 1's mappings too).
    import tempfile

    import ckptd.formats as fmt
    from ckptd.torch import _ids

    with tempfile.TemporaryDirectory() as tmp, ckptd.connect(daemon.socket) as client:
        fmt.export_dcp(client, _ids.encode_job("planless/nested"), 1, tmp, chunk_bytes=1 << 20)
        got = _load_state_dict_from_keys(storage_reader=dcp.FileSystemReader(tmp))
        assert got["optim"]["state"].keys() == steps.keys(), got
        assert torch.equal(got["optim"]["state"]["5"]["step"], steps["5"]), got


def test_async_save_with_a_local_planner_needs_the_writers_planner(daemon: Daemon) -> None:
    """StorageWriter(id) without planner= stages with DCP's planner (every rank every item):
    the planless write_data that follows refuses it with a ValueError naming the fix."""
    os.environ.update(MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    spawn(unplanned_stage_body, 2, daemon.socket)
    # One process (no process group): the same misuse, the same error.
    writer = ct.StorageWriter("planless/unplanned1/step-1", socket=daemon.socket)
    with pytest.raises(BaseException, match="built without planner="):
        dcp.async_save(
            {"w": torch.ones(2)}, storage_writer=writer, planner=ct.LocalPlanner(), no_dist=True
        ).result(timeout=120)
