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
  2 nodes, local+peer   two daemons under tier policy local+peer: each node's part is copied to
           peer_replicas=1 other daemon over the peer channel (gRPC, mutual TLS on loopback;
           certificates from tests/integration/peer_certs.sh), and the store receives only the
           control files (node parts, decision, manifest), no blob
  3 nodes, local+peer   three daemons, the same

The local+peer configurations each have a shared directory of their own: the peer registry
(<store>/.ckptd-peers) is per store, and placement is a ring over every node registered there, so
a store of its own keeps each configuration's parts among its own nodes, as on a real cluster.
Their peer_bytes_max holds four parts (the peer store never evicts the two newest steps of a job:
those, the one arriving, and one spare).

The rounds start once every daemon's staging arena (--staging-mib each, eleven daemons at the
default --nodes) is resident: a daemon faults it in, in the background, after its first client's
Hello, and a round overlapping that measures page faults (seconds on two cores). Any round not
committed within ROUND_TIMEOUT_S, or aborted, fails the bench with the daemons' logs kept
under --out.

Reports the median and max latency per configuration, the ratio to the 1-node median and, for
local+peer, to the same node count under local+remote, for each --poll-ms value (the interval at
which a daemon reads the shared tier bounds the latency: the coordinator's read of the last part,
then the others' read of the decision).

--store s3 puts the shared tier on an S3 store instead: SeaweedFS (`weed`, the `weed server`
command line of bench/remote_bench.py and tests/s3/s3_harness.cc) on loopback, one bucket, each
store above a key prefix of its own in it (--remote_s3_prefix). --nodes picks the node counts
(each under local+remote and local+peer; the 1-node baselines always run).

Writes one JSON object per configuration (each round's latency in rounds_ms) to
--out/cluster_commit.jsonl.
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
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from remote_bench import ACCESS_KEY, BUCKET, SECRET_KEY, s3_client, weed_server

import ckptd
from ckptd._shm import prefix_of, remove_segments

ROOT = Path(__file__).resolve().parents[1]
COLS = 1024
MiB = 1 << 20
# A replicator reads the peer registry again when its copy is older than this
# (daemon/src/peer/replicator.h, kRegistryRefresh): the rounds start once every peer daemon has
# registered and this long after the last one started, so that every node places its part on
# the ring of all of them.
REGISTRY_REFRESH_S = 5.0
# A round not committed by then fails the bench (the daemons' logs are kept in --out).
ROUND_TIMEOUT_S = 120.0


@dataclass
class Peers:
    """The peer tier's options of a daemon under local+peer."""

    certs: str  # ca.pem and NODE.pem / NODE.key for every node id (peer_certs.sh)
    bytes_max: int


@dataclass
class Store:
    """A shared tier: a directory (`where` its path) or a key prefix (`where`) in the bucket of
    the S3 store at `endpoint`."""

    where: str
    endpoint: str = ""

    def flags(self) -> list[str]:
        if not self.endpoint:
            return [f"--remote_dir={self.where}"]
        return [
            f"--remote_s3_endpoint={self.endpoint}",
            f"--remote_s3_bucket={BUCKET}",
            f"--remote_s3_prefix={self.where}",
        ]

    def env(self) -> dict[str, str] | None:
        if not self.endpoint:
            return None
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        return env | {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}

    def keys(self, under: str) -> list[str]:
        """Every file (object key relative to the store) under `under` on the store."""
        if not self.endpoint:
            root = Path(self.where)
            return [str(f.relative_to(root)) for f in (root / under).rglob("*") if f.is_file()]
        client = s3_client(self.endpoint, 1)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=self.where)
        keys = [
            o["Key"][len(self.where) :].lstrip("/") for p in pages for o in p.get("Contents", [])
        ]
        return [k for k in keys if k.startswith(under.rstrip("/") + "/")]


class Node:
    def __init__(
        self,
        daemon: str,
        shared: Store,
        name: str,
        poll_ms: int,
        staging_bytes: int,
        policy: str = "local+remote",
        peers: Peers | None = None,
    ) -> None:
        self.state = tempfile.mkdtemp(prefix=f"ckb-{name}-", dir="/tmp")
        self.socket = os.path.join(self.state, "ckptd.sock")
        flags = [
            f"--state_dir={self.state}",
            *shared.flags(),
            f"--tier_policy={policy}",
            f"--node_id={name}",
            f"--cluster_poll_ms={poll_ms}",
            f"--staging_bytes_max={staging_bytes}",
            "--log_level=warn",
        ]
        if peers is not None:
            flags += [
                "--peer_listen_addr=127.0.0.1:0",
                f"--peer_tls_ca_path={peers.certs}/ca.pem",
                f"--peer_tls_cert_path={peers.certs}/{name}.pem",
                f"--peer_tls_key_path={peers.certs}/{name}.key",
                f"--peer_bytes_max={peers.bytes_max}",
                "--peer_replicas=1",
            ]
        self.log = open(os.path.join(self.state, "ckptd.log"), "w")
        self.proc = subprocess.Popen(
            [daemon, *flags], stdout=self.log, stderr=subprocess.STDOUT, env=shared.env()
        )
        for _ in range(200):
            if os.path.exists(self.socket):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"{name}: the daemon did not start; see {self.state}/ckptd.log")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        remove_segments(self.state)
        shutil.rmtree(self.state, ignore_errors=True)


