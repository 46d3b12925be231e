"""ckptd.hf_trainer.CkptdTrainer: transformers' Trainer (DDP on CPU over gloo; ranks run
hf_trainer_rig.py) saving its checkpoints in ckptd. A 2-rank run saves at steps 2 and 4 with
save_total_limit=1 (the folder checkpoint-2 and ckptd step 2 are rotated out); a 1-rank run
with resume_from_checkpoint=True starts its first step at global step 4 from exactly the weights
saved there and runs on to step 6; its saves are planless (LocalPlanner, no_dist). A rank
killed in step 4's save leaves checkpoint-2 Trainer's last checkpoint. A folder whose ckptd
checkpoint is gone fails with NotFoundError, no folder at all with Trainer's own ValueError, a
corrupt one with DataLossError, the daemon down with UnavailableError naming the socket (a save
and a resume): never a fresh start or a hang."""

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

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import ckptd
from ckptd.torch import encode_job
from conftest import Daemon, free_port, own_daemon, start_daemon

RIG = Path(__file__).with_name("hf_trainer_rig.py")
JOB = "hf/run"
FLAGS = ["--ram_tier_keep_per_job=0", "--stage_timeout_ms=3000"]  # loads read the blobs


def run(
    daemon: Daemon, mode: str, world: int, tmp: Path, tag: str, job: str = JOB, **env: str
) -> tuple[list[int], str]:
    """world ranks of hf_trainer_rig.py MODE: their exit codes and rank 0's log."""
    cmd = [sys.executable, str(RIG), mode, "--job", job, "--dir", str(tmp / "out")]
    cmd += ["--out", str(tmp), "--tag", tag]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    base.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CKPTD_SOCKET=daemon.socket)
    base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), **env)
    procs = []
    for rank in range(world):
        with open(tmp / f"{tag}.rank{rank}.log", "wb") as log:
            rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=log))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=180))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            codes.append(-1)
    return codes, (tmp / f"{tag}.rank0.log").read_text()


def result(tmp: Path, tag: str) -> dict[str, Any]:
    return json.loads((tmp / f"{tag}.json").read_text())


@pytest.fixture(scope="module")
def hf_daemon() -> Iterator[Daemon]:
    with own_daemon(flags=FLAGS) as d:
        yield d


@pytest.fixture(scope="module")
def trained(hf_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("hf")
    codes, log = run(hf_daemon, "train", 2, tmp, "train")
    assert codes == [0, 0], log[-4000:]
    return tmp


def test_checkpoints_live_in_ckptd(hf_daemon: Daemon, trained: Path) -> None:
    assert sorted(os.listdir(trained / "out")) == ["checkpoint-4"]  # save_total_limit=1
    folder = trained / "out" / "checkpoint-4"
    assert sorted(os.listdir(folder)) == ["ckptd.json", "trainer_state.json"]
    assert json.loads((folder / "ckptd.json").read_text()) == {"job": JOB, "step": 4}
    client = ckptd.connect(hf_daemon.socket)
    rows = client.list(encode_job(JOB))
    assert [(r["step"], r["state"], r["world_size"]) for r in rows] == [(4, "COMMITTED", 2)]
    client.close()


def test_resume_from_checkpoint_at_another_world_size(hf_daemon: Daemon, trained: Path) -> None:
    codes, log = run(hf_daemon, "resume", 1, trained, "resume")
    assert codes == [0], log[-4000:]
    saved, resumed = result(trained, "train"), result(trained, "resume")
    assert resumed["first_step"] == 4 and resumed["global_step"] == 6, resumed
    assert resumed["first_step_weights"] == saved["saved_weights"]


def test_saves_are_planless(trained: Path) -> None:
    """No collective and no rank-0 gather of plans: DCP's save with ckptd's LocalPlanner."""
    saved = result(trained, "train")
    assert (saved["planner"], saved["no_dist"]) == ("LocalPlanner", True), saved


def test_a_rank_killed_mid_save_is_never_the_last_checkpoint(
    hf_daemon: Daemon, tmp_path: Path
) -> None:
    """Rank 1 dies in step 4's save before its part is staged: rank 0's save fails (no hang),
    the folder checkpoint-4 never appears, and Trainer's "last" is still checkpoint-2."""
    from transformers.trainer_utils import get_last_checkpoint

    job = "hf/kill"
    codes, log = run(hf_daemon, "kill", 2, tmp_path, "kill", job=job)
    assert codes == [0, -9], log[-4000:]
    out = result(tmp_path, "kill")
    assert not out["train"].startswith("returned"), out
    assert out["train_seconds"] < 60, out
    assert sorted(os.listdir(tmp_path / "out")) == ["checkpoint-2"]
    assert get_last_checkpoint(str(tmp_path / "out")) == str(tmp_path / "out" / "checkpoint-2")
    client = ckptd.connect(hf_daemon.socket)
    assert client.latest(encode_job(job)) == 2
    client.close()


def test_corrupt_and_daemon_down_are_clear_errors(tmp_path: Path) -> None:
    d = start_daemon(flags=FLAGS)
    try:
        env = {"CKPTD_STATE_DIR": d.state_dir, "CKPTD_PID": str(d.proc.pid)}
        codes, log = run(d, "faults", 1, tmp_path, "faults", job="hf/faults", **env)
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)
    assert codes == [0], log[-4000:]
    out = result(tmp_path, "faults")
    assert out["none"].startswith("ValueError") and "No valid checkpoint" in out["none"], out
    assert out["blobs"] >= 1 and out["corrupt"].startswith("DataLossError"), out
    for case in ("down_save", "down_load"):
        assert out[case].startswith("UnavailableError") and d.socket in out[case], (case, out)
        assert out[f"{case}_seconds"] < 30, (case, out)
    assert out["down_folders"] == [], out  # no checkpoint-2 folder for the failed save


def test_a_checkpoint_gone_from_ckptd_is_an_error(hf_daemon: Daemon, trained: Path) -> None:
    client = ckptd.connect(hf_daemon.socket)
    for row in client.list(encode_job(JOB)):
        client.delete(encode_job(JOB), int(row["step"]))
    client.close()
    codes, log = run(hf_daemon, "resume", 1, trained, "gone")
    assert codes != [0], log[-4000:]
    assert "NotFoundError" in log and "does not exist" in log, log[-4000:]
