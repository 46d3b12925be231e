"""GPU tensors through ckptd over CUDA IPC: the daemon copies device → arena on save and writes
verified bytes host → device on load; the trainer's process copies nothing. Needs a CUDA GPU
(skipped otherwise); without one, tests/integration/gpu_ipc_test.cc checks the refusal and the
fallback, and tests/unit/service/gpu_ipc_test.cc the daemon's side over a fake GPU."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator

import pytest
import torch

import ckptd
from conftest import Daemon, free_port, start_daemon

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


# --- issue 38: the GPU claims that had never run on a device --------------------------------------


@pytest.mark.parametrize("two_futures", [False, True], ids=["one-future", "two-futures"])
@pytest.mark.parametrize("with_step", [True, False], ids=["step-in-id", "no-step"])
def test_dcp_async_save_of_gpu_tensors(daemon: Daemon, two_futures: bool, with_step: bool) -> None:
    # One future: async_save returns with the bytes in the daemon. Two futures (DCP's zero-overhead
    # recipe): staging_completion says so. Either way the trainer then changes its GPU tensors and
    # the checkpoint keeps the bytes of the call.
    import torch.distributed.checkpoint as dcp

    import ckptd.torch as ct

    name = f"gpu-async/{'two' if two_futures else 'one'}-{'s' if with_step else 'n'}"
    cid = f"{name}/step-7" if with_step else f"{name}/best"
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.Linear(1024, 256)).cuda()
    sd = {
        "model": model.state_dict(),
        "bf16": _random([333, 129], torch.bfloat16),
        "i64": _random([1000], torch.int64),
        "meta": {"epoch": 3},
    }
    want = {k: v.clone() for k, v in model.state_dict().items()}
    want["bf16"], want["i64"] = sd["bf16"].clone(), sd["i64"].clone()
    writer = ct.StorageWriter(cid, socket=daemon.socket, async_staging=two_futures)
    ckptd.reset_copy_stats()
    resp = dcp.async_save(sd, storage_writer=writer)
    if two_futures:
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        assert isinstance(resp, AsyncSaveResponse)
        resp.staging_completion.result(timeout=120)
        upload = resp.upload_completion
    else:
        upload = resp
    # The optimizer step: every saved tensor changes on the GPU.
    for p in model.parameters():
        p.data.fill_(-3.0)
    sd["bf16"].fill_(7.0)
    sd["i64"].fill_(-1)
    upload.result(timeout=120)
    if two_futures:
        writer.close()
    if with_step:
        assert ckptd.copy_stats()["gpu_fallback_bytes"] == 0  # the daemon copied every GPU byte
    out = {
        "model": {k: torch.zeros_like(v) for k, v in model.state_dict().items()},
        "bf16": torch.zeros_like(sd["bf16"]),
        "i64": torch.zeros_like(sd["i64"]),
        "meta": {"epoch": 0},
    }
    dcp.load(out, storage_reader=ct.StorageReader(cid, socket=daemon.socket))
    for k, v in out["model"].items():
        assert v.device.type == "cuda" and _same(v, want[k]), k
    assert _same(out["bf16"], want["bf16"]) and _same(out["i64"], want["i64"])
    assert out["meta"] == {"epoch": 3}


@pytest.fixture(scope="module", params=["ram", "disk"])
def tiered(request: pytest.FixtureRequest) -> Iterator[tuple[Daemon, str]]:
    """A daemon whose loads come from its RAM tier ("ram", the default options) or from its local
    tier ("disk": --ram_tier_keep_per_job=0, nothing kept hot)."""
    flags = [] if request.param == "ram" else ["--ram_tier_keep_per_job=0"]
    d = start_daemon(512 << 20, flags)
    try:
        yield d, str(request.param)
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)


def _check_tier(counts: dict[str, int], tier: str, nbytes: int) -> None:
    if tier == "ram":
        assert counts["bytes_read"] == 0 and counts["bytes_from_ram"] >= nbytes, counts
    else:
        assert counts["bytes_from_ram"] == 0 and counts["bytes_read"] >= nbytes, counts


def test_a_load_fans_the_same_bytes_to_host_and_gpu(tiered: tuple[Daemon, str]) -> None:
    # The same shard to a host tensor, to GPU tensors (twice) and half of it to a GPU view at an
    # offset of its allocation: every copy gets the checkpoint's bytes (e2cdc73: a run read
    # straight into one destination left another with stale bytes).
    d, tier = tiered
    x = _random([24, 1 << 18], torch.float32)  # 24 MiB: several read runs and copy pieces
    with ckptd.connect(d.socket) as c:
        c.save(f"gpu-fan-{tier}", 1, {"x": x}).committed().result()
        host = torch.zeros(x.shape, dtype=x.dtype)
        gpu = [torch.zeros_like(x), torch.zeros_like(x)]
        big = torch.zeros(13 * (1 << 18) + 4096, device="cuda")
        half = big[4096:].view(13, 1 << 18)
        ckptd.reset_copy_stats()
        counts = c.load_into_counted(
            f"gpu-fan-{tier}",
            1,
            [
                ("x", None, gpu[0]),
                ("x", None, host),
                ("x", ckptd.Box([7, 0], [13, 1 << 18]), half),
                ("x", None, gpu[1]),
            ],
        )
    _check_tier(counts, tier, x.numel() * 4)
    assert ckptd.copy_stats()["gpu_fallback_bytes"] == 0
    assert _same(host, x.cpu())
    assert _same(gpu[0], x) and _same(gpu[1], x)
    assert _same(half, x[7:20]) and not big[:4096].any()


def test_gpu_loads_at_another_layout_from_ram_and_disk(tiered: tuple[Daemon, str]) -> None:
    # Saved by two ranks as row halves (a box item) and as uneven flat pieces (ZeRO-style), from
    # GPU memory; loaded as column blocks, a flat range across both ranks' pieces and the whole
    # item, into GPU destinations (one block into host memory beside them).
    d, tier = tiered
    g = _random([1024, 3072], torch.float32)  # 12 MiB
    f = _random([3 * (1 << 20) + 5], torch.bfloat16)
    cut = 1_234_567
    job = f"gpu-reshard-{tier}"
    with ckptd.connect(d.socket) as c:
        handles = []
        for rank in range(2):
            rows = g[rank * 512 : (rank + 1) * 512]
            piece = f[:cut] if rank == 0 else f[cut:]
            region = ckptd.Flat(0, cut) if rank == 0 else ckptd.Flat(cut, f.numel() - cut)
            shards = {
                "g": ckptd.Shard(rows, [1024, 3072], ckptd.Box([rank * 512, 0], [512, 3072])),
                "f": ckptd.Shard(piece, [f.numel()], region),
            }
            handles.append(c.save(job, 1, shards, rank=rank, world_size=2))
        for h in handles:
            h.committed().result()
        cols = [torch.zeros(1024, 1024, device="cuda") for _ in range(2)]
        host_col = torch.zeros(1024, 1024)
        whole = torch.zeros_like(g)
        span = torch.zeros(2_000_000, device="cuda", dtype=torch.bfloat16)
        targets = [
            ("g", ckptd.Box([0, 0], [1024, 1024]), cols[0]),
            ("g", ckptd.Box([0, 1024], [1024, 1024]), host_col),
            ("g", ckptd.Box([0, 2048], [1024, 1024]), cols[1]),
            ("g", None, whole),
            ("f", ckptd.Flat(cut - 1_000_000, 2_000_000), span),
        ]
        ckptd.reset_copy_stats()
        counts = c.load_into_counted(job, 1, targets)
    _check_tier(counts, tier, g.numel() * 4)
    assert ckptd.copy_stats()["gpu_fallback_bytes"] == 0
    assert _same(cols[0], g[:, :1024]) and _same(cols[1], g[:, 2048:])
    assert _same(host_col, g[:, 1024:2048].cpu())
    assert _same(whole, g)
    assert _same(span, f[cut - 1_000_000 : cut + 1_000_000])


def _expected(step: int, i: int, n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32, device="cuda") * (step + 1) + i


def test_a_client_killed_mid_copy() -> None:
    # A trainer saving 2 GiB of GPU tensors step after step is SIGKILLed in the middle of a Save:
    # half the shortest earlier Save's time after it began, when the daemon is copying its GPU
    # memory over CUDA IPC (about 40 ms of a Save of 2 GiB on an H200). The daemon goes on;
    # every checkpoint of that trainer ends COMMITTED with its bytes, or ABORTED (or never
    # existed); a new client saves and loads GPU tensors.
    d = start_daemon(12 << 30, ["--stage_timeout_ms=3000"])
    n = 128 << 20  # 512 MiB of float32 per tensor, four tensors
    try:
        code = f"""
            import time, torch, ckptd
            c = ckptd.connect({d.socket!r})
            def expected(step, i, n):
                return torch.arange(n, dtype=torch.float32, device="cuda") * (step + 1) + i
            for step in range(1, 1000):
                xs = {{f"x{{i}}": expected(step, i, {n}) for i in range(4)}}
                torch.cuda.synchronize()
                print("saving", step, flush=True)
                t0 = time.perf_counter()
                c.save("gpu-midcopy", step, xs)
                print("saved", step, time.perf_counter() - t0, flush=True)
        """
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        killed_at = 0
        took: list[float] = []
        for line in child.stdout:
            words = line.split()
            if words[0] == "saved":
                took.append(float(words[2]))
            elif int(words[1]) == 4:
                time.sleep(min(took) / 2)
                child.send_signal(signal.SIGKILL)  # in the middle of step 4's Save
                killed_at = 4
                break
        print(f"Saves of steps 1-3 took {took} s; killed {min(took) / 2:.4f} s into step 4's")
        child.wait(timeout=60)
        assert killed_at == 4, child.stderr.read() if child.stderr else ""
        assert d.proc.poll() is None, "the daemon died with its client"
        states: dict[int, str] = {}
        with ckptd.connect(d.socket) as c:
            for step in range(1, killed_at + 1):
                deadline = time.monotonic() + 60
                while True:
                    try:
                        state = c.status("gpu-midcopy", step)["state"]
                    except ckptd.NotFoundError:
                        state = "NOT_FOUND"
                    if (
                        state in ("COMMITTED", "ABORTED", "NOT_FOUND")
                        or time.monotonic() > deadline
                    ):
                        break
                    time.sleep(0.1)
                states[step] = state
                if state == "COMMITTED":
                    out = {f"x{i}": torch.empty(n, device="cuda") for i in range(4)}
                    c.load_into("gpu-midcopy", step, [(k, None, v) for k, v in out.items()])
                    for i in range(4):
                        assert torch.equal(out[f"x{i}"], _expected(step, i, n)), (step, i)
            print(f"states after the kill: {states}")
            assert all(states[s] == "COMMITTED" for s in range(1, killed_at)), states
            assert states[killed_at] in ("COMMITTED", "ABORTED", "NOT_FOUND"), states
            # The daemon serves a new client, GPU memory both ways, its arena not leaked.
            for step in (100, 101, 102):
                xs = {f"x{i}": _expected(step, i, n) for i in range(4)}
                c.save("gpu-midcopy", step, xs).committed().result()
                back = torch.empty(n, device="cuda")
                c.load_into("gpu-midcopy", step, [("x3", None, back)])
                assert torch.equal(back, xs["x3"])
        assert d.proc.poll() is None
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)


def test_gpu_uuid_visible_devices(daemon: Daemon) -> None:
    # A client that names its GPU by UUID in CUDA_VISIBLE_DEVICES: the daemon (which sees every
    # GPU by its own ordinals) finds the allocation by the GPU's UUID.
    uuid = str(torch.cuda.get_device_properties(0).uuid)
    r = _run(
        f"""
        import torch, ckptd
        ckptd.reset_copy_stats()
        with ckptd.connect({daemon.socket!r}) as c:
            x = torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 3
            c.save("gpu-uuid", 1, {{"x": x}}).committed().result()
            y = torch.empty_like(x)
            c.load_into("gpu-uuid", 1, [("x", None, y)])
            assert torch.equal(x, y)
        print("fallback", ckptd.copy_stats()["gpu_fallback_bytes"], flush=True)
        """,
        env={"CUDA_VISIBLE_DEVICES": f"GPU-{uuid}"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "0", r.stdout
    with ckptd.connect(daemon.socket) as c:
        back = torch.empty(1 << 20, device="cuda")
        c.load_into("gpu-uuid", 1, [("x", None, back)])
        assert torch.equal(back, torch.arange(1 << 20, dtype=torch.float32, device="cuda") * 3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_two_gpus_in_another_order(daemon: Daemon) -> None:
    # The client sees the GPUs in the other order (CUDA_VISIBLE_DEVICES=1,0): its cuda:0 is the
    # daemon's GPU 1. The daemon maps each allocation by the GPU's UUID, not the ordinal.
    r = _run(
        f"""
        import torch, ckptd
        ckptd.reset_copy_stats()
        with ckptd.connect({daemon.socket!r}) as c:
            a = torch.arange(1 << 20, dtype=torch.float32, device="cuda:0")
            b = -torch.arange(1 << 20, dtype=torch.float32, device="cuda:1")
            c.save("gpu-order", 1, {{"a": a, "b": b}}).committed().result()
            a2, b2 = torch.empty_like(b), torch.empty_like(a)
            c.load_into("gpu-order", 1, [("a", None, a2), ("b", None, b2)])
            assert torch.equal(a2.cpu(), a.cpu()) and torch.equal(b2.cpu(), b.cpu())
        print("fallback", ckptd.copy_stats()["gpu_fallback_bytes"], flush=True)
        """,
        env={"CUDA_VISIBLE_DEVICES": "1,0"},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-1] == "0", r.stdout
    with ckptd.connect(daemon.socket) as c:  # here in the daemon's order: a on cuda:1
        a = torch.empty(1 << 20, device="cuda:1")
        c.load_into("gpu-order", 1, [("a", None, a)])
        assert torch.equal(a, torch.arange(1 << 20, dtype=torch.float32, device="cuda:1"))


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed")
@pytest.mark.parametrize("stage,bf16", [(1, False), (2, True)], ids=["zero1-fp32", "zero2-bf16"])
def test_deepspeed_zero_on_a_gpu(daemon: Daemon, stage: int, bf16: bool) -> None:
    # ckptd.deepspeed on a CUDA accelerator (NCCL, one rank): the fp32 masters and Adam moments
    # of ZeRO-1/2 partitions on the GPU saved through the daemon, loaded into a fresh engine,
    # bit-exact, and training goes on identically.
    r = _run(
        f"""
        import torch, deepspeed, ckptd
        import ckptd.deepspeed as ckds
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        deepspeed.init_distributed(dist_backend="nccl")

        def engine(seed):
            torch.manual_seed(seed)
            model = torch.nn.Sequential(
                torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64)
            ).cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            cfg = {{
                "train_batch_size": 8, "train_micro_batch_size_per_gpu": 8,
                "zero_optimization": {{"stage": {stage}}}, "zero_allow_untested_optimizer": True,
                "steps_per_print": 1 << 30, "bf16": {{"enabled": {bf16}}},
            }}
            return deepspeed.initialize(model=model, optimizer=opt, config=cfg)[0]

        def step(e, s):
            g = torch.Generator(device="cuda").manual_seed(s)
            dtype = next(e.module.parameters()).dtype
            x = torch.randn(8, 64, device="cuda", generator=g).to(dtype)
            loss = e(x).float().pow(2).mean()
            e.backward(loss)
            e.step()
            return float(loss)

        def full(e):
            out = {{}}
            for n, p in e.module.named_parameters():
                out["fp32/" + n] = safe_get_full_fp32_param(p).clone()
                for k in ("exp_avg", "exp_avg_sq"):
                    out[k + "/" + n] = safe_get_full_optimizer_state(p, k).clone()
            return out

        c = ckptd.connect({daemon.socket!r})
        e = engine(0)
        assert next(e.module.parameters()).is_cuda
        for s in range(3):
            step(e, s)
        ckptd.reset_copy_stats()
        ckds.save(e, c, "gpu-ds{stage}", 3).committed().result()
        fallback = ckptd.copy_stats()["gpu_fallback_bytes"]
        want = full(e)
        e2 = engine(1)
        loaded = ckds.load(e2, c, "gpu-ds{stage}")
        assert loaded.step == 3 and e2.global_steps == 3, (loaded.step, e2.global_steps)
        got = full(e2)
        for k in want:
            assert torch.equal(want[k], got[k]), k
        for (n, p), (_, q) in zip(e.module.named_parameters(), e2.module.named_parameters()):
            assert torch.equal(p, q), n
        assert step(e, 3) == step(e2, 3)
        for k, v in full(e).items():
            assert torch.equal(v, full(e2)[k]), k
        print("ok fallback", fallback, flush=True)
        """,
        env={
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            "DS_ACCELERATOR": "cuda",
        },
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-8000:]
    assert "ok fallback 0" in r.stdout, r.stdout[-4000:]
