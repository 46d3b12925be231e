"""Ratios from the raw bench results (bench/results/*.jsonl), as markdown tables."""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def load(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def planner(rows: list[dict]) -> None:
    by = defaultdict(list)
    for r in rows:
        by[(r["scenario"], r["measure"])].append(r["ms"])
    print("| scenario | measure | median ms |")
    print("|---|---|---|")
    for (scenario, measure), ms in sorted(by.items()):
        print(f"| {scenario} | {measure} | {statistics.median(ms):.1f} |")


def reshard(rows: list[dict]) -> None:
    by = defaultdict(list)
    for r in rows:
        by[r["layout"]].append(r)
    base = statistics.median(r["seconds"] for r in by.get("same_rows4", []) or [{"seconds": 1}])
    print(
        "| layout | ranks | median s | time / same-layout | read / needed (4 KiB) "
        "| device read / needed |"
    )
    print("|---|---|---|---|---|---|")
    for layout, rs in by.items():
        s = statistics.median(r["seconds"] for r in rs)
        need = sum(r["bytes_needed_aligned"] for r in rs)
        read = sum(r["bytes_read"] for r in rs)
        dev = sum(r["device_read_bytes"] for r in rs)
        ratios = f"{s / base:.2f} | {read / need:.3f} | {dev / need:.3f}"
        print(f"| {layout} | {rs[0]['ranks']} | {s:.3f} | {ratios} |")


def main() -> None:
    out = Path(sys.argv[1])
    planner(load(out / "planner.jsonl"))
    print()
    reshard(load(out / "reshard_load.jsonl"))


if __name__ == "__main__":
    main()
