"""ckptd as torch_checkpointing's storage, commit barrier, stager and writer (torch-checkpointing
0.1.1, Meta's library; import name torch_checkpointing). Imported only here: `import ckptd` never
imports it.

Mapping. The library writes a checkpoint as a directory of files (one `torch.save` archive per
item and rank, `<item>_<rank>.pt` by default, and rank 0's metadata file) under a temporary name,
waits at a barrier for every rank, then renames the directory into place. Here:

- the checkpoint directory `<root>/<name>` is ckptd checkpoint (job `root`, encoded as ckptd.torch
  encodes DCP paths, step = the trailing integer of `name`); its temporary name (`tmp_<name>`) is
  the same checkpoint;
- each file is one uint8 tensor item named by its path inside the directory. The write stream
  takes what `torch.save` writes: tensor storages (one write each) are not copied at all, only
  referenced; libckptd-client copies them once into the staging arena at the Save, or not at all
  when they already are arena memory (Stager's staged tensors);
- the barrier (BarrierConfig) is the rank's Save, as rank r of the world size, then a wait for
  COMMITTED: the daemon commits once every rank has saved, so "complete" is ckptd's commit and
  the rename only checks it. A rank that dies before its Save leaves the checkpoint uncommitted
  (the daemon aborts it after its stage timeout), invisible to exists(), ls() and
  latest_checkpoint();
- reads are byte ranges of a file item (`Flat` regions): the daemon reads only those bytes and
  verifies their block checksums (corrupt bytes: ckptd.DataLossError).

Stager: copies each tensor once into the staging arena (GPU tensors device to arena, GIL
released) instead of the library's pinned/shared-memory pool. With the in-process Writer (a
CheckpointProcess stand-in running the library's own CheckpointWriter in a thread) the staged
bytes reach the daemon without another copy; make_async_checkpoint_saver wires the library's
AsyncCheckpointSaver with both.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import fnmatch
import io
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_checkpointing import barriers as _tc_barriers
from torch_checkpointing import staging as _tc_staging
from torch_checkpointing.checkpoint_base import CheckpointWriteInfo
from torch_checkpointing.checkpoint_manager import CheckpointManager
from torch_checkpointing.checkpoint_saver import AsyncCheckpointSaver
from torch_checkpointing.checkpoint_writer import (
    DEFAULT_TEMP_DIR_PREFIX,
    CheckpointWriter,
    CheckpointWriterArgs,
    CheckpointWriterConfig,
)
from torch_checkpointing.config import (
    DEFAULT_WAIT_TIMEOUT_SECS,
    AsyncCheckpointSaverConfig,
    CheckpointSaverConfig,
    SyncCheckpointSaverConfig,
)
from torch_checkpointing.storage import base_storage as _tc_storage
from torch_checkpointing.types import RankInfo

import ckptd

from . import _arrays
from .torch import _ids
from .torch._connection import connect
from .torch._storage import _collect_tensors, _rebuild

__all__ = [
    "BarrierConfig",
    "Stager",
    "Storage",
    "StorageConfig",
    "Writer",
    "latest_checkpoint",
    "make_async_checkpoint_saver",
    "manager_config",
]

NAME_ITEM = _ids.NAME_ITEM  # rank 0 records the directory's name ("step-100") with the checkpoint
_REF_MIN_BYTES = 4096  # shorter writes are copied (headers, small tensors); longer ones referenced
_READ_AHEAD_BYTES = 1 << 16  # small reads (zip directory, pickle) are served from one range load


def _split(path: str | os.PathLike[str]) -> list[str]:
    raw = os.fspath(path)
    for prefix in ("ckptd://", "ckptd:/"):
        if raw.startswith(prefix):
            raw = raw[len(prefix) :]
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"ckptd: path {os.fspath(path)!r}: '..' components are refused")
    return parts


@dataclasses.dataclass(frozen=True)
class _Where:
    """What a storage path names: the root itself (a job), a checkpoint directory (file == ""), or
    a file (or subdirectory) inside one."""

    job: str
    name: str = ""  # the directory's name without the temporary prefix; "" for the root
    step: int | None = None
    file: str = ""


class _Pending:
    """The files one rank of this process wrote into one checkpoint, waiting for its barrier."""

    def __init__(self, client: ckptd.Client, job: str, step: int, name: str) -> None:
        self.client = client
        self.job, self.step, self.name = job, step, name
        self.files: dict[str, list[tuple[int, Any]]] = {}  # file -> [(offset, uint8 piece)]
        self.sizes: dict[str, int] = {}
        self.keep: list[Any] = []  # the tensors whose memory the pieces reference
        self.staged: list[Any] = []  # arena buffers holding copied pieces (the Save takes them)

    def drop(self) -> None:
        """Gives back the arena buffers of a checkpoint that will not be saved."""
        staged, self.staged = self.staged, []
        with contextlib.suppress(ckptd.CkptdError):
            self.client.release(staged)


_pending: dict[tuple[str, str, int], _Pending] = {}  # (socket, job, step), this process only
_pending_lock = threading.Lock()


# --- storage ----------------------------------------------------------------------------------
@dataclasses.dataclass
class StorageConfig(_tc_storage.StorageConfig):
    """The library's StorageConfig for ckptd: pass it as `storage_config=` (CheckpointManager's
    Config, make_*_checkpoint_saver, CheckpointReader). root: the checkpoint folder, e.g.
    "runs/llama" (checkpoints are "runs/llama/step-100"); socket: default $CKPTD_SOCKET.
    temp_dir_prefix: CheckpointWriterConfig's (the same on every rank)."""

    root: str = ""
    socket: str | None = None
    temp_dir_prefix: str = DEFAULT_TEMP_DIR_PREFIX

    def create_storage(self) -> Storage:
        return Storage(self)


