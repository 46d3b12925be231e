"""One copy on restore (issue 37 §1): a load of a checkpoint hot in the RAM tier into ordinary
numpy arrays and torch tensors — whole items, boxes and flat ranges (resharding) — is copied by
the library straight from the hot copy in its arena segment, bit-exact, reading nothing from
storage; hot_direct=False (the daemon's copy into scratch, then the library's) gives the same."""

from __future__ import annotations

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
    rng = np.random.default_rng(37)
    return {
        "w": rng.standard_normal((300, 257)).astype(np.float32),  # not a 4 KiB multiple
        "b": rng.standard_normal(4099).astype(np.float16),
        "big": rng.standard_normal(3 << 20).astype(np.float32),  # 12 MiB: several blocks
    }


@pytest.mark.parametrize("hot_direct", [True, False])
def test_a_hot_restore_into_ordinary_arrays_and_tensors_is_exact(
    client: ckptd.Client, hot_direct: bool
) -> None:
    sd = state()
    job = f"py-hot-direct-{hot_direct}"
    client.save(job, 1, sd).committed().result(60)
    assert client.status(job, 1)["tiers"]["ram"]
    total = sum(v.nbytes for v in sd.values())
    arrays = {k: np.zeros_like(v) for k, v in sd.items()}
    tensors = {k: torch.zeros(v.shape, dtype=torch.from_numpy(v).dtype) for k, v in sd.items()}
    for dest in (arrays, tensors):
        got = client.load_into_counted(
            job, 1, [(k, None, d) for k, d in dest.items()], hot_direct=hot_direct
        )
        for k, v in sd.items():
            d = dest[k].numpy() if isinstance(dest[k], torch.Tensor) else dest[k]
            np.testing.assert_array_equal(d, v)
        assert got["bytes_read"] == 0 and got["bytes_from_ram"] == total


@pytest.mark.parametrize("hot_direct", [True, False])
def test_resharded_regions_restore_exactly_from_ram(client: ckptd.Client, hot_direct: bool) -> None:
    sd = state()
    job = f"py-hot-regions-{hot_direct}"
    client.save(job, 1, sd).committed().result(60)
    w, big = sd["w"], sd["big"]
    box = np.zeros((100, 57), np.float32)  # rows 50..150, columns 200..257: many short runs
    flat = torch.zeros(1000, dtype=torch.float32)
    tail = np.zeros(5 << 10, np.float32)
    targets = [
        ("w", ckptd.Box([50, 200], [100, 57]), box),
        ("w", ckptd.Flat(1234, 1000), flat),
        ("big", ckptd.Flat(len(big) - tail.size, tail.size), tail),
    ]
    got = client.load_into_counted(job, 1, targets, hot_direct=hot_direct)
    np.testing.assert_array_equal(box, w[50:150, 200:257])
    np.testing.assert_array_equal(flat.numpy(), w.reshape(-1)[1234:2234])
    np.testing.assert_array_equal(tail, big[-tail.size :])
    assert got["bytes_read"] == 0
