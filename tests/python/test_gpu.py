"""GPU tensors through ckptd over CUDA IPC: the daemon copies device → arena on save and writes
verified bytes host → device on load; the trainer's process copies nothing. Needs a CUDA GPU
(skipped otherwise); without one, tests/integration/gpu_ipc_test.cc checks the refusal and the
fallback, and tests/unit/service/gpu_ipc_test.cc the daemon's side over a fake GPU."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ckptd
from conftest import Daemon

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float64,
    torch.int64,
    torch.int32,
    torch.int8,
    torch.uint8,
    torch.bool,
]
if hasattr(torch, "float8_e4m3fn"):
    DTYPES += [torch.float8_e4m3fn, torch.float8_e5m2]


def _random(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    raw = torch.randint(
        0,
        256,
        (max(1, int(torch.Size(shape).numel())) * dtype.itemsize,),
        dtype=torch.uint8,
        device="cuda",
    )
    if dtype == torch.bool:
        return (raw[: torch.Size(shape).numel()] & 1).bool().reshape(shape)
    return raw.view(dtype)[: torch.Size(shape).numel()].reshape(shape)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape, dtype and bytes."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    raw_a = a.contiguous().reshape(-1).view(torch.uint8)
    raw_b = b.contiguous().reshape(-1).view(torch.uint8)
    return bool(torch.equal(raw_a, raw_b))


def test_gpu_tensors_save_and_load_over_ipc_bit_exact(daemon: Daemon) -> None:
    ckptd.reset_copy_stats()
    tensors = {f"t.{str(d).split('.')[-1]}": _random([33, 65], d) for d in DTYPES}
    tensors["scalar"] = torch.tensor(3.25, device="cuda")
    tensors["empty"] = torch.empty(0, 7, device="cuda")
    big = _random([4096 + 17], torch.float32)
    tensors["offset"] = big[17:]  # a view at a non-zero offset inside its allocation
    tensors["transposed"] = _random([64, 48], torch.bfloat16).t()  # not contiguous
    saved = {k: v.clone() for k, v in tensors.items()}
    with ckptd.connect(daemon.socket) as c:
        h = c.save("gpu-ipc", 1, tensors)
        for t in tensors.values():  # staged: the tensors are the trainer's again
            t.untyped_storage().fill_(0)
        h.committed().result()
        out = {k: torch.empty_like(v, device="cuda").contiguous() for k, v in saved.items()}
        c.load_into("gpu-ipc", 1, [(k, None, v) for k, v in out.items()])
        for k in saved:
            assert _same(out[k], saved[k]), k
        # Another layout: a box of one item into a GPU destination at an offset of its allocation.
        dest = torch.zeros(100, device="cuda", dtype=torch.float32)
        c.load_into("gpu-ipc", 1, [("t.float32", ckptd.Box([3, 10], [2, 40]), dest[20:100])])
        assert _same(dest[20:100].reshape(2, 40), saved["t.float32"][3:5, 10:50])
        assert not dest[:20].any()
    stats = ckptd.copy_stats()
    assert stats["gpu_fallback_bytes"] == 0, stats  # every GPU byte went through the daemon


def test_dcp_save_and_load_of_a_gpu_model_needs_no_change(daemon: Daemon) -> None:
    import torch.distributed.checkpoint as dcp

    import ckptd.torch as ct

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    model = model.cuda().to(torch.bfloat16)
    want = {k: v.clone() for k, v in model.state_dict().items()}
    ckptd.reset_copy_stats()
    dcp.save(model.state_dict(), storage_writer=ct.StorageWriter("dcp-gpu/1", socket=daemon.socket))
    for p in model.parameters():
        p.data.zero_()
    state = model.state_dict()
    dcp.load(state, storage_reader=ct.StorageReader("dcp-gpu/1", socket=daemon.socket))
    for k, v in want.items():
        assert state[k].device.type == "cuda"
        assert _same(state[k], v), k
    assert ckptd.copy_stats()["gpu_fallback_bytes"] == 0


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_client_killed_while_the_daemon_holds_its_handles(daemon: Daemon) -> None:
    # The child registers two allocations (a save, a load) and is killed without a goodbye: the
    # daemon ends its session, closes the handles and goes on serving.
    r = _run(f"""
        import os, signal, torch, ckptd
        c = ckptd.connect({daemon.socket!r})
        x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
        c.save("gpu-kill", 1, {{"x": x}}).committed().result()
        y = torch.empty_like(x)
        c.load_into("gpu-kill", 1, [("x", None, y)])
        assert torch.equal(x, y)
        print("saved", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert "saved" in r.stdout, r.stderr
    assert daemon.proc.poll() is None
    with ckptd.connect(daemon.socket) as c:
        back = torch.empty(1 << 20, device="cuda")
        c.load_into("gpu-kill", 1, [("x", None, back)])
        assert torch.equal(back, torch.arange(1 << 20, dtype=torch.float32, device="cuda"))
        c.save("gpu-kill", 2, {"x": back}).committed().result()


def test_expandable_segments_work_through_the_fallback_or_ipc(daemon: Daemon) -> None:
    r = _run(
        f"""
        import torch, ckptd
        ckptd.reset_copy_stats()
        with ckptd.connect({daemon.socket!r}) as c:
            x = torch.randn(1000, 333, device="cuda")
            c.save("gpu-expandable", 1, {{"x": x}}).committed().result()
            y = torch.empty_like(x)
            c.load_into("gpu-expandable", 1, [("x", None, y)])
            assert torch.equal(x, y)
        print("fallback", ckptd.copy_stats()["gpu_fallback_bytes"], flush=True)
        """,
        env={"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    assert r.returncode == 0, r.stderr
    fallback = int(r.stdout.split()[-1])
    print(f"expandable segments: {fallback} bytes copied by the library; stderr: {r.stderr!r}")
    if fallback:  # legacy IPC cannot share expandable segments: said once, copied by the library
        assert "cannot be shared over CUDA IPC" in r.stderr


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus(daemon: Daemon) -> None:
    with ckptd.connect(daemon.socket) as c:
        a = torch.randn(1000, device="cuda:0")
        b = torch.randn(1000, device="cuda:1")
        c.save("gpu-two", 1, {"a": a, "b": b}).committed().result()
        a2, b2 = torch.empty_like(b), torch.empty_like(a)  # each loaded onto the other GPU
        c.load_into("gpu-two", 1, [("a", None, a2), ("b", None, b2)])
        assert torch.equal(a2.cpu(), a.cpu()) and torch.equal(b2.cpu(), b.cpu())
