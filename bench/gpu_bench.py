"""GPU data-plane benchmark (issue 13): run on a machine with an NVIDIA GPU, next to the baselines,
in one process, rounds interleaved. Prints one JSON object and writes it to --out.

- D2H staging: ckptd Client.save() of CUDA tensors (the daemon copies device → its pinned arena
  over CUDA IPC; save() returns once staged) against a plain pinned copy of the same bytes
  (tensor.copy_ into pinned host memory, synchronized). Goal: >= 0.8x its GB/s.
- H2D restore: ckptd Client.load_into() CUDA destinations (the daemon verifies and copies
  host → device) against a plain pinned host → device copy: from the RAM tier (the checkpoint
  just saved is hot: its bytes are in the daemon's pinned arena), and, with CKPTD_COLD_SOCKET set
  to a daemon whose RAM tier is off, from its local tier (bounded by the disk, not by PCIe).
- dcp.async_save stall: the time async_save() blocks the trainer, ckptd.torch's StorageWriter
  against DCP's FileSystemWriter, on the same GPU state dict. Goal: <= 0.5x.

Usage: CKPTD_SOCKET=... python bench/gpu_bench.py --gib 2 --rounds 5 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
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


def bench_h2d(
    c: ckptd.Client, tensors: dict[str, torch.Tensor], step: int, rounds: int
) -> dict[str, object]:
    nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
    dest = {k: torch.empty_like(v) for k, v in tensors.items()}
    pinned = {k: v.cpu().pin_memory() for k, v in tensors.items()}
    host = {k: torch.empty_like(v, device="cpu") for k, v in tensors.items()}
    ckptd_s: list[float] = []
    plain_s: list[float] = []
    host_s: list[float] = []
    for _ in range(rounds):
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
    return {
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
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as d:
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
            out["h2d_cold"] = bench_h2d(cold, tensors, 1, a.rounds)
    out["gpu_fallback_bytes"] = ckptd.copy_stats()["gpu_fallback_bytes"]
    out["async_save"] = bench_async_save(socket, tensors, a.rounds)
    text = json.dumps(out, indent=1)
    print(text, flush=True)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
