"""PyTorch Lightning (the `lightning` package, 2.6) checkpoints through ckptd.

    import lightning.pytorch as pl
    import ckptd.lightning as ckl

    trainer = pl.Trainer(
        plugins=[ckl.AsyncCheckpointIO()],                 # or ckl.CheckpointIO(): blocking
        callbacks=[ckl.ModelCheckpoint(dirpath="ckptd://runs/lit", save_last=True)],
    )
    trainer.fit(model, ckpt_path="last")                 # resumes from ckptd's newest "last"

Paths: `ckptd://<path>/<file>` (ModelCheckpoint's dirpath and file names, as Lightning makes them)
is the ckptd job `<path>/<file>` (encoded as ckptd.torch encodes DCP paths); each save of that file
is a new step of its job (the global step, or one past the job's newest), the file's content is
its newest COMMITTED step, and once a newer one has committed the older steps of that job are
deleted: overwriting `last.ckpt` keeps one checkpoint, and ModelCheckpoint's save_top_k removes
files through remove_checkpoint(), which deletes the job's checkpoints. The scheme is registered
with fsspec when this module is imported, so Lightning's own file-system calls (exists, ls,
modified: how Trainer finds ckpt_path="last") see ckptd's catalog, never a local folder that
could be missing and silently start training from scratch.

The checkpoint dict: every tensor in it (the model's state_dict, the optimizer states) is a ckptd
tensor item (copied once into the daemon's arena, checksummed, reshardable by name), the rest of
the dict is one pickled object item `lightning` with references to them.

Async: AsyncCheckpointIO's save_checkpoint returns once the tensors are staged in the daemon's
arena (the whole stall: one memcpy); the daemon persists and commits on its own, and the next
save, remove_checkpoint or teardown waits for the earlier commits (and raises their errors), as
Lightning's AsyncCheckpointIO does with its thread. No thread and no clone of the state: ckptd's
staging is the snapshot.

Failures: the daemon down raises ckptd.UnavailableError naming its socket (Lightning stops the
fit); a file asked for that has no committed checkpoint raises FileNotFoundError naming the job,
a corrupt one ckptd.DataLossError. A trainer killed mid-save leaves its step uncommitted (ckptd
commits a checkpoint only once it is whole), so "last" is still the previous one.

Lightning's FSDP strategy writes its sharded checkpoints with DCP's FileSystemWriter, without
CheckpointIO: use ckptd.torch's StorageWriter through DCP (docs/integrations/lightning.md).
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import fsspec
import lightning.pytorch as pl
import torch
from fsspec.spec import AbstractFileSystem
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO as _CheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint as _ModelCheckpoint

import ckptd

from .torch import _ids

SCHEME = "ckptd://"
OBJECT_ITEM = "lightning"
FORMAT = 1

__all__ = [
    "SCHEME",
    "AsyncCheckpointIO",
    "CheckpointIO",
    "CkptdFileSystem",
    "ModelCheckpoint",
    "job_of",
]


def _path(path: Any) -> str:
    """The path inside ckptd: `ckptd://a/b.ckpt` or a plain path (its leading '/' dropped)."""
    raw = os.fspath(path)
    raw = raw[len(SCHEME) :] if raw.startswith(SCHEME) else raw
    raw = raw[len("ckptd:") :] if raw.startswith("ckptd:") else raw  # normpath'd "ckptd:/a/b"
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"ckptd.lightning: {path!r} is not a checkpoint path")
    return "/".join(parts)


def job_of(path: Any) -> str:
    """The ckptd job holding the checkpoints saved as `path`."""
    return _ids.encode_job(_path(path))


@dataclass
class _Ref:
    """A tensor of the checkpoint dict, saved as the tensor item `name`."""

    name: str


def _split(value: Any, tensors: dict[str, torch.Tensor], where: str) -> Any:
    if isinstance(value, torch.Tensor):
        name = f"t/{len(tensors)}/{where}"[:200]
        tensors[name] = value.detach().cpu().contiguous()
        return _Ref(name)
    if isinstance(value, dict):
        return type(value)(
            (k, _split(v, tensors, f"{where}.{k}" if where else str(k))) for k, v in value.items()
        )
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_split(v, tensors, f"{where}.{i}") for i, v in enumerate(value))
    return value


def _join(value: Any, tensors: dict[str, Any], map_location: Any) -> Any:
    if isinstance(value, _Ref):
        t = tensors[value.name]
        t = t if isinstance(t, torch.Tensor) else torch.from_numpy(t)
        return t.to(map_location) if map_location is not None and not callable(map_location) else t
    if isinstance(value, dict):
        return type(value)((k, _join(v, tensors, map_location)) for k, v in value.items())
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        return type(value)(_join(v, tensors, map_location) for v in value)
    return value


class CheckpointIO(_CheckpointIO):
    """Lightning's CheckpointIO on ckptd: blocking (save_checkpoint returns at COMMITTED).
    socket: the daemon's socket (default $CKPTD_SOCKET); tier_policy: the tier policy each
    checkpoint is saved with; keep: how many of each file's newest steps to keep (1: overwriting
    a file replaces it)."""

    asynchronous = False

    def __init__(
        self, socket: str | None = None, *, tier_policy: str = "default", keep: int = 1
    ) -> None:
        if keep < 1:
            raise ValueError(f"ckptd.lightning: keep={keep} must be at least 1")
        self.socket = socket
        self.tier_policy = tier_policy
        self.keep = keep
        self._client: ckptd.Client | None = None
        if socket:  # Lightning's file-system calls on ckptd:// paths use this daemon too
            CkptdFileSystem.default_socket = socket
        self._pending: list[tuple[str, int, Future[dict[str, Any]]]] = []

    @property
    def client(self) -> ckptd.Client:
        if self._client is None:
            from .torch._connection import connect

            self._client = connect(self.socket, self.tier_policy)
        return self._client

    def _next_step(self, job: str, checkpoint: dict[str, Any]) -> int:
        latest = self.client.latest(job)
        step = int(checkpoint.get("global_step", 0))
        return step if latest is None or step > latest else latest + 1

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise TypeError(
                "ckptd.lightning.CheckpointIO takes no storage_options (the tier policy is the "
                "plugin's tier_policy=)"
            )
        self._finish()  # an earlier asynchronous save's commit, its error raised here
        job = job_of(path)
        tensors: dict[str, torch.Tensor] = {}
        skeleton = _split(checkpoint, tensors, "")
        step = self._next_step(job, checkpoint)
        handle = self.client.save(
            job, step, tensors, {OBJECT_ITEM: {"format": FORMAT, "checkpoint": skeleton}}
        )  # returns once staged: the tensors may change now
        self._pending.append((job, step, handle.committed()))
        if not self.asynchronous:
            self._finish()

    def _finish(self) -> None:
        """Waits for the saves in flight to commit, then drops each file's older steps."""
        pending, self._pending = self._pending, []
        errors: list[BaseException] = []
        for job, step, committed in pending:
            try:
                committed.result()
            except BaseException as e:
                errors.append(e)
                continue
            steps = sorted(
                int(r["step"])
                for r in self.client.list(job)
                if r["state"] == "COMMITTED" and int(r["step"]) <= step
            )
            for old in steps[: -self.keep]:
                self.client.delete(job, old)
        if errors:
            raise errors[0]

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        self._finish()
        job = job_of(path)
        try:
            out = self.client.load(job, "latest", as_torch=True)
        except ckptd.NotFoundError as e:
            raise FileNotFoundError(
                f"ckptd.lightning: {path} (ckptd job {job}) has no committed checkpoint: {e}"
            ) from e
        meta = out.objects.get(OBJECT_ITEM)
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise ValueError(
                f"ckptd.lightning: job {job} step {out.step} is not a Lightning checkpoint "
                f"(no {OBJECT_ITEM!r} object of format {FORMAT})"
            )
        return _join(meta["checkpoint"], out.tensors, map_location)  # type: ignore[no-any-return]

    def remove_checkpoint(self, path: Any) -> None:
        self._finish()
        job = job_of(path)
        for row in self.client.list(job):
            self.client.delete(job, int(row["step"]))

    def teardown(self) -> None:
        self._finish()


