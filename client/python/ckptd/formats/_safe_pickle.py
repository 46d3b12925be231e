"""A pickle reader that resolves only allowlisted globals: what a trusted writer's pickle of plain
data holds. Anything else (os.system, builtins.eval, a class with a code-running __reduce__) is
refused in find_class, before it is imported or called."""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping
from typing import Any

from ._common import RefusedInputError

# Plain values: containers and scalars need no globals at all (pickle has opcodes for them).
PLAIN: dict[str, frozenset[str]] = {
    "builtins": frozenset({"set", "frozenset", "complex", "slice", "range", "bytearray"}),
    "collections": frozenset({"OrderedDict"}),
    "torch": frozenset({"Size"}),
}


def _torch_constants() -> dict[str, Any]:
    """torch.float32, torch.strided, torch.contiguous_format, ...: from the module's own dict, so
    a name in a pickle never reaches torch's lazy-import __getattr__."""
    import torch

    kinds = torch.dtype | torch.layout | torch.memory_format
    return {n: v for n, v in vars(torch).items() if isinstance(v, kinds)}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles only `allowed` globals (module -> names) plus torch's dtype/layout/memory-format
    constants; RefusedInputError naming `path` for anything else."""

    def __init__(
        self, file: io.BufferedIOBase, path: str, allowed: Mapping[str, frozenset[str]]
    ) -> None:
        super().__init__(file)
        self._path = path
        self._allowed = allowed
        self._torch = _torch_constants()

    def find_class(self, module: str, name: str) -> Any:
        if name in self._allowed.get(module, ()):
            return super().find_class(module, name)
        if module == "torch" and name in self._torch:
            return self._torch[name]
        raise RefusedInputError(
            self._path, f"the pickle names {module}.{name}, which is not allowed: refused unread"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedInputError(self._path, "the pickle holds a persistent id: refused")


def loads_plain(data: bytes, path: str) -> Any:
    """A pickle of plain values (scalars, strings, containers, torch dtypes and sizes)."""
    return RestrictedUnpickler(io.BytesIO(data), path, PLAIN).load()
