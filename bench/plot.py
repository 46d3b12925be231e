"""bench/results/ckpt.jsonl -> a PNG of the phases of every system, one panel per (dtype, ranks)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

PHASES = [
    ("save_stall", "save stall"),
    ("committed", "time to committed"),
    ("load_cold", "cold load"),
    ("load_warm", "warm load"),
    ("reshard_cold", "resharded cold load"),
]
SYSTEMS = ["ckptd", "ckptd_dcp", "dcp", "dcp_async", "torch_save", "bytecheckpoint"]


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    rows = [json.loads(line) for line in src.read_text().splitlines() if line.startswith("{")]
    rows = [r for r in rows if r.get("system") in SYSTEMS and "seconds_max" in r]
    configs = sorted({(r["dtype"], r["world"]) for r in rows})
    cols = max(1, len({w for _, w in configs}))
    dtypes = sorted({d for d, _ in configs})
    fig, axes = plt.subplots(
        len(dtypes), cols, figsize=(6 * cols, 4.2 * len(dtypes)), squeeze=False
    )
    worlds = sorted({w for _, w in configs})
    width = 0.8 / len(PHASES)
    for dtype, world in configs:
        ax = axes[dtypes.index(dtype)][worlds.index(world)]
        for k, (phase, label) in enumerate(PHASES):
            ys = []
            for system in SYSTEMS:
                vals = [
                    r["seconds_max"]
                    for r in rows
                    if r["system"] == system
                    and r["phase"] == phase
                    and r["dtype"] == dtype
                    and r["world"] == world
                ]
                ys.append(statistics.median(vals) if vals else 0.0)  # repeated: the median
            xs = [i + (k - len(PHASES) / 2 + 0.5) * width for i in range(len(SYSTEMS))]
            ax.bar(xs, ys, width, label=label)
        ax.set_xticks(range(len(SYSTEMS)))
        ax.set_xticklabels(SYSTEMS, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("seconds (slowest rank)")
        ax.set_title(f"{dtype}, {world} rank{'s' if world > 1 else ''}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Checkpoint phases per system (lower is better)")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)
    print(f"plot: {dst}")


if __name__ == "__main__":
    main()