class Storage(_tc_storage.Storage):
    """torch_checkpointing's Storage over ckptd (see the module docstring). Files are written
    through a checkpoint's barrier (BarrierConfig) and are immutable once committed; a directory
    exists once its checkpoint is COMMITTED. Errors of the daemon propagate (daemon down:
    ckptd.UnavailableError naming the socket), never read as "no such file"."""

    def __init__(self, config: StorageConfig) -> None:
        if not _split(config.root):
            raise ValueError("ckptd StorageConfig: root (the checkpoint folder) is required")
        self._config = config
        self._root = _split(config.root)
        self._job = _ids.encode_job("/".join(self._root))
        if len(self._job.encode()) > _ids.JOB_BYTES_MAX:
            raise ValueError(f"ckptd StorageConfig: root {config.root!r} is too long as a job")
        self._client: ckptd.Client | None = None
        self._items: dict[int, dict[str, int]] = {}  # committed step -> {file: bytes}

    @property
    def client(self) -> ckptd.Client:
        if self._client is None:
            self._client = connect(self._config.socket)
        return self._client

    @property
    def mmap_fill_workers(self) -> int | None:
        return 1  # one ranged load per file: the daemon splits and overlaps the reads itself

    # --- paths ------------------------------------------------------------------------------
    def _where(self, path: str | os.PathLike[str]) -> _Where:
        parts = _split(path)
        n = len(self._root)
        if parts[:n] != self._root:
            raise ValueError(
                f"ckptd: path {os.fspath(path)!r} is outside the storage root "
                f"{'/'.join(self._root)!r}"
            )
        if len(parts) == n:
            return _Where(self._job)
        name = parts[n]  # the temporary directory names the same checkpoint
        prefix = self._config.temp_dir_prefix
        if prefix and name.startswith(prefix) and len(name) > len(prefix):
            name = name[len(prefix) :]
        digits = len(name) - len(name.rstrip("0123456789"))
        if digits == 0:
            raise ValueError(
                f"ckptd: checkpoint directory {parts[n]!r} has no step: end its name with one "
                "(e.g. 'step-100')"
            )
        step = int(name[-digits:])
        return _Where(self._job, name, step, "/".join(parts[n + 1 :]))

    def _committed(self, step: int) -> dict[str, int] | None:
        """{file: bytes} of the committed checkpoint `step`, or None when it is not COMMITTED."""
        if step in self._items:
            return self._items[step]
        try:
            if self.client.status(self._job, step).get("state") != "COMMITTED":
                return None
            rows = self.client.inspect(self._job, step)
        except ckptd.NotFoundError:
            return None
        files = {
            r["name"]: int(r["bytes"])
            for r in rows
            if r["kind"] == "tensor" and not r["name"].startswith(_ids.RESERVED_PREFIX)
        }
        self._items[step] = files
        return files

    def _pending_of(self, w: _Where) -> _Pending | None:
        with _pending_lock:
            return _pending.get((self.client.socket, w.job, int(w.step or 0)))

    def _file(self, path: Path) -> tuple[_Where, int]:
        """(where, bytes) of a committed file; FileNotFoundError naming the job and step."""
        w = self._where(path)
        if w.step is None or not w.file:
            raise IsADirectoryError(f"ckptd: {path} is a directory, not a file")
        files = self._committed(w.step)
        if files is None or w.file not in files:
            raise FileNotFoundError(
                f"ckptd: no file {w.file!r} in a committed checkpoint {w.name} (job "
                f"{w.job} step {w.step})"
            )
        return w, files[w.file]

    # --- reads ------------------------------------------------------------------------------
    def stream_read(
        self, path: Path, read_args: _tc_storage.ReadArgs | None = None
    ) -> io.RawIOBase:
        w, size = self._file(path)
        assert w.step is not None
        return _ItemReader(self.client, w.job, w.step, w.file, size)

    def read(self, path: Path, read_args: _tc_storage.ReadArgs | None = None) -> bytes:
        with self.stream_read(path, read_args) as f:
            return f.readall()

    def getsize(self, path: Path) -> int:
        return self._file(path)[1]

    def exists(self, path: Path) -> bool:
        w = self._where(path)
        if w.step is None:  # the folder exists while it holds a committed checkpoint
            return self.client.latest(w.job) is not None
        pending = self._pending_of(w)
        if pending is not None and (not w.file or w.file in pending.files):
            return True
        files = self._committed(w.step)
        if files is None:
            return False
        return not w.file or any(f == w.file or f.startswith(w.file + "/") for f in files)

    def isdir(self, path: Path) -> bool:
        w = self._where(path)
        if w.step is None or not w.file:
            return self.exists(path)
        files = self._committed(w.step) or {}
        return any(f.startswith(w.file + "/") for f in files)

    def ls(self, path: Path) -> list[str]:
        w = self._where(path)
        if w.step is None:  # the root: the committed checkpoints' directory names
            try:
                rows = self.client.list(w.job)
            except ckptd.NotFoundError:
                return []
            return [self._name(int(r["step"])) for r in rows if r["state"] == "COMMITTED"]
        files = self._committed(w.step)
        if files is None:
            raise FileNotFoundError(f"ckptd: no committed checkpoint {path}")
        prefix = w.file + "/" if w.file else ""
        return sorted({f[len(prefix) :].split("/")[0] for f in files if f.startswith(prefix)})

    def glob(self, pattern: str) -> list[str]:
        """The library's glob without its `except Exception: return []`: a daemon that does not
        answer raises instead of looking like an empty folder."""
        directory, file_pattern = os.path.split(pattern)
        if not self.exists(Path(directory)):
            return []
        names = fnmatch.filter(self.ls(Path(directory)), file_pattern)
        return [os.path.join(directory, n) for n in names]

    def _name(self, step: int) -> str:
        try:
            return bytes(self.client.load_object(self._job, step, NAME_ITEM, raw=True)).decode()
        except ckptd.NotFoundError:
            return f"step-{step}"

    def remap_path(self, path: Path) -> str:
        w = self._where(path)
        tail = "" if w.step is None else f"/{w.step}" + (f"/{w.file}" if w.file else "")
        return f"ckptd://{w.job}{tail}"

    # --- writes -----------------------------------------------------------------------------
    def _begin(self, path: Path) -> tuple[_Pending, str]:
        w = self._where(path)
        if w.step is None or not w.file:
            raise IsADirectoryError(f"ckptd: {path} names a directory, not a file")
        key = (self.client.socket, w.job, w.step)
        stale: list[_Pending] = []
        with _pending_lock:
            pending = _pending.get(key)
            if pending is None:
                # Another checkpoint of this folder still pending here never reached its barrier
                # (its write failed) and this process's writer has moved on: it must never commit.
                stale = [_pending.pop(k) for k in list(_pending) if k[:2] == key[:2]]
                pending = _pending[key] = _Pending(self.client, w.job, w.step, w.name)
        for old in stale:
            old.drop()
            with contextlib.suppress(ckptd.CkptdError):
                self.client.abort(old.job, old.step, "a rank's write failed before its barrier")
        return pending, w.file

    def get_write_stream(self, path: Path, data: object) -> io.IOBase:
        pending, file = self._begin(path)
        return _FileWriter(pending, file, _storages(data))

    def stream_write(self, path: Path) -> io.IOBase:
        return self.get_write_stream(path, None)

    def write(self, path: Path, data: Any) -> None:
        with self.get_write_stream(path, None) as f:
            f.write(data)

    def mkdir(self, path: Path, recursive: bool = True) -> None:
        self._where(path)  # directories exist by their files

    def delete(self, path: Path) -> None:
        w = self._where(path)
        pending = self._pending_of(w) if w.step is not None else None
        if pending is not None and w.file in pending.files:
            del pending.files[w.file]
            return
        raise OSError(f"ckptd: {path}: files of a committed checkpoint cannot be deleted alone")

    def rmdir(self, path: Path) -> None:
        """Deletes a whole checkpoint (a retention policy's call); a file prefix is refused."""
        w = self._where(path)
        if w.step is None or w.file:
            raise OSError(f"ckptd: {path}: only a checkpoint directory can be removed")
        with _pending_lock:
            pending = _pending.pop((self.client.socket, w.job, w.step), None)
        if pending is not None:
            pending.drop()
        self._items.pop(w.step, None)
        try:
            self.client.delete(w.job, w.step)
        except ckptd.NotFoundError:
            pass

    def abandon(self, path: Path, reason: str) -> None:
        """Drops what this process wrote of checkpoint `path` and aborts it in the daemon (best
        effort): a rank whose write failed, so that the checkpoint never commits without it."""
        w = self._where(path)
        if w.step is None:
            return
        with _pending_lock:
            pending = _pending.pop((self.client.socket, w.job, w.step), None)
        if pending is not None:
            pending.drop()
        with contextlib.suppress(ckptd.CkptdError):
            self.client.abort(w.job, w.step, reason)

    def rename(
        self,
        src_path: Path,
        dst_path: Path,
        is_directory: bool = False,
        background_cleanup: bool = False,
    ) -> None:
        """The writer's commit: the temporary directory onto its final name. The two name one ckptd
        checkpoint, committed by the barrier already; this checks that it is."""
        src, dst = self._where(src_path), self._where(dst_path)
        if src.step is None or src.file or dst.file or (src.job, src.step) != (dst.job, dst.step):
            raise OSError(
                f"ckptd: rename {src_path} -> {dst_path}: only a checkpoint's temporary "
                "directory can be renamed, onto its own final name"
            )
        pending = self._pending_of(src)
        if pending is not None and pending.files:
            raise OSError(
                f"ckptd: checkpoint {dst_path} (job {src.job} step {src.step}): its files were "
                "written but never handed to the daemon: the writer's barrier must be ckptd's "
                "(CheckpointWriterConfig(barrier_config=ckptd.torch_checkpointing.BarrierConfig()))"
            )
        state = self.client.status(src.job, src.step).get("state")
        if state != "COMMITTED":
            raise OSError(f"ckptd: checkpoint {dst_path} (job {src.job} step {src.step}): {state}")


