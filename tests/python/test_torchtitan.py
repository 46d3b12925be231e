"""ckptd.torchtitan: TorchTitan's checkpoint manager on ckptd, driven as TorchTitan's Trainer drives
it (torchtitan_rig.py: the llama3 debug model under FSDP2 on CPU over gloo). A 2-rank run saves
steps 1-4 asynchronously (keep_latest_k=2 leaves 3 and 4), and a save rank 1 dies in never
reaches "latest"; runs resumed at 1 and at 3 ranks load step 4 and their losses at steps 5-6
equal the 2-rank run's. The 1-rank run goes on against a daemon of its own: TorchTitan's CLI
parses the Config; an empty job is a fresh start, Hugging Face exports and initial loads work,
while a job holding only an uncommitted checkpoint, a missing load_step or
initial_load_path, a model-only export, a corrupt checkpoint and a killed daemon each give a
clear error, never a fresh start or a hang; once the daemon is restarted, saving goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torchtitan")
pytest.importorskip("torch")

from conftest import Daemon, free_port, own_daemon

RIG = Path(__file__).with_name("torchtitan_rig.py")
JOB = "tt/run"
FLAGS = ["--ram_tier_keep_per_job=0", "--stage_timeout_ms=10000"]  # loads read the blobs
STAGING = 512 << 20  # the debug model and its AdamW state: 74 MB a checkpoint


def start(daemon: Daemon, mode: str, world: int, tmp: Path, tag: str, **env: str) -> Any:
    cmd = [sys.executable, str(RIG), mode, "--job", JOB, "--out", str(tmp), "--tag", tag]
    cmd += ["--async-mode", env.pop("ASYNC_MODE", "disabled")]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    base.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CKPTD_SOCKET=daemon.socket)
    base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), **env)
    procs = []
    for rank in range(world):
        with open(tmp / f"{tag}.rank{rank}.log", "wb") as log:
            rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=log))
    return procs


def finish(procs: list[Any], tmp: Path, tag: str, expected: list[int]) -> dict[str, Any]:
    """Rank 0's result; fails with the ranks' logs unless their exit codes are `expected`."""
    codes: list[Any] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=180))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            codes.append("timeout")
    if codes != expected:
        logs = "\n".join(
            f"--- rank {r}:\n{(tmp / f'{tag}.rank{r}.log').read_text()[-4000:]}"
            for r in range(len(procs))
        )
        pytest.fail(f"{tag}: exit codes {codes}, expected {expected}\n{logs}")
    return json.loads((tmp / f"{tag}.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def tt_daemon() -> Iterator[Daemon]:
    with own_daemon(flags=FLAGS, staging_bytes=STAGING) as d:
        yield d


@pytest.fixture(scope="module")
def runs(tt_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The 2-rank training run (rank 1 killed in its last save); then, together, the resumes
    at 1 and 3 ranks, the 1-rank one going on with the failure cases against a daemon of their
    own (which they kill)."""
    tmp = tmp_path_factory.mktemp("tt")
    train = start(tt_daemon, "train", 2, tmp, "train", ASYNC_MODE="async_with_pinned_mem")
    out: dict[str, Any] = {"train": finish(train, tmp, "train", [0, -9]), "tmp": tmp}
    with own_daemon(flags=FLAGS, staging_bytes=STAGING) as d:
        env = {"CKPTD_STATE_DIR": d.state_dir, "CKPTD_PID": str(d.proc.pid)}
        env.update(CKPTD_FLAGS=" ".join(FLAGS), CKPTD_STAGING_BYTES=str(STAGING))
        one = start(
            tt_daemon,
            "resume",
            1,
            tmp,
            "resume1",
            ASYNC_MODE="async",
            CKPTD_FAULTS_SOCKET=d.socket,
            **env,
        )
        three = start(tt_daemon, "resume", 3, tmp, "resume3")
        out["resume1"] = finish(one, tmp, "resume1", [0])
        out["resume3"] = finish(three, tmp, "resume3", [0, 0, 0])
        out["faults"] = out["resume1"]["faults"]
        out["faults_socket"] = d.socket
    yield out


def test_import_ckptd_does_not_import_torchtitan() -> None:
    code = "import sys, ckptd; sys.exit('torchtitan' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_async_saves_keep_latest_k_and_a_killed_rank(runs: dict[str, Any]) -> None:
    train = runs["train"]
    assert train["fresh"] is False, train  # an empty job: TorchTitan's fresh start
    assert train["planless"] == "LocalPlanner", train  # FSDP2 on 2 ranks: no rank-0 gather
    assert train["killed_save"] != "returned", train  # rank 0's save fails, it does not hang
    # keep_latest_k=2 (of the 2-rank checkpoints); step 6 never committed: "latest" is 4.
    assert train["committed"] == [[3, 2], [4, 2]], train


@pytest.mark.parametrize("world", [1, 3])
def test_resume_at_another_world_size(runs: dict[str, Any], world: int) -> None:
    saved, resumed = runs["train"], runs[f"resume{world}"]
    assert resumed["loaded"] is True and resumed["step"] == 4, resumed
    assert resumed["lr"] == pytest.approx(saved["lr"]), (resumed, saved)  # the LR schedule
    assert resumed["losses"] == pytest.approx(saved["losses"], rel=1e-5), (resumed, saved)
    log = (runs["tmp"] / f"resume{world}.rank0.log").read_text()
    assert "resuming from step 4, the newest COMMITTED one; newer: 6 (" in log  # the killed save


def test_failures_are_clear_errors(runs: dict[str, Any]) -> None:
    out = runs["faults"]
    assert out["cli"] == {"type": "CkptdCheckpointManager.Config", "interval": 7, "async": "async"}
    assert out["empty"] == "returned False", out  # nothing saved: a fresh start
    assert out["initial_missing"].startswith("ValueError"), out
    assert "tt/run/nothing" in out["initial_missing"], out
    assert out["step_missing"].startswith("FileNotFoundError") and "step 5" in out["step_missing"]
    assert out["uncommitted"].startswith("FileNotFoundError"), out  # never a fresh start
    assert "none COMMITTED" in out["uncommitted"], out
    assert out["export_dtypes"] == ["bfloat16"] and out["export_optimizer_items"] == 0, out
    assert out["resume_export"].startswith("ValueError") and "model-only" in out["resume_export"]
    assert out["initial_loaded"] is True and out["initial_equal"] is True, out
    assert out["hf_files"] == ["model.safetensors.index.json"], out  # last_save_in_hf: local
    assert out["hf_loaded"] is True and out["hf_equal"] is True, out  # initial_load_in_hf
    assert out["dcp_loaded"] is True and out["dcp_equal"] is True, out  # a local DCP folder
    assert out["blobs"] >= 1 and out["corrupt"].startswith("DataLossError"), out
    for case in ("down_save", "down_build"):
        assert out[case].startswith("UnavailableError"), (case, out)
        assert runs["faults_socket"] in out[case], (case, out)
    # Restarted: the same manager saves again, and "latest" is that save.
    assert out["restarted_save"] == "returned None" and out["restarted_latest"] == 3, out
