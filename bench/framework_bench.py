"""Training-loop overhead per checkpoint through the frameworks' own checkpoint paths, in one run:
TorchTitan's CheckpointManager (DCP async_save to a local folder) against
ckptd.torchtitan.CkptdCheckpointManager, and Lightning's default TorchCheckpointIO against
ckptd.lightning's AsyncCheckpointIO and CheckpointIO.

TorchTitan: the llama3 debug model as tests/python/torchtitan_rig.py builds it (SDPA attention,
FSDP2 fully_shard on a 1-rank gloo mesh, AdamW; 74 MB of checkpointed state),
--titan-steps steps, saved every --titan-every steps with async_mode="async" by
  dcp_async  TorchTitan's CheckpointManager (dcp.async_save, FileSystemWriter, a local folder)
  ckptd      CkptdCheckpointManager on ckptd://bench/titan (the same async mode)
  none       no checkpoint (the baseline)
Lightning: an MLP LightningModule with Adam (--lit-width, --lit-layers), fit for --lit-steps
steps, ModelCheckpoint(every_n_train_steps=--lit-every, save_top_k=-1) with
  torch_io     Lightning's default TorchCheckpointIO, ModelCheckpoint on a local folder
  ckptd_async  ckptd.lightning.AsyncCheckpointIO, ckptd.lightning.ModelCheckpoint on ckptd://
  ckptd_sync   ckptd.lightning.CheckpointIO (returns at COMMITTED), the same ModelCheckpoint
  none         no ModelCheckpoint (the baseline)

A loop is timed from its first step to the end of its last checkpoint's background work (the
manager's maybe_wait_for_saving(); Lightning's fit returns after CheckpointIO.teardown()), so an
asynchronous save's interference with the steps counts. Configurations take turns loop by loop,
the order rotating every repetition, so drift on the machine hits them alike; each has one
untimed loop first (imports, process groups, connections). Checkpoints are removed between
loops, untimed. Overhead per checkpoint = (median loop time - median baseline loop time) /
checkpoints per loop ("paired": the median over repetitions of (loop - the same repetition's
baseline) / checkpoints); the step time is the baseline's median loop time / steps.

Writes one JSON line per loop to --out/framework.jsonl and prints the medians (--report FILE
prints them from such a file).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests" / "python"))

from bench_common import start_daemon  # noqa: E402

TITAN_SYSTEMS = ["dcp_async", "ckptd", "none"]
LIT_SYSTEMS = ["torch_io", "ckptd_async", "ckptd_sync", "none"]
TITAN_JOB = "bench/titan"
LIT_JOB = "bench/lit"


def _delete_all(sock: str) -> None:
    import ckptd

    with ckptd.connect(sock) as c:
        for j in c.list():
            for ck in c.list(j["job"]):
                c.delete(j["job"], ck["step"])


def _state_bytes(tensors: Any) -> int:
    import torch

    total = 0

    def walk(obj: Any) -> None:
        nonlocal total
        if isinstance(obj, torch.Tensor):
            local = getattr(obj, "_local_tensor", obj)  # a DTensor: this rank's shard
            total += local.numel() * local.element_size()
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)

    walk(tensors)
    return total


# --- TorchTitan ---------------------------------------------------------------------------------
class TitanRun:
    """One model, optimizer, LR schedulers and train state (as torchtitan_rig.Run builds them),
    one checkpoint manager per system, all on the same state."""

    def __init__(self, args: argparse.Namespace, sock: str, work: str) -> None:
        import torch
        from torchtitan.components.checkpointer import CheckpointManager
        from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw
        from torchtitan_rig import TrainState, debug_model

        from ckptd.torchtitan import CkptdCheckpointManager

        self.args = args
        self.model = debug_model(0)
        self.optimizers = default_adamw(lr=8e-4).build(model_parts=[self.model])
        self.lr_schedulers = LRSchedulersContainer.Config(
            warmup_steps=2, decay_ratio=0.8, decay_type="linear", min_lr_factor=0.0
        ).build(optimizers=self.optimizers, training_steps=1 << 30)
        self.train_state = TrainState()
        self.work = work
        common = dict(
            enable=True, interval=args.titan_every, async_mode="async", keep_latest_k=0,
            last_save_model_only=False,
        )  # fmt: skip
        configs = {
            "dcp_async": CheckpointManager.Config(folder="titan-dcp", **common),
            "ckptd": CkptdCheckpointManager.Config(
                folder=f"ckptd://{TITAN_JOB}", socket=sock, **common
            ),
        }
        self.managers = {
            name: cfg.build(
                dataloader=None,
                model_parts=[self.model],
                optimizers=self.optimizers,
                lr_schedulers=self.lr_schedulers,
                states={"train_state": self.train_state},
                sd_adapter=None,
                base_folder=work,
            )
            for name, cfg in configs.items()
        }
        g = torch.Generator().manual_seed(1)
        self.data = torch.randint(0, 2048, (8, args.titan_batch, args.titan_seq + 1), generator=g)
        self.sock = sock

    def step(self, manager: Any) -> None:
        import torch

        self.train_state.step += 1
        batch = self.data[self.train_state.step % len(self.data)]
        inputs, labels = batch[:, :-1], batch[:, 1:]
        positions = torch.arange(inputs.shape[1]).unsqueeze(0).expand(inputs.shape[0], -1)
        logits = self.model(inputs, positions=positions)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        loss.backward()
        if manager is not None:
            manager.maybe_wait_for_staging()
        self.optimizers.step()
        self.lr_schedulers.step()
        self.optimizers.zero_grad()
        self.train_state.ntokens_seen += inputs.numel()

    def loop(self, system: str, steps: int) -> dict[str, Any]:
        """`steps` steps, the manager's save() after each (it saves every --titan-every),
        through the last save's completion: the loop's seconds, checkpoints saved, seconds in
        save() (staging, and the wait for the previous save) and in the final wait."""
        manager = self.managers.get(system)
        saved, in_save = 0, 0.0
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step(manager)
            if manager is not None:
                s0 = time.perf_counter()
                saved += bool(manager.save(self.train_state.step))
                in_save += time.perf_counter() - s0
        w0 = time.perf_counter()
        if manager is not None:
            manager.maybe_wait_for_saving()
        end = time.perf_counter()
        return {
            "loop_s": end - t0,
            "checkpoints": saved,
            "save_call_s": in_save,
            "final_wait_s": end - w0,
        }

    def clean(self, system: str) -> None:
        if system == "ckptd":
            _delete_all(self.sock)
        elif system == "dcp_async":
            shutil.rmtree(os.path.join(self.work, "titan-dcp"), ignore_errors=True)

    def state_bytes(self) -> int:
        return _state_bytes(
            {"model": self.model.state_dict(), "optim": self.optimizers.state_dict()}
        )

    def close(self) -> None:
        for m in self.managers.values():
            m.close()


def run_titan(args: argparse.Namespace, sock: str, work: str) -> list[dict[str, Any]]:
    run = TitanRun(args, sock, work)
    systems = args.titan_systems.split(",")
    for system in systems:  # untimed: first-call costs, and Adam's state exists
        run.loop(system, args.titan_every)
        run.clean(system)
    rows = []
    for r in range(args.reps):
        order = systems[r % len(systems) :] + systems[: r % len(systems)]
        for system in order:
            t = run.loop(system, args.titan_steps)
            run.clean(system)
            row = {
                "framework": "torchtitan", "system": system, "rep": r, **t,
                "steps": args.titan_steps, "state_bytes": run.state_bytes(),
            }  # fmt: skip
            rows.append(row)
            print(
                f"  titan rep {r} {system:<10} {t['loop_s']:7.3f} s  {t['checkpoints']} ckpts  "
                f"in save() {t['save_call_s']:6.3f} s  final wait {t['final_wait_s']:6.3f} s",
                flush=True,
            )
    run.close()
    return rows


# --- Lightning ----------------------------------------------------------------------------------
def lit_module(width: int, layers: int, batch: int, batches: int) -> Any:
    import lightning.pytorch as pl
    import torch

    class Mlp(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            mods: list[torch.nn.Module] = []
            for _ in range(layers):
                mods += [torch.nn.Linear(width, width), torch.nn.GELU()]
            self.net = torch.nn.Sequential(*mods, torch.nn.Linear(width, 1))
            g = torch.Generator().manual_seed(2)
            x = torch.randn(batch * batches, width, generator=g)
            self.data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))

        def training_step(self, b: Any, _: int) -> Any:
            x, y = b
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.Adam(self.parameters(), lr=1e-4)

        def train_dataloader(self) -> Any:
            return torch.utils.data.DataLoader(self.data, batch_size=batch)

    return Mlp()


def lit_fit(
    args: argparse.Namespace, model: Any, system: str, sock: str, work: str, tag: str
) -> dict[str, Any]:
    """One fit of --lit-steps steps: seconds from on_train_start to fit's return (CheckpointIO's
    teardown, which waits for the saves in flight, included), checkpoints saved and seconds in
    CheckpointIO.save_checkpoint."""
    import lightning.pytorch as pl

    import ckptd.lightning as ckl

    times: dict[str, float] = {}

    class Clock(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            times["t0"] = time.perf_counter()

    saved = [0]
    callbacks: list[Any] = [Clock()]
    plugins: list[Any] = []
    every = dict(every_n_train_steps=args.lit_every, save_top_k=-1)
    if system == "torch_io":
        local = os.path.join(work, "lit", tag)
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=local, **every))
    elif system in ("ckptd_async", "ckptd_sync"):
        kind = ckl.AsyncCheckpointIO if system == "ckptd_async" else ckl.CheckpointIO
        plugins.append(kind(socket=sock))
        callbacks.append(ckl.ModelCheckpoint(dirpath=f"ckptd://{LIT_JOB}/{tag}", **every))

    class Count(pl.Callback):
        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
            saved[0] += 1

    callbacks.append(Count())
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=args.lit_steps, max_epochs=-1,
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=system != "none", callbacks=callbacks, plugins=plugins or None,
        num_sanity_val_steps=0,
    )  # fmt: skip
    in_save = [0.0]
    if system != "none":
        io = trainer.strategy.checkpoint_io
        save = io.save_checkpoint

        def timed(*a: Any, **k: Any) -> Any:
            s0 = time.perf_counter()
            try:
                return save(*a, **k)
            finally:
                in_save[0] += time.perf_counter() - s0

        io.save_checkpoint = timed  # type: ignore[method-assign]
    trainer.fit(model)
    return {
        "loop_s": time.perf_counter() - times["t0"], "checkpoints": saved[0],
        "save_call_s": in_save[0],
    }  # fmt: skip


def run_lightning(args: argparse.Namespace, sock: str, work: str) -> list[dict[str, Any]]:
    import logging

    import lightning.pytorch  # noqa: F401  (its loggers exist once imported)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lightning"):
            logging.getLogger(name).setLevel(logging.ERROR)
    model = lit_module(args.lit_width, args.lit_layers, args.lit_batch, args.lit_every)
    nbytes = _state_bytes(model.state_dict()) * 3  # parameters and Adam's two moments
    systems = args.lit_systems.split(",")

    def clean(system: str) -> None:
        if system.startswith("ckptd"):
            _delete_all(sock)
        shutil.rmtree(os.path.join(work, "lit"), ignore_errors=True)

    n = 0
    for system in systems:  # untimed: first-call costs
        steps, args.lit_steps = args.lit_steps, args.lit_every
        lit_fit(args, model, system, sock, work, f"w{n}")
        args.lit_steps = steps
        clean(system)
        n += 1
    rows = []
    for r in range(args.reps):
        order = systems[r % len(systems) :] + systems[: r % len(systems)]
        for system in order:
            t = lit_fit(args, model, system, sock, work, f"r{n}")
            n += 1
            clean(system)
            row = {
                "framework": "lightning", "system": system, "rep": r, **t,
                "steps": args.lit_steps, "state_bytes": nbytes,
            }  # fmt: skip
            rows.append(row)
            print(
                f"  lightning rep {r} {system:<12} {t['loop_s']:7.3f} s  {t['checkpoints']} ckpts"
                f"  in save_checkpoint {t['save_call_s']:6.3f} s",
                flush=True,
            )
    return rows


# --- report -------------------------------------------------------------------------------------
def report(rows: list[dict[str, Any]], own: dict[str, str]) -> None:
    """Medians per framework and system: overhead per checkpoint from the median loops, and the
    median over repetitions of (loop - the same repetition's baseline) ("paired", which a change
    of the machine's load between repetitions moves less); for ckptd's systems, each as a ratio
    to the framework's own path; and the median time inside the save call per checkpoint."""
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        by.setdefault((row["framework"], row["system"]), []).append(row)
    for fw in dict.fromkeys(r["framework"] for r in rows):
        base_rows = by.get((fw, "none"), [])
        if not base_rows:
            continue
        base = statistics.median(r["loop_s"] for r in base_rows)
        base_of = {r["rep"]: r["loop_s"] for r in base_rows}
        step_s = base / base_rows[0]["steps"]
        lo, hi = min(base_of.values()), max(base_of.values())
        mb = max(r["state_bytes"] for r in rows if r["framework"] == fw) / 1e6
        print(
            f"\n{fw}: {mb:.0f} MB of state, step {step_s * 1e3:.1f} ms (baseline median; "
            f"baseline loops {lo:.2f}-{hi:.2f} s)"
        )
        print(
            "| system | median loop s | ckpts | overhead / ckpt ms | / step time | vs own "
            "| paired overhead / ckpt ms | vs own | in save() / ckpt ms |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        ov: dict[str, tuple[float, float]] = {}
        for (f, system), rs in by.items():
            n = rs[0]["checkpoints"]
            if f != fw or not n:
                continue
            loop = statistics.median(r["loop_s"] for r in rs)
            paired = statistics.median((r["loop_s"] - base_of[r["rep"]]) / n for r in rs)
            ov[system] = ((loop - base) / n, paired)
        ref = ov.get(own[fw])
        for (f, system), rs in by.items():
            n = rs[0]["checkpoints"]
            if f != fw or not n:
                continue
            loop = statistics.median(r["loop_s"] for r in rs)
            (a, b), mine = ov[system], system != own[fw] and ref is not None
            ra = f"{a / ref[0]:.2f}" if mine and ref and ref[0] > 0 else "-"
            rb = f"{b / ref[1]:.2f}" if mine and ref and ref[1] > 0 else "-"
            call = statistics.median(r.get("save_call_s", 0.0) for r in rs) / n
            print(
                f"| {system} | {loop:.3f} | {n} | {a * 1e3:.0f} | {a / step_s:.2f} | {ra} "
                f"| {b * 1e3:.0f} | {rb} | {call * 1e3:.0f} |"
            )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--daemon", default=str(ROOT / "build" / "ckptd"))
    ap.add_argument("--work", default=str(ROOT / "bench" / "state-framework"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--parts", default="torchtitan,lightning")
    ap.add_argument("--titan-systems", default=",".join(TITAN_SYSTEMS))
    ap.add_argument("--titan-steps", type=int, default=20)
    ap.add_argument("--titan-every", type=int, default=5)
    ap.add_argument("--titan-batch", type=int, default=2)
    ap.add_argument("--titan-seq", type=int, default=128)
    ap.add_argument("--lit-systems", default=",".join(LIT_SYSTEMS))
    ap.add_argument("--lit-steps", type=int, default=20)
    ap.add_argument("--lit-every", type=int, default=5)
    ap.add_argument("--lit-width", type=int, default=1024)
    ap.add_argument("--lit-layers", type=int, default=6)
    ap.add_argument("--lit-batch", type=int, default=256)
    ap.add_argument("--report", help="print the tables of this framework.jsonl, run nothing")
    args = ap.parse_args()
    own = {"torchtitan": "dcp_async", "lightning": "torch_io"}
    if args.report:
        report([json.loads(line) for line in open(args.report) if line.startswith("{")], own)
        return

    import torch
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), GLOO_SOCKET_IFNAME="lo",
        RANK="0", WORLD_SIZE="1",
    )  # fmt: skip
    shutil.rmtree(args.work, ignore_errors=True)
    state = os.path.join(args.work, "ckptd")
    os.makedirs(state)
    daemon, sock = start_daemon(args.daemon, state, 1 << 30)
    out = Path(args.out) / "framework.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    print(f"framework: torch threads {torch.get_num_threads()}", flush=True)
    rows: list[dict[str, Any]] = []
    try:
        dist.init_process_group("gloo", rank=0, world_size=1)
        parts = args.parts.split(",")
        if "torchtitan" in parts:
            rows += run_titan(args, sock, args.work)
        if "lightning" in parts:
            rows += run_lightning(args, sock, args.work)
        with open(out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
        report(rows, own)
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(args.work, ignore_errors=True)


if __name__ == "__main__":
    main()
