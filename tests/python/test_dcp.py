"""ckptd.torch in one process, no process group: DCP save/load/async_save through the ckptd
StorageWriter/StorageReader, checkpoint ids, copies, dtype casts, FileSystemWriter parity."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptd
from conftest import Daemon

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
import ckptd.torch as ct  # noqa: E402


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> ckptd.Client:
    return ckptd.connect(daemon.socket)


def make_state(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(8, 6, 4, generator=g)
    return {
        "model": {
            "f32": torch.randn(64, 33, generator=g),
            "bf16": torch.randn(17, 9, generator=g).to(torch.bfloat16),
            "f16": torch.randn(10, generator=g).half(),
            "i64": torch.arange(100).reshape(10, 10),
            "u8": torch.arange(200, dtype=torch.uint8),
            "mask": torch.rand(31, generator=g) > 0.5,
            "transposed": base.permute(2, 0, 1),  # non-contiguous views
            "sliced": base[1::2, :, ::3],
            "scalar": torch.tensor(2.5),  # 0-d
            "empty": torch.zeros(0, 5),  # zero-size
        },
        "step": 42,
        "extra": {"name": "run", "lrs": [0.1, 0.01]},
    }


def zeros_like(sd: Any) -> Any:
    if isinstance(sd, torch.Tensor):
        return torch.zeros(sd.shape, dtype=sd.dtype)
    if isinstance(sd, dict):
        return {k: zeros_like(v) for k, v in sd.items()}
    if isinstance(sd, list):
        return [zeros_like(v) for v in sd]
    return None if not isinstance(sd, (int, float, str)) else type(sd)()


def assert_same(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    else:
        assert a == b, path


def test_save_load_round_trip_with_one_copy(daemon: Daemon, client: ckptd.Client) -> None:
    sd = make_state()
    ckptd.reset_copy_stats()
    meta = dcp.save(sd, storage_writer=ct.StorageWriter("dcp/rt/step-1", socket=daemon.socket))
    stats = ckptd.copy_stats()
    # dcp.save returns at COMMITTED.
    assert client.status("dcp.rt", 1)["state"] == "COMMITTED"
    items = {i["name"]: i for i in client.inspect("dcp.rt", 1)}
    tensor_bytes = sum(t.numel() * t.element_size() for t in sd["model"].values())
    object_bytes = sum(i["bytes"] for i in items.values() if i["kind"] == "object")
    assert stats["save_bytes"] == tensor_bytes + object_bytes  # each byte copied once
    assert items["model.bf16"]["dtype"] == "bfloat16"
    assert meta.state_dict_metadata["model.f32"].size == torch.Size([64, 33])

    out = zeros_like(sd)
    out["step"], out["extra"] = 0, {"name": "", "lrs": [0.0, 0.0]}
    dcp.load(out, storage_reader=ct.StorageReader("dcp/rt/step-1", socket=daemon.socket))
    assert_same({k: v.contiguous() for k, v in sd["model"].items()}, out["model"])
    assert out["step"] == 42 and out["extra"] == sd["extra"]


def test_load_casts_to_the_destination_dtype(daemon: Daemon) -> None:
    src = {"w": torch.randn(20, 30), "b": torch.randn(30).to(torch.bfloat16)}
    dcp.save(src, storage_writer=ct.StorageWriter("dcp/cast/step-1", socket=daemon.socket))
    out = {"w": torch.zeros(20, 30, dtype=torch.float64), "b": torch.zeros(30)}
    dcp.load(out, storage_reader=ct.StorageReader("dcp/cast/step-1", socket=daemon.socket))
    assert torch.equal(out["w"], src["w"].double())
    assert torch.equal(out["b"], src["b"].float())


def test_same_as_filesystem_writer(daemon: Daemon, tmp_path: Path) -> None:
    sd = make_state(3)
    dcp.save(sd, storage_writer=dcp.FileSystemWriter(str(tmp_path / "fs")))
    dcp.save(sd, storage_writer=ct.StorageWriter("dcp/parity/step-7", socket=daemon.socket))
    from_fs, from_ckptd = zeros_like(sd), zeros_like(sd)
    dcp.load(from_fs, storage_reader=dcp.FileSystemReader(str(tmp_path / "fs")))
    dcp.load(from_ckptd, storage_reader=ct.StorageReader("dcp/parity/step-7", socket=daemon.socket))
    want = {k: v.contiguous() for k, v in sd["model"].items()}
    assert_same(want, from_fs["model"])
    assert_same(from_fs, from_ckptd)


def test_checkpoint_id_rules(daemon: Daemon, client: ckptd.Client) -> None:
    assert (
        ct.parse("ckptd://runs/a/step-5")
        == ct.parse("/runs/a/step-5")
        == ct.parse(Path("runs/a/step-5"))
    )
    assert ct.parse("runs/a/step-5").job == "runs.a" and ct.parse("runs/a/step-5").step == 5
    assert ct.parse("x_y/v1.2/ckpt").job == "x__y.v1_d2" and ct.parse("x_y/v1.2/ckpt").step is None
    assert ct.decode_job(ct.encode_job("a b/c_d/e.f")) == "a b/c_d/e.f"
    for bad in ["runs//step-1", "runs/../step-1", "step-1", "runs/a/", "/" + "x" * 200 + "/s1"]:
        with pytest.raises(ValueError):
            ct.parse(bad)
        assert not ct.StorageWriter.validate_checkpoint_id(bad)
    # Positional or keyword; reset() replaces it.
    w = ct.StorageWriter(checkpoint_id="ids/a/step-1", socket=daemon.socket)
    assert (w.checkpoint_id, w.step) == ("ids/a/step-1", 1)
    w.reset("ids/a/step-2")
    assert w.step == 2
    # Without a trailing integer: the next free step, and the name is recorded.
    sd = {"w": torch.arange(10.0)}
    dcp.save(sd, storage_writer=ct.StorageWriter("ids/named/step-3", socket=daemon.socket))
    dcp.save(
        {"w": sd["w"] * 2}, storage_writer=ct.StorageWriter("ids/named/best", socket=daemon.socket)
    )
    assert client.latest("ids.named") == 4
    out = {"w": torch.zeros(10)}
    dcp.load(out, storage_reader=ct.StorageReader("ckptd://ids/named/best", socket=daemon.socket))
    assert torch.equal(out["w"], sd["w"] * 2)
    from torch.distributed.checkpoint.api import CheckpointException

    with pytest.raises(CheckpointException, match="no committed checkpoint named 'worst'"):
        dcp.load(out, storage_reader=ct.StorageReader("ids/named/worst", socket=daemon.socket))
    # dcp.save(checkpoint_id=...) goes through reset().
    dcp.save(
        sd, checkpoint_id="ids/kw/step-9", storage_writer=ct.StorageWriter(socket=daemon.socket)
    )
    assert client.latest("ids.kw") == 9


def test_writer_and_reader_are_picklable(daemon: Daemon) -> None:
    w = ct.StorageWriter("pickle/a/step-1", socket=daemon.socket)
    assert w.client is not None  # connect, then pickle without the connection
    w2 = pickle.loads(pickle.dumps(w))
    dcp.save({"x": torch.ones(3)}, storage_writer=w2)
    r = pickle.loads(pickle.dumps(ct.StorageReader("pickle/a/step-1", socket=daemon.socket)))
    out = {"x": torch.zeros(3)}
    dcp.load(out, storage_reader=r)
    assert torch.equal(out["x"], torch.ones(3))


def test_async_save_stages_then_commits(daemon: Daemon, client: ckptd.Client) -> None:
    sd = {"w": torch.randn(256, 256), "v": torch.arange(1000), "meta": {"epoch": 1}}
    want = {"w": sd["w"].clone(), "v": sd["v"].clone()}
    writer = ct.StorageWriter("async/one/step-1", socket=daemon.socket)
    ckptd.reset_copy_stats()
    fut = dcp.async_save(sd, storage_writer=writer)
    # Returned with the checkpoint staged in the daemon (it completes even if we die now)...
    assert client.status("async.one", 1)["state"] in ("STAGING", "PERSISTING", "COMMITTED")
    assert ckptd.copy_stats()["save_bytes"] >= want["w"].nbytes + want["v"].nbytes
    # ... and the tensors free to change.
    sd["w"].zero_()
    sd["v"].fill_(-1)
    fut.result(timeout=120)
    assert client.status("async.one", 1)["state"] == "COMMITTED"
    out = {
        "w": torch.zeros(256, 256),
        "v": torch.zeros(1000, dtype=torch.int64),
        "meta": {"epoch": 0},
    }
    dcp.load(out, storage_reader=ct.StorageReader("async/one/step-1", socket=daemon.socket))
    assert torch.equal(out["w"], want["w"]) and torch.equal(out["v"], want["v"])
    assert out["meta"] == {"epoch": 1}


def test_async_save_without_step_in_id(daemon: Daemon, client: ckptd.Client) -> None:
    sd = {"w": torch.randn(64, 64)}
    want = sd["w"].clone()
    fut = dcp.async_save(
        sd, storage_writer=ct.StorageWriter("async/named/latest-good", socket=daemon.socket)
    )
    sd["w"].zero_()  # the copy into the arena happened before async_save returned
    fut.result(timeout=120)
    out = {"w": torch.zeros(64, 64)}
    dcp.load(out, storage_reader=ct.StorageReader("async/named/latest-good", socket=daemon.socket))
    assert torch.equal(out["w"], want)


def test_reads_checkpoints_saved_by_the_plain_client(daemon: Daemon, client: ckptd.Client) -> None:
    full = torch.arange(48 * 4, dtype=torch.float32).reshape(48, 4)
    flat = full.reshape(-1)
    # Two "ranks" saving row boxes, one item saved as irregular flat (ZeRO-style) shards.
    for rank in range(2):
        client.save(
            "cpp-saved",
            1,
            {
                "rows": ckptd.Shard(
                    full[rank * 24 : (rank + 1) * 24], [48, 4], ckptd.Box([rank * 24, 0], [24, 4])
                ),
                "flat": ckptd.Shard(
                    flat[:50] if rank == 0 else flat[50:],
                    [48, 4],
                    ckptd.Flat(0, 50) if rank == 0 else ckptd.Flat(50, 142),
                ),
            },
            {"note": ckptd.Raw(b"hi")},
            rank=rank,
            world_size=2,
        ).staged().result()
    client.wait("cpp-saved", 1)
    out = {"rows": torch.zeros(48, 4, dtype=torch.float64), "flat": torch.zeros(48, 4), "note": b""}
    r = ct.StorageReader("cpp-saved/step-1", socket=daemon.socket)
    meta = r.read_metadata()
    assert meta.state_dict_metadata["rows"].properties.dtype == torch.float32
    dcp.load({k: v for k, v in out.items() if k != "note"}, storage_reader=r)
    assert torch.equal(out["rows"], full.double()) and torch.equal(out["flat"], full)


def test_convenience_save_and_load(daemon: Daemon) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.randn(5, 8)).sum().backward()
    opt.step()
    ct.save(model, opt, 100, job="conv/run", extra={"epoch": 3}, socket=daemon.socket)
    want_model = {k: v.clone() for k, v in model.state_dict().items()}
    want_opt = opt.state_dict()
    torch.manual_seed(1)
    model2 = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.01)
    loaded = ct.load(model2, opt2, job="conv/run", socket=daemon.socket)
    assert loaded.step == 100 and loaded.extra == {"epoch": 3}
    for k, v in model2.state_dict().items():
        assert torch.equal(v, want_model[k]), k
    got_opt = opt2.state_dict()
    for pid, st in want_opt["state"].items():
        for k, v in st.items():
            assert torch.equal(got_opt["state"][pid][k], v), (pid, k)


def test_numpy_free_import() -> None:
    # The core package imports without torch (checked in a fresh interpreter).
    import subprocess
    import sys

    code = (
        "import sys, builtins\nreal = builtins.__import__\n"
        "def imp(name, *a, **k):\n"
        "    if name == 'torch' or name.startswith('torch.'): raise ImportError(name)\n"
        "    return real(name, *a, **k)\n"
        "builtins.__import__ = imp\nimport ckptd\nassert 'torch' not in sys.modules\n"
        "print(ckptd.Client.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "Client"
    assert np is not None


def test_writers_and_readers_share_one_client_per_socket(daemon: Daemon) -> None:
    # A new writer per checkpoint must not reconnect: the process-wide client for the socket keeps
    # its session, arena mapping and registered GPU allocations (a new connection had been most of
    # an async_save's stall on a GPU, bench/RESULTS.md).
    a = ct.StorageWriter("share/1", socket=daemon.socket)
    b = ct.StorageWriter("share/2", socket=daemon.socket)
    r = ct.StorageReader("share/1", socket=daemon.socket)
    assert a.client is b.client is r.client
    remote = ct.StorageWriter("share/3", socket=daemon.socket, tier_policy="local")
    assert remote.client is not a.client  # another tier policy: another client
    # Pickled (process-based async_save) and back: connects through the same table.
    assert pickle.loads(pickle.dumps(a)).client is a.client
