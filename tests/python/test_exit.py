"""A process exits cleanly while its threads are inside ckptd calls, and with live clients,
sessions and buffers: the exit status is the program's, never SIGABRT ("terminate called without
an active exception": a thread finishing a native call while Python finalizes used to be ended
by pthread_exit inside the binding's GIL guard)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import Daemon

# Daemon threads that keep calling into the client (each call releases the GIL) while the main
# thread returns: some call always finishes during interpreter shutdown. Also left alive: a
# session with an outstanding arena buffer and a registered shm slab, on another client. An
# atexit handler registered before ckptd was imported (so it runs after the binding's own hook)
# still calls the client from the exiting thread.
PROGRAM = textwrap.dedent(
    """
    import atexit, sys, threading, time
    atexit.register(lambda: print("at exit", idle.latest("exit.probe"), flush=True))
    import numpy as np
    import ckptd

    sock, seed = sys.argv[1], int(sys.argv[2])
    busy = ckptd.connect(sock)
    idle = ckptd.connect(sock)
    kept = [idle.stage([np.arange(1024, dtype=np.float32)]), idle.empty(256)]

    def spin(i):
        while True:
            if i % 2:
                busy.latest("exit.probe")
            else:
                busy.list()

    for i in range(4):
        threading.Thread(target=spin, args=(i,), daemon=True).start()
    time.sleep(0.002 * (seed % 20))
    print("done", flush=True)
    """
)

RUNS = 12


def test_exit_with_threads_in_native_calls_is_clean(daemon: Daemon) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROGRAM, daemon.socket, str(i)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(RUNS)
    ]
    failures = []
    for i, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        if p.returncode != 0 or out.split() != ["done", "at", "exit", "None"]:
            failures.append((i, p.returncode, err[-500:]))
    assert not failures, failures
