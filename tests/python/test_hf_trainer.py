"""ckptd.hf_trainer.CkptdTrainer: transformers' Trainer (DDP on CPU over gloo; ranks run
hf_trainer_rig.py) saving its checkpoints in ckptd. A 2-rank run saves at steps 2 and 4 with
save_total_limit=1 (the folder checkpoint-2 and ckptd step 2 are rotated out); a 1-rank run
with resume_from_checkpoint=True starts its first step at global step 4 from exactly the weights
saved there and runs on to step 6; a folder whose ckptd checkpoint is gone fails with
NotFoundError, never a fresh start."""

from __future__ import annotations

import json
import os
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
from conftest import Daemon, free_port, own_daemon

RIG = Path(__file__).with_name("hf_trainer_rig.py")
JOB = "hf/run"


def run(daemon: Daemon, mode: str, world: int, tmp: Path, tag: str) -> tuple[list[int], str]:
    """world ranks of hf_trainer_rig.py MODE: their exit codes and rank 0's log."""
    cmd = [sys.executable, str(RIG), mode, "--job", JOB, "--dir", str(tmp / "out")]
    cmd += ["--out", str(tmp), "--tag", tag]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    base.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CKPTD_SOCKET=daemon.socket)
    base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world))
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
    with own_daemon(flags=["--ram_tier_keep_per_job=0"]) as d:
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


def test_a_checkpoint_gone_from_ckptd_is_an_error(hf_daemon: Daemon, trained: Path) -> None:
    client = ckptd.connect(hf_daemon.socket)
    for row in client.list(encode_job(JOB)):
        client.delete(encode_job(JOB), int(row["step"]))
    client.close()
    codes, log = run(hf_daemon, "resume", 1, trained, "gone")
    assert codes != [0], log[-4000:]
    assert "NotFoundError" in log and "does not exist" in log, log[-4000:]
