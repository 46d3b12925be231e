#!/usr/bin/env python3
"""One copy on restore (issue 37 §1): a restore from the RAM tier into ordinary tensors against an
all-core memcpy of the same bytes, in one run. Goal: <= 1.2x the memcpy.

One rank restores a state of float32 tensors of --tensor-mib each (default 64 MiB), hot in the
daemon's RAM tier. Each round, in rotating order:

  memcpy:numpy     the bar: the state copied into ordinary numpy arrays touched before, each
                   tensor split over every CPU this process may use (np.copyto per slice, which
                   releases the GIL)
  memcpy:torch     the same into ordinary torch tensors (their numpy views): torch's allocator
                   gives no transparent huge pages where numpy's large arrays get them, so the
                   same copy costs more there; each ckptd case is compared with the memcpy into
                   the same kind of memory
  ckptd:direct     client.load_into_counted into ordinary torch tensors (the default): the library
                   copies the hot bytes once from its mapping of the arena segment, checksumming
                   each block as it copies (LoadOptions.hot_direct)
  ckptd:numpy      the same into ordinary numpy arrays
  ckptd:scratch    the same load with hot_direct=False, the path before: the daemon copies the hot
                   bytes into arena scratch (verifying them), the library copies them out again
  ckptd:arena      a load into ckptd.empty() arrays (daemon memory: the daemon's one copy)

Every destination is allocated and touched before the clock (the trainer's model exists), zeroed
before each case, and checked bit-exact in the first round; every ckptd load must read nothing
from storage and copy the whole state from RAM.

Usage: one_copy_restore_bench.py --daemon BUILD/ckptd [--state-mib 512] [--tensor-mib 64]
       [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from bench_common import GB, median, start_daemon

import ckptd

MIB = 1 << 20
CASES = [
    "memcpy:numpy",
    "memcpy:torch",
    "ckptd:direct",
    "ckptd:numpy",
    "ckptd:scratch",
    "ckptd:arena",
]
# The memcpy each case is compared with (the same kind of destination memory).
BAR = {
    "memcpy:numpy": "memcpy:numpy",
    "memcpy:torch": "memcpy:torch",
    "ckptd:direct": "memcpy:torch",
    "ckptd:numpy": "memcpy:numpy",
    "ckptd:scratch": "memcpy:torch",
    "ckptd:arena": "memcpy:numpy",
}


def all_core_copy(pool: ThreadPoolExecutor, threads: int, pairs: list[tuple[Any, Any]]) -> None:
    jobs = []
    for dst, src in pairs:
        step = -(-len(src) // threads)
        for i in range(0, len(src), step):
            jobs.append(pool.submit(np.copyto, dst[i : i + step], src[i : i + step]))
    for j in jobs:
        j.result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--state-mib", type=int, default=512)
    ap.add_argument("--tensor-mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    count = max(1, args.state_mib // args.tensor_mib)
    n = args.tensor_mib * MIB // 4
    state_bytes = count * n * 4
    threads = len(os.sched_getaffinity(0))
    base = tempfile.mkdtemp(prefix="onecopy-", dir=os.path.dirname(os.path.abspath(__file__)))
    rng = np.random.default_rng(37)
    full = {f"t{i:03d}": rng.random(n, dtype=np.float32) for i in range(count)}
    # The hot checkpoint, two batches of scratch (128 MiB each) and room to spare.
    proc, sock = start_daemon(args.daemon, base, state_bytes + 512 * MIB)
    client = ckptd.connect(sock)
    pool = ThreadPoolExecutor(threads)
    samples: dict[tuple[str, int], float] = {}
    try:
        client.save("onecopy", 1, full).committed().result()
        if not client.status("onecopy", 1)["tiers"].get("ram"):
            sys.exit("one_copy_restore_bench: the checkpoint is not in the RAM tier")
        plain = {k: torch.empty(n, dtype=torch.float32) for k in full}
        arrays = {k: np.empty(n, np.float32) for k in full}
        arena = {k: client.empty((n,), np.float32) for k in full}
        copy_dst = {k: np.empty(n, np.float32) for k in full}
        copy_torch = {k: torch.empty(n, dtype=torch.float32) for k in full}
        copy_torch_np = {k: t.numpy() for k, t in copy_torch.items()}
        for d in (*arrays.values(), *arena.values(), *copy_dst.values()):
            d.fill(0)
        for t in (*plain.values(), *copy_torch.values()):
            t.zero_()
        for r in range(args.rounds):
            order = CASES[r % len(CASES) :] + CASES[: r % len(CASES)]
            for case in order:
                dests: dict[str, Any] = {
                    "memcpy:numpy": copy_dst,
                    "memcpy:torch": copy_torch,
                    "ckptd:direct": plain,
                    "ckptd:scratch": plain,
                    "ckptd:numpy": arrays,
                    "ckptd:arena": arena,
                }[case]
                for d in dests.values():
                    d.zero_() if isinstance(d, torch.Tensor) else d.fill(0)
                targets = [(k, None, dests[k]) for k in full]
                t0 = time.perf_counter()
                if case.startswith("memcpy"):
                    into = copy_dst if case == "memcpy:numpy" else copy_torch_np
                    all_core_copy(pool, threads, [(into[k], full[k]) for k in full])
                else:
                    got = client.load_into_counted(
                        "onecopy", 1, targets, hot_direct=case != "ckptd:scratch"
                    )
                seconds = time.perf_counter() - t0
                if not case.startswith("memcpy") and (
                    got["bytes_read"] != 0 or got["bytes_from_ram"] != state_bytes
                ):
                    sys.exit(f"one_copy_restore_bench: {case} did not copy from RAM only: {got}")
                if r == 0:
                    for k, v in full.items():
                        d = dests[k].numpy() if isinstance(dests[k], torch.Tensor) else dests[k]
                        if not np.array_equal(d, v):
                            sys.exit(f"one_copy_restore_bench: {case} {k} is not bit-exact")
                samples[(case, r)] = seconds
                gbps = state_bytes / seconds / GB
                print(f"round {r} {case:16s} {seconds:.3f} s ({gbps:.2f} GB/s)", flush=True)
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=60)
        pool.shutdown()
        shutil.rmtree(base, ignore_errors=True)
    rounds = range(args.rounds)
    print(
        f"\nmedians over {args.rounds} rounds, {state_bytes / GB:.2f} GB in {count} tensors of "
        f"{args.tensor_mib} MiB, {threads} CPUs:"
    )
    print("| case | s | GB/s | x the all-core memcpy into the same memory (per round) |")
    print("|---|---|---|---|")
    for c in CASES:
        s = median([samples[(c, r)] for r in rounds])
        ratio = statistics.median(samples[(c, r)] / samples[(BAR[c], r)] for r in rounds)
        print(f"| {c} | {s:.3f} | {state_bytes / s / GB:.2f} | {ratio:.2f}x ({BAR[c]}) |")


if __name__ == "__main__":
    main()
