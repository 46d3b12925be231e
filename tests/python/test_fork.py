"""A process forked after its parent connected to ckptd (a fork-started worker, a DataLoader
worker on Linux's default start method): gRPC cannot run in it, so every client call there —
the inherited client's, a new one's, default_client() — raises FailedPreconditionError saying
how to start workers instead of hanging or crashing; the child exits normally (the inherited
client's destructor would hang it), and the parent's session and shared-memory slabs are left
whole (a child's copy of a slab neither unregisters nor unlinks it). A child forked before the
parent connected may connect itself.

Each case runs in its own interpreter (a script run with a timeout): the fork must not happen in
the test process, whose own clients would be inherited.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from conftest import Daemon

FORK_AFTER_CONNECT = """
import os, sys
import numpy as np
import ckptd

sock = sys.argv[1]
os.environ["CKPTD_SOCKET"] = sock
c = ckptd.default_client()
a = c.empty(4096)  # a slab alive across the fork
a[:] = np.arange(4096, dtype=np.float32)
pid = os.fork()
if pid == 0:
    errors = []
    for what, call in (
        ("inherited", lambda: c.list()),
        ("default", lambda: ckptd.default_client()),
        ("new", lambda: ckptd.connect(sock)),
        ("save", lambda: c.save("forked", 1, {"a": a})),
    ):
        try:
            call()
            errors.append(f"{what}: no error")
        except ckptd.FailedPreconditionError as e:
            if "spawn" not in str(e) or str(os.getppid()) not in str(e):
                errors.append(f"{what}: {e}")
    c.close()  # nothing to do here
    del a
    print("child:", "; ".join(errors) or "ok", flush=True)
    sys.exit(1 if errors else 0)  # a normal exit: atexit hooks and finalizers run
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
# The parent's session and slab are whole: the slab saves in place and loads back.
c.save("parent", 1, {"a": a}).committed().result()
got = c.load("parent", 1).tensors["a"]
assert np.array_equal(got, np.arange(4096, dtype=np.float32))
assert c.list("forked") == []  # the child's save was refused, not half-done
print("parent: ok", flush=True)
"""

FORK_BEFORE_CONNECT = """
import os, sys
import numpy as np
import ckptd

sock = sys.argv[1]
pid = os.fork()
if pid == 0:
    c = ckptd.connect(sock)
    c.save("child-own", 1, {"x": np.ones(8, np.float32)}).committed().result()
    c.close()
    sys.exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
c = ckptd.connect(sock)
assert np.array_equal(c.load("child-own", 1).tensors["x"], np.ones(8, np.float32))
print("parent: ok", flush=True)
"""


# The child's empty() must not carve its parent's slab: the slab is shared memory, so the parent
# and the child would hand out the same bytes (each process's copy of the allocator thinks that
# part is free) and the child's writes land in the parent's arrays.
FORK_EMPTY_SHARES_NO_SLAB = """
import os, sys
import numpy as np
import ckptd

c = ckptd.connect(sys.argv[1])
a = c.empty(1024)  # the slab the parent carves its arrays from
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.read(r, 1)  # the parent has its array
    try:
        x = c.empty(1024)
        x[:] = 7
        print("child: empty() in a forked child did not raise", flush=True)
        os._exit(1)
    except ckptd.FailedPreconditionError as e:
        os._exit(0 if "spawn" in str(e) else 1)
b = c.empty(1024)
b[:] = 1
os.write(w, b"x")
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
assert np.all(b == 1), "the child wrote into the parent's array"
print("parent: ok", flush=True)
"""

# A slab can outlive its Python client (its arrays hold the native client): a forked child that
# drops such an array must not destroy the native client there (its Goodbye over gRPC hangs).
FORK_SLAB_OUTLIVES_CLIENT = """
import gc, os, sys
import ckptd

c = ckptd.connect(sys.argv[1])
a = c.empty(4096)  # its slab keeps the native client alive
del c
gc.collect()
pid = os.fork()
if pid == 0:
    del a  # the slab goes; with it the child's reference to the native client
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("parent: ok", flush=True)
"""


# A non-blocking save (or a parent's handle's committed()) runs on the client's executor, whose
# threads the child does not have: it must raise, not hand back a Future that never completes.
FORK_NONBLOCKING_SAVE = """
import os, sys
from concurrent.futures import TimeoutError as FutureTimeout
import numpy as np
import ckptd

