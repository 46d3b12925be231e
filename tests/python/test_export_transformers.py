"""docs/USER_GUIDE.md "Exporting to safetensors": an export loads with `transformers`. A tiny Llama
made here
(no hub download: HF_HUB_OFFLINE=1) is saved by two ranks as row blocks, exported with `ckptctl
export` (several files and an index), and loaded by `from_pretrained` next to the model's own
config.json; every weight equals the saved one bit for bit, and the model computes the same
logits as the one that was saved."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import ckptd
from conftest import Daemon, ckptctl

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers reads it: nothing is fetched
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

WORLD = 2


def tiny_llama() -> Any:
    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    torch.manual_seed(7)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms are ones at init: make every weight distinct
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


def test_export_loads_with_transformers_from_pretrained(daemon: Daemon, tmp_path: Path) -> None:
    model = tiny_llama()
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    client = ckptd.connect(daemon.socket)
    for rank in range(WORLD):
        tensors: dict[str, Any] = {}
        for name, t in state.items():
            rows = t.shape[0]
            lo, hi = rows * rank // WORLD, rows * (rank + 1) // WORLD
            box = ckptd.Box([lo] + [0] * (t.dim() - 1), [hi - lo, *t.shape[1:]])
            tensors[name] = ckptd.Shard(t[lo:hi].clone(), list(t.shape), box)
        client.save("py-hf", 3, tensors, rank=rank, world_size=WORLD)
    client.wait("py-hf", 3)
    client.close()

    out = tmp_path / "hf"
    r = ckptctl(daemon, "export", "py-hf", "3", "--format", "safetensors",
                "--max_file_bytes", "64KiB", str(out))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert len(list(out.glob("model-*.safetensors"))) >= 2  # the sharded form, with its index
    model.config.save_pretrained(out)  # the model's own config.json (ckptd does not write one)

    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        out, local_files_only=True, torch_dtype=torch.float32
    ).eval()
    assert type(loaded).__name__ == "LlamaForCausalLM"
    got = loaded.state_dict()
    assert set(got) == set(state)
    for name, want in state.items():
        assert got[name].dtype == want.dtype and torch.equal(got[name], want), name
    ids = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
