"""The plain Python client against a real daemon: round trips, copies, regions, catalog, errors."""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np
import pytest

import ckptd
from conftest import Daemon

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> ckptd.Client:
    return ckptd.connect(daemon.socket)


def state() -> dict[str, Any]:
    base = np.arange(4 * 6 * 5, dtype=np.float64).reshape(4, 6, 5)
    return {
        "f32": np.linspace(-1, 1, 1000, dtype=np.float32).reshape(10, 100),
        "f16": np.arange(64, dtype=np.float16),
        "i8": np.arange(-50, 50, dtype=np.int8),
        "u64": np.array([0, 1, 2**64 - 1], dtype=np.uint64),
        "bool": np.array([True, False, True]),
        "transposed": base.transpose(2, 0, 1),  # non-contiguous
        "strided": base[:, ::2, 1:4],
        "reversed": base[::-1, :, ::-2],  # negative strides
        "scalar": np.array(3.25, dtype=np.float32),  # 0-d
        "empty": np.zeros((0, 7), dtype=np.int32),  # zero-size
        "bf16": torch.arange(-8, 8, dtype=torch.float32).to(torch.bfloat16).reshape(4, 4).t(),
        "t_i64": torch.arange(30, dtype=torch.int64).reshape(5, 6)[:, 1::2],
    }


