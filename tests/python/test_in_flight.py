"""Several checkpoints of one job in flight, through the Python client (docs/USER_GUIDE.md
"Several checkpoints in flight"): a higher step that commits first stays latest() and what a load
of "latest" reads when a lower step commits after it."""

from __future__ import annotations

import numpy as np

import ckptd
from conftest import Daemon


def test_a_lower_step_committing_later_never_becomes_latest(daemon: Daemon) -> None:
    c = ckptd.connect(daemon.socket)
    w = {step: np.full(1024, float(step), dtype=np.float32) for step in (1, 2)}
    # Step 1 waits for its rank 1; step 2 (one rank) commits meanwhile.
    c.save("py-order", 1, {"w": ckptd.Shard(w[1][:512], [1024], ckptd.Box([0], [512]))},
           rank=0, world_size=2)  # fmt: skip
    c.save("py-order", 2, {"w": w[2]}).committed().result()
    assert c.status("py-order", 1)["state"] != "COMMITTED"
    assert c.latest("py-order") == 2
    c.save("py-order", 1, {"w": ckptd.Shard(w[1][512:], [1024], ckptd.Box([512], [512]))},
           rank=1, world_size=2).committed().result()  # fmt: skip
    assert c.latest("py-order") == 2
    got = c.load("py-order", "latest")
    assert got.step == 2
    np.testing.assert_array_equal(got.tensors["w"], w[2])
    np.testing.assert_array_equal(c.load("py-order", 1).tensors["w"], w[1])
    c.close()
