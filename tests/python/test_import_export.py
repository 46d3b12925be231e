"""Imports (`python3 -m ckptd import`, the ckptd-import script) of the formats users already have —
safetensors written by the `safetensors` library, torch.save state dicts, DCP FileSystemWriter
directories (one process, and DTensors saved by four gloo ranks on a 2-D mesh) — loaded back
bit-exact whole and in other layouts; exports to DCP loaded by stock FileSystemReader; hostile and
malformed inputs refused with exit 3 naming the file, without running anything; memory bounded by
the batch."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import re
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptd
from conftest import ROOT, Daemon, free_port, run_rank

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402

import ckptd.torch as ct  # noqa: E402
from ckptd.formats import Progress, parse_size  # noqa: E402

# dcp.save / dcp.load without a process group: "assuming the intent is to ... a single process".
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


# --- helpers -------------------------------------------------------------------------------------
def cli(daemon: Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """`python3 -m ckptd COMMAND --socket <daemon's> ARGS...` run in this process (torch is
    imported once): its exit code and output, as a subprocess would give them."""
    from ckptd import _cli

    out, err = io.StringIO(), io.StringIO()
    argv = [args[0], "--socket", daemon.socket, *args[1:]]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = _cli.main(argv)
        except SystemExit as e:  # argparse's usage errors
            code = int(e.code or 0)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def cli_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`python3 -m ckptd ARGS...` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "ckptd", *args], capture_output=True, text=True, timeout=300
    )


def same_bits(a: Any, b: Any) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def assert_loads_back(client: ckptd.Client, job: str, step: int, ref: dict[str, Any]) -> None:
    """Every tensor whole and bit-exact, and every 2-D one's middle rows as a Box (another
    layout than the import's batches)."""
    out = client.load(job, step, items=list(ref), as_torch=True)
    assert set(out.tensors) == set(ref)
    for name, want in ref.items():
        assert same_bits(out.tensors[name], want), name
        if want.dim() == 2 and want.shape[0] >= 4:
            lo, n = want.shape[0] // 4, want.shape[0] // 2
            rows = torch.empty((n, want.shape[1]), dtype=want.dtype)
            box = ckptd.Box([lo, 0], [n, want.shape[1]])
            client.load(job, step, {name: (rows, box)})
            assert same_bits(rows, want[lo : lo + n]), name


