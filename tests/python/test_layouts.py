"""ckptd.layouts: fused, padded, split and replicated tensor-parallel parameters saved as their
logical tensors and loaded at another TP size. Unit tests of the planning functions (against an
in-memory logical tensor), then a tiny Megatron-style model saved at TP=2 through a real daemon and
loaded at TP=1, 2 and 4, bit-exact against a reference sharding written independently here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ckptd
from ckptd import layouts as L
from ckptd.layouts import Fused, LayoutError, Layouts, Padded, Replicated, Split
from conftest import ROOT, Daemon

H, KV, F, V = 16, 8, 24, 1000  # hidden, GQA key/value width, SwiGLU width, vocabulary
DIVISIBLE_BY = 48  # Megatron's make_vocab_size_divisible_by: pads V to a multiple of 48 * tp

LAYOUTS = Layouts(
    {
        "embedding": Padded(0, V),
        "out_bias": Padded(0, V, split=False),
        "scale": Replicated(),
        "layers.*.attn.qkv": Fused(0, (H, H, H)),
        "layers.*.attn.gqa_qkv": Fused(0, (H, KV, KV)),
        "layers.*.mlp.fc1": Fused(0, (F, F)),
        "layers.*.mlp.fc2": Split(1),
        "layers.*.ln": Replicated(),
    }
)


def padded_rows(tp: int) -> int:
    multiple = DIVISIBLE_BY * tp
    return -(-V // multiple) * multiple


def logical_model() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(16)

    def r(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    return {
        "embedding": r(V, H),
        "out_bias": r(V),
        "scale": np.array(0.5, np.float32),
        "layers.0.attn.qkv": r(3 * H, H),  # [Q; K; V]
        "layers.0.attn.gqa_qkv": r(H + 2 * KV, H),  # [Q; K; V], K and V narrower
        "layers.0.mlp.fc1": r(2 * F, H),  # [W; V]
        "layers.0.mlp.fc2": r(H, F),
        "layers.0.ln": r(H),
    }


def megatron_shard(full: dict[str, np.ndarray], tp: int, k: int) -> dict[str, np.ndarray]:
    """TP rank k's local tensors, the way Megatron shards them: vocabulary padded with zero rows
    then split on dim 0; each sub-parameter of a fused weight split on dim 0, rank k holding its
    k-th slice of each, in order; fc2 split on dim 1; norms and scalars whole."""

    def kth(a: np.ndarray, axis: int = 0) -> np.ndarray:
        return np.split(a, tp, axis=axis)[k]

    def fused(a: np.ndarray, widths: list[int]) -> np.ndarray:
        subs = np.split(a, np.cumsum(widths)[:-1])
        return np.concatenate([kth(s) for s in subs])

    pad = padded_rows(tp)
    emb = np.concatenate([full["embedding"], np.zeros((pad - V, H), np.float32)])
    bias = np.concatenate([full["out_bias"], np.zeros(pad - V, np.float32)])
    return {
        "embedding": kth(emb),
        "out_bias": bias,
        "scale": full["scale"].copy(),
        "layers.0.attn.qkv": fused(full["layers.0.attn.qkv"], [H, H, H]),
        "layers.0.attn.gqa_qkv": fused(full["layers.0.attn.gqa_qkv"], [H, KV, KV]),
        "layers.0.mlp.fc1": fused(full["layers.0.mlp.fc1"], [F, F]),
        "layers.0.mlp.fc2": kth(full["layers.0.mlp.fc2"], axis=1),
        "layers.0.ln": full["layers.0.ln"].copy(),
    }


def assert_bit_exact(got: Any, want: np.ndarray, what: str) -> None:
    got = np.asarray(got)
    assert got.shape == want.shape and got.dtype == want.dtype, what
    assert got.tobytes() == want.tobytes(), what


def garbage_like(a: np.ndarray) -> np.ndarray:
    return np.full(a.shape, 7.0, a.dtype)  # a load must overwrite every element, padding too


# --- planning, without a daemon ------------------------------------------------------------------


def test_fused_qkv_boxes_are_the_logical_rows_and_views_of_the_local_tensor() -> None:
    local = np.arange(3 * H // 2 * H, dtype=np.float32).reshape(3 * H // 2, H)  # tp 2, rank 1
    planned = L.save_shards("qkv", local, Fused(0, (H, H, H)), tp_rank=1, tp_size=2)
    h = H // 2
    assert [(b.offsets, b.lengths) for _, _, b in planned] == [
        ([h, 0], [h, H]),  # Q_1
        ([H + h, 0], [h, H]),  # K_1
        ([2 * H + h, 0], [h, H]),  # V_1
    ]
    assert all(glob == [3 * H, H] for _, glob, _ in planned)
    for i, (view, _, _) in enumerate(planned):
        assert np.shares_memory(view, local) and view.flags.c_contiguous  # a view
        assert np.array_equal(view, local[i * h : (i + 1) * h])


def test_gqa_and_swiglu_widths() -> None:
    local = np.zeros(((H + 2 * KV) // 4, H), np.float32)
    planned = L.save_shards("gqa", local, Fused(0, (H, KV, KV)), tp_rank=3, tp_size=4)
    assert [(b.offsets[0], b.lengths[0]) for _, _, b in planned] == [
        (3 * H // 4, H // 4),
        (H + 3 * KV // 4, KV // 4),
        (H + KV + 3 * KV // 4, KV // 4),
    ]
    local = np.zeros((2 * F // 3, H), np.float32)
    planned = L.save_shards("fc1", local, Fused(0, (F, F)), tp_rank=2, tp_size=3)
    assert [(b.offsets[0], b.lengths[0]) for _, _, b in planned] == [(16, 8), (F + 16, 8)]


def test_split_on_dim_1_is_a_strided_view() -> None:
    local = np.zeros((H, F // 4), np.float32)
    [(view, glob, box)] = L.save_shards("fc2", local, Split(1), tp_rank=2, tp_size=4)
    assert glob == [H, F] and box.offsets == [0, 2 * F // 4] and box.lengths == [H, F // 4]
    assert view.base is local
    dest = np.zeros((H, 2 * F), np.float32)[:, :F]  # a non-contiguous destination
    planned = L.load_targets("w", dest, Fused(1, (F, F)), 1, 2, global_shape=[H, 2 * F])
    assert [b.offsets for b, _ in planned] == [[0, F // 2], [0, F + F // 2]]
    assert all(v.base is dest.base and v.shape == (H, F // 2) for _, v in planned)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_padded_vocabulary_with_the_tp_sizes_padding(tp: int) -> None:
    pad = padded_rows(tp)  # 1008, 1056, 1152: V is a multiple of none
    rows = pad // tp
    for k in range(tp):
        local = np.zeros((rows, H), np.float32)
        planned = L.save_shards("embedding", local, Padded(0, V), k, tp)
        kept = max(0, min(rows, V - k * rows))
        if kept == 0:
            assert planned == []
        else:
            [(view, glob, box)] = planned
            assert glob == [V, H] and box.offsets == [k * rows, 0] and box.lengths == [kept, H]
            assert view.shape == (kept, H)
        pads = L.padding_views("embedding", local, Padded(0, V), k, tp)
        assert sum(p.shape[0] for p in pads) == rows - kept
    whole = np.zeros((pad, H), np.float32)  # split=False: every TP rank reads the V rows
    [(box, _)] = L.load_targets("e", whole, Padded(0, V, split=False), tp - 1, tp)
    assert box.offsets == [0, 0] and box.lengths == [V, H]


def test_replicated_is_saved_by_tp_rank_0_and_loaded_whole_everywhere() -> None:
    local = np.ones(H, np.float32)
    assert len(L.save_shards("ln", local, Replicated(), 0, 4)) == 1
    assert L.save_shards("ln", local, Replicated(), 3, 4) == []
    [(box, view)] = L.load_targets("ln", local, Replicated(), 3, 4, global_shape=[H])
    assert box.offsets == [0] and box.lengths == [H] and np.shares_memory(view, local)
    scalar = np.array(1.0, np.float32)
    [(_, glob, box)] = L.save_shards("s", scalar, Replicated(), 0, 2)
    assert glob == [] and box.lengths == []


def simulate(full: dict[str, np.ndarray], tp_save: int, tp_load: int) -> None:
    """Save at tp_save into in-memory logical tensors, load at tp_load: every logical element is
    written exactly once, and every local tensor equals Megatron's sharding at tp_load."""
    stored = {n: np.full(a.shape, np.nan, np.float32) for n, a in full.items()}
    written = {n: np.zeros(a.shape, np.int32) for n, a in full.items()}
    for k in range(tp_save):
        for name, local in megatron_shard(full, tp_save, k).items():
            layout = LAYOUTS.resolve(name, tp_save)
            for view, glob, box in L.save_shards(name, local, layout, k, tp_save):
                assert glob == list(full[name].shape)
                index = tuple(
                    slice(o, o + n) for o, n in zip(box.offsets, box.lengths, strict=True)
                )
                stored[name][index] = view
                written[name][index] += 1
    for name in full:
        assert (written[name] == 1).all(), name
        assert_bit_exact(stored[name], full[name], name)
    for k in range(tp_load):
        for name, want in megatron_shard(full, tp_load, k).items():
            layout = LAYOUTS.resolve(name, tp_load)
            dest = garbage_like(want)
            shape = stored[name].shape
            for box, view in L.load_targets(name, dest, layout, k, tp_load, global_shape=shape):
                index = tuple(
                    slice(o, o + n) for o, n in zip(box.offsets, box.lengths, strict=True)
                )
                view[...] = stored[name][index]
            for view in L.padding_views(name, dest, layout, k, tp_load):
                view[...] = 0
            assert_bit_exact(dest, want, f"{name} tp {tp_load} rank {k}")


