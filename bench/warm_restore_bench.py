#!/usr/bin/env python3
"""Warm restores: ckptd from its RAM tier against PyTorch DCP's load with the page cache warm and
torch.load, interleaved in one run (issue 12: a warm restore at least as fast as DCP's warm
load, i.e. ckptd's time <= DCP's).

One rank restores a state dict of 16 float32 tensors. Each round, in rotating order:

  memcpy            the bar: one thread copies the state between two arrays touched before
  read              a floor for page-cache loaders: DCP's data file (warm) read with readinto
                    into one buffer of its size touched before (no parsing, no second copy)
  ckptd:arena       a daemon with the RAM tier on (the defaults), the checkpoint hot; one
                    client.load into ckptd.empty() destinations (the daemon's one copy)
  ckptd:plain       the same load into plain torch tensors (the state dict DCP loads into; the
                    library copies once more out of arena scratch)
  ckptd_dcp         dcp.load of that state dict through ckptd.torch.StorageReader, from a DCP
                    checkpoint (ckptd.torch.StorageWriter) hot in the same daemon
  dcp               dcp.load of that state dict from DCP's own directory checkpoint
                    (FileSystemReader), its file read once before the rounds: the page cache warm
  torch.load        torch.load(weights_only=True) of torch.save's file of the same state, the
                    page cache warm (it allocates its tensors inside the clock, as it must)

ckptd and DCP load in place into destinations allocated and touched before the clock (the
trainer's model exists): ckptd.empty arrays for ckptd:arena, one set of plain torch tensors for
ckptd:plain, ckptd_dcp and dcp. Every ckptd load is checked: nothing read from storage, the whole
state copied from RAM; the first round's destinations of every case are checked bit-exact.

Usage: warm_restore_bench.py --daemon BUILD/ckptd [--state-mib 1024] [--rounds 5] [--out F]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from bench_common import GB, device_read_bytes, median, read_through_cache, start_daemon

import ckptd
import ckptd.torch

MIB = 1 << 20
TENSORS = 16
CASES = ["memcpy", "read", "ckptd:arena", "ckptd:plain", "ckptd_dcp", "dcp", "torch.load"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--dir", default=None, help="work dir (default: a temporary one under bench/)")
    ap.add_argument("--state-mib", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "warm_restore.jsonl")
    )
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*torch.distributed.*")
    n = args.state_mib * MIB // TENSORS // 4
    state_bytes = TENSORS * n * 4
    base = args.dir or tempfile.mkdtemp(prefix="warm-", dir=os.path.dirname(__file__))
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(os.path.join(base, "ram"))
    rng = np.random.default_rng(7)
    full = {f"t{i:02d}": rng.random(n, dtype=np.float32) for i in range(TENSORS)}
    full_t = {k: torch.from_numpy(v) for k, v in full.items()}
    samples: list[dict[str, Any]] = []
    # Two hot checkpoints (the plain one and the DCP one) and the scratch of loads into plain
    # tensors (two batches of up to 128 MiB): a reservation that finds the arena full evicts hot
    # checkpoints, so a smaller arena would send the least recently used one to disk.
    arena = 2 * state_bytes + 512 * MIB
    proc, sock = start_daemon(args.daemon, os.path.join(base, "ram"), arena)
    client = ckptd.connect(sock)
    try:
        client.save("warm", 1, full).committed().result()
        dcp.save(full_t, storage_writer=ckptd.torch.StorageWriter("warmdcp/step-1", socket=sock))
        for job in ("warm", "warmdcp"):
            tiers = client.status(job, 1)["tiers"]
            if not tiers.get("ram"):
                sys.exit(f"warm_restore_bench: {job}/1 is not in the RAM tier: {tiers}")
        dcp_dir = os.path.join(base, "dcp")
        dcp.save(full_t, checkpoint_id=dcp_dir)
        torch_file = os.path.join(base, "state.pt")
        torch.save(full_t, torch_file)
        read_through_cache(dcp_dir)  # the page cache warm for both
        read_through_cache(torch_file)
        arena = {k: client.empty((n,), np.float32) for k in full}
        plain = {k: torch.empty(n, dtype=torch.float32) for k in full}
        src = np.ones(state_bytes // 4, np.float32)
        dst = np.empty_like(src)
        (data_file,) = [
            os.path.join(dcp_dir, f) for f in os.listdir(dcp_dir) if f.endswith(".distcp")
        ]
        rbuf = np.empty(os.path.getsize(data_file), np.uint8)
        for a in (*arena.values(), dst, rbuf):
            a.fill(0)  # the model exists before the restore
        for t in plain.values():
            t.zero_()

        def check(case: str, got: dict[str, Any]) -> None:
            for k, v in full.items():
                g = got[k].numpy() if isinstance(got[k], torch.Tensor) else got[k]
                if not np.array_equal(g, v):
                    sys.exit(f"warm_restore_bench: {case} {k} is not bit-exact")

        def ram_only(case: str, read: int, ram: int) -> None:
            if read != 0 or ram != state_bytes:
                sys.exit(
                    f"warm_restore_bench: {case} read {read} from storage, {ram} from RAM "
                    f"(want 0, {state_bytes})"
                )

        for r in range(args.rounds):
            order = CASES[r % len(CASES) :] + CASES[: r % len(CASES)]
            for case in order:
                for a in plain.values():
                    a.zero_()  # a stale restore cannot pass the check
                got: dict[str, Any] | None = plain
                read0 = device_read_bytes(os.getpid())
                t0 = time.perf_counter()
                if case == "memcpy":
                    np.copyto(dst, src)
                    got = None
                elif case == "read":
                    with open(data_file, "rb", buffering=0) as f:
                        mv, off = memoryview(rbuf), 0
                        while off < len(rbuf):
                            off += f.readinto(mv[off : off + 64 * MIB])
                    got = None
                elif case == "ckptd:arena":
                    res = client.load("warm", 1, dict(arena))
                    got = arena
                elif case == "ckptd:plain":
                    res = client.load("warm", 1, dict(plain))
                elif case == "ckptd_dcp":
                    reader = ckptd.torch.StorageReader("warmdcp/step-1", socket=sock)
                    dcp.load(plain, storage_reader=reader)
                elif case == "dcp":
                    dcp.load(plain, checkpoint_id=dcp_dir)
                else:
                    got = torch.load(torch_file, weights_only=True)
                seconds = time.perf_counter() - t0
                dev_read = device_read_bytes(os.getpid()) - read0  # warm: about 0
                if case in ("ckptd:arena", "ckptd:plain"):
                    ram_only(case, res.bytes_read, res.bytes_from_ram)
                elif case == "ckptd_dcp":
                    ram_only(case, reader.bytes_read, reader.bytes_from_ram)
                if r == 0 and got is not None:
                    check(case, got)
                if case == "torch.load":
                    del got
                row = {"round": r, "case": case, "seconds": seconds, "state_bytes": state_bytes,
                       "gbps": state_bytes / seconds / GB,
                       "device_read_bytes": dev_read}  # fmt: skip
                samples.append(row)
                print(f"round {r} {case:12s} {seconds:.3f} s ({row['gbps']:.2f} GB/s)", flush=True)
    finally:
        client.close()
        proc.terminate()
        proc.wait(timeout=60)
        shutil.rmtree(base, ignore_errors=True)
    by = {(s["case"], s["round"]): s["seconds"] for s in samples}
    most = max(s["device_read_bytes"] for s in samples)
    print(f"most this process read from the device in one timed case: {most} bytes")
    rounds = range(args.rounds)
    print(f"\nmedians over {args.rounds} rounds, {state_bytes / GB:.2f} GB:")
    print("| case | s | GB/s | x DCP warm's speed (per round: DCP s / this s) | x memcpy's time |")
    print("|---|---|---|---|---|")
    for c in CASES:
        s = median([by[(c, r)] for r in rounds])
        vs_dcp = statistics.median(by[("dcp", r)] / by[(c, r)] for r in rounds)
        vs_mem = statistics.median(by[(c, r)] / by[("memcpy", r)] for r in rounds)
        print(f"| {c} | {s:.3f} | {state_bytes / s / GB:.2f} | {vs_dcp:.2f}x | {vs_mem:.2f}x |")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        for s in samples:
            f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