def summary(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


def refused(out: subprocess.CompletedProcess[str], names: str | Path) -> None:
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
    assert "refused" in out.stderr and str(names) in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr


def no_checkpoint(client: ckptd.Client, job: str) -> None:
    assert [c["state"] for c in client.list(job)] in ([], ["ABORTED"])


class OpensMarker:
    """Pickled as a call of builtins.open(path, "w"): were it ever unpickled unrestricted, the
    marker file would appear (harmless, and the tests check it never does)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


# --- safetensors --------------------------------------------------------------------------------
def st_reference() -> dict[str, Any]:
    g = torch.Generator().manual_seed(11)
    return {
        "model.embed.weight": torch.randn(96, 40, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up": torch.randn(64, 72, generator=g).to(torch.float16),
        "model.layers.0.attn.qkv": torch.randn(200, 64, generator=g),  # 50 KiB: split
        "model.fp8": torch.randn(16, 24, generator=g).to(torch.float8_e4m3fn),
        "model.token_ids": torch.randint(-(2**40), 2**40, (20, 3), generator=g),
        "model.scale": torch.tensor(0.125),  # 0-d
        "model.empty": torch.zeros(0, 8),
        "model.mask": torch.rand(12, 7, generator=g) > 0.5,
    }


def test_safetensors_single_file(daemon: Daemon, tmp_path: Path) -> None:
    ref = st_reference()
    path = tmp_path / "model.safetensors"
    save_file(ref, str(path), metadata={"format": "pt", "note": "single"})
    out = cli(
        daemon,
        "import",
        "--json",
        "--format",
        "safetensors",
        "--batch_bytes",
        "32KiB",
        "imp-st",
        "1",
        str(path),
    )
    s = summary(out)
    assert s["tensors"] == len(ref) and s["objects"] == 0
    assert s["world_size"] > 3 and max(s["rank_bytes"]) <= 32 << 10
    assert s["bytes"] == sum(t.numel() * t.element_size() for t in ref.values())
    client = ckptd.connect(daemon.socket)
    assert_loads_back(client, "imp-st", 1, ref)
    meta = client.load_object("imp-st", 1, "__ckptd__/safetensors_metadata")
    assert meta == {"model.safetensors": {"format": "pt", "note": "single"}}


def test_safetensors_sharded_index(daemon: Daemon, tmp_path: Path) -> None:
    ref = st_reference()
    names = sorted(ref)
    shards = {
        "model-00001-of-00002.safetensors": names[:4],
        "model-00002-of-00002.safetensors": names[4:],
    }
    for file, part in shards.items():
        save_file({n: ref[n] for n in part}, str(tmp_path / file), metadata={"format": "pt"})
    index = {
        "metadata": {"total_size": 0},
        "weight_map": {n: f for f, p in shards.items() for n in p},
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    s = summary(
        cli(
            daemon,
            "import",
            "--json",
            "--quiet",
            "--format",
            "safetensors",
            "imp-st2",
            "4",
            str(tmp_path),
        )
    )
    assert s["tensors"] == len(ref) and s["world_size"] == 1
    assert_loads_back(ckptd.connect(daemon.socket), "imp-st2", 4, ref)


def test_safetensors_hostile_files_are_refused(daemon: Daemon, tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    save_file({"a": torch.randn(8, 4), "b": torch.arange(5)}, str(good))
    data = good.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + n])

    def with_header(name: str, edit: Any) -> Path:
        h = json.loads(json.dumps(header))
        edit(h)
        raw = json.dumps(h).encode()
        raw += b" " * (-len(raw) % 8)
        path = tmp_path / name
        path.write_bytes(struct.pack("<Q", len(raw)) + raw + data[8 + n :])
        return path

    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(data[:-7])
    cases = [
        truncated,
        with_header("offsets.safetensors", lambda h: h["a"].update(data_offsets=[0, 1 << 20])),
        with_header("dtype.safetensors", lambda h: h["a"].update(dtype="F64")),  # sizes lie
        with_header("shape.safetensors", lambda h: h["b"].update(shape=[9])),
        with_header("unknown.safetensors", lambda h: h["b"].update(dtype="C64")),
    ]
    client = ckptd.connect(daemon.socket)
    for i, path in enumerate(cases):
        refused(cli(daemon, "import", "--format", "safetensors", "bad-st", str(i), str(path)), path)
    escape = tmp_path / "escape.safetensors.index.json"
    escape.write_text(json.dumps({"weight_map": {"a": "../../etc/passwd"}}))
    refused(cli(daemon, "import", "--format", "safetensors", "bad-st", "9", str(escape)), escape)
    no_checkpoint(client, "bad-st")


# --- torch.save ---------------------------------------------------------------------------------
def test_torch_save_nested_state_dict(daemon: Daemon, tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(5)
    state = {
        "model": {"layer": {"weight": torch.randn(48, 16, generator=g), "bias": torch.zeros(16)}},
        "blocks": [torch.arange(6, dtype=torch.int64), torch.randn(3, 3, generator=g).half()],
        "optim": {
            "state": {0: {"exp_avg": torch.randn(48, 16, generator=g).to(torch.bfloat16)}},
            "param_groups": [{"lr": 0.01, "params": [0]}],
        },
        "epoch": 7,
        "name": "run-42",
    }
    path = tmp_path / "state.pt"
    torch.save(state, path)
    s = summary(
        cli(
            daemon,
            "import",
            "--json",
            "--format",
            "torch",
            "--batch_bytes",
            "64KiB",
            "imp-pt",
            "2",
            str(path),
        )
    )
    assert s["tensors"] == 5 and s["objects"] == 3
    ref = {
        "model.layer.weight": state["model"]["layer"]["weight"],
        "model.layer.bias": state["model"]["layer"]["bias"],
        "blocks.0": state["blocks"][0],
        "blocks.1": state["blocks"][1],
        "optim.state.0.exp_avg": state["optim"]["state"][0]["exp_avg"],
    }
    client = ckptd.connect(daemon.socket)
    assert_loads_back(client, "imp-pt", 2, ref)
    out = client.load("imp-pt", 2)
    assert out.objects == {
        "epoch": 7,
        "name": "run-42",
        "optim.param_groups": [{"lr": 0.01, "params": [0]}],
    }


def test_torch_save_hostile_files_are_refused(daemon: Daemon, tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    evil = tmp_path / "evil.pt"
    torch.save({"w": torch.ones(2), "x": OpensMarker(str(marker))}, evil)
    good = tmp_path / "good.pt"
    torch.save({"w": torch.randn(64, 64)}, good)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    bare = tmp_path / "bare.pt"
    torch.save(torch.ones(3), bare)
    for i, path in enumerate((evil, truncated, bare)):
        refused(cli(daemon, "import", "--format", "torch", "bad-pt", str(i), str(path)), path)
    assert not marker.exists()
    no_checkpoint(ckptd.connect(daemon.socket), "bad-pt")


# --- DCP, one process ---------------------------------------------------------------------------
def dcp_state() -> dict[str, Any]:
    g = torch.Generator().manual_seed(3)
    return {
        "model": {
            "w": torch.randn(64, 48, generator=g),
            "b": torch.randn(48, generator=g).to(torch.bfloat16),
        },
        "optim": {"step": torch.tensor(12.0), "m": torch.randn(64, 48, generator=g).half()},
        "epoch": 3,
        "cfg": {"lr": 0.1, "name": "x"},
        "history": [1, 2, 3],
    }


def dcp_save(state: dict[str, Any], path: Path) -> None:
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path)))


def test_dcp_directory_imports_and_loads_in_other_layouts(daemon: Daemon, tmp_path: Path) -> None:
    state = dcp_state()
    dcp_save(state, tmp_path / "ckpt")
    s = summary(
        cli(
            daemon,
            "import",
            "--json",
            "--format",
            "dcp",
            "--batch_bytes",
            "16KiB",
            "imp-dcp",
            "3",
            str(tmp_path / "ckpt"),
        )
    )
    assert s["tensors"] == 4 and s["objects"] == 4  # epoch, cfg.lr, cfg.name, history
    client = ckptd.connect(daemon.socket)
    ref = {
        "model.w": state["model"]["w"],
        "model.b": state["model"]["b"],
        "optim.step": state["optim"]["step"],
        "optim.m": state["optim"]["m"],
    }
    assert_loads_back(client, "imp-dcp", 3, ref)
    # ckptd.torch reads it as if it had saved it: nested state dict, objects included.
    into = {
        "model": {"w": torch.empty(64, 48), "b": torch.empty(48, dtype=torch.bfloat16)},
        "optim": {"step": torch.empty(()), "m": torch.empty(64, 48, dtype=torch.float16)},
        "epoch": 0,
        "cfg": {"lr": 0.0, "name": ""},
        "history": [],
    }
    dcp.load(into, storage_reader=ct.StorageReader("imp-dcp/step-3", socket=daemon.socket))
    assert (
        into["epoch"] == 3
        and into["cfg"] == {"lr": 0.1, "name": "x"}
        and into["history"] == [1, 2, 3]
    )
    assert same_bits(into["model"]["w"], state["model"]["w"])
    assert same_bits(into["optim"]["m"], state["optim"]["m"])


def test_dcp_hostile_directories_are_refused(daemon: Daemon, tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    client = ckptd.connect(daemon.socket)

    def fresh(name: str) -> Path:
        path = tmp_path / name
        dcp_save({"a": torch.randn(32, 32), "b": torch.randn(32, 32)}, path)
        return path

    def metadata(path: Path) -> Any:
        with open(path / ".metadata", "rb") as f:
            return pickle.load(f)  # the test's own file: trusted

    def rewrite(path: Path, md: Any) -> None:
        with open(path / ".metadata", "wb") as f:
            pickle.dump(md, f)

    # A .metadata that names builtins.open (a stand-in for os.system).
    evil = fresh("evil")
    (evil / ".metadata").write_bytes(pickle.dumps(OpensMarker(str(marker))))
    out = cli(daemon, "import", "--format", "dcp", "bad-dcp", "1", str(evil))
    refused(out, evil / ".metadata")
    assert "io.open, which is not allowed" in out.stderr  # builtins.open pickles as io.open
    # A byte range past the end of its file (truncated data), and a path outside the directory.
    short = fresh("short")
    (data,) = short.glob("*.distcp")
    data.write_bytes(data.read_bytes()[:-100])
    refused(cli(daemon, "import", "--format", "dcp", "bad-dcp", "2", str(short)), data)
    outside = fresh("outside")
    md = metadata(outside)
    for info in md.storage_data.values():
        info.relative_path = "../evil/.metadata"
    rewrite(outside, md)
    refused(cli(daemon, "import", "--format", "dcp", "bad-dcp", "3", str(outside)), outside)
    # A chunk whose sizes do not cover the tensor.
    gap = fresh("gap")
    md = metadata(gap)
    md.state_dict_metadata["a"].chunks[0].sizes = torch.Size([16, 32])
    rewrite(gap, md)
    refused(cli(daemon, "import", "--format", "dcp", "bad-dcp", "4", str(gap)), gap)
    # A non-tensor value whose pickle calls open: DCP stores it, the import refuses it unread.
    obj = tmp_path / "object"
    dcp_save({"a": torch.ones(4), "x": OpensMarker(str(marker))}, obj)
    refused(cli(daemon, "import", "--format", "dcp", "bad-dcp", "5", str(obj)), obj)
    assert not marker.exists()
    no_checkpoint(client, "bad-dcp")


def test_dcp_corrupt_chunk_aborts_the_import(daemon: Daemon, tmp_path: Path) -> None:
    """A chunk that fails to decode after earlier ranks were saved: exit 3, checkpoint ABORTED."""
    path = tmp_path / "ckpt"
    dcp_save({"a": torch.randn(32, 64), "b": torch.randn(32, 64)}, path)
    with open(path / ".metadata", "rb") as f:
        md = pickle.load(f)
    last = max(
        (md.storage_data[MetadataIndex(n, torch.Size([0, 0]))] for n in "ab"),
        key=lambda i: i.offset,
    )
    data = path / last.relative_path
    raw = bytearray(data.read_bytes())
    raw[last.offset : last.offset + 64] = b"\0" * 64  # its zip header
    data.write_bytes(bytes(raw))
    out = cli(
        daemon, "import", "--format", "dcp", "--batch_bytes", "8KiB", "bad-chunk", "1", str(path)
    )
    refused(out, data)
    (info,) = ckptd.connect(daemon.socket).list("bad-chunk")
    assert info["state"] == "ABORTED"


# --- DCP, DTensors saved by four processes on a 2-D mesh ----------------------------------------
def dtensor_reference() -> dict[str, Any]:
    return {
        "rows": torch.arange(10 * 6, dtype=torch.float32).reshape(10, 6),
        "cols": torch.randn(4, 9, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16),
        "rep": torch.arange(5, dtype=torch.int64),
        "uneven": torch.arange(7 * 5, dtype=torch.float64).reshape(7, 5),
    }


def save_dtensors(rank: int, path: str) -> None:
    """A (2, 2) mesh (data parallel x tensor parallel, as FSDP2 + TP lay it out): a tensor
    sharded on both mesh dims, one replicated on the first and sharded on the second, one
    replicated on both, and one sharded twice along the same dim into uneven chunks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=4)
    try:
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        ref = dtensor_reference()
        state = {
            "rows": distribute_tensor(ref["rows"], mesh, [Shard(0), Shard(1)]),
            "cols": distribute_tensor(ref["cols"], mesh, [Replicate(), Shard(1)]),
            "rep": distribute_tensor(ref["rep"], mesh, [Replicate(), Replicate()]),
            "uneven": distribute_tensor(ref["uneven"], mesh, [Shard(0), Shard(0)]),
            "meta": {"epoch": 9},
        }
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
    finally:
        dist.destroy_process_group()


