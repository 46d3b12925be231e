"""README "Python and PyTorch": a client survives a daemon restart. One ckptd.Client kept across a
kill -9 and a clean stop of its daemon reconnects (a new session), maps the new instance's arena and
registers its slabs again (ckptd.empty arrays save and load in place, copying nothing); while
the daemon is down a call raises UnavailableError naming the socket."""

from __future__ import annotations

import shutil
import signal

import numpy as np
import pytest

import ckptd
from conftest import start_daemon


def test_client_survives_daemon_restarts() -> None:
    d = start_daemon()
    try:
        client = ckptd.connect(d.socket, connect_timeout_ms=1500)
        z = client.empty((64, 1024), np.float32)  # a slab registered with the daemon
        z[:] = np.arange(z.size, dtype=np.float32).reshape(z.shape)
        first = z.copy()
        plain = np.linspace(0, 1, 5000)
        client.save("py-restart", 1, {"z": z, "plain": plain}).committed().result(60)
        assert client.reconnect_count == 0

        d.proc.send_signal(signal.SIGKILL)
        d.proc.wait()
        with pytest.raises(ckptd.UnavailableError) as e:
            client.list("py-restart")
        assert d.socket in str(e.value)

        d = start_daemon(state_dir=d.state_dir)
        for step, how in ((2, "after kill -9"), (3, "after SIGTERM")):
            z *= 2
            ckptd.reset_copy_stats()
            client.save("py-restart", step, {"z": z, "plain": plain + step}).committed().result(60)
            assert ckptd.copy_stats()["save_bytes"] == plain.nbytes, how  # z: copied nothing
            assert client.reconnect_count == step - 1, how
            out = client.load("py-restart", step)
            np.testing.assert_array_equal(out.tensors["z"], z)
            np.testing.assert_array_equal(out.tensors["plain"], plain + step)
            back = client.empty((64, 1024), np.float32)
            client.load("py-restart", 1, {"z": back})  # saved before the first restart
            np.testing.assert_array_equal(back, first)
            if step == 2:
                d.stop()
                d = start_daemon(state_dir=d.state_dir)
        client.close()
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)
