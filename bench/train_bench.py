"""Training-loop overhead of checkpointing: a small GPT with Adam on the CPU, checkpointed every
--every steps by each system, against the same steps with no checkpoint, in one run.

One process trains one model. The run is a sequence of blocks of --every steps; each block starts
with one system's checkpoint ("none": no checkpoint), and the systems take turns block by block (the
order rotating every round), so drift on the machine hits all of them alike. A block is timed
from the checkpoint call, through the --every training steps that follow it, to the end of that
checkpoint's background work: a training loop waits for it at its next checkpoint at the latest
(as it must, to bound memory), and an asynchronous system's interference with the steps counts.
Overhead per checkpoint = block time - the same round's "none" block time, median over rounds.

Writes one JSON line per block to --out/train.jsonl.

--continuous STEPS (the every-step figures of issue 37): each system trains STEPS steps in a row,
checkpointing every --every steps (1: every step) by its own recipe, with several checkpoints in
flight where it allows them (--in-flight for ckptd; DCP's async_save one at a time, as its docs
require); a run is timed from its first step to the end of its last checkpoint's background work.
Overhead per step = (run time - the same round's "none" run) / the "none" run, median over
rounds. Writes --out/train_every<N>.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from ckpt_bench import fio_command, start_daemon  # noqa: E402

SYSTEMS = [
    "none", "io_floor", "ckptd", "ckptd_overlap", "ckptd_dcp", "ckptd_zoc", "dcp_async", "dcp_zoc",
    "dcp", "torch_save", "bytecheckpoint"
]  # fmt: skip
# ckptd_overlap: ckptd's own overlapped save (Client.save(blocking=False), issue 37 §2) issued
# right after optimizer.step(); the copy runs on the client's niced save thread during forward and
# backward, and the loop waits for handle.staged() only before the next optimizer.step().
# *_zoc: DCP's "zero-overhead checkpointing" recipe. async_save returns AsyncSaveResponse; the
# loop runs forward and backward while the state is staged and waits for staging_completion only
# before optimizer.step(), the first thing that changes the state. ckptd_zoc stages through
# ckptd.torch.StorageWriter(async_staging=True) (the staging future completes once the bytes are
# in the daemon, the upload future at COMMITTED); dcp_zoc through DCP's own DefaultStager with
# use_shared_memory and use_async_staging (use_pinned_memory and use_non_blocking_copy too when
# CUDA is present; they require it) and FileSystemWriter.


def state_bytes(model: Any) -> int:
    """Bytes of a checkpoint: the parameters and Adam's two moments of each."""
    return sum(p.numel() * p.element_size() for p in model.parameters()) * 3


def gpt(vocab: int, d: int, layers: int, heads: int, seq: int) -> Any:
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1 = nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
            self.ln2 = nn.LayerNorm(d)
            self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

        def forward(self, x: Any) -> Any:
            h = self.ln1(x)
            x = x + self.attn(h, h, h, attn_mask=self.mask, need_weights=False)[0]
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(seq, d)
            self.blocks = nn.Sequential(*[Block() for _ in range(layers)])
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab, bias=False)

        def forward(self, idx: Any) -> Any:
            pos = torch.arange(idx.shape[1])
            return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))

    return GPT()


