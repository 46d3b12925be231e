#!/usr/bin/env python3
"""Restores from ckptd's RAM tier against a memcpy of the same bytes, interleaved in one run.

Two checkpoints of the same float32 state (N tensors of [rows, cols]) are saved to one daemon:
`w1` by one rank (whole tensors) and `w4` by four ranks (each a quarter of the rows of every
tensor). Both stay hot in the RAM tier. Each round then times, in rotating order, for 1 and 4
ranks loading at once (one process per rank, started before the clock, released by a barrier):

  memcpy        each rank copies its share of the state between two pre-faulted arrays (the bar:
                "a memcpy of the state, same number of ranks copying");
  same          the ranks load the layout that was saved (1 rank: w1 whole; 4 ranks: w4, each its
                own rows);
  resharded     another layout (1 rank: w4 whole, gathered from the four row shards; 4 ranks: w4
                by column quarters, each rank touching every shard);
each of the two load paths into (a) `arena` destinations (ckptd.empty: the daemon copies from the
hot extents into them, the one copy) and (b) `numpy` arrays (the library copies out of arena
scratch: a second copy). Every load is checked against the daemon's counts: nothing read from
storage, everything copied from RAM. Beside them, `disk`: the same-layout load into arena
destinations from a second daemon with the RAM tier off (ram_tier_keep_per_job=0; O_DIRECT
reads, what every restore was before the RAM tier). The ratio of each to memcpy is recorded.

With --bound (BUILD/ckptd_bench_restore_bound), each round also times the floor of a verified
restore of each layout: the same bytes copied and checksummed per block in one pass by as many
threads as ranks, with ckptd's own kernels and nothing around them (`floor same`: contiguous
shares; `floor columns`: the 4-rank resharded case's 4 KiB runs at a 16 KiB stride). The summary
sets each load against the floor of its layout, the least any verified restore can cost here.

Usage: restore_bench.py --daemon BUILD/ckptd [--bound BUILD/ckptd_bench_restore_bound]
                        [--state-mib 1024] [--rounds 3] [--out F]
Writes one JSON row per sample to --out (bench/results/restore.jsonl by default).
"""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np
from bench_common import start_daemon

import ckptd

MIB = 1 << 20
COLS = 4096
TENSORS = 16


def targets(
    case: str, rank: int, world: int, rows: int
) -> tuple[str, list[tuple[str, Any, tuple[int, int]]]]:
    """(job, [(item, region, shape)]) that `rank` of `world` loads in `case`."""
    out = []
    for i in range(TENSORS):
        name = f"t{i:02d}"
        if case in ("same", "disk") and world == 1:
            out.append((name, None, (rows, COLS)))
        elif case in ("same", "disk"):
            r = rows // world
            out.append((name, ckptd.Box([rank * r, 0], [r, COLS]), (r, COLS)))
        elif world == 1:  # resharded: the whole tensor from four row shards
            out.append((name, None, (rows, COLS)))
        else:  # resharded: a quarter of the columns, across every row shard
            c = COLS // world
            out.append((name, ckptd.Box([0, rank * c], [rows, c]), (rows, c)))
    job = "w1" if case in ("same", "disk") and world == 1 else "w4"
    return job, out


def worker(
    sock: str, case: str, dest: str, rank: int, world: int, rows: int, barrier: Any, results: Any
) -> None:
    if case == "memcpy":
        share = TENSORS * rows * COLS // world
        src = np.ones(share, np.float32)
        dst = np.empty(share, np.float32)
        dst.fill(0)  # faulted in before the clock, as the load destinations are
        barrier.wait()
        t0 = time.monotonic()
        np.copyto(dst, src)
        results.put((rank, t0, time.monotonic(), 0, share * 4))
        return
    client = ckptd.connect(sock)
    client.release(client.stage([np.zeros(1024, np.float32)]))  # the arena mapped before the clock
    job, want = targets(case, rank, world, rows)
    specs = []
    for name, region, shape in want:
        a = client.empty(shape, np.float32) if dest == "arena" else np.empty(shape, np.float32)
        a.fill(0)
        specs.append((name, region, a))
    barrier.wait()
    t0 = time.monotonic()
    result = client.load(job, 1, {n: (a if r is None else (a, r)) for n, r, a in specs})
    t1 = time.monotonic()
    results.put((rank, t0, t1, result.bytes_read, result.bytes_from_ram))
    # Sessions end only once every rank has loaded: a finished rank's teardown (the daemon unmaps
    # its registered destinations) is not restore work, and a trainer keeps its session anyway.
    barrier.wait(timeout=600)
    client.close()


def run_case(sock: str, case: str, dest: str, world: int, rows: int) -> tuple[float, int, int]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(world)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(sock, case, dest, r, world, rows, barrier, results))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit(f"restore_bench: a {case} worker failed")
    seconds = max(g[2] for g in got) - min(g[1] for g in got)
    return seconds, sum(g[3] for g in got), sum(g[4] for g in got)


