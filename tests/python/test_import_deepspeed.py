"""`ckptd-import --format deepspeed` of checkpoints real DeepSpeed wrote: a small model (an
embedding with a padded vocabulary, a fused QKV linear, a SwiGLU MLP, a LayerNorm with a frozen
bias, two buffers; two parameter groups; sizes that leave ZeRO's partitions uneven and padded)
trained 3 steps on CPU with torch's AdamW by 4 gloo ranks at ZeRO stages 1, 2 and 3, saved with
engine.save_checkpoint. Every fp32/ and optim/ item is loaded whole and compared bit-exact with
DeepSpeed's own ds_to_universal output and with the full masters and moments the training ranks
gathered (safe_get_full_fp32_param / safe_get_full_optimizer_state) before saving; Flat pieces of
2-way ZeRO-2 and ZeRO-3 partitions are loaded as another DP size would; frozen parameters,
buffers and the `deepspeed` JSON object are checked; malformed and hostile inputs (a truncated
or missing rank file, a pickle naming code, param_shapes that the partitions do not add up to)
exit 3 naming the file.

This file is also the training script: `python3 test_import_deepspeed.py train DIR` is one rank
(RANK/WORLD_SIZE/... in its environment), `... universal DIR` runs ds_to_universal."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import math
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import ckptd
from conftest import Daemon, free_port

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

if importlib.util.find_spec("deepspeed") is None:  # not imported here: only the ranks need it
    pytest.skip("DeepSpeed is not installed", allow_module_level=True)

DP = 4
STAGES = (1, 2, 3)
STEPS = 3
VOCAB, PADDED_VOCAB, HIDDEN, FFN = 37, 40, 10, 14  # odd sizes: partitions split parameters
TRAIN_TIMEOUT_S = 600
ADAPTER_LOADS = ((1, 3), (2, 1), (3, 2))  # (the imported run's stage, the loading engine's)


# --- the training script (run as ranks in subprocesses) -----------------------------------------
class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(PADDED_VOCAB, HIDDEN)
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)  # fused Q, K, V
        self.proj = nn.Linear(HIDDEN, HIDDEN, bias=False)
        self.gate_up = nn.Linear(HIDDEN, 2 * FFN, bias=False)  # SwiGLU's fused gate and up
        self.down = nn.Linear(FFN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.norm.bias.requires_grad_(False)  # a frozen parameter
        self.register_buffer("position_ids", torch.arange(7))
        self.register_buffer("scale", torch.full((3,), 0.5))
        self.head = nn.Linear(HIDDEN, PADDED_VOCAB, bias=False)

    def forward(self, ids: Any) -> Any:
        x = self.embed(ids)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        x = x + self.proj(torch.softmax(q @ k.transpose(-1, -2) / 3.0, dim=-1) @ v)
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return self.head(self.norm(x)) * self.scale[0] * 2


def _engine(stage: int, perturb: bool = False) -> Any:
    """A fresh engine: AdamW over two parameter groups (matrices with weight decay, the rest
    without) and a StepLR schedule; perturb: other values in the buffer and frozen parameter (a
    load must set them)."""
    import deepspeed

    torch.manual_seed(0)
    model = Tiny()
    if perturb:
        model.scale.fill_(-1.0)
        model.norm.bias.data.fill_(9.0)
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in trainable if p.dim() == 2], "weight_decay": 0.1},
        {"params": [p for p in trainable if p.dim() < 2], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=1e-2, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=sched, config=config)
    return engine


def _full(engine: Any, stage: int) -> dict[str, Any]:
    """Every trainable parameter's full fp32 master and moments, the frozen parameter and the
    buffers, gathered with DeepSpeed's own helpers (collective)."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    # DeepSpeed 0.19.8's ZeRO-1/2 links the hp fragments to the optimizer state after the first
    # group's first step, before the other groups have state: relink, or the second group's
    # moments cannot be gathered ("exp_avg not found in optimizer state fragment").
    if hasattr(engine.optimizer, "_hp_optimizer_states_linked"):
        engine.optimizer._hp_optimizer_states_linked = False
        engine.optimizer._lazy_init_hp_params_optimizer_state()
    out = {f"buffer/{n}": b.clone() for n, b in engine.module.named_buffers()}
    with deepspeed.zero.GatheredParameters([engine.module.norm.bias], enabled=stage == 3):
        out["frozen/norm.bias"] = engine.module.norm.bias.detach().clone()
    for n, p in engine.module.named_parameters():
        if p.requires_grad:
            out[f"fp32/{n}"] = safe_get_full_fp32_param(p).clone()
            for k in ("exp_avg", "exp_avg_sq"):
                out[f"optim/{k}/{n}"] = safe_get_full_optimizer_state(p, k).clone()
    return out


