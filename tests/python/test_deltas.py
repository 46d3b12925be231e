"""Deltas through the Python client and the exporters (docs/USER_GUIDE.md "Deltas"): a daemon with
deltas on, a job whose frozen tensors repeat and whose adapter changes; the later checkpoint
shares the earlier blob (a hard link in its directory) and every reader gets its own bytes:
client.load, `ckptctl export --format safetensors` and the DCP export, also after the checkpoint
that wrote the shared file is deleted."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ckptd
from conftest import Daemon, ckptctl, own_daemon

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")

JOB = "lora-py"


@pytest.fixture(scope="module")
def delta_daemon() -> Iterator[Daemon]:
    with own_daemon(flags=("--deltas=true", "--ram_tier_keep_per_job=0")) as d:
        yield d


def state(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    frozen = {f"base.{i}": rng.random((256, 256), dtype=np.float32) for i in range(4)}
    adapter = np.full((16, 256), float(step), dtype=np.float32)
    return {**frozen, "lora.a": adapter}


def step_dir(d: Daemon, step: int) -> Path:
    return Path(d.state_dir) / "data" / JOB / f"step-{step:020d}"


def test_every_reader_gets_the_delta_checkpoints_bytes(
    delta_daemon: Daemon, tmp_path: Path
) -> None:
    d = delta_daemon
    with ckptd.connect(d.socket) as client:
        for step in (1, 2):
            client.save(JOB, step, state(step)).committed().result(timeout=60)
        shared = step_dir(d, 2) / "r00000-s00000000000000000001.blob"
        assert shared.exists()
        assert os.stat(shared).st_ino == os.stat(step_dir(d, 1) / "r00000.blob").st_ino
        # The changed adapter is all the later checkpoint wrote.
        assert (step_dir(d, 2) / "r00000.blob").stat().st_size <= 16 * 256 * 4 + 4096
        client.delete(JOB, 1)
        want = state(2)
        got = client.load(JOB, 2).tensors
        assert set(got) == set(want)
        for name, arr in want.items():
            assert np.array_equal(np.asarray(got[name]), arr), name

    out = tmp_path / "hf"
    r = ckptctl(d, "export", JOB, "2", "--format", "safetensors", str(out))
    assert r.returncode == 0, r.stderr
    loaded: dict[str, torch.Tensor] = {}
    for f in out.glob("*.safetensors"):
        loaded.update(st_torch.load_file(str(f)))
    for name, arr in want.items():
        assert torch.equal(loaded[name], torch.from_numpy(arr)), name

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    import ckptd.formats as fmt

    with ckptd.connect(d.socket) as client:
        fmt.export_dcp(client, JOB, 2, str(tmp_path / "dcp"), chunk_bytes=1 << 20)
    got_dcp = _load_state_dict_from_keys(storage_reader=dcp.FileSystemReader(str(tmp_path / "dcp")))
    for name, arr in want.items():
        assert torch.equal(got_dcp[name], torch.from_numpy(arr)), name
