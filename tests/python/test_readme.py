"""The README's Python example runs as written against a fresh daemon."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, Daemon

pytest.importorskip("torch")


def test_readme_python_example(daemon: Daemon, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python and PyTorch", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert blocks, "no python example in the README section"
    script = tmp_path / "example.py"
    script.write_text(blocks[0])
    env = dict(os.environ, CKPTD_SOCKET=daemon.socket)
    out = subprocess.run(
        [sys.executable, str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr
    assert "300 {'epoch': 3}" in out.stdout