@pytest.mark.parametrize(("tp_save", "tp_load"), [(2, 4), (4, 2), (2, 1), (1, 4), (4, 4)])
def test_plans_reshard_between_tp_sizes(tp_save: int, tp_load: int) -> None:
    simulate(logical_model(), tp_save, tp_load)


def test_errors_name_the_item() -> None:
    with pytest.raises(LayoutError, match=r"item fc2: .*does not split evenly over .* 4"):
        L.load_targets("fc2", np.zeros((3, 4)), Split(0), 0, 4, global_shape=[10, 4])
    with pytest.raises(LayoutError, match=r"item gqa: .*\[8, 8\] do not divide by .* 16"):
        L.save_shards("gqa", np.zeros((2, H)), Fused(0, (H, KV, KV)), 0, 16)
    with pytest.raises(LayoutError, match=r"item qkv: .* wants 24 along dim 0"):
        L.save_shards("qkv", np.zeros((16, H)), Fused(0, (H, H, H)), 0, 2)
    with pytest.raises(LayoutError, match=r"item emb: .* holds 992 rows .* fewer than the 1000"):
        L.load_targets("emb", np.zeros((248, H)), Padded(0, V), 0, 4)
    with pytest.raises(LayoutError, match=r"item emb: the checkpoint holds logical shape"):
        L.load_targets("emb", np.zeros((256, H)), Padded(0, V), 0, 4, global_shape=[999, H])
    with pytest.raises(LayoutError, match=r"item w: no layout declared for it .* size 2"):
        LAYOUTS.resolve("w", 2)
    assert LAYOUTS.resolve("w", 1) is None  # whole at TP size 1
    with pytest.raises(LayoutError, match="tp_rank 2 is not in"):
        L.save_shards("w", np.zeros(4), Split(0), 2, 2)
    with pytest.raises(LayoutError, match="dim"):
        L.save_shards("w", np.zeros(4), Split(1), 0, 2)
    for bad in (lambda: Fused(0, ()), lambda: Split(-1), lambda: Padded(0, 0), lambda: Split(True)):
        with pytest.raises(LayoutError):
            bad()


