"""The ckptd client: save, load, list, status, latest; arena-backed arrays (ckptd.empty)."""

from __future__ import annotations

import os
import pickle
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import _arrays, _ckptd, _fork
from ._errors import ResourceExhaustedError

DEFAULT_SOCKET = "/var/lib/ckptd/ckptd.sock"
_ALIGN = 4096  # slab arrays start on a page


Rows = list[dict[str, Any]]  # catalog answers: one dict per job / checkpoint / item


@dataclass(frozen=True)
class Box:
    """A box of a tensor item in global coordinates (tensor/pipeline/row-wise shards)."""

    offsets: Sequence[int]
    lengths: Sequence[int]

    def spec(self) -> tuple[str, list[int], list[int]]:
        return ("box", [int(o) for o in self.offsets], [int(n) for n in self.lengths])


@dataclass(frozen=True)
class Flat:
    """Elements [start, start + count) in row-major order of the global tensor (ZeRO/FSDP)."""

    start: int
    count: int

    def spec(self) -> tuple[str, int, int]:
        return ("flat", int(self.start), int(self.count))


Region = Box | Flat | None  # None: the whole item


def _region_spec(region: Region) -> tuple[Any, ...]:
    return ("whole",) if region is None else region.spec()


@dataclass
class Shard:
    """A shard of a tensor item to save: `data` holds `region` of a tensor of `global_shape`."""

    data: Any
    global_shape: Sequence[int]
    region: Region = None


@dataclass(frozen=True)
class Raw:
    """An object saved as these bytes, not pickled (for readers in other languages)."""

    data: bytes


@dataclass
class LoadResult:
    step: int
    tensors: dict[str, Any] = field(default_factory=dict)
    objects: dict[str, Any] = field(default_factory=dict)
    bytes_read: int = 0  # bytes the daemon read from storage for this load
    bytes_read_remote: int = 0  # of bytes_read, those read from the remote tier
    bytes_read_peer: int = 0  # of bytes_read, those read from other nodes' peer stores
    bytes_from_ram: int = 0  # copied from the daemon's RAM tier (not in bytes_read)
    # read from storage into the RAM tier by this load's prefetch hint (then copied from there)
    bytes_prefetched: int = 0