@dataclass
class Config:
    """One configuration: its daemons, one client per daemon, and its latencies."""

    name: str
    nodes: int
    policy: str
    shared: Store
    daemons: list[Node] = field(default_factory=list)
    clients: list[Any] = field(default_factory=list)
    lat: list[float] = field(default_factory=list)

    @property
    def job(self) -> str:
        return f"commit-{self.nodes}" + ("p" if self.policy == "local+peer" else "")


def make_certs(certs: str, names: list[str]) -> None:
    script = str(ROOT / "tests/integration/peer_certs.sh")
    subprocess.run(["sh", script, "ca", certs, "ca"], check=True)
    for n in names:
        subprocess.run(["sh", script, "node", certs, "ca", n], check=True)


def wait_registered(shared: Store, names: list[str], started: float) -> None:
    """Waits until every node in `names` is in the store's peer registry and the replicators'
    cached registry is stale (REGISTRY_REFRESH_S after `started`)."""
    registry = ".ckptd-peers"
    deadline = time.monotonic() + 30
    while not all(f"{registry}/{n}" in shared.keys(registry) for n in names):
        if time.monotonic() > deadline:
            raise RuntimeError(f"peers {names} did not register in {registry}")
        time.sleep(0.05)
    time.sleep(max(0.0, started + REGISTRY_REFRESH_S + 0.5 - time.monotonic()))


def wait_prefaulted(configs: list[Config], timeout_s: float = 300.0) -> None:
    """Waits until every daemon's staging arena is resident. A daemon faults its arena in
    (--staging-mib) in the background after its first client's Hello; eleven of them (the default
    --nodes) at once on two cores take seconds, and a round that overlaps it measures the page
    faults, not the commit."""
    segments = [(x, Path("/dev/shm"), prefix_of(x.state)) for c in configs for x in c.daemons]
    deadline = time.monotonic() + timeout_s
    for x, shm, prefix in segments:
        while True:
            arenas = [os.stat(f) for f in shm.glob(prefix + "*arena*")]
            if arenas and all(st.st_blocks * 512 >= st.st_size for st in arenas):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the staging arena of {x.state} is not resident")
            time.sleep(0.1)


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
            elif info["state"] not in ("STAGING", "PERSISTING", "COMMITTED"):
                raise RuntimeError(f"{job} step {step} on daemon {i}: {info}")
        if pending and time.perf_counter() - t0 > ROUND_TIMEOUT_S:
            raise RuntimeError(
                f"{job} step {step}: not committed on daemons {sorted(pending)} "
                f"after {ROUND_TIMEOUT_S} s: {clients[min(pending)].status(job, step)}"
            )
        if pending:
            time.sleep(0.001)
    return time.perf_counter() - t0


def check_peer_tier(c: Config, steps: int) -> None:
    """Every step of a local+peer configuration is committed at the peer tier: each node keeps
    its own blobs (local_part), every blob has a peer copy, and the store holds no blob."""
    blobs = sorted(k for k in c.shared.keys(c.job) if k.endswith(".blob"))
    if blobs:
        raise RuntimeError(f"{c.name}: blobs on the store: {blobs[:3]}")
    for step in range(1, steps + 1):
        for i, client in enumerate(c.clients):
            t = client.status(c.job, step)["tiers"]
            if not t["local_part"] or not t["peer_nodes"] or t["blobs_without_peer_copy"]:
                raise RuntimeError(f"{c.name} step {step} on daemon {i}: not at the peer tier: {t}")


def start_configs(
    args: argparse.Namespace, work: str, poll: int, configs: list[Config], endpoint: str
) -> None:
    """Appends to `configs` (filled first, so that the caller stops what a failure leaves
    started) 1 node and each of --nodes under local+remote on one store, and each of --nodes under
    local+peer, each on a store of its own (a directory, or an S3 prefix when `endpoint`); the
    first is the 1-node baseline."""

    def store(name: str) -> Store:
        if endpoint:
            return Store(f"{os.path.basename(work)}/{name}", endpoint)
        return Store(tempfile.mkdtemp(prefix=f"{name}-", dir=work))

    shared = store("shared-r")
    configs += [
        Config(f"{n} node{'s' if n > 1 else ''}", n, "local+remote", shared)
        for n in (1, *args.nodes)
    ]
    for n in args.nodes:
        configs.append(Config(f"{n} nodes, local+peer", n, "local+peer", store(f"shared-p{n}")))
    certs = os.path.join(work, "certs")
    part = args.ranks_per_node * args.mib * MiB
    peers = Peers(certs=certs, bytes_max=4 * part)
    staging = args.staging_mib * MiB
    started = time.monotonic()
    for c in configs:
        p = peers if c.policy == "local+peer" else None
        prefix = "p" if p else "n"
        for i in range(c.nodes):
            name = f"{prefix}{c.nodes}-{i}"
            c.daemons.append(Node(args.daemon, c.shared, name, poll, staging, c.policy, p))
        lws = args.ranks_per_node if c.nodes > 1 else 0
        c.clients = [
            ckptd.connect(x.socket, tier_policy=c.policy, local_world_size=lws) for x in c.daemons
        ]
        if p:
            started = time.monotonic()
    for c in configs:
        if c.policy == "local+peer":
            names = [f"p{c.nodes}-{i}" for i in range(c.nodes)]
            wait_registered(c.shared, names, started)
    wait_prefaulted(configs)


