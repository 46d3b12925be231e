"""One rank of a transformers Trainer run on CPU (DDP over gloo) through ckptd.hf_trainer's
CkptdTrainer, for test_hf_trainer.py: a tiny regression model, save_steps=2,
save_total_limit=1.

    train:  max_steps=4 (checkpoints at steps 2 and 4; the folder and ckptd step 2 rotated out)
    resume: max_steps=6, resume_from_checkpoint=True, a fresh model (another seed)
    kill:   as train, but rank 1 dies in step 4's save before its part is staged
    faults: (one rank) a resume with no checkpoint folder, a corrupt checkpoint resumed (its
            blobs flipped under CKPTD_STATE_DIR), then the daemon (CKPTD_PID) killed: a save
            and a resume

Rank 0 writes OUT/<tag>.json: the global step reached, the weights the first training step
of this run started from (resume) or the weights saved at step 4 (train), the planner and
no_dist its saves passed to dcp.save; kill and faults: each failure's exception."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from conftest import flip_blobs


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.mse_loss(self.net(x), labels)}


class Data(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self) -> None:
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(96, 8, generator=g)
        self.y = torch.randn(96, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


def weights(model: nn.Module) -> dict[str, list[float]]:
    model = getattr(model, "module", model)
    return {k: v.detach().flatten().tolist() for k, v in model.state_dict().items()}


def build(args: Any, out_dir: Path, job: str, max_steps: int, seed: int, callbacks: Any) -> Any:
    from transformers import TrainingArguments

    from ckptd.hf_trainer import CkptdTrainer

    torch.manual_seed(seed)
    targs = TrainingArguments(
        output_dir=str(out_dir),
        use_cpu=True,
        per_device_train_batch_size=4,
        max_steps=max_steps,
        save_steps=2,
        save_total_limit=1,
        logging_steps=100,
        report_to=[],
        learning_rate=1e-2,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    return CkptdTrainer(
        model=Tiny(), args=targs, train_dataset=Data(), callbacks=callbacks, ckptd_job=job
    )


def record_saves(result: dict[str, Any]) -> None:
    """Wraps dcp.save as ckptd.hf_trainer calls it: the planner and no_dist of each save."""
    import torch.distributed.checkpoint as dcp

    import ckptd.hf_trainer as hft

    save = dcp.save

    def recorded(*a: Any, **k: Any) -> Any:
        result["planner"] = type(k.get("planner")).__name__
        result["no_dist"] = k.get("no_dist", False)
        return save(*a, **k)

    hft.dcp = SimpleNamespace(save=recorded, load=dcp.load)  # torch's module is left alone


def attempt(out: dict[str, Any], name: str, fn: Any) -> None:
    begin = time.monotonic()
    try:
        out[name] = f"returned {fn()!r}"
    except Exception as e:
        out[name] = f"{type(e).__name__}: {e}"[:400]
    out[f"{name}_seconds"] = round(time.monotonic() - begin, 1)


def faults(args: Any) -> dict[str, Any]:
    """One rank: a checkpoint at step 2 whose blobs are flipped, resumed; then the daemon
    killed: a save (a fresh run reaching step 2) and a resume of the saved folder."""
    out: dict[str, Any] = {}
    empty = build(args, args.dir / "empty", f"{args.job}/empty", 2, 0, [])
    attempt(out, "none", lambda: empty.train(resume_from_checkpoint=True))
    build(args, args.dir / "corrupt", f"{args.job}/corrupt", 2, 0, []).train()
    state_dir = Path(os.environ["CKPTD_STATE_DIR"])
    blobs = [b for b in (state_dir / "data").rglob("*.blob") if "corrupt" in str(b)]
    out["blobs"] = flip_blobs(blobs)
    resume = build(args, args.dir / "corrupt", f"{args.job}/corrupt", 4, 99, [])
    attempt(out, "corrupt", lambda: resume.train(resume_from_checkpoint=True))
    os.kill(int(os.environ["CKPTD_PID"]), signal.SIGKILL)
    fresh = build(args, args.dir / "down", f"{args.job}/down", 2, 0, [])
    attempt(out, "down_save", fresh.train)
    down = args.dir / "down"
    out["down_folders"] = sorted(os.listdir(down)) if down.exists() else []
    resume = build(args, args.dir / "corrupt", f"{args.job}/corrupt", 4, 99, [])
    attempt(out, "down_load", lambda: resume.train(resume_from_checkpoint=True))
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("train", "resume", "kill", "faults"))
    p.add_argument("--job", required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", required=True)
    args = p.parse_args()

    from transformers import TrainerCallback

    seen: dict[str, Any] = {}

    class Watch(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            seen.setdefault("first_step_weights", weights(kw["model"]))
            seen.setdefault("first_step", state.global_step)

        def on_save(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            seen["saved_weights"] = weights(kw["model"])

    record_saves(seen)
    if args.mode == "faults":
        result = faults(args)
    else:
        resume = args.mode == "resume"
        steps, seed = (6, 99) if resume else (4, 0)
        trainer = build(args, args.dir, args.job, steps, seed, [Watch()])
        if args.mode == "kill" and int(os.environ["RANK"]) == 1:
            import ckptd.torch._storage as storage

            def die(self: Any, *a: Any, **k: Any) -> Any:
                if trainer.state.global_step == 4:  # killed before its part is staged
                    os.kill(os.getpid(), signal.SIGKILL)
                return write_data(self, *a, **k)

            write_data = storage.StorageWriter.write_data
            storage.StorageWriter.write_data = die  # type: ignore[method-assign]
        result = {}
        if args.mode == "kill":  # rank 0's save fails (the daemon aborts the checkpoint)
            attempt(result, "train", trainer.train)
        else:
            trainer.train(resume_from_checkpoint=resume)
        result.update(global_step=trainer.state.global_step, **seen)
    if int(os.environ.get("RANK", "0")) == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.tag}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # see conftest.run_rank


if __name__ == "__main__":
    main()
