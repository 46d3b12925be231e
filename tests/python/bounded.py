"""within(): a bound on a block of an in-process test, so that a hang fails the test instead of
holding `make test` (pytest-timeout is not a dependency)."""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
from collections.abc import Iterator
from typing import Any

BACKSTOP_S = 30  # after the alarm: a block stuck in native code without returning to Python


@contextlib.contextmanager
def within(seconds: float, what: str) -> Iterator[None]:
    """Raises TimeoutError in the block once it has run `seconds` (SIGALRM, main thread only).
    A block stuck in native code never sees that exception: BACKSTOP_S later, faulthandler prints
    every thread's stack and ends the process, a failure rather than a hang."""

    def fire(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what}: still running after {seconds} s (a hang)")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + BACKSTOP_S, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