def as_numpy(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy().view(np.uint16)
        return x.numpy()
    return np.asarray(x)


def tensor_bytes(d: dict[str, Any]) -> int:
    return sum(as_numpy(v).nbytes for v in d.values())


def test_round_trip_dtypes_views_objects_and_one_copy(client: ckptd.Client) -> None:
    sd = state()
    objects = {"meta": {"lr": 0.1, "tags": ["a", "b"]}, "raw": ckptd.Raw(b"\x00\x01bytes")}
    ckptd.reset_copy_stats()
    handle = client.save("py-roundtrip", 1, sd, objects)
    staged = handle.staged()
    assert staged.done()
    stats = ckptd.copy_stats()
    object_bytes = len(b"\x00\x01bytes") + len(
        __import__("pickle").dumps(objects["meta"], protocol=__import__("pickle").HIGHEST_PROTOCOL)
    )
    # Exactly one copy of every tensor byte and object byte, into the arena.
    assert stats["save_bytes"] == tensor_bytes(sd) + object_bytes
    assert handle.committed().result(timeout=60)["state"] == "COMMITTED"

    out = client.load("py-roundtrip", "latest", objects=["meta"])
    assert out.step == 1 and out.objects == {"meta": objects["meta"]}
    loaded_all = client.load("py-roundtrip", 1, raw_objects=True)
    assert set(loaded_all.tensors) == set(sd)
    for name, want in sd.items():
        got = loaded_all.tensors[name]
        np.testing.assert_array_equal(
            got.view(np.uint16) if name == "bf16" else got, as_numpy(want), err_msg=name
        )
        assert got.shape == tuple(want.shape)
    assert loaded_all.objects["raw"] == b"\x00\x01bytes"
    assert __import__("pickle").loads(loaded_all.objects["meta"]) == objects["meta"]
    assert client.load_object("py-roundtrip", 1, "raw", raw=True) == b"\x00\x01bytes"


def test_load_as_torch_with_bfloat16(client: ckptd.Client) -> None:
    sd = {"bf16": torch.randn(33, 17).to(torch.bfloat16), "f32": torch.randn(5)}
    client.save("py-torch", 3, sd).committed().result(timeout=60)
    out = client.load("py-torch", 3, as_torch=True)
    assert out.tensors["bf16"].dtype == torch.bfloat16
    assert torch.equal(out.tensors["bf16"], sd["bf16"])
    assert torch.equal(out.tensors["f32"], sd["f32"])


def test_load_copies_once_into_given_buffers(client: ckptd.Client) -> None:
    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    client.save("py-into", 5, {"w": w, "b": np.ones(32, np.float32)}).committed().result(60)
    dest = np.empty_like(w)
    ckptd.reset_copy_stats()
    out = client.load("py-into", 5, {"w": dest})
    assert out.tensors["w"] is dest
    np.testing.assert_array_equal(dest, w)
    assert ckptd.copy_stats()["load_bytes"] == w.nbytes
    # A strided destination: scattered in the same single copy.
    big = np.zeros((32, 64), np.float32)
    client.load("py-into", 5, {"w": big.T})
    np.testing.assert_array_equal(big.T, w)
    # Only some items, and regions of them (resharding): rows 16..48, and a flat range.
    rows = np.empty((32, 32), np.float32)
    flat = np.empty(100, np.float32)
    client.load("py-into", 5, {"w": (rows, ckptd.Box([16, 0], [32, 32]))})
    np.testing.assert_array_equal(rows, w[16:48])
    client.load("py-into", "latest", {"w": (flat, ckptd.Flat(1000, 100))})
    np.testing.assert_array_equal(flat, w.reshape(-1)[1000:1100])


def test_load_in_several_batches_in_flight(client: ckptd.Client) -> None:
    """The test arena is 64 MiB, so loads go in 16 MiB batches, two at once: 40 MiB of tensors
    (one larger than a batch) load bit-exact, each byte copied once, and a bad destination in a
    later batch fails the load naming its item."""
    rng = np.random.default_rng(5)
    arrays = {f"t{i}": rng.standard_normal(1 << 20).astype(np.float32) for i in range(6)}
    arrays["big"] = rng.standard_normal(5 << 20).astype(np.float32)  # 20 MiB: a batch alone
    client.save("py-batches", 1, arrays).committed().result(60)
    dest = {k: np.empty_like(v) for k, v in arrays.items()}
    ckptd.reset_copy_stats()
    out = client.load("py-batches", 1, dest)
    for k, v in arrays.items():
        np.testing.assert_array_equal(dest[k], v)
    assert ckptd.copy_stats()["load_bytes"] == sum(v.nbytes for v in arrays.values())
    # From storage or (what the daemon still holds of it) from its RAM tier.
    assert out.bytes_read + out.bytes_from_ram >= sum(v.nbytes for v in arrays.values())
    bad = dict(dest)
    bad["t5"] = np.empty(10, np.float32)
    with pytest.raises(ckptd.InvalidArgumentError, match="t5"):
        client.load("py-batches", 1, bad)


def test_one_load_mixing_memory_kinds_is_planned_once(client: ckptd.Client) -> None:
    """Destinations in daemon memory (ckptd.empty), plain arrays and strided views go in one call
    of libckptd-client's Load, so the daemon plans them together and reads shared blocks once."""
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32)  # 8 KiB: two 4 KiB blocks
    client.save("py-mixed", 1, {"w": w}).committed().result(60)
    # Step 2 takes step 1's place in the daemon's RAM tier: step 1 is read from storage.
    client.save("py-mixed", 2, {"w": w}).committed().result(60)
    assert not client.status("py-mixed", 1)["tiers"]["ram"]
    in_daemon = client.empty((16, 32), np.float32)  # rows 0..16: the first 2 KiB
    plain = np.empty((16, 32), np.float32)  # rows 16..32: the same 4 KiB block
    strided = np.zeros((32, 32), np.float32).T  # rows 32..64 (the second block), not contiguous
    ckptd.reset_copy_stats()
    n = client.load_into(
        "py-mixed",
        1,
        [
            ("w", ckptd.Box([0, 0], [16, 32]), in_daemon),
            ("w", ckptd.Box([16, 0], [16, 32]), plain),
            ("w", ckptd.Box([32, 0], [32, 32]), strided),
        ],
    )
    np.testing.assert_array_equal(in_daemon, w[:16])
    np.testing.assert_array_equal(plain, w[16:32])
    np.testing.assert_array_equal(strided, w[32:])
    assert n == 8192  # each 4 KiB block read once, not once per memory kind
    # One copy for the plain and strided destinations, none for daemon memory.
    assert ckptd.copy_stats()["load_bytes"] == plain.nbytes + strided.nbytes