def test_declared_layout_must_keep_the_recorded_meaning() -> None:
    qkv = Fused(0, (H, H, H))
    L.check_compatible("qkv", qkv, Fused(0, (H, H, H)))
    L.check_compatible("qkv", None, Split(0))  # saved whole at TP size 1: any layout
    L.check_compatible("ln", Replicated(), Split(0))  # distribution only
    L.check_compatible("emb", Padded(0, V, split=False), Padded(0, V))
    L.check_compatible("emb", Padded(0, V), Split(0))  # shapes are checked against the catalog
    L.check_compatible("qkv", qkv, None)  # whole at TP size 1 is the logical [Q; K; V]
    for declared in (Fused(0, (H, KV, KV)), Split(0), Replicated()):
        with pytest.raises(LayoutError, match=r"item qkv: declared .* saved as Fused\(dim=0"):
            L.check_compatible("qkv", qkv, declared)
    with pytest.raises(LayoutError, match=r"item emb: declared Padded\(dim=0, logical=999"):
        L.check_compatible("emb", Padded(0, V), Padded(0, 999))


def test_layouts_exact_names_first_then_the_first_matching_pattern() -> None:
    ls = Layouts({"a.*": Split(0), "a.b": Replicated(), "a.b*": Split(1)})
    assert ls.find("a.b") == Replicated()
    assert ls.find("a.bc") == Split(0)  # "a.*" was declared first
    assert ls.find("A.b") is None  # case-sensitive
    assert ls.add("x", Split(1)).find("x") == Split(1)
    assert Fused(0, [1, 2]) == Fused(0, (1, 2)) and hash(Fused(0, [1, 2]))


