"""The shm slabs behind ckptd.empty() never outlive their process in /dev/shm: a normal exit
unlinks them even when the arrays are never destroyed, a killed process's slabs are collected by
the next process of the uid that makes one (nobody holds their lock), and a slab some live
process holds is never touched. Slab names never collide, whatever pids came before."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import Daemon

SHM = Path("/dev/shm")

# Makes one slab (ckptd.empty), prints its name, then either returns (a normal exit, the array
# still referenced by a module global) or waits to be killed.
PROGRAM = textwrap.dedent(
    """
    import sys, time
    import ckptd

    client = ckptd.connect(sys.argv[1])
    kept = client.empty(1024)
    print(client._slabs._current.name, flush=True)
    if sys.argv[2] == "wait":
        time.sleep(60)
    """
)


def run(sock: str, mode: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, sock, mode], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    name = proc.stdout.readline().strip()
    assert name.startswith("/ckptd-py-"), name
    return proc, name


def test_a_normal_exit_unlinks_its_slabs(daemon: Daemon) -> None:
    proc, name = run(daemon.socket, "exit")
    assert proc.wait(timeout=60) == 0
    assert not (SHM / name.lstrip("/")).exists()


def test_a_killed_process_slabs_are_collected_by_the_next_one(daemon: Daemon) -> None:
    proc, orphan = run(daemon.socket, "wait")
    assert (SHM / orphan.lstrip("/")).exists()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert (SHM / orphan.lstrip("/")).exists()  # nothing ran to remove it
    # A slab someone holds (as a live process in another pid namespace would) stays.
    held = SHM / f"ckptd-py-{proc.pid}-0-held{os.getpid():x}"
    fd = os.open(held, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 4096)
        fcntl.flock(fd, fcntl.LOCK_EX)
        again, name = run(daemon.socket, "exit")
        assert again.wait(timeout=60) == 0
        assert name != orphan
        assert not (SHM / orphan.lstrip("/")).exists()
        assert held.exists()
    finally:
        os.close(fd)
        held.unlink(missing_ok=True)