def test_dcp_dtensors_from_a_2d_mesh(daemon: Daemon, tmp_path: Path) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    path = str(tmp_path / "dtensors")
    mp.start_processes(
        run_rank, args=(save_dtensors, path), nprocs=4, join=True, start_method="spawn"
    )
    s = summary(cli(daemon, "import", "--json", "--format", "dcp", "imp-dt", "1", path))
    assert s["tensors"] == 4 and s["objects"] == 1
    client = ckptd.connect(daemon.socket)
    shards = {i["name"]: i["shard_count"] for i in client.inspect("imp-dt", 1)}
    counts = (shards["rows"], shards["cols"], shards["rep"], shards["uneven"])
    assert counts == (4, 2, 1, 4), counts  # the saved chunks, each once
    ref = dtensor_reference()
    assert_loads_back(client, "imp-dt", 1, ref)
    # Other layouts: boxes across the saved chunks' boundaries in both dims.
    rows = torch.empty(4, 3)  # rows 3..6 x columns 2..4: all four (5 x 3) chunks
    cols = torch.empty(4, 3, dtype=torch.bfloat16)  # columns 3..5 straddle both saved chunks
    uneven = torch.empty(3, 5, dtype=torch.float64)  # rows 3..5 of chunks 2, 2, 2, 1 rows
    client.load(
        "imp-dt",
        1,
        {
            "rows": (rows, ckptd.Box([3, 2], [4, 3])),
            "cols": (cols, ckptd.Box([0, 3], [4, 3])),
            "uneven": (uneven, ckptd.Box([3, 0], [3, 5])),
        },
    )
    assert same_bits(rows, ref["rows"][3:7, 2:5])
    assert same_bits(cols, ref["cols"][:, 3:6])
    assert same_bits(uneven, ref["uneven"][3:6])
    # DCP's byte items are kept as ckptd.torch keeps them: torch.save bytes.
    raw = client.load_object("imp-dt", 1, "meta.epoch", raw=True)
    assert torch.load(io.BytesIO(raw), weights_only=True) == 9


