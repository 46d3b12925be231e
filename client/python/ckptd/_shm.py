"""The shared-memory names of a daemon on a state dir, for tools that remove a state dir.

A daemon names its /dev/shm segments with a prefix derived from its state dir (daemon/main.cc
ShmPrefix: "ckptd-" and the CRC-32C of the canonical path in 8 hex digits), so that a daemon
restarted on the same dir finds them again and removes what it does not adopt. A dir that is
deleted leaves its segments to nobody: whoever deletes it (a test, a benchmark) removes them with
remove_segments first or after.
"""

from __future__ import annotations

import os
from pathlib import Path


def _crc32c_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as format/crc32c.h computes it."""
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def prefix_of(state_dir: str) -> str:
    """The segment-name prefix of a daemon on `state_dir` ("ckptd-1a2b3c4d-")."""
    canon = os.path.realpath(state_dir)
    return f"ckptd-{crc32c(canon.encode()):08x}-"


def remove_prefix(prefix: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Unlinks every segment named with `prefix` (prefix_of a state dir, taken while the dir
    still exists: a symlink inside a deleted tree resolves no more); returns the names removed."""
    removed = []
    for segment in Path(shm_dir).glob(prefix + "*"):
        segment.unlink(missing_ok=True)
        removed.append(segment.name)
    return removed


def remove_segments(state_dir: str, shm_dir: str = "/dev/shm") -> list[str]:
    """Unlinks every segment of a daemon on `state_dir` (none may still run on it); returns the
    names removed."""
    return remove_prefix(prefix_of(state_dir), shm_dir)
