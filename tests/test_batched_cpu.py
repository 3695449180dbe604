"""Batched gemm() (3-D operands, torch.matmul's broadcast of one batch dimension) on the CPU, with
the stand-in CuPy of tests/fake_cupy.py and sgemm built by ptxas: the fold that runs a batch as
one 2-D GEMM (B shared, A's and C's batches stacked as rows: M' = batch * M), a batch of one, and
sgemm's batched mode (BATCHED=1: grid z = batch, batch strides per operand) for the rest, and clear
errors for kernels without one."""
from __future__ import annotations

import numpy as np
import pytest

from asmgemm import kernel_spec
from asmgemm.errors import AsmError
from fake_cupy import FakeArray
from test_epilogue_cpu import _check, f32, fake, needs_ptxas  # noqa: F401  (fake: the fixture)
from sweeps import sample_every


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
    from asmgemm.runtime.gemm import last_launch
    ran = kernel_spec.get_spec(last_launch()["kernel"])          # (whichever entry of sgemm's catalog ran)
    # the kernel's M: 3 batches of 10 rows, or, run as C^T (a skinny_ct entry: 7 columns), its N
    rows = int(args[ran.abi.index("N" if last_launch()["c_trans"] else "M")])
    assert rows == 30 and grid[2] == 1
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


def _per_batch(x, i):
    x = np.asarray(x)
    return x if x.ndim == 2 else x[i if x.shape[0] > 1 else 0]


# Batched calls that are not one 2-D GEMM: sgemm's batched mode (BATCHED=1, grid z = batch)
CASES = {
    "b_per_batch": lambda: (batch(3, 4, 5), batch(3, 5, 6), None, False),
    "shared_a": lambda: (batch(4, 5), batch(3, 5, 6), None, False),
    "a_batch_of_one": lambda: (batch(1, 4, 5), batch(3, 5, 6), None, False),
    "transposed_a": lambda: (batch(3, 5, 4), batch(5, 6), None, True),
    "strided_a": lambda: (batch(3, 8, 5)[:, :4], batch(3, 5, 6), None, False),
    "strided_c": lambda: (batch(3, 4, 5), batch(5, 6), np.zeros((3, 8, 6), np.float32)[:, :4].view(FakeArray), False),
    "column_major_c": lambda: (batch(3, 4, 5), batch(3, 5, 6),
                               np.zeros((3, 6, 4), np.float32).transpose(0, 2, 1).view(FakeArray), False),
}


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("case", sample_every(7, list(CASES)))
def test_what_does_not_fold_runs_as_a_batched_launch(fake, case):
    import asmgemm
    cp, torch, launches = fake
    a, b, c, ta = CASES[case]()
    out = asmgemm.gemm(a, b, c, trans_a=ta, bias=batch(6, seed=4), activation="silu")
    assert out.shape == (3, 4, 6)
    grid = launches[-1][0]
    assert grid[2] == 3                                          # grid z: the batch
    for i in range(3):
        _check(out[i], _per_batch(a, i), _per_batch(b, i), None, 1.0, 0.0, ta=ta,
               bias_cols=np.asarray(batch(6, seed=4)), activation="silu")


@pytest.mark.toolchain
@needs_ptxas
def test_a_per_row_bias_is_shared_by_the_batches(fake):
    import asmgemm
    a, b, rows = batch(3, 4, 5), batch(5, 6), batch(4, 1, seed=6)   # (M, 1): not foldable into 3*M rows
    c = np.full((3, 4, 6), 7.0, np.float32).view(FakeArray)
    asmgemm.gemm(a, b, c, beta=1.0, bias=rows, activation="gelu")
    for i in range(3):
        _check(c[i], a[i], b, np.full((4, 6), 7.0), 1.0, 1.0, bias_rows=np.asarray(rows).ravel(), activation="gelu")


@pytest.mark.toolchain
@needs_ptxas
def test_batch_strides_are_packed_after_the_operand_swap(fake):
    import asmgemm
    cp, torch, launches = fake
    a, b = batch(3, 4, 5), batch(5, 6)
    c = np.zeros((3, 6, 4), np.float32).transpose(0, 2, 1).view(FakeArray)     # column-major C: swap
    asmgemm.gemm(a, b, c)
    args = launches[-1][2]
    # batch_stride_a, _b, _c in sgemm's abi order: the kernel's A is the user's B (shared: 0)
    abi = kernel_spec.get_spec("sgemm").abi
    assert [int(args[abi.index(f"batch_stride_{x}")]) for x in "abc"] == [0, 20, 24]


def test_too_big_a_batch_for_the_grid(fake):
    import asmgemm
    a = np.zeros((70000, 1, 1), np.float32).view(FakeArray)
    with pytest.raises(AsmError, match="a batch of 70000 matrices needs 70000 grid layers"):
        asmgemm.gemm(a, a)


def test_a_kernel_without_a_batched_mode_folds_or_refuses_by_name(fake):
    import asmgemm
    cp, torch, launches = fake
    a, b = np.ones((3, 4, 5)).view(FakeArray), np.ones((3, 5, 6)).view(FakeArray)   # float64: tiny_dgemm
    with pytest.raises(AsmError) as e:
        asmgemm.gemm(a, b)
    assert "kernel 'tiny_dgemm' has no batched mode" in str(e.value) and "B has a matrix per batch" in str(e.value)
    assert e.value.hint and not launches


def test_batch_shape_errors(fake):
    import asmgemm
    with pytest.raises(AsmError, match="batch sizes differ: A has 3 matrices, B has 2"):
        asmgemm.gemm(batch(3, 4, 5), batch(2, 5, 6))
    with pytest.raises(AsmError, match="2-D matrices or 3-D batches"):
        asmgemm.gemm(batch(2, 3, 4, 5), batch(5, 6))
    with pytest.raises(AsmError, match=r"expected \(3, 4, 6\)"):
        asmgemm.gemm(batch(3, 4, 5), batch(5, 6), batch(4, 6))


def test_a_spec_mapping_batched_needs_the_stride_arguments(tmp_path):
    from test_epilogue_cpu import load_tiny_with_call_param
    with pytest.raises(AsmError) as e:
        load_tiny_with_call_param(tmp_path, 'BATCHED = "batched"')
    assert "maps the call value 'batched' but abi lacks 'batch_stride_a'" in str(e.value)


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("variant", sample_every(3, [(), ("-D", "RQ=4", "-D", "BK=16", "-D", "LOAD_AHEAD=1", "-D", "LDG_NC=0"),
                                                   ("-D", "THREADS=64", "-D", "BK=16", "-D", "ASYNC=1")]),
                         ids=["default", "rq4_bk16_ahead", "t64_async"])
@pytest.mark.parametrize("epilogue", sample_every(2, [(), ("-D", "BIAS=2", "-D", "ACT=2")]), ids=["plain", "bias_rows_gelu"])
def test_the_batched_builds_have_no_spills(run_cli, variant, epilogue):
    code, out, err = run_cli("check", "sgemm", "--no-spills", "-D", "BATCHED=1", *variant, *epilogue)
    assert code == 0, err
