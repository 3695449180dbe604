"""An output that shares memory with an input is refused (runtime/overlap.py): gemm(a, b, a) would
have the kernel overwrite A while reading it.

On the CPU: the byte ranges themselves, the bounds a kept launch plan keeps, and asmgemm.gemm
through the stand-ins (tests/fake_cupy.py: CuPy, torch and __cuda_array_interface__ arrays over
numpy memory), on the first call and through a kept plan. On the GPU (marked gpu): the same for
real CuPy arrays, torch tensors, a foreign array and the fused epilogue's bias."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.runtime import overlap
from asmgemm.toolchain import find_tool
from fake_cupy import CudaArrayInterface, FakeArray, install_fakes

TINY = Path(__file__).parent / "data" / "tiny_gemm"
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")


# ---- the ranges ----------------------------------------------------------------------------------
def test_the_range_of_an_array_is_what_its_shape_and_strides_reach():
    assert overlap.offsets((4, 5), (40, 8), 8) == (0, 3 * 40 + 4 * 8 + 8)
    assert overlap.offsets((4, 5), (8, 32), 8) == (0, 3 * 8 + 4 * 32 + 8)      # column-major
    assert overlap.offsets((3, 4, 5), (0, 40, 8), 8) == (0, 160)              # a broadcast batch
    assert overlap.offsets((4,), (-8,), 8) == (-24, 8)                         # a negative stride
    assert overlap.offsets((0, 5), (40, 8), 8) is None                         # no element
    assert overlap.extent(1000, (2, 3), (12, 4), 4) == (1000, 1024)


@pytest.mark.parametrize("c, x, meets", [
    ((0, (4, 4), (32, 8), 8), (0, (4, 4), (32, 8), 8), True),                 # the same array
    ((0, (4, 4), (32, 8), 8), (128, (4, 4), (32, 8), 8), False),              # next to each other
    ((0, (4, 4), (32, 8), 8), (120, (4, 4), (32, 8), 8), True),               # one element shared
    ((64, (2, 2), (32, 8), 8), (0, (8, 8), (64, 8), 8), True),                # a view inside
    ((0, (4, 4), (64, 8), 8), (32, (4, 4), (64, 8), 8), True),                # interleaved rows: refused
    ((0, (0, 4), (32, 8), 8), (0, (4, 4), (32, 8), 8), False),                # empty C
])
def test_check_output_and_the_kept_bounds_agree(c, x, meets):
    if meets:
        with pytest.raises(AsmError, match="C overlaps A in memory"):
            overlap.check_output(("C", *c), [("A", *x)])
    else:
        overlap.check_output(("C", *c), [("A", *x)])
    lo, hi = overlap.kept_bounds(c[1:], [x[1:]])
    assert (lo < c[0] - x[0] < hi) is meets


def test_kept_bounds_agree_with_the_ranges_at_every_offset():
    """Every pointer difference around two arrays: the two comparisons of a kept plan say what
    the byte ranges say."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        shapes = [tuple(int(n) for n in rng.integers(0, 4, size=2)) for _ in range(2)]
        strides = [tuple(int(s) for s in rng.integers(-3, 4, size=2) * 8) for _ in range(2)]
        (sc, sx), (tc, tx) = shapes, strides
        lo, hi = overlap.kept_bounds((sc, tc, 8), [(sx, tx, 8)])
        for d in range(-80, 81, 4):
            meets = overlap.overlap(overlap.extent(10_000 + d, sc, tc, 8), overlap.extent(10_000, sx, tx, 8))
            assert (lo < d < hi) is meets, (sc, tc, sx, tx, d)


def test_no_input_and_empty_inputs_never_meet():
    assert overlap.kept_bounds(((4, 4), (32, 8), 8), [None, ((0, 3), (24, 8), 8)]) == (0, 0, 0, 0)


# ---- asmgemm.gemm through the stand-ins -----------------------------------------------------------
@pytest.fixture
def fake(monkeypatch, tmp_path):
    from asmgemm.runtime import build_cache, gemm
    cp, torch, launches = install_fakes(monkeypatch, tmp_path, TINY / "tiny_dgemm.toml")
    gemm.clear_plan_cache()
    yield cp, torch, launches
    gemm.clear_plan_cache()
    build_cache.clear_memory_cache()