def _storages(data: object) -> list[tuple[int, int, Any]]:
    """(address, bytes, tensor) of every CPU tensor storage in `data`, sorted: the memory
    torch.save's writes may be referenced in (it lives as long as the data being written)."""
    if data is None:
        return []
    tensors: list[torch.Tensor] = []
    _collect_tensors(data, tensors)
    out = {}
    for t in tensors:
        if t.device.type == "cpu" and t.numel():
            s = t.untyped_storage()
            out[s.data_ptr()] = (s.data_ptr(), s.nbytes(), t)
    return sorted(out.values(), key=lambda r: r[0])


class _FileWriter(io.RawIOBase):
    """One file being written: a list of pieces. A write inside a storage of the data being
    written is referenced, anything else (zip headers, the pickle) copied into small runs."""

    def __init__(self, pending: _Pending, file: str, storages: list[tuple[int, int, Any]]) -> None:
        super().__init__()
        self._pending, self._file = pending, file
        self._storages = storages
        self._starts = [s[0] for s in storages]
        self._pieces: list[tuple[int, Any]] = []
        self._run = bytearray()
        self._run_at = 0
        self._pos = 0

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def write(self, b: Any) -> int:
        m = memoryview(b).cast("B")
        n = m.nbytes
        owner = self._owner(m) if n >= _REF_MIN_BYTES else None
        if owner is not None:  # a tensor of the data: the Save reads it where it is
            self._flush_run()
            self._pieces.append((self._pos, np.frombuffer(m, dtype=np.uint8)))
            self._pending.keep.append(owner)
        elif n >= _REF_MIN_BYTES:  # a temporary (a GPU tensor's host copy): once, into the arena
            self._flush_run()
            piece = self._pending.client.stage([np.frombuffer(m, dtype=np.uint8)])[0]
            self._pending.staged.append(piece)
            self._pieces.append((self._pos, piece))
        else:
            if not self._run:
                self._run_at = self._pos
            self._run += m
        self._pos += n
        return n

    def _owner(self, m: memoryview) -> Any:
        if not self._storages:
            return None
        address = np.frombuffer(m, dtype=np.uint8).__array_interface__["data"][0]
        i = bisect.bisect_right(self._starts, address) - 1
        if i < 0:
            return None
        start, size, tensor = self._storages[i]
        return tensor if address + m.nbytes <= start + size else None

    def _flush_run(self) -> None:
        if self._run:
            self._pieces.append((self._run_at, np.frombuffer(bytes(self._run), dtype=np.uint8)))
            self._run = bytearray()

    def close(self) -> None:
        if not self.closed:
            self._flush_run()
            with _pending_lock:
                self._pending.files[self._file] = self._pieces
                self._pending.sizes[self._file] = self._pos
        super().close()


