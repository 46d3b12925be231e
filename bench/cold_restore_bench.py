#!/usr/bin/env python3
"""Cold restores (page cache dropped, RAM tier empty) against torch.load of the same bytes and
the disk's best sequential read, interleaved in one run (issue 12's cold goals: >= 1.0x
torch.load's cold load, >= 0.85x the better of fio's O_DIRECT and buffered reads).

One rank restores a state of 16 float32 tensors. Each round, in rotating order, with the page
cache dropped before each:

  ckptd:inplace   a daemon with the RAM tier off and the defaults (load_io=direct,
                  load_into_destination on: whole shards read straight into the destination)
  ckptd:bounce    the same with load_into_destination off (every byte through the daemon's read
                  buffer, then copied: how cold loads ran before)
  ckptd:buffered  load_io=buffered (through the page cache), load_into_destination on
  torch.load      torch.save's file of the same state dict, torch.load(weights_only=True)
  fio:direct      fio, sequential read of a file of the state's size, bs=16M x 4, O_DIRECT
  fio:buffered    the same through the page cache

ckptd loads into destinations allocated and touched before the clock (ckptd.empty arrays in the
daemon's arena: a trainer's model, already built); torch.load allocates its tensors inside the
clock, as it must. Every ckptd load is checked: its bytes read from storage, none from RAM, and
the first round's tensors bit-exact.

Usage: cold_restore_bench.py --daemon BUILD/ckptd [--state-mib 1024] [--rounds 3] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import torch
from bench_common import GB, drop_caches, fio_read, median, start_daemon

import ckptd

MIB = 1 << 20
TENSORS = 16
DAEMONS = {
    "inplace": ("--load_into_destination=true", "--load_io=direct"),
    "bounce": ("--load_into_destination=false", "--load_io=direct"),
    "buffered": ("--load_into_destination=true", "--load_io=buffered"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--dir", default=None, help="work dir (default: a temporary one under bench/)")
    ap.add_argument("--state-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "cold_restore.jsonl")
    )
    args = ap.parse_args()
    n = args.state_mib * MIB // TENSORS // 4
    state_bytes = TENSORS * n * 4
    base = args.dir or tempfile.mkdtemp(prefix="cold-", dir=os.path.dirname(__file__))
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    rng = np.random.default_rng(5)
    full = {f"t{i:02d}": rng.random(n, dtype=np.float32) for i in range(TENSORS)}
    procs = {}
    socks = {}
    dests = {}
    clients = {}
    samples: list[dict] = []
    try:
        for name, flags in DAEMONS.items():
            state = os.path.join(base, name)
            os.makedirs(state)
            procs[name], socks[name] = start_daemon(
                args.daemon, state, 3 * state_bytes, ("--ram_tier_keep_per_job=0", *flags)
            )
            c = ckptd.connect(socks[name])
            c.save("cold", 1, full).committed().result()
            dests[name] = {k: c.empty((n,), np.float32) for k in full}
            for a in dests[name].values():
                a.fill(0)  # the model exists before the restore
            clients[name] = c
        torch_file = os.path.join(base, "state.pt")
        torch.save({k: torch.from_numpy(v) for k, v in full.items()}, torch_file)
        fio_file = os.path.join(base, "fio.dat")
        cases = [f"ckptd:{d}" for d in DAEMONS] + ["torch.load", "fio:direct", "fio:buffered"]
        for r in range(args.rounds):
            order = cases[r % len(cases) :] + cases[: r % len(cases)]
            for case in order:
                if case.startswith("fio:"):
                    bw = fio_read(fio_file, state_bytes, direct=case == "fio:direct")
                    seconds = state_bytes / bw
                elif case == "torch.load":
                    drop_caches(base)
                    t0 = time.perf_counter()
                    got = torch.load(torch_file, weights_only=True)
                    seconds = time.perf_counter() - t0
                    del got
                else:
                    name = case.split(":")[1]
                    c = clients[name]
                    drop_caches(base)
                    t0 = time.perf_counter()
                    res = c.load("cold", 1, dict(dests[name]))
                    seconds = time.perf_counter() - t0
                    if res.bytes_read < state_bytes or res.bytes_from_ram != 0:
                        sys.exit(
                            f"cold_restore_bench: {case} read {res.bytes_read}, "
                            f"{res.bytes_from_ram} from RAM"
                        )
                    if r == 0:
                        for k, v in full.items():
                            if not np.array_equal(dests[name][k], v):
                                sys.exit(f"cold_restore_bench: {case} {k} is not bit-exact")
                row = {"round": r, "case": case, "seconds": seconds, "state_bytes": state_bytes,
                       "gbps": state_bytes / seconds / GB}  # fmt: skip
                samples.append(row)
                print(f"round {r} {case:15s} {seconds:.3f} s ({row['gbps']:.2f} GB/s)", flush=True)
    finally:
        for c in clients.values():
            c.close()
        for p in procs.values():
            p.terminate()
            p.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)
    med = {c: median([s["seconds"] for s in samples if s["case"] == c]) for c in cases}
    best_disk = min(med["fio:direct"], med["fio:buffered"])
    print(f"medians over {args.rounds} rounds, {state_bytes / GB:.2f} GB:")
    for c in cases:
        print(f"  {c:15s} {med[c]:.3f} s  {state_bytes / med[c] / GB:5.2f} GB/s  "
              f"vs torch.load {med['torch.load'] / med[c]:.2f}x  "
              f"vs best disk read {best_disk / med[c]:.2f}x")  # fmt: skip
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
