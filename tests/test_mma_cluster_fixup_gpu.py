"""Split-K past 8 ways in one launch for the portable kernel (issue 32's deep-K few-output calls:
mma_gemm.sasm's CLUSTER_K with SPLIT_FIXUP, last_launch()["reduce"] == "cluster+in_kernel") on the
GPU: clusters of C blocks add their sums over distributed shared memory into one workspace slice
each, and the last of each rank's blocks adds the slices into C. It groups the adds differently
from the two-launch split, so C is checked against a float64 product (the spec's tolerance) and
against itself (the same bits call after call: the sum's order is fixed, and the counters wrap
back to zero for the next launch). Shapes: the random benchmark's slowest calls (a few rows or
columns of C over K of 3-14 thousand), S not a multiple of C (blocks with no k range), several
tiles of C with rows for every rank, fp16/bf16, fp32 C, alpha/beta, odd and aligned leading
dimensions, the four layouts, a column-major C. Skipped without CuPy and a GPU with clusters. The
CPU side (the builds, the catalog, the model) is tests/test_mma_cluster_fixup.py."""
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
from asmgemm.runtime.gemm import last_launch  # noqa: E402
from asmgemm.runtime.gpu import device_facts  # noqa: E402

if "clusters" not in arch_for(device_facts().target).features:
    pytest.skip("split-K in clusters needs a GPU with thread block clusters (sm_90)", allow_module_level=True)

from test_mma_cluster_k_gpu import KERNEL, LIMIT, TILINGS, _operand, _values, problem  # noqa: E402


def _run(m, n, k, s, cluster, layout, dtype, c_f32=False, *, aligned, alpha=0.75, beta=-0.5, order="C",
         tiling="t64", repeat=2):
    """C from `repeat` calls of the clusters' one-launch split (the same inputs and initial C), the
    last launch's report, and the float64 reference."""
    opa, opb, c0, ref = problem(m, n, k, layout, dtype, c_f32, aligned=aligned, alpha=alpha, beta=beta,
                                order=order)
    outs = []
    for _ in range(repeat):
        c = c0.copy(order=order)
        if not beta:
            c.view(cp.uint32 if c_f32 else cp.uint16)[...] = 0x7FC00000 if c_f32 else 0x7E00      # NaN: never read
        asmgemm.gemm(opa, opb, c, alpha=alpha, beta=beta, kernel=KERNEL[(dtype, c_f32)],
                     params={**TILINGS[tiling], "SPLIT_K": s, "CLUSTER_K": cluster, "SPLIT_FIXUP": 1})
        cp.cuda.get_current_stream().synchronize()
        outs.append(c)
    return outs, last_launch(), ref


def _check(outs, ran, ref, s, cluster, dtype, c_f32=False):
    assert ran["reduce"] == "cluster+in_kernel" and ran["splits"] == s and ran["cluster"] == cluster, ran
    assert ran["grid"][2] == -(-s // cluster) * cluster, ran
    assert ran["rerun_params"]["SPLIT_K"] == s and ran["rerun_params"]["CLUSTER_K"] == cluster, ran
    word = cp.uint32 if c_f32 else cp.uint16
    for again in outs[1:]:
        assert bool((again.view(word) == outs[0].view(word)).all()), "C's bits differ from one call to the next"
    got = _values(outs[0], dtype, c_f32)
    assert not bool(cp.isnan(got).any()), "unwritten (NaN) elements in C"
    err = float(cp.linalg.norm(got - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
    assert err < LIMIT[(dtype, c_f32)], f"rel err {err:.3g}"


# (M, N, K, S asked, C): the random seeds' slowest calls (S as split_for lands on it: 21x7x13520 asks
# 64 and gets 53, three blocks of the last cluster with no k range), a split that fills its
# clusters, clusters of 4, and C of several tiles (rows for every rank, a partial tile)
SHAPES = [(21, 7, 13520, 53, 8), (75, 69, 6763, 53, 8), (8, 73, 7062, 32, 8), (21, 54, 3089, 12, 4),
          (56, 5, 12421, 49, 8), (200, 150, 5000, 16, 8), (130, 70, 2600, 10, 4)]
IDS = [f"{m}x{n}x{k}_s{s}c{c}" for m, n, k, s, c in SHAPES]


def _splits(k, asked):
    from asmgemm.runtime.split_k import split_for
    return split_for(k, asked, 64).splits


@pytest.mark.parametrize("m,n,k,s,cluster", SHAPES, ids=IDS)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_fp16_clusters_summed_in_the_kernel(m, n, k, s, cluster, layout):
    s = _splits(k, s)
    outs, ran, ref = _run(m, n, k, s, cluster, layout, "float16", aligned=layout in ("nt", "tn"))
    _check(outs, ran, ref, s, cluster, "float16")


@pytest.mark.parametrize("m,n,k,s,cluster", SHAPES[:2] + SHAPES[5:], ids=IDS[:2] + IDS[5:])
def test_bf16_beta_zero_clusters_summed_in_the_kernel(m, n, k, s, cluster):
    s = _splits(k, s)
    outs, ran, ref = _run(m, n, k, s, cluster, "tt", "bfloat16", aligned=False, beta=0.0)
    _check(outs, ran, ref, s, cluster, "bfloat16")


def test_fp32_c_and_a_column_major_c():
    s = _splits(6763, 48)
    outs, ran, ref = _run(75, 69, 6763, s, 8, "tn", "float16", True, aligned=False, alpha=-1.5, beta=2.0, order="F")
    _check(outs, ran, ref, s, 8, "float16", True)


@pytest.mark.parametrize("tiling", ["t128n", "t128"])
def test_the_128_wide_tilings(tiling):
    s = _splits(9000, 24)
    outs, ran, ref = _run(140, 40, 9000, s, 8, "nn", "float16", aligned=tiling == "t128", tiling=tiling)
    _check(outs, ran, ref, s, 8, "float16")
    assert ran["tile"] == (128, 128)


def test_the_catalogs_pick_for_a_deep_k_few_output_call_runs_and_is_right():
    """No params=: the dispatch's own pick for 21x7x13520 (the cost model ranks the clusters' sum
    among the catalog's candidates); whatever it picks, C is right."""
    rng = np.random.default_rng(7)
    a, av = _operand(rng, 21, 13520, "float16", 13521)
    b, bv = _operand(rng, 13520, 7, "float16", 7)
    c = asmgemm.gemm(a, b)
    cp.cuda.get_current_stream().synchronize()
    ref = av @ bv
    err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    assert err < 2e-3, (err, last_launch())
