"""ckptd's exceptions: one class per canonical status code, as the binding raises them, and a real
DATA_LOSS from the daemon raised as DataLossError (not InternalError)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import ckptd
from ckptd import _errors
from conftest import Daemon, own_daemon

# absl::StatusCode value -> (class name, code name, also an instance of)
CODES: dict[int, tuple[str, str, tuple[type, ...]]] = {
    1: ("CancelledError", "CANCELLED", ()),
    2: ("UnknownError", "UNKNOWN", ()),
    3: ("InvalidArgumentError", "INVALID_ARGUMENT", (ValueError,)),
    4: ("DeadlineExceededError", "DEADLINE_EXCEEDED", (TimeoutError,)),
    5: ("NotFoundError", "NOT_FOUND", (LookupError,)),
    6: ("AlreadyExistsError", "ALREADY_EXISTS", ()),
    7: ("PermissionDeniedError", "PERMISSION_DENIED", (PermissionError,)),
    8: ("ResourceExhaustedError", "RESOURCE_EXHAUSTED", ()),
    9: ("FailedPreconditionError", "FAILED_PRECONDITION", ()),
    10: ("AbortedError", "ABORTED", ()),
    11: ("OutOfRangeError", "OUT_OF_RANGE", (ckptd.InvalidArgumentError, ValueError)),
    12: ("UnimplementedError", "UNIMPLEMENTED", (NotImplementedError,)),
    13: ("InternalError", "INTERNAL", ()),
    14: ("UnavailableError", "UNAVAILABLE", (ConnectionError,)),
    15: ("DataLossError", "DATA_LOSS", ()),
    16: ("UnauthenticatedError", "UNAUTHENTICATED", (ckptd.PermissionDeniedError,)),
}


def test_one_class_per_status_code() -> None:
    seen: set[type] = set()
    for value, (name, code, bases) in CODES.items():
        cls = _errors.error_class(value)
        assert cls.__name__ == name, value
        assert cls.code == code
        assert getattr(ckptd, name) is cls  # exported by the package
        assert issubclass(cls, ckptd.CkptdError) and cls is not ckptd.CkptdError
        for base in bases:
            assert issubclass(cls, base), (name, base)
        seen.add(cls)
        e = pickle.loads(pickle.dumps(cls("job j step 3: message")))
        assert type(e) is cls and str(e) == "job j step 3: message"
    assert len(seen) == len(CODES)  # no two codes share a class
    assert not issubclass(ckptd.DataLossError, ckptd.InternalError)
    assert _errors.error_class(99) is ckptd.UnknownError


@pytest.fixture(scope="module")
def cold_daemon() -> Iterator[Daemon]:
    """No RAM tier: every load reads the local blob."""
    with own_daemon(flags=["--ram_tier_keep_per_job=0"]) as d:
        yield d


def test_a_corrupt_blob_raises_data_loss(cold_daemon: Daemon) -> None:
    client = ckptd.connect(cold_daemon.socket)
    x = np.arange(4096, dtype=np.float32)
    client.save("py-dataloss", 1, {"x": x}).committed().result(60)
    np.testing.assert_array_equal(client.load("py-dataloss", 1).tensors["x"], x)
    blobs = list((Path(cold_daemon.state_dir) / "data").glob("py-dataloss/step-*/r00000.blob"))
    assert len(blobs) == 1
    with open(blobs[0], "r+b") as f:
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(ckptd.DataLossError) as e:
        client.load("py-dataloss", 1)
    assert e.value.code == "DATA_LOSS"
    assert "py-dataloss" in str(e.value)
    client.close()
