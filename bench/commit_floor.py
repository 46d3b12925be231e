#!/usr/bin/env python3
"""Time to committed against the device's floor, interleaved in one run.

Each round saves SIZE_MIB of float32 tensors through the Python client (one rank) and times the
save from its call to COMMITTED, and writes the same number of bytes durably on the same file
system two ways: fio in the daemon's own shape (8 MiB writes, 8 in flight, io_uring, O_DIRECT, one
fsync at the end: `fio_qd8`) and `dd oflag=direct conv=fdatasync` (8 MiB blocks, one in flight:
`dd_qd1`). The order rotates every round, so all three see the same minutes of a noisy disk; the
ratios of ckptd's time to each floor are recorded.

Usage: commit_floor.py --daemon BUILD/ckptd --dir DIR [--size-mib 512] [--rounds 5] [--out F]
Writes one JSON row per sample to --out (bench/results/commit_floor.jsonl by default).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from bench_common import start_daemon

import ckptd

MIB = 1 << 20
TENSOR_MIB = 8


def dd_seconds(src: str, dst: str, size_mib: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            "dd",
            f"if={src}",
            f"of={dst}",
            "bs=8M",
            f"count={size_mib // TENSOR_MIB}",
            "oflag=direct",
            "conv=fdatasync",
            "status=none",
        ],
        check=True,
    )
    seconds = time.perf_counter() - t0
    os.remove(dst)
    return seconds


def fio_seconds(dst: str, size_mib: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            "fio",
            "--name=floor",
            f"--filename={dst}",
            "--rw=write",
            "--bs=8M",
            "--iodepth=8",
            "--ioengine=io_uring",
            "--direct=1",
            "--end_fsync=1",
            f"--size={size_mib}M",
            "--output=/dev/null",
        ],
        check=True,
    )
    seconds = time.perf_counter() - t0
    os.remove(dst)
    return seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--dir", default=None, help="state dir (default: a temporary one under bench/)")
    ap.add_argument("--size-mib", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "results", "commit_floor.jsonl")
    )
    args = ap.parse_args()
    if args.size_mib % TENSOR_MIB != 0:
        sys.exit(f"commit_floor: --size-mib must be a multiple of {TENSOR_MIB}")
    base = args.dir or tempfile.mkdtemp(prefix="commit-floor-", dir=os.path.dirname(__file__))
    state = os.path.join(base, "state")
    shutil.rmtree(state, ignore_errors=True)
    os.makedirs(state)
    rng = np.random.default_rng(1)
    tensors = {
        f"t{i}": rng.random(TENSOR_MIB * MIB // 4, dtype=np.float32)
        for i in range(args.size_mib // TENSOR_MIB)
    }
    src = os.path.join(base, "dd-src.bin")
    with open(src, "wb") as f:
        for t in tensors.values():
            f.write(t.tobytes())
    proc, sock = start_daemon(args.daemon, state, 2 * args.size_mib * MIB)
    rows = []
    try:
        client = ckptd.connect(sock)
        client.save("warmup", 1, tensors).committed().result()  # maps the arena, creates files
        for r in range(args.rounds):
            systems = ["ckptd", "fio_qd8", "dd_qd1"]
            order = systems[r % 3 :] + systems[: r % 3]
            sample = {}
            for what in order:
                if what == "ckptd":
                    t0 = time.perf_counter()
                    client.save("floor", r + 1, tensors).committed().result()
                    sample["ckptd_committed_s"] = time.perf_counter() - t0
                elif what == "fio_qd8":
                    sample["fio_qd8_s"] = fio_seconds(os.path.join(base, "fio.dat"), args.size_mib)
                else:
                    sample["dd_qd1_s"] = dd_seconds(
                        src, os.path.join(base, "dd-dst.bin"), args.size_mib
                    )
            sample.update(
                round=r,
                size_mib=args.size_mib,
                order=order,
                vs_fio_qd8=sample["ckptd_committed_s"] / sample["fio_qd8_s"],
                vs_dd_qd1=sample["ckptd_committed_s"] / sample["dd_qd1_s"],
            )
            rows.append(sample)
            print(
                f"round {r}: ckptd committed {sample['ckptd_committed_s']:.3f} s, fio qd8 "
                f"{sample['fio_qd8_s']:.3f} s, dd qd1 {sample['dd_qd1_s']:.3f} s; ratios "
                f"{sample['vs_fio_qd8']:.2f} / {sample['vs_dd_qd1']:.2f}",
                flush=True,
            )
        client.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
        else:
            os.remove(src)
    for key in ("vs_fio_qd8", "vs_dd_qd1"):
        ratios = sorted(s[key] for s in rows)
        print(
            f"ckptd committed {key}: median {ratios[len(ratios) // 2]:.2f} "
            f"(range {ratios[0]:.2f}-{ratios[-1]:.2f})"
        )
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "a") as f:
        for s in rows:
            f.write(json.dumps(s) + "\n")


if __name__ == "__main__":
    main()
