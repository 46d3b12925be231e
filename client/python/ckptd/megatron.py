"""Megatron-core's dist_checkpointing through ckptd: a save and a load strategy.

    import ckptd.megatron as ckm
    from megatron.core import dist_checkpointing as mdc

    mdc.save(sharded_state_dict, "ckpts/gpt/iter_0000100", sharded_strategy=ckm.save_strategy())
    mdc.load(sharded_state_dict, "ckpts/gpt/iter_0000100")       # any TP/PP/DP layout

Seam. dist_checkpointing.save/load take a sharded strategy object (or a (backend, version) pair
looked up in its registry, strategies.base.default_strategies). CkptdSaveShardedStrategy and
CkptdLoadShardedStrategy subclass Megatron's torch_dist strategies (TorchDistSave/
LoadShardedStrategy): the same translation of ShardedTensors and ShardedObjects to a DCP state
dict and the same MCore planners, with ckptd.torch's StorageWriter / StorageReader where torch_dist
has its FileSystemWriterAsync / FileSystemReader. Importing this module registers both under the
backend "ckptd" (version 1), so sharded_strategy=("ckptd", 1) works too, and load() with no
strategy picks the ckptd one from the checkpoint's metadata.json. Megatron is not patched.

What stays a directory. Megatron keeps writing its checkpoint directory as it always does:
common.pt (the non-sharded state, rank 0) and metadata.json ({"sharded_backend": "ckptd", ...},
written last, after every rank finalized). The sharded tensors and sharded objects go to ckptd as
checkpoint id f"{parent of the directory}/{its name}" (or f"{job}/{its name}" with job=): job = the
parent path encoded as ckptd.torch encodes ids, step = the trailing integer of the name
(iter_0000100 -> 100; a name without one takes the job's next free step). Once that checkpoint is
COMMITTED, rank 0 writes LINK_FILE (ckptd.json: {"job", "step"}) into the directory, before
Megatron writes metadata.json, and the load strategy reads ckptd's checkpoint from it (so the
directory may be moved or copied). A directory whose save did not complete has no metadata.json,
which Megatron refuses to load ("is not a distributed checkpoint"). Saving into a directory
replaces whatever checkpoint its id already names (_replace_existing), as torch_dist overwrites
the directory's files: a run resumed after a killed save saves that iteration again.

Async. async_save() (dist_checkpointing.save(..., async_sharded_save=True)) plans with every rank
and hands each rank's shards to the daemon (one copy into its staging arena): when it returns the
tensors are free to change and the checkpoint completes even if the trainer dies. The
AsyncRequest's async_fn only waits for COMMITTED (Megatron runs it in a forked process, where
it waits on a pipe: see _wait_committed); its finalize step, on every rank, checks COMMITTED
(raising the ckptd error if the checkpoint failed) and writes the link. Megatron's
AsyncCallsQueue itself needs CUDA (torch.cuda.synchronize and CUDA tensors for its all_reduce);
the strategy does not.

Failures: the daemon down raises ckptd.UnavailableError naming its socket; a checkpoint missing
from ckptd raises ckptd.NotFoundError naming the job and step; corrupt bytes raise
ckptd.DataLossError naming the item (DCP's CheckpointException is unwrapped, see _ckptd_errors).
Sharded objects are unpickled on load (torch.load), as torch_dist does: load only checkpoints you
trust. Megatron-core is imported by this module only (`import ckptd` never imports it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import os
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from megatron.core.dist_checkpointing.dict_utils import nested_values
from megatron.core.dist_checkpointing.mapping import (
    CheckpointingException,
    ShardedObject,
    ShardedStateDict,
    ShardedTensor,
    StateDict,
)
from megatron.core.dist_checkpointing.strategies import torch as mcore_torch
from megatron.core.dist_checkpointing.strategies.async_utils import AsyncRequest
from megatron.core.dist_checkpointing.strategies.base import (
    StrategyAction,
    register_default_strategy,
)
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata

import ckptd

from .torch import _ids
from .torch._connection import connect
from .torch._errors import ckptd_errors as _ckptd_errors
from .torch._reader import StorageReader
from .torch._storage import StorageWriter

__all__ = [
    "BACKEND",
    "LINK_FILE",
    "VERSION",
    "CkptdLoadShardedStrategy",
    "CkptdSaveShardedStrategy",
    "checkpoint_id",
    "load_strategy",
    "save_strategy",
]

BACKEND = "ckptd"  # metadata.json's sharded_backend
VERSION = 1
LINK_FILE = "ckptd.json"  # in the checkpoint directory: {"job": path, "step": n}
COMMIT_TIMEOUT_MS = 3600 * 1000
_log = logging.getLogger("ckptd.megatron")


def checkpoint_id(checkpoint_dir: str | os.PathLike[str], job: str | None = None) -> str:
    """The ckptd.torch checkpoint id a save into `checkpoint_dir` writes: f"{job}/{name}", job
    default: the directory's absolute parent path ("/ckpts/gpt/iter_0000100" -> job
    "ckpts/gpt", step 100). ValueError (from ckptd.torch) when the encoded job is too long:
    then pass job=."""
    path = Path(os.fspath(checkpoint_dir))
    parent = job.strip("/") if job else str(path.resolve().parent)
    if not path.name or not parent.strip("/"):
        raise ValueError(f"ckptd.megatron: {checkpoint_dir!r} has no parent path; pass job=")
    ckpt = f"{parent}/{path.name}"
    _ids.parse(ckpt)  # ValueError naming the rule
    return ckpt


def _rank() -> int:
    return tdist.get_rank() if tdist.is_available() and tdist.is_initialized() else 0


class _StagingWriter(StorageWriter):
    """ckptd.torch's writer whose finish() waits only until every rank is staged: dcp.save then
    returns once the daemon holds the whole checkpoint, and COMMITTED is waited for by the
    AsyncRequest (async_fn, finalize)."""

    def finish(self, metadata: Metadata, results: Any) -> None:
        assert self.job is not None and self.step is not None
        self.client.wait(self.job, self.step, until="staged", timeout_ms=self.commit_timeout_ms)


@dataclasses.dataclass
class _Commit:
    """A save's wait for COMMITTED: a thread of the saving process calls the daemon's Wait and,
    whatever its outcome, writes one byte to a pipe, which a forked async_fn reads."""

    pid: int
    future: Future[dict[str, Any]]
    read_fd: int
    write_fd: int


_commits: dict[tuple[str, int], _Commit] = {}  # (job, step) -> its wait, in the saving process
_commits_lock = threading.Lock()


def _start_commit_wait(client: ckptd.Client, job: str, step: int, timeout_ms: int) -> None:
    read_fd, write_fd = os.pipe()
    future: Future[dict[str, Any]] = Future()

    def run() -> None:
        try:
            future.set_result(client.wait(job, step, committed=True, timeout_ms=timeout_ms))
        except BaseException as e:  # reported by _finalize
            future.set_exception(e)
        finally:
            os.write(write_fd, b"x")

    with _commits_lock:
        _commits[(job, step)] = _Commit(os.getpid(), future, read_fd, write_fd)
    threading.Thread(target=run, name="ckptd-megatron-commit", daemon=True).start()


def _wait_committed(socket: str | None, job: str, step: int, timeout_ms: int) -> None:
    """The AsyncRequest's async_fn: returns once (job, step) is COMMITTED or failed (_finalize
    reports which). Megatron runs it in a process forked from the trainer (TemporalAsyncCaller),
    in a spawned one (PersistentAsyncCaller) or inline (a blocking save). A forked child must not
    call gRPC (its threads stayed in the parent: a call would hang, a new channel aborts), so it
    waits on the pipe the parent's wait thread writes; a spawned process connects itself."""
    commit = _commits.get((job, step))  # no lock: a forked child may inherit it held
    if commit is None:  # another interpreter (spawned): its own connection
        connect(socket).wait(job, step, committed=True, timeout_ms=timeout_ms)
    elif commit.pid == os.getpid():  # inline
        commit.future.result()
    else:  # forked from the saving process
        os.close(commit.write_fd)
        os.read(commit.read_fd, 1)


