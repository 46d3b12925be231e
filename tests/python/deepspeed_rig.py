"""One rank of a DeepSpeed training run on CPU over gloo, for test_deepspeed_adapter.py (and the
DeepSpeed benchmarks): a small transformer-like model with a padded vocabulary, a fused QKV
projection, a SwiGLU MLP ([W;V] in one weight), a persistent buffer and a frozen parameter,
trained with AdamW under ZeRO stage 1, 2 or 3 at any data-parallel size.

    python3 deepspeed_rig.py train  --stage 2 --dp 4 --job J --out DIR --tag T
    python3 deepspeed_rig.py resume --stage 3 --dp 2 --job J --out DIR --tag T
    (--via deepspeed --ds_dir D: DeepSpeed's own save_checkpoint / universal load_checkpoint;
     --dims: a bigger model; --no_check: no gather; bench/deepspeed_bench.py uses these)

The global batch of every step is the same whatever the DP size (rows split across the ranks),
so the losses of a run resumed at another layout match up to the order of the sums. Rank 0
writes DIR/full_T.pt (every parameter's full fp32 master and Adam moments, gathered with
DeepSpeed's own safe_get_full_* after the save or the load) and DIR/losses_T.json (the global
loss of each step run after that); every rank writes DIR/times_T.rankN.json (wall-clock times of
its phases and its /proc/self/io). Started by test_deepspeed_adapter.run_ranks with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT set."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

VOCAB, SEQ, GLOBAL_BATCH = 50, 8, 8
SMALL = "32,48,64,1"  # --dims: hidden, ffn, padded vocabulary, layers (the tests' model)
PADDED = ("embed.weight", "head.weight")  # their rows past VOCAB are padding


class Block(nn.Module):
    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)  # fused [Q; K; V]
        self.proj = nn.Linear(hidden, hidden)
        self.fc1 = nn.Linear(hidden, 2 * ffn)  # SwiGLU's [W; V]
        self.fc2 = nn.Linear(ffn, hidden)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        mask = torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
        att = (q @ k.transpose(1, 2) / q.shape[-1] ** 0.5).masked_fill(~mask, float("-inf"))
        h = h + self.proj(att.softmax(-1) @ v)
        w, gate = self.fc1(self.norm(h)).chunk(2, dim=-1)
        return h + self.fc2(nn.functional.silu(w) * gate)


class Model(nn.Module):
    def __init__(self, dims: str = SMALL) -> None:
        super().__init__()
        hidden, ffn, vocab_padded, layers = (int(d) for d in dims.split(","))
        self.embed = nn.Embedding(vocab_padded, hidden)  # rows >= VOCAB are padding
        self.layers = nn.ModuleList(Block(hidden, ffn) for _ in range(layers))
        self.head = nn.Linear(hidden, vocab_padded, bias=False)
        self.register_buffer("position", torch.linspace(0.0, 1.0, SEQ))
        self.gain = nn.Parameter(torch.full((hidden,), 0.5), requires_grad=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) + self.position[None, :, None] * self.gain
        for layer in self.layers:
            h = layer(h)
        return self.head(h)[..., :VOCAB]  # padding rows never score


def rank_envs(dp: int, socket: str, threads: int = 1) -> list[dict[str, str]]:
    """The environment of each of dp ranks of one run: a free loopback port for gloo's
    rendezvous, DeepSpeed on the CPU, ckptd's socket."""
    import socket as socketlib

    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE=str(dp))
    env.update(GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS=str(threads), DS_ACCELERATOR="cpu")
    env["CKPTD_SOCKET"] = socket
    return [dict(env, RANK=str(r), LOCAL_RANK=str(r)) for r in range(dp)]


def batch(step: int, rank: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ + 1), generator=g)
    rows = GLOBAL_BATCH // dp
    mine = tokens[rank * rows : (rank + 1) * rows]
    return mine[:, :-1], mine[:, 1:]


