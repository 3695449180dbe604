"""gemm's repeated call on torch tensors (runtime/gemm.py _repeat_call), on the GPU: for each kind
of kept launch (one cuLaunchKernel on TMA maps or plain pointers, the swapped decode launch, a split
through the stream's kept scratch, operands copied to padded rows), the repeated call gives the
first call's bits on the same operands, the right C on new ones at new addresses, and launches the
kept plan without planning again (on torch's current stream: tests/test_raw_launch_gpu.py's side
stream, whose second call is a repeated one). Skipped without torch or a GPU."""
from __future__ import annotations

import pytest

import asmgemm
from asmgemm.runtime import gemm as gemm_module
from asmgemm.runtime import kept_launch

pytestmark = pytest.mark.gpu

CASES = [   # m, n, k, dtype, layout
    (1024, 1024, 1024, "float16", "nn"),     # the TMA kernel: maps rewritten when a pointer moves
    (305, 923, 6, "float16", "nn"),          # odd rows: the portable kernel in place
    (652, 415, 148, "bfloat16", "nt"),
    (8, 4096, 4096, "float16", "nt"),        # decoding: a swapped launch where the model picks C^T
    (1, 4096, 4096, "float32", "nt"),
    (300, 200, 100, "float32", "tn"),
    (64, 64, 8192, "float32", "nn"),         # deep K over few outputs: a split
    (96, 80, 12000, "float16", "tt"),
    (3001, 2999, 701, "float16", "nn"),      # odd rows, large: where the model copies them for TMA
]


def _operands(torch, m, n, k, dtype, layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = getattr(torch, dtype)
    a = torch.randn((k, m) if layout[0] == "t" else (m, k), device="cuda", generator=g).to(dt)
    b = torch.randn((n, k) if layout[1] == "t" else (k, n), device="cuda", generator=g).to(dt)
    return a, b


@pytest.mark.parametrize("m,n,k,dtype,layout", CASES)
def test_the_repeated_call_gives_the_first_calls_c(cuda_gpu, m, n, k, dtype, layout):
    torch = pytest.importorskip("torch")
    gemm_module.clear_plan_cache()
    ta, tb = layout[0] == "t", layout[1] == "t"
    a, b = _operands(torch, m, n, k, dtype, layout, 1)
    first = asmgemm.gemm(a, b, trans_a=ta, trans_b=tb)
    kept = kept_launch._last_launch[0]
    again = asmgemm.gemm(a, b, trans_a=ta, trans_b=tb)
    assert kept_launch._last_launch[0] is kept, "the repeated call planned again"
    assert gemm_module._repeat.tensor is torch.Tensor, "the first call did not arm the repeated call's path"
    assert torch.equal(first, again)
    for seed in (2, 3):                           # new operands at new addresses, and a new C each call
        a2, b2 = _operands(torch, m, n, k, dtype, layout, seed)
        out = asmgemm.gemm(a2, b2, alpha=0.5, trans_a=ta, trans_b=tb)
        assert kept_launch._last_launch[0] is kept and out.data_ptr() != first.data_ptr()
        ref = 0.5 * ((a2.t() if ta else a2).double() @ (b2.t() if tb else b2).double())
        err = float((out.double() - ref).norm() / ref.norm())
        assert err < (1e-5 if dtype == "float32" else 1e-2), f"relative error {err}"
    run = gemm_module.last_launch()
    print(f"{m}x{n}x{k} {dtype} {layout}: {run['kernel']} {run['config']} c_trans={run['c_trans']} "
          f"splits={run['splits']} copies={run['copies']} direct={kept.direct is not None}")


@pytest.mark.parametrize("m,n,k,dtype,layout", [c for c in CASES if c[3] != "bfloat16"])
def test_cupy_arrays_with_a_given_c(cuda_gpu, m, n, k, dtype, layout):
    """What `asmgemm bench` times: CuPy arrays, C given (alpha and beta per call)."""
    cp = cuda_gpu
    gemm_module.clear_plan_cache()
    ta, tb = layout[0] == "t", layout[1] == "t"
    rng = cp.random.default_rng(m + n + k)
    dt = getattr(cp, dtype)
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32).astype(dt)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32).astype(dt)
    c0 = rng.standard_normal((m, n), dtype=cp.float32).astype(dt)
    outs = []
    for _ in range(3):
        c = c0.copy()
        asmgemm.gemm(a, b, c, alpha=0.5, beta=0.25, trans_a=ta, trans_b=tb)
        outs.append(c)
        if len(outs) == 1:
            kept = kept_launch._last_launch[0]
    assert kept_launch._last_launch[0] is kept and gemm_module._repeat.ndarray is cp.ndarray
    assert bool((outs[1] == outs[0]).all()) and bool((outs[2] == outs[0]).all())
    ref = 0.5 * ((a.T if ta else a).astype(cp.float64) @ (b.T if tb else b).astype(cp.float64)) + 0.25 * c0
    err = float(cp.linalg.norm(outs[0].astype(cp.float64) - ref) / cp.linalg.norm(ref))
    assert err < (1e-5 if dtype == "float32" else 1e-2), f"relative error {err}"


def test_the_cases_cover_each_kind_of_kept_launch(cuda_gpu):
    """At least one case above of each: one launch, a swapped launch, a launch through the stream's
    kept scratch (a split's workspace or a padded copy)."""
    torch = pytest.importorskip("torch")
    kinds = set()
    for m, n, k, dtype, layout in CASES:
        gemm_module.clear_plan_cache()
        a, b = _operands(torch, m, n, k, dtype, layout, 1)
        asmgemm.gemm(a, b, trans_a=layout[0] == "t", trans_b=layout[1] == "t")
        kept = kept_launch._last_launch[0]
        kinds.add("direct" if kept.direct is not None else "scratch")
        if kept.swapped:
            kinds.add("swapped")
    assert kinds == {"direct", "scratch", "swapped"}
