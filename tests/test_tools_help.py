"""Every script in tools/ answers `--help` on a machine without a GPU, torch or CuPy (this one, CI):
exit 0, no traceback. Most run on the device machine; a user reads their usage here first."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
SCRIPTS = sorted(p for p in TOOLS.glob("*.py") if "__main__" in p.read_text(encoding="utf-8"))


def test_there_are_scripts():
    assert len(SCRIPTS) > 10


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_without_a_gpu(script):
    run = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                         cwd=TOOLS.parent)
    assert run.returncode == 0 and "Traceback" not in run.stdout + run.stderr, run.stdout + run.stderr
    assert run.stdout.strip(), "no usage printed"