def test_record_round_trip_and_hostile_records() -> None:
    resolved = {"embedding": Padded(0, V), "w": None}
    record = L.parse_record(L.record_json(LAYOUTS, resolved, 2))
    assert record.tp_size == 2 and record.items == resolved
    assert record.layout_of("layers.7.attn.qkv") == (True, Fused(0, (H, H, H)))  # by the rules
    assert record.layout_of("nowhere") == (False, None)
    good = json.loads(L.record_json(LAYOUTS, resolved, 2))
    hostile = [
        (b"{not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[]", "not a ckptd.layouts record"),
        ({**good, "version": 2}, "version 2"),
        ({**good, "tp_size": 0}, "tp_size 0"),
        ({**good, "items": []}, "'items' must be an object"),
        ({**good, "items": {"w": {"kind": "diagonal"}}}, "unknown layout kind 'diagonal'"),
        ({**good, "items": {"w": "split"}}, "an object with a 'kind'"),
        ({**good, "items": {"w": {"kind": "split", "dim": "0"}}}, "dim must be an int"),
        ({**good, "items": {"w": {"kind": "split"}}}, "split takes the fields"),
        ({**good, "items": {"w": {"kind": "fused", "dim": 0, "parts": 3}}}, "parts must be"),
        ({**good, "items": {"w": {"kind": "fused", "dim": 0, "parts": ["a"]}}}, "parts must be"),
        ({**good, "rules": [["x"]]}, "a rule is"),
        ({**good, "rules": [["x", {"kind": "tiled"}]]}, "unknown layout kind 'tiled'"),
    ]
    for doc, message in hostile:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        with pytest.raises(LayoutError, match=re.escape(message)):
            L.parse_record(data, "rec")


# --- against a daemon ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(daemon: Daemon) -> ckptd.Client:
    return ckptd.connect(daemon.socket)


