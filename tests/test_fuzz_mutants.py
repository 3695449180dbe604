"""Mutants of real sources through the command line: the shipped kernels, a spec-only test kernel
and plain PTX from the corpus, with lines and tokens dropped, duplicated and swapped, and random
bytes spliced in. For every mutant `asmgemm build MUTANT -o OUT.ptx [--cubin OUT.cubin]` must

  * exit 0 and write complete outputs (the PTX file equals what the build produced), or
  * exit 1 with a located error (`FILE:LINE:COL: error:` and a caret line), write no file at all,
    print no traceback and no "internal error";
  * and finish within a bound (a hang guard, not a speed test).

The number of mutants per run is the sum of max_examples below (about 430); `pytest
--hypothesis-show-statistics tests/test_fuzz_mutants.py` prints how many each test ran.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from asmgemm.toolchain import find_tool

ROOT = Path(__file__).resolve().parent.parent
SMALL = [ROOT / "kernels_ptx" / "sgemm_naive.sasm", ROOT / "tests" / "data" / "tiny_gemm" / "tiny_dgemm.sasm",
         ROOT / "tests" / "golden" / "ptx" / "macros_and_loops.sasm",
         ROOT / "tests" / "corpus" / "ptx" / "reduce_shfl.ptx", ROOT / "tests" / "corpus" / "ptx" / "device_call.ptx"]
LARGE = [ROOT / "kernels_ptx" / "sgemm.sasm", ROOT / "tests" / "corpus" / "ptx" / "wgmma_sm90a.ptx"]
SOURCES = {p.name: p.read_bytes() for p in SMALL + LARGE}
TIME_BOUND_S = 60.0
LOCATED = re.compile(r"^[^\n]+:\d+:\d+: error: ", re.MULTILINE)
HAVE_PTXAS = find_tool("ptxas", required=False) is not None


def _lines(data: bytes) -> list[bytes]:
    return data.split(b"\n")


def _tokens(data: bytes) -> list[bytes]:
    return re.split(rb"(\s+)", data)


@st.composite
def mutants(draw, names):
    """(file name, mutated bytes, what was done)."""
    name = draw(st.sampled_from(names))
    data = SOURCES[name]
    how = draw(st.sampled_from(["drop line", "duplicate line", "swap lines", "drop token", "duplicate token",
                                "swap tokens", "random bytes"]))
    if how == "random bytes":
        at = draw(st.integers(0, len(data)))
        junk = draw(st.binary(min_size=1, max_size=12))
        return name, data[:at] + junk + data[at:], how
    parts = _lines(data) if how.endswith(("line", "lines")) else _tokens(data)
    sep = b"\n" if how.endswith(("line", "lines")) else b""
    i = draw(st.integers(0, len(parts) - 1))
    if how.startswith("drop"):
        parts = parts[:i] + parts[i + 1:]
    elif how.startswith("duplicate"):
        parts = parts[:i + 1] + [parts[i]] + parts[i + 1:]
    else:
        j = draw(st.integers(0, len(parts) - 1))
        parts = list(parts)
        parts[i], parts[j] = parts[j], parts[i]
    return name, sep.join(parts), how


def _check(run_cli, tmp_path_factory, mutant, with_cubin: bool):
    name, data, how = mutant
    work = tmp_path_factory.mktemp("mutant")
    src = work / name
    src.write_bytes(data)
    out_dir = work / "out"
    out_dir.mkdir()
    args = ["build", str(src), "-o", str(out_dir / "k.ptx")]
    if with_cubin:
        args += ["--cubin", str(out_dir / "k.cubin")]
    t0 = time.perf_counter()
    code, out, err = run_cli(*args)
    elapsed = time.perf_counter() - t0
    what = f"{name} ({how}): exit {code}\n{err[-2000:]}"
    assert elapsed < TIME_BOUND_S, f"took {elapsed:.0f} s: {what}"
    assert "Traceback" not in err and "internal error" not in err, what
    written = sorted(p.name for p in out_dir.iterdir())
    if code == 0:
        assert written == (["k.cubin", "k.ptx"] if with_cubin else ["k.ptx"]), what
        ptx = (out_dir / "k.ptx").read_text()
        assert ptx.startswith("//") and ptx.endswith("\n"), what
        if with_cubin:
            assert (out_dir / "k.cubin").read_bytes()[:4] == b"\x7fELF", what
    else:
        assert code == 1, what
        assert written == [], f"a failed build wrote {written}: {what}"
        assert LOCATED.search(err), f"error without FILE:LINE:COL: {what}"
        assert "\n    " in err and "^" in err, f"error without the source line and caret: {what}"


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                       HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@FAST
@given(mutants([p.name for p in SMALL]))
def test_mutants_of_small_sources_build_or_fail_located(run_cli, tmp_path_factory, mutant):
    _check(run_cli, tmp_path_factory, mutant, with_cubin=False)


@pytest.mark.slow
@SLOW
@given(mutants([p.name for p in LARGE]))
def test_mutants_of_the_sgemm_and_wgmma_sources_build_or_fail_located(run_cli, tmp_path_factory, mutant):
    _check(run_cli, tmp_path_factory, mutant, with_cubin=False)


@pytest.mark.slow
@pytest.mark.toolchain
@pytest.mark.skipif(not HAVE_PTXAS, reason="ptxas not installed")
@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(mutants([p.name for p in SMALL]))
def test_mutants_through_ptxas_build_or_fail_located(run_cli, tmp_path_factory, mutant):
    """With --cubin, ptxas sees what the front end let through: its complaints must come back
    located too, and no PTX may be left behind when the cubin could not be made."""
    _check(run_cli, tmp_path_factory, mutant, with_cubin=True)
