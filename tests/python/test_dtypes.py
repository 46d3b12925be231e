"""The one dtype table (proto/ckptd/v1/dtype_table.h) as Python sees it: the binding's
`_ckptd.DTYPES` is what `ckptd._arrays` builds its maps from, and every row agrees with what numpy,
torch and safetensors themselves say about that dtype. No daemon needed."""

from __future__ import annotations

import numpy as np
import pytest

from ckptd import _arrays, _ckptd

# The wire enum of proto/ckptd/v1/common.proto, written out independently of the table.
WIRE = {
    "float32": 1, "float64": 2, "float16": 3, "bfloat16": 4, "float8_e4m3fn": 5,
    "float8_e5m2": 6, "int8": 7, "uint8": 8, "int16": 9, "int32": 10, "int64": 11, "bool": 12,
    "uint16": 13, "uint32": 14, "uint64": 15,
}  # fmt: skip


def test_table_rows_are_the_wire_enum_in_order() -> None:
    rows = _ckptd.DTYPES
    assert [wire for _, _, wire, _, _ in rows] == list(range(1, len(rows) + 1))
    assert {name: wire for name, _, wire, _, _ in rows} == WIRE
    assert len({st for _, _, _, st, _ in rows}) == len(rows)
    for name, size, _, st, native in rows:
        assert isinstance(name, str) and isinstance(st, str) and isinstance(native, bool)
        assert size in (1, 2, 4, 8), name


def test_arrays_maps_come_from_the_table() -> None:
    assert _arrays.DTYPES is _ckptd.DTYPES
    assert _arrays.ITEMSIZE == {name: size for name, size, _, _, _ in _ckptd.DTYPES}
    for name, size, _, _, _ in _ckptd.DTYPES:
        assert _arrays.numpy_dtype(name).itemsize == size, name
    with pytest.raises(ValueError, match="not supported"):
        _arrays.dtype_name(np.complex64)


def test_numpy_agrees_with_the_table() -> None:
    for name, size, _, _, native in _ckptd.DTYPES:
        if native:
            assert np.dtype(name).itemsize == size, name
            assert _arrays.dtype_name(np.dtype(name)) == name
            assert _arrays.dtype_name(np.zeros(2, dtype=name)) == name
        else:  # numpy itself does not know it (ml_dtypes or a raw stand-in serves it)
            with pytest.raises(TypeError):
                np.dtype(name)


def test_torch_agrees_with_the_table() -> None:
    torch = pytest.importorskip("torch")
    for name, size, _, _, _ in _ckptd.DTYPES:
        tdt = _arrays.torch_dtype(name)
        assert isinstance(tdt, torch.dtype), name
        assert torch.empty(0, dtype=tdt).element_size() == size, name
        assert _arrays.dtype_name(tdt) == name
        assert _arrays.dtype_name(torch.zeros(2, dtype=tdt)) == name


def test_safetensors_agrees_with_the_table() -> None:
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    types = getattr(st_torch, "_TYPES", None)
    if not isinstance(types, dict):
        pytest.skip("this safetensors has no _TYPES map")
    for name, _, _, st, _ in _ckptd.DTYPES:
        assert types.get(st) == getattr(torch, name), (name, st)
