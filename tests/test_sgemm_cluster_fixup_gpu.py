"""sgemm's split-K past 8 ways in one launch (sgemm.sasm's CLUSTER_K with SPLIT_FIXUP,
last_launch()["reduce"] == "cluster+in_kernel") on the GPU: clusters of C blocks add their sums over
distributed shared memory into one workspace slice each, and the last of each rank's blocks adds the
slices into C. It groups the adds differently from the two-launch split, so C is checked against a
float64 product (the spec's tolerance) and against itself (the same bits call after call: the sum's
order is fixed, and the counters wrap back to zero for the next launch). Shapes: the random
benchmark's deep-K fp32 calls over few outputs, S not a multiple of C (blocks with no k range),
tiles of C with rows for every rank, partial tiles, alpha/beta, odd leading dimensions, the four
layouts, the three catalog tilings that split past 8, a column-major C. Skipped without CuPy and a
GPU with clusters. The CPU side (the interpreter's bits, the builds, the catalog) is
tests/test_sgemm_cluster_fixup.py."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402
from asmgemm.isa.arch import arch_for  # noqa: E402
from asmgemm.kernel_spec import get_spec  # noqa: E402
from asmgemm.runtime.gemm import last_launch  # noqa: E402
from asmgemm.runtime.gpu import device_facts  # noqa: E402
from asmgemm.runtime.split_k import split_for  # noqa: E402

if "clusters" not in arch_for(device_facts().target).features:
    pytest.skip("split-K in clusters needs a GPU with thread block clusters (sm_90)", allow_module_level=True)

SPEC = get_spec("sgemm")
LIMIT = SPEC.rel_err_limit
TILINGS = {e.name: dict(e.set) for e in SPEC.configs if e.kernel == "sgemm"}


def _operand(rng, rows, cols, trans, pad):
    """op(X) of rows x cols in fp32 (stored transposed when trans), rows `pad` elements longer than
    they need be (an odd leading dimension where pad is odd), and its float64 values."""
    shape = (cols, rows) if trans else (rows, cols)
    store = cp.asarray(rng.uniform(-1, 1, (shape[0], shape[1] + pad)).astype(np.float32))
    x = store[:, :shape[1]]
    op = x.T if trans else x
    return op, op.astype(cp.float64)


def _run(m, n, k, asked, cluster, layout, tiling, *, pad=1, alpha=0.75, beta=-0.5, order="C", repeat=2):
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    s = split_for(k, asked, SPEC.split_k.k_multiple).splits
    a, av = _operand(rng, m, k, layout[0] == "t", pad)
    b, bv = _operand(rng, k, n, layout[1] == "t", pad + 2)
    c0 = cp.asarray(rng.uniform(-1, 1, (m, n)).astype(np.float32), order=order)
    ref = alpha * (av @ bv) + beta * c0.astype(cp.float64)
    outs = []
    for _ in range(repeat):
        c = c0.copy(order=order)
        if not beta:
            c[...] = cp.nan                        # never read where beta is 0
        asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, kernel="sgemm",
                     params={**TILINGS[tiling], "SPLIT_K": s, "CLUSTER_K": cluster, "SPLIT_FIXUP": 1})
        cp.cuda.get_current_stream().synchronize()
        outs.append(c)
    ran = last_launch()
    assert ran["reduce"] == "cluster+in_kernel" and ran["splits"] == s and ran["cluster"] == cluster, ran
    assert ran["grid"][2] == -(-s // cluster) * cluster, ran
    assert ran["rerun_params"]["SPLIT_K"] == s and ran["rerun_params"]["CLUSTER_K"] == cluster, ran
    assert ran["rerun_params"]["SPLIT_FIXUP"] == 1, ran
    for again in outs[1:]:
        assert bool((again.view(cp.uint32) == outs[0].view(cp.uint32)).all()), "C's bits differ call to call"
    got = outs[0].astype(cp.float64)
    assert not bool(cp.isnan(got).any()), "unwritten (NaN) elements in C"
    err = float(cp.linalg.norm(got - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
    assert err < LIMIT, f"rel err {err:.3g}"
    return ran


# (M, N, K, S asked, C): seeds 170 and 173's deep-K calls over few outputs (S as split_for lands on
# it), a split that fills its clusters, clusters of 4, and C of several tiles
SHAPES = [(80, 96, 5152, 54, 8), (331, 33, 9150, 64, 8), (102, 130, 2772, 58, 4), (53, 81, 15027, 63, 8),
          (2524, 42, 4000, 16, 8), (134, 292, 2052, 43, 4), (9, 9, 10279, 21, 8)]
IDS = [f"{m}x{n}x{k}_s{s}c{c}" for m, n, k, s, c in SHAPES]


@pytest.mark.parametrize("m,n,k,s,cluster", SHAPES, ids=IDS)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_t64_clusters_summed_in_the_kernel(m, n, k, s, cluster, layout):
    _run(m, n, k, s, cluster, layout, "t64x64_k16")


@pytest.mark.parametrize("m,n,k,s,cluster", SHAPES[:4], ids=IDS[:4])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_cp_async_tiling_with_beta_zero(m, n, k, s, cluster, layout):
    _run(m, n, k, s, cluster, layout, "t64x64_k16_cpasync", beta=0.0, pad=0)


@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_the_128_wide_tiling(layout):
    ran = _run(300, 140, 6000, 24, 8, layout, "t128x128_k16", pad=0, alpha=-1.5, beta=2.0)
    assert ran["tile"] == (128, 128)


def test_a_column_major_c():
    _run(75, 69, 6763, 48, 8, "tn", "t64x64_k16", order="F")


def test_the_catalogs_pick_for_deep_k_few_output_calls_runs_and_is_right():
    """No params=: the dispatch's own pick (the cost model ranks the clusters' sum among the
    catalog's candidates); whatever it picks, C is right."""
    for m, n, k, layout in [(80, 96, 5152, "nn"), (331, 33, 9150, "nn"), (102, 130, 2772, "tn")]:
        rng = np.random.default_rng(k)
        a, av = _operand(rng, m, k, layout[0] == "t", 0)
        b, bv = _operand(rng, k, n, layout[1] == "t", 0)
        c = asmgemm.gemm(a, b)
        cp.cuda.get_current_stream().synchronize()
        ref = av @ bv
        err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
        assert err < LIMIT, (m, n, k, err, last_launch())
