#!/usr/bin/env python3
"""Replicated restores: four local ranks loading the same checkpoint at once, and what the device
reads for them, interleaved in one run.

One float32 state (16 tensors of [rows, 4096]) is saved by one rank to four daemons: one with the
RAM tier on (the default), three with it off and load_io = direct, buffered and auto. Then four
ranks (one process each, connected and destinations allocated before a barrier starts the clock)
each load the whole state into plain numpy arrays — data-parallel ranks restoring the same
replicated parameters. Cases, in rotating order each round, the page cache dropped before each
group:

  hint          the RAM tier on, the step not hot; the loads carry the prefetch hint (the first
                rank's load reads the checkpoint into the RAM tier once, the others wait for it,
                all copy from memory);
  hot           right after `hint`: the same load again, now hot (a RAM-tier restore);
  direct        the tier off, load_io = direct: every rank reads the device (O_DIRECT);
  buffered      the tier off, load_io = buffered: through the page cache (read once if the ranks
                keep together);
  auto          the tier off, load_io = auto (the default), the page cache cold: as direct;
  auto_warm     the tier off, load_io = auto, the blobs read through the page cache before the
                clock (what a copy tool or a buffered reader leaves behind): auto copies them out
                of the cache;
  direct_warm   the same with load_io = direct: O_DIRECT reads the device whatever is cached.

Reported per case: seconds (barrier to the last rank's end), the daemon's device reads
(/proc/PID/io read_bytes) against the state's size, and the counts the loads answered. Every
rank's tensors are checked against the state in the first round.

Usage: replicated_restore_bench.py --daemon BUILD/ckptd [--state-mib 1024] [--rounds 3] [--out F]
Writes one JSON row per sample to --out (bench/results/replicated.jsonl by default).
"""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import time
from typing import Any

import numpy as np
from bench_common import device_read_bytes, drop_caches, median, read_through_cache, start_daemon

import ckptd

MIB = 1 << 20
COLS = 4096
TENSORS = 16
RANKS = 4
JOB = "rep"


