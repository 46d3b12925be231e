"""numpy arrays and torch tensors as the binding sees them: (address, shape, byte strides,
itemsize) plus a ckptd dtype name. torch is never imported here unless the caller passed a
tensor (so the package works without it)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import _ckptd

try:  # bfloat16 / float8 for numpy, only where the optional package is already installed
    import ml_dtypes as _ml_dtypes  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover - depends on the environment
    _ml_dtypes = None

# The one dtype table (proto/ckptd/v1/dtype_table.h), as the binding exports it: rows of
# (name, itemsize, wire value, safetensors name, numpy_native) in wire order.
DTYPES: tuple[tuple[str, int, int, str, bool], ...] = _ckptd.DTYPES

# ckptd dtype name -> bytes per element
ITEMSIZE: dict[str, int] = {name: size for name, size, _, _, _ in DTYPES}

# The dtypes numpy itself has (np.dtype(name)); the others come from ml_dtypes when installed.
_NUMPY_NATIVE = {name for name, _, _, _, native in DTYPES if native}

# Stand-ins when numpy has no such type and ml_dtypes is missing: same-size raw integers.
_RAW_STANDIN = {
    name: np.dtype(f"uint{8 * size}") for name, size, _, _, native in DTYPES if not native
}


# torch is imported only for a caller that asked for torch tensors (as_torch=True, a torch dtype),
# and then under this lock: threads making their first such call together never see a
# half-initialized torch (AttributeError: partially initialized module 'torch').
_torch_import_lock = threading.Lock()


def torch_module() -> Any:
    """The torch module, imported on first use under a lock."""
    with _torch_import_lock:
        import torch
    return torch


def _loaded_torch(attr: str) -> Any:
    """torch.<attr> if torch is already imported, else None. Never imports torch, and tolerates a
    torch that another thread is still importing (its attributes not all set yet): an object
    cannot be a torch tensor or dtype before torch has made those classes."""
    torch = sys.modules.get("torch")
    return getattr(torch, attr, None) if torch is not None else None


def is_torch_tensor(x: object) -> bool:
    tensor = _loaded_torch("Tensor")
    return tensor is not None and isinstance(x, tensor)


def is_torch_dtype(x: object) -> bool:
    dtype = _loaded_torch("dtype")
    return dtype is not None and isinstance(x, dtype)


def is_device_tensor(x: object) -> bool:
    """A torch tensor outside CPU memory (CUDA): saved by copying it into the arena with copy_."""
    return is_torch_tensor(x) and x.device.type not in ("cpu", "meta")  # type: ignore[attr-defined]


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype for a ckptd dtype name (ml_dtypes types, else raw uint views)."""
    if name in _NUMPY_NATIVE:
        return np.dtype(name)
    if _ml_dtypes is not None and hasattr(_ml_dtypes, name):
        return np.dtype(getattr(_ml_dtypes, name))
    if name in _RAW_STANDIN:
        return np.dtype(_RAW_STANDIN[name])
    raise ValueError(f"ckptd: unknown dtype {name!r}")


def torch_dtype(name: str) -> Any:
    return getattr(torch_module(), name)


def dtype_name(x: Any) -> str:
    """ckptd's dtype name of an array, a tensor, a numpy dtype or a torch dtype."""
    if is_torch_tensor(x):
        x = x.dtype
    elif isinstance(x, np.ndarray):
        x = x.dtype
    if is_torch_dtype(x):
        name = str(x).removeprefix("torch.")
    else:
        name = np.dtype(x).name
    if name not in ITEMSIZE:
        raise ValueError(f"ckptd: dtype {name} is not supported (supported: {sorted(ITEMSIZE)})")
    return name


def view(x: Any) -> tuple[int, list[int], list[int], int]:
    """(address, shape, byte strides, itemsize) of a CPU array or tensor: how libckptd-client
    sees it (it recognises views of daemon memory by their address)."""
    if is_torch_tensor(x):
        if x.device.type != "cpu":
            raise ValueError(
                f"ckptd: tensor on {x.device}: loads and stage() take CPU tensors (save() takes "
                "GPU tensors too; load into CPU tensors and move them with .to())"
            )
        if x.is_conj() or x.is_neg():
            x = x.resolve_conj().resolve_neg()
        itemsize = x.element_size()
        return (x.data_ptr(), list(x.shape), [s * itemsize for s in x.stride()], itemsize)
    if not isinstance(x, np.ndarray):
        x = np.asarray(x)
    if not x.dtype.isnative:
        raise ValueError("ckptd: byte-swapped numpy arrays are not supported")
    return (x.__array_interface__["data"][0], list(x.shape), list(x.strides), x.itemsize)


def is_cuda_tensor(x: object) -> bool:
    return is_torch_tensor(x) and x.device.type == "cuda"  # type: ignore[attr-defined]


def cuda_view(x: Any) -> tuple[str, int, int]:
    """("cuda", device index, address) of a contiguous CUDA tensor: libckptd-client hands its
    allocation to the daemon over CUDA IPC (or copies it itself where IPC cannot be used)."""
    if not x.is_contiguous() or x.is_conj() or x.is_neg():
        raise ValueError("ckptd: a CUDA tensor saved or loaded in place must be contiguous")
    return ("cuda", int(x.device.index or 0), int(x.data_ptr()))


def nbytes(x: Any) -> int:
    if is_torch_tensor(x):
        return int(x.numel()) * int(x.element_size())
    return int(np.asarray(x).nbytes)


def shape_of(x: Any) -> list[int]:
    return [int(d) for d in x.shape]


def address(x: Any) -> int:
    if is_torch_tensor(x):
        return int(x.data_ptr())
    return int(np.asarray(x).__array_interface__["data"][0])


def view_of(buffer: Any, offset: int, shape: Sequence[int], dtype: str, as_torch: bool) -> Any:
    """A numpy array or torch tensor of `shape` over `buffer` (a writable buffer) at `offset`."""
    count = 1
    for d in shape:
        count *= int(d)
    if as_torch:
        torch = torch_module()
        tdt = torch_dtype(dtype)
        if count == 0:
            return torch.empty(tuple(shape), dtype=tdt)
        flat = torch.frombuffer(buffer, dtype=tdt, count=count, offset=offset)
        return flat.view(tuple(shape))
    arr = np.frombuffer(buffer, dtype=numpy_dtype(dtype), count=count, offset=offset)
    return arr.reshape(tuple(shape))
