"""Helpers the Python benchmarks share: a daemon of their own, the page cache dropped, the
daemon's device reads, fio's sequential read of a file, and medians."""

from __future__ import annotations

import atexit
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable

GB = 1e9


def remove_shm_at_exit(state: str) -> None:
    """The shared-memory segments of a daemon on `state` go when the bench exits (named now:
    the dir may be gone by then)."""
    from ckptd._shm import prefix_of, remove_prefix  # lazily: some benches import no ckptd

    atexit.register(remove_prefix, prefix_of(state))


def start_daemon(
    binary: str, state: str, staging_bytes: int, flags: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str]:
    """Starts `binary` on `state` (socket state/s.sock, log state/daemon.log) and waits for its
    socket; returns the process and the socket's path. Exits the bench if it does not start."""
    sock = os.path.join(state, "s.sock")
    # Benches delete their state dirs, which would orphan the daemon's shared memory (a clean
    # stop keeps the RAM tier's arena for a restart): its segments go when the bench exits.
    remove_shm_at_exit(state)
    with open(os.path.join(state, "daemon.log"), "w") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--state_dir={state}",
                f"--socket={sock}",
                f"--staging_bytes_max={staging_bytes}",
                "--log_level=warn",
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    for _ in range(600):
        if os.path.exists(sock):
            return proc, sock
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    sys.exit(f"bench: {binary} did not create {sock}; see {state}/daemon.log")


def can_drop_caches() -> bool:
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def drop_caches(path: str) -> None:
    """Drops the page cache: all of it when allowed, else each file's under `path` (fadvise)."""
    os.sync()
    if can_drop_caches():
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        return
    drop_file_caches(
        os.path.join(dirpath, fn) for dirpath, _, files in os.walk(path) for fn in files
    )


def drop_file_caches(files: Iterable[str | os.PathLike[str]]) -> None:
    """Drops these files' pages from the page cache (only theirs: other work on this machine keeps
    its cache); a file that cannot be opened is skipped."""
    os.sync()
    for f in files:
        try:
            fd = os.open(f, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def proc_io(pid: int) -> dict[str, int]:
    """Process `pid`'s /proc/PID/io: rchar/wchar (bytes through read/write calls, page cache
    included) and read_bytes/write_bytes (the block devices')."""
    with open(f"/proc/{pid}/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def device_read_bytes(pid: int) -> int:
    """What process `pid` has read from block devices (/proc/PID/io read_bytes)."""
    return proc_io(pid).get("read_bytes", 0)


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """The size of a file, or of every file under a directory."""
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def fio_read(path: str, nbytes: int, direct: bool, bs: str = "16M", depth: int = 4) -> float:
    """fio's sequential read of `path` (nbytes, laid out by fio first) through io_uring with
    O_DIRECT or through the page cache (dropped first); bytes per second."""
    cmd = [
        "fio", "--name=read", f"--filename={path}", "--rw=read", f"--bs={bs}",
        f"--iodepth={depth}", "--ioengine=io_uring", f"--direct={int(direct)}",
        f"--size={nbytes}", "--output-format=json",
    ]  # fmt: skip
    drop_caches(os.path.dirname(path))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    job = json.loads(out[out.index("{") :])["jobs"][0]["read"]
    return job["io_bytes"] / (job["runtime"] / 1000.0)


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def read_through_cache(path: str) -> None:
    """Reads the file `path`, or every file under the directory `path`, once, so its pages are in
    the page cache (what a copy tool or a buffered reader leaves behind)."""
    files = [path] if os.path.isfile(path) else [
        os.path.join(d, fn) for d, _, fns in os.walk(path) for fn in fns
    ]  # fmt: skip
    for fn in files:
        if not os.path.isfile(fn) or os.path.islink(fn):
            continue  # sockets, links
        with open(fn, "rb") as f:
            while f.read(64 << 20):
                pass
