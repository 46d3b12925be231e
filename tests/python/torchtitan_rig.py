"""One rank of a TorchTitan training loop on CPU (gloo) for test_torchtitan.py.

TorchTitan's Trainer cannot run on CPU (it sets up a CUDA device, and its debug model's flex /
varlen attention has no CPU backward), so this rig builds what Trainer.__init__ builds and calls
what Trainer.train calls, from TorchTitan's own parts: the llama3 debug model (attention switched
to TorchTitan's SDPA config, the only one that trains on CPU) sharded with FSDP2 fully_shard,
OptimizersContainer (AdamW) and LRSchedulersContainer from their Configs, a train-state Stateful,
and the checkpoint manager built as Trainer builds it: config.checkpoint.build(...). Every step
feeds the same global batch, whatever the world size.

    train:  steps 1-4, each saved (async_with_pinned_mem, keep_latest_k=2: 3 and 4 remain), steps
            5-6 (the reference losses), then a save of step 6 that rank 1 dies in (SIGKILL
            while staging)
    resume: a fresh model (another seed), load() ("latest"), steps 5-6; then, with
            CKPTD_FAULTS_SOCKET set (one rank), the failure cases against that daemon, named
            in each Config: the Config through TorchTitan's tyro CLI; a job with no
            checkpoint, one whose only checkpoint never committed, load_step missing,
            initial_load_path; a model-only bf16 export; a Hugging Face export and a job
            initialised from it; a job initialised from a local DCP folder; a corrupt
            checkpoint (saved with async_mode "async", its blobs flipped under
            CKPTD_STATE_DIR); that daemon (CKPTD_PID) killed, then restarted

Rank 0 writes OUT/<tag>.json. Started with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and
CKPTD_SOCKET set."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

GLOBAL_BATCH, SEQ = 6, 16


class TrainState:
    """The Trainer's own Stateful (train_state): step and tokens seen."""

    def __init__(self) -> None:
        self.step = 0
        self.ntokens_seen = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "ntokens_seen": self.ntokens_seen}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step, self.ntokens_seen = sd["step"], sd["ntokens_seen"]


def debug_model(seed: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel").model
    for _, _, parent, attr in list(config.traverse(FlexAttention.Config)):
        sdpa = ScaledDotProductAttention.Config()
        if isinstance(parent, list):
            parent[attr] = sdpa  # type: ignore[index]
        else:
            setattr(parent, attr, sdpa)
    with torch.device("meta"):
        model = config.build()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.layers.values() if hasattr(model.layers, "values") else model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    with torch.no_grad():
        model.init_weights(buffer_device=None)
    model.train()
    return model


def checkpoint_config(job: str, **kw: Any) -> Any:
    from ckptd.torchtitan import CkptdCheckpointManager

    if "folder" in kw:  # a local folder (Hugging Face files), the job named apart
        kw["job"] = job
    else:
        kw["folder"] = f"ckptd://{job}"
    kw.setdefault("enable", True)
    kw.setdefault("interval", 1)
    kw.setdefault("keep_latest_k", 2)
    kw.setdefault("last_save_model_only", False)
    return CkptdCheckpointManager.Config(**kw)


class Run:
    """What Trainer.__init__ builds, and Trainer.train_step's calls."""

    def __init__(self, checkpoint: Any, seed: int, sd_adapter: Any = None, base: str = "") -> None:
        from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

        self.model = debug_model(seed)
        self.optimizers = default_adamw(lr=8e-4).build(model_parts=[self.model])
        self.lr_schedulers = LRSchedulersContainer.Config(
            warmup_steps=2, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.0
        ).build(optimizers=self.optimizers, training_steps=10)
        self.train_state = TrainState()
        self.checkpointer = checkpoint.build(
            dataloader=None,
            model_parts=[self.model],
            optimizers=self.optimizers,
            lr_schedulers=self.lr_schedulers,
            states={"train_state": self.train_state},
            sd_adapter=sd_adapter,
            base_folder=base,
        )

    def step(self) -> float:
        """One training step on step's global batch (this rank's rows); the global loss."""
        rank, world = dist.get_rank(), dist.get_world_size()
        self.train_state.step += 1
        g = torch.Generator().manual_seed(1000 + self.train_state.step)
        tokens = torch.randint(0, 2048, (GLOBAL_BATCH, SEQ + 1), generator=g)
        rows = GLOBAL_BATCH // world
        mine = tokens[rank * rows : (rank + 1) * rows]
        inputs, labels = mine[:, :-1], mine[:, 1:]
        positions = torch.arange(SEQ).unsqueeze(0).expand(rows, SEQ)
        logits = self.model(inputs, positions=positions)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        self.checkpointer.maybe_wait_for_staging()
        self.optimizers.step()
        self.lr_schedulers.step()
        self.optimizers.zero_grad()
        self.train_state.ntokens_seen += GLOBAL_BATCH * SEQ
        total = loss.detach().clone()
        dist.all_reduce(total)
        return float(total) / world


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("train", "resume"))
    p.add_argument("--job", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--async-mode", default="disabled")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    result: dict[str, Any] = {"world": dist.get_world_size()}
    if args.mode == "train":
        run = Run(checkpoint_config(args.job, async_mode=args.async_mode), seed=0)
        result["fresh"] = run.checkpointer.load()  # the job is empty: a fresh start
        # FSDP2 over every rank: the saves below plan with no collective (LocalPlanner)
        result["planless"] = type(run.checkpointer._local_planner()).__name__
        for _ in range(4):
            run.step()
            run.checkpointer.save(run.train_state.step)
        run.checkpointer.maybe_wait_for_saving()
        result["losses"] = [run.step(), run.step()]
        result["lr"] = run.lr_schedulers.schedulers[0].get_last_lr()[0]
        result["killed_save"] = kill_rank1_mid_save(run)
        import ckptd
        from ckptd.torch import encode_job

        rows = ckptd.connect(os.environ["CKPTD_SOCKET"]).list(encode_job(args.job))
        result["committed"] = [
            [r["step"], r["world_size"]] for r in rows if r["state"] == "COMMITTED"
        ]
    else:
        run = Run(checkpoint_config(args.job, async_mode=args.async_mode), seed=99)
        result["loaded"] = run.checkpointer.load()
        result["step"] = run.train_state.step
        result["losses"] = [run.step(), run.step()]
        result["lr"] = run.lr_schedulers.schedulers[0].get_last_lr()[0]
        if "CKPTD_FAULTS_SOCKET" in os.environ:  # one rank: the failure cases, on that daemon
            result["faults"] = faults(
                args.job, args.out / "faults", os.environ["CKPTD_FAULTS_SOCKET"]
            )
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.tag}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # see conftest.run_rank


