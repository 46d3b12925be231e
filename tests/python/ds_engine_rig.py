"""One rank of a DeepSpeed run whose engine.save_checkpoint / load_checkpoint go through ckptd
(ckptd.deepspeed_engine.install), for test_deepspeed_engine.py. The model, batches and engine are
deepspeed_rig.py's (ZeRO-2, AdamW, CPU over gloo).

    train:  4 steps, save_checkpoint(DIR) after steps 2 and 4 (overlapped), then steps 5-6
    kill:   load_checkpoint(DIR), one step, save_checkpoint(DIR): rank 1 dies before it is staged;
            rank 0 waits for the commit (aborted) and reports DIR/latest
    resume: a fresh engine (other seed), load_checkpoint(DIR) ("latest"), then steps 5-6
    faults: (one rank) a save whose blob is corrupted, a save deleted from ckptd, a save_dir
            without `latest`, the daemon stopped: what load/save raise

Rank 0 writes OUT/<mode>.json with the losses of the steps it ran after the checkpoint and what
it observed. Started with deepspeed_rig.rank_envs's environment."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import deepspeed_rig as rig


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("train", "kill", "resume", "faults"))
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--job", required=True)
    args = p.parse_args()

    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # see deepspeed_rig.main
    deepspeed.init_distributed(dist_backend="gloo")
    import deepspeed.comm as dist

    import ckptd
    import ckptd.deepspeed_engine as ckde

    rank, dp = dist.get_rank(), dist.get_world_size()
    result: dict[str, Any] = {}
    seed = 0 if args.mode == "train" else 123  # a resume must load, not start fresh
    engine = rig.engine_for(2, dp, seed)
    client = ckptd.connect(connect_timeout_ms=1000) if args.mode == "faults" else None
    # train: the overlapped save (steps 3 and 5 change the state while the saves after steps 2
    # and 4 may still be copying; the resume's losses equal the uninterrupted run's only if each
    # checkpoint holds the state of its save_checkpoint call)
    ce = ckde.install(engine, args.job, client=client, overlap=args.mode == "train")
    if args.mode == "train":
        for step in (1, 2):
            rig.train_step(engine, step, rank, dp)
        engine.save_checkpoint(str(args.dir), client_state={"epoch": 2})
        for step in (3, 4):
            rig.train_step(engine, step, rank, dp)
        engine.save_checkpoint(str(args.dir), client_state={"epoch": 4})
        result["losses"] = [rig.train_step(engine, s, rank, dp) for s in (5, 6)]
        result["waited"] = ce.wait(60)
        result["latest"] = (args.dir / "latest").read_text() if rank == 0 else None
    elif args.mode == "resume":
        path, client_state = engine.load_checkpoint(str(args.dir))
        epoch = None if client_state is None else client_state.get("epoch")
        result.update(path=path, epoch=epoch, global_steps=engine.global_steps)
        result["losses"] = [rig.train_step(engine, s, rank, dp) for s in (5, 6)]
    elif args.mode == "kill":
        engine.load_checkpoint(str(args.dir))
        rig.train_step(engine, 5, rank, dp)
        if rank == 1:

            def die(*a: Any, **k: Any) -> Any:
                os.kill(os.getpid(), signal.SIGKILL)

            ce.client.save = die  # killed before its part is staged
        engine.save_checkpoint(str(args.dir))
        result["latest_after_save"] = (args.dir / "latest").read_text()
        try:
            ce.wait(60)
            result["wait"] = "committed"
        except Exception as e:
            result["wait"] = f"{type(e).__name__}: {e}"
        result["latest"] = (args.dir / "latest").read_text()
    else:
        result = faults(engine, ce, args)
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.mode}.json").write_text(json.dumps(result))
    if args.mode != "kill":
        dist.barrier()
    sys.stdout.flush()
    os._exit(0)  # see conftest.run_rank


def faults(engine: Any, ce: Any, args: argparse.Namespace) -> dict[str, Any]:
    """One rank: each failure's exception (type and message) or what load_checkpoint returned."""
    out: dict[str, Any] = {}

    def attempt(name: str, fn: Any) -> None:
        started = time.monotonic()
        try:
            out[name] = f"returned {fn()!r}"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"
        out[f"{name}_seconds"] = time.monotonic() - started

    ce.async_save = False
    rig.train_step(engine, 1, 0, 1)
    ce.job = f"{args.job}.corrupt"
    engine.save_checkpoint(str(args.dir), tag="corrupt")
    rig.train_step(engine, 2, 0, 1)
    ce.job = f"{args.job}.missing"
    engine.save_checkpoint(str(args.dir), tag="missing")
    blobs = sorted((Path(os.environ["CKPTD_STATE_DIR"]) / "data").glob(f"{args.job}.corrupt/*/*"))
    for blob in (b for b in blobs if b.suffix == ".blob"):
        with open(blob, "r+b") as f:
            f.seek(64)
            byte = f.read(1)
            f.seek(64)
            f.write(bytes([byte[0] ^ 0xFF]))
    out["blobs"] = [str(b) for b in blobs]
    attempt("corrupt", lambda: engine.load_checkpoint(str(args.dir), tag="corrupt"))
    ce.client.delete(f"{args.job}.missing", 2)
    attempt("missing", lambda: engine.load_checkpoint(str(args.dir), tag="missing"))
    attempt("no_latest", lambda: engine.load_checkpoint(str(args.dir / "empty")))
    os.kill(int(os.environ["CKPTD_PID"]), signal.SIGKILL)
    time.sleep(0.5)
    rig.train_step(engine, 3, 0, 1)
    attempt("down_save", lambda: engine.save_checkpoint(str(args.dir), tag="down"))
    attempt("down_load", lambda: engine.load_checkpoint(str(args.dir), tag="corrupt"))
    return out


if __name__ == "__main__":
    main()
