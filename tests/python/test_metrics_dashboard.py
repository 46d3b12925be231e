"""deploy/grafana-dashboard.json against a real daemon's metrics endpoint: every metric a panel
or variable queries is one the daemon exports (scraped over HTTP after a save and a load), and
every label a query selects or groups by is one that metric carries."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np

import ckptd
from conftest import daemon_binary, start_daemon

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana-dashboard.json"


def scrape() -> tuple[dict[str, set[str]], str]:
    """(exported series name -> the label names it carries, the log's URL) of a daemon that
    saved and loaded a checkpoint."""
    d = start_daemon(flags=["--metrics_address=0"])
    try:
        with ckptd.connect(d.socket) as c:
            c.save("dash", 1, {"w": np.ones((64, 64), np.float32)}).committed().result(60)
            c.load("dash", 1)
            c.save("dash", 2, {"w": np.ones((64, 64), np.float32)}, rank=0, world_size=2)
            c.abort("dash", 2, "for the dashboard test")
        ctl = Path(daemon_binary()).parent / "ckptctl"
        subprocess.run(
            [ctl, "--socket", d.socket, "reshard", "dash", "1", "10", "*=consolidated"], check=True
        )
        m = re.search(r"metrics on (http://127\.0\.0\.1:\d+/metrics)", Path(d.log).read_text())
        assert m, Path(d.log).read_text()
        deadline = time.monotonic() + 60
        while True:  # the reshard ends in the background
            body = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
            if "ckptd_reshards_total{" in body or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        d.stop()
        shutil.rmtree(d.state_dir, ignore_errors=True)
    series: dict[str, set[str]] = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, rest = line.partition("{")
        name = name.split(" ")[0]
        labels = set(re.findall(r'(\w+)="', rest.partition("}")[0])) if rest else set()
        series.setdefault(name, set()).update(labels)
    return series, m.group(1)


def test_every_dashboard_query_names_an_exported_metric_and_its_labels() -> None:
    exported, url = scrape()
    dash = json.loads(DASHBOARD.read_text())
    queries = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    queries += [v["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    assert len(queries) >= 20
    seen: set[str] = set()
    for q in queries:
        names = re.findall(r"\b(ckptd_\w+)", q)
        assert names, f"query names no ckptd metric: {q}"
        for n in names:
            assert n in exported, f"{q}: {n} is not exported by the daemon at {url}"
            seen.add(n)
        carried = set().union(*(exported[n] for n in names))
        for sel in re.findall(r"\{([^}]*)\}", q):
            for label in re.findall(r"(\w+)\s*[=!~]", sel):
                assert label in carried, f"{q}: no metric it names carries label {label}"
        for group in re.findall(r"by \(([^)]*)\)", q):
            for label in (g.strip() for g in group.split(",")):
                assert label == "le" or label in carried, f"{q}: groups by missing label {label}"
        for label in re.findall(r"label_values\(\w+, (\w+)\)", q):
            assert label in carried, f"{q}: no label {label}"
    # The families operators need are all on the dashboard.
    for family in (
        "ckptd_checkpoints_total", "ckptd_checkpoint_seconds_bucket",
        "ckptd_save_stage_seconds_bucket", "ckptd_flush_bytes_total", "ckptd_load_bytes_total",
        "ckptd_arena_bytes", "ckptd_ram_tier_bytes", "ckptd_checksum_failures_total",
        "ckptd_rpc_duration_seconds_bucket", "ckptd_reserve_waits_total", "ckptd_queued_calls",
        "ckptd_sessions",
    ):  # fmt: skip
        assert family in seen, f"{family} is on no panel"