def _train(out: str, stage: int, rank: int) -> None:
    engine = _engine(stage)
    g = torch.Generator().manual_seed(100 + rank)
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (2, 7), generator=g)
        loss = F.cross_entropy(engine(ids).reshape(-1, PADDED_VOCAB), ids.reshape(-1))
        engine.backward(loss)
        engine.step()
    ref = _full(engine, stage)
    engine.save_checkpoint(out, client_state={"epoch": 7})
    if rank == 0:
        torch.save(ref, os.path.join(out, "reference.pt"))


def _adapter_main(out: str, rank: int) -> None:
    """Rank 0 imports each stage's checkpoint (ckptd.formats); then every rank loads it with
    ckptd.deepspeed into an engine of another stage, and rank 0 writes DIR/adapter.json: what
    DeepSpeed's gather then holds that differs (bits) from the saved run's, and the scalars."""
    import deepspeed.comm as dist

    import ckptd.deepspeed as ckds
    from ckptd import formats

    client = ckptd.connect(os.environ["CKPTD_SOCKET"])
    if rank == 0:
        for stage in STAGES:
            source = formats.open_source("deepspeed", os.path.join(out, f"z{stage}"))
            formats.import_source(client, f"adapter-z{stage}", 0, source)
    dist.barrier()
    report = {}
    for saved, stage in ADAPTER_LOADS:
        engine = _engine(stage, perturb=True)
        loaded = ckds.load(engine, client, f"adapter-z{saved}", 0)
        got = _full(engine, stage)
        ref = torch.load(os.path.join(out, f"z{saved}", "reference.pt"), weights_only=True)
        report[f"z{saved}->z{stage}"] = {
            "differ": sorted(k for k in ref if not same_bits(got[k], ref[k])),
            "global_steps": engine.global_steps,
            "last_epoch": engine.lr_scheduler.last_epoch,
            "client_state": loaded.client_state,
        }
    if rank == 0:
        Path(out, "adapter.json").write_text(json.dumps(report))


def _train_main(out: str) -> None:
    import deepspeed
    import deepspeed.ops

    # No JIT build of DeepSpeed's CPU shared-memory allreduce (a C++ compile per run): gloo does.
    deepspeed.ops.__compatible_ops__ = {}
    deepspeed.init_distributed(dist_backend="gloo")
    rank = int(os.environ["RANK"])
    for stage in STAGES:
        _train(os.path.join(out, f"z{stage}"), stage, rank)
    _adapter_main(out, rank)


def _universal_main(out: str) -> None:
    """`python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state` of each stage's
    checkpoint, in one process (one import of DeepSpeed), one worker."""
    import runpy

    for stage in STAGES:
        sys.argv = [
            "ds_to_universal",
            f"--input_folder={out}/z{stage}/global_step{STEPS}",
            f"--output_folder={out}/u{stage}/global_step{STEPS}",
            "--inject_missing_state",
            "--num_extract_workers=1",
            "--num_merge_workers=1",
        ]
        runpy.run_module("deepspeed.checkpoint.ds_to_universal", run_name="__main__")