def keep_logs(configs: list[Config], to: Path) -> None:
    """Copies every daemon's log to `to` (a failed round: the state dirs go when they stop)."""
    to.mkdir(parents=True, exist_ok=True)
    for c in configs:
        for x in c.daemons:
            x.log.flush()
            shutil.copy(os.path.join(x.state, "ckptd.log"), to / f"{Path(x.state).name}.log")
    print(f"cluster_commit: daemon logs in {to}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--mib", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--poll-ms", default="200,50")
    # Each of the 11 daemons (default --nodes) faults its arena in whole: 11 GiB at the default.
    ap.add_argument("--staging-mib", type=int, default=1024, help="each daemon's staging arena")
    ap.add_argument("--nodes", default="2,3", help="node counts, each local+remote and local+peer")
    ap.add_argument("--store", choices=("dir", "s3"), default="dir", help="the shared tier")
    ap.add_argument("--weed", default=shutil.which("weed") or "weed")
    args = ap.parse_args()
    args.nodes = [int(n) for n in args.nodes.split(",")]
    rows = args.mib * MiB // (COLS * 4)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for poll in [int(p) for p in args.poll_ms.split(",")]:
        work = tempfile.mkdtemp(prefix="ckb-cluster-", dir="/tmp")
        configs: list[Config] = []
        stack = ExitStack()
        try:
            names = [f"p{n}-{i}" for n in args.nodes for i in range(n)]
            make_certs(os.path.join(work, "certs"), names)
            endpoint = ""
            if args.store == "s3":
                endpoint = stack.enter_context(weed_server(args.weed, Path(work, "weed")))
            start_configs(args, work, poll, configs, endpoint)
            durable = Config("1 node, remote durable", 1, "local+remote", configs[0].shared)
            for rnd in range(args.rounds):
                k = rnd % len(configs)
                for c in configs[k:] + configs[:k]:
                    # Single node: the same total ranks on its one daemon.
                    rpn = args.ranks_per_node * (1 if c.nodes > 1 else 2)
                    c.lat.append(one_round(c.clients, rpn, rows, c.job, rnd + 1))
                    if c is configs[0]:
                        durable.lat.append(
                            one_round(c.clients, rpn, rows, "commit-1r", rnd + 1, remote=True)
                        )
            for c in configs:
                if c.policy == "local+peer":
                    check_peer_tier(c, args.rounds)
        except BaseException:
            keep_logs(configs, out / f"cluster_commit-logs-poll{poll}")
            raise
        finally:
            for c in configs:
                for x in c.daemons:
                    x.stop()
            stack.close()
            shutil.rmtree(work, ignore_errors=True)
        results += summarize([*configs[:1], durable, *configs[1:]], args, poll)
    with open(out / "cluster_commit.jsonl", "w") as f:
        for rec in results:
            f.write(json.dumps(rec) + "\n")


def summarize(configs: list[Config], args: argparse.Namespace, poll: int) -> list[dict[str, Any]]:
    """One record per configuration; configs[0] is the 1-node commit, configs[1] the 1 node
    until remote durable."""
    base = statistics.median(configs[0].lat)
    durable = statistics.median(configs[1].lat)
    remote = {c.nodes: statistics.median(c.lat) for c in configs[2:] if c.policy == "local+remote"}
    recs = []
    for c in configs:
        med = statistics.median(c.lat)
        rec: dict[str, Any] = {
            "bench": "cluster_commit",
            "configuration": c.name,
            "nodes": c.nodes if c is not configs[1] else "1 (remote durable)",
            "tier_policy": c.policy,
            "ranks": args.ranks_per_node * (c.nodes if c.nodes > 1 else 2),
            "ratio_to_1_node_remote_durable": round(med / durable, 2),
            "mib_per_rank": args.mib,
            "cluster_poll_ms": poll,
            "store": args.store,
            "median_ms": round(med * 1000, 1),
            "max_ms": round(max(c.lat) * 1000, 1),
            "ratio_to_1_node": round(med / base, 2),
            "rounds_ms": [round(x * 1000, 1) for x in c.lat],
        }
        if c.policy == "local+peer":
            rec["ratio_to_local_remote_same_nodes"] = round(med / remote[c.nodes], 2)
            rec["peer_replicas"] = 1
        recs.append(rec)
        print(json.dumps(rec), flush=True)
    return recs


if __name__ == "__main__":
    main()
