"""ckptd.deepspeed against real DeepSpeed ZeRO on CPU (gloo): a run trained at DP=4 under ZeRO-2
saves through the adapter; it resumes at the original layout and at DP=2 ZeRO-2, DP=2 ZeRO-3 and
DP=1 ZeRO-1. Every resume's fp32 masters and Adam moments (gathered by DeepSpeed's own
safe_get_full_*) equal the saved run's bit for bit, and the next steps' losses equal those of the
resume at the original layout (exactly there; up to the order of the sums elsewhere). Each rank
is a process running deepspeed_rig.py (see there for the model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
torch = pytest.importorskip("torch")

import deepspeed_rig as rig  # noqa: E402

import ckptd  # noqa: E402
from conftest import Daemon  # noqa: E402

RIG = Path(__file__).with_name("deepspeed_rig.py")
JOB = "ds.adapter"


def run_ranks(
    daemon: Daemon, mode: str, stage: int, dp: int, out: Path, tag: str, dims: str = rig.SMALL
) -> None:
    """dp processes of deepspeed_rig.py, one per rank; fails with their output if one fails."""
    cmd = [sys.executable, str(RIG), mode, "--stage", str(stage), "--dp", str(dp)]
    cmd += ["--job", JOB, "--out", str(out), "--tag", tag, "--dims", dims, "--padded"]
    procs = []
    logs = []
    for rank, rank_env in enumerate(rig.rank_envs(dp, daemon.socket)):
        log = out / f"{tag}.rank{rank}.log"
        logs.append(log)
        with open(log, "wb") as f:
            procs.append(subprocess.Popen(cmd, env=rank_env, stdout=f, stderr=subprocess.STDOUT))
    failed = []
    for rank, proc in enumerate(procs):
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            code = "timeout"
        if code != 0:
            failed.append((rank, code))
    if failed:
        text = "\n".join(f"--- rank {r}:\n{logs[r].read_text()[-4000:]}" for r, _ in failed)
        pytest.fail(f"{mode} stage {stage} dp {dp}: ranks {failed} failed\n{text}")


@pytest.fixture(scope="module")
def trained(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> tuple[Daemon, Path]:
    out = tmp_path_factory.mktemp("ds")
    out.mkdir(exist_ok=True)
    run_ranks(daemon, "train", 2, 4, out, "saved")
    return daemon, out


def load_full(out: Path, tag: str) -> dict[str, torch.Tensor]:
    return torch.load(out / f"full_{tag}.pt", weights_only=True)


def logical(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state without the padding rows of the padded parameters."""
    return {k: v[: rig.VOCAB] if k.split("/")[-1] in rig.PADDED else v for k, v in state.items()}


def losses(out: Path, tag: str) -> list[float]:
    return json.loads((out / f"losses_{tag}.json").read_text())


def test_checkpoint_holds_partitions_not_a_gather(trained: tuple[Daemon, Path]) -> None:
    daemon, out = trained
    client = ckptd.connect(daemon.socket)
    (info,) = client.list(JOB)
    assert info["state"] == "COMMITTED" and info["world_size"] == 4, info
    rows = {r["name"]: r for r in client.inspect(JOB, 3)}
    saved = logical(load_full(out, "saved"))
    for name, full in saved.items():
        assert list(rows[name]["shape"]) == list(full.shape), name
    assert rows["fp32/embed.weight"]["shape"] == [rig.VOCAB, 32]  # no padding rows stored
    # a ZeRO-2 flat partition splits the first weights: qkv spans two ranks' partitions
    assert rows["fp32/layers.0.qkv.weight"]["shard_count"] >= 2, rows["fp32/layers.0.qkv.weight"]
    meta = json.loads(client.load_object(JOB, 3, "deepspeed", raw=True))
    assert meta["zero_stage"] == 2 and meta["dp_world_size"] == 4
    assert meta["global_steps"] == 3 and meta["optim_keys"] == ["exp_avg", "exp_avg_sq"]
    # the checkpoint is universal: whole tensors load without DeepSpeed's help
    whole = client.load(JOB, 3, items=[n for n in saved if "/" in n], as_torch=True)
    for name, tensor in whole.tensors.items():
        assert torch.equal(tensor, saved[name]), name
    client.close()


