"""transformers' Trainer with its checkpoints in ckptd: CkptdTrainer, the one class to name.

    from ckptd.hf_trainer import CkptdTrainer
    trainer = CkptdTrainer(model=model, args=args, train_dataset=ds, ckptd_job="runs/llama")
    trainer.train(resume_from_checkpoint=True)      # the newest checkpoint-N of output_dir

Trainer decides when to save (save_strategy, save_steps) and names each checkpoint
output_dir/checkpoint-<global_step>; it finds "last" by listing output_dir. CkptdTrainer keeps
that: the model, the optimizer, the LR scheduler and each rank's RNG states go to ckptd as
checkpoint f"{ckptd_job}/step-<global_step>" (torch's state_dict helpers and ckptd.torch's DCP
writer: DDP and FSDP2 models save only their own shards, and load at another world size), and
the folder checkpoint-<step> holds only trainer_state.json and ckptd.json (the job and step).
The folder appears (renamed into place) only once the ckptd checkpoint is COMMITTED, so
resume_from_checkpoint=True never picks a save that did not complete. Saves are planless
(ckptd.torch.LocalPlanner with no_dist, as ckptd.accelerate.save_state): no collective and no
rank-0 gather of plans; the daemon commits once every rank's part is in. save_total_limit rotates
the folders as Trainer does and deletes the ckptd steps whose folders it removed. A folder
without ckptd.json (a checkpoint Trainer wrote itself) loads as Trainer would load it.

Failures: the daemon down raises ckptd.UnavailableError naming the socket; a folder whose ckptd
checkpoint is gone raises ckptd.NotFoundError, a corrupt one ckptd.DataLossError (never a fresh
start); no checkpoint folder at all is Trainer's own ValueError("No valid checkpoint found").
Not covered: DeepSpeed inside Trainer (it checkpoints through DeepSpeed: see
ckptd.deepspeed_engine), PEFT adapters, GradScaler state (CPU / bf16 runs need none).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from typing import Any

import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from transformers import Trainer
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from .accelerate import _ckptd_errors, _no_dist_warning, _rng_state, _set_rng_state
from .torch import _ids
from .torch._connection import connect
from .torch._planner import LocalPlanner
from .torch._reader import StorageReader
from .torch._storage import StorageWriter

__all__ = ["MARKER", "CkptdTrainer"]

MARKER = "ckptd.json"
TRAINER_STATE = "trainer_state.json"


def _rank() -> int:
    return tdist.get_rank() if tdist.is_available() and tdist.is_initialized() else 0


def _marker(checkpoint: str | None) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    path = os.path.join(checkpoint, MARKER)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        marker: dict[str, Any] = json.load(f)
    return marker


class CkptdTrainer(Trainer):  # type: ignore[misc]
    """transformers.Trainer whose checkpoints live in ckptd (see the module's docstring).
    ckptd_job: the run's name in ckptd ("runs/llama"); ckptd_socket: default $CKPTD_SOCKET."""

    def __init__(
        self, *args: Any, ckptd_job: str, ckptd_socket: str | None = None, **kw: Any
    ) -> None:
        super().__init__(*args, **kw)
        self.ckptd_job = ckptd_job.strip("/")
        self.ckptd_socket = ckptd_socket

    # --- save ---------------------------------------------------------------------------------
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        step = int(self.state.global_step)
        if self.hp_search_backend is None and trial is None:
            self.store_flos()
        run_dir = self._get_output_dir(trial=trial)
        output_dir = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}")
        optimizer = [] if self.args.save_only_model else self.optimizer
        model_sd, optim_sd = get_state_dict(self.model_wrapped, optimizer)
        state: dict[str, Any] = {"model": model_sd}
        if optimizer:
            state["optim"] = optim_sd
            scheduler = None if self.lr_scheduler is None else self.lr_scheduler.state_dict()
            state["trainer"] = pickle.dumps({"scheduler": scheduler})
            state[f"rng.rank{_rank()}"] = pickle.dumps(_rng_state())
        # Planless (as ckptd.accelerate.save_state): no collective, no rank-0 gather of plans.
        # DTensor replicas go from the rank at coordinate 0 of their Replicate dims, each rank's
        # rng item from that rank, every other value (DDP's replicated model and optimizer, the
        # scheduler) from rank 0, as DCP's dedup would keep one copy.
        rank = _rank()
        planner = LocalPlanner(owns=lambda fqn: fqn.startswith("rng.rank") or rank == 0)
        writer = StorageWriter(
            f"{self.ckptd_job}/step-{step}", socket=self.ckptd_socket, planner=planner
        )
        with _ckptd_errors(), _no_dist_warning():
            # returns once COMMITTED (every rank's part in: the daemon commits)
            dcp.save(state, storage_writer=writer, planner=planner, no_dist=True)
        if not self.args.should_save:
            return
        for cb in [*self.callback_handler.callbacks, self.control]:
            if isinstance(cb, ExportableState):
                name = cb.__class__.__name__
                if isinstance(self.state.stateful_callbacks.get(name), list):
                    self.state.stateful_callbacks[name].append(cb.state())
                else:
                    self.state.stateful_callbacks[name] = cb.state()
        tmp = f"{output_dir}.tmp-ckptd"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        self.state.save_to_json(os.path.join(tmp, TRAINER_STATE))
        with open(os.path.join(tmp, MARKER), "w") as f:
            json.dump({"job": self.ckptd_job, "step": step}, f)
        shutil.rmtree(output_dir, ignore_errors=True)
        os.rename(tmp, output_dir)  # the folder appears once the checkpoint is COMMITTED
        self._rotate_ckptd(run_dir)

    def _rotate_ckptd(self, run_dir: str) -> None:
        """Trainer's save_total_limit on the folders, then the ckptd steps they named."""
        from transformers.trainer_utils import rotate_checkpoints

        limit = self.args.save_total_limit
        if not limit:
            return
        rotate_checkpoints(
            output_dir=run_dir,
            save_total_limit=limit,
            best_model_checkpoint=self.state.best_model_checkpoint,
        )
        client = connect(self.ckptd_socket)
        job = _ids.encode_job(self.ckptd_job)
        for row in client.list(job):
            folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{int(row['step'])}")
            if row["state"] == "COMMITTED" and not os.path.isdir(folder):
                client.delete(job, int(row["step"]))

    # --- load ---------------------------------------------------------------------------------
    def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
        if _marker(resume_from_checkpoint) is None:
            super()._load_from_checkpoint(resume_from_checkpoint, model)
        # else: loaded with the optimizer, after prepare (_load_optimizer_and_scheduler)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        marker = _marker(checkpoint)
        if marker is None:
            super()._load_optimizer_and_scheduler(checkpoint)
            return
        job, step = str(marker["job"]), int(marker["step"])
        client = connect(self.ckptd_socket)
        names = {i["name"] for i in client.inspect(_ids.encode_job(job), step)}
        optimizer = self.optimizer if "trainer" in names else []
        model_sd, optim_sd = get_state_dict(self.model_wrapped, optimizer)
        state: dict[str, Any] = {"model": model_sd}
        if optimizer:
            state["optim"] = optim_sd
            state["trainer"] = b""
        reader = StorageReader(f"{job}/step-{step}", socket=self.ckptd_socket)
        with _ckptd_errors():
            dcp.load(state, storage_reader=reader)
        set_state_dict(
            self.model_wrapped,
            optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state.get("optim", {}),
        )
        if optimizer:
            saved = pickle.loads(state["trainer"])
            if self.lr_scheduler is not None and saved["scheduler"] is not None:
                self.lr_scheduler.load_state_dict(saved["scheduler"])

    def _load_rng_state(self, checkpoint: str | None) -> None:
        marker = _marker(checkpoint)
        if marker is None:
            super()._load_rng_state(checkpoint)
            return
        job, step = str(marker["job"]), int(marker["step"])
        mine = f"rng.rank{_rank()}"
        client = connect(self.ckptd_socket)
        if mine not in {i["name"] for i in client.inspect(_ids.encode_job(job), step)}:
            return  # a rank the saving run did not have: its RNG starts from the seed
        state: dict[str, Any] = {mine: b""}
        reader = StorageReader(f"{job}/step-{step}", socket=self.ckptd_socket)
        with _ckptd_errors():
            dcp.load(state, storage_reader=reader, no_dist=True)
        _set_rng_state(pickle.loads(state[mine]))

    def _load_scaler(self, checkpoint: str | None) -> None:
        if _marker(checkpoint) is None:
            super()._load_scaler(checkpoint)