class _ItemReader(io.RawIOBase):
    """A committed file: byte ranges loaded from its item (checksummed by the daemon). Small reads
    are served from one read-ahead window, so a zip directory costs a few loads, not hundreds."""

    def __init__(self, client: ckptd.Client, job: str, step: int, item: str, size: int) -> None:
        super().__init__()
        self._client, self._job, self._step, self._item = client, job, step, item
        self._size = size
        self._pos = 0
        self._window = b""
        self._window_at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError(f"ckptd: seek to {base + offset} in {self._item}")
        self._pos = base + offset
        return self._pos

    def _load(self, start: int, dest: Any) -> None:
        n = int(dest.nbytes)
        if n:
            region = ckptd.Flat(start, n)
            self._client.load_into(self._job, self._step, [(self._item, region, dest)])

    def readinto(self, buffer: Any) -> int:
        m = memoryview(buffer).cast("B")
        n = max(0, min(m.nbytes, self._size - self._pos))
        if n == 0:
            return 0
        w0, w = self._window_at, self._window
        if w0 <= self._pos and self._pos + n <= w0 + len(w):
            m[:n] = w[self._pos - w0 : self._pos - w0 + n]
        elif n < _READ_AHEAD_BYTES:
            end = min(self._size, self._pos + _READ_AHEAD_BYTES)
            window = np.empty(end - self._pos, dtype=np.uint8)
            self._load(self._pos, window)
            self._window, self._window_at = window.tobytes(), self._pos
            m[:n] = self._window[:n]
        else:
            self._load(self._pos, np.frombuffer(m[:n], dtype=np.uint8))
        self._pos += n
        return n

    def readall(self) -> bytes:
        out = np.empty(max(0, self._size - self._pos), dtype=np.uint8)
        self._load(self._pos, out)
        self._pos = self._size
        return out.tobytes()

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        buf = bytearray(min(size, max(0, self._size - self._pos)))
        got = self.readinto(buf)
        return bytes(buf[:got])


