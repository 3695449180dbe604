"""The fused epilogue on the GPU (gemm(bias=, activation=) through sgemm): every activation with
no bias, a per-column and a per-row bias, odd and 1024-cube shapes, the four layouts, column-major
C (a per-column bias must stay per user column through the operand swap), beta != 0 with a bias,
the large-tile variant, torch tensors. Judged like the spec: the Frobenius relative error against
PyTorch's formulas in float64 (tests/epilogue_reference.py) under sgemm's rel_err_limit.
Skipped without CuPy and a GPU (the cuda_gpu fixture)."""
from __future__ import annotations

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from epilogue_reference import epilogue

pytestmark = pytest.mark.gpu

ACTS = [None, "relu", "gelu", "gelu_tanh", "silu"]
BIASES = ["none", "cols", "rows"]


def _limit() -> float:
    return get_spec("sgemm").rel_err_limit


def _problem(cp, m, n, k, layout="nn", seed=0):
    rng = cp.random.default_rng(seed + 7 * m + 13 * n + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32)
    return a, b, ta, tb, rng


def _bias(cp, rng, where, m, n):
    if where == "none":
        return None, {}
    if where == "cols":
        v = rng.standard_normal(n, dtype=cp.float32)
        return v, {"bias_cols": cp.asnumpy(v)}
    v = rng.standard_normal((m, 1), dtype=cp.float32)
    return v, {"bias_rows": cp.asnumpy(v).ravel()}


def _rel_err(cp, got, a, b, ta, tb, alpha, beta, c0, act, epi):
    a64, b64 = cp.asnumpy(a).astype(np.float64), cp.asnumpy(b).astype(np.float64)
    acc = (a64.T if ta else a64) @ (b64.T if tb else b64)
    want = epilogue(acc, alpha, beta, None if c0 is None else cp.asnumpy(c0), activation=act, **epi)
    got = cp.asnumpy(got).astype(np.float64)
    assert np.isfinite(got).all(), "non-finite values in C"
    return float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))


def _run(cp, m, n, k, act, where, layout="nn", alpha=1.0, beta=0.0, c_order="C", params=None):
    a, b, ta, tb, rng = _problem(cp, m, n, k, layout)
    bias, epi = _bias(cp, rng, where, m, n)
    c0 = rng.standard_normal((m, n), dtype=cp.float32)
    c = c0.copy(order=c_order) if beta != 0 else cp.full((m, n), cp.nan, dtype=cp.float32, order=c_order)
    import asmgemm
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, bias=bias, activation=act,
                       params=params)
    assert out is c
    err = _rel_err(cp, c, a, b, ta, tb, alpha, beta, c0 if beta != 0 else None, act, epi)
    assert err < _limit(), f"{m}x{n}x{k} {layout} act={act} bias={where} beta={beta} C={c_order}: rel err {err:.3e}"


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("where", BIASES)
@pytest.mark.parametrize("shape", [(129, 77, 65), (1024, 1024, 1024)], ids=["129x77x65", "1024cube"])
def test_each_activation_and_bias_mode(cuda_gpu, act, where, shape):
    _run(cuda_gpu, *shape, act, where)


@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
@pytest.mark.parametrize("c_order", ["C", "F"])
@pytest.mark.parametrize("where", ["cols", "rows"])
def test_layouts_and_column_major_c_keep_the_users_bias_axis(cuda_gpu, layout, c_order, where):
    _run(cuda_gpu, 131, 70, 33, "gelu", where, layout=layout, c_order=c_order)


@pytest.mark.parametrize("act", ["gelu", "silu"])
@pytest.mark.parametrize("c_order", ["C", "F"])
def test_beta_with_a_bias(cuda_gpu, act, c_order):
    _run(cuda_gpu, 200, 150, 40, act, "cols", alpha=0.75, beta=-1.5, c_order=c_order)


@pytest.mark.parametrize("params", [{"RQ": 4, "BK": 16, "LOAD_AHEAD": 1, "LDG_NC": 0},
                                    {"THREADS": 64, "BK": 16, "ASYNC": 1}], ids=["rq4_bk16", "t64_async"])
@pytest.mark.parametrize("where", ["cols", "rows"])
def test_other_variants(cuda_gpu, params, where):
    _run(cuda_gpu, 300, 260, 96, "gelu_tanh", where, beta=0.5, params=params)


def test_large_values_stay_finite(cuda_gpu):
    """Products from -120 to 120: the activations' tails give x or -0, no NaN (exp underflows, and
    above 88 EPI_EXP returns +inf, so silu(-120) is -120 / inf through div.full.f32)."""
    cp = cuda_gpu
    import asmgemm
    a = cp.full((64, 1), 1.0, dtype=cp.float32)
    b = cp.linspace(-120, 120, 96, dtype=cp.float32).reshape(1, 96)
    for act in ACTS[1:]:
        c = asmgemm.gemm(a, b, activation=act)
        got = cp.asnumpy(c)
        assert np.isfinite(got).all(), act
        want = epilogue(cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64), 1.0, 0.0, None,
                        activation=act)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-30, err_msg=act)


def test_k_zero_applies_the_epilogue(cuda_gpu):
    cp = cuda_gpu
    import asmgemm
    a, b = cp.zeros((40, 8), cp.float32)[:, :0], cp.zeros((8, 30), cp.float32)[:0]
    c0 = cp.random.default_rng(3).standard_normal((40, 30), dtype=cp.float32)
    c = c0.copy()
    bias = cp.linspace(-1, 1, 30, dtype=cp.float32)
    asmgemm.gemm(a, b, c, beta=2.0, bias=bias, activation="relu")
    np.testing.assert_allclose(cp.asnumpy(c), np.maximum(2.0 * cp.asnumpy(c0) + cp.asnumpy(bias), 0), rtol=1e-6)


def test_bias_errors_on_the_gpu(cuda_gpu):
    cp = cuda_gpu
    import asmgemm
    a, b = cp.ones((8, 4), cp.float32), cp.ones((4, 6), cp.float32)
    with pytest.raises(AsmError, match="bias has shape"):
        asmgemm.gemm(a, b, bias=cp.ones(8, cp.float32))
    with pytest.raises(AsmError, match="dtype float64"):
        asmgemm.gemm(a, b, bias=cp.ones(6, cp.float64))
    with pytest.raises(AsmError, match="not contiguous"):
        asmgemm.gemm(a, b, bias=cp.ones(12, cp.float32)[::2])
    with pytest.raises(AsmError, match="unknown activation"):
        asmgemm.gemm(a, b, activation="gelu_erf")


@pytest.mark.parametrize("where", ["cols", "rows"])
def test_torch_tensors(cuda_gpu, where):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import asmgemm
    m, n, k = 97, 130, 45
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", generator=g)
    w = torch.randn(n, k, device="cuda", generator=g)             # a Linear layer's weight: x @ W^T + b
    bias = torch.randn(n, device="cuda", generator=g) if where == "cols" else torch.randn(m, 1, device="cuda", generator=g)
    for act, fn in ((None, lambda x: x), ("relu", torch.relu), ("gelu", torch.nn.functional.gelu),
                    ("gelu_tanh", lambda x: torch.nn.functional.gelu(x, approximate="tanh")),
                    ("silu", torch.nn.functional.silu)):
        out = asmgemm.gemm(a, w, trans_b=True, bias=bias, activation=act)
        assert isinstance(out, torch.Tensor)
        want = fn(a.double() @ w.double().T + bias.double())
        err = float(torch.linalg.norm(out.double() - want) / torch.linalg.norm(want))
        assert err < _limit(), f"{act} {where}: {err:.3e}"