@pytest.mark.parametrize(
    ("stage", "dp", "dims"),
    [
        (2, 4, rig.SMALL),
        (2, 2, rig.SMALL),
        (3, 2, rig.SMALL),
        (1, 1, rig.SMALL),
        (3, 4, "32,48,96,1"),
    ],
    ids=["same-layout", "dp2-zero2", "dp2-zero3", "dp1-zero1", "dp4-zero3-vocab96"],
)
def test_resume_at_another_layout(
    trained: tuple[Daemon, Path], stage: int, dp: int, dims: str
) -> None:
    """The last case also pads the vocabulary to 96 rows instead of 64 (as another TP size
    would): only the logical rows were stored, and the new padding rows load as zeros."""
    daemon, out = trained
    tag = f"z{stage}dp{dp}v{dims.split(',')[2]}"
    run_ranks(daemon, "resume", stage, dp, out, tag, dims)
    saved, full = logical(load_full(out, "saved")), load_full(out, tag)
    got = logical(full)
    assert set(got) == set(saved)
    for name, tensor in saved.items():
        assert torch.equal(got[name], tensor), f"{tag}: {name} differs after the load"
        if name.split("/")[-1] in rig.PADDED and name.startswith(("fp32/", "optim/")):
            assert not full[name][rig.VOCAB :].any(), f"{tag}: {name}'s padding is not zero"
    reference = losses(out, "saved")  # the saved run going on at its own layout
    if (stage, dp, dims) == (2, 4, rig.SMALL):
        assert losses(out, tag) == reference
    else:
        assert losses(out, tag) == pytest.approx(reference, rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("case", ["param-shape", "buffer-dtype", "frozen-missing"])
def test_load_refuses_another_model(
    trained: tuple[Daemon, Path], tmp_path: Path, case: str
) -> None:
    """A checkpoint that does not match the engine: a clear error naming what differs, raised
    before any tensor is read. param-shape: a parameter's shape; buffer-dtype: a buffer saved in
    another dtype (a whole load checks only byte counts); frozen-missing: a frozen parameter the
    checkpoint lacks."""
    daemon, _ = trained
    client = ckptd.connect(daemon.socket)
    meta = json.loads(client.load_object(JOB, 3, "deepspeed", raw=True))
    for p in meta["params"]:  # the engine below declares no vocabulary padding
        if p["name"] in rig.PADDED:
            p["shape"][0] = int(rig.SMALL.split(",")[2])
    tensors: dict[str, object] = {
        "frozen/gain": torch.zeros(32),
        "buffer/position": torch.zeros(rig.SEQ),
    }
    if case == "param-shape":
        meta["params"][0]["shape"] = [1, 2, 3]
        want = f"parameter {meta['params'][0]['name']} was saved with shape [1, 2, 3]"
    elif case == "buffer-dtype":
        tensors["buffer/position"] = torch.zeros(rig.SEQ, dtype=torch.float64)
        want = f"buffer/position was saved as float64 [{rig.SEQ}], the engine's is float32"
    else:
        meta["frozen"] = []
        want = "holds no frozen parameters ['gain']"
    job = f"{JOB}.bad-{case}"
    objects = {"deepspeed": ckptd.Raw(json.dumps(meta).encode())}
    client.save(job, 1, tensors, objects).committed().result()
    client.close()
    script = tmp_path / "bad.py"
    script.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(RIG.parent)!r})\n"
        "import deepspeed, deepspeed.ops\n"
        "deepspeed.ops.__compatible_ops__['deepspeed_shm_comm'] = False\n"
        "deepspeed.init_distributed(dist_backend='gloo')\n"
        "import ckptd, ckptd.deepspeed as ckds, deepspeed_rig as rig\n"
        "engine = rig.engine_for(2, 1, seed=0)\n"
        "try:\n"
        f"    ckds.load(engine, ckptd.connect(), {job!r})\n"
        "except ValueError as e:\n"
        "    print('REFUSED', e)\n"
    )
    (env,) = rig.rank_envs(1, daemon.socket)
    done = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300
    )
    assert "REFUSED" in done.stdout, done.stdout + done.stderr
    assert want in done.stdout, done.stdout


def test_one_rank_failing_fails_every_rank(trained: tuple[Daemon, Path], tmp_path: Path) -> None:
    """A read that fails on one rank only (here rank 1's, injected): that rank raises its error
    and the other raises a RuntimeError naming it, both promptly; neither waits in the refresh's
    all-gather until the process group's timeout."""
    daemon, _ = trained
    script = tmp_path / "one_fails.py"
    script.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(RIG.parent)!r})\n"
        "import deepspeed, deepspeed.ops\n"
        "deepspeed.ops.__compatible_ops__['deepspeed_shm_comm'] = False\n"
        "deepspeed.init_distributed(dist_backend='gloo')\n"
        "import ckptd, ckptd.deepspeed as ckds, deepspeed_rig as rig\n"
        "from ckptd.layouts import Layouts, Padded\n"
        "rank = int(os.environ['RANK'])\n"
        "engine = rig.engine_for(2, 2, seed=0)\n"
        "client = ckptd.connect()\n"
        "if rank == 1:\n"
        "    def broken(*args, **kwargs):\n"
        "        raise OSError('injected read failure')\n"
        "    client.load_into = broken\n"
        "layouts = Layouts({n: Padded(0, rig.VOCAB) for n in rig.PADDED})\n"
        "try:\n"
        f"    ckds.load(engine, client, {JOB!r}, layouts=layouts)\n"
        "    print('LOADED')\n"
        "except Exception as e:\n"
        "    print('RAISED', type(e).__name__, e)\n"
        "sys.stdout.flush()\n"
        "os._exit(0)\n"
    )
    procs = [
        subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
        for env in rig.rank_envs(2, daemon.socket)
    ]
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert "RAISED OSError injected read failure" in outs[1], outs
    assert "RAISED RuntimeError" in outs[0] and "DP ranks [1] failed" in outs[0], outs
    assert "injected read failure" in outs[0], outs