def _finalize(
    socket: str | None, job_path: str, job: str, step: int, checkpoint_dir: str, timeout_ms: int
) -> None:
    """Every rank: raises the ckptd error unless (job, step) is COMMITTED. Rank 0 then writes the
    link file (atomically), before Megatron's own finalize writes metadata.json."""
    with _commits_lock:
        commit = _commits.pop((job, step), None)
    if commit is None:
        connect(socket).wait(job, step, committed=True, timeout_ms=timeout_ms)
    else:
        try:
            commit.future.result()
        finally:
            os.close(commit.read_fd)
            os.close(commit.write_fd)
    if _rank() != 0:
        return
    link = Path(checkpoint_dir) / LINK_FILE
    tmp = link.with_name(f".{LINK_FILE}.tmp")
    tmp.write_text(json.dumps({"job": job_path, "step": step, "ckptd_job": job}) + "\n")
    os.replace(tmp, link)


def _replace_existing(client: ckptd.Client, ckpt: str) -> None:
    """Rank 0, before a save: a checkpoint already at the id's (job, step) is removed (aborted
    first while in progress), as torch_dist overwrites the files of the directory it saves into.
    That is the resume after a killed save: Megatron restarts from the previous iteration and
    saves this one again, while the daemon holds the killed attempt (ABORTED, or STAGING until
    its stage timeout). DCP's planning exchange makes every other rank write only after this."""
    cid = _ids.parse(ckpt)
    if cid.step is None:
        return  # a named checkpoint takes the next free step
    try:
        state = client.status(cid.job, cid.step)["state"]
    except ckptd.NotFoundError:
        return
    _log.warning(
        "ckptd.megatron: %s: replacing checkpoint %s step %d (%s)", ckpt, cid.job, cid.step, state
    )
    if state not in ("COMMITTED", "ABORTED"):
        with contextlib.suppress(ckptd.FailedPreconditionError, ckptd.NotFoundError):
            client.abort(cid.job, cid.step, "replaced by a new save into the same directory")
    client.delete(cid.job, cid.step)


