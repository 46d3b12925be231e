"""Lightning DDP on CPU (gloo, 2 processes: Lightning starts rank 1 by running this file again)
fitting test_lightning's Tiny model with ckptd's AsyncCheckpointIO; argv: socket, dirpath,
epochs."""

from __future__ import annotations

import sys

from test_lightning import Tiny, trainer

import ckptd.lightning as ckl

if __name__ == "__main__":
    sock, dirpath, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    t = trainer(ckl.AsyncCheckpointIO(sock), dirpath, epochs, devices=2, strategy="ddp")
    t.fit(Tiny())
    print(f"rank {t.global_rank} world {t.world_size} global_step {t.global_step}", flush=True)
