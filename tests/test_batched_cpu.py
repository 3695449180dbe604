"""Batched gemm() (3-D operands, torch.matmul's broadcast of one batch dimension) on the CPU, with
the stand-in CuPy of tests/fake_cupy.py and sgemm built by ptxas: the fold that runs a batch as
one 2-D GEMM (B shared, A's and C's batches stacked as rows: M' = batch * M), a batch of one, and
clear errors for what no shipped kernel can run yet (no kernel has a batched mode)."""
from __future__ import annotations

import numpy as np
import pytest

from asmgemm.errors import AsmError
from fake_cupy import FakeArray
from test_epilogue_cpu import _check, f32, fake, needs_ptxas  # noqa: F401  (fake: the fixture)


def batch(*shape, seed=0):
    return f32(*shape, seed=seed).view(FakeArray)


@pytest.mark.toolchain
@needs_ptxas
def test_a_shared_b_folds_the_batch_into_rows(fake):
    import asmgemm
    cp, torch, launches = fake
    a, b = batch(3, 10, 6), batch(6, 7, seed=1)
    c = asmgemm.gemm(a, b, bias=batch(7, seed=2), activation="relu")
    assert c.shape == (3, 10, 7)
    (grid, block, args, smem, stream), = launches
    assert int(args[3]) == 30                                   # the kernel's M: 3 batches of 10 rows
    for i in range(3):
        _check(c[i], a[i], b, None, 1.0, 0.0, bias_cols=np.asarray(batch(7, seed=2)), activation="relu")
    b3 = b.reshape(1, 6, 7)                                     # a batch of one B: shared as well
    c2 = np.zeros((3, 10, 7), np.float32).view(FakeArray) + 1
    asmgemm.gemm(a, b3, c2, alpha=2.0, beta=0.5)
    for i in range(3):
        _check(c2[i], a[i], b, np.ones((10, 7)), 2.0, 0.5)


@pytest.mark.toolchain
@needs_ptxas
def test_a_batch_of_one_is_the_matrix_in_any_layout(fake):
    import asmgemm
    cp, torch, launches = fake
    a, b = batch(1, 9, 5), batch(1, 4, 5, seed=3)               # B transposed: op(B) = B^T
    c = asmgemm.gemm(a, b, trans_b=True)
    assert c.shape == (1, 9, 4)
    _check(c[0], a[0], b[0], None, 1.0, 0.0, tb=True)
    cf = np.asfortranarray(np.zeros((9, 4), np.float32))[None].view(FakeArray)   # column-major C of the batch
    asmgemm.gemm(a, b, cf, trans_b=True)
    _check(cf[0], a[0], b[0], None, 1.0, 0.0, tb=True)


@pytest.mark.parametrize("make, words", [
    (lambda: (batch(3, 4, 5), batch(3, 5, 6), None), "B has a matrix per batch"),
    (lambda: (batch(4, 5), batch(3, 5, 6), None), "B has a matrix per batch"),
    (lambda: (batch(3, 5, 4), batch(5, 6), None), "A is transposed"),              # trans_a below
    (lambda: (batch(3, 8, 5)[:, :4], batch(5, 6), None), "A's batches are not contiguous"),
    (lambda: (batch(3, 4, 5), batch(5, 6), np.zeros((3, 8, 6), np.float32)[:, :4].view(FakeArray)),
     "C's batches are not contiguous"),
])
def test_what_does_not_fold_is_a_clear_error_naming_the_kernel(fake, make, words):
    import asmgemm
    a, b, c = make()
    with pytest.raises(AsmError) as e:
        asmgemm.gemm(a, b, c, trans_a=words.startswith("A is transposed"))
    assert "kernel 'sgemm' has no batched mode" in str(e.value) and words in str(e.value) and e.value.hint


def test_batch_shape_errors(fake):
    import asmgemm
    with pytest.raises(AsmError, match="batch sizes differ: A has 3 matrices, B has 2"):
        asmgemm.gemm(batch(3, 4, 5), batch(2, 5, 6))
    with pytest.raises(AsmError, match="2-D matrices or 3-D batches"):
        asmgemm.gemm(batch(2, 3, 4, 5), batch(5, 6))
    with pytest.raises(AsmError, match=r"expected \(3, 4, 6\)"):
        asmgemm.gemm(batch(3, 4, 5), batch(5, 6), batch(4, 6))
    with pytest.raises(AsmError, match="per-row bias would have to repeat"):
        asmgemm.gemm(batch(3, 4, 5), batch(5, 6), bias=batch(4, 1))