def engine_for(
    stage: int,
    dp: int,
    seed: int,
    *,
    perturb: bool = False,
    dims: str = SMALL,
    universal: bool = False,
) -> Any:
    """A fresh engine; perturb: other values in the buffer and the frozen parameter too (a
    resume must load them); universal: configured to load DeepSpeed's universal checkpoints."""
    import deepspeed

    torch.manual_seed(seed)
    model = Model(dims)
    if perturb:
        model.position.fill_(-1.0)
        model.gain.data.fill_(9.0)
    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=3e-3, weight_decay=0.01
    )
    config = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // dp,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 30,
        "checkpoint": {"load_universal": universal},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def train_step(engine: Any, step: int, rank: int, dp: int) -> float:
    import deepspeed.comm as dist

    x, y = batch(step, rank, dp)
    logits = engine(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
    engine.backward(loss)
    engine.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return float(total) / dp


def full_state(engine: Any) -> dict[str, torch.Tensor]:
    """Every trainable parameter's full fp32 master and Adam moments (collective)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out = {}
    for name, p in engine.module.named_parameters():
        if not p.requires_grad:
            continue
        out[f"fp32/{name}"] = safe_get_full_fp32_param(p).clone()
        for key in ("exp_avg", "exp_avg_sq"):
            out[f"optim/{key}/{name}"] = safe_get_full_optimizer_state(p, key).clone()
    return out


def io_counters() -> dict[str, int]:
    """This process's /proc/self/io: rchar/wchar (bytes through read/write calls, page cache
    included) and read_bytes/write_bytes (the device's)."""
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("train", "resume"))
    p.add_argument("--stage", type=int, required=True)
    p.add_argument("--dp", type=int, required=True)
    p.add_argument("--job", default="ds")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", required=True)
    p.add_argument("--train_steps", type=int, default=3)
    p.add_argument("--next_steps", type=int, default=2)
    p.add_argument("--dims", default=SMALL, help="hidden,ffn,padded vocabulary,layers")
    p.add_argument(
        "--via",
        choices=("ckptd", "deepspeed"),
        default="ckptd",
        help="train: save through ckptd.deepspeed, or DeepSpeed's save_checkpoint into "
        "--ds_dir; resume: load through ckptd.deepspeed, or DeepSpeed's load_checkpoint of the "
        "universal checkpoint --ds_dir (the folder ds_to_universal wrote)",
    )
    p.add_argument("--ds_dir", type=Path)
    p.add_argument("--no_check", action="store_true", help="no full-state gather (benchmarks)")
    p.add_argument(
        "--padded",
        action="store_true",
        help="declare the vocabulary padding (embed and head rows past VOCAB) to ckptd.deepspeed",
    )
    args = p.parse_args()
    started = time.time()

    import deepspeed
    import deepspeed.ops

    # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce for inference at
    # init_distributed (minutes of g++ on a small machine, racing between ranks); ZeRO training
    # over gloo never calls it.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    import deepspeed.comm as dist

    import ckptd
    import ckptd.deepspeed as ckds
    from ckptd.layouts import Layouts, Padded

    layouts = Layouts({n: Padded(0, VOCAB) for n in PADDED}) if args.padded else None
    rank = dist.get_rank()
    client = ckptd.connect() if args.via == "ckptd" else None
    times: dict[str, Any] = {"started": started}
    universal = args.mode == "resume" and args.via == "deepspeed"
    seed, perturb = (0, False) if args.mode == "train" else (123, True)  # the load must win
    engine = engine_for(
        args.stage, args.dp, seed, perturb=perturb, dims=args.dims, universal=universal
    )
    times["engine"] = time.time()
    io_engine = io_counters()
    if args.mode == "train":
        for step in range(1, args.train_steps + 1):
            train_step(engine, step, rank, args.dp)
        times["trained"] = time.time()
        if args.via == "ckptd":
            handle = ckds.save(
                engine,
                client,
                args.job,
                args.train_steps,
                client_state={"epoch": 7, "rank": rank},
                layouts=layouts,
            )
            times["staged"] = time.time()
            handle.committed().result()
        else:
            engine.save_checkpoint(str(args.ds_dir), client_state={"epoch": 7, "rank": rank})
        times["saved"] = time.time()
        first = args.train_steps + 1
    else:
        if args.via == "ckptd":
            loaded = ckds.load(engine, client, args.job, layouts=layouts)
            assert loaded.client_state == {"epoch": 7, "rank": 0}, loaded.client_state
            times["bytes_read"] = loaded.bytes_read
            times["load_seconds"] = loaded.seconds
            first = loaded.step + 1
        else:
            path, _ = engine.load_checkpoint(str(args.ds_dir.parent), tag=args.ds_dir.name)
            assert path is not None, f"DeepSpeed loaded nothing from {args.ds_dir}"
            first = engine.global_steps + 1
        assert engine.global_steps == first - 1, (engine.global_steps, first)
        times["restored"] = time.time()
        times["io_restore"] = {k: v - io_engine[k] for k, v in io_counters().items()}
    state = {} if args.no_check else full_state(engine)
    if not args.no_check:
        state["buffer/position"] = engine.module.position.clone()
        with deepspeed.zero.GatheredParameters([engine.module.gain], enabled=args.stage == 3):
            state["frozen/gain"] = engine.module.gain.detach().clone()
    losses = []
    for s in range(first, first + args.next_steps):
        losses.append(train_step(engine, s, rank, args.dp))
        times.setdefault("first_step", time.time())
    times["io"] = io_counters()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"times_{args.tag}.rank{rank}.json").write_text(json.dumps(times))
    if rank == 0:
        if state:
            torch.save(state, args.out / f"full_{args.tag}.pt")
        (args.out / f"losses_{args.tag}.json").write_text(json.dumps(losses))
    dist.barrier()
    if client is not None:
        client.close()
    sys.stdout.flush()
    os._exit(0)  # see conftest.run_rank: gloo's teardown can abort a clean exit


if __name__ == "__main__":
    main()
