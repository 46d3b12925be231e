"""ckptd.accelerate: Hugging Face Accelerate's save_state / load_state through ckptd, with real
Accelerate (FSDP2 on CPU over gloo; ranks run accelerate_rig.py). A 2-rank run saves at step 2;
a rank killed in the next save leaves "latest" on step 2; runs resumed at 1 and at 3 ranks load
it (model, optimizer, scheduler, custom object, step) and their next losses equal the 2-rank
run's. One rank: a job without checkpoints, a corrupt checkpoint and a killed daemon each give a
clear error (or None with missing_ok), never a fresh start or a hang."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("torch")

import ckptd
from ckptd.torch import encode_job
from conftest import Daemon, free_port, own_daemon, start_daemon

RIG = Path(__file__).with_name("accelerate_rig.py")
JOB = "acc/run"
FLAGS = ["--ram_tier_keep_per_job=0", "--stage_timeout_ms=3000"]  # loads read the blobs


def run(daemon: Daemon, mode: str, world: int, tmp: Path, tag: str, **env: str) -> dict[str, Any]:
    """world ranks of accelerate_rig.py MODE; rank 0's result. Fails with their logs unless every
    rank exits 0 (mode kill: rank 1 killed)."""
    cmd = [sys.executable, str(RIG), mode, "--job", JOB, "--out", str(tmp), "--tag", tag, "--fsdp"]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    base.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CKPTD_SOCKET=daemon.socket)
    base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), **env)
    procs = []
    for rank in range(world):
        with open(tmp / f"{tag}.rank{rank}.log", "wb") as log:
            rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=log))
    codes: list[Any] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=180))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            codes.append("timeout")
    expected = [0, -9] if mode == "kill" else [0] * world
    if codes != expected:
        logs = "\n".join(
            f"--- rank {r}:\n{(tmp / f'{tag}.rank{r}.log').read_text()[-4000:]}"
            for r in range(world)
        )
        pytest.fail(f"{mode}: exit codes {codes}, expected {expected}\n{logs}")
    return json.loads((tmp / f"{tag}.json").read_text())


@pytest.fixture(scope="module")
def acc_daemon() -> Iterator[Daemon]:
    with own_daemon(flags=FLAGS) as d:
        yield d


@pytest.fixture(scope="module")
def trained(acc_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("acc")
    return tmp, run(acc_daemon, "train", 2, tmp, "train")


def test_total_limit_keeps_the_newest(acc_daemon: Daemon, trained: tuple[Path, Any]) -> None:
    """ProjectConfiguration(total_limit=1): the async save of step 1 is deleted once step 2 is
    committed."""
    client = ckptd.connect(acc_daemon.socket)
    rows = client.list(encode_job(JOB))
    client.close()
    assert [(r["step"], r["state"], r["world_size"]) for r in rows] == [(2, "COMMITTED", 2)]


def test_a_rank_killed_mid_save_never_reaches_latest(
    acc_daemon: Daemon, trained: tuple[Path, Any]
) -> None:
    tmp, _ = trained
    killed = run(acc_daemon, "kill", 2, tmp, "kill")
    assert killed["save"] != "returned", killed  # rank 0's save fails, it does not hang
    client = ckptd.connect(acc_daemon.socket)
    job = encode_job(JOB)
    assert client.latest(job) == 2
    client.close()


@pytest.mark.parametrize("world", [1, 3])
def test_resume_at_another_world_size(
    acc_daemon: Daemon, trained: tuple[Path, Any], world: int
) -> None:
    tmp, saved = trained
    resumed = run(acc_daemon, "resume", world, tmp, f"resume{world}")
    assert resumed["loaded"] == 2 and resumed["seen"] == 24, resumed  # the custom object
    assert resumed["lr"] == pytest.approx(1e-2 / 5), resumed  # the scheduler (stepped 2x2 times)
    assert resumed["losses"] == pytest.approx(saved["losses"], rel=1e-5), (resumed, saved)


def test_failures_are_clear_errors(tmp_path: Path) -> None:
    d = start_daemon(flags=FLAGS)
    try:
        env = {"CKPTD_STATE_DIR": d.state_dir, "CKPTD_PID": str(d.proc.pid)}
        out = run(d, "faults", 1, tmp_path, "faults", **env)
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)
    assert out["none"].startswith("NotFoundError") and "acc/run/empty" in out["none"], out
    assert out["none_ok"] == "returned None", out
    assert out["blobs"] >= 1 and out["corrupt"].startswith("DataLossError"), out
    for case in ("down_save", "down_load"):
        assert out[case].startswith("UnavailableError") and d.socket in out[case], (case, out)