# --- the commit barrier ---------------------------------------------------------------------
@dataclasses.dataclass
class BarrierConfig(_tc_barriers.BarrierConfig):
    """The writer's barrier for ckptd storage: pass it as CheckpointWriterConfig(barrier_config=).
    Each rank hands the files it wrote to the daemon (its Save, as rank r of the world size) and
    waits until the checkpoint is COMMITTED, which happens once every rank has saved."""

    timeout_barrier_init_sec: int = 60
    socket: str | None = None

    def create_barrier(self, rank_info: RankInfo) -> Barrier:
        return Barrier(self, rank_info)


class Barrier(_tc_barriers.Barrier):
    def __init__(self, config: BarrierConfig, rank_info: RankInfo) -> None:
        self._socket = config.socket
        self._rank_info = rank_info

    def execute_barrier(self, timeout_secs: int) -> None:
        rank = int(self._rank_info.global_rank)
        world = int(self._rank_info.global_world_size)
        socket = connect(self._socket).socket
        with _pending_lock:
            batch = [_pending.pop(k) for k in list(_pending) if k[0] == socket]
        if not batch:
            raise RuntimeError(
                f"ckptd barrier: rank {rank} wrote no file of any checkpoint through ckptd's "
                "Storage (the writer's storage_config must be ckptd.torch_checkpointing's "
                "StorageConfig, and every rank must write at least one file)"
            )
        for p in batch:
            _save_rank(p, rank, world)
        for p in batch:
            p.client.wait(p.job, p.step, timeout_ms=int(timeout_secs) * 1000)


