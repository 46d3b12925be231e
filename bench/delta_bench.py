"""Deltas on a LoRA-style job: bytes written and time to committed, with and without, in one run.

The job's state is --state-mib of fp32: a frozen part (99%, the base model, in 32 MiB tensors)
and a part that changes every step (--changing-percent, default 1%: the adapters and their
optimizer state, in 16 tensors). Every step rewrites the changing part with new values, saves the
whole state and waits until it is committed. Two jobs on one daemon, their steps interleaved so
the machine's load hits both alike: `full-*` (deltas off) and `delta-*` (on, through the per-job
rule `delta-*: deltas=1`).

Measured per checkpoint (step 1 writes everything in both jobs and is left out):
  committed_s   from save() to committed: the copy into the daemon, the flush (for deltas: the
                checksums first, then the unchanged bytes read back and compared), the fsync and
                the manifest
  new_bytes     bytes of blob files new on disk in the checkpoint's directory (a file shared with
                an earlier checkpoint, a hard link, counts once, where it was written)
  dev_write     the daemon's writes to block devices during the checkpoint (/proc/PID/io:
                blobs, manifest, index journal)

Writes one JSON line per checkpoint to --out/delta.jsonl and prints the table.
"""

from __future__ import annotations

import argparse
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


def new_blob_bytes(step_dir: str, seen: set[int]) -> int:
    """Bytes of the blob files in `step_dir` whose inode no earlier checkpoint had."""
    total = 0
    for name in os.listdir(step_dir):
        if not name.endswith(".blob"):
            continue
        st = os.stat(os.path.join(step_dir, name))
        if st.st_ino not in seen:
            seen.add(st.st_ino)
            total += st.st_size
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--binary", default=os.environ.get("CKPTD_BIN", str(ROOT / "build/ckptd")))
    p.add_argument("--state-mib", type=int, default=512, help="the job's state in MiB (512)")
    p.add_argument("--changing-percent", type=float, default=1.0, help="changed per step (1)")
    p.add_argument("--steps", type=int, default=8, help="checkpoints per job (8)")
    p.add_argument("--dir", default=None, help="where the state dir goes (the temp dir)")
    p.add_argument("--out", default=str(ROOT / "bench/results"))
    args = p.parse_args()
    import ckptd

    rng = np.random.default_rng(7)
    changing_n = int(args.state_mib * MiB * args.changing_percent / 100) // 4 // 16 * 16
    frozen_n = args.state_mib * MiB // 4 - changing_n
    frozen = {
        f"base.{i}": a
        for i, a in enumerate(
            np.array_split(rng.random(frozen_n, dtype=np.float32), max(1, frozen_n // (8 * MiB)))
        )
    }
    changing = [rng.random(changing_n // 16, dtype=np.float32) for _ in range(16)]

    base = tempfile.mkdtemp(prefix="ckptd-delta-bench-", dir=args.dir)
    arena = 2 * args.state_mib * MiB + 256 * MiB
    proc, sock = bench_common.start_daemon(
        args.binary, base, arena, ("--retention_rules=delta-*: deltas=1",)
    )
    rows: list[dict] = []
    seen: dict[str, set[int]] = {"full": set(), "delta": set()}
    try:
        client = ckptd.connect(sock)
        for step in range(1, args.steps + 1):
            for c in changing:
                c[:] = rng.random(c.size, dtype=np.float32)
            tensors = dict(frozen)
            tensors.update({f"lora.{i}": c for i, c in enumerate(changing)})
            for mode in ("full", "delta") if step % 2 else ("delta", "full"):
                job = f"{mode}-lora"
                io0 = bench_common.proc_io(proc.pid)["write_bytes"]
                t0 = time.monotonic()
                client.save(job, step, tensors).committed().result()
                committed = time.monotonic() - t0
                dev_write = bench_common.proc_io(proc.pid)["write_bytes"] - io0
                step_dir = os.path.join(base, "data", job, f"step-{step:020d}")
                rows.append(
                    {
                        "mode": mode,
                        "step": step,
                        "committed_s": committed,
                        "new_bytes": new_blob_bytes(step_dir, seen[mode]),
                        "dev_write": dev_write,
                        "state_mib": args.state_mib,
                        "changing_percent": args.changing_percent,
                    }
                )
        client.close()
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(base, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "delta.jsonl"), "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(
        f"state {args.state_mib} MiB, {args.changing_percent}% changing per step, "
        f"{args.steps} steps (medians of steps 2..{args.steps})"
    )
    print("| mode | time to committed (s) | new blob bytes (MiB) | device writes (MiB) |")
    print("|---|---|---|---|")
    med = {}
    for mode in ("full", "delta"):
        later = [r for r in rows if r["mode"] == mode and r["step"] > 1]
        med[mode] = {
            k: bench_common.median([r[k] for r in later])
            for k in ("committed_s", "new_bytes", "dev_write")
        }
        m = med[mode]
        print(
            f"| {mode} | {m['committed_s']:.3f} | {m['new_bytes'] / MiB:.1f} | "
            f"{m['dev_write'] / MiB:.1f} |"
        )
    f, d = med["full"], med["delta"]
    print(
        f"delta / full: time to committed {d['committed_s'] / f['committed_s']:.2f}x, "
        f"new blob bytes {d['new_bytes'] / max(1, f['new_bytes']):.3f}x, "
        f"device writes {d['dev_write'] / max(1, f['dev_write']):.3f}x"
    )


if __name__ == "__main__":
    main()
