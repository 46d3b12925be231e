"""Time to resume after a node's loss (issue 35 §7): a replacement node's ranks restored from the
peer holding its part, against the store and against the lost node's own RAM tier.

Three daemons on this machine stand for the nodes node-a, node-b and node-c: each has its own
state dir, socket and arena and a peer listener on loopback (mutual TLS, certificates made by
tests/integration/peer_certs.sh), and their shared tier is one directory (the posix plugin, as on
a shared file system), tier policy local+remote, cluster_poll_ms 20. Each round saves one
checkpoint spanning nodes: 4 ranks of --mib MiB (a row block each of one float32 tensor), ranks
0-1 through node-a and 2-3 through node-b (local_world_size 2). At COMMITTED node-b's part is on
the store, and its copy in node-c's peer store (docs/PEERS.md "Replication"). Ranks 2 and 3 are
then restored, each by a client of its own in a thread of its own, into a new numpy array:

  own_ram    on node-b itself, from its RAM tier, before it is lost (the baseline): from the
             clients' connect until both loads returned
  (node-b is lost: SIGKILL, its state dir and its shared memory removed)
  peers      a replacement node-b (the same options, an empty state dir), node-b's blobs moved
             out of the store first: they can only come from node-c's peer store
  store_dir  a replacement node-b without a peer listener, reading the shared directory, the page
             cache of node-b's blobs dropped first (posix_fadvise DONTNEED): a cold read
  store_s3   the same with S3 as the store: a SeaweedFS `weed` on loopback (bench/remote_bench.py
             starts it), the page cache of its files dropped first; its checkpoint (the same
             shape, saved through node-a and node-b daemons on that store) is saved once, before
             the rounds

A replacement is timed from its spawn until both loads returned ("total"); "restore" is the part
after its socket appeared (the daemon's start excluded), comparable to own_ram's whole time.
Every load is checked: the bytes are the ones saved, and they came from where the source says
(bytes_from_ram, bytes_read_peer, bytes_read_remote). The replacements' order rotates each round.
CPU seconds are recorded for the restoring daemon, for whoever serves the bytes (node-c for
peers, weed for store_s3) and for the clients (this process).

Writes one JSON object per source, and one of the goals' ratios, to --out (JSON lines).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import drop_file_caches, remove_shm_at_exit
from remote_bench import ACCESS_KEY, BUCKET, SECRET_KEY, WEED_PID, proc_cpu_s, weed_server

import ckptd
from ckptd._shm import remove_segments

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
COLS = 1024
JOB = "peer-restore"
NODES = ("node-a", "node-b", "node-c")
RANKS_PER_NODE = 2
WORLD = 4
LOST_RANKS = (2, 3)  # node-b's
SOURCES = ("own_ram", "peers", "store_dir", "store_s3")
S3_STEP = 1  # the one checkpoint on the S3 store
LIVE: list[Node] = []  # the daemons running; main() kills those an error or a signal leaves


@dataclass
class Setup:
    daemon: str
    work: Path  # state dirs, the shared directory, certificates, weed's data
    mib: int  # per rank
    weed: str = "weed"
    s3_endpoint: str = ""  # once weed runs

    @property
    def shared(self) -> Path:
        return self.work / "shared"

    @property
    def certs(self) -> Path:
        return self.work / "certs"

    @property
    def rows(self) -> int:
        return self.mib * MiB // (COLS * 4)

    def flags(self, name: str, store: str, peers: bool) -> list[str]:
        """A daemon's flags: its store the shared directory ("dir") or weed ("s3")."""
        part = RANKS_PER_NODE * self.mib * MiB
        flags = [
            "--tier_policy=local+remote",
            "--cluster_poll_ms=20",
            f"--staging_bytes_max={2 * part + 256 * MiB}",  # the part hot, plus load scratch
            "--log_level=warn",
        ]
        if store == "dir":
            flags.append(f"--remote_dir={self.shared}")
        else:
            flags += [
                f"--remote_s3_endpoint={self.s3_endpoint}",
                f"--remote_s3_bucket={BUCKET}",
                f"--remote_s3_prefix={JOB}",
            ]
        if peers:
            flags += [
                "--peer_listen_addr=127.0.0.1:0",
                f"--peer_tls_ca_path={self.certs}/ca.pem",
                f"--peer_tls_cert_path={self.certs}/{name}.pem",
                f"--peer_tls_key_path={self.certs}/{name}.key",
                # Two parts (a registry read before node-b's restart sends node-a's part here
                # too) of the two newest steps, which a peer store never evicts, and one more.
                f"--peer_bytes_max={6 * part}",
                "--peer_replicas=1",
            ]
        return flags


