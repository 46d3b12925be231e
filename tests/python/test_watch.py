"""`ckptctl watch` against a real daemon: a checkpoint short of a rank, then flushing slowly, seen
in a pseudo-terminal (redrawn in place with ANSI cursor movement), as plain lines through a pipe
and as JSON lines; each run ends (--until_idle) once the checkpoint committed, with a line saying
so."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import subprocess
import time
from collections.abc import Iterator

import numpy as np
import pytest

import ckptd
from conftest import Daemon, ckptctl_binary, start_daemon

ROWS = 512  # 512 x 1024 float32 per rank: 2 MiB


@pytest.fixture()
def slow() -> Iterator[Daemon]:
    # Every flush waits 1.5 s: the checkpoint stays PERSISTING long enough to be watched.
    d = start_daemon(flags=("--debug_flush_delay_ms=1500", "--flush_gate_ms=0"))
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(d.state_dir, ignore_errors=True)


def save_rank(c: ckptd.Client, step: int, rank: int) -> ckptd.SaveHandle:
    part = np.full((ROWS, 1024), rank + 1, np.float32)
    shard = ckptd.Shard(part, (2 * ROWS, 1024), ckptd.Box([rank * ROWS, 0], [ROWS, 1024]))
    return c.save("watched", step, {"w": shard}, rank=rank, world_size=2)


def watch_while_saving(d: Daemon, step: int, argv: list[str], tty: bool) -> str:
    """Rank 0 saves, the watch starts, rank 1 saves a second later; the watch's output."""
    c = ckptd.connect(d.socket)
    try:
        save_rank(c, step, 0)
        cmd = [ckptctl_binary(), "--socket", d.socket, "watch", "watched", *argv]
        if tty:
            master, slave = pty.openpty()
            proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, close_fds=True)
            os.close(slave)
        else:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            master = proc.stdout.fileno()  # type: ignore[union-attr]
        out = b""
        rank1: ckptd.SaveHandle | None = None
        started = time.monotonic()
        deadline = started + 60
        while time.monotonic() < deadline:
            if rank1 is None and time.monotonic() - started > 1.0:
                rank1 = save_rank(c, step, 1)
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the pty's other end closed: the watch exited
                    chunk = b""
                if not chunk and proc.poll() is not None:
                    break
                out += chunk
            elif proc.poll() is not None and rank1 is not None:
                break
        assert proc.wait(timeout=10) == 0, out.decode(errors="replace")
        assert rank1 is not None
        rank1.committed().result()
        return out.decode()
    finally:
        c.close()


def test_watch_in_a_terminal_redraws_in_place(slow: Daemon) -> None:
    out = watch_while_saving(slow, 1, ["--until_idle", "--interval_ms", "100"], tty=True)
    assert "\x1b[K" in out and "\x1b[J" in out, out  # lines cleared and redrawn
    assert re.search(r"\x1b\[\d+F", out), out  # the cursor moved back up to redraw
    assert "watched/1  staging" in out and "ranks 1/2 (missing 1)" in out, out
    assert "watched/1  persisting" in out, out
    assert "watched/1  COMMITTED (local; watched for" in out, out


def test_watch_through_a_pipe_prints_plain_lines(slow: Daemon) -> None:
    out = watch_while_saving(slow, 2, ["--until_idle", "--interval_ms", "100"], tty=False)
    assert "\x1b" not in out, out
    lines = out.splitlines()
    assert any(line.startswith("watched/2  staging") for line in lines), out
    assert any(line.startswith("watched/2  persisting") for line in lines), out
    assert lines[-1].startswith("watched/2  COMMITTED (local; watched for"), out
    # A line is printed when it changes, not at every poll: far fewer lines than polls.
    assert len(lines) < 40, out


def test_watch_json_lines(slow: Daemon) -> None:
    out = watch_while_saving(slow, 3, ["--until_idle", "--json", "--interval_ms", "100"], False)
    records = [json.loads(line) for line in out.splitlines()]
    live = [r for r in records if "ended" not in r]
    assert live and all(r["job"] == "watched" and r["step"] == 3 for r in records)
    assert live[0]["phase"] == "staging" and live[0]["missing_ranks"] == [1]
    assert live[0]["world_size"] == 2 and live[0]["tier"] == "local"
    assert any(r["phase"] == "persisting" for r in live)
    assert records[-1]["ended"] == "COMMITTED"
    assert isinstance(live[-1]["bytes_total"], int) and live[-1]["bytes_total"] >= 2 << 20


def test_watch_with_nothing_in_flight_and_usage_errors(slow: Daemon) -> None:
    run = subprocess.run(
        [ckptctl_binary(), "--socket", slow.socket, "watch", "--until_idle"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert run.returncode == 0 and run.stdout == "nothing in flight\n"
    bad = subprocess.run(
        [ckptctl_binary(), "--socket", slow.socket, "watch", "--interval_ms", "5"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--interval_ms" in bad.stderr
    misplaced = subprocess.run(
        [ckptctl_binary(), "--socket", slow.socket, "ls", "--until_idle"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert misplaced.returncode == 2 and "apply to watch only" in misplaced.stderr
