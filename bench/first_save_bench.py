"""The first save after the daemon starts against the saves after it, in one run.

A job that starts with its daemon (a fresh daemon, its arena's shared memory not yet faulted in)
connects at once and saves the same state --saves times, waiting for each to commit. The save
stall (save() returning "staged") of the first save is compared with the median of the later ones;
the ratio is what issue 37 asks to bring to ~1. Each round starts a new daemon on a new state dir
(its segments removed), so every round's first save is a cold one.

Variants (run side by side, interleaved per round):
  default             the daemon and the client as configured by default
  no_client_populate  CKPTD_ARENA_POPULATE=0: the client does not map the arena's pages ahead
                      (each page of the first save's copy takes a fault)
  no_prefault         --staging_prefault=false: nothing faulted ahead, every page at first touch

Writes one JSON line per save to --out/first_save.jsonl and prints the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_common  # noqa: E402 (found through the path above)

MiB = 1 << 20
GiB = 1 << 30
# name -> (daemon flags, client environment)
VARIANTS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "default": ((), {}),
    "no_client_populate": ((), {"CKPTD_ARENA_POPULATE": "0"}),
    "no_prefault": (("--staging_prefault=false",), {}),
}


def one_round(binary: str, variant: str, args: argparse.Namespace, state: np.ndarray) -> list[dict]:
    import ckptd
    from ckptd._shm import prefix_of, remove_prefix

    base = tempfile.mkdtemp(prefix="ckptd-first-save-", dir=args.dir)
    flags, env = VARIANTS[variant]
    proc, sock = bench_common.start_daemon(
        binary, base, args.arena_gib * GiB, ("--ram_tier_keep_per_job=1", *flags)
    )
    os.environ.pop("CKPTD_ARENA_POPULATE", None)
    os.environ.update(env)  # read by libckptd-client when it maps the arena (connect)
    started = time.monotonic()
    rows = []
    try:
        client = ckptd.connect(sock)
        # The tensors: --save_mib in 16 arrays (a model's few large tensors).
        tensors = {f"w{i}": a for i, a in enumerate(np.array_split(state, 16))}
        time.sleep(args.init_s)  # the job's own start (model, data) before its first save
        for step in range(1, args.saves + 1):
            t0 = time.monotonic()
            handle = client.save("first", step, tensors)
            stall = time.monotonic() - t0
            handle.committed().result()
            rows.append(
                {
                    "variant": variant,
                    "step": step,
                    "stall_s": stall,
                    "since_start_s": t0 - started,
                    "committed_s": time.monotonic() - t0,
                    "save_mib": args.save_mib,
                    "arena_gib": args.arena_gib,
                    "init_s": args.init_s,
                }
            )
        client.close()
        del client, tensors  # unmaps the round's arena (its pages stay while mapped)
        gc.collect()
    finally:
        proc.terminate()
        proc.wait()
        # A clean stop keeps the arena (hot checkpoints) for a restart: each round's 4 GiB go now.
        remove_prefix(prefix_of(base))
        shutil.rmtree(base, ignore_errors=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--binary", default=os.environ.get("CKPTD_BIN", str(ROOT / "build/ckptd")))
    p.add_argument("--arena-gib", type=int, default=1, help="staging_bytes_max in GiB (1)")
    p.add_argument("--save-mib", type=int, default=256, help="bytes of each save in MiB (256)")
    p.add_argument("--saves", type=int, default=4, help="saves per round (4)")
    p.add_argument(
        "--init-s", type=float, default=0.0, help="seconds from connect to the first save (0)"
    )
    p.add_argument("--rounds", type=int, default=3, help="daemons started per variant (3)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    p.add_argument("--dir", default=None, help="where the state dirs go (the temp dir)")
    p.add_argument("--out", default=str(ROOT / "bench/results"))
    args = p.parse_args()
    if args.save_mib * MiB > args.arena_gib * GiB:
        sys.exit("bench: --save-mib must fit in --arena-gib")
    state = np.random.default_rng(1).random(args.save_mib * MiB // 4, dtype=np.float32)
    variants = args.variants.split(",")
    rows: list[dict] = []
    for _ in range(args.rounds):
        for v in variants:  # interleaved: the machine's load hits every variant alike
            rows += one_round(args.binary, v, args, state)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "first_save.jsonl"), "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(
        f"arena {args.arena_gib} GiB, saves of {args.save_mib} MiB, first save {args.init_s} s "
        f"after connecting, {args.rounds} rounds"
    )
    print("| variant | first save stall (s) | later saves (median, s) | first / later |")
    print("|---|---|---|---|")
    for v in variants:
        first = [r["stall_s"] for r in rows if r["variant"] == v and r["step"] == 1]
        later = [r["stall_s"] for r in rows if r["variant"] == v and r["step"] > 1]
        f, lt = bench_common.median(first), bench_common.median(later)
        print(f"| {v} | {f:.3f} | {lt:.3f} | {f / lt:.1f}x |")


if __name__ == "__main__":
    main()
