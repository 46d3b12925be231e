"""One rank of a Megatron-core dist_checkpointing run on CPU (gloo) for test_megatron.py.

A GPT-like sharded state dict with known global tensors (a seed): a vocab-parallel embedding
(TP on axis 0, first pipeline stage only), two stacked layers whose fc1 (fp32, TP on axis 0) and
fc2 (bf16, TP on axis 1) carry a prepended layer axis split by PP, a layer norm replicated over TP
and DP (only its main replica is saved), a ShardedObject per (PP, TP) rank (DP replicas), and a
common part (Megatron's common.pt). Layouts are "tp,pp,dp" (world = tp*pp*dp; rank = ((pp *
dp) + dp_rank) * tp + tp_rank).

    save:   (all ranks) iter_0000001 blocking with ckptd's strategy object; iter_0000002 with
            async_sharded_save=True scheduled on Megatron's AsyncCallsQueue (the tensors zeroed
            as soon as save() returns); iter_0000003: a real GPTModel at TP=2; iter_0000001
            loaded again in --reload's layout by the same ranks; iter_0000004 at DP=2 through
            Megatron's FullyParallelSaveStrategyWrapper around ckptd's strategy;
            iter_0000005 through the registry ("ckptd", 1) with rank 1 killed before its
            shards are staged
    load:   (one rank) iterations 1, 2 and 4 at --layout with no strategy named (the registry,
            from metadata.json), load_plain_tensors and load_sharded_metadata; the GPTModel at
            TP=1, against a TP=1 model of the saving seed; iteration 5
            saved again (the resume after the killed save) and loaded; then, on the faults
            daemon (CKPTD_FAULTS_SOCKET, CKPTD_STATE_DIR, CKPTD_PID) with strategies given its
            socket: a directory saved twice, a missing directory, one without metadata.json, a
            checkpoint deleted from ckptd, a corrupt one (its blobs flipped), and save / load
            with that daemon killed

Rank 0 writes OUT/<tag>.json (every check's outcome; the test asserts). Started with RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT and CKPTD_SOCKET set."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

VOCAB, HIDDEN, FFN, LAYERS = 8, 6, 8, 2
DP2 = (1, 1, 2)  # the layout of iteration 4


def global_tensors(fill: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + fill)
    return {
        "embedding.word_embeddings.weight": torch.randn(VOCAB, HIDDEN, generator=g),
        "decoder.layers.mlp.linear_fc1.weight": torch.randn(LAYERS, FFN, HIDDEN, generator=g),
        "decoder.layers.mlp.linear_fc2.weight": torch.randn(LAYERS, HIDDEN, FFN, generator=g).to(
            torch.bfloat16
        ),
        "decoder.final_layernorm.weight": torch.randn(HIDDEN, generator=g),
    }


def coords(layout: tuple[int, int, int], rank: int) -> tuple[int, int, int]:
    """(tp_rank, pp_rank, dp_rank) of `rank`."""
    tp, _, dp = layout
    return rank % tp, rank // (tp * dp), (rank // tp) % dp


def sharded_state_dict(
    layout: tuple[int, int, int],
    rank: int,
    fill: int | None,
    saved: tuple[int, int, int] | None = None,
) -> dict[str, Any]:
    """This rank's sharded state dict; fill None: empty tensors to load into. saved: the layout
    that saved the checkpoint, when it differs (its ShardedObjects are keyed by its (PP, TP)
    coordinates, so every rank asks for all of them, rank 0 as the main replica)."""
    from megatron.core.dist_checkpointing import ShardedObject, ShardedTensor

    tp, pp, _ = layout
    tp_rank, pp_rank, dp_rank = coords(layout, rank)
    full = global_tensors(fill if fill is not None else 0)

    def data(t: torch.Tensor) -> torch.Tensor:
        return t.clone() if fill is not None else torch.full_like(t, -7)

    sd: dict[str, Any] = {}
    if pp_rank == 0:
        key = "embedding.word_embeddings.weight"
        local = full[key].chunk(tp, 0)[tp_rank]
        sd[key] = ShardedTensor.from_rank_offsets(
            key, data(local), (0, tp_rank, tp), replica_id=dp_rank
        )
    per_stage = LAYERS // pp
    for i in range(per_stage):
        layer = pp_rank * per_stage + i
        for name, axis in (("linear_fc1", 0), ("linear_fc2", 1)):
            key = f"decoder.layers.mlp.{name}.weight"
            local = full[key][layer].chunk(tp, axis)[tp_rank]
            sd[f"decoder.layers.{i}.mlp.{name}.weight"] = ShardedTensor.from_rank_offsets(
                key,
                data(local),
                (0, layer, LAYERS),
                (axis + 1, tp_rank, tp),
                replica_id=dp_rank,
                prepend_axis_num=1,
            )
    if pp_rank == pp - 1:
        key = "decoder.final_layernorm.weight"
        sd[key] = ShardedTensor.from_rank_offsets(
            key, data(full[key]), replica_id=(tp_rank, dp_rank)
        )
    if saved is None or saved == layout:
        shards = [(pp, tp, pp_rank, tp_rank, dp_rank)]
    else:
        spp, stp = saved[1], saved[0]
        shards = [(spp, stp, p, t, rank) for p in range(spp) for t in range(stp)]
    for opp, otp, p, t, replica in shards:
        value = {"pp": p, "tp": t, "fill": fill} if fill is not None else None
        name = "rng_state" if len(shards) == 1 else f"rng_state.{p}.{t}"
        sd[name] = ShardedObject("rng_state", value, (opp, otp), (p, t), replica_id=replica)
    if fill is not None:
        sd["iteration"] = fill  # common: Megatron's common.pt
        sd["args"] = {"hidden": HIDDEN, "layers": LAYERS}
    return sd


def compare(
    layout: tuple[int, int, int],
    rank: int,
    loaded: dict[str, Any],
    fill: int,
    saved: tuple[int, int, int] | None = None,
) -> list[str]:
    """Names of the entries that differ from what `layout` at `rank` should hold (bit-exact)."""
    expected = sharded_state_dict(layout, rank, fill, saved)
    bad = []
    for k, sh in expected.items():
        got = loaded.get(k)
        if hasattr(sh, "data") and isinstance(sh.data, torch.Tensor):
            if not (
                isinstance(got, torch.Tensor)
                and got.dtype == sh.data.dtype
                and torch.equal(got, sh.data)
            ):
                bad.append(k)
        elif hasattr(sh, "data"):
            if got != sh.data:
                bad.append(f"{k}: {got!r} != {sh.data!r}")
        elif got != sh:
            bad.append(f"{k}: {got!r}")
    return bad


def build_gpt(tp: int, seed: int) -> Any:
    """A real Megatron-core GPTModel (2 layers, the local layer spec: no Transformer Engine) at
    tensor-parallel size `tp`, initialized on the CPU: Megatron then draws each weight whole and
    splits it, so a seed gives the same global weights at every TP size. Every weight + 0.5."""
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.transformer_config import TransformerConfig

    ps.destroy_model_parallel()
    ps.initialize_model_parallel(tensor_model_parallel_size=tp)
    config = TransformerConfig(
        num_layers=2, hidden_size=16, num_attention_heads=4, use_cpu_initialization=True
    )
    torch.manual_seed(seed)
    model = GPTModel(
        config=config,
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=64,
        max_sequence_length=8,
    )
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.5)
    return model


def parse_layout(s: str) -> tuple[int, int, int]:
    tp, pp, dp = (int(x) for x in s.split(","))
    return tp, pp, dp


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("save", "load"))
    p.add_argument("--dir", type=Path, required=True)  # the parent of the iter_* directories
    p.add_argument("--layout", type=parse_layout, default=(1, 1, 1))
    p.add_argument("--reload", type=parse_layout, default=None)
    p.add_argument("--saved", type=parse_layout, default=None)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tag", required=True)
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    import ckptd
    import ckptd.torch  # noqa: F401 (imported for the check below)

    # `import ckptd` (and ckptd.torch) never imports Megatron: only ckptd.megatron does.
    before = sorted(m for m in sys.modules if "megatron" in m)
    from megatron.core import dist_checkpointing as mdc

    import ckptd.megatron as ckm

    result: dict[str, Any] = {"world": world, "megatron_before": before}
    if args.mode == "save":
        save(mdc, ckm, args.dir, args.layout, args.reload or args.layout, result)
    else:
        load(mdc, args.dir, args.layout, args.saved, result)
        result.update(faults(mdc, ckm, args.dir.with_name("faults"), args.layout))
    if rank == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{args.tag}.json").write_text(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # see conftest.run_rank


def save(
    mdc: Any,
    ckm: Any,
    root: Path,
    layout: tuple[int, int, int],
    reload: tuple[int, int, int],
    result: dict[str, Any],
) -> None:
    """Iteration 1 blocking, iteration 2 async, iteration 1 reloaded in `reload`'s layout,
    iteration 4 at DP=2 through the fully parallel wrapper, then iteration 5 with rank 1 killed
    before its shards are staged."""
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    d1, d2, d5 = (root / f"iter_000000{i}" for i in (1, 2, 5))
    for d in (d1, d2, d5):
        d.mkdir(parents=True, exist_ok=True)
    mdc.save(sharded_state_dict(layout, rank, 1), str(d1), sharded_strategy=ckm.save_strategy())
    result["async"] = async_save(mdc, sharded_state_dict(layout, rank, 2), str(d2))
    result["files"] = sorted(f.name for f in d1.iterdir())
    # A real GPTModel's sharded state dict at TP=2 (test_load_at_tp1_... loads it at TP=1).
    d3 = root / "iter_0000003"
    d3.mkdir(parents=True, exist_ok=True)
    gpt_sd = build_gpt(2, 1234).sharded_state_dict()
    mdc.save(gpt_sd, str(d3), sharded_strategy=ckm.save_strategy())
    loaded = mdc.load(sharded_state_dict(reload, rank, None, layout), str(d1))
    gathered: list[Any] = [None] * world
    torch.distributed.all_gather_object(gathered, compare(reload, rank, loaded, 1, layout))
    result["reload_bad"] = gathered
    # DP=2 (each rank a full replica), Megatron's fully parallel wrapper around ckptd's strategy:
    # the replicas' saving is split between the ranks.
    from megatron.core.dist_checkpointing.strategies.fully_parallel import (
        FullyParallelSaveStrategyWrapper,
    )

    d4 = root / "iter_0000004"
    d4.mkdir(parents=True, exist_ok=True)
    wrapper = FullyParallelSaveStrategyWrapper(ckm.save_strategy())
    sd4 = sharded_state_dict(DP2, rank, 4)
    mdc.save(sd4, str(d4), sharded_strategy=wrapper)
    from megatron.core.dist_checkpointing.mapping import is_main_replica

    mine = sorted(
        k for k, sh in sd4.items() if hasattr(sh, "replica_id") and is_main_replica(sh.replica_id)
    )  # what the wrapper gave this rank to send
    main: list[Any] = [None] * world
    torch.distributed.all_gather_object(main, mine)
    result["dp2_main"] = main
    if rank == 1:
        import ckptd.torch._storage as storage

        def die(*a: Any, **k: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)

        storage.StorageWriter.write_data = die  # type: ignore[method-assign]
    try:  # through the registry this time
        mdc.save(sharded_state_dict(layout, rank, 5), str(d5), sharded_strategy=("ckptd", 1))
        result["killed_save"] = "returned"
    except BaseException as e:  # the ckptd error, DCP's CheckpointException or gloo's
        result["killed_save"] = f"{type(e).__name__}: {e}"[:300]
    result["killed_files"] = sorted(f.name for f in d5.iterdir())


def load(
    mdc: Any,
    root: Path,
    layout: tuple[int, int, int],
    saved: tuple[int, int, int] | None,
    result: dict[str, Any],
) -> None:
    """Iterations 1, 2 and 4 in `layout` with no strategy named (the registry, from metadata.json),
    load_plain_tensors and load_sharded_metadata of iteration 1."""
    d1, d2 = str(root / "iter_0000001"), str(root / "iter_0000002")
    loaded = mdc.load(sharded_state_dict(layout, 0, None, saved), d1)
    result["bad"] = compare(layout, 0, loaded, 1, saved)
    loaded2 = mdc.load(sharded_state_dict(layout, 0, None, saved), d2)
    result["bad2"] = compare(layout, 0, loaded2, 2, saved)
    plain = mdc.load_plain_tensors(d1)
    full = global_tensors(1)
    result["plain_bad"] = sorted(k for k, v in full.items() if not torch.equal(plain[k], v))
    loaded4 = mdc.load(sharded_state_dict(layout, 0, None, DP2), str(root / "iter_0000004"))
    result["bad4"] = compare(layout, 0, loaded4, 4, DP2)
    result["metadata"] = sorted(mdc.serialization.load_sharded_metadata(d1))
    # The GPTModel saved at TP=2, loaded into a TP=1 model of another seed, against a TP=1 model
    # of the saving seed.
    gpt = build_gpt(1, 99)
    fresh = {k: v.clone() for k, v in gpt.state_dict().items() if isinstance(v, torch.Tensor)}
    gpt.load_state_dict(mdc.load(gpt.sharded_state_dict(), str(root / "iter_0000003")))
    got = gpt.state_dict()
    reference = {
        k: v for k, v in build_gpt(1, 1234).state_dict().items() if isinstance(v, torch.Tensor)
    }
    result["gpt_tensors"] = len(reference)
    result["gpt_bad"] = sorted(k for k, v in reference.items() if not torch.equal(got[k], v))
    result["gpt_differed"] = sum(not torch.equal(fresh[k], v) for k, v in reference.items())
    # The resume after the killed save: iteration 5 saved again into its directory (the daemon
    # still holds the killed attempt), then loaded.
    import ckptd.megatron as ckm

    d5 = str(root / "iter_0000005")
    mdc.save(sharded_state_dict(layout, 0, 5), d5, sharded_strategy=ckm.save_strategy())
    result["bad5"] = compare(layout, 0, mdc.load(sharded_state_dict(layout, 0, None), d5), 5)


def async_save(mdc: Any, sd: dict[str, Any], path: str) -> dict[str, Any]:
    """dist_checkpointing.save(..., async_sharded_save=True) scheduled on Megatron's own
    AsyncCallsQueue (its async_fn in a forked process, then the finalize functions).

    The queue needs CUDA for two things only: torch.cuda.synchronize() before it forks, and the
    device of the tensors it all_reduces to agree that every rank is done. Here (no GPU) those
    two torch.cuda functions are pointed at the CPU for the duration; Megatron is not changed."""
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    import ckptd.megatron as ckm

    out: dict[str, Any] = {}
    sync, device = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    try:
        request = mdc.save(sd, path, sharded_strategy=ckm.save_strategy(), async_sharded_save=True)
        out["metadata_before_finalize"] = os.path.exists(os.path.join(path, "metadata.json"))
        for sh in sd.values():  # staged: the tensors may change now
            if hasattr(sh, "data") and isinstance(sh.data, torch.Tensor):
                sh.data.fill_(0)
        queue = AsyncCallsQueue()
        queue.schedule_async_request(request)
        out["finalized"] = queue.maybe_finalize_async_calls(blocking=True)
        queue.close()
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = sync, device  # type: ignore[assignment]
    out["metadata_after_finalize"] = os.path.exists(os.path.join(path, "metadata.json"))
    return out


def faults(mdc: Any, ckm: Any, root: Path, layout: tuple[int, int, int]) -> dict[str, Any]:
    """Each failure's exception (type and message), or what the call returned. The strategies
    are given the faults daemon's socket (CKPTD_FAULTS_SOCKET) explicitly."""
    import ckptd

    sock = os.environ["CKPTD_FAULTS_SOCKET"]
    out: dict[str, Any] = {}

    def attempt(name: str, fn: Any) -> None:
        try:
            out[name] = f"returned {type(fn()).__name__}"
        except BaseException as e:
            out[name] = f"{type(e).__name__}: {e}"[:400]
            if hasattr(e, "failures"):  # DCP's CheckpointException: what each rank raised
                out[f"{name}_failures"] = str(e)[-1500:]

    def save(d: Path, fill: int) -> None:
        d.mkdir(parents=True)
        strategy = ckm.save_strategy(socket=sock)
        mdc.save(sharded_state_dict(layout, 0, fill), str(d), sharded_strategy=strategy)

    def load(d: Path) -> Any:
        strategy = ckm.load_strategy(socket=sock)
        return mdc.load(sharded_state_dict(layout, 0, None), str(d), sharded_strategy=strategy)

    # A directory saved twice: the second save replaces the first (as torch_dist overwrites).
    again = root / "iter_0000009"
    save(again, 9)
    strategy = ckm.save_strategy(socket=sock)
    mdc.save(sharded_state_dict(layout, 0, 10), str(again), sharded_strategy=strategy)
    out["overwrite_bad"] = compare(layout, 0, load(again), 10)
    attempt("no_dir", lambda: load(root / "iter_0000404"))
    (root / "iter_0000005").mkdir(parents=True)
    attempt("no_metadata", lambda: load(root / "iter_0000005"))
    # Saved, then deleted from ckptd: the directory is whole, its data is gone.
    gone = root / "iter_0000006"
    save(gone, 6)
    link = json.loads((gone / ckm.LINK_FILE).read_text())
    ckptd.connect(sock).delete(link["ckptd_job"], link["step"])
    attempt("gone", lambda: load(gone))
    # Corrupt: every blob of the faults daemon flipped at one byte.
    bad = root / "iter_0000007"
    save(bad, 7)
    blobs = list((Path(os.environ["CKPTD_STATE_DIR"]) / "data").rglob("*.blob"))
    for blob in blobs:
        with open(blob, "r+b") as f:
            f.seek(8)
            byte = f.read(1)
            f.seek(8)
            f.write(bytes([byte[0] ^ 0xFF]))
    out["blobs"] = len(blobs)
    attempt("corrupt", lambda: load(bad))
    os.kill(int(os.environ["CKPTD_PID"]), signal.SIGKILL)
    down = root / "iter_0000008"
    attempt("down_save", lambda: save(down, 8))
    out["down_files"] = sorted(f.name for f in down.iterdir())
    attempt("down_load", lambda: load(bad))
    return out


if __name__ == "__main__":
    main()
