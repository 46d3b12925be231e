"""Import throughput of each importer (`python3 -m ckptd import --format F`) against the disk's
read bandwidth, one run, rounds rotating the order.

The sources are the same tensors (fp32, --mib in all) written by each format's own writer:
safetensors.torch.save_file, torch.save, and DCP's FileSystemWriter (dcp.save, one process), plus
a DeepSpeed ZeRO-2 checkpoint (engine.save_checkpoint of tests/python/deepspeed_rig.py's model at
DP=2) with --deepspeed_dims. The page cache is dropped before each import; the import reads the
source and the daemon writes it to the same disk (its RAM tier off). The bar is the better of
fio's sequential O_DIRECT and buffered reads of a file of the same size; beside it, a sequential
copy of such a file on the same disk (dd, O_DIRECT, fsynced), the floor of anything that reads a
source and writes it durably on one disk. The import's time is its
own (ImportResult.elapsed_s: from opening the source to COMMITTED, without the interpreter's start).

    python3 bench/import_bench.py --daemon build/ckptd --dir /var/tmp/imp [--mib 1024]
        [--rounds 2] [--formats safetensors,torch,dcp,deepspeed] [--out bench/results/import.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_common import GB, drop_caches, fio_read, median, start_daemon, tree_bytes

import ckptd

ROOT = Path(__file__).resolve().parents[1]
RIG = ROOT / "tests" / "python" / "deepspeed_rig.py"
sys.path.insert(0, str(RIG.parent))
from deepspeed_rig import rank_envs  # noqa: E402  (the rig's ranks' environment)


def state(mib: int) -> dict[str, Any]:
    import torch

    n = 16
    rows = (mib << 20) // n // 4 // 4096
    g = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(rows, 4096, generator=g) for i in range(n)}


def write_sources(base: Path, mib: int, formats: list[str], ds_dims: str) -> dict[str, Path]:
    import torch

    out: dict[str, Path] = {}
    tensors = state(mib) if set(formats) - {"deepspeed"} else {}
    if "safetensors" in formats:
        from safetensors.torch import save_file

        out["safetensors"] = base / "model.safetensors"
        save_file(tensors, str(out["safetensors"]))
    if "torch" in formats:
        out["torch"] = base / "model.pt"
        torch.save(tensors, out["torch"])
    if "dcp" in formats:
        import torch.distributed.checkpoint as dcp

        out["dcp"] = base / "dcp"
        dcp.save(tensors, storage_writer=dcp.FileSystemWriter(str(out["dcp"])))
    if "deepspeed" in formats:
        out["deepspeed"] = deepspeed_source(base, ds_dims)
    return out


def deepspeed_source(base: Path, dims: str) -> Path:
    """A ZeRO-2 checkpoint written by DeepSpeed's own save_checkpoint at DP=2 (the rig's model)."""
    saved = base / "deepspeed"
    argv = [sys.executable, str(RIG), "train", "--stage", "2", "--dp", "2", "--dims", dims]
    argv += ["--via", "deepspeed", "--ds_dir", str(saved), "--next_steps", "0", "--no_check"]
    argv += ["--out", str(base / "rig"), "--tag", "ds"]
    procs = [subprocess.Popen(argv, env=env) for env in rank_envs(2, "")]
    if any(p.wait() for p in procs):
        sys.exit("bench: the DeepSpeed run that writes the source failed")
    return saved


def copy_rate(src: str, dst: str, nbytes: int) -> float:
    """Bytes per second of a sequential copy of `src` to `dst` on the same disk, O_DIRECT both
    ways and fsynced (dd): what an import, which reads the source and has the daemon write it,
    can do at best."""
    drop_caches(os.path.dirname(src))
    started = time.monotonic()
    subprocess.run(
        ["dd", f"if={src}", f"of={dst}", "bs=16M", "iflag=direct", "oflag=direct", "conv=fsync"],
        check=True,
        capture_output=True,
    )
    rate = nbytes / (time.monotonic() - started)
    os.unlink(dst)
    return rate


def run_import(sock: str, fmt: str, job: str, path: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "ckptd", "import", "--socket", sock, "--quiet", "--json"]
    cmd += ["--format", fmt, job, "1", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"bench: import {fmt} failed ({done.returncode}):\n{done.stderr}")
    return dict(json.loads(done.stdout))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--daemon", default=str(ROOT / "build" / "ckptd"))
    p.add_argument("--dir", required=True)
    p.add_argument("--mib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--formats", default="safetensors,torch,dcp,deepspeed")
    p.add_argument("--deepspeed_dims", default="1024,4096,32768,3", help="see deepspeed_rig.py")
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "import.jsonl"))
    args = p.parse_args()
    formats = [f for f in args.formats.split(",") if f]

    base = Path(args.dir)
    shutil.rmtree(base, ignore_errors=True)
    (base / "state").mkdir(parents=True)
    sources = write_sources(base, args.mib, formats, args.deepspeed_dims)
    daemon, sock = start_daemon(
        args.daemon, str(base / "state"), 2048 << 20, ("--ram_tier_keep_per_job=0",)
    )
    rows: list[dict[str, Any]] = []
    client = ckptd.connect(sock)
    try:
        fio_file = str(base / "fio.dat")
        nbytes = max(tree_bytes(s) for s in sources.values())
        for r in range(args.rounds):
            bar = max(fio_read(fio_file, nbytes, direct=True), fio_read(fio_file, nbytes, False))
            copy = copy_rate(fio_file, str(base / "copy.dat"), nbytes)
            order = formats[r % len(formats) :] + formats[: r % len(formats)]
            for fmt in order:
                drop_caches(str(base))
                started = time.time()
                got = run_import(sock, fmt, f"imp-{fmt}-{r}", sources[fmt])
                row = {
                    "bench": "import",
                    "format": fmt,
                    "round": r,
                    "source_bytes": tree_bytes(sources[fmt]),
                    "tensor_bytes": got["bytes"],
                    "ranks": got["world_size"],
                    "elapsed_s": got["elapsed_s"],
                    "process_s": time.time() - started,
                    "import_gbps": got["bytes"] / got["elapsed_s"] / GB,
                    "disk_read_gbps": bar / GB,
                }
                row["disk_copy_gbps"] = copy / GB
                row["ratio_to_disk_read"] = row["import_gbps"] / row["disk_read_gbps"]
                row["ratio_to_disk_copy"] = row["import_gbps"] / row["disk_copy_gbps"]
                rows.append(row)
                print(json.dumps(row), flush=True)
                client.delete(f"imp-{fmt}-{r}", 1)  # the disk holds one copy at a time
    finally:
        client.close()
        daemon.terminate()
        daemon.wait()
        shutil.rmtree(base, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "a") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    for fmt in formats:
        mine = [x for x in rows if x["format"] == fmt]
        print(
            f"import {fmt:12s} {median([x['import_gbps'] for x in mine]):.2f} GB/s, "
            f"{median([x['ratio_to_disk_read'] for x in mine]):.2f}x the disk's best read "
            f"({median([x['disk_read_gbps'] for x in mine]):.2f} GB/s), "
            f"{median([x['ratio_to_disk_copy'] for x in mine]):.2f}x a copy on the same disk "
            f"({median([x['disk_copy_gbps'] for x in mine]):.2f} GB/s)"
        )


if __name__ == "__main__":
    main()
