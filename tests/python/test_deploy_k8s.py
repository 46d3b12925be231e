"""deploy/k8s against the Kubernetes schemas and against the daemon.

Every manifest validates offline against the Kubernetes OpenAPI schemas that kubernetes-validate
bundles (strict: an unknown field fails), for the oldest and the newest Kubernetes release the
manifests are written for. Then what the daemon depends on: the ConfigMap's config starts a real
ckptd (only its paths moved to a temp dir) that answers the DaemonSet's probe commands and serves
metrics; the example training Job's code saves and loads through the socket named in its
CKPTD_SOCKET; and the socket, /dev/shm, groups, metrics port, memory, grace period and node_id
agree between the ConfigMap, the DaemonSet and the Job. Nothing is contacted but loopback."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from conftest import daemon_binary, remove_shm_at_end

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
# The oldest Kubernetes release still supported upstream when the manifests were written, and
# the newest whose schemas kubernetes-validate (pinned in deploy/setup.sh) bundles.
K8S_VERSIONS = ("1.32", "1.37")
MiB = 1 << 20
GiB = 1 << 30
# Defaults of the options the memory sizing adds (docs/CONFIGURATION.md "Configuration").
DEFAULTS = {
    "load_threads": "2",
    "load_buffer_bytes": str(64 * MiB),
    "upload_threads": "2",
    "upload_chunk_bytes": str(64 * MiB),
    "shutdown_grace_s": "30",
}
# RocksDB, gRPC, the manifest cache and a reshard's buffers, as the DaemonSet's comment counts.
BASE_OVERHEAD_BYTES = 1 * GiB


def manifest_files() -> list[Path]:
    return sorted(K8S.glob("*.yaml")) + sorted((K8S / "examples").glob("*.yaml"))


def documents() -> list[tuple[Path, dict[str, Any]]]:
    return [(f, d) for f in manifest_files() for d in yaml.safe_load_all(f.read_text()) if d]


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for _, d in documents() if d["kind"] == kind]
    if name is not None:
        found = [d for d in found if d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''} in {K8S}, found {len(found)}"
    return found[0]


def parse_config(text: str) -> dict[str, str]:
    """`name = value` lines as the daemon reads them (daemon/src/options.cc LoadConfigFile)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, eq, value = line.partition("=")
        assert eq, f"not a 'name = value' line: {line}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] == '"':
            value = value[1:-1]
        out[name.strip().replace("-", "_")] = value
    return out


def config_text() -> str:
    return str(one("ConfigMap", "ckptd-config")["data"]["ckptd.conf"])


def config() -> dict[str, str]:
    return parse_config(config_text())


def option(name: str) -> str:
    return config().get(name, DEFAULTS.get(name, ""))


def bytes_of(quantity: str) -> int:
    """A Kubernetes memory quantity (18Gi, 512Mi, 2G, 1000) in bytes."""
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti|k|M|G|T)?", quantity)
    assert m, f"unsupported quantity {quantity}"
    unit = {"Ki": 1 << 10, "Mi": MiB, "Gi": GiB, "Ti": 1 << 40, "k": 10**3, "M": 10**6}
    unit |= {"G": 10**9, "T": 10**12}
    return int(m.group(1)) * unit.get(m.group(2) or "", 1)


def pod_spec(kind: str) -> dict[str, Any]:
    return dict(one(kind)["spec"]["template"]["spec"])


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    found = [c for c in spec["containers"] if c["name"] == name]
    assert len(found) == 1, f"no container {name}"
    return dict(found[0])


