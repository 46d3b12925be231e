"""One rank of a Hugging Face Accelerate run on CPU (gloo) for test_accelerate.py: a tiny MLP,
AdamW and a LambdaLR scheduler prepared by Accelerator (FSDP2 with --fsdp, else DDP), a
registered custom object, and the same global batch every step whatever the world size.

    train:  step 1, save_state(step 1, async), step 2, save_state(step 2) (total_limit=1: step 1
            deleted), then steps 3-4
    resume: a fresh model (another seed), load_state("latest"), then steps 3-4
    kill:   steps 1-3, save_state(step 3) where rank 1 dies before it is staged
    faults: (one rank) load_state of a job with no checkpoint, of a corrupt one (its blobs
            flipped under CKPTD_STATE_DIR), and save/load with the daemon (CKPTD_PID) killed

Rank 0 writes OUT/<tag>.json: the global losses of steps 3-4 and what load_state restored.
Started with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and CKPTD_SOCKET set."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

GLOBAL_BATCH, WIDTH = 12, 16


class Counter:
    """A custom object registered for checkpointing."""

    def __init__(self) -> None:
        self.seen = 0

    def state_dict(self) -> dict[str, int]:
        return {"seen": self.seen}

    def load_state_dict(self, sd: dict[str, int]) -> None:
        self.seen = sd["seen"]


def batch(step: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(500 + step)
    x = torch.randn(GLOBAL_BATCH, WIDTH, generator=g)
    y = torch.randn(GLOBAL_BATCH, 1, generator=g)
    rows = GLOBAL_BATCH // world
    return x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("train", "resume", "kill", "faults"))
    p.add_argument("--job", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--fsdp", action="store_true")
    args = p.parse_args()

    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin, ProjectConfiguration

    import ckptd.accelerate as cka

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2) if args.fsdp else None
    accelerator = Accelerator(
        cpu=True,
        fsdp_plugin=plugin,
        project_config=ProjectConfiguration(total_limit=1),
    )
    rank, world = accelerator.process_index, accelerator.num_processes
    torch.manual_seed(0 if args.mode != "resume" else 99)  # a resume must load, not start fresh
    model = nn.Sequential(nn.Linear(WIDTH, 32), nn.Tanh(), nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    counter = Counter()
    accelerator.register_for_checkpointing(counter)

    def step(s: int) -> float:
        x, y = batch(s, rank, world)
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        counter.seen += len(x) * world
        total = loss.detach().clone()
        if world > 1:
            torch.distributed.all_reduce(total)
        return float(total) / world

    result: dict[str, Any] = {"world": world}
    if args.mode == "train":
        step(1)
        cka.save_state(accelerator, args.job, 1, async_save=True).result()
        step(2)
        cka.save_state(accelerator, args.job, 2)  # total_limit=1: step 1 deleted
    elif args.mode == "kill":
        for s in (1, 2, 3):
            step(s)
        if rank == 1:
            import ckptd.torch._storage as storage

            def die(*a: Any, **k: Any) -> Any:
                os.kill(os.getpid(), signal.SIGKILL)

            storage.StorageWriter.write_data = die  # killed before its part is staged
        try:
            cka.save_state(accelerator, args.job, 3)
            result["save"] = "returned"
        except BaseException as e:  # DCP's CheckpointException or gloo's RuntimeError
            result["save"] = f"{type(e).__name__}: {e}"[:300]
        result["loaded"] = None
    elif args.mode == "faults":
        result = faults(accelerator, args.job, step)
    else:
        result["loaded"] = cka.load_state(accelerator, args.job)
        result["seen"] = counter.seen
        result["lr"] = scheduler.get_last_lr()[0]
    if args.mode in ("train", "resume"):
        result["losses"] = [step(3), step(4)]
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.tag}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # see conftest.run_rank


def faults(accelerator: Any, job: str, step: Any) -> dict[str, Any]:
    """Each failure's exception (type and message), or what load_state returned."""
    import ckptd.accelerate as cka

    out: dict[str, Any] = {}

    def attempt(name: str, fn: Any) -> None:
        try:
            out[name] = f"returned {fn()!r}"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"[:400]

    attempt("none", lambda: cka.load_state(accelerator, f"{job}/empty"))
    attempt("none_ok", lambda: cka.load_state(accelerator, f"{job}/empty", missing_ok=True))
    step(1)
    cka.save_state(accelerator, f"{job}/corrupt", 1)
    state_dir = Path(os.environ["CKPTD_STATE_DIR"])
    blobs = [b for b in (state_dir / "data").rglob("*.blob") if "corrupt" in str(b)]
    for blob in blobs:
        with open(blob, "r+b") as f:
            f.seek(8)
            byte = f.read(1)
            f.seek(8)
            f.write(bytes([byte[0] ^ 0xFF]))
    out["blobs"] = len(blobs)
    attempt("corrupt", lambda: cka.load_state(accelerator, f"{job}/corrupt"))
    os.kill(int(os.environ["CKPTD_PID"]), signal.SIGKILL)
    attempt("down_save", lambda: cka.save_state(accelerator, job, 2))
    attempt("down_load", lambda: cka.load_state(accelerator, job))
    return out


if __name__ == "__main__":
    main()
