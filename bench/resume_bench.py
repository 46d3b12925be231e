#!/usr/bin/env python3
"""Time to resume: a trainer killed with SIGKILL right after a checkpoint is durable, then a new
trainer process timed from its start to the end of its first training step after restoring.

The trainer is train_bench.py's small GPT with Adam on the CPU (its gpt() and its Checkpointer's
saves). One trial of a system:

  1. a trainer process builds the model, trains --warmup steps (Adam's state exists), saves a
     checkpoint, waits until it is durable (ckptd: COMMITTED; DCP: dcp.save returned, its files
     fsynced; torch.save: the file fsynced), prints a checksum of its state and trains on; the
     bench kills it with SIGKILL as soon as it reads that line;
  2. for a cold case the page cache is dropped (bench_common.drop_caches) and then the
     interpreter's and the libraries' files are read back in, untimed, by a throwaway process
     (imports, then reads every file it maps), so that only the checkpoint's bytes are cold, as
     on a node whose trainer died a moment ago;
  3. the bench takes the clock just before it starts the new trainer (Popen); the new process
     imports torch and what its system needs, builds the model and optimizer, restores into
     them and runs one training step, and prints the monotonic time of each of those points.

Systems (--systems, comma-separated; each trial's resumed process is a fresh one):

  none         no checkpoint, no kill: start, build, one step (the floor every resume pays)
  ckptd        the plain client (train_bench's "ckptd" save: flat tensors + the rest as one
               object); the new process allocates Adam's state, then one client.load straight
               into the model's and optimizer's tensors, from a daemon keeping the newest
               checkpoint hot in its RAM tier (the load must report bytes_from_ram = the
               tensors' bytes and bytes_read 0)
  ckptd_cold   the same against a second daemon with --ram_tier_keep_per_job=0, the page cache
               dropped (the load must read the tensors' bytes from storage, none from RAM)
  ckptd_torch  ckptd.torch.save / ckptd.torch.load (model + optimizer through DCP's
               get_state_dict / set_state_dict and ckptd's DCP storage), RAM tier
  dcp_warm     train_bench's "dcp" save (dcp.save to a directory); the new process allocates
               Adam's state and dcp.load()s in place into the model's and optimizer's state dict,
               files in the page cache (just written)
  dcp_cold     the same, page cache dropped
  torch_warm   torch.save of the same state dict, fsynced; torch.load(weights_only=True), then
               model.load_state_dict and optimizer.load_state_dict; page cache warm
  torch_cold   the same, page cache dropped

Before the timed rounds each system runs one verification trial (not timed): the new process
prints a checksum of its restored state (parameters, buffers, Adam's moments and step counts,
lr) before its first step, which must equal the one the killed trainer printed. The timed rounds
interleave the systems, the order rotating every round. Writes one JSON line per trial to --out
and prints a markdown table of medians and per-round ratios.

Usage: resume_bench.py --daemon BUILD/ckptd [--rounds 5] [--systems ...] [--out F]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SYSTEMS = ["none", "ckptd", "ckptd_cold", "ckptd_torch", "dcp_warm", "dcp_cold", "torch_warm",
           "torch_cold"]  # fmt: skip
COLD = {"ckptd_cold", "dcp_cold", "torch_cold"}
# What a system is compared with: the peer with its bytes equally far away (RAM / page cache, or
# on the device only).
PEER_TEMP = {"ckptd": "warm", "ckptd_torch": "warm", "dcp_warm": "warm", "torch_warm": "warm",
             "ckptd_cold": "cold", "dcp_cold": "cold", "torch_cold": "cold"}  # fmt: skip
SAVE_AS = {"ckptd": "ckptd", "ckptd_cold": "ckptd", "dcp_warm": "dcp", "dcp_cold": "dcp",
           "torch_warm": "torch_save", "torch_cold": "torch_save"}  # fmt: skip
MARK = "RESUME "  # prefix of the children's JSON lines on stdout


# --- the trainer processes -----------------------------------------------------------------------
def _emit(**kw: Any) -> None:
    print(MARK + json.dumps(kw), flush=True)


def _model(args: argparse.Namespace) -> tuple[Any, Any]:
    import torch
    from train_bench import gpt

    torch.manual_seed(0)
    model = gpt(args.vocab, args.dim, args.layers, args.heads, args.seq)
    return model, torch.optim.Adam(model.parameters(), lr=1e-4)


def _step(args: argparse.Namespace, model: Any, opt: Any, i: int) -> None:
    import torch

    g = torch.Generator().manual_seed(i)
    d = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
    loss = torch.nn.functional.cross_entropy(model(d[:, :-1]).flatten(0, 1), d[:, 1:].flatten())
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()


def _checksum(model: Any, opt: Any) -> str:
    """Of the model's state dict and the optimizer's state (moments, step counts) and lr."""
    import torch

    h = hashlib.blake2b(digest_size=16)

    def add(name: str, t: torch.Tensor) -> None:
        h.update(name.encode())
        h.update(t.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())

    for k, t in model.state_dict().items():
        add(k, t)
    osd = opt.state_dict()
    for pid in sorted(osd["state"]):
        for k in sorted(osd["state"][pid]):
            add(f"{pid}.{k}", torch.as_tensor(osd["state"][pid][k], dtype=torch.float32))
    h.update(repr([g["lr"] for g in osd["param_groups"]]).encode())
    return h.hexdigest()


def _tensor_bytes(model: Any, opt: Any) -> int:
    """The bytes of the checkpoint's tensor items (train_bench's flat: numel > 1)."""
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values() if t.numel() > 1)
    for st in opt.state.values():
        n += sum(v.numel() * v.element_size() for v in st.values() if v.numel() > 1)
    return n


def train_child(args: argparse.Namespace) -> None:
    """Trains, checkpoints once, reports when it is durable, trains on until killed."""
    from train_bench import Checkpointer

    model, opt = _model(args)
    for i in range(args.warmup):
        _step(args, model, opt, i)
    t0 = time.monotonic()
    if args.system == "ckptd_torch":
        import ckptd.torch

        ckptd.torch.save(model, opt, args.ckpt_step, job="resume", socket=args.sock)  # COMMITTED
    else:
        ck = Checkpointer(SAVE_AS[args.system], args.dir, args.sock, model, opt)
        ck.save(args.ckpt_step)
        ck.drain()  # ckptd: COMMITTED; dcp and torch_save are durable when save returns
    _emit(event="durable", save_s=time.monotonic() - t0, checksum=_checksum(model, opt),
          tensor_bytes=_tensor_bytes(model, opt))  # fmt: skip
    i = args.warmup
    while True:  # killed here, in the middle of the next steps
        _step(args, model, opt, i)
        i += 1


def _alloc_adam(model: Any, opt: Any) -> None:
    """Adam's state, allocated for an in-place restore (what Adam's first step would create)."""
    import torch

    for p in model.parameters():
        opt.state[p] = {
            "step": torch.tensor(0.0),
            "exp_avg": torch.empty_like(p, memory_format=torch.preserve_format),
            "exp_avg_sq": torch.empty_like(p, memory_format=torch.preserve_format),
        }


def _put(node: Any, name: str, value: Any) -> None:
    """Sets the leaf train_bench's flat() named `name` ("state.optim.state.0.step": keys joined
    by dots, keys that may hold dots themselves) in the nested state dict `node`."""
    rest = name
    while True:
        for k in node:
            ks = str(k)
            if rest == ks:
                node[k] = value
                return
            if rest.startswith(ks + "."):
                node, rest = node[k], rest[len(ks) + 1 :]
                break
        else:
            raise KeyError(f"resume_bench: {name} is not in the state dict")


def resume_child(args: argparse.Namespace) -> None:
    """Imports, builds, restores, runs one step; prints the monotonic time of each point and the
    restore's parts."""
    t_main = time.monotonic()
    import torch
    from train_bench import Checkpointer

    if args.system in ("ckptd", "ckptd_cold"):
        import ckptd
    elif args.system == "ckptd_torch":
        import ckptd.torch
    elif args.system.startswith("dcp"):
        import torch.distributed.checkpoint as dcp
    t_import = time.monotonic()
    model, opt = _model(args)
    t_build = time.monotonic()
    counts: dict[str, int] = {}
    parts: dict[str, float] = {}
    t = t_build

    def part(name: str) -> None:
        nonlocal t
        now = time.monotonic()
        parts[name] = now - t
        t = now

    path = os.path.join(args.dir, SAVE_AS.get(args.system, ""), f"step-{args.ckpt_step}")
    if args.system in ("ckptd", "ckptd_cold"):
        client = ckptd.connect(args.sock)  # maps the daemon's arena
        part("connect")
        _alloc_adam(model, opt)
        tensors, _ = Checkpointer("none", "", "", model, opt).flat()
        part("alloc")
        res = client.load("train", args.ckpt_step, tensors, objects=["rest"])
        part("load")
        sd = {"state": {"model": model.state_dict(), "optim": opt.state_dict()}}
        for name, value in res.objects["rest"].items():
            _put(sd, name, value)
        opt.load_state_dict(sd["state"]["optim"])
        part("apply")
        counts = {"bytes_read": res.bytes_read, "bytes_from_ram": res.bytes_from_ram}
    elif args.system == "ckptd_torch":
        ckptd.torch.load(model, opt, args.ckpt_step, job="resume", socket=args.sock)
        part("load")
    elif args.system.startswith("dcp"):
        _alloc_adam(model, opt)
        sd = {"model": model.state_dict(), "optim": opt.state_dict()}
        part("alloc")
        dcp.load(sd, checkpoint_id=path)  # in place into the existing tensors
        part("load")
        opt.load_state_dict(sd["optim"])
        part("apply")
    elif args.system.startswith("torch"):
        sd = torch.load(os.path.join(path, "state.pt"), weights_only=True)
        part("load")
        model.load_state_dict(sd["model"])
        opt.load_state_dict(sd["optim"])
        del sd
        part("apply")
    t_restore = time.monotonic()
    checksum = _checksum(model, opt) if args.verify else None
    t_step0 = time.monotonic()
    _step(args, model, opt, args.warmup)
    t_step = time.monotonic()
    with open("/proc/self/io") as f:
        io = {ln.split(":")[0]: int(ln.split()[1]) for ln in f}
    _emit(event="step1", t_main=t_main, t_import=t_import, t_build=t_build, t_restore=t_restore,
          t_step0=t_step0, t_step=t_step, checksum=checksum, own_read_bytes=io["read_bytes"],
          parts=parts, **counts)  # fmt: skip


