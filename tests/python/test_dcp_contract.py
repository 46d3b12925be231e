"""DCP 2.13's backend contract, one process: plan and metadata caching, per-save state without
reset(), the two-future async protocol and reference-only staging, close(), picklable errors,
_extensions refused, allow_partial_load, _load_state_dict_from_keys and template-less loads."""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from typing import IO, Any

import pytest

import ckptd
from conftest import Daemon

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from torch.distributed.checkpoint._extension import (  # noqa: E402
    ExtensionRegistry,
    StreamTransformExtension,
)
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402
from torch.distributed.checkpoint.default_planner import (  # noqa: E402
    DefaultLoadPlanner,
    DefaultSavePlanner,
)
from torch.distributed.checkpoint.planner import SavePlanner  # noqa: E402
from torch.distributed.checkpoint.state_dict_loader import (  # noqa: E402
    _load_state_dict_from_keys,
)
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse  # noqa: E402

import ckptd.torch as ct  # noqa: E402

MIB_ROWS = 256  # a (256, 1024) float32 tensor is 1 MiB


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> ckptd.Client:
    return ckptd.connect(daemon.socket)


@pytest.fixture
def plan_cache() -> Iterator[None]:
    """DCP's plan cache is class-level (SavePlanner._cached_*): empty before and after a test."""
    caches = [v for k, v in vars(SavePlanner).items() if k.startswith("_cached_")]
    assert caches, "torch moved DCP's plan cache"
    for c in caches:
        c.clear()
    yield
    for c in caches:
        c.clear()


