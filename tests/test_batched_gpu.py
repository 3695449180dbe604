"""Batched gemm() on the GPU: a shared B folded with the batch into one GEMM (M' = batch * M), a
batch of one, the fused epilogue on a batch, torch tensors; against float64 under sgemm's
rel_err_limit. Skipped without CuPy and a GPU."""
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


def test_a_batch_per_b_is_refused_until_a_batched_kernel(cuda_gpu):
    cp = cuda_gpu
    import asmgemm
    with pytest.raises(AsmError, match="kernel 'sgemm' has no batched mode"):
        asmgemm.gemm(cp.ones((2, 8, 4), cp.float32), cp.ones((2, 4, 8), cp.float32))


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
