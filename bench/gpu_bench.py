"""GPU data-plane benchmark (issues 13 and 38): run on a machine with an NVIDIA GPU, next to the
baselines, in one process, rounds interleaved. Prints one JSON object and writes it to --out.

- D2H staging: ckptd Client.save() of CUDA tensors (the daemon copies device → its pinned arena
  over CUDA IPC; save() returns once staged) against a plain pinned copy of the same bytes
  (tensor.copy_ into pinned host memory, synchronized). Goal: >= 0.9x its GB/s.
- H2D restore: ckptd Client.load_into() CUDA destinations (the daemon verifies and copies
  host → device) against a plain pinned host → device copy: from the RAM tier (the checkpoint
  just saved is hot: its bytes are in the daemon's pinned arena; goal >= 0.9x), and, with
  CKPTD_COLD_SOCKET set to a daemon whose RAM tier is off, from its local tier (bounded by the
  disk, not by PCIe). The cold restore's baseline is the disk itself: a sequential O_DIRECT read
  (dd, 16 MiB blocks) of a file of the same size in --disk_dir (the cold daemon's file system),
  one per round, interleaved.
- dcp.async_save stall: the time async_save() blocks the trainer, ckptd.torch's StorageWriter
  against DCP's FileSystemWriter, on the same GPU state dict. Goal: <= 0.1x.

Usage: CKPTD_SOCKET=... python bench/gpu_bench.py --gib 2 --rounds 5 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

import torch

import ckptd


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def _tensors(total_bytes: int, count: int) -> dict[str, torch.Tensor]:
    per = total_bytes // count // 2  # bf16
    return {
        f"layer{i}.w": torch.randn(per, device="cuda", dtype=torch.bfloat16) for i in range(count)
    }


def bench_d2h(c: ckptd.Client, tensors: dict[str, torch.Tensor], rounds: int) -> dict[str, float]:
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    pinned = {k: torch.empty_like(v, device="cpu").pin_memory() for k, v in tensors.items()}
    ckptd_s: list[float] = []
    plain_s: list[float] = []
    c.save("bench-gpu", 0, tensors).committed().result()  # warm-up: registration, arena pinning
    for r in range(1, rounds + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k, v in tensors.items():
            pinned[k].copy_(v, non_blocking=True)
        torch.cuda.synchronize()
        plain_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        h = c.save("bench-gpu", r, tensors)
        ckptd_s.append(time.perf_counter() - t0)
        h.committed().result()
        c.delete("bench-gpu", r - 1)
    ck, pl = statistics.median(ckptd_s), statistics.median(plain_s)
    return {
        "bytes": nbytes,
        "ckptd_save_gbps": _gbps(nbytes, ck),
        "pinned_copy_gbps": _gbps(nbytes, pl),
        "ratio": pl / ck,
        "ckptd_rounds_s": ckptd_s,
        "pinned_rounds_s": plain_s,
        "step": rounds,
    }


def _disk_file(directory: str, nbytes: int) -> str:
    """A file of nbytes (rounded up to 16 MiB) in directory, written with O_DIRECT and synced."""
    path = os.path.join(directory, "gpu_bench_disk.bin")
    blocks = max(1, (nbytes + (16 << 20) - 1) >> 24)
    subprocess.run(
        [
            "dd",
            "if=/dev/urandom",
            f"of={path}",
            "bs=16M",
            f"count={blocks}",
            "oflag=direct",
            "conv=fdatasync",
            "status=none",
        ],
        check=True,
    )
    return path


def _disk_read(path: str) -> float:
    """Seconds of one sequential O_DIRECT read of path (dd, 16 MiB blocks)."""
    t0 = time.perf_counter()
    subprocess.run(
        ["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct", "status=none"], check=True
    )
    return time.perf_counter() - t0


def bench_h2d(
    c: ckptd.Client,
    tensors: dict[str, torch.Tensor],
    step: int,
    rounds: int,
    disk_file: str | None = None,
) -> dict[str, object]:
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    dest = {k: torch.empty_like(v) for k, v in tensors.items()}
    pinned = {k: v.cpu().pin_memory() for k, v in tensors.items()}
    host = {k: torch.empty_like(v, device="cpu") for k, v in tensors.items()}
    ckptd_s: list[float] = []
    plain_s: list[float] = []
    host_s: list[float] = []
    disk_s: list[float] = []
    for _ in range(rounds):
        if disk_file:
            disk_s.append(_disk_read(disk_file))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for k, v in dest.items():
            v.copy_(pinned[k], non_blocking=True)
        torch.cuda.synchronize()
        plain_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        counts = c.load_into_counted("bench-gpu", step, [(k, None, v) for k, v in dest.items()])
        ckptd_s.append(time.perf_counter() - t0)
        # The same load into host memory: the same reads, no device copy.
        t0 = time.perf_counter()
        c.load_into("bench-gpu", step, [(k, None, v) for k, v in host.items()])
        host_s.append(time.perf_counter() - t0)
    for k, v in tensors.items():
        assert torch.equal(dest[k], v), k
    ck, pl, ho = (statistics.median(x) for x in (ckptd_s, plain_s, host_s))
    disk: dict[str, object] = {}
    if disk_file:
        dk = statistics.median(disk_s)
        disk_bytes = os.path.getsize(disk_file)
        disk = {
            "disk_read_gbps": _gbps(disk_bytes, dk),
            "disk_read_best_gbps": _gbps(disk_bytes, min(disk_s)),
            "vs_disk": _gbps(nbytes, ck) / _gbps(disk_bytes, dk),
            "vs_disk_best": _gbps(nbytes, ck) / _gbps(disk_bytes, min(disk_s)),
            "disk_rounds_s": disk_s,
        }
    return {
        **disk,
        "bytes": nbytes,
        "ckptd_load_gbps": _gbps(nbytes, ck),
        "pinned_copy_gbps": _gbps(nbytes, pl),
        "ckptd_load_to_host_gbps": _gbps(nbytes, ho),
        "ratio": pl / ck,
        "gpu_vs_host_load": ho / ck,
        "ckptd_rounds_s": ckptd_s,
        "pinned_rounds_s": plain_s,
        "host_rounds_s": host_s,
        "last_load_counts": counts,
    }


def bench_async_save(
    socket: str, tensors: dict[str, torch.Tensor], rounds: int
) -> dict[str, float]:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import ckptd.torch as ct

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("gloo", rank=0, world_size=1)

    def stall(writer: object) -> float:
        """How long async_save blocks the caller; then waits for the save to finish."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fut = dcp.async_save(dict(tensors), storage_writer=writer)
        blocked = time.perf_counter() - t0
        fut.result()
        return blocked

    ckptd_s: list[float] = []
    shared_s: list[float] = []
    dcp_s: list[float] = []
    with (
        tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d,
        ckptd.connect(socket) as c,
    ):
        for r in range(rounds + 1):  # round 0 warms every writer up
            times = (
                stall(dcp.FileSystemWriter(f"{d}/{r}")),
                stall(ct.StorageWriter(f"bench-dcp/{r}", socket=socket)),
                # Without a socket: the process-wide client on $CKPTD_SOCKET.
                stall(ct.StorageWriter(f"bench-dcp2/{r}")),
            )
            if r:
                for out, t in zip((dcp_s, ckptd_s, shared_s), times, strict=True):
                    out.append(t)
            # Each round's checkpoints go: 3 x the state per round would fill a small disk.
            shutil.rmtree(f"{d}/{r}")
            c.delete("bench-dcp", r)
            c.delete("bench-dcp2", r)
    ck, sh, base = (statistics.median(x) for x in (ckptd_s, shared_s, dcp_s))
    return {
        "ckptd_stall_s": ck,
        "ckptd_shared_client_stall_s": sh,
        "dcp_stall_s": base,
        "ratio": ck / base,
        "shared_client_ratio": sh / base,
        "ckptd_rounds_s": ckptd_s,
        "ckptd_shared_client_rounds_s": shared_s,
        "dcp_rounds_s": dcp_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=2.0)
    ap.add_argument("--tensors", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="")
    ap.add_argument(
        "--disk_dir",
        default=os.environ.get("BENCH_DIR") or tempfile.gettempdir(),
        help="where the cold restore's disk baseline file goes (the cold daemon's file system)",
    )
    a = ap.parse_args()
    socket = os.environ["CKPTD_SOCKET"]
    torch.manual_seed(0)
    tensors = _tensors(int(a.gib * (1 << 30)), a.tensors)
    out: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "gib": a.gib,
        "tensors": a.tensors,
    }
    ckptd.reset_copy_stats()
    with ckptd.connect(socket) as c:
        d2h = bench_d2h(c, tensors, a.rounds)
        out["d2h"] = d2h
        out["h2d"] = bench_h2d(c, tensors, int(d2h["step"]), a.rounds)
    cold_socket = os.environ.get("CKPTD_COLD_SOCKET")
    if cold_socket:
        with ckptd.connect(cold_socket) as cold:
            cold.save("bench-gpu", 1, tensors).committed().result()
            nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
            disk_file = _disk_file(a.disk_dir, nbytes)
            try:
                out["h2d_cold"] = bench_h2d(cold, tensors, 1, a.rounds, disk_file)
            finally:
                os.unlink(disk_file)
    out["gpu_fallback_bytes"] = ckptd.copy_stats()["gpu_fallback_bytes"]
    out["async_save"] = bench_async_save(socket, tensors, a.rounds)
    text = json.dumps(out, indent=1)
    print(text, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
