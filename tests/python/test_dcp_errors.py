"""dcp.load through ckptd.torch.StorageReader reports ckptd's error, never DCP's AssertionError
("metadata is None"): a failed read_metadata() makes the reader's read_metadata(rank=r) (DCP's
fallback) raise MetadataError, which DCP passes into its CheckpointException and
ckptd.torch._errors.ckptd_errors (used by the integrations) unwraps. A daemon restarting: loads
fail with UnavailableError naming the socket (bounded), then succeed once it is back. One
process, no_dist."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from bounded import within

from conftest import Daemon, flip_blobs, own_daemon, start_daemon

torch = pytest.importorskip("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.api import CheckpointException  # noqa: E402

import ckptd  # noqa: E402
import ckptd.torch as ct  # noqa: E402
from ckptd.torch._errors import ckptd_errors  # noqa: E402


@pytest.fixture(scope="module")
def corrupt() -> Iterator[Daemon]:
    """A daemon holding err/run step 1 with every blob's bytes flipped (its DCP planner item
    too, which read_metadata reads)."""
    with own_daemon(flags=["--ram_tier_keep_per_job=0"]) as d:
        state = {"w": torch.arange(64, dtype=torch.float32), "step": 3}
        dcp.save(state, storage_writer=ct.StorageWriter("err/run/step-1", socket=d.socket))
        flip_blobs(list(Path(d.state_dir, "data").rglob("*.blob")))
        yield d


def load(d: Daemon, checkpoint: str) -> None:
    state = {"w": torch.zeros(64), "step": 0}
    dcp.load(state, storage_reader=ct.StorageReader(checkpoint, socket=d.socket), no_dist=True)


def test_corrupt_metadata_is_data_loss_not_assertion(corrupt: Daemon) -> None:
    with pytest.raises(CheckpointException) as e:
        load(corrupt, "err/run/step-1")
    (failure,) = e.value.failures.values()
    failure = failure[0] if isinstance(failure, tuple) else failure  # (error, traceback)
    assert isinstance(failure, ct.MetadataError), failure  # not AssertionError("metadata is None")
    assert isinstance(failure.error, ckptd.DataLossError), failure.error
    with pytest.raises(ckptd.DataLossError, match="crc32c"), ckptd_errors():
        load(corrupt, "err/run/step-1")


def test_missing_checkpoint_is_not_found(corrupt: Daemon) -> None:
    with pytest.raises(ckptd.NotFoundError, match="no such checkpoint"), ckptd_errors():
        load(corrupt, "err/none/step-1")


def test_a_fresh_reader_still_reads_a_rank_local_part(corrupt: Daemon) -> None:
    """read_metadata(rank=r) raises ct.MetadataError only right after a failed read_metadata()."""
    reader = ct.StorageReader("err/none/step-1", socket=corrupt.socket)
    with pytest.raises(ckptd.NotFoundError):
        reader.read_metadata(rank=0)  # the part job's own error, not a MetadataError


def test_daemon_down_names_the_socket() -> None:
    with own_daemon() as d:
        d.stop()
        with within(30, "a load with the daemon down"):
            with pytest.raises(ckptd.UnavailableError) as e, ckptd_errors():
                load(d, "err/run/step-1")
    assert d.socket in str(e.value)


def test_a_restarted_daemon_serves_the_checkpoint_again() -> None:
    """Down: UnavailableError, bounded; restarted on its state dir: the same load succeeds."""
    with own_daemon() as d:
        state = {"w": torch.arange(64, dtype=torch.float32), "step": 3}
        dcp.save(state, storage_writer=ct.StorageWriter("err/restart/step-1", socket=d.socket))
        d.stop()
        with within(30, "a load while the daemon restarts"):
            with pytest.raises(ckptd.UnavailableError), ckptd_errors():
                load(d, "err/restart/step-1")
        again = start_daemon(state_dir=d.state_dir)
        try:
            out = {"w": torch.zeros(64), "step": 0}
            reader = ct.StorageReader("err/restart/step-1", socket=again.socket)
            with within(30, "a load from the restarted daemon"), ckptd_errors():
                dcp.load(out, storage_reader=reader, no_dist=True)
        finally:
            again.stop()
    assert torch.equal(out["w"], state["w"]) and out["step"] == 3, out