def test_sharded_save_from_two_ranks(client: ckptd.Client) -> None:
    full = np.arange(40 * 8, dtype=np.int32).reshape(40, 8)
    shards = [
        ckptd.Shard(full[r * 20 : (r + 1) * 20], full.shape, ckptd.Box([r * 20, 0], [20, 8]))
        for r in range(2)
    ]
    h0 = client.save(
        "py-shards", 7, {"w": shards[0]}, {"rng": 0}, rank=0, world_size=2, per_rank_objects=["rng"]
    )
    assert client.status("py-shards", 7)["state"] != "COMMITTED"
    h1 = client.save(
        "py-shards", 7, {"w": shards[1]}, {"rng": 1}, rank=1, world_size=2, per_rank_objects=["rng"]
    )
    h0.committed().result(60)
    h1.committed().result(60)
    np.testing.assert_array_equal(client.load("py-shards", 7).tensors["w"], full)
    assert client.load_object("py-shards", 7, "rng", rank=1) == 1


def test_empty_is_saved_without_a_copy(client: ckptd.Client) -> None:
    a = client.empty((256, 256), np.float32)
    a[:] = np.random.default_rng(1).standard_normal(a.shape)
    t = client.empty((1000,), torch.bfloat16)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16
    t.copy_(torch.linspace(0, 1, 1000))
    ckptd.reset_copy_stats()
    h = client.save("py-zero-copy", 1, {"a": a, "t": t})
    assert ckptd.copy_stats()["save_bytes"] == 0
    h.committed().result(60)
    # Reusable once committed.
    want_a, want_t = a.copy(), t.clone()
    a[:] = 0
    out = client.load("py-zero-copy", 1, as_torch=True)
    assert np.array_equal(out.tensors["a"].numpy(), want_a)
    assert torch.equal(out.tensors["t"], want_t)
    # Loading into daemon memory copies nothing either.
    ckptd.reset_copy_stats()
    client.load("py-zero-copy", 1, {"a": a})
    assert ckptd.copy_stats()["load_bytes"] == 0
    np.testing.assert_array_equal(a, want_a)


def test_nonblocking_save_and_catalog(client: ckptd.Client) -> None:
    x = np.ones((128, 128), np.float32)
    h = client.save("py-catalog", 10, {"x": x}, blocking=False)
    assert h.staged().result(60)["bytes_staged"] >= x.nbytes
    h.committed().result(60)
    client.save("py-catalog", 20, {"x": x * 2}).committed().result(60)
    assert client.latest("py-catalog") == 20
    assert [c["step"] for c in client.list("py-catalog")] == [10, 20]
    assert any(j["job"] == "py-catalog" for j in client.list())
    st = client.status("py-catalog", 10)
    assert st["state"] == "COMMITTED" and st["tiers"]["local"]
    items = client.inspect("py-catalog", 20)
    assert [(i["name"], i["dtype"], i["shape"]) for i in items] == [("x", "float32", [128, 128])]
    assert client.latest("py-nonexistent-job") is None
    # On local storage alone: it survives no node's loss, so no latest is that durable.
    assert client.latest("py-catalog", durable="committed") == 20
    assert client.latest("py-catalog", durable="peer") is None
    assert client.latest("py-catalog", durable="store") is None
    with pytest.raises(ValueError, match="durable"):
        client.latest("py-catalog", durable="disk")


def test_concurrent_saves_from_threads(client: ckptd.Client) -> None:
    errors: list[BaseException] = []

    def run(step: int) -> None:
        try:
            client.save("py-threads", step, {"x": np.full(1000, step)}).committed().result(60)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    for s in range(4):
        assert (client.load("py-threads", s).tensors["x"] == s).all()


def test_errors_carry_the_daemon_message(client: ckptd.Client) -> None:
    client.save("py-errors", 1, {"x": np.zeros(4)}).committed().result(60)
    with pytest.raises(ckptd.NotFoundError) as e:
        client.load("py-errors", 99)
    assert "py-errors" in str(e.value)
    with pytest.raises(ckptd.NotFoundError) as e:
        client.load("py-errors", 1, {"nope": np.zeros(4)})
    assert "nope" in str(e.value)
    with pytest.raises(ckptd.InvalidArgumentError) as e:
        client.save("bad/job", 1, {"x": np.zeros(4)})
    assert "bad/job" in str(e.value)
    with pytest.raises(ckptd.CkptdError) as e:
        client.load("py-errors", 1, {"x": np.zeros(5)})  # wrong size
    assert "x" in str(e.value)


