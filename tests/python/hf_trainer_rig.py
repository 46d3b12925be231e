"""One rank of a transformers Trainer run on CPU (DDP over gloo) through ckptd.hf_trainer's
CkptdTrainer, for test_hf_trainer.py: a tiny regression model, save_steps=2,
save_total_limit=1.

    train:  max_steps=4 (checkpoints at steps 2 and 4; the folder and ckptd step 2 rotated out)
    resume: max_steps=6, resume_from_checkpoint=True, a fresh model (another seed)

Rank 0 writes OUT/<tag>.json: the global step reached, and the weights the first training step
of this run started from (resume) or the weights saved at step 4 (train)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn


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


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("train", "resume"))
    p.add_argument("--job", required=True)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", required=True)
    args = p.parse_args()

    from transformers import TrainerCallback, TrainingArguments

    from ckptd.hf_trainer import CkptdTrainer

    seen: dict[str, Any] = {}

    class Watch(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            seen.setdefault("first_step_weights", weights(kw["model"]))
            seen.setdefault("first_step", state.global_step)

        def on_save(self, targs: Any, state: Any, control: Any, **kw: Any) -> None:
            seen["saved_weights"] = weights(kw["model"])

    torch.manual_seed(0 if args.mode == "train" else 99)
    targs = TrainingArguments(
        output_dir=str(args.dir),
        use_cpu=True,
        per_device_train_batch_size=4,
        max_steps=4 if args.mode == "train" else 6,
        save_steps=2,
        save_total_limit=1,
        logging_steps=100,
        report_to=[],
        learning_rate=1e-2,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = CkptdTrainer(
        model=Tiny(),
        args=targs,
        train_dataset=Data(),
        callbacks=[Watch()],
        ckptd_job=args.job,
    )
    trainer.train(resume_from_checkpoint=args.mode == "resume")
    if trainer.args.process_index == 0:
        result = {"global_step": trainer.state.global_step, **seen}
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.tag}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # see conftest.run_rank


if __name__ == "__main__":
    main()