@pytest.fixture(scope="module")
def saved_tp2(client: ckptd.Client) -> dict[str, np.ndarray]:
    """The model saved at TP=2 by ranks 0 and 1 (job layouts-tp2, step 1); its logical tensors."""
    full = logical_model()
    for k in range(2):
        h = L.save_tp(
            client,
            "layouts-tp2",
            1,
            megatron_shard(full, 2, k),
            LAYOUTS,
            k,
            2,
            rank=k,
            world_size=2,
        )
    h.committed().result()
    return full


@pytest.mark.parametrize("tp", [4, 1, 2])
def test_save_at_tp2_load_at_any_tp_is_bit_exact(
    client: ckptd.Client, saved_tp2: dict[str, np.ndarray], tp: int
) -> None:
    for k in range(tp):
        want = megatron_shard(saved_tp2, tp, k)
        dest = {name: garbage_like(a) for name, a in want.items()}
        L.load_tp(client, "layouts-tp2", 1, dest, LAYOUTS, k, tp)
        for name, a in want.items():
            assert_bit_exact(dest[name], a, f"{name} at tp {tp} rank {k}")


def test_the_checkpoint_holds_the_logical_tensors(
    client: ckptd.Client, saved_tp2: dict[str, np.ndarray]
) -> None:
    out = client.load("layouts-tp2", 1, items=list(saved_tp2))  # no layouts: whole items
    for name, a in saved_tp2.items():
        assert_bit_exact(out.tensors[name], a, name)  # qkv is [Q; K; V], embedding V rows
    qkv = {"layers.0.attn.qkv": garbage_like(saved_tp2["layers.0.attn.qkv"])}
    L.load_tp(client, "layouts-tp2", 1, qkv, Layouts(), 0, 1)  # undeclared at TP 1: whole
    assert_bit_exact(qkv["layers.0.attn.qkv"], saved_tp2["layers.0.attn.qkv"], "qkv")
    recorded = json.loads(client.load_object("layouts-tp2", 1, L.LAYOUTS_ITEM, raw=True))
    assert recorded["tp_size"] == 2 and recorded["items"]["scale"] == {"kind": "replicated"}


