"""Coordination cost of a DCP save and load on one rank, at up to 10,000 simulated ranks.

What runs where in dcp.save / dcp.load (torch 2.13, state_dict_saver.py / state_dict_loader.py),
with DCP's FileSystemWriter/Reader ("dcp") and with ckptd.torch's StorageWriter/Reader
("ckptd"; TorchTitan, HF Trainer, Accelerate and Megatron's ckptd strategy go through these):

  save  every rank: planner.set_up_planner + create_local_plan + writer.prepare_local_plan;
        gather_object of every local plan to the coordinator (rank 0); there:
        planner.create_global_plan(N plans) (dedup, Metadata of every chunk, validation) and
        writer.prepare_global_plan; scatter_object of one plan per rank; every rank writes; then
        gather_object of every rank's WriteResults to rank 0, writer.finish(metadata, results)
        there, and broadcast_object of the Metadata to every rank (dcp.save returns it).
  load  every rank: reader.read_metadata + planner.set_up_planner + create_local_plan;
        gather_object of the N load plans to rank 0, planner.create_global_plan (identity in
        DefaultLoadPlanner) + reader.prepare_global_plan, scatter; every rank reads; then
        all_gather_object of every rank's (None) result.

ckptd keeps DCP's DefaultSavePlanner and DefaultLoadPlanner and only replaces the storage layer,
so the gathers, the coordinator's create_global_plan and the closing broadcast all stay; what
changes is the writer's prepare_global_plan, the WriteResults, finish() (a wait for the daemon's
COMMITTED instead of writing .metadata) and, on load, the Metadata every rank plans against (one
chunk per tensor from the daemon's manifest, so the resharding match runs in the daemon).
"ckptd_local" is ckptd.torch with dcp.save(..., use_collectives=False): every rank plans alone
(create_global_plan over its own plan), no gather, each rank's shards a checkpoint of its own;
its load (StorageReader.read_metadata() over the N parts) is measured with the same stub.
"ckptd_planless" is what ckptd.torch.save runs: the real dcp.save(..., storage_writer=ckptd's,
planner=ckptd.torch.LocalPlanner(), no_dist=True) on rank 1 and on rank 0, each planning its own
items (the replicated non-tensor value on rank 0 only) and saving them as rank r of N of the one
checkpoint through the stub; no collective runs, so there is no coordinator step (rank 0's
column is its own save). Its checkpoint loads like "ckptd" (one manifest), so it has no load row.

Nothing is distributed here: one process plays each role. The world is torch's "fake" process
group (torch.testing's FakeStore) at world size N, so the DTensors (FSDP-style Shard(0)) and
DCP's planners see rank r of N exactly as on a real rank. Local plans are built by DCP for ranks
0, 1 and N-1; the other N-3 are rank 1's plan with its offsets moved to rank r (checked equal
to DCP's own plan for rank N-1). Gathers and scatters are costed as what they pickle and
unpickle (dist.gather_object pickles each object once and unpickles it on the receiver); the
network time is not. ckptd's client is a stub (no daemon): its calls are counted, and the
daemon's side of the commit is measured by bench/cluster_merge_bench.cc.

Times are CPU seconds of this process (time.process_time): per-rank steps the median of --reps,
the coordinator's steps one run per world size. Writes one JSON object per (world size, path,
direction) to --out; --report FILE prints the tables from such a file.

Usage: python3 bench/planning_scale_bench.py [--worlds 16,128,1000,10000] [--tensors 16]
           [--rows 8] [--cols 1024] [--reps 5] [--out bench/results/planning_scale.jsonl]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import pickle
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, Metadata
from torch.distributed.checkpoint.planner import SavePlan, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore

import ckptd
import ckptd.torch as ckt
from ckptd.torch import _ids
from ckptd.torch._storage import _index_key, _write_results

JOB_ID = "bench/planning/step-1"


def cpu(fn: Callable[[], Any]) -> tuple[Any, float]:
    """(fn(), CPU milliseconds of this process). The cyclic GC stays on: the coordinator
    allocates what it gathers, as it would on a real rank 0."""
    t = time.process_time()
    out = fn()
    return out, (time.process_time() - t) * 1e3


def per_rank(fn: Callable[[], Any], reps: int) -> tuple[Any, float]:
    """(fn(), median CPU ms over reps), the cyclic GC off: this process holds every rank's
    plans, whose collection a real non-coordinator rank would not pay for."""
    runs = []
    gc.disable()
    try:
        for _ in range(reps):
            runs.append(cpu(fn))
    finally:
        gc.enable()
    return runs[-1][0], statistics.median(ms for _, ms in runs)


# --- the simulated world ----------------------------------------------------------------------
def world(n: int, rank: int, tensors: int, rows: int, cols: int) -> dict[str, Any]:
    """Rank `rank` of `n`'s state dict: `tensors` FSDP-style Shard(0) DTensors of global shape
    (rows * n, cols) float32 (rows x cols on each rank) and one non-tensor value."""
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=n)
    mesh = init_device_mesh("cpu", (n,))
    shape = torch.Size([rows * n, cols])
    model = {
        f"layers.{i}.weight": DTensor.from_local(
            torch.zeros(rows, cols),
            mesh,
            [Shard(0)],
            run_check=False,
            shape=shape,
            stride=(cols, 1),
        )
        for i in range(tensors)
    }
    return {"model": model, "step": 100}


def save_local(sd: dict[str, Any], writer: Any, rank: int) -> tuple[DefaultSavePlanner, SavePlan]:
    planner = DefaultSavePlanner()
    planner.set_up_planner(sd, storage_meta=writer.storage_meta(), is_coordinator=rank == 0)
    writer.set_up_storage_writer(rank == 0, rank=rank, use_collectives=True)
    return planner, writer.prepare_local_plan(planner.create_local_plan())


def moved(plan: SavePlan, rank: int, rows: int) -> SavePlan:
    """Rank 1's local plan as rank `rank` makes it: each shard's row offset moved."""
    items = []
    for it in plan.items:
        if it.type == WriteItemType.SHARD and it.tensor_data is not None:
            off = torch.Size([rank * rows, *it.tensor_data.chunk.offsets[1:]])
            chunk = ChunkStorageMetadata(offsets=off, sizes=it.tensor_data.chunk.sizes)
            it = dataclasses.replace(
                it,
                index=dataclasses.replace(it.index, offset=off),
                tensor_data=dataclasses.replace(it.tensor_data, chunk=chunk),
            )
        items.append(it)
    return dataclasses.replace(plan, items=items)


class StubClient:
    """ckptd.Client's calls the writer and reader make, answered from memory and counted."""

    def __init__(
        self, tensors: dict[str, list[int]], mappings: Any, parts: int = 0, rows: int = 0
    ) -> None:
        self.tensors, self.mappings, self.parts, self.rows = tensors, mappings, parts, rows
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def wait(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self._count("wait")
        return {"state": "COMMITTED"}

    def _job(self) -> str:
        return _ids.parse(JOB_ID).job

    def inspect(self, job: str, step: int) -> list[dict[str, Any]]:
        self._count("inspect")
        if self.parts and job == self._job():
            raise ckptd.NotFoundError(f"job {job} step {step}: no such checkpoint")
        out = [
            {"name": "step", "kind": "object"},
            {"name": _ids.PLANNER_DATA_ITEM, "kind": "object"},
        ]
        for name, shape in self.tensors.items():
            if self.parts:  # a part holds its chunk as the whole item
                shape = [self.rows, *shape[1:]]
            out.append({"name": name, "kind": "tensor", "shape": shape, "dtype": "float32"})
        return out

    def load_object(self, job: str, step: int, name: str, **kwargs: Any) -> Any:
        self._count("load_object")
        if name == _ids.PLANNER_DATA_ITEM:
            return self.mappings
        rank = _ids.part_rank(self._job(), job)
        assert name == _ids.DCP_CHUNKS_ITEM and rank is not None
        return {
            n: {"size": s, "chunks": [([rank * self.rows, 0], [self.rows, *s[1:]])]}
            for n, s in self.tensors.items()
        }

    def list(self, job: str | None = None) -> list[dict[str, Any]]:
        self._count("list")
        return [{"job": _ids.part_job(self._job(), r)} for r in range(self.parts)]

    def status(self, job: str, step: int) -> dict[str, Any]:
        self._count("status")
        return {"state": "COMMITTED"}

    def save(self, job: str, step: int, tensors: Any, objects: Any, **kwargs: Any) -> None:
        self._count("save")
        self.saved_items = len(tensors) + len(objects)


def ckptd_writer(stub: StubClient) -> ckt.StorageWriter:
    w = ckt.StorageWriter(JOB_ID)
    w._client = stub  # type: ignore[assignment]
    return w


# --- save -------------------------------------------------------------------------------------
def save_side(n: int, args: argparse.Namespace, tmp: str) -> list[dict[str, Any]]:
    sd_last = world(n, n - 1, args.tensors, args.rows, args.cols)
    _, plan_last = save_local(sd_last, FileSystemWriter(os.path.join(tmp, "x")), n - 1)
    out = [save_one(n, args, tmp, path, plan_last) for path in ("dcp", "ckptd")]
    out.append(save_rank_local(n, args))
    out.append(save_planless(n, args))
    return out


def save_one(
    n: int, args: argparse.Namespace, tmp: str, path: str, plan_last: SavePlan
) -> dict[str, Any]:
    """One save at world size n through `path`'s writer: rank 1's steps and the coordinator's."""
    t, rows, cols, reps = args.tensors, args.rows, args.cols, args.reps
    fs_dir = os.path.join(tmp, f"dcp-{n}")
    stub = StubClient({}, None)

    def make_writer() -> Any:
        return FileSystemWriter(fs_dir) if path == "dcp" else ckptd_writer(stub)

    # The coordinator's own local plan (it is a rank too), then rank 1's, timed.
    sd0 = world(n, 0, t, rows, cols)
    planner0, plan0 = save_local(sd0, make_writer(), 0)
    writer0 = make_writer()
    writer0.set_up_storage_writer(True, rank=0, use_collectives=True)
    sd1 = world(n, 1, t, rows, cols)
    (_, plan1), local_ms = per_rank(lambda: save_local(sd1, make_writer(), 1), reps)
    plan1_blob, pickle_ms = per_rank(lambda: pickle.dumps(plan1), reps)
    assert moved(plan1, n - 1, rows) == plan_last, "a moved plan differs from DCP's own"
    plans = [plan0, plan1] + [moved(plan1, r, rows) for r in range(2, n)]
    blobs = [pickle.dumps(p) for p in plans]
    gather_bytes = sum(len(b) for b in blobs)
    received, c_unpickle = cpu(lambda: [pickle.loads(b) for b in blobs])
    (central, metadata), c_global = cpu(lambda: planner0.create_global_plan(received))
    central, c_prepare = cpu(lambda: writer0.prepare_global_plan(central))
    scattered, c_scatter = cpu(lambda: [pickle.dumps(p) for p in central])
    mine = scattered[1]
    _, r_unpickle_plan = per_rank(lambda: pickle.loads(mine), reps)

    def results(r: int, plan: SavePlan) -> list[WriteResult]:
        if path == "ckptd":
            sizes = {_index_key(i.index): rows * cols * 4 for i in plan.items}
            return _write_results(plan.items, sizes)
        return [
            WriteResult(
                index=i.index,
                size_in_bytes=rows * cols * 4,
                storage_data=_StorageInfo(f"__{r}_0.distcp", k * rows * cols * 4, rows * cols * 4),
            )
            for k, i in enumerate(plan.items)
        ]

    all_results = [results(r, p) for r, p in enumerate(central)]
    rblobs = [pickle.dumps(x) for x in all_results]
    results_bytes = len(rblobs[1])
    got, c_results = cpu(lambda: [pickle.loads(b) for b in rblobs])
    _, c_finish = cpu(lambda: writer0.finish(metadata, got))
    meta_file = os.path.join(fs_dir, ".metadata")
    file_bytes = os.path.getsize(meta_file) if path == "dcp" else 0
    bcast, c_bcast = cpu(lambda: pickle.dumps(metadata))
    _, r_unpickle_md = per_rank(lambda: pickle.loads(bcast), reps)
    rank_ms = local_ms + pickle_ms + r_unpickle_plan + r_unpickle_md
    # The coordinator is a rank too: its own steps plus the gathered ones.
    coord = c_unpickle + c_global + c_prepare + c_scatter + c_results + c_finish + c_bcast
    coord += local_ms + pickle_ms
    row = {
        "bench": "planning_scale",
        "direction": "save",
        "path": path,
        "world": n,
        "tensors": t,
        "rows": rows,
        "cols": cols,
        "rank_local_plan_ms": local_ms,
        "rank_pickle_plan_ms": pickle_ms,
        "rank_plan_bytes": len(plan1_blob),
        "rank_central_plan_bytes": len(mine),
        "rank_unpickle_central_ms": r_unpickle_plan,
        "rank_results_bytes": results_bytes,
        "rank_metadata_bytes": len(bcast),
        "rank_unpickle_metadata_ms": r_unpickle_md,
        "rank_total_ms": rank_ms,
        "coord_gather_bytes": gather_bytes,
        "coord_unpickle_plans_ms": c_unpickle,
        "coord_create_global_plan_ms": c_global,
        "coord_prepare_global_plan_ms": c_prepare,
        "coord_scatter_pickle_ms": c_scatter,
        "coord_unpickle_results_ms": c_results,
        "coord_finish_ms": c_finish,
        "coord_bcast_pickle_ms": c_bcast,
        "coord_total_ms": coord,
        "metadata_file_bytes": file_bytes,
        "client_calls": dict(stub.calls),
        "metadata_chunks": sum(
            len(getattr(v, "chunks", [])) for v in metadata.state_dict_metadata.values()
        ),
    }
    print(json.dumps(row), flush=True)
    return row


def save_rank_local(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """ckptd.torch with use_collectives=False: what dcp.save runs on rank 1, alone."""
    sd1 = world(n, 1, args.tensors, args.rows, args.cols)
    stub = StubClient({}, None)

    def alone() -> Any:
        w = ckptd_writer(stub)
        planner = DefaultSavePlanner()
        planner.set_up_planner(sd1, storage_meta=w.storage_meta(), is_coordinator=False)
        w.set_up_storage_writer(False, rank=1, use_collectives=False)
        plan = w.prepare_local_plan(planner.create_local_plan())
        plans, md = planner.create_global_plan([plan])
        plans = w.prepare_global_plan(plans)
        plan = planner.finish_plan(plans[0])
        results = _write_results(plan.items, {})
        w.finish(md, [results])
        return md

    md, ms = per_rank(alone, args.reps)
    row = {
        "bench": "planning_scale",
        "direction": "save",
        "path": "ckptd_local",
        "world": n,
        "tensors": args.tensors,
        "rows": args.rows,
        "cols": args.cols,
        "rank_total_ms": ms,
        "rank_local_plan_ms": ms,
        "rank_metadata_bytes": len(pickle.dumps(md)),
        "coord_total_ms": 0.0,
        "coord_gather_bytes": 0,
    }
    print(json.dumps(row), flush=True)
    return row


def save_planless(n: int, args: argparse.Namespace) -> dict[str, Any]:
    """ckptd.torch.save's path: the real dcp.save with LocalPlanner and no_dist=True, on rank 1
    and on rank 0 of n (rank 0 also writes the replicated non-tensor value)."""
    out: dict[int, tuple[Any, float, StubClient]] = {}
    for rank in (1, 0):
        sd = world(n, rank, args.tensors, args.rows, args.cols)
        stub = StubClient({}, None)

        def alone(sd: dict[str, Any] = sd, stub: StubClient = stub) -> Any:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no_dist's "assuming a single process"
                return dcp.save(
                    sd, storage_writer=ckptd_writer(stub), planner=ckt.LocalPlanner(), no_dist=True
                )

        md, ms = per_rank(alone, args.reps)
        out[rank] = (md, ms, stub)
    md1, ms1, stub1 = out[1]
    md0, ms0, stub0 = out[0]
    row = {
        "bench": "planning_scale",
        "direction": "save",
        "path": "ckptd_planless",
        "world": n,
        "tensors": args.tensors,
        "rows": args.rows,
        "cols": args.cols,
        "rank_total_ms": ms1,
        "rank_local_plan_ms": ms1,
        "rank_metadata_bytes": 0,  # nothing received: no collective
        "rank_returned_metadata_bytes": len(pickle.dumps(md1)),
        "rank_saved_items": stub1.saved_items,
        "rank0_total_ms": ms0,
        "rank0_saved_items": stub0.saved_items,
        "rank0_returned_metadata_bytes": len(pickle.dumps(md0)),
        "coord_total_ms": ms0,  # no coordinator: rank 0's own save, the busiest rank's
        "coord_gather_bytes": 0,
        "client_calls": {k: v // args.reps for k, v in stub1.calls.items()},
    }
    print(json.dumps(row), flush=True)
    return row


# --- load -------------------------------------------------------------------------------------
def load_side(n: int, args: argparse.Namespace, tmp: str) -> list[dict[str, Any]]:
    sd1 = world(n, 1, args.tensors, args.rows, args.cols)
    paths = ("dcp", "ckptd", "ckptd_local", "ckptd_planless")
    if not os.path.isdir(os.path.join(tmp, f"dcp-{n}")):  # --directions load: no DCP save made
        paths = paths[1:]
    return [load_one(n, args, tmp, path, sd1) for path in paths]


def load_one(
    n: int, args: argparse.Namespace, tmp: str, path: str, sd1: dict[str, Any]
) -> dict[str, Any]:
    """One load at world size n through `path`'s reader: rank 1's steps and the coordinator's."""
    t, rows, cols, reps = args.tensors, args.rows, args.cols, args.reps
    shapes = {f"model.layers.{i}.weight": [rows * n, cols] for i in range(t)}
    mappings: dict[str, Any] = {k: ("model", k.split(".", 1)[1]) for k in shapes}
    mappings["step"] = ("step",)
    stub = StubClient(shapes, mappings, parts=n if path == "ckptd_local" else 0, rows=rows)

    def make_reader() -> Any:
        if path == "dcp":
            return FileSystemReader(os.path.join(tmp, f"dcp-{n}"))
        r = ckt.StorageReader(JOB_ID)
        r._client = stub  # type: ignore[assignment]
        return r

    def read_md() -> tuple[Any, Metadata]:
        reader = make_reader()
        return reader, reader.read_metadata()

    (reader, md), md_ms = per_rank(read_md, reps)
    stub.calls.clear()
    read_md()
    calls = dict(stub.calls)

    def plan_local() -> Any:
        planner = DefaultLoadPlanner()
        planner.set_up_planner({"model": dict(sd1["model"]), "step": 0}, md, False)
        reader.set_up_storage_reader(md, False, rank=1, use_collectives=True)
        return reader.prepare_local_plan(planner.create_local_plan())

    plan1, local_ms = per_rank(plan_local, reps)
    blob = pickle.dumps(plan1)
    row: dict[str, Any] = {
        "bench": "planning_scale",
        "direction": "load",
        "path": path,
        "world": n,
        "tensors": t,
        "rows": rows,
        "cols": cols,
        "rank_read_metadata_ms": md_ms,
        "rank_metadata_bytes": len(pickle.dumps(md)),
        "rank_local_plan_ms": local_ms,
        "rank_plan_bytes": len(blob),
        "rank_read_items": len(plan1.items),
        "client_calls": calls,
        "metadata_chunks": sum(
            len(getattr(v, "chunks", [])) for v in md.state_dict_metadata.values()
        ),
    }
    if path in ("ckptd_local", "ckptd_planless"):
        # ckptd_local: DCP's use_collectives=False load (rank-local parts; no gather, a barrier).
        # ckptd_planless: ckptd.torch.load's dcp.load(..., no_dist=True) of the one manifest:
        # each rank plans against the whole Metadata and reads its own part; no gather, no
        # scatter, no closing all_gather.
        row.update(rank_total_ms=md_ms + local_ms, coord_total_ms=0.0, coord_gather_bytes=0)
        print(json.dumps(row), flush=True)
        return row
    # The coordinator receives N plans of this size and shape (rank 1's, N times: the others
    # differ only in offsets), returns them (identity) and scatters them.
    blobs = [blob] * n
    got, c_unpickle = cpu(lambda: [pickle.loads(b) for b in blobs])
    lp = DefaultLoadPlanner()
    central, c_global = cpu(lambda: reader.prepare_global_plan(lp.create_global_plan(got)))
    _, c_scatter = cpu(lambda: [pickle.dumps(p) for p in central])
    # The closing all_gather_object("read"): every rank receives N results (None).
    nones = [pickle.dumps(None)] * n
    _, ag_ms = per_rank(lambda: [pickle.loads(b) for b in nones], reps)
    rank_ms = md_ms + local_ms + ag_ms
    row.update(
        rank_allgather_ms=ag_ms,
        rank_total_ms=rank_ms,
        coord_gather_bytes=len(blob) * n,
        coord_unpickle_plans_ms=c_unpickle,
        coord_create_global_plan_ms=c_global,
        coord_scatter_pickle_ms=c_scatter,
        coord_total_ms=c_unpickle + c_global + c_scatter + rank_ms,
    )
    print(json.dumps(row), flush=True)
    return row


# --- report -----------------------------------------------------------------------------------
def report(rows: list[dict[str, Any]]) -> None:
    def growth(d: str, p: str, key: str, a: int = 1000, b: int = 10000) -> str:
        x = [r for r in rows if (r["direction"], r["path"], r["world"]) == (d, p, a)]
        y = [r for r in rows if (r["direction"], r["path"], r["world"]) == (d, p, b)]
        if not x or not y or not x[0].get(key):
            return "—"
        return f"{y[0][key] / x[0][key]:.1f}x"

    print(
        "| direction | path | N | rank CPU ms | rank receives (bytes) | coordinator CPU ms "
        "| coordinator receives (bytes) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        recv = r.get("rank_metadata_bytes", 0)  # the Metadata broadcast / read on every rank
        print(
            f"| {r['direction']} | {r['path']} | {r['world']:,} | {r['rank_total_ms']:.2f} "
            f"| {recv:,} | {r['coord_total_ms']:.1f} | {r.get('coord_gather_bytes', 0):,} |"
        )
    print()
    print("Growth N = 1,000 → 10,000 (rank total / coordinator total):")
    for d, p in sorted({(r["direction"], r["path"]) for r in rows}):
        print(
            f"- {d} {p}: rank {growth(d, p, 'rank_total_ms')}, "
            f"coordinator {growth(d, p, 'coord_total_ms')}"
        )
    print()
    keys = sorted({k for r in rows for k in r if k.endswith("_ms") or k.endswith("_bytes")})
    print("| direction | path | N | " + " | ".join(keys) + " |")
    print("|---" * (3 + len(keys)) + "|")
    for r in rows:
        vals = []
        for k in keys:
            v = r.get(k)
            vals.append("" if v is None else (f"{v:.2f}" if isinstance(v, float) else f"{v:,}"))
        print(f"| {r['direction']} | {r['path']} | {r['world']:,} | " + " | ".join(vals) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", default="16,128,1000,10000")
    ap.add_argument("--tensors", type=int, default=16, help="sharded tensors per rank")
    ap.add_argument("--rows", type=int, default=8, help="rows of each tensor per rank")
    ap.add_argument("--cols", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=5, help="repetitions of each per-rank step")
    ap.add_argument("--out", default="bench/results/planning_scale.jsonl")
    ap.add_argument("--report", metavar="FILE", help="print the tables of a results file")
    ap.add_argument("--directions", default="save,load", help="save, load or both")
    args = ap.parse_args()
    if args.report:
        with open(args.report) as f:
            report([json.loads(line) for line in f if line.strip()])
        return
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="ckptd-planning-")
    rows: list[dict[str, Any]] = []
    start = time.process_time()
    try:
        for n in (int(x) for x in args.worlds.split(",")):
            if "save" in args.directions:
                rows += save_side(n, args, tmp)
            if "load" in args.directions:
                rows += load_side(n, args, tmp)
            shutil.rmtree(os.path.join(tmp, f"dcp-{n}"), ignore_errors=True)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)
    with open(args.out, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"planning_scale: {time.process_time() - start:.1f} CPU s in all", file=sys.stderr)
    report(rows)


if __name__ == "__main__":
    main()
