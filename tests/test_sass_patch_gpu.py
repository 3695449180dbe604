"""Issue 35 on the GPU: kernels whose cubins carry the project's control codes (a spec's `sass_patch`)
give the same C as ptxas's code, bit for bit, in every layout, on odd shapes and at the configuration
the dispatch picks for a large problem. Control codes change when an instruction issues, never what
it computes, and no pass reorders an accumulator's chain, so any difference is a broken dependency.
Skipped without CuPy or a GPU."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402
from asmgemm.runtime.gemm import last_launch  # noqa: E402
from asmgemm.kernel_spec import get_spec, register, unregister, with_sass_patch  # noqa: E402

KERNELS = {"sgemm": cp.float32, "hgemm": cp.float16, "hgemm_mma": cp.float16}
PATCHES = {"reuse": {"reuse": True}, "stall": {"stall": True}, "stall_y8": {"stall": True, "yield_every": 8},
           "reorder": {"experimental_reorder": True}}
ODD_SHAPES = [(127, 129, 65), (7, 13, 5)]


@pytest.fixture(scope="module")
def patched():
    """(kernel, patch name) -> the registered patched copy's name."""
    names = {}
    for kernel in KERNELS:
        for pname, options in PATCHES.items():
            copy = with_sass_patch(get_spec(kernel), f"{kernel}__gpu_{pname}", options)
            register(copy)
            names[kernel, pname] = copy.name
    yield names
    for name in names.values():
        unregister(name)


def _operands(kernel, m, n, k, layout, seed):
    rng = cp.random.default_rng(seed)
    ta, tb = layout[0] == "t", layout[1] == "t"
    dtype = KERNELS[kernel]
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32).astype(dtype)
    return a, b, ta, tb


def _plain_then_patched(kernel, patched_name, m, n, k, layout, params=None):
    """C from the patched copy (its own choice of configuration, or `params`), then from ptxas's
    code with the configuration the copy ran (the plain kernel, left to choose, might send a small
    shape elsewhere). Where the copy's catalog sends the call to another kernel (sgemm's skinny
    entries), the copy runs with params={}: itself, with its source's default tiling."""
    a, b, ta, tb = _operands(kernel, m, n, k, layout, seed=m * 7 + n * 3 + k)
    c_patched = cp.full((m, n), cp.nan, dtype=KERNELS[kernel])
    asmgemm.gemm(a, b, c_patched, trans_a=ta, trans_b=tb, kernel=patched_name, params=params)
    ran = last_launch()
    if ran["kernel"] != patched_name and params is None:
        asmgemm.gemm(a, b, c_patched, trans_a=ta, trans_b=tb, kernel=patched_name, params={})
        ran = last_launch()
    assert ran["kernel"] == patched_name and ran["sass_patch"], ran
    c_plain = cp.full((m, n), cp.nan, dtype=KERNELS[kernel])
    asmgemm.gemm(a, b, c_plain, trans_a=ta, trans_b=tb, kernel=kernel, params=ran["rerun_params"])
    plain = last_launch()
    assert plain["kernel"] == kernel and not plain["sass_patch"], plain
    assert plain["params"] == ran["params"], (plain["params"], ran["params"])
    ref = (a.T if ta else a).astype(cp.float64) @ (b.T if tb else b).astype(cp.float64)
    return c_plain, c_patched, ref


def _assert_same(c_plain, c_patched, ref, what):
    assert bool(cp.isfinite(c_patched).all()), f"{what}: non-finite values"
    # bit for bit: both ran the same arithmetic in the same order
    differ = int((c_plain.view(cp.uint16 if c_plain.itemsize == 2 else cp.uint32)
                  != c_patched.view(cp.uint16 if c_patched.itemsize == 2 else cp.uint32)).sum())
    err = float(cp.linalg.norm(c_patched.astype(cp.float64) - ref) / (cp.linalg.norm(ref) or 1.0))
    assert differ == 0, f"{what}: {differ} elements differ from ptxas's code (rel err to fp64 {err:.2e})"
    assert err < (2e-5 if c_patched.dtype == cp.float32 else 5e-3), f"{what}: rel err {err:.2e}"


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k", ODD_SHAPES)
@pytest.mark.parametrize("pname", list(PATCHES))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_patched_odd_shapes(patched, kernel, pname, m, n, k, layout):
    c_plain, c_patched, ref = _plain_then_patched(kernel, patched[kernel, pname], m, n, k, layout)
    _assert_same(c_plain, c_patched, ref, f"{kernel} @{pname} {m}x{n}x{k} {layout}")


@pytest.mark.parametrize("pname", list(PATCHES))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_patched_large_configuration(patched, kernel, pname):
    """The configuration the dispatch runs at 4096^3 (the one the A/B times), at a smaller shape
    with ragged edges, so its main loop runs many iterations and its edge code runs too."""
    a, b, _, _ = _operands(kernel, 4096, 4096, 4096, "nn", seed=1)
    asmgemm.gemm(a, b, cp.empty((4096, 4096), dtype=KERNELS[kernel]), kernel=kernel)
    ran = last_launch()
    if ran["kernel"] != kernel:
        pytest.skip(f"the dispatch runs {ran['kernel']} for {kernel} at 4096^3")
    params = ran["rerun_params"]
    c_plain, c_patched, ref = _plain_then_patched(kernel, patched[kernel, pname], 1000, 1032, 1040, "nn", params)
    _assert_same(c_plain, c_patched, ref, f"{kernel} @{pname} with {params}")