def test_load_into_torch_tensors(client: ckptd.Client, saved_tp2: dict[str, np.ndarray]) -> None:
    torch = pytest.importorskip("torch")
    want = megatron_shard(saved_tp2, 4, 1)
    dest = {name: torch.full(a.shape, 7.0) for name, a in want.items()}
    dest["layers.0.mlp.fc2"] = torch.full((F // 4, H), 7.0).t()  # non-contiguous destination
    L.load_tp(client, "layouts-tp2", "latest", dest, LAYOUTS, 1, 4)
    for name, a in want.items():
        assert_bit_exact(dest[name].contiguous().numpy(), a, name)


def test_load_refuses_a_changed_meaning_before_reading(
    client: ckptd.Client, saved_tp2: dict[str, np.ndarray]
) -> None:
    local = megatron_shard(saved_tp2, 2, 0)
    cases = [
        ("layers.*.attn.qkv", Fused(0, (H, 2 * H)), r"item layers.0.attn.qkv: declared Fused"),
        ("layers.*.attn.qkv", Split(0), r"item layers.0.attn.qkv: declared Split\(dim=0\)"),
        ("embedding", Padded(0, 992), r"item embedding: declared Padded\(dim=0, logical=992"),
    ]
    for key, layout, message in cases:
        changed = Layouts({**dict(LAYOUTS.rules()), key: layout})
        dest = {name: garbage_like(a) for name, a in local.items()}
        with pytest.raises(LayoutError, match=message):
            L.load_tp(client, "layouts-tp2", 1, dest, changed, 0, 2)
        assert all((d == 7.0).all() for d in dest.values())  # nothing was read
    with pytest.raises(
        LayoutError, match=r"job layouts-tp2 step 1: item extra: no layout declared"
    ):
        L.load_tp(client, "layouts-tp2", 1, {"extra": np.zeros(4)}, LAYOUTS, 0, 2)
    with pytest.raises(LayoutError, match=r"holds float32, the local tensor is float64"):
        L.load_tp(client, "layouts-tp2", 1, {"layers.0.ln": np.zeros(H)}, LAYOUTS, 0, 2)


def test_save_refuses_undeclared_items_at_tp_above_1(client: ckptd.Client) -> None:
    with pytest.raises(
        LayoutError, match=r"job layouts-stray step 1 rank 0: item stray.weight: no layout"
    ):
        L.save_tp(client, "layouts-stray", 1, {"stray.weight": np.zeros(4)}, LAYOUTS, 0, 2)
    assert client.list("layouts-stray") == []  # refused before anything was saved


def test_hostile_records_and_a_missing_record(client: ckptd.Client) -> None:
    w = np.arange(8, dtype=np.float32)
    records = {
        1: b"{not json",
        2: json.dumps(
            {
                "format": "ckptd.layouts",
                "version": 1,
                "tp_size": 2,
                "items": {"w": {"kind": "diagonal"}},
                "rules": [],
            }
        ).encode(),
    }
    for step, data in records.items():
        h = client.save("layouts-bad", step, {"w": w}, {L.LAYOUTS_ITEM: ckptd.Raw(data)})
        h.committed().result()
    client.save("layouts-bad", 3, {"w": w}).committed().result()
    dest = {"w": np.zeros(8, np.float32)}
    ls = Layouts({"w": Split(0)})
    with pytest.raises(
        LayoutError, match=r"job layouts-bad step 1: object ckptd.layouts: not JSON"
    ):
        L.load_tp(client, "layouts-bad", 1, dest, ls, 0, 1)
    with pytest.raises(LayoutError, match=r"step 2: .*unknown layout kind 'diagonal'"):
        L.load_tp(client, "layouts-bad", 2, dest, ls, 0, 1)
    with pytest.raises(LayoutError, match=r"step 3: no ckptd.layouts object"):
        L.load_tp(client, "layouts-bad", 3, dest, ls, 0, 1)
    L.load_tp(client, "layouts-bad", 3, dest, ls, 0, 1, require_record=False)
    assert_bit_exact(dest["w"], w, "w")
    half = {"w": np.zeros(4, np.float32)}
    L.load_tp(client, "layouts-bad", 3, half, ls, 1, 2, require_record=False)
    assert_bit_exact(half["w"], w[4:], "w")


def test_save_takes_a_list_of_shards_per_item(client: ckptd.Client) -> None:
    a = np.arange(12, dtype=np.int32).reshape(6, 2)

    def rows(start: int) -> ckptd.Shard:
        return ckptd.Shard(a[start : start + 2], [6, 2], ckptd.Box([start, 0], [2, 2]))

    client.save("layouts-list", 1, {"a": [rows(0), rows(4)]}, rank=0, world_size=2)
    h = client.save("layouts-list", 1, {"a": [rows(2)]}, rank=1, world_size=2)
    h.committed().result()
    assert_bit_exact(client.load("layouts-list", 1).tensors["a"], a, "a")
    with pytest.raises(TypeError, match="item a: a list of regions holds Shards, not ndarray"):
        client.save("layouts-list", 2, {"a": [a]})


def test_readme_example(daemon: Daemon, tmp_path: Path) -> None:
    readme = (ROOT / "docs" / "USER_GUIDE.md").read_text()
    section = readme.split("### Tensor-parallel layouts", 1)[1]
    [block] = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)[:1]
    (tmp_path / "example.py").write_text(block)
    env = dict(os.environ, CKPTD_SOCKET=daemon.socket)
    out = subprocess.run(
        [sys.executable, "example.py"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