# --- export to DCP -------------------------------------------------------------------------------
def test_export_dcp_loads_with_stock_reader(daemon: Daemon, tmp_path: Path) -> None:
    """Saved by 4 ranks as row blocks and flat ranges; exported in chunks of 16 KiB (SHARD
    items); stock dcp.load into plain tensors, one process, no process group."""
    g = torch.Generator().manual_seed(9)
    ref = {
        "w": torch.randn(100, 40, generator=g),  # 16000 bytes: one chunk
        "big": torch.randn(300, 32, generator=g).to(torch.bfloat16),  # 18.75 KiB
        "flat": torch.randn(1000, generator=g, dtype=torch.float64),
        "zero_d": torch.tensor(3, dtype=torch.int32),
        "empty": torch.zeros(0, 3),
    }
    client = ckptd.connect(daemon.socket)
    for rank in range(4):
        tensors: dict[str, Any] = {}
        for name, t in ref.items():
            if t.dim() == 2 and t.shape[0] > 0:
                lo, hi = t.shape[0] * rank // 4, t.shape[0] * (rank + 1) // 4
                tensors[name] = ckptd.Shard(
                    t[lo:hi].clone(), list(t.shape), ckptd.Box([lo, 0], [hi - lo, t.shape[1]])
                )
            elif t.dim() == 1:
                lo, hi = t.numel() * rank // 4, t.numel() * (rank + 1) // 4
                tensors[name] = ckptd.Shard(t[lo:hi].clone(), [t.numel()], ckptd.Flat(lo, hi - lo))
            elif rank == 0:
                tensors[name] = t
        objects = (
            {
                "epoch": 4,
                "config": {"lr": 3e-4, "betas": (0.9, 0.95)},
                "rng": np.random.default_rng(0),
            }
            if rank == 0
            else None
        )
        client.save("exp", 5, tensors, objects, rank=rank, world_size=4)
    client.wait("exp", 5)
    out_dir = tmp_path / "dcp"
    s = summary(
        cli(daemon, "export", "--json", "--chunk_bytes", "16KiB", "exp", "latest", str(out_dir))
    )
    assert s["step"] == 5 and s["tensors"] == len(ref) and s["objects"] == 2
    assert len(s["skipped"]) == 1 and s["skipped"][0].startswith("rng")
    state: dict[str, Any] = {n: torch.empty(t.shape, dtype=t.dtype) for n, t in ref.items()}
    state.update(epoch=0, config={})
    dcp.load(state, storage_reader=dcp.FileSystemReader(str(out_dir)), no_dist=True)
    for name, want in ref.items():
        assert same_bits(state[name], want), name
    assert state["epoch"] == 4 and state["config"] == {"lr": 3e-4, "betas": (0.9, 0.95)}
    md = dcp.FileSystemReader(str(out_dir)).read_metadata()
    assert len(md.state_dict_metadata["big"].chunks) == 2  # row blocks of at most 16 KiB
    # The target exists: refused without --force; replaced with it; other files never replaced.
    again = cli(daemon, "export", "exp", "5", str(out_dir))
    assert again.returncode == 1 and "--force" in again.stderr
    assert cli(daemon, "export", "--force", "--quiet", "exp", "5", str(out_dir)).returncode == 0
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert cli(daemon, "export", "--force", "exp", "5", str(other)).returncode == 1
    assert (other / "notes.txt").read_text() == "mine"