def run_floor(bound: str, layout: str, world: int, state_mib: int) -> float:
    """Seconds of the floor of a verified restore of `layout` by `world` threads."""
    out = subprocess.run(
        [bound, "--threads", str(world), "--mib", str(state_mib), "--layouts", layout],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return float(json.loads(out.splitlines()[-1])["seconds"])


def floor_of(case: str, world: int) -> str:
    """The floor layout a load `case` of `world` ranks is set against."""
    return "columns" if case == "resharded" and world > 1 else "same"


def save_both(client: ckptd.Client, full: dict[str, Any], rows: int) -> None:
    """w1 saved by one rank, w4 by four (a quarter of the rows of every tensor each)."""
    client.save("w1", 1, full).committed().result()
    q = rows // 4
    handles = [
        client.save(
            "w4",
            1,
            {
                n: ckptd.Shard(t[r * q : (r + 1) * q], t.shape, ckptd.Box([r * q, 0], [q, COLS]))
                for n, t in full.items()
            },
            rank=r,
            world_size=4,
        )
        for r in range(4)
    ]
    for h in handles:
        h.committed().result()


CASES = [(c, d) for c in ("same", "resharded") for d in ("arena", "numpy")] + [("disk", "arena")]


def median_range(rows: list[dict[str, Any]], key: str) -> str:
    ratios = sorted(r[key] for r in rows)
    return f"{ratios[len(ratios) // 2]:.2f}x (range {ratios[0]:.2f}-{ratios[-1]:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--dir", default=None, help="state dir (default: a temporary one under bench/)")
    ap.add_argument("--bound", default=None, help="ckptd_bench_restore_bound: time the floor too")
    ap.add_argument("--state-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--worlds", default="1,4", help="ranks loading at once, comma-separated")
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "restore.jsonl")
    )
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    rows = args.state_mib * MIB // (TENSORS * COLS * 4)
    rows -= rows % 4
    state_bytes = TENSORS * rows * COLS * 4
    base = args.dir or tempfile.mkdtemp(prefix="restore-", dir=os.path.dirname(__file__))
    state = os.path.join(base, "state")
    shutil.rmtree(state, ignore_errors=True)
    os.makedirs(state)
    # Both checkpoints hot, plus room for the destinations and scratch of four loaders.
    proc, sock = start_daemon(args.daemon, state, 4 * state_bytes)
    # The RAM tier off: loads read the disk (O_DIRECT), as every restore did before it.
    disk_state = os.path.join(base, "disk")
    os.makedirs(disk_state, exist_ok=True)
    disk, disk_sock = start_daemon(
        args.daemon, disk_state, 2 * state_bytes, ("--ram_tier_keep_per_job=0",)
    )
    samples = []
    try:
        client = ckptd.connect(sock)
        rng = np.random.default_rng(3)
        full = {f"t{i:02d}": rng.random((rows, COLS), dtype=np.float32) for i in range(TENSORS)}
        save_both(client, full, rows)
        disk_client = ckptd.connect(disk_sock)
        save_both(disk_client, full, rows)
        disk_client.close()
        for job in ("w1", "w4"):
            tiers = client.status(job, 1)["tiers"]
            if not tiers.get("ram"):
                sys.exit(f"restore_bench: {job}/1 is not in the RAM tier: {tiers}")
        # Correctness once, outside the clock: a resharded load is bit-exact.
        got = client.load("w4", 1, items=["t00"]).tensors["t00"]
        if not np.array_equal(got, full["t00"]):
            sys.exit("restore_bench: w4/1 t00 does not load bit-exact")
        client.close()
        del full
        for r in range(args.rounds):
            for world in worlds:
                floors = [("floor", "same")] + ([("floor", "columns")] if world > 1 else [])
                order = [("memcpy", "-"), *CASES, *(floors if args.bound else [])]
                order = order[r % len(order) :] + order[: r % len(order)]
                times = {}
                for case, dest in order:
                    if case == "floor":
                        times[(case, dest)] = run_floor(args.bound, dest, world, args.state_mib)
                        continue
                    at = disk_sock if case == "disk" else sock
                    s, read, ram = run_case(at, case, dest, world, rows)
                    times[(case, dest)] = s
                    if case == "disk" and (ram != 0 or read < state_bytes):
                        sys.exit(f"restore_bench: disk x{world} read {read}, {ram} from RAM")
                    if case in ("same", "resharded") and (read != 0 or ram < state_bytes):
                        sys.exit(
                            f"restore_bench: {case}/{dest} x{world} read {read} bytes from "
                            f"storage, {ram} from RAM (want 0 and {state_bytes})"
                        )
                base_s = times[("memcpy", "-")]
                for (case, dest), s in times.items():
                    floor_s = times.get(("floor", floor_of(case, world)))
                    row = dict(
                        round=r,
                        world=world,
                        case=case,
                        dest=dest,
                        seconds=s,
                        state_bytes=state_bytes,
                        gbps=state_bytes / s / 1e9,
                        vs_memcpy=s / base_s,
                    )
                    if floor_s is not None and case in ("same", "resharded"):
                        row["vs_floor"] = s / floor_s
                    samples.append(row)
                    print(
                        f"round {r} x{world} {case:9s} {dest:5s}: {s:.3f} s "
                        f"({row['gbps']:.2f} GB/s) {row['vs_memcpy']:.2f}x memcpy"
                        + (f", {row['vs_floor']:.2f}x floor" if "vs_floor" in row else ""),
                        flush=True,
                    )
    finally:
        for p in (proc, disk):
            p.terminate()
            p.wait(timeout=60)
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print("median ratio to memcpy (same number of ranks copying), and to the floor of its layout:")
    for world in worlds:
        shown = CASES + ([("floor", "same"), ("floor", "columns")] if args.bound else [])
        for case, dest in shown:
            want = (world, case, dest)
            rows_of = [s for s in samples if (s["world"], s["case"], s["dest"]) == want]
            if not rows_of:
                continue
            line = f"  x{world} {case:9s} {dest:7s}: {median_range(rows_of, 'vs_memcpy')} memcpy"
            if "vs_floor" in rows_of[0]:
                line += f", {median_range(rows_of, 'vs_floor')} floor ({floor_of(case, world)})"
            print(line)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
