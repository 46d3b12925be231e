"""TorchTitan's checkpoint manager on ckptd (tested with torchtitan 0.3.0, torch 2.13).

    from ckptd.torchtitan import CkptdCheckpointManager

    def my_llama3() -> Trainer.Config:                 # a config_registry function
        config = llama3_8b()
        config.checkpoint = CkptdCheckpointManager.Config(
            enable=True, folder="ckptd://runs/llama3-8b", interval=500, keep_latest_k=3,
            async_mode="async",
        )
        return config

TorchTitan's Trainer builds its checkpoint manager from `Trainer.Config.checkpoint` (any
`BaseCheckpointManager.Config`: `config.checkpoint.build(...)` constructs the class that
declares that Config). CkptdCheckpointManager is TorchTitan's DCP CheckpointManager with the
storage underneath replaced, so every other option (interval, async_mode, keep_latest_k,
load_step, initial_load_*, last_save_model_only / export_dtype, exclude_from_loading,
enable_first_step_checkpoint, load_only) keeps TorchTitan's meaning:

- Each checkpoint is the DCP checkpoint f"{job}/step-{step}" written through ckptd.torch's
  StorageWriter (every rank stages its own shards, the daemon commits), and read back at any
  world size through its StorageReader. Planless (no collective at all: ckptd.torch.LocalPlanner
  with no_dist) when every rank is its own data-parallel rank (the dataloader's dp_world_size is
  the world size: FSDP, DDP or HSDP without tensor, context or pipeline parallelism; without a
  dataloader: every parameter a DTensor on a mesh of all ranks, so no pipeline stages): DTensor
  replicas are written by the rank at coordinate 0 of their Replicate mesh dims, each rank's
  dataloader entry (dataloader.dp_rank_<r>, which it alone holds) by that rank, every other
  value (plain tensors such as optimizer steps, LR schedulers, the train state) by rank 0, as
  they are the same on every data-parallel rank. With tensor, context or pipeline parallelism
  a non-DTensor value may be held by some ranks only (a pipeline stage's), so DCP's collective
  planning (a rank-0 gather) is kept there. The job path is `job=`, else the
  `folder` (a "ckptd://" folder as it is, a plain one joined to the dump folder).
- async_mode "disabled": save() returns at COMMITTED. "async": returns once this rank's shards
  are copied into the daemon's staging arena and handed to it (once every rank has, the
  checkpoint completes even if the trainers die); the next save waits for the commit and raises
  its error. "async_with_pinned_mem": that copy runs in a background thread while the next step
  computes (the arena is the staging memory: TorchTitan's DefaultStager and checkpoint process
  are not built); TorchTitan's maybe_wait_for_staging() waits for it before optimizer.step().
- "latest" (load_step=-1) is the job's newest COMMITTED step: a checkpoint some rank never
  staged, or one a killed run left half-written, is never COMMITTED, so never loaded.
  keep_latest_k keeps that many COMMITTED steps (rank 0 deletes older ones after each save; an
  asynchronous save in flight is not counted, so k whole checkpoints remain if it fails).
- A job without any checkpoint is TorchTitan's "no checkpoint" path: initial_load_path (a local
  DCP or Hugging Face folder as TorchTitan reads it, or "ckptd://<job>[/step-N]"), else a fresh
  start. A job that holds checkpoints none of which is COMMITTED raises instead (never a silent
  fresh start: torchtitan#3732), and so do a load_step that is not committed, a corrupt
  checkpoint (ckptd.DataLossError naming the item) and the daemon down
  (ckptd.UnavailableError naming its socket, already when the manager is built).
- The last save with last_save_model_only is a model-only export of that step in export_dtype;
  it is marked as one, and resuming a run from it raises (load it with initial_load_path and
  initial_load_model_only instead). last_save_in_hf writes Hugging Face safetensors to the local
  folder dump_folder/folder/step-N, as TorchTitan does (name the job with job= then: TorchTitan
  refuses last_save_in_hf with a "://" folder).

torchtitan is imported by this module only (`import ckptd` never imports it). Loading unpickles
the non-tensor state (dataloader, LR schedulers, train state), as DCP does: load only
checkpoints you trust.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import warnings
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import DTensor
from torchtitan.components.checkpointer import DATALOADER, MODEL, AsyncMode
from torchtitan.components.checkpointer import CheckpointManager as _DcpCheckpointManager
from torchtitan.tools import filesystem
from torchtitan.tools.logging import logger
from torchtitan.tools.utils import GarbageCollection

import ckptd

from .torch import _ids
from .torch._connection import connect, rank_world
from .torch._errors import ckptd_errors as _ckptd_errors
from .torch._planner import LocalPlanner
from .torch._reader import StorageReader
from .torch._storage import StorageWriter

__all__ = ["MARK", "CkptdCheckpointManager"]

SCHEME = "ckptd://"
MARK = "ckptd.torchtitan"  # an object item of every checkpoint: {"format", "step", "model_only"}
FORMAT = 1


def _job_path(path: str, what: str) -> str:
    """A ckptd job path from a folder or URI: "ckptd://" and empty or "." components dropped."""
    raw = path[len(SCHEME) :] if path.startswith(SCHEME) else path
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"ckptd.torchtitan: {what} {path!r} does not name a ckptd job path")
    return "/".join(parts)


def _split_step(path: str) -> tuple[str, int | None]:
    """("runs/x", 5) for "runs/x/step-5"; ("runs/x", None) for "runs/x" (its latest)."""
    head, _, last = path.rpartition("/")
    if head and last.startswith("step-") and last[5:].isdigit():
        return head, int(last[5:])
    return path, None


class _ArenaStager:
    """Stands in TorchTitan's DefaultStager slot (see CkptdCheckpointManager.__init__)."""

    def close(self) -> None:
        pass