c = ckptd.connect(sys.argv[1])
# An idle executor thread in the parent (the child's executor believes it has one too).
parent = c.save("nb-parent", 1, {"a": np.ones(4, np.float32)}, blocking=False)
parent.staged().result()
pid = os.fork()
if pid == 0:
    problems = []
    for what, call in (
        ("save", lambda: c.save("nb-forked", 1, {"a": np.ones(4, np.float32)}, blocking=False)
         .staged().result(timeout=10)),
        ("committed", lambda: parent.committed().result(timeout=10)),
    ):
        try:
            call()
            problems.append(f"{what}: no error")
        except ckptd.FailedPreconditionError:
            pass
        except FutureTimeout:
            problems.append(f"{what}: its Future never completed")
    print("child:", "; ".join(problems) or "ok", flush=True)
    os._exit(1 if problems else 0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
parent.committed().result()
print("parent: ok", flush=True)
"""


# ckptd.torch.StorageWriter(async_staging=True) stages on a pool thread of its own: in a child
# forked after a stage(), the pool's copy has no thread, so the child's stage() must fail like any
# ckptd call there, not return a Future that never completes.
FORK_ASYNC_STAGING = """
import os, sys
from concurrent.futures import TimeoutError as FutureTimeout
import torch
import ckptd
import ckptd.torch

w = ckptd.torch.StorageWriter("runs/forkpool/step-1", socket=sys.argv[1], async_staging=True)
w.stage({"a": torch.ones(4)}).result()  # the staging thread, idle now
pid = os.fork()
if pid == 0:
    try:
        w.stage({"a": torch.ones(4)}).result(timeout=10)
        print("child: no error", flush=True)
        os._exit(1)
    except ckptd.FailedPreconditionError:
        os._exit(0)
    except FutureTimeout:
        print("child: stage()'s Future never completed", flush=True)
        os._exit(1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
print("parent: ok", flush=True)
"""


# ckptd.torch_checkpointing's Stager (async_staging) and Writer run their work on one-thread pools
# made once: in a child forked after each ran a task, the pools' copies have no thread. The
# child's stage() must fail like any ckptd call there, and its write() must run (here it fails on
# the checkpoint info it is given), not return a Future that never completes.
FORK_TORCH_CHECKPOINTING_POOLS = """
import os, sys
from concurrent.futures import Future, TimeoutError as FutureTimeout
import torch
import ckptd
from ckptd import torch_checkpointing as ctc

sock = sys.argv[1]
stager = ctc.Stager(socket=sock, async_staging=True)
stager.stage({"a": torch.ones(4)}).result()  # the staging thread, idle now
args = ctc.CheckpointWriterArgs(
    config=ctc._writer_config(None, sock),
    rank_info=ctc.RankInfo(0, 1, 0, 1),
    storage_config=ctc.StorageConfig(root="runs/forkpool-tc", socket=sock),
)
writer = ctc.Writer(args)


class Sentinel(Exception):
    pass


def failed_info():
    f = Future()
    f.set_exception(Sentinel())
    return f


try:  # the writing thread runs once, idle now
    writer.write(failed_info(), "runs/forkpool-tc/step-1").result()
except Sentinel:
    pass
pid = os.fork()
if pid == 0:
    problems = []
    for what, call, want in (
        ("stage", lambda: stager.stage({"a": torch.ones(4)}).result(timeout=10),
         ckptd.FailedPreconditionError),
        ("write", lambda: writer.write(failed_info(), "runs/forkpool-tc/step-2")
         .result(timeout=10), Sentinel),
    ):
        try:
            call()
            problems.append(f"{what}: no error")
        except want:
            pass
        except FutureTimeout:
            problems.append(f"{what}: its Future never completed")
    print("child:", "; ".join(problems) or "ok", flush=True)
    os._exit(1 if problems else 0)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, status
stager.close()
print("parent: ok", flush=True)
"""


def run(script: str, daemon: Daemon) -> str:
    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), daemon.socket],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def test_a_child_forked_after_connect_gets_a_clear_error_and_leaves_the_parent_whole(
    daemon: Daemon,
) -> None:
    out = run(FORK_AFTER_CONNECT, daemon)
    assert "child: ok" in out and "parent: ok" in out, out


def test_a_child_forked_before_any_connect_connects_itself(daemon: Daemon) -> None:
    out = run(FORK_BEFORE_CONNECT, daemon)
    assert "parent: ok" in out, out


def test_a_forked_childs_empty_raises_and_leaves_the_parents_slab_alone(daemon: Daemon) -> None:
    out = run(FORK_EMPTY_SHARES_NO_SLAB, daemon)
    assert "parent: ok" in out, out


def test_a_forked_child_dropping_a_slab_whose_client_is_gone_exits(daemon: Daemon) -> None:
    out = run(FORK_SLAB_OUTLIVES_CLIENT, daemon)
    assert "parent: ok" in out, out


def test_a_forked_childs_nonblocking_save_raises_instead_of_never_completing(
    daemon: Daemon,
) -> None:
    out = run(FORK_NONBLOCKING_SAVE, daemon)
    assert "parent: ok" in out, out


def test_a_forked_childs_async_staging_fails_instead_of_never_completing(daemon: Daemon) -> None:
    out = run(FORK_ASYNC_STAGING, daemon)
    assert "parent: ok" in out, out


def test_a_forked_childs_torch_checkpointing_pools_run_instead_of_never_completing(
    daemon: Daemon,
) -> None:
    pytest.importorskip("torch_checkpointing")
    out = run(FORK_TORCH_CHECKPOINTING_POOLS, daemon)
    assert "parent: ok" in out, out
