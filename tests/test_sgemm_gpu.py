"""SGEMM on the GPU against a float64 reference: shapes, layouts, alpha/beta, leading dimensions,
column-major C. Skipped without CuPy or a GPU."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402
from asmgemm.errors import AsmError  # noqa: E402

# float32 accumulation over K terms: relative norm error well under 1e-5 for these sizes; TF32
# or a wrong element would be far above.
REL_TOL = 2e-5


def _rand(rng, shape):
    return rng.standard_normal(shape, dtype=cp.float32)


def _reference(a, b, c0, alpha, beta, trans_a, trans_b):
    a64 = a.astype(cp.float64)
    b64 = b.astype(cp.float64)
    out = alpha * ((a64.T if trans_a else a64) @ (b64.T if trans_b else b64))
    if beta != 0:
        out = out + beta * c0.astype(cp.float64)
    return out


def _rel_err(out, ref):
    assert bool(cp.isfinite(out).all()), "non-finite values in C"
    denom = float(cp.linalg.norm(ref)) or 1.0
    return float(cp.linalg.norm(out.astype(cp.float64) - ref)) / denom


def _check(m, n, k, layout="nn", alpha=1.0, beta=0.0, params=None, seed=0):
    rng = cp.random.default_rng(seed + m * 7 + n * 13 + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = _rand(rng, (k, m) if ta else (m, k))
    b = _rand(rng, (n, k) if tb else (k, n))
    c0 = _rand(rng, (m, n))
    c = c0.copy() if beta != 0 else cp.full((m, n), cp.nan, dtype=cp.float32)
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, params=params)
    assert out is c
    err = _rel_err(c, _reference(a, b, c0, alpha, beta, ta, tb))
    assert err < REL_TOL, f"{m}x{n}x{k} {layout} alpha={alpha} beta={beta} params={params}: rel err {err:.3e}"


SHAPES = [(1, 1, 1), (7, 7, 7), (127, 127, 127), (129, 129, 129), (1000, 1000, 1000),
          (3000, 5000, 700), (300, 200, 1), (1, 300, 257), (300, 1, 257), (130, 250, 9)]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_shapes_nn(m, n, k):
    _check(m, n, k)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k", [(129, 127, 131), (256, 384, 64), (33, 65, 17), (1000, 1000, 1000)])
def test_layouts(layout, m, n, k):
    _check(m, n, k, layout)


VARIANTS = [{"THREADS": 256, "RQ": 2, "BK": 8}, {"THREADS": 256, "RQ": 2, "BK": 16}, {"THREADS": 64, "RQ": 2, "BK": 8},
            {"THREADS": 64, "RQ": 2, "BK": 16}, {"THREADS": 256, "RQ": 4, "BK": 8}, {"THREADS": 256, "RQ": 4, "BK": 16},
            {"THREADS": 256, "RQ": 2, "BK": 8, "ASYNC": 1}, {"THREADS": 64, "RQ": 2, "BK": 8, "ASYNC": 1},
            {"THREADS": 256, "RQ": 4, "BK": 16, "ASYNC": 1}, {"THREADS": 256, "RQ": 4, "BK": 8, "PREFETCH": 1},
            {"THREADS": 64, "RQ": 2, "BK": 16, "ASYNC": 1}]      # the default for small problems


def _vid(v):
    return "t{THREADS}-rq{RQ}-bk{BK}".format(**v) + ("-async" if v.get("ASYNC") else "") + \
        ("-pf" if v.get("PREFETCH") else "")


@pytest.mark.parametrize("variant", VARIANTS, ids=_vid)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k", [(300, 200, 100), (131, 67, 45)])
def test_variants(variant, layout, m, n, k):
    _check(m, n, k, layout, params=variant)


@pytest.mark.parametrize("variant", [v for v in VARIANTS if v.get("ASYNC")], ids=_vid)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k", [(1000, 16, 48), (16, 1000, 48), (7, 5, 33)])
def test_async_copies_nothing_past_the_edge(variant, layout, m, n, k):
    """ASYNC=1 copies nothing for an MN-contiguous operand's columns past M or N (src-size 0:
    zero-filled) where it used to clamp them onto the last ones: tiles much wider than the matrix,
    the C columns they feed never stored."""
    _check(m, n, k, layout, params=variant)


@pytest.mark.parametrize("variant", VARIANTS, ids=_vid)
def test_variants_scalar_loads_and_beta(variant):
    """Odd leading dimensions (scalar-load paths of every operand), beta != 0, a K tail."""
    rng = cp.random.default_rng(21)
    m, n, k = 263, 141, 37
    a = _rand(rng, (m, k + 3))[:, 1:1 + k]
    b = _rand(rng, (k, n + 5))[:, 2:2 + n]
    c0 = _rand(rng, (m, n))
    c = c0.copy()
    asmgemm.gemm(a, b, c, alpha=0.75, beta=-0.5, params=variant)
    assert _rel_err(c, _reference(a, b, c0, 0.75, -0.5, False, False)) < REL_TOL


@pytest.mark.parametrize("alpha,beta", [(0.5, 0.0), (1.0, 1.0), (-2.0, 0.25), (0.0, 3.0)])
@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_alpha_beta(alpha, beta, layout):
    _check(257, 190, 77, layout, alpha=alpha, beta=beta)


def test_beta_zero_does_not_read_c():
    """C full of NaN and beta=0: any read of C would poison the result."""
    _check(300, 260, 50, beta=0.0)
    rng = cp.random.default_rng(5)
    a, b = _rand(rng, (64, 32)), _rand(rng, (32, 96))
    c = cp.full((64, 96), cp.nan, dtype=cp.float32)
    asmgemm.gemm(a, b, c, beta=0.0)
    assert bool(cp.isfinite(c).all())


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_leading_dimensions_and_offsets(layout):
    """Views into larger arrays: leading dimensions above the row, misaligned starts (scalar loads)."""
    rng = cp.random.default_rng(11)
    m, n, k = 150, 170, 90
    ta, tb = layout[0] == "t", layout[1] == "t"
    big_a = _rand(rng, (300, 301))
    big_b = _rand(rng, (310, 333))
    big_c = _rand(rng, (400, 405))
    a = big_a[3:3 + (k if ta else m), 5:5 + (m if ta else k)]
    b = big_b[1:1 + (n if tb else k), 2:2 + (k if tb else n)]
    c = big_c[7:7 + m, 9:9 + n]
    c0 = c.copy()
    outside = big_c.copy()
    asmgemm.gemm(a, b, c, alpha=1.5, beta=0.5, trans_a=ta, trans_b=tb)
    ref = _reference(a, b, c0, 1.5, 0.5, ta, tb)
    assert _rel_err(c, ref) < REL_TOL
    mask = cp.ones(big_c.shape, dtype=bool)
    mask[7:7 + m, 9:9 + n] = False
    assert bool((big_c[mask] == outside[mask]).all()), "wrote outside C"


def test_aligned_views_use_vector_path():
    """ld % 4 == 0 and 16-byte aligned starts: the 128-bit load path, on views."""
    rng = cp.random.default_rng(12)
    big_a = _rand(rng, (520, 264))
    big_b = _rand(rng, (200, 516))
    a = big_a[8:8 + 300, 4:4 + 180]
    b = big_b[0:180, 4:4 + 260]
    c = cp.empty((300, 260), dtype=cp.float32)
    asmgemm.gemm(a, b, c)
    assert _rel_err(c, _reference(a, b, None, 1.0, 0.0, False, False)) < REL_TOL


@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_column_major_c(layout):
    rng = cp.random.default_rng(13)
    m, n, k = 210, 140, 75
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = _rand(rng, (k, m) if ta else (m, k))
    b = _rand(rng, (n, k) if tb else (k, n))
    c0 = _rand(rng, (m, n))
    c = cp.asfortranarray(c0)
    asmgemm.gemm(a, b, c, alpha=2.0, beta=-1.0, trans_a=ta, trans_b=tb)
    assert _rel_err(c, _reference(a, b, c0, 2.0, -1.0, ta, tb)) < REL_TOL


def test_fortran_order_inputs():
    rng = cp.random.default_rng(14)
    a = cp.asfortranarray(_rand(rng, (123, 77)))
    b = cp.asfortranarray(_rand(rng, (77, 99)))
    c = asmgemm.gemm(a, b)
    assert _rel_err(c, _reference(a, b, None, 1.0, 0.0, False, False)) < REL_TOL


def test_new_c_allocated():
    rng = cp.random.default_rng(15)
    a, b = _rand(rng, (40, 30)), _rand(rng, (30, 20))
    c = asmgemm.gemm(a, b)
    assert c.shape == (40, 20) and c.dtype == cp.float32
    assert _rel_err(c, _reference(a, b, None, 1.0, 0.0, False, False)) < REL_TOL


def test_errors():
    a = cp.ones((4, 5), dtype=cp.float32)
    with pytest.raises(AsmError, match="float32"):
        asmgemm.gemm(a.astype(cp.float64), a.T.astype(cp.float64))
    with pytest.raises(AsmError, match="inner dimensions"):
        asmgemm.gemm(a, a)
    with pytest.raises(AsmError, match="shape"):
        asmgemm.gemm(a, a.T.copy(), cp.empty((3, 3), dtype=cp.float32))
    strided = cp.ones((5, 10), dtype=cp.float32)[:, ::2]
    with pytest.raises(AsmError, match="not contiguous"):
        asmgemm.gemm(a, strided)
