"""The remote tier from Python (docs/OPERATIONS.md "Tiers"): a client saving with
tier_policy="local+remote",
wait(until="remote"), the upload shown in status, and a second daemon with an empty state dir
(a fresh node) loading the checkpoint from the shared directory alone, in another layout."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import ckptd
from conftest import Daemon, start_daemon


def stop(d: Daemon) -> None:
    d.stop()
    shutil.rmtree(d.state_dir, ignore_errors=True)


def test_local_and_remote_then_a_fresh_node_loads_from_the_store(store: str) -> None:
    a = start_daemon(flags=[f"--remote_dir={store}"])
    try:
        c = ckptd.connect(a.socket, tier_policy="local+remote")
        w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)
        for rank in range(2):  # two row halves
            rows = w[rank * 32 : (rank + 1) * 32]
            shard = ckptd.Shard(
                rows, global_shape=w.shape, region=ckptd.Box((rank * 32, 0), (32, 32))
            )
            c.save("pyremote", 5, {"w": shard}, {"meta": {"lr": 0.1}}, rank=rank, world_size=2)
        info = c.wait("pyremote", 5, until="remote", timeout_ms=30000)
        assert info["tiers"]["local"] and info["tiers"]["remote"]
        assert info["upload"]["state"] == "durable"
        assert info["upload"]["store"] == f"posix:{store}"
        with pytest.raises(ckptd.FailedPreconditionError):
            local = ckptd.connect(a.socket, tier_policy="local")
            local.save("pyremote", 6, {"w": w})
            local.wait("pyremote", 6, until="remote", timeout_ms=1000)
        with pytest.raises(ValueError, match="tier_policy"):
            ckptd.connect(a.socket, tier_policy="cloud")
    finally:
        stop(a)

    b = start_daemon(flags=[f"--remote_dir={store}"])
    try:
        c = ckptd.connect(b.socket)
        assert c.latest("pyremote") == 5  # step 6 was saved local only
        status = c.status("pyremote", 5)
        assert status["tiers"]["remote"] and not status["tiers"]["local"]
        got = c.load("pyremote", 5, items=["w"], objects=["meta"])
        np.testing.assert_array_equal(got.tensors["w"], w)
        assert got.objects["meta"] == {"lr": 0.1}
        assert got.bytes_read > 0 and got.bytes_read_remote == got.bytes_read
        # Another layout: a column half, read from the store alone.
        cols = np.zeros((64, 16), dtype=np.float32)
        c.load("pyremote", 5, into={"w": (cols, ckptd.Box((0, 16), (64, 16)))})
        np.testing.assert_array_equal(cols, w[:, 16:])
    finally:
        stop(b)


def test_dcp_save_with_a_remote_tier_loads_on_a_fresh_node(store: str) -> None:
    """ckptd.torch needs no change beyond configuration: StorageWriter(tier_policy=...)."""
    torch = pytest.importorskip("torch")
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    import ckptd.torch as ct

    sd = {"w": torch.randn(48, 16), "b": torch.arange(16, dtype=torch.bfloat16), "step": 7}
    a = start_daemon(flags=[f"--remote_dir={store}"])
    try:
        writer = ct.StorageWriter("dcp/remote/step-3", socket=a.socket, tier_policy="local+remote")
        dcp.save(sd, storage_writer=writer)
        c = ckptd.connect(a.socket)
        assert c.wait("dcp.remote", 3, until="remote", timeout_ms=30000)["tiers"]["remote"]
    finally:
        stop(a)
    b = start_daemon(flags=[f"--remote_dir={store}"])
    try:
        out = {"w": torch.zeros(48, 16), "b": torch.zeros(16, dtype=torch.bfloat16), "step": 0}
        dcp.load(out, storage_reader=ct.StorageReader("dcp/remote/step-3", socket=b.socket))
        assert torch.equal(out["w"], sd["w"]) and torch.equal(out["b"], sd["b"])
        assert out["step"] == 7
    finally:
        stop(b)
