"""ckptd._shm names a daemon's shared-memory segments as the daemon does (daemon/main.cc
ShmPrefix: CRC-32C of the canonical state dir), through a symlink too, and remove_segments
removes exactly those: what tests and benchmarks rely on to leave no /dev/shm behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

import ckptd
from ckptd._shm import crc32c, prefix_of, remove_segments
from conftest import start_daemon


def test_crc32c_is_castagnoli() -> None:
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    assert crc32c(b"") == 0


def test_prefix_names_the_daemons_segments_and_removes_only_them() -> None:
    base = tempfile.mkdtemp(prefix="ckshm", dir="/tmp")
    real = os.path.join(base, "state")
    os.makedirs(real)
    link = os.path.join(base, "link")
    os.symlink(real, link)  # the daemon canonicalizes its state dir; so does prefix_of
    bystander = Path("/dev/shm") / (prefix_of(base) + "arena-u0-0123456789abcdef")
    bystander.write_bytes(b"x")  # another state dir's segment: not ours to remove
    d = start_daemon(state_dir=link)
    try:
        with ckptd.connect(d.socket) as c:
            c.save("j", 1, {"w": np.arange(1024, dtype=np.float32)}).committed().result(60)
        ours = sorted(p.name for p in Path("/dev/shm").glob(prefix_of(link) + "*"))
        assert ours, "the daemon's arena segment is not named with prefix_of(state_dir)"
        assert prefix_of(link) == prefix_of(real)
        assert all(name.startswith(prefix_of(real) + "arena-u") for name in ours)
    finally:
        d.stop()
    try:
        # A clean stop keeps the arena while the RAM tier holds the checkpoint.
        assert sorted(remove_segments(link)) == ours
        assert not list(Path("/dev/shm").glob(prefix_of(real) + "*"))
        assert bystander.exists()
    finally:
        bystander.unlink(missing_ok=True)
        shutil.rmtree(base, ignore_errors=True)
