"""ckptd.megatron: Megatron-core's dist_checkpointing save and load strategies through ckptd,
with real megatron-core on CPU over gloo (ranks run megatron_rig.py). Two ranks at TP=2 save
iteration 1 (blocking, the strategy object) and iteration 2 (async_sharded_save through
Megatron's AsyncCallsQueue), reload iteration 1 at PP=2, save iteration 4 at DP=2 through
Megatron's fully parallel wrapper, and save iteration 5 with rank 1 killed (latest stays on 4,
no metadata.json). One rank loads 1, 2 and 4 at TP=1 through the registry; then a missing
directory, one without metadata.json, a checkpoint gone from ckptd, a corrupt one and a killed
daemon each give a clear error, never a fresh start or a hang."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import ckptd
from conftest import Daemon, free_port, own_daemon, start_daemon

# Found, not imported: Megatron and torch take seconds to import and only the ranks need them.
for _module in ("megatron.core", "torch"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed", allow_module_level=True)

RIG = Path(__file__).with_name("megatron_rig.py")
FLAGS = ["--ram_tier_keep_per_job=0", "--stage_timeout_ms=3000"]  # loads read the blobs
TP2, PP2, TP1 = "2,1,1", "1,2,1", "1,1,1"


def run(daemon: Daemon, mode: str, world: int, root: Path, *args: str, **env: str) -> Any:
    """world ranks of megatron_rig.py MODE; rank 0's result. Fails with their logs unless every
    rank exits 0 (mode save: rank 1 is killed in its last save)."""
    out = root / "out"
    cmd = [sys.executable, str(RIG), mode, "--dir", str(root / "ckpts"), "--out", str(out)]
    cmd += ["--tag", mode, *args]
    base = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    base.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1", CKPTD_SOCKET=daemon.socket)
    base.update(WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), **env)
    procs = []
    for rank in range(world):
        with open(root / f"{mode}.rank{rank}.log", "wb") as log:
            rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=log, stderr=log))
    codes: list[Any] = []
    for proc in procs:
        try:
            codes.append(proc.wait(timeout=120))
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            codes.append("timeout")
    expected = [0, -9] if mode == "save" else [0] * world
    if codes != expected:
        logs = "\n".join(
            f"--- rank {r}:\n{(root / f'{mode}.rank{r}.log').read_text()[-4000:]}"
            for r in range(world)
        )
        pytest.fail(f"{mode}: exit codes {codes}, expected {expected}\n{logs}")
    return json.loads((out / f"{mode}.json").read_text())


def ckptd_job(root: Path) -> str:
    """The ckptd job the rig's checkpoint directories map to (their parent's path, encoded), as
    iteration 1's link file names it."""
    return str(
        json.loads((root / "ckpts" / "iter_0000001" / "ckptd.json").read_text())["ckptd_job"]
    )


@pytest.fixture(scope="module")
def mg_daemon() -> Iterator[Daemon]:
    with own_daemon(flags=FLAGS) as d:
        yield d


@pytest.fixture(scope="module")
def saved(mg_daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """2 ranks (save mode); rank 1 is killed in its last save (iteration 5)."""
    root = tmp_path_factory.mktemp("mg")
    out = run(mg_daemon, "save", 2, root, "--layout", TP2, "--reload", PP2)
    client = ckptd.connect(mg_daemon.socket)  # before the load run saves iteration 5 again
    out["latest"] = client.latest(ckptd_job(root))
    out["rows"] = [(r["step"], r["state"], r["world_size"]) for r in client.list(ckptd_job(root))]
    client.close()
    return root, out


@pytest.fixture(scope="module")
def loaded(mg_daemon: Daemon, saved: tuple[Path, Any]) -> Iterator[Any]:
    """1 rank at TP=1 (load mode), then the failures on a daemon of its own, killed at the end."""
    root, _ = saved
    d = start_daemon(flags=FLAGS)
    env = {"CKPTD_FAULTS_SOCKET": d.socket, "CKPTD_STATE_DIR": d.state_dir}
    env["CKPTD_PID"] = str(d.proc.pid)
    try:
        yield run(mg_daemon, "load", 1, root, "--layout", TP1, "--saved", TP2, **env), d.socket
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)


