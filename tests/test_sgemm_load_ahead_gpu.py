"""LOAD_AHEAD=1 (tile t+2's global loads issued during tile t and held in registers across the
barrier) on the GPU against a float64 reference. Its K bookkeeping differs from the default
schedule (one staged tile before the loop, a drain pass after it), so K sweeps every case around
the tile edges: K < BK, a partial second tile, exactly two tiles (drain only), one loop pass, and
a loop followed by a partial tile; all layouts, scalar-load paths, alpha/beta. Skipped without a GPU."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402

REL_TOL = 2e-5
AHEAD_VARIANTS = [{"THREADS": 256, "RQ": 2, "BK": 8, "LOAD_AHEAD": 1, "LDG_NC": 0},
                  {"THREADS": 256, "RQ": 4, "BK": 8, "LOAD_AHEAD": 1, "LDG_NC": 0},
                  {"THREADS": 256, "RQ": 4, "BK": 8, "LOAD_AHEAD": 1, "LDG_NC": 1},
                  {"THREADS": 64, "RQ": 2, "BK": 8, "LOAD_AHEAD": 1, "LDG_NC": 0},
                  {"THREADS": 256, "RQ": 4, "BK": 16, "LOAD_AHEAD": 1, "LDG_NC": 0}]
# BK=8: 1..7 one guarded tile; 9..15 a partial second tile; 16 drain only; 17..23 drain + partial;
# 24 one loop pass + drain; 25.. loop passes, drain, partial tile.
# BK=16: the same edges at 16, 32, 48.
K_SWEEP = [1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 31, 32, 33, 40, 41, 47, 48, 49, 57, 64, 65, 100]


def _vid(v):
    return "t{THREADS}-rq{RQ}-bk{BK}-nc{LDG_NC}".format(**v)


def _check(m, n, k, layout, params, alpha=1.0, beta=0.0, pad=(0, 0), seed=0):
    rng = cp.random.default_rng(seed + 1000 * m + 10 * n + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    sa = (k, m) if ta else (m, k)
    sb = (n, k) if tb else (k, n)
    # pad > 0: a column-offset view with an odd leading dimension (the scalar-load paths)
    a = rng.standard_normal((sa[0], sa[1] + pad[0]), dtype=cp.float32)[:, pad[0]:]
    b = rng.standard_normal((sb[0], sb[1] + pad[1]), dtype=cp.float32)[:, pad[1]:]
    c0 = rng.standard_normal((m, n), dtype=cp.float32)
    c = c0.copy() if beta != 0 else cp.full((m, n), cp.nan, dtype=cp.float32)
    asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, params=params)
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    ref = alpha * ((a64.T if ta else a64) @ (b64.T if tb else b64)) + (beta * c0.astype(cp.float64) if beta else 0)
    assert bool(cp.isfinite(c).all()), f"{m}x{n}x{k} {layout} {params}: unwritten or non-finite C"
    err = float(cp.linalg.norm(c.astype(cp.float64) - ref)) / (float(cp.linalg.norm(ref)) or 1.0)
    assert err < REL_TOL, f"{m}x{n}x{k} {layout} {params}: rel err {err:.3e}"


@pytest.mark.parametrize("variant", AHEAD_VARIANTS, ids=_vid)
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_k_sweep(variant, layout):
    for k in K_SWEEP:
        _check(131, 67, k, layout, variant)


@pytest.mark.parametrize("variant", AHEAD_VARIANTS, ids=_vid)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_layouts_alpha_beta(variant, layout):
    _check(300, 200, 100, layout, variant)
    _check(263, 141, 37, layout, variant, alpha=0.75, beta=-0.5)
    _check(129, 257, 66, layout, variant, alpha=-1.25, beta=0.5, pad=(1, 3))


@pytest.mark.parametrize("variant", AHEAD_VARIANTS, ids=_vid)
def test_large_square(variant):
    _check(1000, 1000, 1000, "nn", variant)
    _check(1024, 512, 2048, "tn", variant)
