"""Golden PTX for small examples: the emitted text is meant to be stable (deterministic, readable).

A difference is either a regression or a deliberate change of the emitter. To accept a deliberate
change, regenerate and review the diff before committing:

    ASMGEMM_REGEN_GOLDEN=1 python3 -m pytest -q tests/test_emit_golden.py && git diff tests/golden
"""
import os
from pathlib import Path

import pytest

from asmgemm.pipeline import BuildOptions, build_file

GOLDEN = Path(__file__).parent / "golden" / "ptx"
SOURCES = sorted(p for p in GOLDEN.iterdir() if p.suffix in (".sasm", ".ptx") and ".expected" not in p.name)
CASES = [(src, trace) for src in SOURCES for trace in ("none", "comments")]


def _expected_path(src: Path, trace: str) -> Path:
    return src.with_name(f"{src.stem}.{trace}.expected.ptx")


@pytest.mark.parametrize("src, trace", CASES, ids=[f"{s.name}-{t}" for s, t in CASES])
def test_golden_ptx(src: Path, trace: str):
    # The golden files record the path relative to the tests folder, so they match on any machine.
    rel = src.relative_to(Path(__file__).parent)
    cwd = os.getcwd()
    os.chdir(Path(__file__).parent)
    try:
        ptx = build_file(str(rel), BuildOptions(trace=trace)).ptx
    finally:
        os.chdir(cwd)
    expected = _expected_path(src, trace)
    if os.environ.get("ASMGEMM_REGEN_GOLDEN"):
        expected.write_text(ptx)
    assert expected.exists(), f"no golden file {expected.name}: run with ASMGEMM_REGEN_GOLDEN=1 and review it"
    assert ptx == expected.read_text(), f"{src.name} ({trace}) differs from {expected.name}"


def test_golden_examples_exist():
    assert len(SOURCES) >= 3
