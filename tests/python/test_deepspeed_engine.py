"""ckptd.deepspeed_engine: DeepSpeed's own engine.save_checkpoint / load_checkpoint through ckptd,
with real DeepSpeed (ZeRO-2, 2 ranks on CPU over gloo; ranks run ds_engine_rig.py). A run saves
twice (async), a fresh engine resumes from "latest" and its next losses equal the uninterrupted
run's exactly; a rank killed before its part is staged leaves `latest` on the previous
checkpoint (the daemon aborts the new one), and the resume after it loads that one. One
rank: a corrupt blob, a checkpoint deleted from ckptd, a save_dir without `latest` and a daemon
killed each give a clear error (or DeepSpeed's "no checkpoint" answer), never a fresh start or a
hang."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("torch")

import deepspeed_rig as rig

import ckptd
from conftest import Daemon, own_daemon, start_daemon

RIG = Path(__file__).with_name("ds_engine_rig.py")
JOB = "ds.engine"
FLAGS = ["--ram_tier_keep_per_job=0", "--stage_timeout_ms=3000"]  # loads read the blobs


def run(
    daemon: Daemon, mode: str, dp: int, tmp: Path, job: str = JOB, **env: str
) -> dict[str, Any]:
    """dp ranks of ds_engine_rig.py MODE; rank 0's result. Fails with their logs unless every
    rank exits 0 (mode kill: rank 1 killed)."""
    cmd = [sys.executable, str(RIG), mode, "--dir", str(tmp / "ckpts"), "--out", str(tmp)]
    cmd += ["--job", job]
    procs = []
    for rank, rank_env in enumerate(rig.rank_envs(dp, daemon.socket)):
        with open(tmp / f"{mode}.rank{rank}.log", "wb") as log:
            procs.append(subprocess.Popen(cmd, env=dict(rank_env, **env), stdout=log, stderr=log))
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=240))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            codes.append("timeout")
    expected = [0, -9] if mode == "kill" else [0] * dp
    if codes != expected:
        logs = "\n".join(
            f"--- rank {r}:\n{(tmp / f'{mode}.rank{r}.log').read_text()[-4000:]}" for r in range(dp)
        )
        pytest.fail(f"{mode}: exit codes {codes}, expected {expected}\n{logs}")
    return json.loads((tmp / f"{mode}.json").read_text())


@pytest.fixture(scope="module")
def engine_daemon() -> Iterator[Daemon]:
    with own_daemon(flags=FLAGS) as d:
        yield d


@pytest.fixture(scope="module")
def trained(engine_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    tmp = tmp_path_factory.mktemp("dse")
    return tmp, run(engine_daemon, "train", 2, tmp)


def test_save_checkpoint_goes_to_ckptd(engine_daemon: Daemon, trained: tuple[Path, Any]) -> None:
    tmp, result = trained
    assert result["waited"] == 4 and result["latest"] == "global_step4", result
    client = ckptd.connect(engine_daemon.socket)
    rows = {r["step"]: r for r in client.list(JOB)}
    assert sorted(rows) == [2, 4] and {r["state"] for r in rows.values()} == {"COMMITTED"}
    assert rows[4]["world_size"] == 2
    items = {r["name"] for r in client.inspect(JOB, 4)}
    client.close()
    # every .pt DeepSpeed wrote is a small pointer; the tensors are items of the checkpoint
    files = sorted(p.name for p in (tmp / "ckpts" / "global_step4").iterdir())
    assert "mp_rank_00_model_states.pt" in files, files
    assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" in files, files
    for name in files:
        pointer = json.loads((tmp / "ckpts" / "global_step4" / name).read_text())
        assert pointer == {"format": "ckptd-deepspeed-pointer", "job": JOB, "step": 4, "file": name}
        assert name in items and f"{name}/0" in items, (name, sorted(items)[:10])


def test_a_rank_killed_mid_save_never_reaches_latest(
    engine_daemon: Daemon, trained: tuple[Path, Any]
) -> None:
    """Rank 1 dies before its part of step 5 is staged: rank 0's save_checkpoint returns (it
    waits in no collective), its wait() raises the daemon's abort naming the missing rank, and
    `latest` still names global_step4 (which the resume below loads)."""
    tmp, _ = trained
    killed = run(engine_daemon, "kill", 2, tmp)
    assert killed["latest_after_save"] == "global_step4", killed
    assert killed["latest"] == "global_step4", killed
    assert killed["wait"].startswith("AbortedError") and "1" in killed["wait"], killed
    client = ckptd.connect(engine_daemon.socket)
    assert client.latest(JOB) == 4
    client.close()


def test_resume_from_latest_matches_the_uninterrupted_run(
    engine_daemon: Daemon, trained: tuple[Path, Any]
) -> None:
    """After the killed save above too: "latest" is still global_step4."""
    tmp, saved = trained
    resumed = run(engine_daemon, "resume", 2, tmp)
    assert "/global_step4/" in resumed["path"] and resumed["global_steps"] == 4, resumed
    assert resumed["epoch"] == 4, resumed  # save_checkpoint's client_state
    assert resumed["losses"] == saved["losses"]


def test_failures_are_clear_errors(tmp_path: Path) -> None:
    d = start_daemon(flags=FLAGS)
    try:
        env = {"CKPTD_STATE_DIR": d.state_dir, "CKPTD_PID": str(d.proc.pid)}
        out = run(d, "faults", 1, tmp_path, job="ds.faults", **env)
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)
    assert out["blobs"], out
    assert out["corrupt"].startswith("DataLossError") and "ds.faults.corrupt" in out["corrupt"]
    assert out["missing"].startswith("NotFoundError") and "ds.faults.missing" in out["missing"]
    assert out["no_latest"] == "returned (None, None)", out  # DeepSpeed's "no checkpoint"
    for case in ("down_save", "down_load"):
        assert out[case].startswith("UnavailableError") and d.socket in out[case], (case, out)
        assert out[f"{case}_seconds"] < 30, (case, out)  # the client's connect timeout: 1 s
