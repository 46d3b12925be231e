"""DeepSpeed's own engine.save_checkpoint / engine.load_checkpoint through ckptd: a DeepSpeed
CheckpointEngine installed on an engine by one call.

    import ckptd.deepspeed_engine as ckde
    engine, *_ = deepspeed.initialize(...)
    ckde.install(engine, job="run42")                     # every rank, once
    # or install(engine, job="run42", overlap=True): save_checkpoint returns before its copy,
    # which overlaps forward and backward; engine.step() first waits until it is staged
    engine.save_checkpoint("ckpts")                       # returns once this rank is staged
    ...
    path, client_state = engine.load_checkpoint("ckpts")  # "latest": the newest COMMITTED one
    engine.checkpoint_engine.wait()                       # before exit: the last save is durable

DeepSpeed's config names only its built-in checkpoint engines, so install() replaces
engine.checkpoint_engine with a CkptdCheckpointEngine. DeepSpeed keeps writing its usual layout
(save_dir/tag/mp_rank_00_model_states.pt, zero_pp_rank_N_..._optim_states.pt, save_dir/latest)
and finding its files by listing save_dir, but each .pt file it names holds only a small JSON
pointer ({"ckptd": job, step, file}); the bytes are in ckptd checkpoint (job, step), step =
engine.global_steps at the save. Each state dict is pickled with its tensors taken out (as
torch.save does): every tensor is an item "<file>/<n>" of the checkpoint, copied once into the
daemon's staging arena; the rest is the object "<file>". Every rank saves its own files as its
rank of one ckptd checkpoint (rank = global rank, world size = global world size), so the daemon
commits it once every rank is staged, with no collective of ours.

Async and commit: DeepSpeed's CheckpointEngine has create/save/commit and a "decoupled" mode whose
commit is deferred. This engine is decoupled: save_checkpoint returns once this rank's part is
staged (its one memcpy; training may change the tensors from then on) and the daemon persists and
commits in the background (async_save=True, the default). DeepSpeed's own `latest` file is then
written by this engine, on global rank 0, only once the daemon reports the checkpoint COMMITTED:
a save that never completes (a rank killed mid-save: the daemon aborts it after its
stage_timeout_ms) is never named by `latest`, and load_checkpoint() without a tag resumes from
the previous one. wait() blocks until the last save is COMMITTED (raising its error, e.g.
AbortedError naming the missing ranks); DeepSpeed calls cleanup() (= wait()) from
engine.destroy(). async_save=False: save_checkpoint returns once the checkpoint is COMMITTED on
every rank, and `latest` is written before it returns.

Failures: the daemon down raises ckptd.UnavailableError naming its socket (from install(),
save_checkpoint and load_checkpoint, on every rank: each rank talks to its own node's daemon and
waits in no collective of ours). A tag whose checkpoint is missing from ckptd or whose bytes fail
their checksums raises NotFoundError / DataLossError naming the job and step; a save_dir with no
`latest` takes DeepSpeed's own "no checkpoint" path (load_checkpoint returns (None, None)). A .pt
file that is not a pointer (a checkpoint written by DeepSpeed's torch engine) is read with
torch.load, as DeepSpeed's own engine would: such checkpoints keep loading after install().

Layouts: this path keeps DeepSpeed's own file layout, so it resumes where DeepSpeed's own
load_checkpoint can (the same data-parallel size, or any size with DeepSpeed's elastic
checkpoints); ckptd.deepspeed.save/load resume at any DP size and ZeRO stage. Retention: DeepSpeed
deletes nothing; ckptd's per-job retention (the daemon's keep options) removes old steps, and a
pointer to a removed step raises NotFoundError. Loading unpickles the state dicts, as
DeepSpeed's torch engine does (torch.load(weights_only=False)): load only checkpoints you trust.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import threading
from concurrent.futures import Future
from typing import Any

import torch
from deepspeed import comm as dist
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import (
    CheckpointCommitInfo,
    CheckpointEngine,
)

import ckptd

from ._client import Client, Raw, SaveHandle

__all__ = ["POINTER", "CkptdCheckpointEngine", "install"]

POINTER = "ckptd-deepspeed-pointer"  # the "format" of a pointer file
_log = logging.getLogger("ckptd.deepspeed_engine")


class _Pickler(pickle.Pickler):
    """Pickles a state dict with each non-empty tensor replaced by the name of its item."""

    def __init__(self, out: io.BytesIO, prefix: str, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(out, protocol=pickle.HIGHEST_PROTOCOL)
        self._prefix = prefix
        self._tensors = tensors
        self._names: dict[int, str] = {}  # id(tensor) -> item: a tensor named twice is saved once
        self._keep: list[torch.Tensor] = []

    def persistent_id(self, obj: Any) -> str | None:
        if not isinstance(obj, torch.Tensor) or obj.numel() == 0:
            return None  # empty tensors pickle as themselves
        name = self._names.get(id(obj))
        if name is None:
            name = f"{self._prefix}/{len(self._names)}"
            self._names[id(obj)] = name
            self._keep.append(obj)  # ids stay unique while pickling
            self._tensors[name] = obj.detach().contiguous()
        return name


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(io.BytesIO(data))
        self._tensors = tensors

    def persistent_load(self, pid: Any) -> torch.Tensor:
        return self._tensors[str(pid)]


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class CkptdCheckpointEngine(CheckpointEngine):  # type: ignore[misc]
    """A DeepSpeed CheckpointEngine whose bytes go to ckptd (see the module's docstring). Made by
    install(); one per DeepSpeed engine."""

    def __init__(
        self,
        engine: Any,
        client: Client,
        job: str,
        *,
        async_save: bool = True,
        overlap: bool = False,
    ) -> None:
        super().__init__(None)
        self.name = "CkptdCheckpointEngine"
        self.engine = engine
        self.client = client
        self.job = job
        self.async_save = async_save
        self.overlap = overlap
        self._staging: Future[dict[str, Any]] | None = None  # overlap: the last save's staging
        self._info: CheckpointCommitInfo | None = None
        self._step = 0
        self._tensors: dict[str, torch.Tensor] = {}
        self._objects: dict[str, Any] = {}
        # the last save: its step, its commit, and set once `latest` was handled after it
        self._last: tuple[int, Future[dict[str, Any]], threading.Event] | None = None
        self._latest_lock = threading.Lock()
        self._latest_written = -1

    # --- DeepSpeed's CheckpointEngine --------------------------------------------------------
    def create(self, info: CheckpointCommitInfo) -> None:
        if self._info is not None:  # a save_checkpoint that raised before staging
            self._tensors.clear()
            self._objects.clear()
        self._info = info
        self._step = int(self.engine.global_steps)

    def save(self, state_dict: Any, path: str) -> None:
        info = self._require_info(path)
        file = os.path.relpath(path, os.path.join(info.save_dir, info.tag))
        if file in self._objects:
            raise ValueError(f"ckptd.deepspeed_engine: {path} saved twice in one checkpoint")
        out = io.BytesIO()
        _Pickler(out, file, self._tensors).dump(state_dict)  # the rest pickled now, as torch.save
        self._objects[file] = Raw(out.getvalue())
        pointer = {"format": POINTER, "job": self.job, "step": self._step, "file": file}
        _write_atomically(path, json.dumps(pointer))

    def load(self, path: str, map_location: Any = None) -> Any:
        self.wait_staged()  # a load writes the tensors a save may still be copying
        pointer = _read_pointer(path)
        if pointer is None:  # not ours: a file DeepSpeed's torch engine wrote
            return torch.load(path, map_location=map_location, weights_only=False)
        job, step, file = str(pointer["job"]), int(pointer["step"]), str(pointer["file"])
        raw = self.client.load_object(job, step, file, raw=True)
        prefix = f"{file}/"
        names = [r["name"] for r in self.client.inspect(job, step) if r["name"].startswith(prefix)]
        tensors: dict[str, torch.Tensor] = {}
        if names:
            tensors = self.client.load(job, step, items=names, objects=[], as_torch=True).tensors
        if isinstance(map_location, (str, torch.device)) and str(map_location) != "cpu":
            tensors = {k: v.to(map_location) for k, v in tensors.items()}
        return _Unpickler(raw, tensors).load()

    def commit(self, info: CheckpointCommitInfo) -> bool:
        # stage() commits; DeepSpeed never calls this for a decoupled engine (get_commit_info)
        return True

    def is_decoupled(self) -> bool:
        return True  # DeepSpeed then leaves `latest` to this engine

    def get_commit_info(self) -> None:
        return None  # nothing for DeepSpeed to commit at the next step: stage() did

    def cleanup(self) -> None:
        """engine.destroy(): waits for the last save; logs (never raises) its failure."""
        try:
            self.wait()
        except Exception as e:
            _log.error("ckptd.deepspeed_engine: the last save of job %s failed: %s", self.job, e)

    def preserves_storage_sharing(self) -> bool:
        return False  # each tensor's own bytes are saved: DeepSpeed need not clone views

    # --- ckptd's staged / committed ----------------------------------------------------------
    def stage(self) -> SaveHandle | None:
        """Saves this rank's files of the save_checkpoint that just ran as its rank of ckptd
        checkpoint (job, step); returns once staged (async_save) or committed. Called by the
        save_checkpoint that install() wraps."""
        info = self._info
        if info is None:
            return None
        tensors, objects = self._tensors, self._objects
        self._info, self._tensors, self._objects = None, {}, {}
        step = self._step
        self.wait_staged()
        handle = self.client.save(
            self.job,
            step,
            tensors,
            objects,
            rank=dist.get_rank(),
            world_size=dist.get_world_size(),
            blocking=not self.overlap,
        )
        if self.overlap:
            self._staging = handle.staged()
        committed = handle.committed()
        handled = threading.Event()
        self._last = (step, committed, handled)
        writes_latest = dist.get_rank() == 0 and info.save_latest
        if not self.async_save:
            committed.result()
            if writes_latest:
                self._write_latest(info, step)  # before save_checkpoint returns, as DeepSpeed's
            handled.set()
            dist.barrier()
        elif writes_latest:
            committed.add_done_callback(lambda f: self._on_committed(f, info, step, handled))
        else:
            handled.set()
        return handle

    def wait_staged(self) -> None:
        """overlap: blocks until the last save is staged (its tensors may change from then on),
        raising its error; install() calls it before every engine.step() and load."""
        staging, self._staging = self._staging, None
        if staging is not None:
            staging.result()

    def wait(self, timeout: float | None = None) -> int | None:
        """Blocks until the last save is COMMITTED and returns its step (None if none): raises
        what made it fail (AbortedError naming the ranks missing, DataLossError, ...)."""
        self.wait_staged()
        if self._last is None:
            return None
        step, committed, handled = self._last
        committed.result(timeout)
        handled.wait(timeout)  # rank 0: `latest` written
        return step

    # --- helpers ------------------------------------------------------------------------------
    def _require_info(self, path: str) -> CheckpointCommitInfo:
        if self._info is None:
            raise RuntimeError(
                f"ckptd.deepspeed_engine: save({path}) outside engine.save_checkpoint"
            )
        return self._info

    def _on_committed(
        self,
        f: Future[dict[str, Any]],
        info: CheckpointCommitInfo,
        step: int,
        handled: threading.Event,
    ) -> None:
        try:
            self._latest_after(f, info, step)
        finally:
            handled.set()

    def _latest_after(
        self, f: Future[dict[str, Any]], info: CheckpointCommitInfo, step: int
    ) -> None:
        error = f.exception()
        if error is not None:
            _log.error(
                "ckptd.deepspeed_engine: job %s step %s (tag %s) did not commit, `latest` not "
                "updated: %s",
                self.job,
                step,
                info.tag,
                error,
            )
            return
        self._write_latest(info, step)

    def _write_latest(self, info: CheckpointCommitInfo, step: int) -> None:
        with self._latest_lock:
            if step < self._latest_written:
                return  # a later save committed first: `latest` never goes back
            _write_atomically(os.path.join(info.save_dir, "latest"), info.tag)
            self._latest_written = step


def _read_pointer(path: str) -> dict[str, Any] | None:
    with open(path, "rb") as f:
        head = f.read(4096)
    if not head.startswith(b"{"):
        return None
    try:
        pointer = json.loads(head)
    except ValueError:
        return None
    if not isinstance(pointer, dict) or pointer.get("format") != POINTER:
        return None
    return pointer


def install(
    engine: Any,
    job: str,
    *,
    client: Client | None = None,
    async_save: bool = True,
    overlap: bool = False,
) -> CkptdCheckpointEngine:
    """Makes engine.save_checkpoint / load_checkpoint go through ckptd checkpoint job `job`
    (every rank, after deepspeed.initialize). client: default ckptd.connect() ($CKPTD_SOCKET;
    UnavailableError naming the socket when the daemon is down). async_save: save_checkpoint
    returns once this rank is staged and `latest` follows the daemon's commit (True), or once
    committed (False). overlap (with async_save): the overlapped save — save_checkpoint returns
    before its copy, which runs on the client's save thread while forward and backward run; the
    next engine.step() (and a load_checkpoint) first waits until it is staged, so the state the
    checkpoint holds is the one of the save_checkpoint call. Returns the engine also found at
    engine.checkpoint_engine."""
    if overlap and not async_save:
        raise ValueError("ckptd.deepspeed_engine.install: overlap=True needs async_save=True")
    if client is None:
        client = ckptd.connect()
    ce = CkptdCheckpointEngine(engine, client, job, async_save=async_save, overlap=overlap)
    engine.checkpoint_engine = ce
    original = engine.save_checkpoint

    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        done = original(*args, **kwargs)
        ce.stage()
        return done

    save_checkpoint.__doc__ = original.__doc__
    engine.save_checkpoint = save_checkpoint  # this engine object only
    if overlap:
        original_step = engine.step

        def step(*args: Any, **kwargs: Any) -> Any:
            ce.wait_staged()  # the step changes what the last save may still be copying
            return original_step(*args, **kwargs)

        step.__doc__ = original_step.__doc__
        engine.step = step
    return ce