class Node:
    """One daemon standing for a node; its state dir and shared memory go when it stops or is
    lost. Every one started is in LIVE until then."""

    def __init__(self, setup: Setup, name: str, store: str = "dir", peers: bool = True) -> None:
        self.name = name
        self.state = tempfile.mkdtemp(prefix=f"{name}-", dir=setup.work)
        self.socket = os.path.join(self.state, "ckptd.sock")
        remove_shm_at_exit(self.state)  # however the bench ends
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env |= {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        argv = [setup.daemon, f"--state_dir={self.state}", f"--node_id={name}"]
        argv += setup.flags(name, store, peers)
        with open(os.path.join(self.state, "ckptd.log"), "w") as log:
            self.spawned = time.perf_counter()
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        LIVE.append(self)

    def wait_socket(self, timeout_s: float = 60.0) -> float:
        """Waits for the socket (polled every millisecond); returns when it appeared."""
        deadline = time.perf_counter() + timeout_s
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.perf_counter() > deadline:
                sys.exit(f"bench: {self.name} did not start; see {self.state}/ckptd.log")
            time.sleep(0.001)
        return time.perf_counter()

    def client(self) -> Any:
        return ckptd.connect(
            self.socket, tier_policy="local+remote", local_world_size=RANKS_PER_NODE
        )

    def cpu_s(self) -> float:
        """The daemon's CPU seconds so far (user and system, all threads)."""
        return proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._gone()

    def lose(self) -> None:
        """The node is lost: the daemon killed, its memory and its state dir gone."""
        self.proc.kill()
        self.proc.wait()
        self._gone()

    def _gone(self) -> None:
        LIVE.remove(self)
        remove_segments(self.state)
        shutil.rmtree(self.state, ignore_errors=True)


def make_certs(certs: Path) -> None:
    script = str(ROOT / "tests/integration/peer_certs.sh")
    subprocess.run(["sh", script, "ca", str(certs), "ca"], check=True)
    for n in NODES:
        subprocess.run(["sh", script, "node", str(certs), "ca", n], check=True)


def save_round(nodes: list[Node], data: dict[int, np.ndarray], step: int) -> float:
    """Saves (JOB, step): ranks 0-1 through the first node, 2-3 through the second; returns the
    seconds from the first save to COMMITTED on both."""
    rows = data[0].shape[0]
    clients = [n.client() for n in nodes]
    t0 = time.perf_counter()
    for r in range(WORLD):
        data[r][0, :] = step  # each step's bytes differ
        region = ckptd.Box((r * rows, 0), (rows, COLS))
        shard = ckptd.Shard(data[r], global_shape=(rows * WORLD, COLS), region=region)
        clients[r // RANKS_PER_NODE].save(JOB, step, {"w": shard}, rank=r, world_size=WORLD)
    for c in clients:
        c.wait(JOB, step)
    took = time.perf_counter() - t0
    for c in clients:
        c.close()
    return took


def restore(node: Node, step: int, rows: int) -> tuple[float, list[dict[str, Any]]]:
    """Ranks 2 and 3, each a client of its own in a thread of its own, connect to `node` and load
    their row block into a new numpy array; returns when both loads returned and, per rank, the
    array and the daemon's counts. The clients close once every rank loaded."""

    def one(r: int) -> dict[str, Any]:
        c = node.client()
        dest = np.empty((rows, COLS), dtype=np.float32)
        box = ckptd.Box((r * rows, 0), (rows, COLS))
        counts = c.load_into_counted(JOB, step, [("w", box, dest)], rank=r)
        return {"rank": r, "client": c, "array": dest, "counts": counts}

    with ThreadPoolExecutor(len(LOST_RANKS)) as pool:
        got = list(pool.map(one, LOST_RANKS))
    done = time.perf_counter()
    for g in got:
        g.pop("client").close()
    return done, got


def check(source: str, got: list[dict[str, Any]], step: int) -> None:
    """The bytes are the ones saved (row 0 the step, the rest rank + 1), read from where `source`
    says."""
    for g in got:
        r, a, k = g["rank"], g["array"], g["counts"]
        if not ((a[0] == step).all() and (a[1:] == r + 1).all()):
            sys.exit(f"bench: {source}: rank {r} loaded other bytes than it saved")
        want = {
            "own_ram": k["bytes_from_ram"] == a.nbytes and k["bytes_read"] == 0,
            "peers": k["bytes_read_peer"] == a.nbytes,
        }.get(source, k["bytes_read_remote"] == a.nbytes and k["bytes_read_peer"] == 0)
        if not want:
            sys.exit(f"bench: {source}: rank {r}'s load counted {k} for {a.nbytes} bytes")


def client_cpu_s() -> float:
    """This process's CPU seconds so far: the ranks' clients (their copies out of the arena)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def timed(
    node: Node, step: int, rows: int, fresh: bool, server_cpu_s: Callable[[], float]
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """restore() on `node`, timed from its spawn if `fresh` (a replacement), else from now; with
    the CPU seconds over that time of the daemon, of whoever serves the bytes and of the
    clients."""
    since = node.spawned if fresh else time.perf_counter()
    daemon_cpu = 0.0 if fresh else node.cpu_s()
    server_cpu, own_cpu = server_cpu_s(), client_cpu_s()
    up = node.wait_socket()
    done, got = restore(node, step, rows)
    t = {
        "total_s": done - since,
        "start_s": up - since,
        "restore_s": done - up,
        "daemon_cpu_s": node.cpu_s() - daemon_cpu,
        "server_cpu_s": server_cpu_s() - server_cpu,
        "client_cpu_s": client_cpu_s() - own_cpu,
    }
    return t, got


def served_by(source: str, nodes: dict[str, Node]) -> Callable[[], float]:
    """The CPU seconds so far of what serves `source`'s bytes (a disk read counts nowhere)."""
    if source == "peers":
        return nodes["node-c"].cpu_s
    if source == "store_s3":
        return lambda: proc_cpu_s(WEED_PID["pid"])
    return lambda: 0.0


def replacement(
    setup: Setup, source: str, step: int, server_cpu_s: Callable[[], float]
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Node-b's replacement for `source`, timed from its spawn until ranks 2 and 3 loaded."""
    step_dir = setup.shared / JOB / f"step-{step:020d}"
    blobs = [step_dir / f"r{r:05d}.blob" for r in LOST_RANKS]
    aside = setup.work / "aside"
    if source == "peers":
        aside.mkdir(exist_ok=True)
        for b in blobs:
            b.rename(aside / b.name)
    elif source == "store_dir":
        drop_file_caches(blobs)
    else:
        files = [Path(d, f) for d, _, fs in os.walk(setup.work / "weed") for f in fs]
        drop_file_caches([f for f in files if f.is_file()])  # not its socket
    store = "s3" if source == "store_s3" else "dir"
    node = Node(setup, "node-b", store, peers=source == "peers")
    try:
        t = timed(node, step, setup.rows, True, server_cpu_s)
    finally:
        if source == "peers":
            for b in blobs:
                (aside / b.name).rename(b)
    node.stop()
    return t


def save_on_s3(setup: Setup, data: dict[int, np.ndarray]) -> None:
    """The store_s3 checkpoint, saved once through node-a and node-b daemons on weed."""
    nodes = [Node(setup, n, "s3", peers=False) for n in ("node-a", "node-b")]
    for n in nodes:
        n.wait_socket()
    save_round(nodes, data, S3_STEP)
    for n in nodes:
        n.stop()


def run(setup: Setup, sources: list[str], rounds: int) -> dict[str, list[dict[str, float]]]:
    setup.shared.mkdir()
    make_certs(setup.certs)
    data = {r: np.full((setup.rows, COLS), r + 1, dtype=np.float32) for r in range(WORLD)}
    times: dict[str, list[dict[str, float]]] = {s: [] for s in sources}
    replacements = [s for s in sources if s != "own_ram"]
    with ExitStack() as stack:
        if "store_s3" in sources:
            setup.s3_endpoint = stack.enter_context(weed_server(setup.weed, setup.work / "weed"))
            save_on_s3(setup, data)
        nodes = {n: Node(setup, n) for n in NODES}
        for rnd in range(rounds):
            step = rnd + 1
            for n in nodes.values():
                n.wait_socket()
            commit_s = save_round([nodes["node-a"], nodes["node-b"]], data, step)
            t, got = timed(nodes["node-b"], step, setup.rows, False, served_by("own_ram", nodes))
            check("own_ram", got, step)
            if "own_ram" in times:
                times["own_ram"].append(t)
            nodes["node-b"].lose()
            k = rnd % max(1, len(replacements))
            for source in replacements[k:] + replacements[:k]:
                s = S3_STEP if source == "store_s3" else step
                t, got = replacement(setup, source, s, served_by(source, nodes))
                check(source, got, s)
                times[source].append(t)
            row = {s: round(v[-1]["total_s"], 3) for s, v in times.items()}
            print(f"round {step}: committed in {commit_s:.2f} s; total {row}", flush=True)
            nodes["node-b"] = Node(setup, "node-b")  # the next round's, with its listener
        for n in nodes.values():
            n.stop()
    return times


def report(mib: int, times: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    def med(source: str, key: str) -> float:
        return statistics.median(t[key] for t in times[source])

    part_bytes = len(LOST_RANKS) * mib * MiB
    rows: list[dict[str, Any]] = []
    for source, ts in times.items():
        totals = [t["total_s"] for t in ts]
        rows.append(
            {
                "bench": "peer_restore",
                "source": source,
                "mib_per_rank": mib,
                "ranks": len(LOST_RANKS),
                "rounds": len(ts),
                "median_total_s": round(med(source, "total_s"), 3),
                "range_total_s": [round(min(totals), 3), round(max(totals), 3)],
                "median_start_s": round(med(source, "start_s"), 3),
                "median_restore_s": round(med(source, "restore_s"), 3),
                "restore_gib_per_s": round(part_bytes / med(source, "restore_s") / (1 << 30), 2),
                "median_daemon_cpu_s": round(med(source, "daemon_cpu_s"), 2),
                "median_server_cpu_s": round(med(source, "server_cpu_s"), 2),
                "median_client_cpu_s": round(med(source, "client_cpu_s"), 2),
            }
        )
    goals: dict[str, Any] = {"bench": "peer_restore_ratios"}
    pairs = [("peers", "own_ram"), ("store_dir", "peers"), ("store_s3", "peers")]
    for a, b in pairs:
        if a in times and b in times:
            for key in ("total_s", "restore_s"):
                name = f"{a}_over_{b}_{key.removesuffix('_s')}"
                goals[name] = round(med(a, key) / med(b, key), 2)
    return [*rows, goals]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemon", required=True)
    ap.add_argument("--out", required=True, help="a JSON-lines file")
    ap.add_argument("--work", default=None, help="where its temp dir goes (default: $TMPDIR)")
    ap.add_argument("--mib", type=int, default=256, help="MiB per rank")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--sources", default=",".join(SOURCES), help=f"of {','.join(SOURCES)}")
    ap.add_argument("--weed", default=shutil.which("weed") or "weed")
    args = ap.parse_args()
    sources = args.sources.split(",")
    if unknown := set(sources) - set(SOURCES):
        sys.exit(f"bench: unknown sources {sorted(unknown)}")
    # SIGTERM ends the bench through its clean-ups (daemons and weed stopped, dirs removed).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="ckb-peer-restore-", dir=args.work))
    try:
        times = run(Setup(args.daemon, work, args.mib, args.weed), sources, args.rounds)
    finally:
        for n in list(LIVE):  # what an error or a signal left: killed, no drain
            n.lose()
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for rec in report(args.mib, times):
            print(json.dumps(rec), flush=True)
            f.write(json.dumps(rec) + "\n")


if __name__ == "__main__":
    main()