def host_path(spec: dict[str, Any], ctr: dict[str, Any], path: str) -> tuple[str, bool]:
    """(host path, read-only) of the hostPath mount that holds `path` in the container."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    best: dict[str, Any] | None = None
    for m in ctr.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/")
        if (path == mp or path.startswith(mp + "/")) and (
            best is None or len(mp) > len(best["mountPath"])
        ):
            best = m
    assert best is not None, f"{ctr['name']}: no volume mounted over {path}"
    vol = volumes[best["name"]]
    assert "hostPath" in vol, f"{ctr['name']}: {path} is on {vol}, not a hostPath"
    rest = path[len(best["mountPath"].rstrip("/")) :]
    return vol["hostPath"]["path"].rstrip("/") + rest, bool(best.get("readOnly", False))


def env(ctr: dict[str, Any], name: str) -> str:
    values = [e.get("value") for e in ctr.get("env", []) if e["name"] == name]
    assert len(values) == 1 and values[0], f"{ctr['name']}: no {name} value in env"
    return str(values[0])


# --- the schemas ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_manifest_validates_against_the_kubernetes_schemas(version: str) -> None:
    docs = documents()
    kinds = {d["kind"] for _, d in docs}
    assert {"Namespace", "ConfigMap", "ServiceAccount", "DaemonSet", "Job"} <= kinds, kinds
    errors = []
    for path, doc in docs:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            where = ".".join(str(p) for p in e.path)
            errors.append(
                f"{path.name}: {doc['kind']}/{doc['metadata']['name']}: {where}: {e.message}"
            )
    assert not errors, "\n".join(errors)


# --- the daemon ----------------------------------------------------------------------------------


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    socket: str
    log: Path


def daemon_args(tmp: str, overrides: Sequence[str]) -> list[str]:
    """The DaemonSet's command line, its config file and $(NODE_NAME) made local, the paths
    moved under tmp (flags win over the file), socket_group made the test's own group (a
    process may give its socket only a group it is in), metrics on a free loopback port."""
    ds = pod_spec("DaemonSet")
    ctr = container(ds, "ckptd")
    conf = Path(tmp) / "ckptd.conf"
    conf.write_text(config_text())
    args: list[str] = []
    for a in ctr["args"]:
        a = a.replace("$(NODE_NAME)", "node-a")
        args.append(f"--config={conf}" if a.startswith("--config=") else a)
    return [
        daemon_binary(),
        *args,
        f"--state_dir={tmp}/state",
        f"--data_dir={tmp}/data",
        f"--socket={tmp}/ckptd.sock",
        f"--socket_group={os.getgid()}",
        "--metrics_address=127.0.0.1:0",
        *overrides,
    ]


def start(tmp: str, overrides: Sequence[str] = ()) -> Started:
    remove_shm_at_end(f"{tmp}/state")
    log = Path(tmp) / "ckptd.log"
    sock = f"{tmp}/ckptd.sock"
    with open(log, "wb") as out:
        proc = subprocess.Popen(daemon_args(tmp, overrides), stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while "ckptd ready on" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"ckptd did not start with the ConfigMap's config:\n{log.read_text()}")
        time.sleep(0.05)
    return Started(proc, sock, log)


def stop(d: Started) -> None:
    if d.proc.poll() is None:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait()


@pytest.fixture
def tmp() -> Iterator[str]:
    path = tempfile.mkdtemp(prefix="ckk8s", dir="/tmp")  # unix socket paths: at most 107 bytes
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_configmap_starts_the_daemon_which_answers_the_probes_and_serves_metrics(
    tmp: str,
) -> None:
    d = start(tmp)
    try:
        ctr = container(pod_spec("DaemonSet"), "ckptd")
        ctl = str(Path(daemon_binary()).parent / "ckptctl")
        sock = option("socket")
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            cmd = list(ctr[probe]["exec"]["command"])
            assert cmd[0] == "ckptctl" and sock in cmd, f"{probe} {cmd} does not ask {sock}"
            cmd = [ctl] + [d.socket if a == sock else a for a in cmd[1:]]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, f"{probe} {cmd}: exit {r.returncode}: {r.stderr}"
        m = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", d.log.read_text())
        assert m, d.log.read_text()
        body = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        capacity = re.search(r"^ckptd_arena_capacity_bytes (\d+)", body, re.M)
        assert capacity, body  # the arena less its header page
        assert 0 < int(option("staging_bytes_max")) - int(capacity.group(1)) <= MiB
    finally:
        stop(d)
    assert d.proc.returncode == 0, d.log.read_text()


def test_the_example_job_saves_and_loads_through_its_ckptd_socket(tmp: str) -> None:
    # The arena scaled down (the Job's code maps it, and the daemon faults it all in); every
    # other option as the ConfigMap has it.
    d = start(tmp, [f"--staging_bytes_max={64 * MiB}", f"--ram_tier_bytes_max={32 * MiB}"])
    try:
        trainer = container(pod_spec("Job"), "trainer")
        cmd = list(trainer["command"])
        assert cmd[:2] == ["python3", "-c"], cmd
        assert env(trainer, "CKPTD_SOCKET") == option("socket")
        run_env = dict(os.environ, CKPTD_SOCKET=d.socket)
        r = subprocess.run(
            [sys.executable, "-c", cmd[2]], env=run_env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == "committed 1", r.stdout
    finally:
        stop(d)


# --- what the daemon depends on ------------------------------------------------------------------


def test_the_configmap_sets_every_option_of_the_systemd_config() -> None:
    systemd = parse_config((ROOT / "deploy" / "ckptd.conf").read_text())
    missing = set(systemd) - set(config())
    assert not missing, f"the ConfigMap lacks options of deploy/ckptd.conf: {sorted(missing)}"


def test_daemon_and_job_share_the_socket_and_dev_shm() -> None:
    ds, job = pod_spec("DaemonSet"), pod_spec("Job")
    daemon, trainer = container(ds, "ckptd"), container(job, "trainer")
    sock = option("socket")
    assert len(sock) <= 101, sock
    daemon_host, daemon_ro = host_path(ds, daemon, sock)
    trainer_sock = env(trainer, "CKPTD_SOCKET")
    trainer_host, _ = host_path(job, trainer, trainer_sock)
    assert daemon_host == trainer_host, f"daemon {daemon_host}, trainer {trainer_host}"
    assert not daemon_ro, "the daemon must create its socket"
    for spec, ctr in ((ds, daemon), (job, trainer)):
        assert spec.get("hostIPC") is True, f"{ctr['name']}: hostIPC (CUDA IPC)"
        shm, ro = host_path(spec, ctr, "/dev/shm")
        assert shm == "/dev/shm" and not ro, f"{ctr['name']}: /dev/shm is {shm}"
    assert ds.get("nodeSelector") == job.get("nodeSelector"), "the Job must run where ckptd runs"


def test_groups_let_the_trainer_connect_and_the_daemon_give_its_socket_a_group() -> None:
    ds, job = pod_spec("DaemonSet"), pod_spec("Job")
    group = int(option("socket_group"))
    assert int(option("socket_mode"), 8) & 0o060 == 0o060, "the socket's group needs rw"
    daemon_ids = ds["securityContext"]
    assert group in [daemon_ids.get("runAsGroup"), *daemon_ids.get("supplementalGroups", [])]
    assert group in job["securityContext"].get("supplementalGroups", [])
    assert job["securityContext"].get("runAsUser") != daemon_ids["runAsUser"]
    int(option("admin_group"))  # numeric: the container has no /etc/group of the node
    init = ds["initContainers"][0]["command"][-1]
    assert f"chown {daemon_ids['runAsUser']}:{group}" in init, init


def test_metrics_port_agrees_with_annotations_container_port_and_network_policy() -> None:
    host, _, port = option("metrics_address").rpartition(":")
    assert host not in ("", "127.0.0.1", "localhost"), "Prometheus scrapes the pod's IP"
    ds = one("DaemonSet")
    notes = ds["spec"]["template"]["metadata"]["annotations"]
    assert notes["prometheus.io/scrape"] == "true"
    assert notes["prometheus.io/port"] == port
    ports = container(pod_spec("DaemonSet"), "ckptd")["ports"]
    assert [p["containerPort"] for p in ports if p["name"] == "metrics"] == [int(port)]
    policy = one("NetworkPolicy")
    assert [p["port"] for r in policy["spec"]["ingress"] for p in r["ports"]] == [int(port)]


def test_memory_request_and_limit_cover_the_arena_and_buffers() -> None:
    res = container(pod_spec("DaemonSet"), "ckptd")["resources"]
    limit = bytes_of(res["limits"]["memory"])
    assert bytes_of(res["requests"]["memory"]) == limit, "request the arena, not less"
    arena = int(option("staging_bytes_max"))
    assert 0 <= int(option("ram_tier_bytes_max")) <= arena  # the RAM tier is inside the arena
    need = (
        arena
        + 2 * int(option("load_buffer_bytes")) * int(option("load_threads"))
        + 2 * int(option("upload_chunk_bytes")) * int(option("upload_threads"))
        + BASE_OVERHEAD_BYTES
    )
    assert limit >= need, f"memory limit {limit} < {need} bytes (arena {arena} + buffers)"
    assert option("staging_mlock") in ("", "false"), "Kubernetes cannot raise RLIMIT_MEMLOCK"


def test_daemon_writes_only_to_its_mounts_and_stops_within_its_grace() -> None:
    ds = pod_spec("DaemonSet")
    ctr = container(ds, "ckptd")
    assert ctr["securityContext"]["readOnlyRootFilesystem"] is True
    for name in ("state_dir", "data_dir"):
        _, ro = host_path(ds, ctr, option(name))
        assert not ro, f"{name} {option(name)} is mounted read-only"
    assert ds["terminationGracePeriodSeconds"] > int(option("shutdown_grace_s"))
    conf = [a for a in ctr["args"] if a.startswith("--config=")]
    mount = next(m for m in ctr["volumeMounts"] if m["name"] == "config")["mountPath"]
    assert conf == [f"--config={mount}/ckptd.conf"], conf
    volume = next(v for v in ds["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == one("ConfigMap")["metadata"]["name"]
    node = [e for e in ctr["env"] if e["name"] == "NODE_NAME"]
    assert node and node[0]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node_id=$(NODE_NAME)" in ctr["args"], "node_id must outlive the pod"