class CkptdSaveShardedStrategy(mcore_torch.TorchDistSaveShardedStrategy):
    """Megatron's torch_dist save strategy writing through ckptd (see the module docstring).

    job: the ckptd job path (default: the checkpoint directory's parent path); socket: the
    daemon's (default $CKPTD_SOCKET); tier_policy: StorageWriter's; commit_timeout_ms: how long
    the async_fn and finalize wait for COMMITTED. keep_only_main_replica as torch_dist's: only
    each shard's main replica is sent. Megatron's plan caching (cached_metadata) and
    thread_count do not apply: the daemon plans the writes."""

    def __init__(
        self,
        backend: str = BACKEND,
        version: int = VERSION,
        keep_only_main_replica: bool = True,
        *,
        job: str | None = None,
        socket: str | None = None,
        tier_policy: str = "default",
        commit_timeout_ms: int = COMMIT_TIMEOUT_MS,
    ) -> None:
        super().__init__(backend, version, keep_only_main_replica=keep_only_main_replica)
        self.job = job
        self.socket = socket
        self.tier_policy = tier_policy
        self.commit_timeout_ms = commit_timeout_ms

    @property
    def can_handle_sharded_objects(self) -> bool:  # type: ignore[override]
        return True  # ShardedObjects go to ckptd too (object items), not to files

    def async_save(
        self, sharded_state_dict: ShardedStateDict, checkpoint_dir: str | os.PathLike[str]
    ) -> AsyncRequest:
        """Plans with every rank and stages this rank's shards in the daemon (returns once every
        rank is staged); the AsyncRequest waits for COMMITTED and writes the link file."""
        ckpt = checkpoint_id(checkpoint_dir, self.job)
        sharded, _, _ = mcore_torch._replace_state_dict_keys_with_sharded_keys(
            sharded_state_dict, self.keep_only_main_replica
        )
        pyt_state_dict = mcore_torch.mcore_to_pyt_state_dict(sharded, False)
        writer = _StagingWriter(
            ckpt,
            socket=self.socket,
            tier_policy=self.tier_policy,
            commit_timeout_ms=self.commit_timeout_ms,
        )
        planner = mcore_torch.MCoreSavePlanner(
            dedup_replicated_tensors=not self.keep_only_main_replica, flatten_state_dict=False
        )
        if _rank() == 0:
            _replace_existing(writer.client, ckpt)
        with _ckptd_errors():
            dcp.save(pyt_state_dict, storage_writer=writer, planner=planner)
        assert writer.job is not None and writer.step is not None
        _start_commit_wait(writer.client, writer.job, writer.step, self.commit_timeout_ms)
        job_path = ckpt.rsplit("/", 1)[0]
        args = (self.socket, writer.job, writer.step, self.commit_timeout_ms)
        finalize = functools.partial(
            _finalize,
            self.socket,
            job_path,
            writer.job,
            writer.step,
            os.fspath(checkpoint_dir),
            self.commit_timeout_ms,
        )
        return AsyncRequest(functools.partial(_wait_committed, *args), (), [finalize])


