"""ckptd.torch_checkpointing: Meta's torch_checkpointing (0.1.1) saving through ckptd, with the real
library (DTensors on CPU over gloo; ranks run torch_checkpointing_rig.py). 2 ranks save step-1
(CheckpointManager, sync), step-2 (AsyncCheckpointSaver with ckptd's Stager and Writer: one copy)
and step-3, where a rank dies before its barrier: "latest" stays on step-2. 3 ranks and 1 rank
load both steps into other placements bit-exact (the library's DefaultResharder over ckptd's
ranged, checksummed reads). One rank then checks a missing checkpoint, a corrupt one and a killed
daemon: clear errors, never a fresh start or a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("torch_checkpointing")

from conftest import Daemon, free_port, own_daemon

RIG = Path(__file__).with_name("torch_checkpointing_rig.py")
ROOT = "tc/run"
FLAGS = ["--ram_tier_keep_per_job=0", "--stage_timeout_ms=2000"]  # loads read the blobs


def run(daemon: Daemon, mode: str, world: int, tmp: Path, tag: str, *extra: str) -> Any:
    """world ranks of the rig (forked by one launcher); rank 0's result. Fails with their logs
    unless every rank exits 0 (mode save: rank 1 dies of SIGKILL in its last save)."""
    cmd = [sys.executable, str(RIG), mode, "--world", str(world), "--root", ROOT]
    cmd += ["--out", str(tmp), "--tag", tag, *extra]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CKPTD_SOCKET=daemon.socket)
    env.update(CKPTD_STATE_DIR=daemon.state_dir, CKPTD_PID=str(daemon.proc.pid))
    launcher = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    codes_file = tmp / f"{tag}.codes.json"
    codes = json.loads(codes_file.read_text()) if codes_file.exists() else launcher.stderr
    expected = [0, -9] if mode == "save" else [0] * world
    if codes != expected:
        logs = "\n".join(
            f"--- rank {r}:\n{(tmp / f'{tag}.rank{r}.log').read_text()[-4000:]}"
            for r in range(world)
            if (tmp / f"{tag}.rank{r}.log").exists()
        )
        pytest.fail(f"{mode}: exit codes {codes}, expected {expected}\n{logs}")
    return json.loads((tmp / f"{tag}.json").read_text())


@pytest.fixture(scope="module")
def tc_daemon() -> Iterator[Daemon]:
    with own_daemon(flags=FLAGS) as d:
        yield d


@pytest.fixture(scope="module")
def saved(tc_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("tc")
    return tmp, run(tc_daemon, "save", 2, tmp, "save")


def test_sync_and_async_saves_commit(saved: tuple[Path, Any]) -> None:
    _, out = saved
    assert out["imported_alone"], "import ckptd (and ckptd.torch) imported torch_checkpointing"
    assert out["after_sync"] == f"{ROOT}/step-1", out
    assert out["after_async"] == f"{ROOT}/step-2", out
    # One copy: staging copied the tensors into the arena; the save referenced them, copying only
    # the archives' headers and pickles (a few KiB).
    assert 0 <= out["async_copied_over_tensor_bytes"] < 64 << 10, out


def test_a_rank_killed_mid_save_never_reaches_latest(saved: tuple[Path, Any]) -> None:
    _, out = saved
    assert out["killed"].startswith("AbortedError"), out  # rank 0's save fails, it does not hang
    assert out["after_kill"] == f"{ROOT}/step-2", out
    assert out["ls"] == ["step-1", "step-2"], out


def test_reshard_to_three_ranks(tc_daemon: Daemon, saved: tuple[Path, Any]) -> None:
    tmp, _ = saved
    out = run(tc_daemon, "load", 3, tmp, "load3")
    assert out["latest"] == f"{ROOT}/step-2" and out["exact1"] and out["exact2"], out


def test_a_rank_whose_write_failed_never_commits_that_checkpoint(tc_daemon: Daemon) -> None:
    """In this process, one rank of 2: the other rank saved its part of step-5; this one wrote a
    file of it and failed before its barrier. Its next checkpoint aborts step-5 (which could
    otherwise commit without that rank's other files) and commits alone."""
    import numpy as np
    import torch
    from torch_checkpointing import CheckpointManager

    import ckptd
    import ckptd.torch_checkpointing as ckt
    from ckptd.torch import encode_job

    root, job = "tc/failed", encode_job("tc/failed")
    client = ckptd.connect(tc_daemon.socket)
    client.save(job, 5, {"other_1.pt": np.zeros(8, np.uint8)}, rank=1, world_size=2)
    storage = ckt.StorageConfig(root=root, socket=tc_daemon.socket).create_storage()
    storage.write(Path(f"{root}/tmp_step-5/model_0.pt"), b"the first file")  # then it failed
    manager = CheckpointManager(ckt.manager_config(root, socket=tc_daemon.socket, async_save=False))
    manager.save(f"{root}/step-6", {"model": {"w": torch.arange(4.0)}})
    assert client.status(job, 5)["state"] == "ABORTED"
    assert ckt.latest_checkpoint(root, socket=tc_daemon.socket) == f"{root}/step-6"
    assert not storage.exists(Path(f"{root}/step-5"))
    into = {"w": torch.zeros(4)}
    manager.load(f"{root}/step-6", into={"model": into})
    assert torch.equal(into["w"], torch.arange(4.0))
    client.close()


def test_one_rank_then_failures(tc_daemon: Daemon, saved: tuple[Path, Any]) -> None:
    """Last: it kills the daemon."""
    tmp, _ = saved
    out = run(tc_daemon, "load", 1, tmp, "load1", "--faults")
    assert out["latest"] == f"{ROOT}/step-2" and out["exact1"] and out["exact2"], out
    assert out["missing"].startswith("FileNotFoundError") and "step-99" in out["missing"], out
    assert out["empty_latest"] is None, out
    assert out["blobs"] >= 1 and out["corrupt"].startswith("DataLossError"), out
    for case in ("down_save", "down_load", "down_latest"):
        assert out[case].startswith("UnavailableError"), (case, out)
        assert tc_daemon.socket in out[case], (case, out)
