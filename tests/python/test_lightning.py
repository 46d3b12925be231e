"""ckptd.lightning with the real Lightning (2.6, CPU): fit, stop, resume with ckpt_path="last"
from ckptd (blocking and async CheckpointIO) and end with the weights of an uninterrupted fit;
save_top_k's retention and "last" overwritten keep one checkpoint per file; a trainer killed
mid-save resumes from the previous "last"; a missing file, a corrupt checkpoint and the daemon
down are errors (never a silent fresh start; the daemon down within a bound, never a hang)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from bounded import within

from conftest import Daemon, flip_blobs, free_port, start_daemon

torch = pytest.importorskip("torch")
pl = pytest.importorskip("lightning.pytorch")

import ckptd  # noqa: E402
import ckptd.lightning as ckl  # noqa: E402
from ckptd.torch import _ids  # noqa: E402

EPOCHS = 4


class Tiny(pl.LightningModule):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(8, 1)

    def training_step(self, batch: Any, _: int) -> Any:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=0.05)

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(1)
        x = torch.randn(32, 8, generator=g)
        data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
        return torch.utils.data.DataLoader(data, batch_size=8)


def trainer(io: Any, dirpath: str, epochs: int, **kw: Any) -> Any:
    return pl.Trainer(
        accelerator="cpu",
        max_epochs=epochs,
        plugins=[io],
        callbacks=[ckl.ModelCheckpoint(dirpath=dirpath, save_last=True), *kw.pop("callbacks", [])],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kw,
    )


def weights(model: Any) -> list[Any]:
    return [p.detach().clone() for p in model.parameters()]


@pytest.fixture(scope="module")
def reference() -> list[Any]:
    model = Tiny()
    pl.Trainer(
        accelerator="cpu",
        max_epochs=EPOCHS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    ).fit(model)
    return weights(model)


def jobs_under(client: ckptd.Client, prefix: str) -> dict[str, list[int]]:
    out = {}
    for row in client.list():
        if row["latest_committed_step"] is None:  # every checkpoint of it deleted
            continue
        path = _ids.decode_job(row["job"])
        if path.startswith(prefix + "/"):
            out[path[len(prefix) + 1 :]] = [int(r["step"]) for r in client.list(row["job"])]
    return out


@pytest.mark.parametrize("io_class", [ckl.CheckpointIO, ckl.AsyncCheckpointIO])
def test_fit_stop_resume_last(daemon: Daemon, reference: list[Any], io_class: Any) -> None:
    dirpath = f"ckptd://runs/lit-{io_class.__name__}"
    first = Tiny()
    trainer(io_class(daemon.socket), dirpath, EPOCHS // 2).fit(first)
    client = ckptd.connect(daemon.socket)
    files = jobs_under(client, dirpath[len(ckl.SCHEME) :])
    # "last" overwritten each epoch and save_top_k=1's removals: one checkpoint per file
    assert set(files) == {"last.ckpt", f"epoch={EPOCHS // 2 - 1}-step={EPOCHS // 2 * 4}.ckpt"}
    assert all(len(steps) == 1 for steps in files.values()), files

    resumed = Tiny()
    t = trainer(io_class(daemon.socket), dirpath, EPOCHS)
    t.fit(resumed, ckpt_path="last")
    assert t.ckpt_path == f"{dirpath}/last.ckpt"
    for a, b in zip(weights(resumed), reference, strict=True):
        torch.testing.assert_close(a, b)
    assert t.global_step == EPOCHS * 4


def test_missing_file_and_corrupt_checkpoint_are_errors(reference: list[Any]) -> None:
    d = start_daemon(flags=["--ram_tier_keep_per_job=0"])
    try:
        io = ckl.CheckpointIO(d.socket)
        with pytest.raises(FileNotFoundError, match=r"runs/lit-x/nothing\.ckpt"):
            trainer(io, "ckptd://runs/lit-x", 1).fit(
                Tiny(), ckpt_path="ckptd://runs/lit-x/nothing.ckpt"
            )
        trainer(ckl.CheckpointIO(d.socket), "ckptd://runs/lit-c", 1).fit(Tiny())
        job = ckl.job_of("ckptd://runs/lit-c/last.ckpt")
        flip_blobs(list(Path(d.state_dir, "data").glob(f"{job}/step-*/*.blob")))
        with pytest.raises(ckptd.DataLossError):
            trainer(ckl.CheckpointIO(d.socket), "ckptd://runs/lit-c", 2).fit(
                Tiny(), ckpt_path="last"
            )
        d.stop()
        with within(30, "a fit with the daemon down"), pytest.raises(ckptd.UnavailableError) as e:
            trainer(ckl.CheckpointIO(d.socket), "ckptd://runs/lit-d", 1).fit(Tiny())
        assert d.socket in str(e.value)
    finally:
        d.stop()
        d.remove_shm()
        shutil.rmtree(d.state_dir, ignore_errors=True)


KILLED = """
import os, signal, sys
sys.path.insert(0, {here!r})
import lightning.pytorch as pl
import ckptd.lightning as ckl
from test_lightning import Tiny, trainer

class KillMidSave(pl.Callback):
    def on_save_checkpoint(self, trainer, module, checkpoint):
        if trainer.current_epoch == 1:  # the dict is built, nothing written yet
            os.kill(os.getpid(), signal.SIGKILL)

io = ckl.AsyncCheckpointIO({sock!r})
trainer(io, "ckptd://runs/lit-kill", 3, callbacks=[KillMidSave()]).fit(Tiny())
"""


def test_killed_mid_save_resumes_from_the_previous_last(daemon: Daemon) -> None:
    script = KILLED.format(here=str(Path(__file__).parent), sock=daemon.socket)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    client = ckptd.connect(daemon.socket)
    (row,) = client.list(ckl.job_of("ckptd://runs/lit-kill/last.ckpt"))
    assert row["state"] == "COMMITTED" and row["step"] == 4  # epoch 0's, whole
    t = trainer(ckl.CheckpointIO(daemon.socket), "ckptd://runs/lit-kill", 2)
    resumed = Tiny()
    t.fit(resumed, ckpt_path="last")
    assert t.global_step == 8 and os.path.basename(str(t.ckpt_path)) == "last.ckpt"


def test_two_ddp_ranks_save_one_rank_resumes(daemon: Daemon) -> None:
    """Lightning DDP, 2 gloo processes, saves (rank 0 through CheckpointIO); 1 process resumes
    from "last" at another world size and continues the step count."""
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
        PYTHONPATH=str(Path(__file__).parent),
    )
    rig = str(Path(__file__).parent / "lightning_rig.py")
    dirpath = "ckptd://runs/lit-ddp"
    proc = subprocess.run(
        [sys.executable, rig, daemon.socket, dirpath, "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # 32 samples, batch 8, 2 ranks: 2 steps per rank in the epoch
    assert "rank 1 world 2 global_step 2" in proc.stdout, proc.stdout
    client = ckptd.connect(daemon.socket)
    (row,) = client.list(ckl.job_of(f"{dirpath}/last.ckpt"))
    assert row["state"] == "COMMITTED" and row["step"] == 2
    t = trainer(ckl.CheckpointIO(daemon.socket), dirpath, 2)
    t.fit(Tiny(), ckpt_path="last")
    assert t.global_step == 2 + 4  # resumed at 1 rank: the second epoch's 4 steps