# --- the bench (parent) --------------------------------------------------------------------------
def _child_cmd(args: argparse.Namespace, role: str, system: str, sock: str, step: int) -> list[str]:
    return [
        sys.executable, str(Path(__file__).resolve()), "--role", role, "--system", system,
        "--sock", sock, "--dir", os.path.join(args.work, "files"), "--ckpt-step", str(step),
        "--vocab", str(args.vocab), "--dim", str(args.dim), "--layers", str(args.layers),
        "--heads", str(args.heads), "--seq", str(args.seq), "--batch", str(args.batch),
        "--warmup", str(args.warmup),
    ]  # fmt: skip


def _read_event(proc: subprocess.Popen, event: str, what: str) -> dict[str, Any]:
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(MARK):
            got = json.loads(line[len(MARK) :])
            if got.get("event") == event:
                return got
    proc.wait()
    sys.exit(
        f"resume_bench: {what} exited ({proc.returncode}) before '{event}'; see *.children.log"
    )


def prewarm_child() -> None:
    """Imports what the trainers import, then reads every regular file this process maps from
    start to end: an import alone leaves most of libtorch's code (which the first step runs) on
    the device."""
    import numpy  # noqa: F401
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    import train_bench  # noqa: F401

    import ckptd.torch  # noqa: F401

    with open("/proc/self/maps") as f:
        paths = {ln.split()[-1] for ln in f if ln.split()[-1].startswith("/")}
    for p in paths:
        if os.path.isfile(p):
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def _prewarm(log: Any) -> None:
    """The interpreter's and the libraries' files back in the page cache (untimed)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--role", "prewarm"]
    subprocess.run(cmd, check=True, stdout=log, stderr=log)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="bench", choices=["bench", "train", "resume", "prewarm"])
    ap.add_argument("--daemon", default=str(HERE.parent / "build" / "ckptd"))
    ap.add_argument("--work", default=None, help="work dir (default: a temporary one in bench/)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--systems", default=",".join(SYSTEMS))
    ap.add_argument("--arena-mib", type=int, default=512, help="each daemon's staging arena")
    ap.add_argument("--out", default=str(HERE / "results" / "resume.jsonl"))
    # The model (train_bench.py's: 13.4M parameters, 161 MB with Adam's moments).
    from train_bench import add_model_args

    add_model_args(ap)
    ap.add_argument("--warmup", type=int, default=1)
    # The children's.
    ap.add_argument("--system", default="")
    ap.add_argument("--sock", default="")
    ap.add_argument("--dir", default="")
    ap.add_argument("--ckpt-step", type=int, default=0)
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--table", default=None, help="only print the table of this results file")
    args = ap.parse_args()
    if args.table:
        with open(args.table) as f:
            rows = [json.loads(line) for line in f]
        table(rows, [s for s in SYSTEMS if any(r["system"] == s for r in rows)])
        return
    sys.path.insert(0, str(HERE))
    if args.role == "train":
        train_child(args)
        return
    if args.role == "resume":
        resume_child(args)
        return
    if args.role == "prewarm":
        prewarm_child()
        return
    run_bench(args)


def run_bench(args: argparse.Namespace) -> None:
    from bench_common import device_read_bytes, drop_caches, start_daemon

    import ckptd

    systems = args.systems.split(",")
    unknown = set(systems) - set(SYSTEMS)
    if unknown:
        sys.exit(f"resume_bench: unknown systems {sorted(unknown)}")
    args.work = args.work or tempfile.mkdtemp(prefix="resume-", dir=HERE)
    shutil.rmtree(args.work, ignore_errors=True)
    for d in ("ram", "cold", "files"):
        os.makedirs(os.path.join(args.work, d))
    arena = args.arena_mib << 20
    ram, ram_sock = start_daemon(args.daemon, os.path.join(args.work, "ram"), arena)
    cold, cold_sock = start_daemon(
        args.daemon, os.path.join(args.work, "cold"), arena, ("--ram_tier_keep_per_job=0",)
    )
    daemons = {"ckptd": (ram, ram_sock), "ckptd_torch": (ram, ram_sock),
               "ckptd_cold": (cold, cold_sock)}  # fmt: skip
    log_path = os.path.splitext(args.out)[0] + ".children.log"  # kept: the children's stderr
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    log = open(log_path, "w")
    rows: list[dict[str, Any]] = []
    step = 100

    def trial(system: str, rnd: int, verify: bool) -> dict[str, Any]:
        nonlocal step
        step += 1
        proc, sock = daemons.get(system, (None, ""))
        job = "resume" if system == "ckptd_torch" else "train"
        row: dict[str, Any] = {"system": system, "round": rnd, "verify": verify}
        if system != "none":
            tr = subprocess.Popen(_child_cmd(args, "train", system, sock, step),
                                  stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip
            saved = _read_event(tr, "durable", f"the {system} trainer")
            tr.send_signal(signal.SIGKILL)
            tr.wait()
            row.update(save_s=saved["save_s"], tensor_bytes=saved["tensor_bytes"])
            if proc is not None:
                with ckptd.connect(sock) as c:
                    tiers = c.status(job, step)["tiers"]
                if bool(tiers.get("ram")) == (system == "ckptd_cold"):
                    sys.exit(f"resume_bench: {system} {job}/{step} tiers {tiers}")
                row["tiers"] = sorted(k for k, v in tiers.items() if v)
        if system in COLD:
            drop_caches(args.work)
            _prewarm(log)
        read0 = device_read_bytes(proc.pid) if proc is not None else 0
        cmd = _child_cmd(args, "resume", system, sock, step) + (["--verify"] if verify else [])
        t0 = time.monotonic()
        rp = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
        got = _read_event(rp, "step1", f"the resumed {system} trainer")
        rp.wait()
        if proc is not None:
            row["daemon_read_bytes"] = device_read_bytes(proc.pid) - read0
        row.update(
            total_s=got["t_step"] - t0 - (got["t_step0"] - got["t_restore"]),
            start_s=got["t_main"] - t0,
            import_s=got["t_import"] - got["t_main"],
            build_s=got["t_build"] - got["t_import"],
            restore_s=got["t_restore"] - got["t_build"],
            step1_s=got["t_step"] - got["t_step0"],
            own_read_bytes=got["own_read_bytes"],
            parts=got["parts"],
        )
        for k in ("bytes_read", "bytes_from_ram"):
            if k in got:
                row[k] = got[k]
        tb = row.get("tensor_bytes", 0)
        if system == "ckptd" and (got["bytes_read"] != 0 or got["bytes_from_ram"] != tb):
            sys.exit(f"resume_bench: ckptd read {got['bytes_read']}, {got['bytes_from_ram']} "
                     f"from RAM (want 0, {tb})")  # fmt: skip
        if system == "ckptd_cold" and (got["bytes_read"] < tb or got["bytes_from_ram"] != 0):
            sys.exit(f"resume_bench: ckptd_cold read {got['bytes_read']}, "
                     f"{got['bytes_from_ram']} from RAM (want >= {tb}, 0)")  # fmt: skip
        if verify and system != "none" and got["checksum"] != saved["checksum"]:
            sys.exit(f"resume_bench: {system}'s restored state differs from the saved one")
        # Outside the clock: the checkpoint goes.
        if proc is not None:
            with ckptd.connect(sock) as c:
                c.delete(job, step)
        shutil.rmtree(os.path.join(args.work, "files"), ignore_errors=True)
        rows.append(row)
        print(
            f"round {rnd:>2} {system:<12} total {row['total_s']:6.3f} s  start "
            f"{row['start_s']:.3f}  import {row['import_s']:.3f}  build {row['build_s']:.3f}  "
            f"restore {row['restore_s']:.3f} ("
            + " ".join(f"{k} {v:.3f}" for k, v in row["parts"].items())
            + f")  step1 {row['step1_s']:.3f}"
            + ("  (verified)" if verify and system != "none" else ""),
            flush=True,
        )
        return row

    try:
        for system in systems:  # once each, untimed: the restored state must equal the saved one
            trial(system, -1, True)
        for r in range(args.rounds):
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            for system in order:
                trial(system, r, False)
    finally:
        log.close()
        for p in (ram, cold):
            p.terminate()
            p.wait(timeout=60)
        shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    table(rows, systems)


def table(rows: list[dict[str, Any]], systems: list[str]) -> None:
    """Medians over the timed rounds; ratios are per round (the peer's time / this system's, the
    peer holding its bytes equally far away: RAM or page cache, or only the device), then the
    median of those."""
    timed = [r for r in rows if not r["verify"]]
    for r in timed:
        r["restored_s"] = r["total_s"] - r["step1_s"]
    by = {(r["system"], r["round"]): r for r in timed}
    rounds = sorted({r["round"] for r in timed})

    def vals(system: str, key: str) -> list[float]:
        return [by[(system, r)][key] for r in rounds if (system, r) in by]

    def med(system: str, key: str) -> float:
        return statistics.median(vals(system, key))

    def ratio(system: str, peer: str, key: str) -> str:
        xs = [by[(peer, r)][key] / by[(system, r)][key] for r in rounds
              if (system, r) in by and (peer, r) in by and by[(system, r)][key] > 0]  # fmt: skip
        return f"{statistics.median(xs):.2f}x" if xs else "-"

    n = next((r["tensor_bytes"] for r in timed if "tensor_bytes" in r), None)
    print(f"\nmedians over {len(rounds)} rounds" + (f", {n / 1e6:.0f} MB of tensors" if n else ""))
    print(
        "| system | start to first step done, s (range) | start to restored | restore (its parts) "
        "| first step | DCP / this: total, to restored, restore "
        "| torch.save / this: total, to restored, restore |"
    )
    print("|---|---|---|---|---|---|---|")
    for s in systems:
        temp = PEER_TEMP.get(s)
        peers = [f"dcp_{temp}", f"torch_{temp}"] if temp else []
        keys = list(by.get((s, rounds[0]), {}).get("parts", {}))
        parts = ", ".join(
            f"{k} {statistics.median(by[(s, r)]['parts'][k] for r in rounds):.3f}" for k in keys
        )
        total = vals(s, "total_s")
        cells = [
            f"{med(s, 'total_s'):.2f} ({min(total):.2f}-{max(total):.2f})",
            f"{med(s, 'restored_s'):.2f}",
            f"{med(s, 'restore_s'):.3f}" + (f" ({parts})" if parts else ""),
            f"{med(s, 'step1_s'):.2f}",
        ]
        for p in peers or ["", ""]:
            cells.append(
                ", ".join(ratio(s, p, k) for k in ("total_s", "restored_s", "restore_s"))
                if p in systems
                else "-"
            )
        print(f"| {s} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