def test_no_daemon_is_a_clear_connection_error(tmp_path: Any) -> None:
    path = str(tmp_path / "none.sock")
    with pytest.raises(ConnectionError) as e:
        ckptd.connect(path, connect_timeout_ms=300)
    assert path in str(e.value)
    assert isinstance(e.value, ckptd.UnavailableError)


def test_socket_from_environment(daemon: Daemon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CKPTD_SOCKET", daemon.socket)
    c = ckptd.connect()
    assert c.target == "unix:" + daemon.socket
    assert os.environ["CKPTD_SOCKET"] == c.socket


# --- GPU tensors and a CUDA-pinned arena ----------------------------------------------------------
def test_pin_cuda_without_a_gpu_fails_naming_the_cause(daemon: Daemon) -> None:
    if torch.cuda.is_available():
        with ckptd.connect(daemon.socket, pin_cuda=True) as c:
            assert c.arena_pinned_for_cuda
        return
    with pytest.raises(ckptd.FailedPreconditionError, match=r"pinning arena .*for CUDA"):
        ckptd.connect(daemon.socket, pin_cuda=True)
    with ckptd.connect(daemon.socket) as c:  # the daemon still serves unpinned clients
        assert not c.arena_pinned_for_cuda


@pytest.fixture
def cpu_as_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Routes CPU tensors through the path GPU tensors take (copy_ into arena buffers, saved in
    place), so it runs on every machine; the GPU test below runs it with CUDA tensors."""
    monkeypatch.setattr(ckptd._arrays, "is_device_tensor", ckptd._arrays.is_torch_tensor)


@pytest.mark.usefixtures("cpu_as_device")
def test_device_tensors_are_copied_once_into_the_arena(client: ckptd.Client) -> None:
    src = {
        "a": torch.arange(3000, dtype=torch.float32).reshape(30, 100).t(),  # non-contiguous
        "b": torch.ones(5).bfloat16(),
        "c": ckptd.Shard(torch.full((2, 4), 7.0), [2, 4], ckptd.Box([0, 0], [2, 4])),
        "e": torch.zeros((0, 3)),  # empty: moved, not staged
    }
    ckptd.reset_copy_stats()
    client.save("py-devstage", 1, src)
    assert ckptd.copy_stats()["save_bytes"] == 0  # the copy_ was the one copy: saved in place
    client.wait("py-devstage", 1)
    got = client.load("py-devstage", 1, as_torch=True)
    assert torch.equal(got.tensors["a"], src["a"]) and torch.equal(got.tensors["b"], src["b"])
    assert torch.equal(got.tensors["c"], torch.full((2, 4), 7.0))
    assert got.tensors["e"].shape == (0, 3)
    views = client.stage([torch.ones(3), torch.zeros(0), torch.zeros(2)])  # the same path
    assert [v.tolist() for v in views] == [[1.0, 1.0, 1.0], [], [0.0, 0.0]]
    client.release(views)


@pytest.mark.usefixtures("cpu_as_device")
def test_device_tensors_buffers_are_released_when_the_save_fails(client: ckptd.Client) -> None:
    # 40 MiB of the 64 MiB arena each time: a buffer kept after a failed save would make the
    # next reservation wait and fail with ResourceExhaustedError.
    for _ in range(3):
        with pytest.raises(ckptd.InvalidArgumentError, match="job"):
            client.save("bad/job name", 1, {"a": torch.ones(10 << 20)})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_tensors_save_device_to_pinned_arena_and_load(daemon: Daemon) -> None:
    with ckptd.connect(daemon.socket, pin_cuda=True) as c:
        sd = {"w": torch.randn(1024, 1024, device="cuda"), "b": torch.arange(7, device="cuda")}
        c.save("py-gpu", 1, sd)
        c.wait("py-gpu", 1)
        got = c.load("py-gpu", 1, as_torch=True)
        assert all(torch.equal(got.tensors[k], v.cpu()) for k, v in sd.items())


def test_the_prefetch_hint_restores_a_cold_checkpoint_through_the_ram_tier(
    client: ckptd.Client,
) -> None:
    """A load of a checkpoint that is not hot, with prefetch=True, brings the whole checkpoint
    into the RAM tier (bytes_prefetched) and copies from there; the next load finds it hot."""
    w = np.arange(512 * 64, dtype=np.float32).reshape(512, 64)
    client.save("py-hint", 1, {"w": w}).committed().result(60)
    client.save("py-hint", 2, {"w": w + 1}).committed().result(60)  # step 1 leaves the tier
    assert not client.status("py-hint", 1)["tiers"]["ram"]
    got = client.load("py-hint", 1, prefetch=True)
    np.testing.assert_array_equal(got.tensors["w"], w)
    assert got.bytes_read == 0 and got.bytes_from_ram == w.nbytes
    assert got.bytes_prefetched >= w.nbytes
    assert client.status("py-hint", 1)["tiers"]["ram"]
    rows = np.empty((128, 64), np.float32)
    counts = client.load_into_counted(
        "py-hint", 1, [("w", ckptd.Box([128, 0], [128, 64]), rows)], prefetch=True
    )
    np.testing.assert_array_equal(rows, w[128:256])
    assert counts["bytes_read"] == 0 and counts["bytes_prefetched"] == 0  # hot already


def test_close_ends_the_session_at_once(daemon: Daemon) -> None:
    # The arena is 64 MiB: a second client gets 48 MiB only if the first one's close() gave its
    # staged buffer back to the daemon (the session's end frees its extents), not at GC.
    a = ckptd.connect(daemon.socket)
    held = a.stage([np.ones(12 << 20, np.float32)])[0]
    a.close()
    a.close()  # closing again does nothing
    assert held.nbytes == 48 << 20 and float(held[0]) == 1.0  # still mapped, readable
    with pytest.raises(ckptd.FailedPreconditionError, match="closed"):
        a.list()
    with ckptd.connect(daemon.socket) as b:
        got = b.stage([np.full(12 << 20, 2.0, np.float32)])[0]
        assert float(got[-1]) == 2.0
        b.release([got])


def test_a_restore_right_after_the_save_copies_from_the_ram_tier(client: ckptd.Client) -> None:
    """The newest checkpoint stays hot in the daemon's arena: a load reads nothing from storage,
    into plain arrays, daemon memory and another layout alike; the status says `ram`."""
    w = np.arange(256 * 64, dtype=np.float32).reshape(256, 64)
    client.save("py-ram", 1, {"w": w}, objects={"meta": {"epoch": 1}}).committed().result(60)
    status = client.status("py-ram", 1)
    assert status["tiers"]["ram"] and status["tiers"]["local"]
    assert status["tiers"]["ram_bytes"] >= w.nbytes
    got = client.load("py-ram", "latest")
    np.testing.assert_array_equal(got.tensors["w"], w)
    assert got.objects["meta"] == {"epoch": 1}
    assert got.bytes_read == 0 and got.bytes_from_ram == w.nbytes
    in_daemon = client.empty((64, 64), np.float32)
    cols = np.empty((256, 16), np.float32)
    counts = client.load_into_counted(
        "py-ram",
        1,
        [
            ("w", ckptd.Box([64, 0], [64, 64]), in_daemon),
            ("w", ckptd.Box([0, 16], [256, 16]), cols),
        ],
    )
    np.testing.assert_array_equal(in_daemon, w[64:128])
    np.testing.assert_array_equal(cols, w[:, 16:32])
    assert counts["bytes_read"] == 0 and counts["bytes_from_ram"] == in_daemon.nbytes + cols.nbytes
    # Nothing from a remote store or another node's peer store (docs/PEERS.md "Replication").
    assert counts["bytes_read_remote"] == 0 and counts["bytes_read_peer"] == 0
    assert got.bytes_read_peer == 0 and status["tiers"]["peer_nodes"] == []
