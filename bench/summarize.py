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


PHASES = ["save_stall", "committed", "load_cold", "load_warm", "reshard_cold"]
PEERS = ["ckptd_dcp", "dcp", "dcp_async", "torch_save", "bytecheckpoint"]
GB = 1e9


def _index(rows: list[dict]) -> dict[tuple, dict]:
    """(system, phase, dtype, world, from_world) -> row; repeated measurements (ckptd, memcpy)
    become one row holding the median of their times and their count in "reps"."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        key = (r["system"], r["phase"], r.get("dtype"), r.get("world"), r.get("from_world"))
        groups[key].append(r)
    out = {}
    for key, rs in groups.items():
        row = dict(rs[0])
        for field in ("seconds_max", "seconds_mean"):
            if field in row:
                row[field] = statistics.median(r[field] for r in rs)
        row["reps"] = len(rs)
        out[key] = row
    return out


def _fio_table(rows: list[dict]) -> None:
    """Every fio measurement: block size x queue depth, at the start and the end of the run."""
    limits = [r for r in rows if r["system"] == "limit" and r["phase"].startswith("odirect_")]
    shapes = list(dict.fromkeys(r["options"].split(" io_uring")[0] for r in limits))
    print("| fio | when | " + " | ".join(shapes) + " |")
    print("|---|---|" + "---|" * len(shapes))
    for rw in ("write", "read"):
        for when in ("start", "end"):
            got = {
                r["options"].split(" io_uring")[0]: r["bw_bytes_per_s"] / GB
                for r in limits
                if r["phase"] == f"odirect_{rw}" and r.get("when", "start") == when
            }
            if got:
                cells = " | ".join(_fmt(got.get(shape)) for shape in shapes)
                print(f"| {rw} GB/s | {when} | {cells} |")


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def checkpoint(rows: list[dict]) -> None:
    """Per-phase times (slowest rank) of every system, then the goals as ratios."""
    if not rows:
        return
    ix = _index(rows)
    wbw = max(r["bw_bytes_per_s"] for r in rows if r["phase"] == "odirect_write")
    rbw = max(r["bw_bytes_per_s"] for r in rows if r["phase"] == "odirect_read")
    print(
        f"Limits: O_DIRECT write {wbw / GB:.2f} GB/s, read {rbw / GB:.2f} GB/s (fio, best of "
        "the shapes tried, at the start and the end of the run)."
    )
    print()
    _fio_table(rows)
    print()
    configs = sorted(
        {(r["dtype"], r["world"]) for r in rows if r["system"] != "limit" or r["phase"] == "memcpy"}
    )
    systems = ["ckptd", *PEERS]

    def sec(
        system: str, phase: str, dtype: str, world: int, src: int | None = None
    ) -> float | None:
        r = ix.get((system, phase, dtype, world, src))
        return None if r is None else r["seconds_max"]

    def src_of(dtype: str, world: int) -> int | None:
        froms = [
            k[4]
            for k in ix
            if k[1] == "reshard_cold" and k[2] == dtype and k[3] == world and k[0] == "ckptd"
        ]
        return froms[0] if froms else None

    print(
        "| dtype | ranks | state GB | system | stall s | committed s | cold load s | warm load s "
        "| resharded cold load s | cold device read / state |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for dtype, world in configs:
        mc = ix.get(("limit", "memcpy", dtype, world, None))
        if mc is None:
            continue
        nbytes = mc["bytes"]
        print(
            f"| {dtype} | {world} | {nbytes / GB:.2f} | memcpy (limit) | {mc['seconds_max']:.3f}"
            " | | | | | |"
        )
        for system in systems:
            vals = [sec(system, p, dtype, world) for p in PHASES[:4]]
            src = src_of(dtype, world)
            rs = sec(system, "reshard_cold", dtype, world, src)
            if all(v is None for v in vals) and rs is None:
                continue
            cold = ix.get((system, "load_cold", dtype, world, None))
            dev = _fmt(cold["read_bytes"] / nbytes, ".3f") if cold else "-"
            cells = " | ".join(_fmt(v, ".3f") for v in vals)
            label = f"{_fmt(rs, '.3f')} ({src}→{world})" if rs is not None else "-"
            print(
                f"| {dtype} | {world} | {nbytes / GB:.2f} | {system} | {cells} | {label} | {dev} |"
            )
    for r in rows:
        if r.get("phase") == "unavailable":
            print(f"\n{r['system']} did not run ({r['dtype']}, {r['world']} ranks): {r['why']}")
    print()
    print("Goals (ckptd, ratios within one run; ✓ met, ✗ missed):")
    print()
    print(
        "| dtype | ranks | stall / memcpy (≤1.2) | stall / DCP async stall (≤1) "
        "| DCP sync save / stall (≥10) | committed / (bytes÷write bw + stall) (≤1.15) "
        "| cold load bw / read bw (≥0.85) | resharded / same-layout cold (≤1.25) "
        "| resharded / DCP resharded (<1) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")

    def mark(v: float | None, ok: bool) -> str:
        return "-" if v is None else f"{v:.2f} {'✓' if ok else '✗'}"

    for dtype, world in configs:
        mc = ix.get(("limit", "memcpy", dtype, world, None))
        if mc is None:
            continue
        nbytes = mc["bytes"]
        stall = sec("ckptd", "save_stall", dtype, world)
        committed = sec("ckptd", "committed", dtype, world)
        cold = sec("ckptd", "load_cold", dtype, world)
        src = src_of(dtype, world)
        rs = sec("ckptd", "reshard_cold", dtype, world, src)
        dcp_rs = sec("dcp", "reshard_cold", dtype, world, src)
        das = sec("dcp_async", "save_stall", dtype, world)
        dss = sec("dcp", "save_stall", dtype, world)
        if stall is None or committed is None or cold is None:
            continue
        a = stall / mc["seconds_max"]
        b = stall / das if das else None
        c = dss / stall if dss else None
        d = committed / (nbytes / wbw + stall)
        e = (nbytes / cold) / rbw
        f = rs / cold if rs else None
        g = rs / dcp_rs if rs and dcp_rs else None
        print(
            f"| {dtype} | {world} | {mark(a, a <= 1.2)} | {mark(b, b is not None and b <= 1)} "
            f"| {mark(c, c is not None and c >= 10)} | {mark(d, d <= 1.15)} "
            f"| {mark(e, e >= 0.85)} | {mark(f, f is not None and f <= 1.25)} "
            f"| {mark(g, g is not None and g < 1)} |"
        )
    # The last resharded run (e.g. 4 -> 1) has no save of its own: against the first run's load.
    print()
    print("ckptd's speed-up over each peer (peer time / ckptd time; above 1: ckptd is faster):")
    print()
    print("| peer | phase | " + " | ".join(f"{d} x{w}" for d, w in configs) + " |")
    print("|---|---|" + "---|" * len(configs))
    for peer in PEERS:
        for phase in PHASES:
            cells = []
            for dtype, world in configs:
                src = src_of(dtype, world) if phase == "reshard_cold" else None
                mine, theirs = (
                    sec("ckptd", phase, dtype, world, src),
                    sec(peer, phase, dtype, world, src),
                )
                cells.append(_fmt(theirs / mine if mine and theirs else None))
            if any(c != "-" for c in cells):
                print(f"| {peer} | {phase} | " + " | ".join(cells) + " |")


def train(rows: list[dict]) -> None:
    rows = [r for r in rows if "block_s" in r]  # (files of older runs had whole loops)
    if not rows:
        return
    none = {r["round"]: r["block_s"] for r in rows if r["system"] == "none"}
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["system"] != "none":
            by[r["system"]].append(r)
    base = statistics.median(none.values())
    first = rows[0]
    print(
        f"Training loop: blocks of {first['steps']} steps, {len(none)} rounds; a block without a "
        f"checkpoint: {base:.2f} s ({base / first['steps'] * 1000:.0f} ms/step); state "
        f"{first['state_bytes'] / 1e6:.0f} MB."
    )
    print()
    print(
        "| system | overhead per checkpoint ms (median of block - same round's none) "
        "| overhead / DCP async's | call (stall) ms | wait after the steps ms |"
    )
    print("|---|---|---|---|---|")
    over = {
        system: statistics.median(r["block_s"] - none[r["round"]] for r in rs)
        for system, rs in by.items()
    }
    for system, rs in by.items():
        rel = over[system] / over["dcp_async"] if over.get("dcp_async", 0) > 0 else None
        call = statistics.median(r["call_s"] for r in rs)
        wait = statistics.median(r["wait_s"] for r in rs)
        print(
            f"| {system} | {over[system] * 1000:.0f} | {_fmt(rel)} | {call * 1000:.0f} "
            f"| {wait * 1000:.0f} |"
        )


def every_step(rows: list[dict]) -> None:
    """train_bench.py --continuous: overhead per step of checkpointing every N steps."""
    if not rows:
        return
    none = {r["round"]: r["run_s"] for r in rows if r["system"] == "none"}
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["system"] != "none":
            by[r["system"]].append(r)
    first = rows[0]
    base = statistics.median(none.values())
    print(
        f"Checkpoint every {first['every']} step(s): runs of {first['steps']} steps, {len(none)} "
        f"rounds; a run without checkpoints: {base:.2f} s ({base / first['steps'] * 1000:.0f} "
        f"ms/step); state {first['state_bytes'] / 1e6:.0f} MB."
    )
    print()
    print(
        "| system | overhead per step (median of run / same round's none - 1) "
        "| overhead / best DCP's | save calls per step ms | wait after the steps ms |"
    )
    print("|---|---|---|---|---|")
    over = {
        system: statistics.median(r["run_s"] / none[r["round"]] - 1 for r in rs)
        for system, rs in by.items()
    }
    dcp = [over[s] for s in ("dcp_async", "dcp_zoc") if s in over]
    best = min(dcp) if dcp else None
    for system, rs in by.items():
        rel = over[system] / best if best else None
        call = statistics.median(r["call_s"] for r in rs) / first["steps"]
        wait = statistics.median(r["wait_s"] for r in rs)
        print(
            f"| {system} | {over[system] * 100:.1f}% | {_fmt(rel)} | {call * 1000:.0f} "
            f"| {wait * 1000:.0f} |"
        )


def main() -> None:
    out = Path(sys.argv[1])
    planner(load(out / "planner.jsonl"))
    print()
    reshard(load(out / "reshard_load.jsonl"))
    print()
    checkpoint(load(out / "ckpt.jsonl"))
    print()
    train(load(out / "train.jsonl"))
    for every in (1, 10):
        print()
        every_step(load(out / f"train_every{every}.jsonl"))
    remote_rows = load(out / "remote.jsonl")
    if remote_rows:
        from remote_bench import table

        table(remote_rows)


if __name__ == "__main__":
    main()