def state_dict(rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(11)
    return {f"t{i:02d}": rng.random((rows, COLS), dtype=np.float32) for i in range(TENSORS)}


def worker(
    sock: str, step: int, rows: int, prefetch: bool, check: bool, barrier: Any, results: Any
) -> None:
    client = ckptd.connect(sock)
    client.release(client.stage([np.zeros(1024, np.float32)]))  # the arena mapped before the clock
    dest = {f"t{i:02d}": np.empty((rows, COLS), np.float32) for i in range(TENSORS)}
    for a in dest.values():
        a.fill(0)  # faulted in before the clock
    barrier.wait()
    t0 = time.monotonic()
    r = client.load(JOB, step, dest, prefetch=prefetch)
    t1 = time.monotonic()
    ok = True
    if check:
        want = state_dict(rows)
        ok = all(np.array_equal(dest[k], want[k]) for k in want)
    results.put((t0, t1, r.bytes_read, r.bytes_from_ram, r.bytes_prefetched, ok))
    client.close()


def run_case(
    sock: str, pid: int, step: int, rows: int, prefetch: bool, check: bool
) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(RANKS)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(sock, step, rows, prefetch, check, barrier, results))
        for _ in range(RANKS)
    ]
    for p in procs:
        p.start()
    before = device_read_bytes(pid)
    got = [results.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            sys.exit("replicated_restore_bench: a worker failed")
    if not all(g[5] for g in got):
        sys.exit("replicated_restore_bench: a rank's tensors differ from the state saved")
    return dict(
        seconds=max(g[1] for g in got) - min(g[0] for g in got),
        device_bytes=device_read_bytes(pid) - before,
        bytes_read=sum(g[2] for g in got),
        bytes_from_ram=sum(g[3] for g in got),
        bytes_prefetched=sum(g[4] for g in got),
    )


GROUPS = [("hint", "hot"), ("direct",), ("buffered",), ("auto",), ("auto_warm",), ("direct_warm",)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--dir", default=None, help="state dirs (default: a temporary one in bench/)")
    ap.add_argument("--state-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "replicated.jsonl")
    )
    args = ap.parse_args()
    rows = args.state_mib * MIB // (TENSORS * COLS * 4)
    state_bytes = TENSORS * rows * COLS * 4
    base = args.dir or tempfile.mkdtemp(prefix="replicated-", dir=os.path.dirname(__file__))
    scratch = RANKS * 256 * MIB  # four loaders' arena scratch (two 128 MiB batches each)
    daemons: dict[str, tuple[Any, str, str]] = {}  # name -> (process, socket, state dir)
    flags = {
        "tier": (),
        "direct": ("--ram_tier_keep_per_job=0", "--load_io=direct"),
        "buffered": ("--ram_tier_keep_per_job=0", "--load_io=buffered"),
        "auto": ("--ram_tier_keep_per_job=0", "--load_io=auto"),
    }
    samples = []
    try:
        for name, extra in flags.items():
            state = os.path.join(base, name)
            shutil.rmtree(state, ignore_errors=True)
            os.makedirs(state)
            staging = (2 * state_bytes if name == "tier" else 0) + scratch + 64 * MIB
            staging -= staging % 4096
            proc, sock = start_daemon(args.daemon, state, staging, extra)
            daemons[name] = (proc, sock, state)
        sd = state_dict(rows)
        # The tier daemon: steps 1..rounds+1, so each round's `hint` finds its step cold (only
        # the newest is hot); the others: step 1.
        for name, (_, sock, _) in daemons.items():
            with ckptd.connect(sock) as c:
                for step in range(1, args.rounds + 2 if name == "tier" else 2):
                    c.save(JOB, step, sd).committed().result()
        del sd
        by_case = {
            "hint": ("tier", True),
            "hot": ("tier", False),
            "direct": ("direct", False),
            "buffered": ("buffered", False),
            "auto": ("auto", False),
            "auto_warm": ("auto", False),
            "direct_warm": ("direct", False),
        }
        for r in range(args.rounds):
            order = GROUPS[r % len(GROUPS) :] + GROUPS[: r % len(GROUPS)]
            for group in order:
                for name in {by_case[c][0] for c in group}:
                    drop_caches(daemons[name][2])
                for case in group:
                    name, prefetch = by_case[case]
                    proc, sock, state = daemons[name]
                    step = r + 1 if name == "tier" else 1
                    if case.endswith("_warm"):
                        read_through_cache(state)
                    got = run_case(sock, proc.pid, step, rows, prefetch, check=r == 0)
                    row = dict(round=r, case=case, state_bytes=state_bytes, **got)
                    row["device_x_state"] = got["device_bytes"] / state_bytes
                    samples.append(row)
                    print(
                        f"round {r} {case:11s}: {got['seconds']:.3f} s, device "
                        f"{row['device_x_state']:.2f}x the state; read {got['bytes_read']}, "
                        f"from RAM {got['bytes_from_ram']}, prefetched {got['bytes_prefetched']}",
                        flush=True,
                    )
                    if case in ("hint", "hot") and got["bytes_read"] != 0:
                        sys.exit(f"replicated_restore_bench: {case}: a load read storage itself")
    finally:
        for proc, _, state in daemons.values():
            proc.terminate()
            proc.wait(timeout=60)
            shutil.rmtree(state, ignore_errors=True)  # several GB of checkpoints
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    print(f"4 ranks restoring the same {state_bytes / 1e9:.2f} GB (medians):")
    hot = median([s["seconds"] for s in samples if s["case"] == "hot"])
    print("| case | s | x hot (RAM tier) | device read / state |")
    print("|---|---|---|---|")
    for case in ("hint", "hot", "direct", "buffered", "auto", "auto_warm", "direct_warm"):
        rows_ = [s for s in samples if s["case"] == case]
        sec = median([s["seconds"] for s in rows_])
        dev = median([s["device_x_state"] for s in rows_])
        print(f"| {case} | {sec:.3f} | {sec / hot:.2f} | {dev:.2f} |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
