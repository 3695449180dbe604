"""tools/fit_tma_time.py's fit on the CPU: coefficients recovered from times made by known ones,
the DRAM floor respected, and the tool's refusals (no GPU needed; the refit of the shipped H100
coefficients from tools/data builds the TMA kernel's configurations, so it needs ptxas)."""
from __future__ import annotations

import importlib.util
import random
import subprocess
import sys
from pathlib import Path

import pytest

from asmgemm.runtime import path_model
from asmgemm.toolchain import find_tool

TOOL = Path(__file__).resolve().parent.parent / "tools" / "fit_tma_time.py"
spec = importlib.util.spec_from_file_location("fit_tma_time", TOOL)
fit_tma_time = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fit_tma_time)


def made_by(theta, terms, dram):
    return list(fit_tma_time.predict(theta, terms, dram)[0])


def test_the_fit_recovers_the_coefficients_that_made_the_times():
    rng = random.Random(7)
    terms = [(rng.randint(1, 200), rng.randint(1, 8), rng.choice([0.125, 0.25, 0.5, 1.0, 1.5, 2.0]),
              rng.randint(10_000, 50_000_000)) for _ in range(60)]
    truth = [5e-6, 0.16e-6, 0.25e-6, 1.2e-6]
    got = fit_tma_time.fit(terms, made_by(truth, terms, 3.35e12), 3.35e12)
    assert list(got) == pytest.approx(truth, rel=1e-3)
    assert fit_tma_time.rms_log(got, terms, made_by(truth, terms, 3.35e12), 3.35e12) < 1e-4


def test_calls_on_the_dram_floor_fit_the_fixed_cost_only():
    """A call whose bytes outlast its compute says nothing about the K-tile terms: halving its
    time would be a lie the fit cannot absorb there, so the compute-bound calls still decide them."""
    terms = [(c, 1, 1.0, 1000) for c in (4, 8, 16, 32, 64, 128)] + [(2, 1, 1.0, 600_000_000)]
    truth = [5e-6, 0.2e-6, 0.2e-6, 1e-6]
    times = made_by(truth, terms, 3e12)
    assert times[-1] == pytest.approx(5e-6 + 200e-6)
    got = fit_tma_time.fit(terms, times, 3e12)
    assert got[0] == pytest.approx(5e-6, rel=1e-2) and got[1] + got[2] == pytest.approx(0.4e-6, rel=1e-2)


def test_a_file_that_is_not_timings_is_refused_with_a_message(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text('{"rows": [{"case": "gemm 4x4 nn"}]}')
    proc = subprocess.run([sys.executable, str(TOOL), str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "fit_tma_time:" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")
def test_the_shipped_h100_coefficients_are_the_fit_of_the_kept_training_seed(tmp_path):
    """path_model.H100_TMA_TIME is what the tool fits on tools/data/path_train_h100.json.gz (so a
    change to the terms' reading of a launch shows here, not as silently stale coefficients)."""
    out = tmp_path / "fit.json"
    data = TOOL.parent / "data" / "path_train_h100.json.gz"
    proc = subprocess.run([sys.executable, str(TOOL), str(data), "--json", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    import json
    got = json.loads(out.read_text())
    shipped = path_model.H100_TMA_TIME
    for name in fit_tma_time.NAMES:
        assert got[name] == pytest.approx(getattr(shipped, name), rel=5e-3), name
    assert got["loo_rms_log"] == pytest.approx(shipped.rms_log, abs=5e-4)