class SaveHandle:
    """What save() returns. staged(): the daemon owns the bytes (the caller's tensors may change;
    for ckptd.empty memory, only once committed). committed(): the checkpoint is durable."""

    def __init__(self, client: Client, job: str, step: int, staged: Future[dict[str, Any]]) -> None:
        self.job = job
        self.step = step
        self._client = client
        self._staged = staged
        self._committed: Future[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    def staged(self) -> Future[dict[str, Any]]:
        """Resolves to {"bytes_staged", "state"} once this rank's save is staged."""
        return self._staged

    def committed(self, timeout_ms: int | None = None) -> Future[dict[str, Any]]:
        """Resolves to the checkpoint's status once COMMITTED (AbortedError if aborted)."""
        with self._lock:
            if self._committed is None:
                wait_ms = self._client.wait_timeout_ms if timeout_ms is None else timeout_ms

                def wait() -> dict[str, Any]:
                    self._staged.result()
                    return self._client.wait(self.job, self.step, timeout_ms=wait_ms)

                self._committed = self._client._submit(wait)
            return self._committed


class _Slabs:
    """Registered shm slabs of one client, carved into 4 KiB-aligned arrays (ckptd.empty). A slab
    lives while any array over it does; its memory is then unregistered and unlinked."""

    def __init__(self, client: Client, slab_bytes: int) -> None:
        self._client = client
        self._slab_bytes = slab_bytes
        self._lock = threading.Lock()
        self._current: Any = None
        self._used = 0

    def allocate(self, nbytes: int) -> tuple[Any, int]:
        size = max(_ALIGN, -(-nbytes // _ALIGN) * _ALIGN)
        # FailedPreconditionError in a forked child (before the lock, which a parent's thread
        # may have held at the fork): the current slab is shared memory the parent carves too,
        # so the child's arrays would be the parent's bytes.
        native = self._client._native
        with self._lock:
            if self._current is None or self._used + size > self._current.size:
                slab = native.new_slab(max(size, self._slab_bytes))
                self._current, self._used = slab, 0
            offset = self._used
            self._used += size
            return self._current, offset


def _contiguous_cuda(t: Any) -> Any:
    """t itself when the daemon can read or write it in place, else a contiguous copy on its
    device (conjugate / negative views resolved)."""
    if t.is_conj() or t.is_neg():
        t = t.resolve_conj().resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def _lower_priority(nice: int) -> None:
    """A save thread's initializer: lowers this thread's CPU priority to `nice` (Linux sets a
    thread's own nice value with PRIO_PROCESS and its native id). A refusal (a sandbox) keeps the
    normal priority: the save is only slower to overlap."""
    if nice > 0:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        except OSError:
            pass


def _device_events(tensors: Iterable[Any]) -> list[Any]:
    """One CUDA event recorded on the current stream of each device these tensors are on: once
    they completed, the work the caller queued so far (the kernels writing the tensors) is done.
    The overlapped save waits for them on its save thread instead of synchronizing here."""
    devices = {t.device for t in tensors}
    if not devices:
        return []
    torch = _arrays.torch_module()
    events = []
    for device in devices:
        with torch.cuda.device(device):
            event = torch.cuda.Event()
            event.record()
            events.append(event)
    return events


def _sync_devices(tensors: Iterable[Any]) -> None:
    """Waits for the work queued on the devices of these CUDA tensors: the daemon's copies run on
    its own streams, unordered with this process's. Imports nothing: CUDA tensors mean torch is
    loaded (a numpy-only caller never imports torch)."""
    devices = {t.device for t in tensors}
    if devices:
        torch = _arrays.torch_module()
        for device in devices:
            torch.cuda.synchronize(device)


class Client:
    """One session with the local ckptd. Thread-safe. Create with ckptd.connect()."""

    def __init__(
        self,
        socket: str | os.PathLike[str] | None = None,
        *,
        rpc_timeout_ms: int = 60000,
        connect_timeout_ms: int = 5000,
        wait_timeout_ms: int = 3600 * 1000,
        slab_bytes: int = 64 << 20,
        client_name: str = "",
        pin_cuda: bool = False,
        tier_policy: str = "default",
        local_world_size: int = 0,
        save_threads: int = 1,
        save_thread_nice: int = 10,
        async_saves_max: int = 4,
    ) -> None:
        # tier_policy: the tiers every checkpoint this client saves is made durable on —
        # "default" (the daemon's tier_policy), "local", "local+remote" (committed locally,
        # then uploaded to the daemon's remote tier; wait(..., until="remote") waits for that),
        # "remote" (flushed straight to the remote tier and committed there, no local copy), or
        # "local+peer" (a checkpoint spanning nodes, committed once each node's ranks are on its
        # local storage and its part on its peers; the store holds control files only:
        # docs/PEERS.md "Committing at the peer tier").
        # local_world_size: the ranks of a checkpoint saving through this client's daemon
        # (torchrun's LOCAL_WORLD_SIZE), the same on every rank of the node; fewer than the
        # world size makes the checkpoint span nodes, one daemon each, committed through their
        # shared tier (needs "local+remote", "remote" or "local+peer"). 0: all ranks save through
        # this daemon.
        # save_threads, save_thread_nice, async_saves_max: the overlapped save (save(...,
        # blocking=False)): the threads that run it (1..16; with 1, in submission order), the nice
        # value (0..19) they lower their CPU priority to so that the copy yields the cores to the
        # compute it overlaps (0: unchanged), and how many may be queued or running at once
        # (1..64; one more raises ResourceExhaustedError naming the limit).
        if local_world_size < 0:
            raise ValueError(f"local_world_size {local_world_size} is negative")
        if not (
            1 <= save_threads <= 16 and 0 <= save_thread_nice <= 19 and 1 <= async_saves_max <= 64
        ):
            raise ValueError(
                f"save_threads ({save_threads}) must be in [1, 16], save_thread_nice "
                f"({save_thread_nice}) in [0, 19], async_saves_max ({async_saves_max}) in [1, 64]"
            )
        path = os.fspath(socket) if socket is not None else os.environ.get("CKPTD_SOCKET", "")
        self.socket = path or DEFAULT_SOCKET
        self.wait_timeout_ms = wait_timeout_ms
        _fork.check_can_connect()
        self._forked = False  # set in a process forked after this client was made (_fork)
        self._native_client = _ckptd.Client(
            self.socket,
            rpc_timeout_ms,
            connect_timeout_ms,
            client_name or f"ckptd-py/{os.getpid()}",
            pin_cuda,
            tier_policy,
            local_world_size,
        )
        _fork.track(self)
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="ckptd")
        self._slabs = _Slabs(self, slab_bytes)
        self._save_pool = ThreadPoolExecutor(
            max_workers=save_threads,
            thread_name_prefix="ckptd-save",
            initializer=_lower_priority,
            initargs=(save_thread_nice,),
        )
        self._async_saves_max = async_saves_max
        self._async_lock = threading.Lock()
        self._async_in_flight = 0

    def _submit(self, fn: Any) -> Future[Any]:
        """fn on the client's threads; FailedPreconditionError in a process forked after the
        client was made (its executor's threads are the parent's: the work would never run)."""
        if self._forked:
            raise _fork.error()
        return self._executor.submit(fn)

    def _submit_save(self, fn: Any) -> Future[Any]:
        """fn on the save threads (the overlapped save); ResourceExhaustedError when
        async_saves_max saves are queued or running."""
        if self._forked:
            raise _fork.error()
        with self._async_lock:
            if self._async_in_flight >= self._async_saves_max:
                raise ResourceExhaustedError(
                    f"{self._async_in_flight} saves of this client are already in flight "
                    f"(async_saves_max {self._async_saves_max}): wait for one's staged() first"
                )
            self._async_in_flight += 1

        def run() -> Any:
            try:
                return fn()
            finally:
                with self._async_lock:
                    self._async_in_flight -= 1

        return self._save_pool.submit(run)

    @property
    def _native(self) -> Any:
        """The native client; FailedPreconditionError in a process forked after it was made."""
        if self._forked:
            raise _fork.error()
        return self._native_client

    # --- memory ---------------------------------------------------------------------------------
    def empty(self, shape: Sequence[int] | int, dtype: Any = np.float32) -> Any:
        """An uninitialised array in shared memory the daemon reads in place: saving it copies
        nothing. A torch dtype gives a torch tensor, anything else a numpy array. After a save,
        write it again only once the checkpoint is committed (handle.committed())."""
        shape = [int(shape)] if isinstance(shape, int) else [int(d) for d in shape]
        name = _arrays.dtype_name(dtype)
        count = int(np.prod(shape)) if shape else 1
        slab, offset = self._slabs.allocate(count * _arrays.ITEMSIZE[name])
        return _arrays.view_of(slab, offset, shape, name, as_torch=_is_torch_dtype(dtype))

    def stage(self, arrays: Sequence[Any]) -> list[Any]:
        """Copies each array once into its own staging-arena buffer (GIL released; GPU tensors
        device to arena) and returns same-typed CPU views of those buffers. Saving a view copies
        nothing and hands the buffer to the daemon; a staged view must not be saved twice."""
        device = [i for i, a in enumerate(arrays) if _arrays.is_device_tensor(a)]
        host = [i for i, a in enumerate(arrays) if not _arrays.is_device_tensor(a)]
        out: list[Any] = [None] * len(arrays)
        for i, view in zip(
            device, self._stage_from_device([arrays[i] for i in device]), strict=True
        ):
            out[i] = view
        try:
            bufs = self._native.stage([_arrays.view(arrays[i]) for i in host]) if host else []
        except BaseException:
            self.release([out[i] for i in device])
            raise
        for i, b in zip(host, bufs, strict=True):
            a = arrays[i]
            out[i] = _arrays.view_of(
                b,
                0,
                _arrays.shape_of(a),
                _arrays.dtype_name(a),
                as_torch=_arrays.is_torch_tensor(a),
            )
        return out

    def _stage_from_device(self, tensors: list[Any]) -> list[Any]:
        """Copies each device (GPU) tensor once into its own staging-arena buffer with copy_
        (DMA straight into the arena when it is pinned: pin_cuda=True) and returns arena-backed
        CPU views of them, registered like stage()'s (an empty tensor: just a CPU copy, no
        buffer). Returns once the copies are done. Without tensors it does nothing (and never
        imports torch)."""
        if not tensors:
            return []
        torch = _arrays.torch_module()
        sized = [t for t in tensors if _arrays.nbytes(t) > 0]
        bufs = self._native.allocate([_arrays.nbytes(t) for t in sized]) if sized else []
        views = []
        try:
            next_buf = iter(bufs)
            for t in tensors:
                if _arrays.nbytes(t) == 0:
                    views.append(t.cpu())
                    continue
                view = _arrays.view_of(
                    next(next_buf), 0, _arrays.shape_of(t), _arrays.dtype_name(t), as_torch=True
                )
                view.copy_(t, non_blocking=True)  # value semantics: conj/neg views resolved
                views.append(view)
            for device in {t.device for t in tensors if t.device.type == "cuda"}:
                torch.cuda.synchronize(device)
        except BaseException:
            self._native.release(bufs)
            raise
        return views

    @property
    def arena_pinned_for_cuda(self) -> bool:
        """Whether this process's mapping of the staging arena is pinned for CUDA (pin_cuda)."""
        return bool(self._native.arena_pinned_for_cuda())

    @property
    def reconnect_count(self) -> int:
        """How often this client reconnected to a restarted daemon: each time a new session, the
        new instance's arena mapped and the shared-memory slabs registered again."""
        return int(self._native.reconnect_count())

    def release(self, staged: Iterable[Any]) -> None:
        """Gives back the arena buffers of stage() views that were not saved (libckptd-client
        finds each view's buffer; views of anything else are skipped)."""
        self._native.release_at([_arrays.address(v) for v in staged])

    # --- save -----------------------------------------------------------------------------------
    def save(
        self,
        job: str,
        step: int,
        tensors: Mapping[str, Any] | None = None,
        objects: Mapping[str, Any] | None = None,
        *,
        rank: int = 0,
        world_size: int = 1,
        per_rank_objects: Iterable[str] = (),
        blocking: bool = True,
    ) -> SaveHandle:
        """Saves this rank's part of checkpoint (job, step).

        tensors: name -> array/tensor (the whole item), Shard (a region of it) or a list of Shards
        (disjoint regions of the item held by this rank, e.g. the sub-parameters of a fused
        tensor-parallel weight: ckptd.layouts). Each is copied once into the staging arena with
        the GIL released; ckptd.empty()/stage() memory is not copied at all. objects: name -> any
        picklable value (Raw(bytes) is stored unpickled); names in per_rank_objects are kept per
        rank, others once for the job. CUDA tensors are copied by the daemon itself over CUDA
        IPC, device to its pinned arena, on its low-priority streams: this process copies
        nothing (where the daemon cannot, libckptd-client copies them, saying so once on
        stderr). Other device tensors are copied into the arena here, before save() returns.
        blocking=True returns once staged. blocking=False is the overlapped save (docs/
        USER_GUIDE.md "Overlapping the save with compute"): it returns at once and the copy runs
        on the client's save threads (niced: save_threads, save_thread_nice) — for CUDA tensors
        once the kernels queued so far on their devices are done — while the caller computes.
        Call handle.staged().result() before changing the tensors (before optimizer.step()): a
        change before it may reach the checkpoint. The daemon commits once ranks
        0..world_size-1 have saved."""
        specs: list[tuple[Any, ...]] = []
        keep: list[Any] = []  # holds converted sources alive during the call
        # (name, shard) in order; a name given a list of Shards appears once per Shard
        shards = [
            (name, s) for name, value in (tensors or {}).items() for s in _shards(name, value)
        ]
        # CUDA tensors go to libckptd-client as device memory: the daemon copies them over CUDA
        # IPC during the Save call (or the library does, where IPC cannot be used). Other device
        # tensors (not CUDA) are copied into the arena here.
        on_device = [
            i
            for i, (_, s) in enumerate(shards)
            if _arrays.is_device_tensor(s.data) and not _arrays.is_cuda_tensor(s.data)
        ]
        staged_views = self._stage_from_device([shards[i][1].data for i in on_device])
        device_views = dict(zip(on_device, staged_views, strict=True))
        cuda = {
            i: _contiguous_cuda(s.data)
            for i, (_, s) in enumerate(shards)
            if _arrays.is_cuda_tensor(s.data)
        }
        # The trainer's kernels writing them must be done before the daemon copies: now when
        # blocking, on the save thread (events recorded now) for the overlapped save.
        events = [] if blocking else _device_events(cuda.values())
        if blocking:
            _sync_devices(cuda.values())
        try:  # the device copies' buffers stay ours until the daemon takes them
            for i, (name, shard) in enumerate(shards):
                data = device_views.get(i, cuda.get(i, shard.data))
                if not _arrays.is_torch_tensor(data) and not isinstance(data, np.ndarray):
                    data = np.asarray(data)
                keep.append(data)
                specs.append(
                    (
                        name,
                        _arrays.dtype_name(data),
                        [int(d) for d in shard.global_shape],
                        _region_spec(shard.region),
                        _arrays.cuda_view(data) if i in cuda else _arrays.view(data),
                    )
                )
            per_rank = set(per_rank_objects)
            objs = [
                (name, name in per_rank, _object_bytes(v)) for name, v in (objects or {}).items()
            ]
        except BaseException:
            self.release(staged_views)
            raise

        def run() -> dict[str, Any]:
            try:
                for event in events:
                    event.synchronize()
                result: dict[str, Any] = self._native.save(job, step, rank, world_size, specs, objs)
            except BaseException:
                self.release(staged_views)
                raise
            del keep[:]
            return result

        if blocking:
            staged: Future[dict[str, Any]] = Future()
            staged.set_result(run())
        else:
            try:
                staged = self._submit_save(run)
            except BaseException:
                self.release(staged_views)
                raise
        return SaveHandle(self, job, step, staged)

    def wait(
        self,
        job: str,
        step: int,
        *,
        committed: bool = True,
        until: str | None = None,
        timeout_ms: int | None = None,
    ) -> dict[str, Any]:
        """Blocks until (job, step) is COMMITTED and returns its status. `until` "staged" waits
        only until every rank is staged (as committed=False), "remote" until it is also durable on
        the daemon's remote tier."""
        ms = self.wait_timeout_ms if timeout_ms is None else timeout_ms
        if until is None:
            until = "committed" if committed else "staged"
        return dict(self._native.wait(job, step, until, ms))

    def commit_partial(self, job: str, step: int) -> dict[str, Any]:
        """Commits the ranks staged so far as an intentionally partial checkpoint."""
        return dict(self._native.commit(job, step))

    def abort(self, job: str, step: int, reason: str = "") -> dict[str, Any]:
        return dict(self._native.abort(job, step, reason))

    # --- load -----------------------------------------------------------------------------------
    def load(
        self,
        job: str,
        step: int | str = "latest",
        into: Mapping[str, Any] | None = None,
        *,
        items: Iterable[str] | None = None,
        objects: Iterable[str] | None = None,
        rank: int = 0,
        raw_objects: bool = False,
        as_torch: bool = False,
        prefetch: bool = False,
    ) -> LoadResult:
        """Loads from a COMMITTED checkpoint (step "latest" or an int).

        into: name -> destination array/tensor (the whole item) or (destination, Box/Flat) for a
        region of it: that is resharding. The destination's bytes must match the item's dtype.
        Without `into`, loads the tensors named in `items` (default: all) into new numpy arrays
        (torch tensors with as_torch=True). Objects named in `objects` (default without `into`:
        all) are unpickled unless raw_objects. Per-rank objects are this `rank`'s copy.
        prefetch: a hint — the daemon brings the whole checkpoint into its RAM tier first (once,
        however many local ranks ask at the same time) and copies this load from there; for
        restores where several ranks of the node load the same checkpoint."""
        resolved = self._resolve_step(job, step)
        result = LoadResult(step=resolved)
        targets: list[tuple[str, Any, Any]] = []  # (item, region, destination)
        object_names = list(objects) if objects is not None else []
        if into is not None:
            for name, value in into.items():
                dest, region = value if isinstance(value, tuple) else (value, None)
                targets.append((name, region, dest))
                result.tensors[name] = dest
        else:
            catalog = self._native.inspect(job, resolved)
            wanted = set(items) if items is not None else None
            for info in catalog:
                if info["kind"] == "tensor" and (wanted is None or info["name"] in wanted):
                    dest = _new_array(info["shape"], info["dtype"], as_torch)
                    targets.append((info["name"], None, dest))
                    result.tensors[info["name"]] = dest
                elif info["kind"] == "object" and objects is None and items is None:
                    object_names.append(info["name"])
            if wanted is not None:
                missing = wanted - set(result.tensors)
                if missing:
                    from ._errors import NotFoundError

                    raise NotFoundError(
                        f"job {job} step {resolved}: no tensor items {sorted(missing)}"
                    )
        read = self._load_into(job, resolved, targets, rank=rank, prefetch=prefetch)
        result.bytes_read = int(read["bytes_read"])
        result.bytes_read_remote = int(read["bytes_read_remote"])
        result.bytes_read_peer = int(read["bytes_read_peer"])
        result.bytes_from_ram = int(read["bytes_from_ram"])
        result.bytes_prefetched = int(read["bytes_prefetched"])
        for name in object_names:
            data = self._native.load_object(job, resolved, rank, name)
            result.objects[name] = data if raw_objects else pickle.loads(data)
        return result

    def load_into(
        self, job: str, step: int, targets: Sequence[tuple[str, Region, Any]], *, rank: int = 0
    ) -> int:
        """Loads (item, region, destination) targets and returns the bytes the daemon read from
        storage. One call of libckptd-client's Load: it batches by its one policy (at most
        load_batch_bytes of arena scratch per Load RPC, two in flight, so the daemon's reads
        overlap the copies out of the arena), copies nothing for ckptd.empty()/stage() memory."""
        return int(self._load_into(job, step, targets, rank=rank)["bytes_read"])

    def load_into_counted(
        self,
        job: str,
        step: int,
        targets: Sequence[tuple[str, Region, Any]],
        *,
        rank: int = 0,
        prefetch: bool = False,
        hot_direct: bool = True,
    ) -> dict[str, int]:
        """load_into, answering the daemon's counts: bytes_read (from storage),
        bytes_read_remote (of those, from the remote tier), bytes_read_peer (of those, from other
        nodes' peer stores), bytes_from_ram (copied from its RAM tier) and bytes_prefetched (read
        into the RAM tier by this load's prefetch hint, see load()). hot_direct=False: bytes hot
        in the RAM tier go through arena scratch (two copies) instead of being copied once
        straight into the destinations (for comparison; see docs/USER_GUIDE.md)."""
        got = self._load_into(
            job, step, targets, rank=rank, prefetch=prefetch, hot_direct=hot_direct
        )
        keys = (
            "bytes_read",
            "bytes_read_remote",
            "bytes_read_peer",
            "bytes_from_ram",
            "bytes_prefetched",
        )
        return {k: int(got[k]) for k in keys}

    def _load_into(
        self,
        job: str,
        step: int,
        targets: Sequence[tuple[str, Region, Any]],
        *,
        rank: int = 0,
        prefetch: bool = False,
        hot_direct: bool = True,
    ) -> dict[str, Any]:
        # CUDA destinations are written by the daemon over CUDA IPC (or by the library, where IPC
        # cannot be used); a non-contiguous one through a contiguous temporary on its device.
        scatter: list[tuple[Any, Any]] = []
        specs = []
        for item, region, dest in targets:
            view: Any
            if _arrays.is_cuda_tensor(dest):
                direct = _contiguous_cuda(dest)
                if direct is not dest:
                    scatter.append((dest, direct))
                view = _arrays.cuda_view(direct)
            else:
                view = _arrays.view(dest)
            specs.append((item, _region_spec(region), view, _arrays.nbytes(dest)))
        if not specs:
            return {
                "bytes_read": 0,
                "bytes_read_remote": 0,
                "bytes_read_peer": 0,
                "bytes_from_ram": 0,
                "bytes_prefetched": 0,
            }
        _sync_devices([d for _, _, d in targets if _arrays.is_cuda_tensor(d)])
        out = self._native.load(job, step, rank, specs, prefetch, hot_direct)
        for dest, direct in scatter:
            dest.copy_(direct)
        for (item, _, _, n), got in zip(specs, out["item_bytes"], strict=True):
            if got != n:
                from ._errors import InvalidArgumentError

                raise InvalidArgumentError(
                    f"job {job} step {step} item {item}: the destination has {n} bytes, the "
                    f"checkpoint has {got} for the region asked (dtype or shape mismatch)"
                )
        return dict(out)

    def load_object(
        self, job: str, step: int | str, item: str, *, rank: int = 0, raw: bool = False
    ) -> Any:
        data = self._native.load_object(job, self._resolve_step(job, step), rank, item)
        return data if raw else pickle.loads(data)

    def _resolve_step(self, job: str, step: int | str) -> int:
        """The step "latest" or an int names, resolved by libckptd-client (Client::ResolveStep);
        NotFoundError when the job has no committed checkpoint."""
        if isinstance(step, str) and step != "latest":
            raise ValueError(f"step must be an int or 'latest', not {step!r}")
        return int(self._native.resolve_step(job, None if step == "latest" else int(step)))

    # --- catalog --------------------------------------------------------------------------------
    def list(self, job: str | None = None) -> Rows:
        """Without a job: every job. With one: its checkpoints, oldest first."""
        if job is None:
            return list(self._native.list_jobs())
        return list(self._native.list_checkpoints(job))

    def status(self, job: str, step: int) -> dict[str, Any]:
        """State, tiers reached, bytes and per-rank progress of a checkpoint."""
        return dict(self._native.status(job, step))

    def latest(self, job: str, durable: str = "committed") -> int | None:
        """The newest COMMITTED step of a job, or None.

        durable: "committed" (any), "peer" (one that survives the loss of any node: every blob
        on a peer or on the store) or "store" (one whole on the remote store, which survives the
        loss of every node); docs/PEERS.md "What survives what".
        """
        latest = self._native.latest(job, durable)
        return None if latest is None else int(latest)

    def inspect(self, job: str, step: int | str = "latest") -> Rows:
        """The items of a committed checkpoint: name, kind, dtype, shape, shard count, bytes."""
        return list(self._native.inspect(job, self._resolve_step(job, step)))

    def delete(self, job: str, step: int) -> None:
        self._native.delete(job, step)

    @property
    def target(self) -> str:
        return str(self._native.target())

    def close(self) -> None:
        """Ends the session now, after the saves and loads in flight: the daemon releases what the
        session held (as when the process exits). Views of stage()/empty() buffers stay mapped
        (touching them never faults), but stage()'s arena buffers are the daemon's again. Every
        later call raises FailedPreconditionError. Closing again does nothing. In a process
        forked after the client was made it does nothing (the session is the parent's)."""
        if self._forked:
            return
        self._save_pool.shutdown(wait=True)
        self._executor.shutdown(wait=True)
        self._native.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _shards(name: str, value: Any) -> list[Shard]:
    """The shards one entry of save()'s tensors stands for: a list of Shards as it is (each a
    region of the item; the daemon refuses overlapping ones), a Shard, or a whole array."""
    if isinstance(value, list):
        for s in value:
            if not isinstance(s, Shard):
                raise TypeError(
                    f"ckptd: item {name}: a list of regions holds Shards, not {type(s).__name__}"
                )
        return value
    return [value if isinstance(value, Shard) else Shard(value, _arrays.shape_of(value))]


def _object_bytes(value: Any) -> bytes:
    if isinstance(value, Raw):
        return bytes(value.data)
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _is_torch_dtype(dtype: Any) -> bool:
    return _arrays.is_torch_dtype(dtype)


def _new_array(shape: Sequence[int], dtype: str, as_torch: bool) -> Any:
    if as_torch:
        torch = _arrays.torch_module()
        return torch.empty(tuple(shape), dtype=_arrays.torch_dtype(dtype))
    return np.empty(tuple(shape), dtype=_arrays.numpy_dtype(dtype))


def copy_stats() -> dict[str, int]:
    """Bytes and calls of the copies made by the client, process-wide: save_bytes counts the one
    copy into the staging arena, load_bytes the one copy out of it."""
    return dict(_ckptd.copy_stats())


def reset_copy_stats() -> None:
    _ckptd.reset_copy_stats()