# --- fixtures and helpers -----------------------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CKPTD_SOCKET"}
    return dict(env, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", **extra)


def _run_ranks(out: Path, socket: str) -> None:
    port = str(free_port())
    procs = []
    for rank in range(DP):
        env = _env(
            RANK=str(rank),
            WORLD_SIZE=str(DP),
            LOCAL_RANK=str(rank),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=port,
            GLOO_SOCKET_IFNAME="lo",
            CKPTD_SOCKET=socket,
        )
        log = open(out / f"rank{rank}.log", "wb")  # closed below
        cmd = [sys.executable, __file__, "train", str(out)]
        procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
    failed = []
    for rank, (proc, log) in enumerate(procs):
        try:
            proc.wait(timeout=TRAIN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        if proc.returncode != 0:
            failed.append(rank)
    if failed:
        tail = (out / f"rank{failed[0]}.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"DeepSpeed ranks {failed} failed; rank {failed[0]}'s log:\n{tail}")


@pytest.fixture(scope="module")
def trained(daemon: Daemon, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One training run: DIR/z{1,2,3} (engine.save_checkpoint), DIR/adapter.json (those imported
    and loaded by ckptd.deepspeed) and DIR/u{1,2,3} (ds_to_universal of each)."""
    out = tmp_path_factory.mktemp("deepspeed")
    _run_ranks(out, daemon.socket)
    done = subprocess.run(
        [sys.executable, __file__, "universal", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=TRAIN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """`python3 -m ckptd import --socket <daemon's> ARGS...` in this process."""
    from ckptd import _cli

    out, err = io.StringIO(), io.StringIO()
    argv = ["import", "--socket", daemon.socket, "--format", "deepspeed", "--json", *args]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = _cli.main(argv)
        except SystemExit as e:
            code = int(e.code or 0)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def imported(daemon: Daemon, job: str, path: Path, *args: str) -> dict[str, Any]:
    out = cli(daemon, *args, job, "0", str(path))
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def refused(out: subprocess.CompletedProcess[str], file: Path) -> None:
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
    assert "refused" in out.stderr and str(file) in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def same_bits(a: Any, b: Any) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def reference(trained: Path, stage: int) -> dict[str, Any]:
    return dict(torch.load(trained / f"z{stage}" / "reference.pt", weights_only=True))


def universal(trained: Path, stage: int, name: str, state: str) -> Any:
    file = trained / f"u{stage}" / f"global_step{STEPS}" / "zero" / name / f"{state}.pt"
    value = torch.load(file, weights_only=True)
    return value["param"] if isinstance(value, dict) else value  # ZeRO-3's: a flat tensor


def trainable(ref: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    return {k[5:]: tuple(v.shape) for k, v in ref.items() if k.startswith("fp32/")}


# --- tests --------------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", STAGES)
def test_import_matches_deepspeed(daemon: Daemon, trained: Path, stage: int) -> None:
    client = ckptd.connect(daemon.socket)
    job = f"ds-z{stage}"
    ckpt = trained / f"z{stage}"  # the directory: `latest` names the tag
    summary = imported(daemon, job, ckpt if stage != 2 else ckpt / f"global_step{STEPS}")
    assert summary["world_size"] == DP  # every DP rank's bytes fit one batch: rank r = DP rank r
    ref = reference(trained, stage)
    params = trainable(ref)
    items = [
        f"{kind}/{n}" for n in params for kind in ("fp32", "optim/exp_avg", "optim/exp_avg_sq")
    ]
    out = client.load(job, 0, items=items, as_torch=True)
    for name in params:
        for kind, state in (
            ("fp32", "fp32"),
            ("optim/exp_avg", "exp_avg"),
            ("optim/exp_avg_sq", "exp_avg_sq"),
        ):
            got = out.tensors[f"{kind}/{name}"]
            uni = universal(trained, stage, name, state)
            assert same_bits(got, uni.reshape(got.shape)), (kind, name)  # ZeRO-3's is flat
            assert same_bits(got, ref[f"{kind}/{name}"]), (kind, name)
    rest = client.load(
        job, 0, items=["frozen/norm.bias", "buffer/position_ids", "buffer/scale"], as_torch=True
    )
    for name, got in rest.tensors.items():
        assert same_bits(got, ref[name]), name
    meta = json.loads(client.load_object(job, 0, "deepspeed", raw=True))
    assert {k: meta[k] for k in ("format", "source", "zero_stage", "dp_world_size")} == {
        "format": 1,
        "source": "import",
        "zero_stage": stage,
        "dp_world_size": DP,
    }
    assert meta["ds_version"] == importlib.metadata.version("deepspeed")
    order = sorted(params.items(), key=lambda p: len(p[1]) < 2)  # the groups: matrices first
    assert [(p["name"], tuple(p["shape"])) for p in meta["params"]] == order
    assert [p["group"] for p in meta["params"]] == [0] * 6 + [1] * 3
    assert (meta["frozen"], meta["buffers"]) == (["norm.bias"], ["position_ids", "scale"])
    assert meta["optim_keys"] == ["exp_avg", "exp_avg_sq"]
    assert [g["weight_decay"] for g in meta["param_groups"]] == [0.1, 0.0]
    assert (
        meta["param_groups"][0]["betas"] == [0.9, 0.95] and "params" not in meta["param_groups"][0]
    )
    assert meta["optim_steps"] == [float(STEPS)] * 2
    assert (meta["global_steps"], meta["global_samples"], meta["skipped_steps"]) == (
        STEPS,
        STEPS * 2 * DP,
        0,
    )
    assert (
        meta["lr_scheduler"]["last_epoch"] == STEPS
        and meta["lr_scheduler"]["_last_lr"] == [5e-3] * 2
    )
    assert meta["loss_scaler"]["cur_scale"] == 1.0
    assert meta["client_state"] is True
    assert pickle.loads(client.load_object(job, 0, "client_state", raw=True)) == {"epoch": 7}


def test_adapter_loads_the_import_at_another_stage(trained: Path) -> None:
    """ckptd.deepspeed.load of each import into a 4-rank engine of another ZeRO stage: DeepSpeed's
    gather of its masters and moments, its frozen parameter and buffers equal the saved run's
    bit for bit; the counters, scheduler and client_state are restored."""
    report = json.loads((trained / "adapter.json").read_text())
    assert sorted(report) == sorted(f"z{a}->z{b}" for a, b in ADAPTER_LOADS)
    for loaded in report.values():
        assert loaded == {
            "differ": [],
            "global_steps": STEPS,
            "last_epoch": STEPS,
            "client_state": {"epoch": 7},
        }, report


def zero2_pieces(params: dict[str, tuple[int, ...]], dp: int) -> list[list[tuple[str, int, int]]]:
    """Each rank's (param, start, count) under a ZeRO-1/2 partition at `dp` ranks of one group
    holding every parameter (no alignment)."""
    sizes = {n: math.prod(s) for n, s in params.items()}
    total = sum(sizes.values())
    stride = -(-total // dp)
    ranks: list[list[tuple[str, int, int]]] = [[] for _ in range(dp)]
    offset = 0
    for name, n in sizes.items():
        for r in range(dp):
            lo, hi = max(offset, r * stride), min(offset + n, (r + 1) * stride)
            if hi > lo:
                ranks[r].append((name, lo - offset, hi - lo))
        offset += n
    return ranks


def zero3_pieces(params: dict[str, tuple[int, ...]], dp: int) -> list[list[tuple[str, int, int]]]:
    """Each rank's (param, start, count) under ZeRO-3 at `dp` ranks."""
    ranks: list[list[tuple[str, int, int]]] = [[] for _ in range(dp)]
    for name, shape in params.items():
        n = math.prod(shape)
        chunk = -(-n // dp)
        for r in range(dp):
            count = min(chunk, n - r * chunk)
            if count > 0:
                ranks[r].append((name, r * chunk, count))
    return ranks


@pytest.mark.parametrize("stage", [2, 3])
def test_loads_at_another_dp_size(daemon: Daemon, trained: Path, stage: int) -> None:
    """What a 2-rank engine's load reads: each rank's Flat pieces of fp32/ and optim/, at ZeRO-2
    and ZeRO-3 partitions, from the 4-rank import."""
    client = ckptd.connect(daemon.socket)
    job = f"ds-z{stage}"
    if not any(c["step"] == 0 for c in client.list(job)):
        imported(daemon, job, trained / f"z{stage}")
    ref = reference(trained, stage)
    params = trainable(ref)
    for layout in (zero2_pieces(params, 2), zero3_pieces(params, 2)):
        for rank, pieces in enumerate(layout):
            targets = []
            for name, start, count in pieces:
                for kind in ("fp32", "optim/exp_avg", "optim/exp_avg_sq"):
                    dest = torch.empty(count, dtype=torch.float32)
                    targets.append((f"{kind}/{name}", ckptd.Flat(start, count), dest))
            client.load_into(job, 0, targets, rank=rank)
            for item, region, dest in targets:
                want = ref[item].reshape(-1)[region.start : region.start + region.count]
                assert same_bits(dest, want), (item, region)


def test_small_batches_split_each_rank(daemon: Daemon, trained: Path) -> None:
    """--batch_bytes below a DP rank's bytes: each DP rank is saved as several ckptd ranks (a
    rank's pieces page-rounded), none mixing two DP ranks, and the import loads back the same."""
    client = ckptd.connect(daemon.socket)
    summary = imported(daemon, "ds-small", trained / "z2", "--batch_bytes", "16KiB")
    assert summary["world_size"] > DP
    assert all(0 < b <= 16 << 10 for b in summary["rank_bytes"][1:])
    ref = reference(trained, 2)
    out = client.load("ds-small", 0, items=list(ref), as_torch=True)
    for name, want in ref.items():
        assert same_bits(out.tensors[name], want), name


@pytest.mark.parametrize("stage", [2, 3])
def test_padded_vocabulary_stored_without_its_padding(
    daemon: Daemon, trained: Path, stage: int
) -> None:
    """--padded embed.weight=VOCAB: the embedding and head are stored as their VOCAB logical rows
    (fp32 and moments), as ckptd.deepspeed saves a parameter declared Padded(0, VOCAB), and the
    metadata records the logical shapes; the other parameters are unchanged."""
    client = ckptd.connect(daemon.socket)
    job = f"ds-padded-z{stage}"
    padded = [f"--padded=embed.weight={VOCAB}", f"--padded=head.weight={VOCAB}"]
    imported(daemon, job, trained / f"z{stage}", *padded)
    ref = reference(trained, stage)
    out = client.load(job, 0, items=list(ref), as_torch=True)
    for name, want in ref.items():
        if name.endswith(("/embed.weight", "/head.weight")):
            want = want[:VOCAB]
        assert same_bits(out.tensors[name], want), name
    meta = json.loads(client.load_object(job, 0, "deepspeed", raw=True))
    shapes = {p["name"]: p["shape"] for p in meta["params"]}
    assert shapes["embed.weight"] == shapes["head.weight"] == [VOCAB, HIDDEN]


def test_padded_usage_errors(daemon: Daemon, trained: Path) -> None:
    for arg, why in (
        ("--padded=nope.weight=3", "no trainable parameter"),
        (f"--padded=embed.weight={PADDED_VOCAB + 1}", "between 1 and its first dimension"),
        ("--padded=embed.weight", "is not NAME=ROWS"),
    ):
        out = cli(daemon, arg, "ds-padded-bad", "0", str(trained / "z2"))
        assert out.returncode == 2, (arg, out.returncode, out.stderr)
        assert why in out.stderr, (arg, out.stderr)
    no_checkpoint(daemon, "ds-padded-bad")


# --- malformed and hostile input ----------------------------------------------------------------
@pytest.fixture()
def tag(trained: Path, tmp_path: Path) -> Path:
    """A copy of the ZeRO-2 checkpoint's tag directory, to break."""
    return Path(shutil.copytree(trained / "z2" / f"global_step{STEPS}", tmp_path / "global_step3"))


def no_checkpoint(daemon: Daemon, job: str) -> None:
    client = ckptd.connect(daemon.socket)
    assert [c["state"] for c in client.list(job)] in ([], ["ABORTED"])


def test_truncated_rank_file_refused(daemon: Daemon, tag: Path) -> None:
    file = tag / "zero_pp_rank_2_mp_rank_00_optim_states.pt"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    refused(cli(daemon, "ds-trunc", "0", str(tag)), file)
    no_checkpoint(daemon, "ds-trunc")


def test_missing_rank_file_refused(daemon: Daemon, tag: Path) -> None:
    file = tag / "zero_pp_rank_3_mp_rank_00_optim_states.pt"
    file.unlink()
    out = cli(daemon, "ds-missing", "0", str(tag))
    refused(out, file)
    assert "4 DP ranks" in out.stderr
    no_checkpoint(daemon, "ds-missing")


def test_extra_rank_file_refused(daemon: Daemon, tag: Path) -> None:
    """A fifth rank's file (another run's, or another layout's) in a 4-rank checkpoint."""
    file = tag / "zero_pp_rank_4_mp_rank_00_optim_states.pt"
    shutil.copy(tag / "zero_pp_rank_3_mp_rank_00_optim_states.pt", file)
    refused(cli(daemon, "ds-extra", "0", str(tag)), file)
    no_checkpoint(daemon, "ds-extra")


def test_reads_without_deepspeed(trained: Path) -> None:
    """The importer neither imports DeepSpeed nor needs it."""
    code = (
        "import sys; from ckptd.formats import open_source; "
        f"s = open_source('deepspeed', {str(trained / 'z3')!r}); "
        "assert 'deepspeed' not in sys.modules, sorted(sys.modules); print(len(s.pieces))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and int(out.stdout) > 0, out.stderr


class OpensMarker:
    """Pickled as a call of builtins.open(path, "w"): unpickled unrestricted, the marker file
    would appear (the test checks it never does)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def test_pickle_naming_code_refused(daemon: Daemon, tag: Path) -> None:
    file = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    marker = tag / "opened"
    torch.save(
        {"optimizer_state_dict": {"zero_stage": 2, "loss_scaler": OpensMarker(str(marker))}}, file
    )
    out = cli(daemon, "ds-code", "0", str(tag))
    refused(out, file)
    assert "GLOBAL io.open was not an allowed global" in out.stderr, out.stderr
    assert not marker.exists()
    no_checkpoint(daemon, "ds-code")


def test_partitions_not_adding_up_refused(daemon: Daemon, tag: Path) -> None:
    """param_shapes that the partitions do not cover (head.weight one row longer)."""
    file = tag / "mp_rank_00_model_states.pt"
    model = torch.load(file, weights_only=True)
    model["param_shapes"][0]["head.weight"] = torch.Size([PADDED_VOCAB + 1, HIDDEN])
    torch.save(model, file)
    out = cli(daemon, "ds-shapes", "0", str(tag))
    assert out.returncode == 3 and "refused" in out.stderr and str(tag) in out.stderr, out.stderr
    assert "group 0" in out.stderr, out.stderr
    no_checkpoint(daemon, "ds-shapes")


def test_not_a_checkpoint_refused(daemon: Daemon, tmp_path: Path) -> None:
    (tmp_path / "latest").write_text("../elsewhere")
    refused(cli(daemon, "ds-latest", "0", str(tmp_path)), tmp_path / "latest")


if __name__ == "__main__":
    {"train": _train_main, "universal": _universal_main}[sys.argv[1]](sys.argv[2])
