"""Round-trip check of bench/peers/bytecheckpoint_peer.py on CPU + gloo.

    python3 bench/peers/try_bytecheckpoint.py --ranks 1 2 [--wrap ddp|fsdp|fsdp2] [--mb 4]

Spawns N ranks, takes one Adam step on a small MLP, saves it (sync, then async), loads each
checkpoint into a freshly initialised model + optimizer and checks that every parameter and every
optimizer state tensor equals the saved one. Prints the adapter's timings. Exit code 0 = all ok.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bytecheckpoint_peer as peer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(wrap: str, mb: float, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    width = 512
    # Two width x width layers per block, 4 bytes each; Adam adds 2x the parameter bytes.
    blocks = max(1, round(mb * 2**20 / (2 * width * width * 4)))
    layers: list[torch.nn.Module] = []
    for _ in range(blocks):
        layers += [torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width)]
    model: torch.nn.Module = torch.nn.Sequential(*layers)
    if wrap == "fsdp":
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = FullyShardedDataParallel(model, device_id=torch.device("cpu"))
    elif wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(8, width)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def _local(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    to_local = getattr(t, "to_local", None)
    return to_local() if to_local is not None else t


def _snapshot(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = [_local(p).clone() for p in model.parameters()]
    for p in model.parameters():
        for key in sorted(opt.state[p]):
            value = opt.state[p][key]
            if isinstance(value, torch.Tensor):
                out.append(_local(value).clone())
    return out


def _worker(rank: int, world: int, port: int, root: str, wrap: str, mb: float) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, opt = _build(wrap, mb, seed=0)
        saved = _snapshot(model, opt)
        nbytes = sum(t.numel() * t.element_size() for t in saved)
        for async_save in (False, True, False, True):
            path = os.path.join(root, f"ckpt_async{int(async_save)}")
            stall, committed = peer.save(path, model, opt, async_save=async_save)
            fresh, fresh_opt = _build(wrap, mb, seed=1 + rank)
            if fresh_opt.state:
                for p in fresh.parameters():  # make every state tensor differ from the saved one
                    for value in fresh_opt.state[p].values():
                        if isinstance(value, torch.Tensor):
                            value.add_(1)
            seconds = peer.load(path, fresh, fresh_opt)
            loaded = _snapshot(fresh, fresh_opt)
            ok = len(loaded) == len(saved) and all(map(torch.equal, saved, loaded))
            print(
                f"rank {rank}/{world} wrap={wrap} async={async_save} local_bytes={nbytes} "
                f"stall={stall:.4f}s committed={committed:.4f}s load={seconds:.4f}s equal={ok}",
                flush=True,
            )
            if not ok:
                raise SystemExit(f"rank {rank}: loaded state differs from saved state")
            dist.barrier()
    finally:
        dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--wrap", choices=["ddp", "fsdp", "fsdp2"], default="ddp")
    parser.add_argument("--mb", type=float, default=4.0, help="parameter MiB (approx.)")
    args = parser.parse_args()
    ok, why = peer.available()
    print(f"available={ok} {why}".rstrip(), flush=True)
    if not ok:
        return 1
    for world in args.ranks:
        with tempfile.TemporaryDirectory(prefix="bcp_try_", dir="/tmp") as root:
            mp.spawn(_worker, args=(world, _free_port(), root, args.wrap, args.mb), nprocs=world)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