def _save_rank(p: _Pending, rank: int, world: int) -> None:
    tensors: dict[str, Any] = {}
    for file, pieces in p.files.items():
        size = p.sizes[file]
        if size == 0:
            tensors[file] = np.empty(0, dtype=np.uint8)
        elif len(pieces) == 1 and pieces[0][1].nbytes == size:
            tensors[file] = pieces[0][1]
        else:
            tensors[file] = [
                ckptd.Shard(a, [size], ckptd.Flat(off, int(a.nbytes))) for off, a in pieces
            ]
    objects = {NAME_ITEM: ckptd.Raw(p.name.encode())} if rank == 0 else {}
    try:
        p.client.save(p.job, p.step, tensors, objects, rank=rank, world_size=world)
    except BaseException:
        p.drop()
        raise
    finally:
        p.keep.clear()
    p.staged = []  # the daemon owns them now


# --- stager and in-process writer -------------------------------------------------------------
class _Pool:
    """A one-thread pool that is made again in a process that did not make it. A child forked
    after the pool started its thread inherits the pool without the thread (and believing it has
    one idle), so work queued there would never run and its Future never complete; the child's
    own pool runs it, and it fails as every ckptd call there does (ckptd._client, fork:
    FailedPreconditionError naming spawn). As ckptd.torch.StorageWriter's staging pool."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._pid = os.getpid()
        self._pool = ThreadPoolExecutor(1, name)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        if self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(1, self._name)  # the parent's copy is left alone
            self._pid = os.getpid()
        return self._pool.submit(fn, *args)

    def shutdown(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait)


class Stager(_tc_staging.CheckpointStager):
    """The library's CheckpointStager over ckptd: stage() copies every tensor of the payload once
    into the daemon's staging arena (GPU tensors device to arena) and returns the payload with
    arena views in their place (DTensors re-wrapped; other values deep-copied; keys not requiring
    copy passed through). Saved through ckptd's Storage in this process (Writer), those bytes go to
    the daemon with no further copy. async_staging: stage() runs in a thread and returns a Future
    (AsyncCheckpointSaver accepts both)."""

    def __init__(self, *, socket: str | None = None, async_staging: bool = True) -> None:
        self._socket = socket
        self._pool = _Pool("ckptd-stage") if async_staging else None
        self._staged: object | None = None
        self._held: list[int] = []  # arena addresses of views not (yet) handed to the daemon
        self._lock = threading.Lock()

    def stage(self, state_dict: Any, keys_not_requiring_copy: Sequence[str] = ()) -> Any:
        if self._pool is None:
            return self._stage(state_dict, keys_not_requiring_copy)
        return self._pool.submit(self._stage, state_dict, keys_not_requiring_copy)

    def _stage(self, state_dict: Any, keys_not_requiring_copy: Sequence[str]) -> Any:
        client = connect(self._socket)
        self._release(client)  # the last payload's buffers the writer did not hand over
        skip = set(keys_not_requiring_copy)
        mapping = isinstance(state_dict, dict)
        copy = {k: v for k, v in state_dict.items() if k not in skip} if mapping else state_dict
        tensors: list[torch.Tensor] = []
        _collect_tensors(copy, tensors)
        views = client.stage(tensors) if tensors else []
        with self._lock:
            self._held = [_arrays.address(v) for v in views if v.numel()]
        staged = _rebuild(copy, iter(views))
        if mapping:
            staged = {k: (state_dict[k] if k in skip else staged[k]) for k in state_dict}
        self._staged = staged
        return staged

    def _release(self, client: ckptd.Client) -> None:
        with self._lock:
            held, self._held = self._held, []
        if held:
            client._native.release_at(held)  # buffers the daemon took are skipped

    def get_staged_state_dict(self) -> object | None:
        return self._staged

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._staged = None
        with contextlib.suppress(ckptd.CkptdError):
            self._release(connect(self._socket))


class Writer:
    """A CheckpointProcess stand-in for AsyncCheckpointSaver(checkpoint_process=): the library's
    own CheckpointWriter (ckptd storage and barrier) run in one thread of this process, so Stager's
    arena views reach the daemon as they are (the library's subprocess would copy them through a
    pipe first). write() returns a Future that completes at COMMITTED."""

    def __init__(self, writer_args: CheckpointWriterArgs) -> None:
        self._writer = CheckpointWriter(writer_args)
        config = writer_args.storage_config
        self._storage = config.create_storage() if isinstance(config, StorageConfig) else None
        self._pool = _Pool("ckptd-write")
        # The saver sends the sharding metadata once; the writer needs it with every checkpoint.
        self._metadata: bytes | None = None

    def write(self, checkpoint_info: CheckpointWriteInfo | Future[Any], path: str) -> Future[None]:
        def run() -> None:
            info = checkpoint_info
            if isinstance(info, Future):
                info = info.result()
            if self._metadata is None:
                self._metadata = info.serialized_distributed_metadata
            try:
                self._writer.write(path, info.for_writes(self._metadata))
            except BaseException as e:
                if self._storage is not None:  # never commits later, without this rank's files
                    self._storage.abandon(Path(path), f"rank's write failed: {e}"[:200])
                raise

        return self._pool.submit(run)

    def wait_for_init(self) -> None:
        pass

    def check_ok(self) -> None:
        pass

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._writer.close()


# --- wiring -------------------------------------------------------------------------------------
def _writer_config(
    config: CheckpointWriterConfig | None, socket: str | None
) -> CheckpointWriterConfig:
    base = config or CheckpointWriterConfig()
    return dataclasses.replace(base, barrier_config=BarrierConfig(socket=socket))


def manager_config(
    root: str,
    *,
    socket: str | None = None,
    async_save: bool = True,
    **fields: Any,
) -> CheckpointManager.Config:
    """CheckpointManager.Config whose storage is ckptd (root: the checkpoint folder) and whose
    writer commits through ckptd's barrier; `fields` are the Config's own (items, default, load,
    pre_finalize_callback, ...). async_save: the library's async saver (its DefaultStager and
    writer subprocess), else its sync saver. `save=` given in fields keeps its own options."""
    save = fields.pop("save", None)
    if save is None:
        save = AsyncCheckpointSaverConfig() if async_save else SyncCheckpointSaverConfig()
    if not isinstance(save, CheckpointSaverConfig):
        raise TypeError(f"save= must be a CheckpointSaverConfig, not {type(save).__name__}")
    save = dataclasses.replace(save, writer_config=_writer_config(save.writer_config, socket))
    storage = StorageConfig(
        root=root, socket=socket, temp_dir_prefix=save.writer_config.temp_dir_prefix
    )
    return CheckpointManager.Config(save=save, storage_config=storage, **fields)


def make_async_checkpoint_saver(
    root: str,
    *,
    socket: str | None = None,
    rank_info: RankInfo | None = None,
    writer_config: CheckpointWriterConfig | None = None,
    metadata_manager: Any = None,
    pre_finalize_callback: Callable[..., None] | None = None,
    finalize_callback: Callable[..., None] | None = None,
    lock_acquire_timeout: float = DEFAULT_WAIT_TIMEOUT_SECS,
    async_staging: bool = True,
) -> AsyncCheckpointSaver:
    """The library's AsyncCheckpointSaver with ckptd's Stager and Writer: save(path, checkpoint)
    returns (stage_future, write_future) as always; staging is one copy into the daemon's arena,
    and write_future completes once the checkpoint is COMMITTED."""
    from torch_checkpointing.builder import _get_default_rank_info

    info = rank_info or _get_default_rank_info()
    wc = _writer_config(writer_config, socket)
    args = CheckpointWriterArgs(
        config=wc,
        rank_info=info,
        storage_config=StorageConfig(root=root, socket=socket, temp_dir_prefix=wc.temp_dir_prefix),
        pre_finalize_callback=pre_finalize_callback,
        finalize_callback=finalize_callback,
    )
    return AsyncCheckpointSaver(
        checkpoint_stager=Stager(socket=socket, async_staging=async_staging),
        checkpoint_process=Writer(args),  # type: ignore[arg-type]
        metadata_manager=metadata_manager,
        lock_acquire_timeout=lock_acquire_timeout,
    )


def latest_checkpoint(
    root: str, *, socket: str | None = None, durable: str = "committed"
) -> str | None:
    """`<root>/<name>` of the newest COMMITTED checkpoint under root, None when there is none
    (a first run). durable: as Client.latest ("peer", "store": one that survives more). A daemon
    that does not answer raises ckptd.UnavailableError."""
    storage = StorageConfig(root=root, socket=socket).create_storage()
    latest = storage.client.latest(storage._job, durable)
    if latest is None:
        return None
    return f"{root.rstrip('/')}/{storage._name(latest)}"
