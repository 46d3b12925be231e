"""torch_checkpointing runs on CPU (gloo) for test_torch_checkpointing.py, in three phases. The
state is one item "model" of DTensors on a 1-D mesh of every rank (a DefaultResharder declared,
so the library records sharding metadata and reshards on load), whose full values are a function
of (name, version) whatever the world size.

    save:   (2 ranks) step-1 through CheckpointManager (sync saver); step-2 through the library's
            AsyncCheckpointSaver built with ckptd's Stager and Writer, the live tensors changed as
            soon as staging is done; step-3 where rank 1 SIGKILLs itself after writing its files
            (pre_finalize_callback), before its barrier
    load3:  (3 ranks) latest_checkpoint, then step-1 and step-2 loaded into other placements,
            compared bit-exact with the full tensors
    load1:  (1 rank) the same; step-4 through CheckpointManager's async saver (the library's
            writer subprocess) and loaded back; then on a second daemon (FAULTS_SOCKET,
            FAULTS_STATE_DIR, FAULTS_PID): a missing checkpoint, a corrupt one (its blobs
            flipped), and save / load / latest with that daemon killed; as rank 0 of 2, writes
            that fail (before the barrier; in ckptd's Writer)

One launcher imports everything once and forks the ranks of each phase in turn. Rank 0 of each
phase writes OUT/<phase>.json. Started with MASTER_ADDR and CKPTD_SOCKET set."""

# ruff: noqa: E402 - ckptd is imported first, alone, to check that it imports no torch_checkpointing
from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import ckptd
import ckptd.torch
from ckptd.torch import encode_job

IMPORTED_ALONE = "torch_checkpointing" not in sys.modules

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch_checkpointing import CheckpointManager, ItemSpec
from torch_checkpointing.checkpoint_base import CheckpointBase, CheckpointItem
from torch_checkpointing.default_resharder import DefaultResharder
from torch_checkpointing.metadata_manager import DefaultMetadataManager
from torch_checkpointing.types import RankInfo

import ckptd.torch_checkpointing as ckt

# b: 151 rows, split unevenly at 2 ranks; every shard of w and b over 4 KiB (referenced by the
# write stream, not copied), r under it (copied).
SHAPES = {"w": (256, 64), "b": (151, 64), "r": (4,)}
SAVE_PLACEMENT = {"w": Shard(0), "b": Shard(0), "r": Replicate()}
LOAD_PLACEMENT = {"w": Shard(0), "b": Shard(1), "r": Replicate()}  # b: columns now


def _gather_on_cpu(self: Any, data: Any, process_group: Any = None) -> dict[int, Any]:
    """torch_checkpointing 0.1.1 gathers the sharding metadata of a save from several ranks in
    CUDA tensors (DefaultMetadataManager._all_gather_pickled_data: device="cuda"), whatever the
    storage, so no CPU-only run of more than one rank can save with a resharder. This rig, on a
    machine without a GPU, gathers the same objects over gloo instead; ckptd's module changes
    nothing of the library."""
    out: list[Any] = [None] * dist.get_world_size(process_group)
    dist.all_gather_object(out, data, group=process_group)
    return dict(enumerate(out))


if not torch.cuda.is_available():
    DefaultMetadataManager._all_gather_pickled_data = _gather_on_cpu  # type: ignore[method-assign]


def full(name: str, version: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * version + sorted(SHAPES).index(name))
    return torch.randn(SHAPES[name], generator=g)


def state(mesh: Any, version: int, placements: dict[str, Any], zeros: bool = False) -> dict:
    return {
        n: distribute_tensor(
            torch.zeros(SHAPES[n]) if zeros else full(n, version), mesh, [placements[n]]
        )
        for n in SHAPES
    }


def manager(root: str, **fields: Any) -> CheckpointManager:
    items = {"model": ItemSpec(resharder=DefaultResharder())}
    return CheckpointManager(ckt.manager_config(root, async_save=False, items=items, **fields))


def faults_manager(root: str) -> CheckpointManager:
    return manager(root, socket=os.environ["FAULTS_SOCKET"])


class Checkpoint(CheckpointBase):
    def __init__(self, model: dict[str, Any]) -> None:
        self.model = model

    def get_items(self) -> dict[str, CheckpointItem]:
        return {"model": CheckpointItem(value=self.model, resharder=DefaultResharder())}

    def load_state_dict(self, state_dict: Any) -> None:
        pass


