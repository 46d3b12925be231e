"""Commit latency across nodes: from the last rank staged to COMMITTED visible on every daemon.

Daemons on this machine stand for nodes (own state dir, socket, arena); their shared tier is a
directory (the posix plugin, as on a shared file system). For each configuration, --rounds
checkpoints of --ranks-per-node ranks per node, --mib MiB per rank (one row block of one
float32 tensor each), are saved; every rank's save() returns once staged (journaled), and the
clock runs from the last of those returns until every daemon's status says COMMITTED (polled
every millisecond). Configurations, side by side in one run, rounds interleaved:

  1 node   one daemon holds every rank (the single-node commit, local+remote: the baseline)
  1 node, remote durable   the same, until its upload is DURABLE: the same bytes on the shared
           tier, which a commit across nodes needs before it commits (the second baseline)
  2 nodes  two daemons, the ranks split between them (cluster_poll_ms as given)
  3 nodes  three daemons

Reports the median and max latency per configuration and the ratio to the 1-node median, for
each --poll-ms value (the interval at which a daemon reads the shared tier bounds the latency:
the coordinator's read of the last part, then the others' read of the decision).

Writes one JSON object per configuration to --out/cluster_commit.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import ckptd

COLS = 1024


class Node:
    def __init__(self, daemon: str, shared: str, name: str, poll_ms: int) -> None:
        self.state = tempfile.mkdtemp(prefix=f"ckb-{name}-", dir="/tmp")
        self.socket = os.path.join(self.state, "ckptd.sock")
        flags = [
            f"--state_dir={self.state}",
            f"--remote_dir={shared}",
            "--tier_policy=local+remote",
            f"--node_id={name}",
            f"--cluster_poll_ms={poll_ms}",
            "--staging_bytes_max=1073741824",
            "--log_level=warn",
        ]
        self.log = open(os.path.join(self.state, "ckptd.log"), "w")
        self.proc = subprocess.Popen([daemon, *flags], stdout=self.log, stderr=subprocess.STDOUT)
        for _ in range(200):
            if os.path.exists(self.socket):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{name}: the daemon did not start; see {self.state}/ckptd.log")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        self.log.close()
        shutil.rmtree(self.state, ignore_errors=True)


def one_round(
    clients: list[Any], ranks_per_node: int, rows: int, job: str, step: int, remote: bool = False
) -> float:
    world = ranks_per_node * len(clients)
    w = np.ones((rows, COLS), dtype=np.float32)
    for r in range(world):
        c = clients[r // ranks_per_node]
        shard = ckptd.Shard(
            w, global_shape=(rows * world, COLS), region=ckptd.Box((r * rows, 0), (rows, COLS))
        )
        c.save(job, step, {"w": shard}, rank=r, world_size=world)
    t0 = time.perf_counter()
    pending = set(range(len(clients)))
    while pending:
        for i in list(pending):
            info = clients[i].status(job, step)
            if info["state"] == "COMMITTED" and (not remote or info["tiers"]["remote"]):
                pending.discard(i)
        if pending:
            time.sleep(0.001)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--mib", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--poll-ms", default="200,50")
    args = ap.parse_args()
    rows = args.mib * (1 << 20) // (COLS * 4)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for poll in [int(p) for p in args.poll_ms.split(",")]:
        shared = tempfile.mkdtemp(prefix="ckb-shared-", dir="/tmp")
        configs: dict[int, tuple[list[Node], list[Any]]] = {}
        try:
            for n in (1, 2, 3):
                nodes = [Node(args.daemon, shared, f"n{n}-{i}", poll) for i in range(n)]
                lws = args.ranks_per_node if n > 1 else 0
                clients = [
                    ckptd.connect(x.socket, tier_policy="local+remote", local_world_size=lws)
                    for x in nodes
                ]
                configs[n] = (nodes, clients)
            lat: dict[int, list[float]] = {n: [] for n in configs}
            lat[0] = []  # 1 node, until remote durable
            for rnd in range(args.rounds):
                order = list(configs)
                order = order[rnd % len(order) :] + order[: rnd % len(order)]
                for n in order:
                    # Single node: the same total ranks on its one daemon.
                    rpn = args.ranks_per_node * (1 if n > 1 else 2)
                    lat[n].append(one_round(configs[n][1], rpn, rows, f"commit-{n}", rnd + 1))
                    if n == 1:
                        lat[0].append(
                            one_round(configs[1][1], rpn, rows, "commit-1r", rnd + 1, remote=True)
                        )
        finally:
            for nodes, _ in configs.values():
                for x in nodes:
                    x.stop()
            shutil.rmtree(shared, ignore_errors=True)
        base = statistics.median(lat[1])
        for n, xs in lat.items():
            rec = {
                "bench": "cluster_commit",
                "nodes": n if n else "1 (remote durable)",
                "ranks": args.ranks_per_node * (n if n > 1 else 2),
                "ratio_to_1_node_remote_durable": round(
                    statistics.median(xs) / statistics.median(lat[0]), 2
                ),
                "mib_per_rank": args.mib,
                "cluster_poll_ms": poll,
                "median_ms": round(statistics.median(xs) * 1000, 1),
                "max_ms": round(max(xs) * 1000, 1),
                "ratio_to_1_node": round(statistics.median(xs) / base, 2),
            }
            results.append(rec)
            print(json.dumps(rec), flush=True)
    with open(out / "cluster_commit.jsonl", "w") as f:
        for rec in results:
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
