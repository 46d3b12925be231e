"""`ckptctl export --format safetensors` read back with the `safetensors` library itself: tensors
saved as row blocks and flat ranges by several ranks come back whole, bit-exact, in every dtype
safetensors has (bfloat16 and float8 included), through the index as Hugging Face loads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import ckptd
from conftest import Daemon, ckptctl

torch = pytest.importorskip("torch")
st_torch = pytest.importorskip("safetensors.torch")
safetensors = pytest.importorskip("safetensors")

WORLD = 4


def reference() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1234)
    return {
        "model.embed.weight": torch.randn(96, 40, generator=g),  # float32
        "model.layers.0.attn.qkv": torch.randn(64, 48, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up": torch.randn(32, 72, generator=g).to(torch.float16),
        "model.layers.0.mlp.fp8": torch.randn(16, 24, generator=g).to(torch.float8_e4m3fn),
        "model.layers.1.mlp.fp8": torch.randn(8, 8, generator=g).to(torch.float8_e5m2),
        "model.layers.0.norm": torch.randn(72, generator=g, dtype=torch.float64),
        "model.token_ids": torch.randint(-(2**40), 2**40, (20, 3), generator=g),
        "model.int32": torch.randint(-1000, 1000, (7, 9), generator=g, dtype=torch.int32),
        "model.int16": torch.randint(-1000, 1000, (5,), generator=g, dtype=torch.int16),
        "model.int8": torch.randint(-100, 100, (6, 2), generator=g, dtype=torch.int8),
        "model.uint8": torch.randint(0, 255, (33,), generator=g, dtype=torch.uint8),
        "model.mask": torch.rand(12, 7, generator=g) > 0.5,
        "optim.step": torch.tensor(1234.5),  # 0-d
        "model.empty": torch.zeros(0, 8),
        'model.\u00e9t\u00e9 "quoted"\\name': torch.arange(6, dtype=torch.float32),  # escaping
    }


def shard(name: str, t: Any, rank: int) -> ckptd.Shard | None:
    """Rank `rank`'s part: row blocks for 2-D tensors, uneven flat ranges for 1-D ones, the
    whole tensor from rank 0 for 0-d and empty ones (saving layouts differ from the export's)."""
    if t.dim() == 0 or t.numel() == 0:
        return ckptd.Shard(t, list(t.shape)) if rank == 0 else None
    if t.dim() == 1:
        n = t.numel()
        cuts = [0] + [min(n, n * i // WORLD + 1) for i in range(1, WORLD)] + [n]
        lo, hi = cuts[rank], cuts[rank + 1]
        return ckptd.Shard(t[lo:hi].clone(), list(t.shape), ckptd.Flat(lo, hi - lo))
    rows = t.shape[0]
    lo, hi = rows * rank // WORLD, rows * (rank + 1) // WORLD
    offsets = [lo] + [0] * (t.dim() - 1)
    lengths = [hi - lo, *t.shape[1:]]
    return ckptd.Shard(t[lo:hi].clone(), list(t.shape), ckptd.Box(offsets, lengths))


def same_bits(a: Any, b: Any) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    # Compared as bytes: bit-exact, and defined for every dtype (float8 has no torch.equal).
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


@pytest.fixture(scope="module")
def saved(daemon: Daemon) -> dict[str, Any]:
    ref = reference()
    client = ckptd.connect(daemon.socket)
    for rank in range(WORLD):
        tensors = {n: s for n, t in ref.items() if (s := shard(n, t, rank)) is not None}
        client.save(
            "py-export",
            7,
            tensors,
            {"extra.config": {"lr": 3e-4}, "extra.rng": rank},
            rank=rank,
            world_size=WORLD,
            per_rank_objects=["extra.rng"],
        )
    client.wait("py-export", 7)
    return ref


def test_export_read_back_with_safetensors_equals_saved(
    daemon: Daemon, saved: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "hf"
    r = ckptctl(daemon, "export", "py-export", "7", "--format", "safetensors",
                "--max_file_bytes", "8KiB", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "extra.config" in r.stdout and "extra.rng" in r.stdout  # skipped objects named

    index = json.loads((out / "model.safetensors.index.json").read_text())
    weight_map: dict[str, str] = index["weight_map"]
    assert set(weight_map) == set(saved)
    files = sorted(set(weight_map.values()))
    assert len(files) >= 3
    assert files == [
        f"model-{i:05d}-of-{len(files):05d}.safetensors" for i in range(1, len(files) + 1)
    ]
    assert sorted(p.name for p in out.iterdir()) == [*files, "model.safetensors.index.json"]
    total = sum(t.numel() * t.element_size() for t in saved.values())
    assert index["metadata"]["total_size"] == total

    loaded: dict[str, Any] = {}
    for f in files:
        path = out / f
        tensors = st_torch.load_file(str(path))
        assert set(tensors) == {n for n, v in weight_map.items() if v == f}
        if len(tensors) > 1:
            assert path.stat().st_size <= 8 * 1024
        with safetensors.safe_open(str(path), framework="pt") as h:
            assert h.metadata()["format"] == "pt"
            assert h.metadata()["ckptd_step"] == "7"
        loaded.update(tensors)
    for name, want in saved.items():
        assert same_bits(loaded[name], want), name
    # The largest tensor is bfloat16, and it is bit-exact too (not just close).
    assert loaded["model.layers.0.attn.qkv"].dtype == torch.bfloat16


def test_export_latest_single_file_loads_like_hugging_face(
    daemon: Daemon, saved: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "one"
    r = ckptctl(daemon, "--json", "export", "py-export", "latest", str(out))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["step"] == 7 and summary["skipped_objects"] == ["extra.config", "extra.rng"]
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model.safetensors"}
    # Hugging Face's sharded loading: open each file the index names, take each tensor.
    for name, file in index["weight_map"].items():
        with safetensors.safe_open(str(out / file), framework="pt") as h:
            assert same_bits(h.get_tensor(name), saved[name]), name


def test_export_errors(daemon: Daemon, saved: dict[str, Any], tmp_path: Path) -> None:
    r = ckptctl(daemon, "export", "py-export", "7", "--format", "onnx", str(tmp_path / "a"))
    assert r.returncode == 2 and "safetensors" in r.stderr
    r = ckptctl(daemon, "export", "py-export", "7", "--max_file_bytes", "lots", str(tmp_path / "b"))
    assert r.returncode == 2 and "--max_file_bytes" in r.stderr
    r = ckptctl(daemon, "export", "py-export", "8", str(tmp_path / "c"))
    assert r.returncode == 1 and "NOT_FOUND" in r.stderr
    out = tmp_path / "d"
    assert ckptctl(daemon, "export", "py-export", "7", str(out)).returncode == 0
    r = ckptctl(daemon, "export", "py-export", "7", str(out))
    assert r.returncode == 1 and "--force" in r.stderr


def test_export_loads_with_dcps_hugging_face_reader(
    daemon: Daemon, saved: dict[str, Any], tmp_path: Path
) -> None:
    # DCP's own HuggingFaceStorageReader (torch.distributed.checkpoint.hf_storage) reads the
    # export through dcp.load: every dtype, bit-exact; and a template with fewer keys reads those.
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint import load as dcp_load

    out = tmp_path / "dcp-hf"
    r = ckptctl(daemon, "export", "py-export", "7", "--max_file_bytes", "8KiB", str(out))
    assert r.returncode == 0, r.stderr
    sd = {n: torch.zeros_like(t) for n, t in saved.items()}
    dcp_load(sd, storage_reader=HuggingFaceStorageReader(str(out)))
    for n, want in saved.items():
        assert same_bits(sd[n], want), n
    some = {"model.embed.weight": torch.zeros(96, 40), "optim.step": torch.tensor(0.0)}
    dcp_load(some, storage_reader=HuggingFaceStorageReader(str(out)))
    assert same_bits(some["model.embed.weight"], saved["model.embed.weight"])
    assert same_bits(some["optim.step"], saved["optim.step"])