def state(i: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(i)
    return {
        "model": {"w": torch.randn(32, 16, generator=g), "b": torch.randn(16, generator=g)},
        "optim": {"step": torch.tensor(float(i)), "lr": 0.1},
        "epoch": i,
    }


def zeros(sd: Any) -> Any:
    if isinstance(sd, torch.Tensor):
        return torch.zeros_like(sd)
    if isinstance(sd, dict):
        return {k: zeros(v) for k, v in sd.items()}
    return sd


def assert_same(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            assert_same(a[k], b[k])
    else:
        assert a == b


def test_ten_saves_with_plan_caching(daemon: Daemon, plan_cache: None) -> None:
    writer = ct.StorageWriter(socket=daemon.socket)
    metas = []
    for i in range(10):
        meta = dcp.save(
            state(i),
            checkpoint_id=f"cache/run/step-{i}",
            storage_writer=writer,
            planner=DefaultSavePlanner(enable_plan_caching=True),
        )
        # finish() records this save in the Metadata, also when DCP hands back its cached one.
        assert meta.storage_meta is not None
        assert meta.storage_meta.checkpoint_id == f"cache/run/step-{i}"
        assert meta.storage_meta.save_id == f"cache.run/{i}"
        assert meta.version == ct.DCP_VERSION
        metas.append(meta)
    assert metas[1] is metas[9]  # the cache was in use: DCP returned its cached Metadata
    for i in range(10):
        out = zeros(state(i))
        dcp.load(out, storage_reader=ct.StorageReader(f"cache/run/step-{i}", socket=daemon.socket))
        assert_same(state(i), out)


def test_cached_plans_pass_through_unchanged(daemon: Daemon) -> None:
    from torch.distributed.checkpoint.planner import SavePlan

    writer = ct.StorageWriter("cache/unit/step-1", socket=daemon.socket)
    cached = SavePlan([], usable=False)
    assert writer.prepare_local_plan(cached) is cached
    out = writer.prepare_global_plan([cached, SavePlan([], planner_data={"a": ("a",)})])
    assert [p.usable for p in out] == [False, True]
    # Only what a cached plan keeps true: the number of ranks and the mappings, never a step.
    assert [vars(p.storage_data) for p in out] == [
        {"world_size": 2, "planner_data": {"a": ("a",)}},
        {"world_size": 2, "planner_data": None},
    ]


def test_writer_reused_without_reset_takes_a_new_step(
    daemon: Daemon, client: ckptd.Client, plan_cache: None
) -> None:
    # dcp.save without checkpoint_id never calls reset(): per-save state starts in
    # set_up_storage_writer, so each save takes the job's next free step.
    writer = ct.StorageWriter("cache/named/best", socket=daemon.socket)
    for i in range(3):
        dcp.save(
            state(i), storage_writer=writer, planner=DefaultSavePlanner(enable_plan_caching=True)
        )
        assert writer.step == i
    assert [c["step"] for c in client.list("cache.named")] == [0, 1, 2]
    out = zeros(state(0))
    dcp.load(out, storage_reader=ct.StorageReader("cache/named/best", socket=daemon.socket))
    assert_same(state(2), out)


def test_async_staging_returns_two_futures(daemon: Daemon, client: ckptd.Client) -> None:
    sd = {"w": torch.randn(MIB_ROWS, 1024), "meta": {"epoch": 1}}
    want = sd["w"].clone()
    writer = ct.StorageWriter("two/futures/step-3", socket=daemon.socket, async_staging=True)
    resp = dcp.async_save(sd, storage_writer=writer)
    assert isinstance(resp, AsyncSaveResponse)
    resp.staging_completion.result(timeout=60)
    # Staged means the bytes are in the daemon: the checkpoint exists and the trainer may change
    # its tensors (the optimizer step of the zero-overhead recipe).
    assert client.status("two.futures", 3)["state"] in ("STAGING", "PERSISTING", "COMMITTED")
    sd["w"].fill_(-1)
    resp.upload_completion.result(timeout=120)
    assert client.status("two.futures", 3)["state"] == "COMMITTED"
    out = {"w": torch.zeros(MIB_ROWS, 1024), "meta": {"epoch": 0}}
    dcp.load(out, storage_reader=ct.StorageReader("two/futures/step-3", socket=daemon.socket))
    assert torch.equal(out["w"], want) and out["meta"] == {"epoch": 1}
    writer.close()


def test_dcps_own_stager_with_the_ckptd_writer(daemon: Daemon, client: ckptd.Client) -> None:
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    sd = {"w": torch.randn(64, 32), "epoch": 2}
    want = sd["w"].clone()
    stager = DefaultStager(StagingOptions(False, False, True, False))  # CPU: async staging
    try:
        resp = dcp.async_save(
            sd,
            storage_writer=ct.StorageWriter("stager/run/step-1", socket=daemon.socket),
            async_stager=stager,
        )
        assert isinstance(resp, AsyncSaveResponse)
        resp.staging_completion.result(timeout=60)
        sd["w"].zero_()
        resp.upload_completion.result(timeout=120)
    finally:
        stager.close()
    assert client.status("stager.run", 1)["state"] == "COMMITTED"
    out = {"w": torch.zeros(64, 32), "epoch": 0}
    dcp.load(out, storage_reader=ct.StorageReader("stager/run/step-1", socket=daemon.socket))
    assert torch.equal(out["w"], want) and out["epoch"] == 2


def test_async_save_with_the_id_given_to_async_save(daemon: Daemon, client: ckptd.Client) -> None:
    # TorchTitan passes checkpoint_id to async_save: a writer without an id stages into the arena
    # and hands the shards over once dcp.save's reset() named the checkpoint.
    sd = {"w": torch.randn(32, 32)}
    want = sd["w"].clone()
    writer = ct.StorageWriter(socket=daemon.socket, async_staging=True)
    resp = dcp.async_save(sd, storage_writer=writer, checkpoint_id="tt/run/step-10")
    resp.staging_completion.result(timeout=60)
    sd["w"].zero_()
    resp.upload_completion.result(timeout=120)
    assert client.status("tt.run", 10)["state"] == "COMMITTED"
    out = {"w": torch.zeros(32, 32)}
    dcp.load(out, storage_reader=ct.StorageReader("tt/run/step-10", socket=daemon.socket))
    assert torch.equal(out["w"], want)
    # A writer that already has an id refuses another one from async_save: stage() used its own.
    writer = ct.StorageWriter("tt/run/step-11", socket=daemon.socket)
    fut = dcp.async_save(
        {"w": torch.ones(2)}, storage_writer=writer, checkpoint_id="tt/run/step-12"
    )
    with pytest.raises(ValueError, match=r"give the checkpoint_id to the writer.*tt\.run step 11"):
        fut.result(timeout=120)
    # Aborted, unless the one-rank checkpoint committed first (it may still be persisting).
    deadline = time.monotonic() + 60
    state = client.status("tt.run", 11)["state"]
    while state not in ("ABORTED", "COMMITTED") and time.monotonic() < deadline:
        time.sleep(0.05)
        state = client.status("tt.run", 11)["state"]
    assert state in ("ABORTED", "COMMITTED")
    with pytest.raises(ckptd.NotFoundError):
        client.status("tt.run", 12)


def test_stage_hands_over_and_returns_references(daemon: Daemon, client: ckptd.Client) -> None:
    # With a step in the id, stage() gives back meta tensors: a process-based async_save pickles
    # only references to its checkpoint process, never the tensor bytes a second time.
    sd = {"w": torch.randn(64, 64), "n": {"b": torch.arange(5)}, "x": 3}
    writer = ct.StorageWriter("refs/run/step-1", socket=daemon.socket)
    staged = writer.stage(sd)
    assert isinstance(staged, dict)
    assert staged["w"].device.type == "meta" and staged["n"]["b"].device.type == "meta"
    assert staged["w"].shape == sd["w"].shape and staged["n"]["b"].dtype == torch.int64
    assert staged["x"] == 3
    assert len(pickle.dumps(staged)) < 4096  # 16 KiB of float32 do not travel
    assert client.status("refs.run", 1)["state"] in ("STAGING", "PERSISTING", "COMMITTED")
    dcp.save(staged, storage_writer=writer)  # what the checkpoint process does with them
    out = zeros(sd)
    dcp.load(out, storage_reader=ct.StorageReader("refs/run/step-1", socket=daemon.socket))
    assert_same(sd, out)
    # A pickled writer (the checkpoint process's copy) finishes that checkpoint: the original
    # forgets it, so moving it to another id aborts nothing.
    w2 = ct.StorageWriter("refs/run/step-2", socket=daemon.socket)
    w2.stage({"w": torch.ones(3)})
    copy = pickle.loads(pickle.dumps(w2))
    w2.reset("refs/run/step-9")
    dcp.save({"w": torch.empty(3, device="meta")}, storage_writer=copy)
    assert client.status("refs.run", 2)["state"] == "COMMITTED"


def test_close_releases_what_stage_holds(daemon: Daemon) -> None:
    # Without a step the shards wait for planning; close() gives their arena buffers back.
    writer = ct.StorageWriter("close/run/later", socket=daemon.socket, async_staging=True)
    fut = writer.stage({"a": torch.ones(MIB_ROWS, 1024), "b": torch.ones(10)})
    assert not isinstance(fut, dict)
    staged = fut.result(timeout=60)
    assert staged["a"].device.type == "cpu" and torch.equal(staged["a"], torch.ones(MIB_ROWS, 1024))
    assert writer.arena_buffers_held == 2
    # A process-based async_save would pickle the writer now: refused, not copied twice more.
    with pytest.raises(RuntimeError, match=r"and no step.*Give the writer an id with a step"):
        pickle.dumps(writer)
    writer.close()
    assert writer.arena_buffers_held == 0
    # The arena (64 MiB) takes 40 stagings of 2 MiB only if each close() gave its buffer back.
    for _ in range(40):
        writer.stage({"a": torch.ones(2 * MIB_ROWS, 1024)}).result(timeout=60)
        writer.close()


def test_errors_pickle_with_the_daemons_message(daemon: Daemon) -> None:
    sd = {"w": torch.ones(4)}
    dcp.save(sd, storage_writer=ct.StorageWriter("errs/run/step-1", socket=daemon.socket))
    with pytest.raises(CheckpointException) as info:
        dcp.save(sd, storage_writer=ct.StorageWriter("errs/run/step-1", socket=daemon.socket))
    # DCP sends this between ranks and from its checkpoint process: pickled.
    back = pickle.loads(pickle.dumps(info.value))
    err, _ = back.failures[0]
    assert isinstance(err, ckptd.AlreadyExistsError)
    assert "errs.run" in str(err) and "COMMITTED" in str(err)
    for cls in (ckptd.NotFoundError, ckptd.UnavailableError, ckptd.ResourceExhaustedError):
        e = pickle.loads(pickle.dumps(cls("job j step 3 item w: message")))
        assert type(e) is cls and str(e) == "job j step 3 item w: message"


class _Xor(StreamTransformExtension):
    """A byte-stream transform, as DCP's ZStandard is one."""

    @staticmethod
    def registry_name() -> str:
        return "test.xor"

    @staticmethod
    def from_descriptor(version: str) -> _Xor:
        return _Xor()

    def get_descriptor(self) -> str:
        return "test.xor/1"

    def transform_to(self, output: IO[bytes]) -> IO[bytes]:
        return output

    def transform_from(self, input: IO[bytes]) -> IO[bytes]:
        return input


def test_extensions_are_refused_not_ignored(daemon: Daemon) -> None:
    with pytest.raises(ValueError, match=r"_extensions \['test.xor/1'\] are not supported"):
        ct.StorageWriter("ext/run/step-1", socket=daemon.socket, _extensions=[_Xor()])
    ct.StorageWriter("ext/run/step-1", socket=daemon.socket, _extensions=[])  # nothing to refuse
    # The reader takes FileSystemReader's registry: ckptd checkpoints carry no descriptors.
    dcp.save(
        {"w": torch.ones(3)},
        storage_writer=ct.StorageWriter("ext/run/step-1", socket=daemon.socket),
    )
    out = {"w": torch.zeros(3)}
    reg = ExtensionRegistry()
    dcp.load(
        out,
        storage_reader=ct.StorageReader(
            "ext/run/step-1", socket=daemon.socket, _extension_registry=reg
        ),
    )
    assert torch.equal(out["w"], torch.ones(3))


def _saved_big(daemon: Daemon, job_path: str) -> dict[str, Any]:
    g = torch.Generator().manual_seed(5)
    sd = {
        "model": {
            "a": torch.randn(MIB_ROWS, 1024, generator=g),
            "b": torch.randn(MIB_ROWS, 1024, generator=g),
        },
        "rng": {"seed": 5},
    }
    dcp.save(sd, storage_writer=ct.StorageWriter(job_path, socket=daemon.socket))
    return sd


def test_keyed_and_template_less_loads_read_only_what_they_need(daemon: Daemon) -> None:
    sd = _saved_big(daemon, "keys/run/step-1")
    need = sd["model"]["a"].nbytes
    reader = ct.StorageReader("keys/run/step-1", socket=daemon.socket)
    got = _load_state_dict_from_keys({"model.a"}, storage_reader=reader)
    assert set(got) == {"model"} and set(got["model"]) == {"a"}
    assert torch.equal(got["model"]["a"], sd["model"]["a"])
    moved = reader.bytes_read + reader.bytes_from_ram  # from storage or the RAM tier
    assert need <= moved <= 1.05 * need, (reader.bytes_read, reader.bytes_from_ram, need)
    # No keys: everything, unflattened with the planner data saved with the checkpoint.
    reader = ct.StorageReader("keys/run/step-1", socket=daemon.socket)
    everything = _load_state_dict_from_keys(storage_reader=reader)
    assert_same(sd, everything)
    assert reader.bytes_read + reader.bytes_from_ram <= 1.05 * 2 * need


def test_a_reader_with_the_prefetch_hint_restores_through_the_ram_tier(
    daemon: Daemon, client: ckptd.Client
) -> None:
    sd = _saved_big(daemon, "hinted/run/step-1")
    _saved_big(daemon, "hinted/run/step-2")  # step 1 leaves the RAM tier (one kept per job)
    assert not client.status("hinted.run", 1)["tiers"]["ram"]
    out = {"model": {"a": torch.zeros(MIB_ROWS, 1024), "b": torch.zeros(MIB_ROWS, 1024)}}
    reader = ct.StorageReader("hinted/run/step-1", socket=daemon.socket, prefetch=True)
    dcp.load(out, storage_reader=reader)
    assert torch.equal(out["model"]["a"], sd["model"]["a"])
    assert torch.equal(out["model"]["b"], sd["model"]["b"])
    need = sd["model"]["a"].nbytes + sd["model"]["b"].nbytes
    assert reader.bytes_read == 0 and reader.bytes_from_ram == need
    assert reader.bytes_prefetched >= need
    assert client.status("hinted.run", 1)["tiers"]["ram"]


def test_partial_load(daemon: Daemon) -> None:
    sd = _saved_big(daemon, "partial/run/step-1")
    out = {"model": {"a": torch.zeros(MIB_ROWS, 1024), "new": torch.full((3,), 7.0)}}
    with pytest.raises(CheckpointException, match=r"model\.new"):
        dcp.load(out, storage_reader=ct.StorageReader("partial/run/step-1", socket=daemon.socket))
    reader = ct.StorageReader("partial/run/step-1", socket=daemon.socket)
    dcp.load(out, storage_reader=reader, planner=DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(out["model"]["a"], sd["model"]["a"])
    assert torch.equal(out["model"]["new"], torch.full((3,), 7.0))  # not in the checkpoint
    assert reader.bytes_read + reader.bytes_from_ram <= 1.05 * sd["model"]["a"].nbytes


def test_no_dist_without_a_process_group(daemon: Daemon, client: ckptd.Client) -> None:
    sd = state(4)
    dcp.save(
        sd, storage_writer=ct.StorageWriter("nodist/one/step-1", socket=daemon.socket), no_dist=True
    )
    assert client.status("nodist.one", 1)["world_size"] == 1
    out = zeros(state(0))
    dcp.load(
        out,
        storage_reader=ct.StorageReader("nodist/one/step-1", socket=daemon.socket),
        no_dist=True,
    )
    assert_same(sd, out)


def test_rank_local_save_needs_a_step(daemon: Daemon, client: ckptd.Client) -> None:
    # Without collectives the ranks cannot agree on a free step: refused, naming the fix.
    writer = ct.StorageWriter("local1/run/latest", socket=daemon.socket)
    with pytest.raises(ValueError, match="use_collectives=False the ranks cannot agree"):
        dcp.save({"w": torch.ones(3)}, storage_writer=writer, use_collectives=False)
    # With a step: one process's rank-local part, a checkpoint of its own, read back whole.
    sd = {"w": torch.arange(12.0).reshape(3, 4), "n": 1}
    dcp.save(
        sd,
        storage_writer=ct.StorageWriter("local1/run/step-4", socket=daemon.socket),
        use_collectives=False,
    )
    assert client.status("local1.run._rank0", 4)["state"] == "COMMITTED"
    with pytest.raises(ckptd.NotFoundError):
        client.status("local1.run", 4)
    out = {"w": torch.zeros(3, 4), "n": 0}
    dcp.load(out, storage_reader=ct.StorageReader("local1/run/step-4", socket=daemon.socket))
    assert torch.equal(out["w"], sd["w"]) and out["n"] == 1


def test_deprecated_entry_points(daemon: Daemon) -> None:
    # save_state_dict / load_state_dict call reset() without an id: the writer keeps its own.
    # (torch 2.13's private _Checkpointer fails before reaching any storage: it passes
    # coordinator_rank= to dcp.save, which has no such argument.)
    import warnings

    sd = state(11)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        writer = ct.StorageWriter("entry/old/step-2", socket=daemon.socket)
        dcp.save_state_dict(sd, writer, no_dist=True)  # no process group here
        out = zeros(state(0))
        reader = ct.StorageReader("entry/old/step-2", socket=daemon.socket)
        dcp.load_state_dict(out, reader, no_dist=True)
    assert_same(sd, out)


def test_a_planner_unlike_stages_is_refused(daemon: Daemon) -> None:
    # stage() plans with DefaultSavePlanner to hand the shards over early; a planner that names
    # the items otherwise (no flattening) cannot use them: refused, naming the items and the fix.
    sd = {"model": {"w": torch.ones(4)}}
    writer = ct.StorageWriter("planner/run/step-1", socket=daemon.socket)
    fut = dcp.async_save(sd, storage_writer=writer, planner=DefaultSavePlanner(False))
    with pytest.raises(CheckpointException, match=r"items \[.model.\] were not staged by stage"):
        fut.result(timeout=120)
