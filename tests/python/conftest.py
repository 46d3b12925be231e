"""Fixtures: a real ckptd per test module, on a short temp path (unix socket paths must fit in
107 bytes), with a small staging arena; stopped (SIGTERM, then SIGKILL) after the module."""

from __future__ import annotations

import contextlib
import faulthandler
import os
import shutil
import signal
import socket as socketlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ckptd._shm import prefix_of, remove_prefix, remove_segments

ROOT = Path(__file__).resolve().parents[2]
STAGING_BYTES = 64 << 20


def run_rank(rank: int, fn: Any, *args: Any) -> None:
    """The body of one rank spawned by torch.multiprocessing: fn(rank, *args), then a hard exit.

    A failure raises as usual (torch reports it with the rank's traceback). faulthandler prints
    every thread's Python stack if the rank dies of a signal. After success the rank leaves with
    os._exit: interpreter finalization of a process that ran gloo has aborted intermittently in CI
    ("terminate called without an active exception", from a native thread torch or gloo leaves
    joinable at teardown), which is not what these tests check. ckptd's own exit path is tested by
    test_exit.py, which lets the interpreter finalize with client calls in flight."""
    faulthandler.enable()
    fn(rank, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def daemon_binary() -> str:
    path = os.environ.get("CKPTD_BIN") or str(ROOT / "build" / "ckptd")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no ckptd binary at {path}: run `make build` or set CKPTD_BIN")
    return path


def ckptctl_binary() -> str:
    path = os.environ.get("CKPTCTL_BIN") or str(Path(daemon_binary()).parent / "ckptctl")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no ckptctl binary at {path}: run `make build` or set CKPTCTL_BIN")
    return path


def ckptctl(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """`ckptctl --socket <daemon's> ARGS...`, its output captured as text."""
    return subprocess.run(
        [ckptctl_binary(), "--socket", daemon.socket, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


@dataclass
class Daemon:
    state_dir: str
    socket: str
    proc: subprocess.Popen[bytes]
    log: str

    def remove_shm(self) -> None:
        """Unlinks this daemon's shared-memory segments, for a daemon whose state dir is being
        removed: a clean stop keeps the arena while the RAM tier holds checkpoints (for a restart
        on the same state dir), and only a daemon on that state dir would remove it later."""
        remove_segments(self.state_dir)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _die_with_parent() -> None:
    """In the child: SIGTERM when the test process dies (even by SIGKILL or a crash)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


# The segment prefix of every state dir a test started a daemon on, taken then (the dir may be
# gone by the end): their shared-memory segments are removed when the session ends (tests delete
# their state dirs, which orphans the segments; see ckptd._shm).
_PREFIXES: set[str] = set()


def remove_shm_at_end(state_dir: str) -> None:
    """For a test that starts its own daemon on `state_dir`: its segments go when the session
    ends, as start_daemon's do."""
    _PREFIXES.add(prefix_of(state_dir))


@pytest.fixture(scope="session", autouse=True)
def _remove_daemons_shm() -> Iterator[None]:
    yield
    for prefix in _PREFIXES:
        remove_prefix(prefix)


def start_daemon(
    staging_bytes: int = STAGING_BYTES, flags: Sequence[str] = (), state_dir: str | None = None
) -> Daemon:
    """A daemon on `state_dir` (default: a new temp dir), its output appended to ckptd.log."""
    state_dir = state_dir or tempfile.mkdtemp(prefix="ckpy", dir="/tmp")
    remove_shm_at_end(state_dir)
    sock = os.path.join(state_dir, "ckptd.sock")
    log = os.path.join(state_dir, "ckptd.log")
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [
                daemon_binary(),
                f"--state_dir={state_dir}",
                f"--staging_bytes_max={staging_bytes}",
                *flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ckptd exited with {proc.returncode}:\n{Path(log).read_text()}")
        if os.path.exists(sock):
            s = socketlib.socket(socketlib.AF_UNIX)
            try:
                s.connect(sock)
                return Daemon(state_dir, sock, proc, log)
            except OSError:
                pass
            finally:
                s.close()
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"ckptd did not listen on {sock} within 30 s:\n{Path(log).read_text()}")


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with own_daemon() as d:
        yield d


@contextlib.contextmanager
def own_daemon(flags: Sequence[str] = (), **kwargs: Any) -> Iterator[Daemon]:
    """A daemon of the caller's own (start_daemon's arguments); at the end it is stopped and its
    segments and state dir are removed."""
    d = start_daemon(flags=flags, **kwargs)
    try:
        yield d
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)


def flip_blobs(blobs: Sequence[Path]) -> int:
    """Damages each blob: one byte in every 64 flipped (so every checksum block of it, whatever
    its padding). Returns how many; asserts there is at least one."""
    assert blobs, "no blob to damage"
    for blob in blobs:
        data = bytearray(blob.read_bytes())
        for i in range(0, len(data), 64):
            data[i] ^= 0xFF
        blob.write_bytes(bytes(data))
    return len(blobs)


def free_port() -> int:
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def store() -> Iterator[str]:
    """A directory standing for the remote tier's shared file system (--remote_dir)."""
    path = tempfile.mkdtemp(prefix="ckpy-store", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
