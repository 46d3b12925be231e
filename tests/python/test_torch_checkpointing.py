"""ckptd.torch_checkpointing: Meta's torch_checkpointing (0.1.1) saving through ckptd, with the real
library (DTensors on CPU over gloo; one torch_checkpointing_rig.py launcher forks the ranks of
each phase). 2 ranks save step-1 (CheckpointManager, sync), step-2 (AsyncCheckpointSaver with
ckptd's Stager and Writer: one copy) and step-3, where a rank dies before its barrier: "latest"
stays on step-2. 3 ranks and 1 rank load both steps into other placements bit-exact (the
library's DefaultResharder over ckptd's ranged, checksummed reads). On a second daemon: a missing
checkpoint, a corrupt one and the daemon killed give clear errors, never a fresh start or a hang.
A rank whose write failed never lets that checkpoint commit."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Daemon, own_daemon

# Found, not imported: this process stays without torch (the rig imports it once for all ranks).
for _module in ("torch", "torch_checkpointing"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed", allow_module_level=True)

RIG = Path(__file__).with_name("torch_checkpointing_rig.py")
ROOT = "tc/run"
FLAGS = ["--ram_tier_keep_per_job=0", "--stage_timeout_ms=2000"]  # loads read the blobs


@pytest.fixture(scope="module")
def tc_daemon() -> Iterator[Daemon]:
    with own_daemon(flags=FLAGS) as d:
        yield d


@pytest.fixture(scope="module")
def runs(tc_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The rig's three phases (save at 2 ranks, load at 3, load at 1 and the failures on a
    second daemon, which they kill); each phase's rank-0 result. Fails with the ranks' logs
    unless every rank exits 0 (rank 1 of save: SIGKILL, in its last save)."""
    tmp = tmp_path_factory.mktemp("tc")
    with own_daemon(flags=FLAGS) as faulty:
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo")
        env.update(OMP_NUM_THREADS="1", CKPTD_SOCKET=tc_daemon.socket)
        env.update(FAULTS_SOCKET=faulty.socket, FAULTS_STATE_DIR=faulty.state_dir)
        env.update(FAULTS_PID=str(faulty.proc.pid))
        cmd = [sys.executable, str(RIG), "--root", ROOT, "--out", str(tmp)]
        launcher = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=170)
    expected = {"save": [0, -9], "load3": [0, 0, 0], "load1": [0]}
    codes_file = tmp / "codes.json"
    codes = json.loads(codes_file.read_text()) if codes_file.exists() else launcher.stderr
    if codes != expected:
        logs = "\n".join(f"--- {log.name}:\n{log.read_text()[-3000:]}" for log in tmp.glob("*.log"))
        pytest.fail(f"exit codes {codes}, expected {expected}\n{logs}")
    out = {tag: json.loads((tmp / f"{tag}.json").read_text()) for tag in expected}
    out["load1"]["faults_socket"] = faulty.socket
    return out


def test_sync_and_async_saves_commit(runs: dict[str, Any]) -> None:
    out = runs["save"]
    assert out["imported_alone"], "import ckptd (and ckptd.torch) imported torch_checkpointing"
    assert out["after_sync"] == f"{ROOT}/step-1", out
    assert out["after_async"] == f"{ROOT}/step-2", out
    # One copy: staging copied the tensors (about 50 KiB a rank) into the arena; the save referenced
    # them, copying only the archives' headers and pickles (a few KiB).
    assert 0 <= out["async_copied_over_tensor_bytes"] < 8 << 10, out


def test_a_rank_killed_mid_save_never_reaches_latest(runs: dict[str, Any]) -> None:
    out = runs["save"]
    assert out["killed"].startswith("AbortedError"), out  # rank 0's save fails, it does not hang
    assert out["after_kill"] == f"{ROOT}/step-2", out
    assert out["ls"] == ["step-1", "step-2"], out


@pytest.mark.parametrize("phase", ["load3", "load1"])
def test_reshard_to_other_world_sizes(runs: dict[str, Any], phase: str) -> None:
    out = runs[phase]
    assert out["latest"] == f"{ROOT}/step-2" and out["exact1"] and out["exact2"], out


def test_checkpoint_managers_async_saver(runs: dict[str, Any]) -> None:
    out = runs["load1"]
    assert out["async_manager_latest"] == f"{ROOT}/step-4" and out["async_manager_exact"], out


def test_a_rank_whose_failed_write_never_commits(runs: dict[str, Any]) -> None:
    """One rank of 2, the other's part saved. A write that failed before the barrier: the rank's
    next checkpoint aborts that one, which would otherwise commit without the rank's other
    files. A write failing in ckptd's Writer: aborted at once, its future raising the error."""
    out = runs["load1"]
    assert out["stale_state"] == "ABORTED" and out["stale_next"] == "tc/failed/step-6", out
    assert not out["stale_exists"] and out["stale_next_exact"], out
    assert "pickle" in out["writer_error"] or "lambda" in out["writer_error"], out
    assert out["writer_state"] == "ABORTED", out


def test_failures_are_clear_errors(runs: dict[str, Any]) -> None:
    out = runs["load1"]
    assert out["missing"].startswith("FileNotFoundError") and "step-99" in out["missing"], out
    assert out["empty_latest"] is None, out
    assert out["blobs"] >= 1 and out["corrupt"].startswith("DataLossError"), out
    for case in ("down_save", "down_load", "down_latest"):
        assert out[case].startswith("UnavailableError"), (case, out)
        assert out["faults_socket"] in out[case], (case, out)