class AsyncCheckpointIO(CheckpointIO):
    """CheckpointIO whose save_checkpoint returns once staged (Lightning's AsyncCheckpointIO's
    role): the daemon commits in the background; the next save, a load, remove_checkpoint and
    teardown wait for it and raise its error."""

    asynchronous = True


class CkptdFileSystem(AbstractFileSystem):  # type: ignore[misc]
    """fsspec's view of ckptd's catalog for `ckptd://` paths: a file is a job with a COMMITTED
    checkpoint, a directory a path prefix of jobs. What Lightning's Trainer and ModelCheckpoint
    call (exists, ls, info, modified, isdir, makedirs, rm) and nothing else: the bytes go
    through CheckpointIO."""

    protocol = "ckptd"
    root_marker = ""
    default_socket: str | None = None  # the last CheckpointIO's socket= (else $CKPTD_SOCKET)

    def __init__(self, socket: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.socket = socket

    @property
    def _client(self) -> ckptd.Client:
        from .torch._connection import connect

        return connect(self.socket or CkptdFileSystem.default_socket)

    def exists(self, path: Any, **kwargs: Any) -> bool:
        """fsspec's exists() answers False on any error: here only "no such checkpoint" is False,
        and the daemon down raises (UnavailableError naming its socket), never "nothing saved"."""
        try:
            self.info(path)
            return True
        except FileNotFoundError:
            return False

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        raw = os.fspath(path) if not isinstance(path, list) else path
        if isinstance(raw, list):
            return [cls._strip_protocol(p) for p in raw]  # type: ignore[return-value]
        raw = raw[len(SCHEME) :] if raw.startswith(SCHEME) else raw
        raw = raw[len("ckptd:") :] if raw.startswith("ckptd:") else raw
        return "/".join(p for p in raw.split("/") if p not in ("", "."))

    def _files(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for row in self._client.list():
            if row.get("latest_committed_step") is None:
                continue
            name = str(row["job"])
            try:
                path = _ids.decode_job(name)
            except ValueError:
                continue
            out[path] = row
        return out

    def _file_info(self, path: str) -> dict[str, Any] | None:
        job = _ids.encode_job(path)
        rows = [r for r in self._client.list(job) if r.get("state") == "COMMITTED"]
        if not rows:
            return None
        newest = max(rows, key=lambda r: int(r["step"]))
        ts = float(newest.get("committed_unix_ms") or newest.get("created_unix_ms") or 0) / 1e3
        return {
            "name": SCHEME + path,
            "size": int(newest.get("bytes", 0) or 0),
            "type": "file",
            "step": int(newest["step"]),
            "mtime": ts,
        }

    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        base = self._strip_protocol(path)
        info = self._file_info(base) if base else None
        if info is not None:
            return [info] if detail else [info["name"]]
        prefix = f"{base}/" if base else ""
        entries: dict[str, dict[str, Any]] = {}
        for p in self._files():
            if not p.startswith(prefix):
                continue
            head = p[len(prefix) :].split("/", 1)
            full = prefix + head[0]
            if len(head) == 1:
                fi = self._file_info(full)
                if fi is not None:
                    entries[full] = fi
            else:
                entries.setdefault(full, {"name": SCHEME + full, "size": 0, "type": "directory"})
        if not entries and base:
            raise FileNotFoundError(f"{SCHEME}{base}: no ckptd job under it")
        rows = sorted(entries.values(), key=lambda e: e["name"])
        return rows if detail else [e["name"] for e in rows]

    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        base = self._strip_protocol(path)
        fi = self._file_info(base) if base else None
        if fi is not None:
            return fi
        prefix = f"{base}/" if base else ""
        if not base or any(p.startswith(prefix) for p in self._files()):
            return {"name": SCHEME + base, "size": 0, "type": "directory"}
        raise FileNotFoundError(f"{SCHEME}{base}: no committed ckptd checkpoint")

    def modified(self, path: Any) -> datetime:
        return datetime.fromtimestamp(self.info(path).get("mtime", 0.0), tz=timezone.utc)

    def makedirs(self, path: Any, exist_ok: bool = False) -> None:
        pass  # ckptd has no directories: a job path needs none

    def mkdir(self, path: Any, create_parents: bool = True, **kwargs: Any) -> None:
        pass

    def _rm(self, path: Any) -> None:
        job = _ids.encode_job(self._strip_protocol(path))
        for row in self._client.list(job):
            self._client.delete(job, int(row["step"]))

    def rm_file(self, path: Any) -> None:
        self._rm(path)


fsspec.register_implementation("ckptd", CkptdFileSystem, clobber=True)


class ModelCheckpoint(_ModelCheckpoint):
    """Lightning's ModelCheckpoint, every option as there, its files in ckptd: dirpath is a
    `ckptd://` path (a plain path is taken as one: `runs/lit` is `ckptd://runs/lit`); Trainer's
    ckpt_path="last" finds this callback's newest committed "last" through ckptd's catalog."""

    def __init__(self, dirpath: Any = None, *args: Any, **kwargs: Any) -> None:
        if dirpath is None:
            raise ValueError("ckptd.lightning.ModelCheckpoint: pass dirpath='ckptd://<path>'")
        super().__init__(SCHEME + _path(dirpath), *args, **kwargs)

    def _find_last_checkpoints(self, trainer: pl.Trainer) -> set[str]:
        assert self.dirpath is not None
        base = _path(self.dirpath)
        stem = self.CHECKPOINT_NAME_LAST or "last"
        out: set[str] = set()
        for p in CkptdFileSystem()._files():
            head, _, name = p.rpartition("/")
            if head != base or not name.endswith(self.FILE_EXTENSION):
                continue
            if Path(name).stem == stem or Path(name).stem.startswith(f"{stem}-v"):
                if CkptdFileSystem()._file_info(p) is not None:
                    out.add(SCHEME + p)
        return out
