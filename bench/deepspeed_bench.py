"""Resuming a DeepSpeed ZeRO checkpoint at another data-parallel size: ckptd against DeepSpeed's
universal checkpointing, one run, same model, same machine.

    ckptd:     train at DP=a, ckptd.deepspeed.save (to durable) |
               resume at DP=b: ckptd.deepspeed.load
    deepspeed: train at DP=a, engine.save_checkpoint | ds_to_universal --inject_missing_state |
               resume at DP=b: engine.load_checkpoint with load_universal

Every rank is a process of tests/python/deepspeed_rig.py (ZeRO over gloo on CPU, AdamW). The page
cache is dropped before the conversion and before each resume, and the daemon's RAM tier is off:
both systems restore cold from the disk. Measured: the save (stall and to durable), the conversion,
the time from launching the resumed ranks to the end of their first step (the slowest rank), bytes
written (ckptd: the daemon's device writes; DeepSpeed: the files' sizes) and bytes read per resumed
rank (ckptd: what the daemon read for the rank; DeepSpeed: the rank's rchar during its load) against
what the rank needs (its partition of the fp32 masters and the two Adam moments).

    python3 bench/deepspeed_bench.py --binary build/ckptd [--dims 1024,4096,32768,7]
        [--train_dp 2 --resume_dp 4 --stage 2] [--out bench/results/deepspeed.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import GB, can_drop_caches, drop_caches, proc_io, start_daemon, tree_bytes

ROOT = Path(__file__).resolve().parents[1]
RIG = ROOT / "tests" / "python" / "deepspeed_rig.py"
sys.path.insert(0, str(RIG.parent))
from deepspeed_rig import Model, rank_envs  # noqa: E402  (the rig's model and environment)


def run_ranks(argv: list[str], dp: int, sock: str, logs: Path, tag: str) -> float:
    """dp ranks of the rig; returns the wall-clock time they were launched at."""
    threads = max(1, (os.cpu_count() or 1) // dp)
    envs = rank_envs(dp, sock, threads)
    launched = time.time()
    procs = []
    for rank in range(dp):
        with open(logs / f"{tag}.rank{rank}.log", "wb") as log:
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(RIG), *argv],
                    env=envs[rank],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
    codes = [p.wait() for p in procs]
    if any(codes):
        sys.exit(f"bench: {tag}: ranks exited {codes}; see {logs}/{tag}.rank*.log")
    return launched


def times(out: Path, tag: str, dp: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"times_{tag}.rank{r}.json").read_text()) for r in range(dp)]


def resumed(t: list[dict[str, Any]], launched: float, system: str) -> dict[str, float]:
    """A resume's times, the slowest rank's: launch to restored, the load itself (engine built to
    restored) and launch to the end of the first step."""
    return {
        f"{system}_restored_s": max(r["restored"] for r in t) - launched,
        f"{system}_load_s": max(r["restored"] - r["engine"] for r in t),
        f"{system}_first_step_s": max(r["first_step"] for r in t) - launched,
    }


def trainable_params(dims: str) -> int:
    import torch

    with torch.device("meta"):
        model = Model(dims)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--binary", default=str(ROOT / "build" / "ckptd"))
    p.add_argument("--dims", default="1024,4096,32768,7", help="hidden,ffn,padded vocab,layers")
    p.add_argument("--train_dp", type=int, default=2)
    p.add_argument("--resume_dp", type=int, default=4)
    p.add_argument("--stage", type=int, default=2)
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temp dir)")
    p.add_argument(
        "--staging_mib", type=int, default=4096, help="the daemon's arena (holds a whole save)"
    )
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "deepspeed.jsonl"))
    p.add_argument("--ckptd_only", action="store_true", help="skip DeepSpeed's path (no ratio)")
    args = p.parse_args()

    params = trainable_params(args.dims)
    needed_per_rank = 12 * params / args.resume_dp  # fp32 master + exp_avg + exp_avg_sq
    base = Path(tempfile.mkdtemp(prefix="ckds", dir=args.dir or "/tmp"))
    logs = base / "logs"
    logs.mkdir()
    state = base / "ckptd"
    state.mkdir()
    daemon, sock = start_daemon(
        args.binary, str(state), args.staging_mib << 20, ("--ram_tier_keep_per_job=0",)
    )
    common = ["--stage", str(args.stage), "--dims", args.dims, "--no_check", "--out", str(base)]
    result: dict[str, Any] = {
        "bench": "deepspeed_resume",
        "dims": args.dims,
        "trainable_params": params,
        "train_dp": args.train_dp,
        "resume_dp": args.resume_dp,
        "stage": args.stage,
        "cold": can_drop_caches(),
    }
    try:
        # --- ckptd ---
        before = proc_io(daemon.pid)
        argv = ["train", "--dp", str(args.train_dp), "--job", "bench", "--next_steps", "0"]
        run_ranks([*argv, "--tag", "ck_train", *common], args.train_dp, sock, logs, "ck_train")
        t = times(base, "ck_train", args.train_dp)
        result["ckptd_save_stall_s"] = max(r["staged"] - r["trained"] for r in t)
        result["ckptd_save_s"] = max(r["saved"] - r["trained"] for r in t)
        result["ckptd_written_bytes"] = proc_io(daemon.pid)["write_bytes"] - before["write_bytes"]
        drop_caches(str(state))
        before = proc_io(daemon.pid)
        argv = ["resume", "--dp", str(args.resume_dp), "--job", "bench", "--next_steps", "1"]
        launched = run_ranks(
            [*argv, "--tag", "ck_resume", *common], args.resume_dp, sock, logs, "ck_resume"
        )
        t = times(base, "ck_resume", args.resume_dp)
        result.update(resumed(t, launched, "ckptd"))
        result["ckptd_read_per_rank_bytes"] = max(r["bytes_read"] for r in t)
        result["ckptd_device_read_bytes"] = proc_io(daemon.pid)["read_bytes"] - before["read_bytes"]
        result["ckptd_load_phases_s"] = {
            k: max(r["load_seconds"][k] for r in t) for k in t[0]["load_seconds"]
        }
        if args.ckptd_only:
            print(json.dumps(result))
            return

        # --- DeepSpeed: save_checkpoint, ds_to_universal, load_universal ---
        saved = base / "ds"
        argv = ["train", "--dp", str(args.train_dp), "--via", "deepspeed", "--next_steps", "0"]
        argv += ["--ds_dir", str(saved)]
        run_ranks([*argv, "--tag", "ds_train", *common], args.train_dp, sock, logs, "ds_train")
        t = times(base, "ds_train", args.train_dp)
        result["ds_save_s"] = max(r["saved"] - r["trained"] for r in t)
        tag = (saved / "latest").read_text().strip()
        result["ds_written_bytes"] = tree_bytes(saved)
        universal = base / "ds_universal" / f"{tag}_universal"
        drop_caches(str(saved))
        started = time.time()
        convert = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal"]
        convert += ["--input_folder", str(saved / tag), "--output_folder", str(universal)]
        convert += ["--inject_missing_state", "--num_extract_workers", "2"]
        convert += ["--num_merge_workers", "2"]
        with open(logs / "ds_to_universal.log", "wb") as log:
            subprocess.run(
                convert,
                check=True,
                env=dict(os.environ, DS_ACCELERATOR="cpu"),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        result["ds_convert_s"] = time.time() - started
        result["ds_convert_written_bytes"] = tree_bytes(universal)
        drop_caches(str(base))
        argv = ["resume", "--dp", str(args.resume_dp), "--via", "deepspeed", "--next_steps", "1"]
        argv += ["--ds_dir", str(universal)]
        launched = run_ranks(
            [*argv, "--tag", "ds_resume", *common], args.resume_dp, sock, logs, "ds_resume"
        )
        t = times(base, "ds_resume", args.resume_dp)
        result.update(resumed(t, launched, "ds"))
        result["ds_read_per_rank_bytes"] = max(r["io_restore"]["rchar"] for r in t)
    finally:
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(base, ignore_errors=True)

    ck_total = result["ckptd_save_s"] + result["ckptd_first_step_s"]
    ds_total = result["ds_save_s"] + result["ds_convert_s"] + result["ds_first_step_s"]
    result.update(
        needed_per_rank_bytes=needed_per_rank,
        ckptd_end_to_end_s=ck_total,
        ds_end_to_end_s=ds_total,
        speedup=ds_total / ck_total,
        ckptd_read_amplification=result["ckptd_read_per_rank_bytes"] / needed_per_rank,
        ds_read_amplification=result["ds_read_per_rank_bytes"] / needed_per_rank,
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        f.write(json.dumps(result) + "\n")
    print(
        f"deepspeed resume ({params / 1e6:.0f}M params, ZeRO-{args.stage}, DP {args.train_dp} -> "
        f"{args.resume_dp}, {12 * params / GB:.2f} GB of fp32 state):\n"
        f"  ckptd     save {result['ckptd_save_s']:.1f} s (stall {result['ckptd_save_stall_s']:.1f}"
        f" s), to first resumed step {result['ckptd_first_step_s']:.1f} s; end to end "
        f"{ck_total:.1f} s; wrote {result['ckptd_written_bytes'] / GB:.2f} GB; read per rank "
        f"{result['ckptd_read_amplification']:.3f}x what it needs\n"
        f"  deepspeed save {result['ds_save_s']:.1f} s, ds_to_universal "
        f"{result['ds_convert_s']:.1f} s, load {result['ds_load_s']:.1f} s, to first resumed step "
        f"{result['ds_first_step_s']:.1f} s; end to end {ds_total:.1f} s;"
        f" wrote {(result['ds_written_bytes'] + result['ds_convert_written_bytes']) / GB:.2f} GB; "
        f"read per rank {result['ds_read_amplification']:.3f}x what it needs\n"
        f"  ckptd is {result['speedup']:.2f}x faster end to end"
    )


if __name__ == "__main__":
    main()