def read_link(checkpoint_dir: str | os.PathLike[str]) -> tuple[str, int]:
    """(job path, step) of the ckptd checkpoint a Megatron checkpoint directory names; NotFoundError
    naming the directory when it holds no link file."""
    link = Path(os.fspath(checkpoint_dir)) / LINK_FILE
    try:
        data = json.loads(link.read_text())
        return str(data["job"]), int(data["step"])
    except FileNotFoundError:
        raise ckptd.NotFoundError(
            f"ckptd.megatron: {checkpoint_dir} has no {LINK_FILE}: it was not saved through "
            "ckptd's strategy, or its save did not complete"
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointingException(f"ckptd.megatron: {link} is not valid: {e}") from e


class _Reader(StorageReader):
    """StorageReader whose whole-checkpoint metadata, once read, is answered again without a
    round trip (dcp.load reads it once more)."""

    metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.metadata is not None and kwargs.get("rank") is None:
            return self.metadata
        return super().read_metadata(*args, **kwargs)


class CkptdLoadShardedStrategy(mcore_torch.TorchDistLoadShardedStrategy):
    """Megatron's torch_dist load strategy reading through ckptd: loads a checkpoint saved by
    CkptdSaveShardedStrategy into any TP/PP/DP layout (each rank reads only the byte ranges of
    its own shards). socket: the daemon's (default $CKPTD_SOCKET); prefetch: StorageReader's."""

    def __init__(self, *, socket: str | None = None, prefetch: bool = False) -> None:
        super().__init__()
        self.socket = socket
        self.prefetch = prefetch

    @property
    def can_handle_sharded_objects(self) -> bool:  # type: ignore[override]
        return True

    def reader(self, checkpoint_dir: str | os.PathLike[str]) -> StorageReader:
        """ckptd.torch's reader for the checkpoint the directory links to, its metadata read
        already: the ckptd error (UnavailableError naming the socket, NotFoundError naming the
        job and step) is raised here, where DCP would turn it into an AssertionError's text."""
        job, step = read_link(checkpoint_dir)
        reader = _Reader(f"{job}/step-{step}", socket=self.socket, prefetch=self.prefetch)
        reader.metadata = reader.read_metadata()
        return reader

    def load(
        self, sharded_state_dict: ShardedStateDict, checkpoint_dir: str | os.PathLike[str]
    ) -> StateDict:
        """TorchDistLoadShardedStrategy.load with ckptd's reader."""
        tensors = [t for t in nested_values(sharded_state_dict) if isinstance(t, ShardedTensor)]
        flexible = [t for t in tensors if not t.allow_shape_mismatch]
        mismatch = {t.key: t for t in tensors if t.allow_shape_mismatch}
        sharded, flat_mapping, rename_mapping = (
            mcore_torch._replace_state_dict_keys_with_sharded_keys(sharded_state_dict)
        )
        pyt_state_dict = mcore_torch.mcore_to_pyt_state_dict(sharded, True)
        planner = mcore_torch.MCoreLoadPlanner(
            shapes_validation_sharded_tensors=flexible,
            allow_shape_mismatch_sharded_tensors=mismatch,
        )
        with _ckptd_errors():
            dcp.load(pyt_state_dict, storage_reader=self.reader(checkpoint_dir), planner=planner)
        state = {k: mcore_torch._unwrap_pyt_sharded_tensor(v) for k, v in pyt_state_dict.items()}
        state = mcore_torch._replace_sharded_keys_with_state_dict_keys(
            state,
            flat_mapping,
            rename_mapping,  # type: ignore[arg-type]
        )
        mcore_torch._restore_dict_types(state, sharded_state_dict)
        return state

    def load_tensors_metadata(
        self, checkpoint_dir: str | os.PathLike[str], metadata: Metadata | None = None
    ) -> dict[str, Any]:
        """Global shape and dtype of every sharded tensor (from the daemon's manifest)."""
        if metadata is None:
            metadata = self.reader(checkpoint_dir).metadata
        return super().load_tensors_metadata(Path(checkpoint_dir), metadata)

    def load_sharded_metadata(self, checkpoint_dir: str | os.PathLike[str]) -> dict[str, Any]:
        metadata = self.reader(checkpoint_dir).metadata
        assert metadata is not None
        out: dict[str, Any] = {}
        for key, md in metadata.state_dict_metadata.items():
            if isinstance(md, BytesStorageMetadata):
                obj = ShardedObject.empty_from_unique_key(key)
                out[obj.unique_key] = obj
        out.update(self.load_tensors_metadata(checkpoint_dir, metadata))
        return out

    def remove_sharded_tensors(self, checkpoint_dir: str, key_prefix: str) -> None:
        raise NotImplementedError(
            "ckptd.megatron: a ckptd checkpoint is immutable once committed; save a new one "
            "without those tensors instead"
        )

    def check_backend_compatibility(self, loaded_backend: str) -> None:
        if loaded_backend != BACKEND:
            raise CheckpointingException(
                f"ckptd.megatron: the checkpoint's sharded_backend is {loaded_backend!r}, not "
                f"{BACKEND!r}: load it with Megatron's own strategy for that backend"
            )

    def check_version_compatibility(self, loaded_version: int) -> None:
        if int(loaded_version) != VERSION:
            raise CheckpointingException(
                f"ckptd.megatron: sharded_backend_version {loaded_version} (this module reads "
                f"{VERSION})"
            )


def save_strategy(**kwargs: Any) -> CkptdSaveShardedStrategy:
    """CkptdSaveShardedStrategy(**kwargs): pass as dist_checkpointing.save's sharded_strategy."""
    return CkptdSaveShardedStrategy(**kwargs)


def load_strategy(**kwargs: Any) -> CkptdLoadShardedStrategy:
    """CkptdLoadShardedStrategy(**kwargs): pass as dist_checkpointing.load's sharded_strategy
    (optional: load() finds the registered one from metadata.json)."""
    return CkptdLoadShardedStrategy(**kwargs)


def register() -> None:
    """Registers both strategies (default socket, job from the directory) as Megatron's defaults
    for backend ("ckptd", 1). Called on import."""
    register_default_strategy(
        StrategyAction.SAVE_SHARDED, BACKEND, VERSION, CkptdSaveShardedStrategy()
    )
    register_default_strategy(
        StrategyAction.LOAD_SHARDED, BACKEND, VERSION, CkptdLoadShardedStrategy()
    )


register()
