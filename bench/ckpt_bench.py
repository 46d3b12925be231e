"""ckptd against torch.save, PyTorch DCP and ByteCheckpoint on one machine, in one run.

For each dtype (fp32, bf16) and each world size (1, 2, 4 ranks; gloo on loopback) every system
saves and loads the same GPT-style state (model weights + Adam exp_avg/exp_avg_sq, at least
--state-gb in all, every tensor row-sharded over the ranks like FSDP), and the machine's limits
are measured beside them:

  memcpy   each rank copies its bytes into pre-faulted memory with one thread, all ranks at once
  disk     fio: sequential O_DIRECT write (with a final fsync) and read of the data directory

Phases per system: save stall (call -> the caller may touch its tensors again), time to committed
(call -> durable on disk), cold load (page cache dropped; ckptd has no RAM tier and reads with
O_DIRECT), warm load, and resharded cold load: the checkpoint saved by the previous world size
(1->2, 2->4, and a last 1-rank run loads the 4-rank one: 4->1). Device bytes read come from
/proc/PID/io (the daemon's for ckptd, the ranks' own for the others). Every load is checked
against the saved data (per-block sums).

Writes one JSON line per measurement to --out/ckpt.jsonl; bench/summarize.py makes the tables
and bench/plot.py the PNG.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_common  # noqa: E402 (found through the path above)

GB = 1000**3
MiB = 1 << 20
# ckptd's save, its cold loads and the memcpy limit are repeated (the median is reported); each
# peer runs once (a 2 GB save takes 5-15 s).
REPS = int(os.environ.get("BENCH_REPS", "3"))
LOAD_STEP = 1 + REPS  # the step ckptd's loads read: the last one saved
QUARTERS = 4  # every tensor's dim 0 is generated in 4 blocks: any 1/2/4-way row split is a union


# --- the workload -----------------------------------------------------------------------------
def workload(state_bytes: int, itemsize: int) -> list[Any]:
    """GPT-style parameter shapes (embedding + L blocks of LN, QKV, proj, LN, MLP) with L the
    fewest blocks that make params + exp_avg + exp_avg_sq >= state_bytes. Model width 2048 and
    vocabulary 32768 from 1 GB of state; 512 and 8192 below (smoke runs)."""
    d, vocab = (2048, 32768) if state_bytes >= GB else (512, 8192)
    block = [
        ("ln1.weight", [d]),
        ("attn.qkv.weight", [3 * d, d]),
        ("attn.proj.weight", [d, d]),
        ("ln2.weight", [d]),
        ("mlp.fc1.weight", [4 * d, d]),
        ("mlp.fc2.weight", [d, 4 * d]),
    ]
    per_block = sum(math.prod(s) for _, s in block)
    fixed = vocab * d + d  # embedding + final norm
    params_needed = math.ceil(state_bytes / (3 * itemsize))
    layers = max(1, math.ceil((params_needed - fixed) / per_block))
    params = [("embed.weight", [vocab, d])]
    for i in range(layers):
        params += [(f"layers.{i}.{n}", s) for n, s in block]
    params.append(("norm.weight", [d]))
    out = []
    for name, shape in params:
        out.append((f"model.{name}", shape))
        out.append((f"optim.{name}.exp_avg", shape))
        out.append((f"optim.{name}.exp_avg_sq", shape))
    return out


@dataclass
class Config:
    dtype: str
    world: int
    reshard_from: int | None  # world size whose checkpoints the resharded loads read
    save: bool  # False: only the resharded loads (the final 4->1 run)
    state_bytes: int
    data_dir: str
    socket: str
    daemon_pid: int
    port: int
    out_file: str
    systems: list[str]
    verify: bool
    drop_caches: bool


# --- rank side ----------------------------------------------------------------------------------
def _torch_dtype(name: str) -> Any:
    import torch

    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


def _rows(world: int, rank: int, n: int) -> tuple[int, int]:
    per = n // world
    return rank * per, per


class RankState:
    """This rank's row blocks of every tensor, generated per quarter block from a fixed seed, and
    the sum of every quarter block of the global state (to check any layout's load)."""

    def __init__(self, cfg: Config, rank: int) -> None:
        import torch
        import torch.distributed as dist

        self.cfg = cfg
        self.rank = rank
        self.dtype = _torch_dtype(cfg.dtype)
        itemsize = torch.tensor([], dtype=self.dtype).element_size()
        self.shapes = workload(cfg.state_bytes, itemsize)
        self.total_bytes = sum(math.prod(s) * itemsize for _, s in self.shapes)
        self.local: dict[str, torch.Tensor] = {}
        sums: dict[tuple[int, int], float] = {}
        for t, (name, shape) in enumerate(self.shapes):
            start, rows = _rows(cfg.world, rank, shape[0])
            local = torch.empty([rows, *shape[1:]], dtype=self.dtype)
            q_rows = shape[0] // QUARTERS
            for q in range(start // q_rows, (start + rows) // q_rows):
                g = torch.Generator().manual_seed(t * QUARTERS + q)
                blk = local[q * q_rows - start : (q + 1) * q_rows - start]
                blk.uniform_(-1, 1, generator=g)
                sums[(t, q)] = float(blk.sum(dtype=torch.float64))
            self.local[name] = local
        gathered: list[Any] = [None] * cfg.world
        dist.all_gather_object(gathered, sums)
        self.sums = {k: v for part in gathered for k, v in part.items()}
        self.local_bytes = sum(t.numel() * t.element_size() for t in self.local.values())

    def empty_like_layout(self, world: int, rank: int) -> dict[str, Any]:
        import torch

        out = {}
        for name, shape in self.shapes:
            _, rows = _rows(world, rank, shape[0])
            out[name] = torch.zeros([rows, *shape[1:]], dtype=self.dtype)  # pre-faulted
        return out

    def check(self, loaded: dict[str, Any], world: int, rank: int, what: str) -> None:
        """Raises when a loaded local block's sums differ from the saved data's."""
        import torch

        for t, (name, shape) in enumerate(self.shapes):
            start, rows = _rows(world, rank, shape[0])
            q_rows = shape[0] // QUARTERS
            got = loaded[name]
            for q in range(start // q_rows, (start + rows) // q_rows):
                blk = got[q * q_rows - start : (q + 1) * q_rows - start]
                s = float(blk.detach().sum(dtype=torch.float64))
                if s != self.sums[(t, q)]:
                    raise RuntimeError(f"{what}: {name} block {q} differs after load")


def _mesh_dtensors(local: dict[str, Any], shapes: list[Any], world: int) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    out = {}
    for name, shape in shapes:
        t = local[name]
        stride = list(_contiguous_stride(shape))
        out[name] = DTensor.from_local(
            t, mesh, [Shard(0)], run_check=False, shape=tuple(shape), stride=tuple(stride)
        )
    return out


def _contiguous_stride(shape: list[int]) -> list[int]:
    stride, acc = [], 1
    for d in reversed(shape):
        stride.append(acc)
        acc *= d
    return list(reversed(stride))


def _read_bytes(pid: int | str) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


class Recorder:
    """Times phases on every rank from a common start (a barrier); rank 0 writes one JSON line
    per phase with the slowest rank's and the mean rank's seconds and the device bytes read."""

    def __init__(self, cfg: Config, rank: int) -> None:
        self.cfg = cfg
        self.rank = rank

    def start(self, io_pid: int | None = None) -> dict[str, Any]:
        import torch.distributed as dist

        dist.barrier()
        mark = {"own": _read_bytes("self"), "t0": 0.0, "pid": io_pid}
        mark["dev"] = _read_bytes(io_pid) if io_pid and self.rank == 0 else 0
        mark["t0"] = time.perf_counter()
        return mark

    def record(
        self,
        system: str,
        phase: str,
        seconds: float,
        mark: dict[str, Any],
        *,
        nbytes: int,
        extra: dict[str, Any] | None = None,
    ) -> None:
        import torch.distributed as dist

        own = _read_bytes("self") - mark["own"]
        dist.barrier()
        pid = mark["pid"]
        dev = _read_bytes(pid) - mark["dev"] if pid and self.rank == 0 else 0
        per_rank: list[Any] = [None] * self.cfg.world
        dist.all_gather_object(per_rank, (seconds, own))
        if self.rank != 0:
            return
        secs = [p[0] for p in per_rank]
        row = {
            "system": system,
            "phase": phase,
            "dtype": self.cfg.dtype,
            "world": self.cfg.world,
            "seconds_max": max(secs),
            "seconds_mean": sum(secs) / len(secs),
            "bytes": nbytes,
            "read_bytes": dev if pid else sum(p[1] for p in per_rank),
            **(extra or {}),
        }
        with open(self.cfg.out_file, "a") as f:
            f.write(json.dumps(row) + "\n")
        print(
            f"  {system:<13} {phase:<13} {max(secs):8.3f} s  {nbytes / max(secs) / GB:6.2f} GB/s"
            f"  read {row['read_bytes'] / GB:6.2f} GB",
            flush=True,
        )

    def timed(
        self,
        system: str,
        phase: str,
        fn: Callable[[], Any],
        *,
        nbytes: int,
        io_pid: int | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Any:
        mark = self.start(io_pid)
        result = fn()
        self.record(
            system, phase, time.perf_counter() - mark["t0"], mark, nbytes=nbytes, extra=extra
        )
        return result

    def save(
        self, system: str, stage: Callable[[], Any], persist: Callable[[Any], None], nbytes: int
    ) -> None:
        """stage() returns when the caller may touch its tensors again (the stall); persist(x)
        returns when the checkpoint is durable (time to committed, from the same start)."""
        mark = self.start()
        handle = stage()
        stall = time.perf_counter() - mark["t0"]
        persist(handle)
        committed = time.perf_counter() - mark["t0"]
        self.record(system, "save_stall", stall, mark, nbytes=nbytes)
        mark["own"] = _read_bytes("self")
        self.record(system, "committed", committed, mark, nbytes=nbytes)


def _memcpy_limit(rec: Recorder, st: RankState) -> None:
    import numpy as np
    import torch

    dst = {n: torch.zeros_like(t) for n, t in st.local.items()}  # pre-faulted
    pairs = [
        (d.view(torch.uint8).numpy(), st.local[n].view(torch.uint8).numpy()) for n, d in dst.items()
    ]

    def copy() -> None:
        for d, s in pairs:
            np.copyto(d, s)

    copy()  # first touch of the sources' cache lines and TLB, as a training loop has
    for _ in range(REPS):
        rec.timed(
            "limit", "memcpy", copy, nbytes=st.total_bytes, extra={"rank_bytes": st.local_bytes}
        )


def _boxes(st: RankState, world: int, rank: int) -> dict[str, Any]:
    import ckptd

    out = {}
    for name, shape in st.shapes:
        start, rows = _rows(world, rank, shape[0])
        out[name] = ckptd.Box([start] + [0] * (len(shape) - 1), [rows, *shape[1:]])
    return out


def _run_ckptd(rec: Recorder, st: RankState, cfg: Config, rank: int) -> None:
    """ckptd's own Python client: save() copies each tensor once into the staging arena and
    returns (the stall); the daemon flushes with O_DIRECT + io_uring and commits."""
    import ckptd

    client = ckptd.connect(cfg.socket)
    job = f"bench-{cfg.dtype}-w{{}}"
    system = "ckptd"
    if cfg.save:
        boxes = _boxes(st, cfg.world, rank)
        tensors = {n: ckptd.Shard(st.local[n], s, boxes[n]) for n, s in st.shapes}
        # Step 1 is a warm-up (first save maps the arena); steps 2.. are measured, each committed
        # before the next. The last one (LOAD_STEP) is loaded.
        client.save(
            job.format(cfg.world), 1, tensors, rank=rank, world_size=cfg.world
        ).committed().result()
        name = job.format(cfg.world)
        for step in range(2, LOAD_STEP + 1):
            rec.save(
                system,
                lambda s=step: client.save(name, s, tensors, rank=rank, world_size=cfg.world),
                lambda h: h.committed().result(),
                st.total_bytes,
            )
            if rank == 0:
                client.delete(name, step - 1)
        dest = st.empty_like_layout(cfg.world, rank)
        into = {n: (dest[n], boxes[n]) for n, _ in st.shapes}
        for phase in ["load_cold"] * REPS + ["load_warm"]:
            if phase == "load_cold":
                bench_common.drop_caches(cfg.data_dir)
            rec.timed(
                system,
                phase,
                lambda: client.load(job.format(cfg.world), LOAD_STEP, into=into),
                nbytes=st.total_bytes,
                io_pid=cfg.daemon_pid,
            )
            if cfg.verify:
                st.check(dest, cfg.world, rank, f"{system} {phase}")
        del dest, into
    if cfg.reshard_from is not None:
        boxes = _boxes(st, cfg.world, rank)
        dest = st.empty_like_layout(cfg.world, rank)
        into = {n: (dest[n], boxes[n]) for n, _ in st.shapes}
        for _ in range(REPS):
            bench_common.drop_caches(cfg.data_dir)
            rec.timed(
                system,
                "reshard_cold",
                lambda: client.load(job.format(cfg.reshard_from), LOAD_STEP, into=into),
                nbytes=st.total_bytes,
                io_pid=cfg.daemon_pid,
                extra={"from_world": cfg.reshard_from},
            )
            if cfg.verify:
                st.check(dest, cfg.world, rank, f"{system} reshard")
    client.close()


def _dcp_result(r: Any) -> None:
    fut = getattr(r, "upload_completion", r)
    fut.result()


def _run_dcp(rec: Recorder, st: RankState, cfg: Config, rank: int, system: str) -> None:
    """PyTorch DCP. dcp: FileSystemWriter/Reader with their defaults (one file per rank, one
    writer thread, sync_files=True), synchronous save. dcp_async: the same writer through
    dcp.async_save (thread checkpointer, default stager). ckptd_dcp: ckptd's DCP StorageWriter
    (and AsyncStager) through dcp.async_save, and its StorageReader."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

    use_ckptd = system == "ckptd_dcp"
    base = os.path.join(cfg.data_dir, system)

    def ckpt_id(world: int, step: int = 2) -> str:
        if use_ckptd:
            return f"bench/{system}-{cfg.dtype}-w{world}/step-{step}"
        return os.path.join(base, f"{cfg.dtype}-w{world}")

    def writer(world: int, step: int = 2) -> Any:
        if use_ckptd:
            from ckptd.torch import StorageWriter

            return StorageWriter(ckpt_id(world, step), socket=cfg.socket)
        return FileSystemWriter(ckpt_id(world))

    def reader(world: int) -> Any:
        if use_ckptd:
            from ckptd.torch import StorageReader

            return StorageReader(ckpt_id(world), socket=cfg.socket)
        return FileSystemReader(ckpt_id(world))

    io_pid = cfg.daemon_pid if use_ckptd else None
    if cfg.save:
        sd = _mesh_dtensors(st.local, st.shapes, cfg.world)
        if system == "dcp":
            rec.save(
                system,
                lambda: dcp.save(sd, storage_writer=writer(cfg.world)),
                lambda _: None,
                st.total_bytes,
            )
        else:
            if use_ckptd:  # a warm-up save (maps the arena), as for the native client
                _dcp_result(dcp.async_save(sd, storage_writer=writer(cfg.world, 1)))
            rec.save(
                system,
                lambda: dcp.async_save(sd, storage_writer=writer(cfg.world)),
                _dcp_result,
                st.total_bytes,
            )
        del sd
        if system != "dcp_async":  # dcp_async wrote the same files as dcp; loads are dcp's
            dest = st.empty_like_layout(cfg.world, rank)
            dsd = _mesh_dtensors(dest, st.shapes, cfg.world)
            for phase in ("load_cold", "load_warm"):
                if phase == "load_cold":
                    bench_common.drop_caches(cfg.data_dir)
                rec.timed(
                    system,
                    phase,
                    lambda: dcp.load(dsd, storage_reader=reader(cfg.world)),
                    nbytes=st.total_bytes,
                    io_pid=io_pid,
                )
                if cfg.verify:
                    st.check(dest, cfg.world, rank, f"{system} {phase}")
            del dest, dsd
    if cfg.reshard_from is not None and system != "dcp_async":
        dest = st.empty_like_layout(cfg.world, rank)
        dsd = _mesh_dtensors(dest, st.shapes, cfg.world)
        bench_common.drop_caches(cfg.data_dir)
        rec.timed(
            system,
            "reshard_cold",
            lambda: dcp.load(dsd, storage_reader=reader(cfg.reshard_from)),
            nbytes=st.total_bytes,
            io_pid=io_pid,
            extra={"from_world": cfg.reshard_from},
        )
        if cfg.verify:
            st.check(dest, cfg.world, rank, f"{system} reshard")


def _run_torch_save(rec: Recorder, st: RankState, cfg: Config, rank: int) -> None:
    """torch.save of the rank's local tensors to one file per rank, then fsync (durable);
    torch.load(weights_only=True) back. It cannot reshard."""
    import torch

    if not cfg.save:
        return
    d = os.path.join(cfg.data_dir, "torch_save", f"{cfg.dtype}-w{cfg.world}")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"rank{rank}.pt")

    def fsync(_: Any) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    rec.save("torch_save", lambda: torch.save(st.local, path), fsync, st.total_bytes)
    for phase in ("load_cold", "load_warm"):
        if phase == "load_cold":
            bench_common.drop_caches(d)
        got = rec.timed(
            "torch_save",
            phase,
            lambda: torch.load(path, weights_only=True, map_location="cpu"),
            nbytes=st.total_bytes,
        )
        if cfg.verify:
            st.check(got, cfg.world, rank, f"torch_save {phase}")
        del got


def _bcp_model(st: RankState, world: int, fill: bool) -> tuple[Any, Any, dict[str, Any]]:
    """An FSDP2 (fully_shard, rows over the ranks) module holding the workload's parameters and an
    Adam optimizer holding its exp_avg/exp_avg_sq: the same bytes as the other systems save
    (fill=True) or zeros to load into. Returns (model, optimizer, name -> local tensor)."""
    import torch
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard

    params = [(n[len("model.") :], s) for n, s in st.shapes if n.startswith("model.")]
    with torch.device("meta"):
        model = nn.Module()
        for name, shape in params:
            model.register_parameter(
                name.replace(".", "_"), nn.Parameter(torch.empty(shape, dtype=st.dtype))
            )
    mesh = init_device_mesh("cpu", (world,))
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    local: dict[str, Any] = {}
    with torch.no_grad():
        for name, shape in params:
            p = getattr(model, name.replace(".", "_"))
            p.to_local().copy_(st.local[f"model.{name}"]) if fill else p.to_local().zero_()
            local[f"model.{name}"] = p.to_local()
            state: dict[str, Any] = {"step": torch.tensor(1.0)}
            for key in ("exp_avg", "exp_avg_sq"):
                t = (
                    st.local[f"optim.{name}.{key}"]
                    if fill
                    else torch.zeros_like(st.local[f"optim.{name}.{key}"])
                )
                state[key] = DTensor.from_local(
                    t,
                    mesh,
                    [Shard(0)],
                    run_check=False,
                    shape=tuple(shape),
                    stride=tuple(_contiguous_stride(shape)),
                )
            optimizer.state[p] = state
    return model, optimizer, local


def _bcp_locals(model: Any, optimizer: Any, st: RankState) -> dict[str, Any]:
    out = {}
    for n, _ in st.shapes:
        if n.startswith("model."):
            name = n[len("model.") :]
            p = getattr(model, name.replace(".", "_"))
            out[n] = p.to_local()
            for key in ("exp_avg", "exp_avg_sq"):
                out[f"optim.{name}.{key}"] = optimizer.state[p][key].to_local()
    return out


def _run_bytecheckpoint(rec: Recorder, st: RankState, cfg: Config, rank: int) -> None:
    """ByteCheckpoint 0.0.2 (bench/peers/bytecheckpoint_peer.py states its options): an FSDP2
    model + Adam holding the same bytes, saved with fast_saving=True, loaded with
    fast_loading=True."""
    from peers import bytecheckpoint_peer as bcp

    ok, why = bcp.available()
    if not ok:
        if rank == 0:
            with open(cfg.out_file, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "system": "bytecheckpoint",
                            "phase": "unavailable",
                            "dtype": cfg.dtype,
                            "world": cfg.world,
                            "why": why,
                        }
                    )
                    + "\n"
                )
        return
    system = "bytecheckpoint"

    def path(world: int) -> str:
        return os.path.join(cfg.data_dir, system, f"{cfg.dtype}-w{world}")

    if cfg.save:
        model, opt, _ = _bcp_model(st, cfg.world, fill=True)
        bcp.save(path(cfg.world) + "-warmup", model, opt, async_save=True)  # coordinator start
        if rank == 0:
            shutil.rmtree(path(cfg.world) + "-warmup", ignore_errors=True)
        times: dict[str, float] = {}

        def stage() -> None:
            times["stall"], times["committed"] = bcp.save(
                path(cfg.world), model, opt, async_save=True
            )

        mark = rec.start()
        stage()
        rec.record(
            system,
            "save_stall",
            times["stall"],
            mark,
            nbytes=st.total_bytes,
            extra={"options": bcp.OPTIONS},
        )
        rec.record(system, "committed", times["committed"], mark, nbytes=st.total_bytes)
        del model, opt
        model, opt, _ = _bcp_model(st, cfg.world, fill=False)
        for phase in ("load_cold", "load_warm"):
            if phase == "load_cold":
                bench_common.drop_caches(path(cfg.world))
            rec.timed(
                system, phase, lambda: bcp.load(path(cfg.world), model, opt), nbytes=st.total_bytes
            )
            if cfg.verify:
                st.check(_bcp_locals(model, opt, st), cfg.world, rank, f"{system} {phase}")
        del model, opt
    if cfg.reshard_from is not None:
        model, opt, _ = _bcp_model(st, cfg.world, fill=False)
        bench_common.drop_caches(path(cfg.reshard_from))
        rec.timed(
            system,
            "reshard_cold",
            lambda: bcp.load(path(cfg.reshard_from), model, opt),
            nbytes=st.total_bytes,
            extra={"from_world": cfg.reshard_from},
        )
        if cfg.verify:
            st.check(_bcp_locals(model, opt, st), cfg.world, rank, f"{system} reshard")


def rank_main(rank: int, cfg: Config) -> None:
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(cfg.port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // cfg.world))
    dist.init_process_group("gloo", rank=rank, world_size=cfg.world)
    try:
        st = RankState(cfg, rank)
        rec = Recorder(cfg, rank)
        if rank == 0:
            print(
                f"[{cfg.dtype} world={cfg.world}] state {st.total_bytes / GB:.2f} GB, "
                f"{len(st.shapes)} tensors, reshard from {cfg.reshard_from}",
                flush=True,
            )
        if cfg.save:
            _memcpy_limit(rec, st)
        for system in cfg.systems:
            if system == "ckptd":
                _run_ckptd(rec, st, cfg, rank)
            elif system in ("dcp", "dcp_async", "ckptd_dcp"):
                _run_dcp(rec, st, cfg, rank, system)
            elif system == "torch_save":
                _run_torch_save(rec, st, cfg, rank)
            elif system == "bytecheckpoint":
                _run_bytecheckpoint(rec, st, cfg, rank)
            dist.barrier()
    finally:
        dist.destroy_process_group()


# --- driver -------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


FIO_SHAPES = [("1M", 8), ("16M", 4), ("64M", 4)]  # block size, I/Os in flight


def fio_command(path: str, rw: str, bs: str, depth: int, nbytes: int) -> list[str]:
    """fio: a sequential O_DIRECT `rw` of nbytes at `path` through io_uring, fsync at the end."""
    return [
        "fio", "--name=limit", f"--filename={path}", f"--rw={rw}", f"--bs={bs}",
        f"--iodepth={depth}", "--ioengine=io_uring", "--direct=1", f"--size={nbytes}",
        "--end_fsync=1",
    ]  # fmt: skip


def fio_limits(data_dir: str, nbytes: int, out_file: str, drop: bool, when: str) -> None:
    """Sequential O_DIRECT write (io_uring, fsync at the end) and read of a file of nbytes in the
    data directory, at each of FIO_SHAPES; the summary takes the best of them as the limit."""
    path = os.path.join(data_dir, "fio.dat")
    for rw in ("write", "read"):
        for bs, depth in FIO_SHAPES:
            os.sync()
            if drop:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("1\n")
            out = subprocess.run(
                [*fio_command(path, rw, bs, depth, nbytes), "--output-format=json"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            job = json.loads(out[out.index("{") :])["jobs"][0][rw]
            bw = job["io_bytes"] / (job["runtime"] / 1000.0)
            row = {
                "system": "limit",
                "phase": f"odirect_{rw}",
                "bytes": job["io_bytes"],
                "seconds_max": job["runtime"] / 1000.0,
                "bw_bytes_per_s": bw,
                "block": bs,
                "options": f"fio bs={bs} iodepth={depth} io_uring direct=1 end_fsync=1",
                "when": when,
            }
            with open(out_file, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(
                f"  limit         odirect_{rw:<5} bs={bs:<4} qd={depth}  {bw / GB:6.2f} GB/s",
                flush=True,
            )
    os.unlink(path)


def start_daemon(binary: str, state_dir: str, staging_bytes: int) -> subprocess.Popen[bytes]:
    sock = os.path.join(state_dir, "ckptd.sock")
    bench_common.remove_shm_at_exit(state_dir)
    log = open(os.path.join(state_dir, "ckptd.log"), "wb")  # lives as long as the daemon
    proc = subprocess.Popen(
        [
            binary,
            f"--state_dir={state_dir}",
            f"--staging_bytes_max={staging_bytes}",
            "--log_level=warn",
            # The RAM tier off: this bench's cold (and warm) loads read the disk, as its peers'
            # do; restores from the RAM tier are measured by restore_bench.py and gpu_bench.py.
            "--ram_tier_keep_per_job=0",
            *os.environ.get("BENCH_DAEMON_FLAGS", "").split(),  # e.g. an option to compare
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    for _ in range(600):
        if os.path.exists(sock):
            return proc
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"ckptd did not start; see {state_dir}/ckptd.log")


def cleanup(state: Path, sock: str, dtype: str, world: int) -> None:
    """Removes every system's checkpoints of (dtype, world) once no later run reads them."""
    import ckptd

    for sub in ("dcp", "dcp_async", "torch_save", "bytecheckpoint"):
        shutil.rmtree(state / sub / f"{dtype}-w{world}", ignore_errors=True)
    with ckptd.connect(sock) as c:
        for j in c.list():
            if j["job"].endswith(f"-{dtype}-w{world}"):
                for ck in c.list(j["job"]):
                    c.delete(j["job"], ck["step"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--state-gb", type=float, default=2.0)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--systems", default="ckptd,ckptd_dcp,dcp,dcp_async,torch_save,bytecheckpoint")
    ap.add_argument("--state-dir", default=str(ROOT / "bench" / "state"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--daemon", default=str(ROOT / "build" / "ckptd"))
    ap.add_argument("--no-verify", action="store_true")
    args = ap.parse_args()

    import torch.multiprocessing as mp

    state = Path(args.state_dir)
    shutil.rmtree(state, ignore_errors=True)
    (state / "ckptd").mkdir(parents=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = str(out_dir / "ckpt.jsonl")
    Path(out_file).unlink(missing_ok=True)
    state_bytes = int(args.state_gb * GB)
    drop = os.access("/proc/sys/vm/drop_caches", os.W_OK)
    print(f"bench: page cache dropped by {'drop_caches' if drop else 'fadvise'}", flush=True)
    fio_limits(str(state), state_bytes, out_file, drop, "start")

    # Double-buffered: room for two whole checkpoints of the node (step N+1 stages while N
    # persists), plus slack for the extents' 4 KiB rounding.
    staging = (2 * state_bytes + 512 * MiB) // 4096 * 4096
    daemon = start_daemon(args.daemon, str(state / "ckptd"), staging)
    try:
        worlds = [int(w) for w in args.worlds.split(",")]
        for dtype in args.dtypes.split(","):
            runs: list[tuple[int, int | None, bool]] = []
            prev = None
            for w in worlds:
                runs.append((w, prev, True))
                prev = w
            if len(worlds) > 1:
                runs.append((worlds[0], worlds[-1], False))  # e.g. 4 -> 1
            for world, src, save in runs:
                cfg = Config(
                    dtype=dtype,
                    world=world,
                    reshard_from=src,
                    save=save,
                    state_bytes=state_bytes,
                    data_dir=str(state),
                    socket=str(state / "ckptd" / "ckptd.sock"),
                    daemon_pid=daemon.pid,
                    port=_free_port(),
                    out_file=out_file,
                    systems=args.systems.split(","),
                    verify=not args.no_verify,
                    drop_caches=drop,
                )
                mp.start_processes(
                    rank_main, args=(cfg,), nprocs=world, join=True, start_method="spawn"
                )
                if src is not None:
                    cleanup(state, cfg.socket, dtype, src)
            cleanup(state, str(state / "ckptd" / "ckptd.sock"), dtype, worlds[-1])
        # Again at the end: the disk's speed drifts over a run; the summary takes the best.
        fio_limits(str(state), state_bytes, out_file, drop, "end")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
    with open(out_dir / "ckpt_config.json", "w") as f:
        json.dump({"args": vars(args), "staging_bytes": staging}, f)


if __name__ == "__main__":
    main()