def rand(*shape, seed=0):
    return np.random.default_rng(seed + 7 * sum(shape)).standard_normal(shape)


def cupy_like(x):
    return x.view(FakeArray)


@pytest.mark.parametrize("kind", ["cupy", "torch", "interface"])
def test_gemm_refuses_c_that_is_a_before_planning(fake, kind):
    import asmgemm
    cp, torch, launches = fake
    host = {n: rand(16, 16, seed=i) for i, n in enumerate("ab")}
    wrap = {"cupy": cupy_like, "torch": torch.from_numpy, "interface": CudaArrayInterface}[kind]
    a, b = wrap(host["a"]), wrap(host["b"])
    before = host["a"].copy()
    with pytest.raises(AsmError, match=r"C overlaps A in memory") as exc:
        asmgemm.gemm(a, b, a)
    assert exc.value.span is None and "overwrite A" in exc.value.message
    with pytest.raises(AsmError, match=r"C overlaps B in memory"):
        asmgemm.gemm(a, b, b, beta=1.0)
    assert not launches and np.array_equal(host["a"], before)


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("kind", ["cupy", "torch", "interface"])
def test_a_kept_plan_refuses_the_same_shapes_aliased(fake, kind, monkeypatch):
    """The first call (a C of its own) keeps a plan; a second call of the same shapes and strides
    whose C is A goes through that plan, and is refused there."""
    import asmgemm
    cp, torch, launches = fake
    wrap = {"cupy": cupy_like, "torch": torch.from_numpy, "interface": CudaArrayInterface}[kind]
    ha, hb, hc = rand(16, 16, seed=1), rand(16, 16, seed=2), rand(16, 16, seed=3)
    a, b, c = wrap(ha), wrap(hb), wrap(hc)
    asmgemm.gemm(a, b, c)
    asmgemm.gemm(a, b, c)                                   # the kept plan, C apart: runs
    assert len(launches) == 2
    np.testing.assert_allclose(hc, ha @ hb, rtol=1e-12)
    before = ha.copy()
    from asmgemm.runtime import gemm
    planned = []
    real = gemm._plan_and_launch
    monkeypatch.setattr(gemm, "_plan_and_launch", lambda *args: planned.append(1) or real(*args))
    with pytest.raises(AsmError, match="C overlaps A in memory"):
        asmgemm.gemm(a, b, a)
    with pytest.raises(AsmError, match="C overlaps B in memory"):
        asmgemm.gemm(a, b, b)
    assert not planned, "the aliased calls were planned afresh: the kept plan's check went untested"
    assert len(launches) == 2 and np.array_equal(ha, before)


@pytest.mark.toolchain
@needs_ptxas
def test_views_of_one_buffer_refused_only_where_they_meet(fake):
    import asmgemm
    cp, torch, launches = fake
    buf = np.zeros((32, 16))
    x = rand(16, 16, seed=4)
    buf[:16] = x
    a, c_apart, c_inside = buf[:16].view(FakeArray), buf[16:].view(FakeArray), buf[8:24].view(FakeArray)
    b = cupy_like(rand(16, 16, seed=5))
    asmgemm.gemm(a, b, c_apart)                              # rows 16..31: no byte shared with A
    np.testing.assert_allclose(buf[16:], x @ np.asarray(b), rtol=1e-12)
    with pytest.raises(AsmError, match="C overlaps A in memory"):
        asmgemm.gemm(a, b, c_inside)                         # rows 8..23: half of A


def test_batched_c_overlapping_a_batch_is_refused(fake):
    import asmgemm
    a = cupy_like(rand(3, 8, 8, seed=6))
    b = cupy_like(rand(3, 8, 8, seed=7))
    with pytest.raises(AsmError, match="C overlaps A in memory"):
        asmgemm.gemm(a, b, a)
    big = cupy_like(np.zeros((4, 8, 8)))
    with pytest.raises(AsmError, match="C overlaps B in memory"):
        asmgemm.gemm(a, big[1:], big[:3])                    # C's batches 1 and 2 are B's 0 and 1


def test_c_overlapping_the_bias_is_refused_before_anything_else(fake):
    """(tiny_dgemm has no fused epilogue: the overlap is the first thing said)"""
    import asmgemm
    c_host = rand(8, 8, seed=8)
    c = cupy_like(c_host)
    with pytest.raises(AsmError, match="C overlaps bias in memory"):
        asmgemm.gemm(cupy_like(rand(8, 8)), cupy_like(rand(8, 8, seed=9)), c, bias=c[0])


