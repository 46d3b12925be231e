"""deploy/ckptd.service sets MemoryDenyWriteExecute=yes: the daemon must never need writable
executable memory. The kernel's own form of that setting (prctl PR_SET_MDWE, Linux >= 6.3, what
systemd >= 254 applies) is set on a real daemon, which then saves, flushes, commits and loads.
tests/deploy/systemd_unit_test.sh checks the unit file itself (systemd-analyze)."""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import ckptd
from conftest import daemon_binary, remove_shm_at_end

PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
PR_SET_PDEATHSIG = 1


def deny_write_execute() -> None:
    """In the child, before exec: what MemoryDenyWriteExecute=yes does (inherited by exec)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_MDWE)")
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def mdwe_supported() -> bool:
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None).prctl(66, 0, 0, 0, 0) != 1)"
    try:
        r = subprocess.run([sys.executable, "-c", probe], preexec_fn=deny_write_execute)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def test_the_daemon_runs_with_memory_deny_write_execute() -> None:
    if not mdwe_supported():
        pytest.skip("this kernel has no PR_SET_MDWE (Linux >= 6.3)")
    # The setting is in force across exec: W+X memory is refused to the child.
    wx = "import mmap; mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)"
    r = subprocess.run([sys.executable, "-c", wx], preexec_fn=deny_write_execute)
    assert r.returncode != 0, "a write+execute mapping was allowed under PR_SET_MDWE"

    state = tempfile.mkdtemp(prefix="ckmdwe", dir="/tmp")
    remove_shm_at_end(state)
    sock = os.path.join(state, "ckptd.sock")
    log = Path(state) / "ckptd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                daemon_binary(),
                f"--state_dir={state}",
                f"--staging_bytes_max={64 << 20}",
                "--metrics_address=0",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=deny_write_execute,
        )
    try:
        deadline = time.monotonic() + 30
        while "ckptd ready on" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        w = np.arange(1 << 20, dtype=np.float32)
        with ckptd.connect(sock) as c:
            c.save("mdwe", 1, {"w": w}).committed().result(60)
            assert np.array_equal(c.load("mdwe", 1).tensors["w"], w)
            buf = c.empty((1 << 20,), np.float32)  # a registered region, read in place
            buf[:] = w
            c.save("mdwe", 2, {"w": buf}).committed().result(60)
            assert np.array_equal(c.load("mdwe", 2).tensors["w"], w)
        assert proc.poll() is None, log.read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        text = log.read_text()
        shutil.rmtree(state, ignore_errors=True)
    assert proc.returncode == 0, text