def test_dcp_round_trip_through_ckptd(daemon: Daemon, tmp_path: Path) -> None:
    """DCP in, DCP out: the nested state dict (planner_data kept) loads as it was saved, also
    through DCP's own dcp_to_torch_save (the empty-state-dict planner)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    state = dcp_state()
    dcp_save(state, tmp_path / "in")
    assert (
        cli(
            daemon, "import", "--quiet", "--format", "dcp", "trip", "1", str(tmp_path / "in")
        ).returncode
        == 0
    )
    assert cli(daemon, "export", "--quiet", "trip", "1", str(tmp_path / "out")).returncode == 0
    dcp_to_torch_save(str(tmp_path / "out"), str(tmp_path / "out.pt"))
    back = torch.load(tmp_path / "out.pt", weights_only=True)
    assert (
        back["epoch"] == 3
        and back["cfg"] == {"lr": 0.1, "name": "x"}
        and back["history"] == [1, 2, 3]
    )
    for group in ("model", "optim"):
        for k, v in state[group].items():
            assert same_bits(back[group][k], v), (group, k)


# --- memory and progress ------------------------------------------------------------------------
PROBE = r"""
import sys, threading, time
def anon():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
import ckptd._cli, ckptd.formats._dcp_import, ckptd.formats._importer  # noqa: imports first
peak, stop = [0], threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], anon())
        time.sleep(0.001)