def test_tp2_save_reloads_at_pp2_bit_exact(mg_daemon: Daemon, saved: tuple[Path, Any]) -> None:
    """Megatron's directory keeps its own files (common.pt, metadata.json) plus the link to
    ckptd's checkpoint; the sharded tensors and objects are in ckptd, committed by 2 ranks."""
    root, out = saved
    assert out["files"] == ["ckptd.json", "common.pt", "metadata.json"], out
    meta = json.loads((root / "ckpts" / "iter_0000001" / "metadata.json").read_text())
    assert meta["sharded_backend"] == "ckptd", meta
    link = json.loads((root / "ckpts" / "iter_0000001" / "ckptd.json").read_text())
    assert (link["job"], link["step"]) == (str((root / "ckpts").resolve()), 1), link
    assert out["reload_bad"] == [[], []], out  # every tensor and object, on both ranks


def test_async_save_through_megatrons_queue(saved: tuple[Path, Any]) -> None:
    """metadata.json appears only at finalize; the tensors were zeroed right after save()
    returned, and iteration 2 still loads with its values (test_load_at_tp1_...)."""
    _, out = saved
    assert out["async"] == {
        "metadata_before_finalize": False,
        "finalized": [0],
        "metadata_after_finalize": True,
    }, out


def test_a_rank_killed_mid_save_is_never_latest(saved: tuple[Path, Any]) -> None:
    _, out = saved
    assert out["killed_save"] != "returned", out  # rank 0's save fails, it does not hang
    assert "metadata.json" not in out["killed_files"], out  # Megatron refuses the directory
    assert "ckptd.json" not in out["killed_files"], out
    assert out["latest"] == 4, out  # iteration 5 never committed
    committed = [(step, world) for step, state, world in out["rows"] if state == "COMMITTED"]
    assert committed == [(1, 2), (2, 2), (3, 2), (4, 2)], out["rows"]


def test_fully_parallel_wrapper_splits_the_replicas(saved: tuple[Path, Any]) -> None:
    """Iteration 4, at DP=2 (both ranks hold every tensor), saved through Megatron's
    FullyParallelSaveStrategyWrapper around ckptd's strategy: each rank sends a part, together
    all (loaded back bit-exact by test_load_at_tp1_through_the_registry)."""
    _, out = saved
    rank0, rank1 = out["dp2_main"]
    assert rank0 and rank1 and not set(rank0) & set(rank1), out["dp2_main"]
    # the embedding, 2 layers x (fc1, fc2), the layer norm and the object: each sent once
    assert len(rank0) + len(rank1) == 7, out["dp2_main"]


def test_load_at_tp1_through_the_registry(loaded: Any) -> None:
    out, _ = loaded
    assert out["bad"] == [] and out["bad2"] == [], out  # iteration 2: the async save's values
    assert out["bad4"] == [], out  # the fully parallel save
    assert out["bad5"] == [], out  # the killed iteration, saved again by the resumed run


def test_gpt_model_saved_at_tp2_loads_at_tp1(loaded: Any) -> None:
    """A real Megatron-core GPTModel (local layer spec, CPU) saved at TP=2 by the 2-rank run and
    loaded by a TP=1 model built from another seed: every tensor of its state dict equals a TP=1
    model of the saving seed (Megatron's CPU initialization draws whole weights, so a seed means
    the same global weights at any TP size)."""
    out, _ = loaded
    assert out["gpt_tensors"] > 20 and out["gpt_bad"] == [], out
    assert out["gpt_differed"] >= 10, out  # its random weights (embeddings, linears) differed
    assert out["plain_bad"] == [], out  # load_plain_tensors: the whole global tensors
    assert out["megatron_before"] == [], out  # `import ckptd, ckptd.torch` imported no Megatron
    assert "rng_state/shard_0.1_1.2" in out["metadata"], out  # load_sharded_metadata


def test_failures_are_clear_errors(loaded: Any) -> None:
    out, socket = loaded
    assert out["overwrite_bad"] == [], out  # a directory saved twice holds the second save
    assert out["no_dir"].startswith("CheckpointingException") and "does not exist" in out["no_dir"]
    assert "is not a distributed checkpoint" in out["no_metadata"], out
    assert out["gone"].startswith("NotFoundError") and "step 6" in out["gone"], out
    assert out["blobs"] >= 1 and out["corrupt"].startswith("DataLossError"), out
    for case in ("down_save", "down_load"):
        assert out[case].startswith("UnavailableError") and socket in out[case], (case, out)
    assert "metadata.json" not in out["down_files"], out  # never a loadable checkpoint