class CkptdCheckpointManager(_DcpCheckpointManager):
    """TorchTitan's CheckpointManager with its checkpoints in ckptd (module docstring)."""

    @dataclass(kw_only=True, slots=True)
    class Config(_DcpCheckpointManager.Config):
        job: str = ""
        """ckptd job path of the checkpoints (e.g. "runs/llama3"); empty: the folder."""

        socket: str | None = None
        """The daemon's socket; None: $CKPTD_SOCKET, else the default socket."""

        tier_policy: str = "default"
        """Tiers each checkpoint is made durable on (docs/OPERATIONS.md "Tiers")."""

        commit_timeout_ms: int = 3600 * 1000
        """How long a save waits for its checkpoint to commit."""

    def __init__(self, config: Config, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        if not self.enable:
            return
        base = kwargs.get("base_folder", "")
        if config.job:
            self.job_path = _job_path(config.job, "checkpoint.job")
        elif config.folder.startswith(SCHEME):
            self.job_path = _job_path(config.folder, "checkpoint.folder")
        else:
            self.job_path = _job_path(filesystem.join(base, config.folder), "checkpoint.folder")
        self.job = _ids.encode_job(self.job_path)
        if config.folder.startswith(SCHEME):  # self.folder: local, for Hugging Face files only
            self.folder = filesystem.join(base, self.job_path)
        self.socket = config.socket
        self.tier_policy = config.tier_policy
        self.commit_timeout_ms = config.commit_timeout_ms
        self._model_only_save = False
        self._writer: StorageWriter | None = None
        # async_with_pinned_mem: TorchTitan builds a DefaultStager (pinned host buffers and a
        # checkpoint process) when this slot is empty; ckptd's writer stages into the daemon's
        # arena itself, so the slot holds a stand-in and none is built.
        self.stager = _ArenaStager()
        # Asks the daemon now: one that is down fails the run at start, naming its socket.
        self._client = connect(self.socket, self.tier_policy)
        self._committed_steps(self.job)
        logger.info(f"Checkpoints go to ckptd job {self.job_path} ({self.job}).")

    # --- where checkpoints are --------------------------------------------------------------
    def _create_checkpoint_id(self, step: int, folder: str = "") -> str:
        return f"{self.job_path}/step-{step}"

    def _committed_steps(self, job: str) -> tuple[list[int], list[dict[str, Any]]]:
        try:
            rows = list(self._client.list(job))
        except ckptd.NotFoundError:
            rows = []
        steps = sorted(int(r["step"]) for r in rows if r["state"] == "COMMITTED")
        return steps, rows

    def _find_load_step(self, folder: str = "") -> int:
        steps, _ = self._committed_steps(self.job)
        return steps[-1] if steps else -1

    def _marker(self, job: str, step: int) -> dict[str, Any]:
        try:
            raw = self._client.load_object(job, step, MARK, raw=True)
        except ckptd.NotFoundError:
            return {}  # not written by this module (e.g. a plain ckptd.torch DCP save)
        payload = torch.load(io.BytesIO(raw), weights_only=True)
        return dict(json.loads(payload))

    # --- save -------------------------------------------------------------------------------
    def _save_last_step(self, curr_step: int) -> None:
        self._model_only_save = self.last_save_model_only
        try:
            super()._save_last_step(curr_step)
        finally:
            self._model_only_save = False

    @torch.no_grad()
    def dcp_save(
        self,
        state_dict: dict[str, Any],
        checkpoint_id: str,
        async_mode: AsyncMode,
        enable_garbage_collection: bool = False,
        to_hf: bool = False,
    ) -> Any:
        if to_hf:  # safetensors for other tools: a local folder, as TorchTitan writes it
            local = filesystem.join(self.folder, posixpath.basename(checkpoint_id))
            os.makedirs(local, exist_ok=True)
            return super().dcp_save(
                state_dict, local, async_mode, enable_garbage_collection, to_hf=True
            )
        _, step = _split_step(checkpoint_id)
        mark = {"format": FORMAT, "step": step, "model_only": self._model_only_save}
        state_dict = {**state_dict, MARK: json.dumps(mark).encode()}
        self._close_writer()
        planner = self._local_planner()
        writer = StorageWriter(
            checkpoint_id,
            socket=self.socket,
            tier_policy=self.tier_policy,
            commit_timeout_ms=self.commit_timeout_ms,
            async_staging=async_mode == AsyncMode.ASYNC_WITH_PINNED_MEM,
            planner=planner,
        )
        planless: dict[str, Any] = {} if planner is None else {"planner": planner, "no_dist": True}
        ret: Any = None
        with _ckptd_errors(), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            if async_mode == AsyncMode.DISABLED:
                dcp.save(state_dict, storage_writer=writer, **planless)
                writer.close()
            else:  # the writer is its own stager: no DefaultStager, no checkpoint process
                ret = dcp.async_save(
                    state_dict, storage_writer=writer, process_group=self.pg, **planless
                )
                self._writer = writer
        if enable_garbage_collection:
            GarbageCollection.collect("GC collection invoked by checkpointer.")
        return ret

    def _local_planner(self) -> LocalPlanner | None:
        """A LocalPlanner when every rank is its own data-parallel rank (module docstring),
        else None (DCP's collective planning)."""
        rank, world = rank_world()
        dataloader = self.states.get(DATALOADER)
        if dataloader is not None:
            if getattr(dataloader, "dp_world_size", None) != world:
                return None
        elif world > 1 and not self._model_spans_world(world):
            return None
        mine = f"{DATALOADER}.dp_rank_"

        def owns(fqn: str) -> bool:
            return fqn.startswith(mine) or rank == 0

        return LocalPlanner(process_group=self.pg, owns=owns)

    def _model_spans_world(self, world: int) -> bool:
        """Every parameter is a DTensor on a mesh of all `world` ranks: no pipeline stages
        (their meshes are smaller, or their parameters plain), so the non-DTensor values are
        the same on every rank."""
        parts = getattr(self.states.get(MODEL), "model", None) or []
        params = [p for part in parts for p in part.parameters()]
        return bool(params) and all(
            isinstance(p, DTensor) and p.device_mesh.size() == world for p in params
        )

    def _wait_for_saving(self) -> None:
        future: Future[Any] | None = self.save_future
        self.save_future = None
        try:
            with _ckptd_errors():
                if future is not None:
                    future.result()
        finally:
            self._close_writer()

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def _purge_stale_checkpoints(self) -> None:
        """keep_latest_k: rank 0 deletes the COMMITTED steps older than the newest k. TorchTitan
        counts a save still in flight as one of its k folders; here only committed ones count,
        so k whole checkpoints remain even when the save in flight fails."""
        if self.keep_latest_k <= 0 or rank_world()[0] != 0:
            return
        steps, _ = self._committed_steps(self.job)
        for step in steps[: -self.keep_latest_k]:
            try:
                self._client.delete(self.job, step)
                logger.info(f"Checkpointer deleted ckptd job {self.job} step {step}.")
            except ckptd.CkptdError as e:  # as TorchTitan's purge thread: warn, go on
                logger.warning(f"Checkpointer failed to delete {self.job} step {step}: {e}")

    def _close(self) -> None:
        try:
            if getattr(self, "save_future", None) is not None:
                self._wait_for_saving()
        finally:
            self._close_writer()
            super()._close()

    # --- load -------------------------------------------------------------------------------
    @torch.no_grad()
    def _load(self, step: int = -1) -> bool:
        steps, rows = self._committed_steps(self.job)
        if step != -1:
            if step not in steps:
                raise FileNotFoundError(
                    f"--checkpoint.load_step={step} not found: ckptd job {self.job_path} "
                    f"({self.job}) has no committed step {step} (committed: {steps})"
                )
            return self._resume(step)
        if steps:
            newer = [f"{r['step']} ({r['state']})" for r in rows if int(r["step"]) > steps[-1]]
            if newer:  # killed mid-save (ABORTED), or damaged (CORRUPT, MISSING): never loaded
                logger.warning(
                    f"ckptd job {self.job_path}: resuming from step {steps[-1]}, the newest "
                    f"COMMITTED one; newer: {', '.join(newer)}"
                )
            return self._resume(steps[-1])
        if rows:
            states = sorted({str(r["state"]) for r in rows})
            raise FileNotFoundError(
                f"ckptd job {self.job_path} ({self.job}) holds {len(rows)} checkpoint(s), none "
                f"COMMITTED ({', '.join(states)}): refusing to start from scratch. Delete them "
                f"(ckptctl rm {self.job} <step>) to start over"
            )
        return self._initial_load()

    def _resume(self, step: int) -> bool:
        mark = self._marker(self.job, step)
        if mark.get("model_only") and step != 0:
            raise ValueError(
                f"ckptd job {self.job_path} step {step} is a model-only export (the last save "
                "with last_save_model_only): it cannot resume training. Load it with "
                f"initial_load_path='{SCHEME}{self.job_path}/step-{step}' and "
                "initial_load_model_only=True in another job"
            )
        logger.info(f"Loading the checkpoint from ckptd job {self.job_path} step {step}.")
        self._ckptd_load(self._states_to_load(step == 0), self.job_path, step)
        return True

    def _initial_load(self) -> bool:
        path = self.initial_load_path
        if path and path.startswith(SCHEME):
            if self.initial_load_in_hf:
                raise ValueError(
                    f"checkpoint.initial_load_path {path}: initial_load_in_hf reads a local "
                    "Hugging Face folder, not a ckptd checkpoint"
                )
            job_path, step = _split_step(_job_path(path, "checkpoint.initial_load_path"))
            job = _ids.encode_job(job_path)
            steps, _ = self._committed_steps(job)
            if step is None and steps:
                step = steps[-1]
            if step is None or step not in steps:
                raise ValueError(
                    f"Checkpoint.initial_load_path is invalid: {path} (ckptd job {job}) has no "
                    f"committed checkpoint{'' if step is None else f' at step {step}'}"
                )
            logger.info(f"Loading the initial checkpoint from {path} (step {step}).")
            self._ckptd_load(self._states_to_load(self.initial_load_model_only), job_path, step)
            return True
        return bool(super()._load(-1))  # TorchTitan's: a local folder, HF assets or a fresh start

    def _ckptd_load(self, states: dict[str, Any], job_path: str, step: int) -> None:
        reader = StorageReader(f"{job_path}/step-{step}", socket=self.socket)
        with _ckptd_errors():
            dcp.load(states, storage_reader=reader)
        if MODEL in self.states:
            self.states[MODEL].load_state_dict(states)
        GarbageCollection.collect("GC collection for checkpoint loading.")
