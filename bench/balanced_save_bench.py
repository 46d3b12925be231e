"""Planless saves of a replicated (DDP-like) state: balanced writers against rank 0 writing it all.

--world ranks (gloo, one process each) hold the same --state-mib of fp32 in 16 plain tensors, as
data-parallel replicas do. Each round saves it through dcp.save(..., planner=LocalPlanner(...),
no_dist=True) and ckptd.torch.StorageWriter, with two planners interleaved round by round:

  rank0     LocalPlanner(writer_rank=0): rank 0 copies every tensor into the daemon (the rule
            before balancing; DCP's own dedup also keeps each replicated item on one rank)
  balanced  LocalPlanner(): each tensor by one rank, largest first to the least loaded

Measured per save: the save's wall time on the slowest rank (the stall every rank waits for,
since the next step needs every rank), the bytes each rank sent, and time to committed.
Writes one JSON line per save to --out/balanced_save.jsonl and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket as socketlib
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_common  # noqa: E402 (found through the path above)

MiB = 1 << 20
MODES = ("rank0", "balanced")


def free_port() -> int:
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_main(rank: int, world: int, sock: str, args: argparse.Namespace, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import ckptd
    import ckptd.torch as ct

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    g = torch.Generator().manual_seed(3)
    n = args.state_mib * MiB // 4 // 16
    state = {f"w{i}": torch.rand(n + i, generator=g) for i in range(16)}
    rows = []
    step = 0
    for rnd in range(args.rounds):
        for mode in MODES if rnd % 2 == 0 else MODES[::-1]:
            step += 1
            planner = ct.LocalPlanner(writer_rank=0) if mode == "rank0" else ct.LocalPlanner()
            writer = ct.StorageWriter(f"bench/balanced/step-{step}", socket=sock, planner=planner)
            dist.barrier()
            t0 = time.monotonic()
            dcp.save(state, storage_writer=writer, planner=planner, no_dist=True)
            wall = time.monotonic() - t0
            sent = sum(state[i.index.fqn].numel() * 4 for i in planner.create_local_plan().items)
            dist.barrier()
            committed = None
            if rank == 0:
                with ckptd.connect(sock) as c:
                    st = c.wait("bench.balanced", step, until="committed", timeout_ms=120000)
                    committed = st.get("timings", {}).get("committed_ms")
            rows.append(
                {"mode": mode, "round": rnd, "rank": rank, "wall_s": wall, "sent": sent,
                 "committed_ms": committed, "world": world, "state_mib": args.state_mib}
            )  # fmt: skip
    with open(os.path.join(out, f"rank{rank}.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--binary", default=os.environ.get("CKPTD_BIN", str(ROOT / "build/ckptd")))
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--state-mib", type=int, default=256, help="the replicated state (256)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=str(ROOT / "bench/results"))
    args = p.parse_args()
    import torch.multiprocessing as mp

    base = tempfile.mkdtemp(prefix="ckptd-balanced-bench-")
    arena = 3 * args.state_mib * MiB
    proc, sock = bench_common.start_daemon(args.binary, base, arena, ("--keep_local=2",))
    rows: list[dict] = []
    try:
        os.environ.update(
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            GLOO_SOCKET_IFNAME="lo",
            OMP_NUM_THREADS="1",
        )
        mp.start_processes(
            rank_main, args=(args.world, sock, args, base), nprocs=args.world, start_method="spawn"
        )
        for r in range(args.world):
            with open(os.path.join(base, f"rank{r}.jsonl")) as f:
                rows += [json.loads(line) for line in f]
    finally:
        proc.terminate()
        proc.wait()
        shutil.rmtree(base, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "balanced_save.jsonl"), "a") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    print(f"{args.world} ranks, {args.state_mib} MiB replicated on each, {args.rounds} rounds")
    print("| writers | slowest rank's save (s, median) | most bytes one rank sent (MiB) |")
    print("|---|---|---|")
    med = {}
    for mode in MODES:
        slowest = [
            max(r["wall_s"] for r in rows if r["mode"] == mode and r["round"] == k)
            for k in range(args.rounds)
        ]
        most = max(r["sent"] for r in rows if r["mode"] == mode)
        med[mode] = bench_common.median(slowest)
        print(f"| {mode} | {med[mode]:.3f} | {most / MiB:.1f} |")
    print(f"balanced / rank0: slowest rank's save {med['balanced'] / med['rank0']:.2f}x")


if __name__ == "__main__":
    main()
