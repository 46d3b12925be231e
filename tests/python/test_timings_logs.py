"""Per-phase timings of a checkpoint and its ranks (recorded in the index, shown by `ckptctl
status` and `--json`, kept across a daemon restart), and the JSON log: every line one valid JSON
object, RPC lines with their request id, one line per checkpoint state change with its job, step
and timings."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptd
from conftest import Daemon, ckptctl, start_daemon

WORLD = 2
FLAGS = ("--log_format=json", "--log_level=debug", "--flush_gate_ms=0")


@pytest.fixture()
def logged() -> Iterator[Daemon]:
    d = start_daemon(flags=FLAGS)
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(d.state_dir, ignore_errors=True)


def save_two_ranks(d: Daemon, job: str, step: int) -> None:
    clients = [ckptd.connect(d.socket) for _ in range(WORLD)]
    try:
        full = np.arange(WORLD * 256 * 1024, dtype=np.float32).reshape(WORLD * 256, 1024)
        handles = []
        for r, c in enumerate(clients):
            part = full[r * 256 : (r + 1) * 256]
            shard = ckptd.Shard(part, full.shape, ckptd.Box([r * 256, 0], [256, 1024]))
            handles.append(c.save(job, step, {"w": shard}, rank=r, world_size=WORLD))
        for h in handles:
            h.committed().result()
    finally:
        for c in clients:
            c.close()


def status_json(d: Daemon, job: str, step: int) -> dict[str, Any]:
    out = ckptctl(d, "--json", "status", job, str(step))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def check_timings(t: dict[str, Any]) -> None:
    ranks = t["ranks"]
    assert [r.get("rank", 0) for r in ranks] == list(range(WORLD))
    for r in ranks:
        # Every phase of a rank was measured (integers, as numbers), the client's included.
        for phase in ("reserve_us", "copy_us", "staged_us", "flush_us", "fsync_us"):
            assert isinstance(r[phase], int) and r[phase] > 0, (phase, r)
        assert "persisted_at_ms" in r, r
        assert r["persisted_at_ms"] >= r.get("staged_at_ms", 0)
    assert t["manifest_us"] > 0
    assert t["committed_ms"] >= t["all_persisted_ms"] >= t.get("all_staged_ms", 0)
    assert t["all_persisted_ms"] == max(r["persisted_at_ms"] for r in ranks)


def test_timings_recorded_shown_and_kept_across_a_restart(logged: Daemon) -> None:
    save_two_ranks(logged, "timed", 1)
    status = status_json(logged, "timed", 1)
    assert status["summary"]["state"] == "COMMITTED"
    check_timings(status["timings"])

    text = ckptctl(logged, "status", "timed", "1")
    assert text.returncode == 0, text.stderr
    assert "timings: all staged +" in text.stdout and "committed +" in text.stdout
    header = next(line for line in text.stdout.splitlines() if "RESERVE" in line)
    assert header.split() == [
        "RANK",
        "RESERVE",
        "COPY",
        "STAGED",
        "QUEUED",
        "FLUSH",
        "FSYNC",
        "STAGED_AT",
        "PERSISTED_AT",
    ]


def test_timings_survive_a_restart_of_the_daemon() -> None:
    d = start_daemon(flags=FLAGS)
    try:
        save_two_ranks(d, "kept", 4)
        before = status_json(d, "kept", 4)["timings"]
        d.stop()
        # The same state dir, a new daemon process: the timings come from the index.
        d2 = start_daemon(flags=FLAGS, state_dir=d.state_dir)
        try:
            assert status_json(d2, "kept", 4)["timings"] == before
        finally:
            d2.stop()
    finally:
        d.stop()
        shutil.rmtree(d.state_dir, ignore_errors=True)


def log_lines(d: Daemon) -> list[dict[str, Any]]:
    lines = Path(d.log).read_text(errors="strict").splitlines()
    parsed = []
    for line in lines:
        if not line.startswith("{"):
            continue  # not the daemon's logger (none expected; tolerated)
        parsed.append(json.loads(line))  # every line of the daemon's log is one JSON object
    return parsed


def test_json_log_lines_state_changes_and_request_ids(logged: Daemon) -> None:
    save_two_ranks(logged, "logged", 2)
    c = ckptd.connect(logged.socket)
    try:
        with pytest.raises(ckptd.NotFoundError):
            c.load("logged", 99)
    finally:
        c.close()
    lines = log_lines(logged)
    assert lines, Path(logged.log).read_text()
    for line in lines:
        assert {"time", "level", "thread", "msg"} <= line.keys(), line

    def events(name: str) -> list[dict[str, Any]]:
        return [x for x in lines if x.get("event") == name and x.get("job") == "logged"]

    opened = events("opened")
    assert len(opened) == 1 and opened[0]["step"] == 2 and opened[0]["world_size"] == WORLD
    # Logged inside the Save that opened it: the call's fields too.
    assert opened[0]["method"] == "Save" and opened[0]["request_id"].startswith("d")
    assert isinstance(opened[0]["uid"], int)
    staged = events("rank_staged")
    assert sorted(x["rank"] for x in staged) == list(range(WORLD))
    assert all(x["staged_us"] > 0 and x["bytes"] == 256 * 1024 * 4 for x in staged)
    assert len(events("all_staged")) == 1
    persisted = events("rank_persisted")
    assert sorted(x["rank"] for x in persisted) == list(range(WORLD))
    assert all(x["flush_us"] > 0 and x["fsync_us"] > 0 for x in persisted)
    committed = events("committed")
    assert len(committed) == 1
    line = committed[0]
    assert line["level"] == "info" and line["step"] == 2 and line["ranks"] == WORLD
    assert line["committed_ms"] >= line["all_persisted_ms"]
    assert line["manifest_us"] > 0 and line["max_fsync_us"] > 0 and line["max_copy_us"] > 0
    status = status_json(logged, "logged", 2)["timings"]
    assert line["committed_ms"] == status["committed_ms"]
    # Request ids are unique per call.
    ids = [x["request_id"] for x in lines if "request_id" in x and x.get("event") == "rank_staged"]
    assert len(set(ids)) == len(ids) == WORLD


def test_aborted_checkpoint_logs_its_reason(logged: Daemon) -> None:
    c = ckptd.connect(logged.socket)
    try:
        c.save(
            "gone",
            1,
            {"w": ckptd.Shard(np.ones(4, np.float32), (8,), ckptd.Box([0], [4]))},
            rank=0,
            world_size=2,
        )
        out = ckptctl(logged, "abort", "gone", "1", 'operator said "stop"')
        assert out.returncode == 0, out.stderr
    finally:
        c.close()
    aborted = [x for x in log_lines(logged) if x.get("event") == "aborted"]
    assert len(aborted) == 1 and aborted[0]["job"] == "gone" and aborted[0]["step"] == 1
    assert 'operator said "stop"' in aborted[0]["msg"]