# ---- on the GPU ----------------------------------------------------------------------------------
def _gpu_cases(cp):
    rs = cp.random.RandomState(11)
    a = rs.standard_normal((128, 128), dtype=cp.float32)
    b = rs.standard_normal((128, 128), dtype=cp.float32)
    return a, b


@pytest.mark.gpu
def test_on_the_gpu_cupy_aliases_are_refused_first_call_and_kept_plan(cuda_gpu):
    import asmgemm
    cp = cuda_gpu
    a, b = _gpu_cases(cp)
    c = cp.empty_like(a)
    asmgemm.gemm(a, b, c)                                    # keeps the plan of these shapes
    a0 = a.copy()
    for alias, name in ((a, "A"), (b, "B")):
        with pytest.raises(AsmError, match=f"C overlaps {name} in memory"):
            asmgemm.gemm(a, b, alias)
    with pytest.raises(AsmError, match="C overlaps A in memory"):
        asmgemm.gemm(a[64:], b, a[32:96])                       # C: rows 32..95 of A's buffer, A: 64..127
    cp.cuda.Device().synchronize()
    assert bool((a == a0).all())
    assert float(cp.abs(asmgemm.gemm(a, b, c) - a @ b).max()) < 1e-2     # the kept plan still runs


@pytest.mark.gpu
def test_on_the_gpu_batched_aliases_are_refused(cuda_gpu):
    import asmgemm
    cp = cuda_gpu
    rs = cp.random.RandomState(12)
    a = rs.standard_normal((4, 64, 64), dtype=cp.float32)
    b = rs.standard_normal((4, 64, 64), dtype=cp.float32)
    with pytest.raises(AsmError, match="C overlaps A in memory"):
        asmgemm.gemm(a, b, a)
    with pytest.raises(AsmError, match="C overlaps B in memory"):
        asmgemm.gemm(a, b[0], b)


@pytest.mark.gpu
def test_on_the_gpu_torch_aliases_are_refused(cuda_gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device")
    import asmgemm
    a = torch.randn(128, 128, device="cuda")
    b = torch.randn(128, 128, device="cuda")
    c = torch.empty_like(a)
    asmgemm.gemm(a, b, c)
    for alias, name in ((a, "A"), (b, "B"), (a.t(), "A")):
        with pytest.raises(AsmError, match=f"C overlaps {name} in memory"):
            asmgemm.gemm(a, b, alias)


@pytest.mark.gpu
def test_on_the_gpu_a_cuda_array_interface_alias_is_refused(cuda_gpu):
    import asmgemm
    cp = cuda_gpu

    from conftest import InterfaceOnly as Foreign    # only the interface, as numba's device arrays
    a, b = _gpu_cases(cp)
    fa, fb = Foreign(a), Foreign(b)
    with pytest.raises(AsmError, match="C overlaps A in memory"):
        asmgemm.gemm(fa, fb, Foreign(a))
    with pytest.raises(AsmError, match="C overlaps B in memory"):
        asmgemm.gemm(fa, fb, Foreign(b))


@pytest.mark.gpu
def test_on_the_gpu_c_overlapping_the_bias_is_refused(cuda_gpu):
    """sgemm's fused epilogue reads the bias while C is stored: a bias inside C is refused, on the
    first call and through the kept plan of a call with a bias of its own."""
    import asmgemm
    cp = cuda_gpu
    a, b = _gpu_cases(cp)
    c = cp.zeros((128, 128), dtype=cp.float32)
    own = cp.ones(128, dtype=cp.float32)
    asmgemm.gemm(a, b, c, bias=own)                          # keeps the plan of a per-column bias
    with pytest.raises(AsmError, match="C overlaps bias in memory"):
        asmgemm.gemm(a, b, c, bias=c[5])
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        ta, tb = torch.randn(64, 64, device="cuda"), torch.randn(64, 64, device="cuda")
        tc = torch.zeros(64, 64, device="cuda")
        with pytest.raises(AsmError, match="C overlaps bias in memory"):
            asmgemm.gemm(ta, tb, tc, bias=tc[3])
