"""The overlapped save (save(..., blocking=False); ckptd.torch.save(..., overlap=True)): it returns
before its copy; staged() is the one point after which the tensors may change. Each safety case
runs twice: waiting for staged() before the overwrite keeps the old bytes, and the same code
without the wait, with the save held before its copy, gets the new ones — so a test (or a
library) that skipped the wait would fail. The hold is the client's one save thread kept busy, as
a previous save still copying keeps it in a real loop."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import numpy as np
import pytest

import ckptd
from conftest import Daemon


@pytest.fixture()
def client(daemon: Daemon) -> Iterator[ckptd.Client]:
    c = ckptd.connect(daemon.socket, async_saves_max=3)
    yield c
    c.close()


def hold_save_thread(client: ckptd.Client) -> threading.Event:
    """Keeps the client's one save thread busy until the returned event is set."""
    release = threading.Event()
    started = threading.Event()

    def busy() -> None:
        started.set()
        release.wait(60)

    client._save_pool.submit(busy)
    assert started.wait(10)
    return release


def save_then_overwrite(client: ckptd.Client, job: str, wait_first: bool) -> np.ndarray:
    weights = np.arange(100_000, dtype=np.float32)
    release = hold_save_thread(client)
    handle = client.save(job, 1, {"w": weights}, blocking=False)
    assert not handle.staged().done()  # returned before its copy
    if wait_first:
        threading.Timer(0.05, release.set).start()
        handle.staged().result(60)
        weights += 1  # the optimizer step
    else:
        weights += 1  # the optimizer step, too early
        release.set()
        handle.staged().result(60)
    handle.committed().result(60)
    got: np.ndarray = client.load(job, 1).tensors["w"]
    return got


def test_waiting_for_staged_keeps_the_bytes_of_the_call(client: ckptd.Client) -> None:
    got = save_then_overwrite(client, "py-overlap-wait", wait_first=True)
    np.testing.assert_array_equal(got, np.arange(100_000, dtype=np.float32))


def test_a_change_before_staged_can_reach_the_checkpoint(client: ckptd.Client) -> None:
    got = save_then_overwrite(client, "py-overlap-nowait", wait_first=False)
    np.testing.assert_array_equal(got, np.arange(100_000, dtype=np.float32) + 1)


def test_saves_in_flight_are_bounded_and_run_in_order(client: ckptd.Client) -> None:
    release = hold_save_thread(client)
    arrays = [np.full(1000, i, np.float32) for i in range(3)]
    # The held task counts as none of the saves: three fit, a fourth is refused.
    handles = [
        client.save("py-overlap-bound", i, {"w": a}, blocking=False)
        for i, a in enumerate(arrays[:2])
    ]
    handles.append(client.save("py-overlap-bound", 2, {"w": arrays[2]}, blocking=False))
    with pytest.raises(ckptd.ResourceExhaustedError, match="async_saves_max 3"):
        client.save("py-overlap-bound", 3, {"w": arrays[0]}, blocking=False)
    release.set()
    for h in handles:
        h.committed().result(60)
    for i, a in enumerate(arrays):
        np.testing.assert_array_equal(client.load("py-overlap-bound", i).tensors["w"], a)
    assert client.latest("py-overlap-bound") == 2
    # Room again once they are staged.
    client.save("py-overlap-bound", 3, {"w": arrays[0]}, blocking=False).committed().result(60)


def test_save_threads_run_niced(client: ckptd.Client) -> None:
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    seen = client._save_pool.submit(
        lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    ).result(10)
    assert seen == max(base, 10)


def test_an_overlapped_save_error_comes_from_staged(client: ckptd.Client) -> None:
    handle = client.save("bad job name!", 1, {"w": np.ones(4, np.float32)}, blocking=False)
    with pytest.raises(ckptd.InvalidArgumentError, match="job"):
        handle.staged().result(60)


def test_bad_overlap_options_are_refused(daemon: Daemon) -> None:
    with pytest.raises(ValueError, match="save_threads"):
        ckptd.connect(daemon.socket, save_thread_nice=20)


torch = pytest.importorskip("torch")


def test_torch_overlapped_save_waits_only_for_staging(daemon: Daemon) -> None:
    """ckptd.torch.save(overlap=True) right after optimizer.step(); forward and backward run while
    it stages; the next step waits for staging_completion by itself, then changes the
    parameters: the checkpoint holds the state of the save's call."""
    import ckptd.torch as ct

    os.environ["CKPTD_SOCKET"] = daemon.socket
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(16, 64)

    def forward_backward() -> None:
        opt.zero_grad()
        model(x).square().mean().backward()

    forward_backward()
    opt.step()
    want = {k: v.detach().clone() for k, v in model.state_dict().items()}
    resp = ct.save(model, opt, step=5, job="py-overlap-torch", overlap=True)
    forward_backward()  # overlaps the staging
    opt.step()  # waits for the staging first (the save's step pre-hook), then changes the state
    assert resp.staging_completion.done()
    assert not opt._optimizer_step_pre_hooks  # the hook removed itself
    assert any(not torch.equal(want[k], v) for k, v in model.state_dict().items())
    resp.upload_completion.result(60)
    fresh = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    fresh_opt = torch.optim.Adam(fresh.parameters(), lr=0.1)
    ct.load(fresh, fresh_opt, step=5, job="py-overlap-torch")
    for k, v in fresh.state_dict().items():
        torch.testing.assert_close(v, want[k], rtol=0, atol=0)
