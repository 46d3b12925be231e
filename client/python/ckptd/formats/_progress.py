"""A progress line on stderr: bytes done of the total, a bar, the rate and the ETA — redrawn in
place on a terminal (\\r), a plain line every few seconds otherwise (logs, pipes), in ckptctl
watch's style: `import safetensors [#####-----] 1.2 GiB / 3.0 GiB  40%  512.0 MiB/s  ETA 4s`."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import TextIO

BAR_WIDTH = 24
TTY_REDRAW_S = 0.1  # a terminal line is redrawn at most this often
PLAIN_EVERY_S = 5.0  # a pipe gets a line this often (and the last one)

_UNITS = {
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB' (ckptctl's HumanBytes)."""
    if n < 1024:
        return f"{int(n)} B"
    v = n / 1024
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        if v < 1024:
            return f"{v:.1f} {unit}"
        v /= 1024
    return f"{v:.1f} PiB"


def duration(seconds: float) -> str:
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def parse_size(text: str) -> int:
    """'1GiB', '512MB', '4096' -> bytes (KB/MB/GB/TB powers of 1000, KiB... of 1024, as
    ckptctl's --max_file_bytes). ValueError for anything else."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).upper() if m else ""
    if m is None or (unit and unit not in _UNITS):
        raise ValueError(f"{text!r} is not a size (a number with B, KB, MB, GB, TB, KiB ... TiB)")
    return int(m.group(1)) * _UNITS[unit or "B"]


class Progress:
    """Counts bytes done against a known total and draws them. Not thread-safe: one caller."""

    def __init__(
        self,
        label: str,
        total_bytes: int,
        *,
        stream: TextIO | None = None,
        quiet: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.total_bytes = total_bytes
        self.done_bytes = 0
        self._stream = stream if stream is not None else sys.stderr
        self._quiet = quiet
        self._clock = clock
        self._start_s = clock()
        self._drawn_s: float | None = None
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._width = 0  # of the last line drawn in place

    @property
    def elapsed_s(self) -> float:
        return self._clock() - self._start_s

    def rate(self) -> float:
        """Bytes per second since the start (0 before any time has passed)."""
        elapsed = self.elapsed_s
        return self.done_bytes / elapsed if elapsed > 0 else 0.0

    def render(self) -> str:
        total = self.total_bytes
        done = min(self.done_bytes, total) if total else self.done_bytes
        filled = done * BAR_WIDTH // total if total else BAR_WIDTH
        pct = done * 100 // total if total else 100
        rate = self.rate()
        eta = duration((total - done) / rate) if rate > 0 else "-"
        bar = "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "]"
        speed = f"{human_bytes(rate)}/s" if rate > 0 else "-/s"
        return (
            f"{self.label} {bar} {human_bytes(done)} / {human_bytes(total)} {pct:3d}%"
            f"  {speed}  ETA {eta}"
        )

    def advance(self, nbytes: int) -> None:
        self.done_bytes += nbytes
        self._draw(final=False)

    def finish(self) -> None:
        """The last line (always drawn unless quiet), ending the in-place line."""
        self._draw(final=True)

    def _draw(self, final: bool) -> None:
        if self._quiet:
            return
        now = self._clock()
        every = TTY_REDRAW_S if self._tty else PLAIN_EVERY_S
        if not final and self._drawn_s is not None and now - self._drawn_s < every:
            return
        if not final and self._drawn_s is None and not self._tty and now - self._start_s < every:
            return  # a pipe: the first line after PLAIN_EVERY_S, so short runs print one line
        self._drawn_s = now
        line = self.render()
        if self._tty:
            pad = " " * max(0, self._width - len(line))
            self._stream.write("\r" + line + pad + ("\n" if final else ""))
            self._width = len(line)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()