base = anon()
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
rc = ckptd._cli.main(sys.argv[1:])
stop.set()
sampler.join()
print("ANON_GROWTH", peak[0] - base, file=sys.stderr)
sys.exit(rc)
"""


def test_memory_is_bounded_by_the_batch(daemon: Daemon, tmp_path: Path) -> None:
    """A 48 MiB DCP checkpoint (48 tensors of 1 MiB) imported in batches of 4 MiB: every rank the
    daemon stored holds at most 4 MiB (its blob on disk), and the import process's anonymous
    memory (DCP chunks are decoded into it) grows by far less than the checkpoint."""
    g = torch.Generator().manual_seed(2)
    dcp_save({f"layer{i}": torch.randn(512, 512, generator=g) for i in range(48)}, tmp_path / "big")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            "import",
            "--json",
            "--quiet",
            "--socket",
            daemon.socket,
            "--format",
            "dcp",
            "--batch_bytes",
            "4MiB",
            "imp-mem",
            "1",
            str(tmp_path / "big"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    s = summary(out)
    assert s["world_size"] >= 12 and max(s["rank_bytes"]) <= 4 << 20
    blobs = sorted((Path(daemon.state_dir) / "data").glob("imp-mem/step-*/r*.blob"))
    assert len(blobs) == s["world_size"]
    assert max(b.stat().st_size for b in blobs) <= 4 << 20
    growth = int(out.stderr.split("ANON_GROWTH ")[1].split()[0])
    assert growth < 24 << 20, growth  # the whole checkpoint would be 48 MiB


def test_progress_line_on_a_pipe_and_a_terminal() -> None:
    now = [0.0]
    pipe = io.StringIO()
    p = Progress("import dcp", 100 << 20, stream=pipe, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 1.0
        p.advance(5 << 20)
    p.finish()
    lines = pipe.getvalue().splitlines()
    assert len(lines) == 3  # at 5 s, at 10 s, and the last one
    assert lines[-1] == (
        "import dcp [############------------] 50.0 MiB / 100.0 MiB  50%  5.0 MiB/s  ETA 10s"
    )

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    p = Progress("export dcp", 10, stream=tty, clock=lambda: now[0])
    for _ in range(3):
        now[0] += 1.0
        p.advance(3)
    p.finish()
    assert tty.getvalue().count("\r") == 4 and tty.getvalue().endswith("ETA 0s\n")
    quiet = io.StringIO()
    p = Progress("x", 1, stream=quiet, quiet=True)
    p.advance(1)
    p.finish()
    assert quiet.getvalue() == ""


# --- the command line ---------------------------------------------------------------------------
def test_usage_and_daemon_errors(daemon: Daemon, tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(3)}, str(path))
    assert parse_size("1GiB") == 1 << 30 and parse_size("512MB") == 512_000_000
    bad = cli(
        daemon, "import", "--format", "safetensors", "--batch_bytes", "lots", "u", "1", str(path)
    )
    assert bad.returncode == 2 and "batch_bytes" in bad.stderr
    assert cli(daemon, "import", "--format", "zip", "u", "1", str(path)).returncode == 2
    assert (
        cli(daemon, "export", "--format", "safetensors", "u", "1", str(tmp_path / "x")).returncode
        == 2
    )
    assert cli(daemon, "import", "--format", "safetensors", "u", "1", str(path)).returncode == 0
    exists = cli(daemon, "import", "--format", "safetensors", "u", "1", str(path))
    assert exists.returncode == 1 and "already" in exists.stderr  # the daemon's ALREADY_EXISTS
    missing = cli(daemon, "import", "--format", "torch", "u", "2", str(tmp_path / "nope.pt"))
    assert missing.returncode == 1 and "nope.pt" in missing.stderr
    sock = str(tmp_path / "none.sock")
    nobody = cli_process("import", "--socket", sock, "--format", "safetensors", "u", "3", str(path))
    assert nobody.returncode == 1 and "none.sock" in nobody.stderr


def test_python_m_ckptd_in_a_process(daemon: Daemon, tmp_path: Path) -> None:
    """The exit codes and output of a real `python3 -m ckptd` process: 0 with the summary on
    stdout and the progress on stderr, 3 for a refused file."""
    path = tmp_path / "m.safetensors"
    save_file({"a": torch.ones(300, 10)}, str(path))
    ok = cli_process(
        "import", "--socket", daemon.socket, "--format", "safetensors", "p", "1", str(path)
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith(f"imported safetensors {path} as p/1: 1 tensor, 0 objects")
    assert "import safetensors [########################]" in ok.stderr and "100%" in ok.stderr
    marker = tmp_path / "executed"
    evil = tmp_path / "evil.pt"
    torch.save({"x": OpensMarker(str(marker))}, evil)
    bad = cli_process("import", "--socket", daemon.socket, "--format", "torch", "p", "2", str(evil))
    refused(bad, evil)
    assert not marker.exists()


def test_console_scripts_do_not_shadow_the_daemon() -> None:
    """pyproject's scripts: ckptd-import / ckptd-export, never `ckptd` (the daemon's binary)."""
    from ckptd import _cli

    text = (ROOT / "client" / "python" / "pyproject.toml").read_text()
    section = text.split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]
    scripts = dict(re.findall(r'^([\w-]+) = "([^"]+)"$', section, flags=re.M))
    assert set(scripts) == {"ckptd-import", "ckptd-export"}
    for target in scripts.values():
        module, func = target.split(":")
        assert module == "ckptd._cli" and callable(getattr(_cli, func))
    from ckptd.formats import _common

    assert _common.RESERVED_PREFIX == ct._ids.RESERVED_PREFIX
