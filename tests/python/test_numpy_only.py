"""The plain client is numpy-only and thread-safe: a caller that passes numpy arrays never imports
torch, and several threads making their first save and load at the same moment all succeed
(each in a fresh interpreter, so the first call really is the first)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import Daemon

HERE = Path(__file__).resolve().parent


def run_python(code: str, socket: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), socket],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )


NUMPY_ONLY = """
    import sys
    import numpy as np
    import ckptd

    client = ckptd.connect(sys.argv[1])
    x = np.arange(1000, dtype=np.float32).reshape(10, 100)
    h = client.save("py-numpy-only", 1, {"x": x, "v": x[:, ::3]}, {"meta": {"a": 1}})
    h.committed().result(60)
    out = client.load("py-numpy-only", "latest")
    np.testing.assert_array_equal(out.tensors["x"], x)
    dest = np.empty((10, 100), dtype=np.float32)
    client.load("py-numpy-only", 1, {"x": dest})
    np.testing.assert_array_equal(dest, x)
    z = client.empty((4, 4), np.float64)
    z[:] = 1.5
    client.save("py-numpy-only", 2, {"z": z}, blocking=False).committed().result(60)
    client.list("py-numpy-only")
    client.close()
    assert "torch" not in sys.modules, "ckptd imported torch for a numpy-only caller"
    print("ok")
"""


def test_numpy_only_caller_never_imports_torch(daemon: Daemon) -> None:
    r = run_python(NUMPY_ONLY, daemon.socket)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


FIRST_CALLS_AT_ONCE = """
    import sys
    import threading
    import numpy as np
    import ckptd

    THREADS = 8
    client = ckptd.connect(sys.argv[1])
    start = threading.Barrier(THREADS)
    errors = []

    def first(i):
        try:
            x = np.full((256,), i, dtype=np.int64)
            start.wait()
            client.save(f"py-first-{i}", 1, {"x": x}).committed().result(60)
            np.testing.assert_array_equal(client.load(f"py-first-{i}", 1).tensors["x"], x)
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=first, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert "torch" not in sys.modules
    print("ok")
"""


def test_first_saves_from_many_threads_at_once(daemon: Daemon) -> None:
    r = run_python(FIRST_CALLS_AT_ONCE, daemon.socket)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


TORCH_FIRST_CALLS_AT_ONCE = """
    import sys
    import threading
    import numpy as np
    import ckptd

    THREADS = 6
    client = ckptd.connect(sys.argv[1])
    client.save("py-first-torch", 1, {"x": np.arange(64, dtype=np.float32)}).committed().result(60)
    start = threading.Barrier(THREADS)
    errors = []

    def first(i):
        try:
            start.wait()
            t = client.load("py-first-torch", 1, as_torch=True).tensors["x"]  # imports torch
            assert type(t).__module__ == "torch", type(t)
        except BaseException as e:
            errors.append(repr(e))

    threads = [threading.Thread(target=first, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    print("ok")
"""


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_first_torch_loads_from_many_threads_at_once(daemon: Daemon) -> None:
    """as_torch=True imports torch on first use: threads asking at once all get whole tensors."""
    r = run_python(TORCH_FIRST_CALLS_AT_ONCE, daemon.socket)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"