class Checkpointer:
    """One system's save, split into start (blocks the loop) and drain (waits for durability)."""

    def __init__(
        self, system: str, base: str, sock: str, model: Any, opt: Any, in_flight: int = 1
    ) -> None:
        self.system, self.base, self.sock = system, base, sock
        self.model, self.opt = model, opt
        # checkpoints whose background work is not waited for yet, oldest first; at most
        # max_pending (ckptd: --in-flight; every other system one, its own recipe's bound)
        self.pendings: list[Any] = []
        self.max_pending = in_flight if system.startswith("ckptd") else 1
        self.staging: Any = None  # *_zoc: waited for before the next optimizer.step()
        self.client: Any = None
        self.stager: Any = None
        if system == "dcp_zoc":
            import torch
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available()
            self.stager = DefaultStager(StagingOptions(cuda, True, True, cuda))
        if system in ("ckptd", "ckptd_overlap"):
            import ckptd

            self.client = ckptd.connect(sock, async_saves_max=max(4, in_flight))

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optim": self.opt.state_dict()}

    def flat(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """Tensors by name and the rest (step counters, hyper-parameters) as objects."""
        import torch

        tensors: dict[str, Any] = {}
        objects: dict[str, Any] = {}

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, torch.Tensor) and obj.numel() > 1:
                tensors[prefix] = obj.detach()
            elif isinstance(obj, dict):
                for k, v in obj.items():
                    walk(f"{prefix}.{k}", v)
            else:
                objects[prefix] = obj

        walk("state", self.state())
        return tensors, objects

    def save(self, step: int) -> None:
        import torch
        import torch.distributed.checkpoint as dcp

        self.before_optimizer_step()
        while len(self.pendings) >= self.max_pending:
            self._finish(self.pendings.pop(0))
        self.pending: Any = None
        path = os.path.join(self.base, self.system, f"step-{step}")
        if self.system == "ckptd":
            tensors, objects = self.flat()
            self.pending = self.client.save("train", step, tensors, objects={"rest": objects})
        elif self.system == "ckptd_overlap":
            tensors, objects = self.flat()
            self.pending = self.client.save(
                "train", step, tensors, objects={"rest": objects}, blocking=False
            )
            self.staging = self.pending.staged()
        elif self.system == "ckptd_dcp":
            from ckptd.torch import StorageWriter

            self.pending = dcp.async_save(
                self.state(),
                storage_writer=StorageWriter(f"train/dcp/step-{step}", socket=self.sock),
            )
        elif self.system == "ckptd_zoc":
            from ckptd.torch import StorageWriter

            writer = StorageWriter(f"train/zoc/step-{step}", socket=self.sock, async_staging=True)
            resp = dcp.async_save(self.state(), storage_writer=writer)
            self.staging, self.pending = resp.staging_completion, resp.upload_completion
        elif self.system == "dcp_zoc":
            resp = dcp.async_save(self.state(), checkpoint_id=path, async_stager=self.stager)
            self.staging, self.pending = resp.staging_completion, resp.upload_completion
        elif self.system == "dcp_async":
            self.pending = dcp.async_save(self.state(), checkpoint_id=path)
        elif self.system == "dcp":
            dcp.save(self.state(), checkpoint_id=path)
        elif self.system == "torch_save":
            os.makedirs(path, exist_ok=True)
            f = os.path.join(path, "state.pt")
            torch.save(self.state(), f)
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        elif self.system == "io_floor":
            # Not a checkpoint system: the durable write every system must do (the state's bytes,
            # O_DIRECT from another process, then fsync), to show what that alone costs the steps.
            os.makedirs(path, exist_ok=True)
            self.pending = subprocess.Popen(
                fio_command(f"{path}/floor.dat", "write", "8M", 8, state_bytes(self.model)),
                stdout=subprocess.DEVNULL,
            )
        elif self.system == "bytecheckpoint":
            from peers import bytecheckpoint_peer as bcp

            bcp.save(path, self.model, self.opt, async_save=True)
        if self.pending is not None:
            self.pendings.append(self.pending)

    def before_optimizer_step(self) -> None:
        """The zero-overhead recipe's wait: the state must be staged before it changes."""
        if self.staging is not None:
            self.staging.result()
            self.staging = None

    def drain(self) -> None:
        self.before_optimizer_step()
        while self.pendings:
            self._finish(self.pendings.pop(0))

    def _finish(self, pending: Any) -> None:
        """Waits for one checkpoint's background work (durable: COMMITTED)."""
        if self.system in ("ckptd", "ckptd_overlap"):
            pending.committed().result()
        elif self.system == "io_floor":
            if pending.wait() != 0:
                raise RuntimeError("fio failed")
        else:
            getattr(pending, "upload_completion", pending).result()

    def close(self) -> None:
        self.drain()
        if self.client is not None:
            self.client.close()
        if self.stager is not None:
            self.stager.close()


class Loop:
    """The model, optimizer, batches and one Checkpointer per system, shared by run_blocks and
    run_continuous: --warmup steps first (Adam state exists before the first checkpoint), then
    one untimed checkpoint per system (first-call costs — imports, connections, thread pools,
    mapping the arena — are paid once per job, not per checkpoint)."""

    def __init__(self, args: argparse.Namespace, sock: str, in_flight: int = 1) -> None:
        import torch

        torch.manual_seed(0)
        self.args, self.sock = args, sock
        self.model = gpt(args.vocab, args.dim, args.layers, args.heads, args.seq)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        self.data = torch.randint(0, args.vocab, (16, args.batch, args.seq + 1))
        for i in range(args.warmup):
            self.step(i)
        self.systems = args.systems.split(",")
        self.cks = {
            s: Checkpointer(s, args.state_dir, sock, self.model, self.opt, in_flight)
            for s in self.systems
            if s != "none"
        }
        if "bytecheckpoint" in self.cks:
            from bytecheckpoint.distributed.rpc_context import setup_rpc_service

            setup_rpc_service()
        for system, ck in self.cks.items():
            ck.save(args.warmup)
            ck.drain()
            _cleanup(args.state_dir, sock, system)

    def step(self, i: int, ck: Checkpointer | None = None) -> None:
        import torch

        x, y = self.data[i % len(self.data), :, :-1], self.data[i % len(self.data), :, 1:]
        loss = torch.nn.functional.cross_entropy(self.model(x).flatten(0, 1), y.flatten())
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        if ck is not None:
            ck.before_optimizer_step()  # the overlapped recipes' one wait
        self.opt.step()

    def order(self, r: int) -> list[str]:
        """Round r's order of the systems (rotated every round)."""
        return self.systems[r % len(self.systems) :] + self.systems[: r % len(self.systems)]

    def close(self) -> None:
        for ck in self.cks.values():
            ck.close()