def attempt(out: dict[str, Any], name: str, fn: Any) -> None:
    t0 = time.monotonic()
    try:
        out[name] = f"returned {fn()!r}"
    except BaseException as e:  # the rig reports every failure's type
        out[name] = f"{type(e).__name__}: {e}"[:400]
    out.setdefault("seconds", {})[name] = round(time.monotonic() - t0, 2)


def suicide_on_rank1(_: Any) -> None:
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def save(root: str, mesh: Any, rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    mgr = manager(root)
    mgr.save(f"{root}/step-1", {"model": state(mesh, 1, SAVE_PLACEMENT)})
    out["after_sync"] = ckt.latest_checkpoint(root)

    info = RankInfo(
        global_world_size=world, global_rank=rank, role_rank=rank, role_world_size=world
    )
    saver = ckt.make_async_checkpoint_saver(root, metadata_manager=DefaultMetadataManager(info))
    live = state(mesh, 2, SAVE_PLACEMENT)
    tensor_bytes = sum(t.to_local().nbytes for t in live.values())
    ckptd.reset_copy_stats()
    staged, written = saver.save(f"{root}/step-2", Checkpoint(live))
    staged.result()
    for t in live.values():  # the trainer goes on: the checkpoint keeps the staged values
        t.to_local().add_(1000.0)
    written.result()
    copied = ckptd.copy_stats()["save_bytes"]
    out["async_copied_over_tensor_bytes"] = copied - tensor_bytes
    saver.close()
    out["after_async"] = ckt.latest_checkpoint(root)

    killer = manager(root, pre_finalize_callback=suicide_on_rank1)
    attempt(out, "killed", lambda: killer.save(f"{root}/step-3", {"model": live}))
    out["after_kill"] = ckt.latest_checkpoint(root)
    out["ls"] = ckt.StorageConfig(root=root).create_storage().ls(Path(root))
    return out


def load(root: str, mesh: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"latest": ckt.latest_checkpoint(root)}
    mgr = manager(root)
    for version in (1, 2):
        into = state(mesh, version, LOAD_PLACEMENT, zeros=True)
        mgr.load(f"{root}/step-{version}", into={"model": into})
        out[f"exact{version}"] = all(
            isinstance(t, DTensor) and torch.equal(t.full_tensor(), full(n, version))
            for n, t in into.items()
        )
    return out


def async_manager(root: str, mesh: Any) -> dict[str, Any]:
    """CheckpointManager's default async saver (the library's DefaultStager and writer
    subprocess) through ckptd: step-4, then loaded back."""
    items = {"model": ItemSpec(resharder=DefaultResharder())}
    mgr = CheckpointManager(ckt.manager_config(root, items=items))
    mgr.save(f"{root}/step-4", {"model": state(mesh, 4, SAVE_PLACEMENT)}).result()  # type: ignore[union-attr]
    mgr.close()
    into = state(mesh, 4, LOAD_PLACEMENT, zeros=True)
    manager(root).load(f"{root}/step-4", into={"model": into})
    exact = all(torch.equal(t.full_tensor(), full(n, 4)) for n, t in into.items())
    return {"async_manager_latest": ckt.latest_checkpoint(root), "async_manager_exact": exact}


class Unpicklable(CheckpointBase):
    def get_items(self) -> dict[str, CheckpointItem]:
        return {
            "model": CheckpointItem(value={"w": torch.arange(4.0)}),
            "bad": CheckpointItem(value=lambda: 0),  # torch.save cannot pickle it
        }

    def load_state_dict(self, state_dict: Any) -> None:
        pass


def failed_writes() -> dict[str, Any]:
    """As rank 0 of 2, the other rank's part of each checkpoint saved directly. stale: a file of
    step-5 written, then the write failed before the barrier; then step-6 (one rank). writer:
    ckptd's Writer whose torch.save fails on the second file."""
    out: dict[str, Any] = {}
    client = ckptd.connect(os.environ["CKPTD_SOCKET"])
    job = encode_job("tc/failed")
    client.save(job, 5, {"other_1.pt": np.zeros(8, np.uint8)}, rank=1, world_size=2)
    storage = ckt.StorageConfig(root="tc/failed").create_storage()
    storage.write(Path("tc/failed/tmp_step-5/model_0.pt"), b"the first file")  # then it failed
    mgr = CheckpointManager(ckt.manager_config("tc/failed", async_save=False))
    mgr.save("tc/failed/step-6", {"model": {"w": torch.arange(4.0)}})
    out["stale_state"] = client.status(job, 5)["state"]
    out["stale_next"] = ckt.latest_checkpoint("tc/failed")
    out["stale_exists"] = storage.exists(Path("tc/failed/step-5"))
    into = {"w": torch.zeros(4)}
    mgr.load("tc/failed/step-6", into={"model": into})
    out["stale_next_exact"] = torch.equal(into["w"], torch.arange(4.0))

    job = encode_job("tc/badwrite")
    client.save(job, 9, {"other_1.pt": np.zeros(8, np.uint8)}, rank=1, world_size=2)
    info = RankInfo(global_world_size=2, global_rank=0, role_rank=0, role_world_size=2)
    saver = ckt.make_async_checkpoint_saver("tc/badwrite", rank_info=info)
    _, written = saver.save("tc/badwrite/step-9", Unpicklable())
    attempt(out, "writer_error", lambda: written.result(timeout=60))
    out["writer_state"] = client.status(job, 9)["state"]
    saver.close()
    return out


def faults(root: str, mesh: Any) -> dict[str, Any]:
    """On the daemon of FAULTS_SOCKET (FAULTS_STATE_DIR, FAULTS_PID), which it kills."""
    sock = os.environ["FAULTS_SOCKET"]
    out: dict[str, Any] = {}
    mgr = faults_manager(root)
    into = {"model": state(mesh, 1, LOAD_PLACEMENT, zeros=True)}
    attempt(out, "missing", lambda: mgr.load(f"{root}/step-99", into=into))
    out["empty_latest"] = ckt.latest_checkpoint(root, socket=sock)
    mgr.save(f"{root}/step-1", {"model": state(mesh, 1, SAVE_PLACEMENT)})
    state_dir = Path(os.environ["FAULTS_STATE_DIR"])
    blobs = list((state_dir / "data").rglob("*.blob"))
    for blob in blobs:
        with open(blob, "r+b") as f:
            f.seek(8)
            byte = f.read(1)
            f.seek(8)
            f.write(bytes([byte[0] ^ 0xFF]))
    out["blobs"] = len(blobs)
    attempt(out, "corrupt", lambda: faults_manager(root).load(f"{root}/step-1", into=into))
    os.kill(int(os.environ["FAULTS_PID"]), signal.SIGKILL)
    attempt(out, "down_save", lambda: faults_manager(root).save(f"{root}/step-7", into))
    # Each waits for the client's connect timeout (5 s) before it raises.
    attempt(out, "down_load", lambda: faults_manager(root).load(f"{root}/step-1", into=into))
    attempt(out, "down_latest", lambda: ckt.latest_checkpoint(root, socket=sock))
    return out


PHASES = (("save", "save", 2), ("load3", "load", 3), ("load1", "load", 1))  # (tag, mode, world)


def rank_main(mode: str, tag: str, root: str, out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    result = save(root, mesh, rank, world) if mode == "save" else load(root, mesh)
    if world == 1:
        result.update(async_manager(root, mesh))
        result.update(failed_writes())
        result.update(faults(root, mesh))
    result["imported_alone"] = IMPORTED_ALONE
    if rank == 0:
        (out / f"{tag}.json").write_text(json.dumps(result))


def fork_rank(rank: int, world: int, mode: str, tag: str, root: str, out: Path) -> int:
    pid = os.fork()
    if pid:
        return pid
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
    log = os.open(out / f"{tag}.rank{rank}.log", os.O_WRONLY | os.O_CREAT)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    os.environ["LOCAL_WORLD_SIZE"] = str(world)
    code = 0
    try:
        rank_main(mode, tag, root, out)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # see conftest.run_rank


def main() -> None:
    """Imports once, then forks the ranks of each phase in turn (each rank importing torch and
    DTensor itself would cost seconds on a 2-core machine); writes OUT/codes.json: each phase's
    ranks' exit codes (negative: the signal that ended the rank)."""
    p = argparse.ArgumentParser()
    p.add_argument("--root", required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    codes: dict[str, list[int]] = {}
    for tag, mode, world in PHASES:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
        pids = [fork_rank(r, world, mode, tag, args.root, args.out) for r in range(world)]
        codes[tag] = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
    (args.out / "codes.json").write_text(json.dumps(codes))


if __name__ == "__main__":
    main()