def kill_rank1_mid_save(run: Run) -> str:
    """A save of the current step that rank 1 dies in, while staging its shards."""
    if dist.get_rank() == 1:
        import ckptd.torch._storage as storage

        def die(*a: Any, **k: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)

        storage.StorageWriter._stage_now = die  # type: ignore[method-assign]
    try:
        run.checkpointer.save(run.train_state.step)
        run.checkpointer.maybe_wait_for_saving()
        return "returned"
    except BaseException as e:  # DCP's CheckpointException or gloo's RuntimeError
        return f"{type(e).__name__}: {e}"[:300]


def faults(job: str, out_dir: Path, socket: str) -> dict[str, Any]:
    """Each failure's exception (type and message), or what the call returned. Every manager
    here names the daemon at `socket` in its Config (checkpoint.socket)."""
    import ckptd
    from ckptd.torch import encode_job

    out: dict[str, Any] = {}

    def config(job: str, **kw: Any) -> Any:
        return checkpoint_config(job, socket=socket, **kw)

    def attempt(name: str, fn: Any) -> None:
        try:
            out[name] = f"returned {fn()!r}"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"[:400]

    out["cli"] = cli_config(job)
    # A job with nothing in it: TorchTitan's "no checkpoint" path (a fresh start) ...
    attempt("empty", lambda: Run(config(f"{job}/empty"), 0).checkpointer.load())
    # ... but an initial_load_path or a load_step that is not there is an error.
    missing = config(f"{job}/empty", initial_load_path=f"ckptd://{job}/nothing")
    attempt("initial_missing", lambda: Run(missing, 0).checkpointer.load())
    attempt("step_missing", lambda: Run(config(job), 0).checkpointer.load(step=5))
    # A job whose only checkpoint never committed (rank 1 of 2 never staged it).
    client = ckptd.connect(socket)
    half = encode_job(f"{job}/half")
    client.save(half, 1, {"w": torch.ones(4)}, rank=0, world_size=2)
    attempt("uncommitted", lambda: Run(config(f"{job}/half"), 0).checkpointer.load())

    # The last save, model-only in bfloat16; a run resumed from it; another job starting from it.
    export = Run(config(f"{job}/export", export_dtype="bfloat16"), 0)
    export.checkpointer.last_save_model_only = True
    export.step()
    export.checkpointer.save(1, last_step=True)
    items = client.inspect(encode_job(f"{job}/export"), 1)
    out["export_dtypes"] = sorted({str(i.get("dtype")) for i in items if i["kind"] != "object"})
    out["export_optimizer_items"] = sum(i["name"].startswith("optimizer") for i in items)
    attempt("resume_export", lambda: Run(config(f"{job}/export"), 0).checkpointer.load())
    seeded = Run(
        config(
            f"{job}/from-export",
            initial_load_path=f"ckptd://{job}/export",
            initial_load_model_only=True,
        ),
        seed=5,
    )
    out["initial_loaded"] = seeded.checkpointer.load()
    want = export.model.state_dict()["norm.weight"].full_tensor().bfloat16().float()
    got = seeded.model.state_dict()["norm.weight"].full_tensor()
    out["initial_equal"] = bool(torch.equal(want, got)) and seeded.train_state.step == 0

    # The last save as Hugging Face safetensors (a local folder), and a job initialised from it.
    from torchtitan.models.llama3 import model_registry

    spec = model_registry("debugmodel")
    adapter = spec.state_dict_adapter(spec.model, None)
    hf_config = config(f"{job}/hf", folder="hf", last_save_model_only=True, last_save_in_hf=True)
    hf = Run(hf_config, 0, sd_adapter=adapter, base=str(out_dir))
    hf.step()
    hf.checkpointer.save(1, last_step=True)
    out["hf_files"] = sorted(p.name for p in (out_dir / "hf" / "step-1").glob("*.json"))
    from_hf = config(
        f"{job}/from-hf",
        initial_load_path=str((out_dir / "hf" / "step-1").resolve()),
        initial_load_in_hf=True,
        initial_load_model_only=True,
    )
    loaded = Run(from_hf, seed=5, sd_adapter=adapter)
    out["hf_loaded"] = loaded.checkpointer.load()
    want = hf.model.state_dict()["norm.weight"].full_tensor()
    got = loaded.model.state_dict()["norm.weight"].full_tensor()
    out["hf_equal"] = bool(torch.equal(want, got))

    # A job initialised from a local DCP folder (TorchTitan's own path, FileSystemReader).
    import torch.distributed.checkpoint as dcp

    local = out_dir / "dcp"
    dcp.save(dict(hf.model.state_dict()), checkpoint_id=str(local))
    from_dcp = config(
        f"{job}/from-dcp", initial_load_path=str(local.resolve()), initial_load_model_only=True
    )
    loaded = Run(from_dcp, seed=6)
    out["dcp_loaded"] = loaded.checkpointer.load()
    got = loaded.model.state_dict()["norm.weight"].full_tensor()
    out["dcp_equal"] = bool(torch.equal(want, got))

    # A corrupt checkpoint (saved with async_mode="async").
    corrupt = Run(config(f"{job}/corrupt", async_mode="async"), 0)
    corrupt.step()
    corrupt.checkpointer.save(1)
    corrupt.checkpointer.maybe_wait_for_saving()
    state_dir = Path(os.environ["CKPTD_STATE_DIR"])
    blobs = [b for b in (state_dir / "data").rglob("*.blob") if "corrupt" in str(b)]
    for blob in blobs:  # a byte in the middle: tensor data (the start may be padding)
        with open(blob, "r+b") as f:
            f.seek(blob.stat().st_size // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0xFF]))
    out["blobs"] = len(blobs)
    attempt("corrupt", lambda: Run(config(f"{job}/corrupt"), 0).checkpointer.load())

    # The daemon down: a save, and building the manager (a run starting), name the socket.
    os.kill(int(os.environ["CKPTD_PID"]), signal.SIGKILL)
    attempt("down_save", lambda: save_and_wait(corrupt, 2))
    attempt("down_build", lambda: Run(config(job), 0))

    # The daemon restarted on its state dir: the same manager saves again (its client
    # reconnects) and that save is "latest". The test's fixture removes this daemon's files.
    from conftest import start_daemon

    flags = os.environ["CKPTD_FLAGS"].split()
    staging = int(os.environ["CKPTD_STAGING_BYTES"])
    again = start_daemon(staging, flags, state_dir=os.environ["CKPTD_STATE_DIR"])
    attempt("restarted_save", lambda: save_and_wait(corrupt, 3))
    out["restarted_latest"] = client.latest(encode_job(f"{job}/corrupt"))
    again.proc.kill()
    return out


def save_and_wait(run: Run, step: int) -> None:
    run.checkpointer.save(step)
    run.checkpointer.maybe_wait_for_saving()


def cli_config(job: str) -> dict[str, Any]:
    """The manager's Config as TorchTitan's ConfigManager parses it: a config_registry function
    sets Trainer.Config.checkpoint to it, and --checkpoint.<field> overrides each field."""
    from dataclasses import field, make_dataclass

    import tyro
    from torchtitan.components.checkpointer import BaseCheckpointManager
    from torchtitan.config.manager import custom_registry

    # Trainer.Config's checkpoint field, without the rest of the trainer.
    default = field(default_factory=lambda: checkpoint_config(job))
    Holder = make_dataclass("Holder", [("checkpoint", BaseCheckpointManager.Config, default)])
    cli = ["--checkpoint.interval", "7", "--checkpoint.async-mode", "async"]
    parsed = tyro.cli(Holder, args=cli, default=Holder(), registry=custom_registry)
    ck = parsed.checkpoint
    return {"type": type(ck).__qualname__, "interval": ck.interval, "async": ck.async_mode}


if __name__ == "__main__":
    main()
