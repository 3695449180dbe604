"""Batched gemm() on the GPU: a shared B folded with the batch into one GEMM (M' = batch * M);
sgemm's batched mode (grid z) for a matrix per batch, a shared A, transposed and strided batches,
column-major C, with and without the fused epilogue; torch tensors (Linear over a batch, bmm);
against float64 under sgemm's rel_err_limit. Skipped without CuPy and a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from epilogue_reference import epilogue

pytestmark = pytest.mark.gpu


def _err(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


@pytest.mark.parametrize("bshape", ["2d", "batch1"])
@pytest.mark.parametrize("act", [None, "gelu"])
def test_shared_b_folds(cuda_gpu, bshape, act):
    cp = cuda_gpu
    import asmgemm
    rng = cp.random.default_rng(0)
    batch, m, n, k = 5, 129, 77, 65
    a = rng.standard_normal((batch, m, k), dtype=cp.float32)
    b = rng.standard_normal((k, n) if bshape == "2d" else (1, k, n), dtype=cp.float32)
    bias = rng.standard_normal(n, dtype=cp.float32) if act else None
    c = asmgemm.gemm(a, b, bias=bias, activation=act)
    assert c.shape == (batch, m, n)
    a64, b64 = cp.asnumpy(a).astype(np.float64), cp.asnumpy(b).astype(np.float64).reshape(k, n)
    for i in range(batch):
        want = epilogue(a64[i] @ b64, 1.0, 0.0, None, bias_cols=None if bias is None else cp.asnumpy(bias),
                        activation=act)
        assert _err(cp.asnumpy(c[i]).astype(np.float64), want) < get_spec("sgemm").rel_err_limit


def test_given_c_with_beta(cuda_gpu):
    cp = cuda_gpu
    import asmgemm
    rng = cp.random.default_rng(1)
    a = rng.standard_normal((3, 64, 40), dtype=cp.float32)
    b = rng.standard_normal((40, 50), dtype=cp.float32)
    c0 = rng.standard_normal((3, 64, 50), dtype=cp.float32)
    c = c0.copy()
    asmgemm.gemm(a, b, c, alpha=0.5, beta=2.0)
    want = 0.5 * (cp.asnumpy(a).astype(np.float64) @ cp.asnumpy(b).astype(np.float64)) + 2.0 * cp.asnumpy(c0)
    assert _err(cp.asnumpy(c).astype(np.float64), want) < get_spec("sgemm").rel_err_limit


def _batched_case(cp, case, rng):
    """(a, b, c or None, trans_a, trans_b) of a batch of 4 that does not fold into one GEMM."""
    bt, m, n, k = 4, 131, 70, 33
    f = cp.float32

    def r(*shape):
        return rng.standard_normal(shape, dtype=f)
    if case == "b_per_batch":
        return r(bt, m, k), r(bt, k, n), None, False, False
    if case == "shared_a":
        return r(m, k), r(bt, k, n), None, False, False
    if case == "transposed":
        return r(bt, k, m), r(bt, n, k), None, True, True
    if case == "strided":
        return r(bt, m + 3, k + 5)[:, :m, :k], r(bt, k, n + 2)[:, :, :n], r(bt, m + 1, n)[:, :m], False, False
    if case == "column_major_c":
        return r(bt, m, k), r(bt, k, n), cp.full((bt, n, m), cp.nan, dtype=f).transpose(0, 2, 1), False, False
    raise ValueError(case)


@pytest.mark.parametrize("case", ["b_per_batch", "shared_a", "transposed", "strided", "column_major_c"])
@pytest.mark.parametrize("where", ["none", "cols", "rows"])
def test_batched_kernel(cuda_gpu, case, where):
    cp = cuda_gpu
    import asmgemm
    rng = cp.random.default_rng(5)
    a, b, c, ta, tb = _batched_case(cp, case, rng)
    m = a.shape[-1] if ta else a.shape[-2]
    n = b.shape[-2] if tb else b.shape[-1]
    bias = {"none": None, "cols": rng.standard_normal(n, dtype=cp.float32),
            "rows": rng.standard_normal((m, 1), dtype=cp.float32)}[where]
    act = None if where == "none" else "gelu"
    out = asmgemm.gemm(a, b, c, trans_a=ta, trans_b=tb, bias=bias, activation=act)
    assert out.shape == (4, m, n)
    a64, b64 = cp.asnumpy(a).astype(np.float64), cp.asnumpy(b).astype(np.float64)
    epi = {} if bias is None else ({"bias_cols": cp.asnumpy(bias)} if where == "cols" else
                                   {"bias_rows": cp.asnumpy(bias).ravel()})
    for i in range(4):
        ai = a64 if a64.ndim == 2 else a64[i]
        bi = b64 if b64.ndim == 2 else b64[i]
        want = epilogue((ai.T if ta else ai) @ (bi.T if tb else bi), 1.0, 0.0, None, activation=act, **epi)
        err = _err(cp.asnumpy(out[i]).astype(np.float64), want)
        assert err < get_spec("sgemm").rel_err_limit, f"{case} {where} batch {i}: {err:.3e}"


def test_too_big_a_batch(cuda_gpu):
    cp = cuda_gpu
    import asmgemm
    with pytest.raises(AsmError, match="grid layers"):
        asmgemm.gemm(cp.ones((70000, 1, 2), cp.float32), cp.ones((70000, 2, 1), cp.float32))


def test_torch_batches(cuda_gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    import asmgemm
    x = torch.randn(4, 33, 48, device="cuda")
    w = torch.randn(96, 48, device="cuda")
    bias = torch.randn(96, device="cuda")
    out = asmgemm.gemm(x, w, trans_b=True, bias=bias, activation="silu")     # a Linear layer + SiLU on a batch
    want = torch.nn.functional.silu(x.double() @ w.double().T + bias.double())
    assert out.shape == (4, 33, 96)
    assert float(torch.linalg.norm(out.double() - want) / torch.linalg.norm(want)) < get_spec("sgemm").rel_err_limit
    y = torch.randn(4, 48, 20, device="cuda")                                 # torch.bmm: a matrix per batch
    out = asmgemm.gemm(x, y)
    want = torch.bmm(x.double(), y.double())
    assert float(torch.linalg.norm(out.double() - want) / torch.linalg.norm(want)) < get_spec("sgemm").rel_err_limit