def run_blocks(args: argparse.Namespace, sock: str) -> list[dict[str, Any]]:
    """One model and optimizer; blocks of --every steps, each block starting with one system's
    checkpoint (or none), the systems interleaved block by block so that drift on the machine
    hits all of them alike. A block is timed from the checkpoint call through the next --every
    steps to the end of that checkpoint's background work (the wait a training loop would have
    at its next checkpoint), so an asynchronous system's interference with training counts."""
    loop = Loop(args, sock)
    i = args.warmup
    rows = []
    for r in range(args.rounds):
        for system in loop.order(r):
            ck = loop.cks.get(system)
            i += args.every
            t0 = time.perf_counter()
            if ck is not None:
                ck.save(i)
            call = time.perf_counter() - t0
            for k in range(args.every):
                loop.step(i + k, ck)
            steps_end = time.perf_counter()
            if ck is not None:
                ck.drain()
            end = time.perf_counter()
            row = {
                "system": system,
                "round": r,
                "block_s": end - t0,
                "call_s": call,
                "wait_s": end - steps_end,
                "steps": args.every,
                "state_bytes": state_bytes(loop.model),
            }
            rows.append(row)
            print(
                f"  round {r} {system:<15} block {row['block_s']:6.3f} s  call {call:6.3f} s  "
                f"wait after the steps {row['wait_s']:6.3f} s",
                flush=True,
            )
            _cleanup(args.state_dir, sock, system)
    loop.close()
    return rows


def run_continuous(args: argparse.Namespace, sock: str) -> list[dict[str, Any]]:
    """Runs of --continuous steps per system, checkpointing every --every steps (see the top);
    the systems interleaved run by run, the order rotating every round."""
    loop = Loop(args, sock, args.in_flight)
    i = args.warmup
    rows = []
    for r in range(args.rounds):
        for system in loop.order(r):
            ck = loop.cks.get(system)
            t0 = time.perf_counter()
            stall = 0.0
            for k in range(args.continuous):
                i += 1
                loop.step(i, ck)
                # The first step of every group of --every: its checkpoint's background work then
                # overlaps the group's other steps (as run_blocks), not just the run's end.
                if ck is not None and k % args.every == 0:
                    c0 = time.perf_counter()
                    ck.save(i)  # right after optimizer.step()
                    stall += time.perf_counter() - c0
            steps_end = time.perf_counter()
            if ck is not None:
                ck.drain()
            end = time.perf_counter()
            row = {
                "system": system,
                "round": r,
                "run_s": end - t0,
                "call_s": stall,
                "wait_s": end - steps_end,
                "steps": args.continuous,
                "every": args.every,
                "state_bytes": state_bytes(loop.model),
            }
            rows.append(row)
            print(
                f"  round {r} {system:<15} run {row['run_s']:6.3f} s  calls {stall:6.3f} s  "
                f"wait after the steps {row['wait_s']:6.3f} s",
                flush=True,
            )
            _cleanup(args.state_dir, sock, system)
    loop.close()
    return rows


def _cleanup(state_dir: str, sock: str, system: str) -> None:
    """Removes the checkpoints a block wrote (outside the timed block)."""
    if system in ("ckptd", "ckptd_overlap", "ckptd_dcp", "ckptd_zoc"):
        _delete_ckptd(sock)
    else:
        shutil.rmtree(os.path.join(state_dir, system), ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def add_model_args(ap: argparse.ArgumentParser) -> None:
    """The model's and the batch's shape (13.4M parameters, 161 MB with Adam's moments), shared
    with resume_bench.py."""
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--state-dir", default=str(ROOT / "bench" / "state-train"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--daemon", default=str(ROOT / "build" / "ckptd"))
    ap.add_argument("--continuous", type=int, default=0, help="steps per run (0: blocks)")
    ap.add_argument("--in-flight", type=int, default=2, help="ckptd checkpoints in flight")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist

    os.environ.setdefault("BYTECHECKPOINT_LOGGING_LEVEL", "ERROR")
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), GLOO_SOCKET_IFNAME="lo"
    )
    dist.init_process_group("gloo", rank=0, world_size=1)
    shutil.rmtree(args.state_dir, ignore_errors=True)
    os.makedirs(os.path.join(args.state_dir, "ckptd"))
    daemon = start_daemon(args.daemon, os.path.join(args.state_dir, "ckptd"), 1 << 30)
    sock = os.path.join(args.state_dir, "ckptd", "ckptd.sock")
    name = f"train_every{args.every}.jsonl" if args.continuous else "train.jsonl"
    out = Path(args.out) / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    print(f"train: torch threads {torch.get_num_threads()}", flush=True)
    try:
        rows = run_continuous(args, sock) if args.continuous else run_blocks(args, sock)
        with open(out, "w") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)
        dist.destroy_process_group()


def _delete_ckptd(sock: str) -> None:
    import ckptd

    with ckptd.connect(sock) as c:
        for j in c.list():
            for ck in c.list(j["job"]):
                c.delete(j["job"], ck["step"])


if __name__ == "__main__":
    main()
