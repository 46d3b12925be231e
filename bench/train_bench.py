"""Training-loop overhead of checkpointing: a small GPT with Adam on the CPU, checkpointed every
--every steps by each system, against the same loop with no checkpoint, in one run.

Systems are interleaved round by round (none, ckptd, ckptd_dcp, dcp_async, dcp, torch_save,
bytecheckpoint, then again), so drift on the machine hits all of them alike. Asynchronous systems
wait for their previous checkpoint before starting the next one (as a training script must, to
bound memory); that wait is part of the loop. The loop time excludes the drain after the last
step, which is reported separately. Overhead per checkpoint = (loop - loop without checkpoints) /
checkpoints, median over rounds.

Writes one JSON line per (round, system) to --out/train.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from ckpt_bench import start_daemon  # noqa: E402

SYSTEMS = ["none", "ckptd", "ckptd_dcp", "dcp_async", "dcp", "torch_save", "bytecheckpoint"]


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

    def __init__(self, system: str, base: str, sock: str, model: Any, opt: Any) -> None:
        self.system, self.base, self.sock = system, base, sock
        self.model, self.opt = model, opt
        self.pending: Any = None
        self.client: Any = None
        if system == "ckptd":
            import ckptd

            self.client = ckptd.connect(sock)

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

        self.drain()
        path = os.path.join(self.base, self.system, f"step-{step}")
        if self.system == "ckptd":
            tensors, objects = self.flat()
            self.pending = self.client.save("train", step, tensors, objects={"rest": objects})
        elif self.system == "ckptd_dcp":
            from ckptd.torch import StorageWriter

            self.pending = dcp.async_save(
                self.state(),
                storage_writer=StorageWriter(f"train/dcp/step-{step}", socket=self.sock),
            )
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
        elif self.system == "bytecheckpoint":
            from peers import bytecheckpoint_peer as bcp

            bcp.save(path, self.model, self.opt, async_save=True)

    def drain(self) -> None:
        if self.pending is None:
            return
        if self.system == "ckptd":
            self.pending.committed().result()
        else:
            getattr(self.pending, "upload_completion", self.pending).result()
        self.pending = None

    def close(self) -> None:
        self.drain()
        if self.client is not None:
            self.client.close()


def run_loop(system: str, args: argparse.Namespace, sock: str, seed: int) -> dict[str, Any]:
    import torch

    torch.manual_seed(seed)
    model = gpt(args.vocab, args.dim, args.layers, args.heads, args.seq)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    data = torch.randint(0, args.vocab, (args.steps + 1, args.batch, args.seq + 1))
    ck = None if system == "none" else Checkpointer(system, args.state_dir, sock, model, opt)

    def step(i: int) -> None:
        x, y = data[i, :, :-1], data[i, :, 1:]
        loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(args.warmup):  # Adam state exists before the first checkpoint
        step(i)
    if ck is not None and system == "bytecheckpoint":
        from bytecheckpoint.distributed.rpc_context import setup_rpc_service

        setup_rpc_service()
    checkpoints = 0
    t0 = time.perf_counter()
    for i in range(args.steps):
        step(i)
        if ck is not None and (i + 1) % args.every == 0:
            ck.save(i + 1)
            checkpoints += 1
    loop = time.perf_counter() - t0
    drain = 0.0
    if ck is not None:
        t1 = time.perf_counter()
        ck.close()
        drain = time.perf_counter() - t1
    state_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) * 3
    return {
        "system": system,
        "loop_s": loop,
        "drain_s": drain,
        "checkpoints": checkpoints,
        "steps": args.steps,
        "state_bytes": state_bytes,
    }


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--every", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--state-dir", default=str(ROOT / "bench" / "state-train"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--daemon", default=str(ROOT / "build" / "ckptd"))
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
    out = Path(args.out) / "train.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    print(f"train: torch threads {torch.get_num_threads()}", flush=True)
    try:
        for r in range(args.rounds):
            for system in args.systems.split(","):
                row = run_loop(system, args, sock, seed=r)
                row["round"] = r
                row["step_s"] = row["loop_s"] / row["steps"]
                with open(out, "a") as f:
                    f.write(json.dumps(row) + "\n")
                print(
                    f"  round {r} {system:<15} loop {row['loop_s']:7.3f} s  drain "
                    f"{row['drain_s']:6.3f} s  ({row['checkpoints']} checkpoints of "
                    f"{row['state_bytes'] / 1e6:.0f} MB)",
                    flush=True,
                )
                for sub in os.listdir(args.state_dir):
                    if sub != "ckptd":
                        shutil.rmtree(os.path.join(args.state_dir, sub), ignore_errors=True)
                _delete_ckptd(sock)
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
