"""Split-K inside clusters for the portable kernel (issue 32: mma_gemm.sasm's CLUSTER_K) on the GPU:
the S blocks of a tile one cluster, their sums added over distributed shared memory in one launch,
must give C the very bits of the two-launch split (the partial pass, then splitk_reduce.sasm) at the
same S, and C within the spec's tolerance of a float64 product. params= force each mode with the
same split ({'SPLIT_K': S, 'CLUSTER_K': S} against {'SPLIT_K': S, 'CLUSTER_K': 1}): fp16 and bf16
inputs, fp16/bf16 and fp32 C, the four layouts, the small deep-K shapes the split is for (few tiles
of C), odd leading dimensions (2-byte copies) and aligned ones, alpha and beta (beta = 0: C is not
read), a column-major C (the operand swap), the catalog's three tilings. Skipped without CuPy and a
GPU with clusters (sm_90). The CPU side (the interpreter's bit-for-bit check, the builds, the
catalog and the model) is tests/test_mma_cluster_k.py."""
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

KERNEL = {("float16", False): "hgemm_mma", ("bfloat16", False): "bgemm_mma", ("float16", True): "hgemm_mma_f32c"}
LIMIT = {("float16", False): 2e-3, ("bfloat16", False): 1e-2, ("float16", True): 5e-4}
TILINGS = {"t64": {"BM": 64, "BN": 64, "WM": 32, "WN": 32}, "t128n": {"WN": 32}, "t128": {}}


def _operand(rng, rows, cols, dtype, ld):
    """rows x cols of `dtype` (bfloat16: uint16 bits) with leading dimension ld; its float64 values."""
    x = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
    if dtype == "bfloat16":
        bits = (x.view(np.uint32) >> 16).astype(np.uint16)
        vals = (bits.astype(np.uint32) << 16).view(np.float32)
    else:
        bits = x.astype(np.float16)
        vals = bits.astype(np.float32)
    store = cp.zeros((rows, ld), dtype=bits.dtype)
    view = store[:, :cols]
    view[...] = cp.asarray(bits)
    return view, cp.asarray(vals.astype(np.float64))


def _c(rng, m, n, dtype, c_f32, order):
    x = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    if c_f32:
        c = x
    elif dtype == "bfloat16":
        c = (x.view(np.uint32) >> 16).astype(np.uint16)
    else:
        c = x.astype(np.float16)
    return cp.asarray(c, order=order)


def _values(c, dtype, c_f32):
    if c_f32 or dtype == "float16":
        return c.astype(cp.float64)
    return (c.astype(cp.uint32) << 16).view(cp.float32).astype(cp.float64)


def problem(m, n, k, layout, dtype, c_f32, *, aligned, alpha, beta, order):
    """op(A), op(B) as gemm() takes them, C's initial value and the float64 reference of alpha op(A)
    op(B) + beta C. aligned: leading dimensions padded to a multiple of 8 (16-byte copies); else to
    an odd one (2-byte copies)."""
    rng = np.random.default_rng(m * 31 + n * 7 + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    ar, ac = (k, m) if ta else (m, k)
    br, bc = (n, k) if tb else (k, n)

    def ld(cols):
        return -(-cols // 8) * 8 if aligned else cols + (0 if cols % 2 else 1)
    a, av = _operand(rng, ar, ac, dtype, ld(ac))
    b, bv = _operand(rng, br, bc, dtype, ld(bc))
    opa, opb = (a.T if ta else a), (b.T if tb else b)
    c0 = _c(rng, m, n, dtype, c_f32, order)
    ref = alpha * ((av.T if ta else av) @ (bv.T if tb else bv))
    if beta:
        ref += beta * _values(c0, dtype, c_f32)
    return opa, opb, c0, ref


def _both(m, n, k, s, layout, dtype, c_f32, *, aligned, alpha=0.75, beta=-0.5, order="C", tiling="t64"):
    """C from each mode (the same inputs and initial C), what each launch reported, and the float64
    reference (problem())."""
    opa, opb, c0, ref = problem(m, n, k, layout, dtype, c_f32, aligned=aligned, alpha=alpha, beta=beta, order=order)
    out, runs = {}, {}
    for mode, cluster in (("kernel", 1), ("cluster", s)):
        c = c0.copy(order=order)
        if not beta:
            c.view(cp.uint32 if c_f32 else cp.uint16)[...] = 0x7FC00000 if c_f32 else 0x7E00      # NaN: never read
        asmgemm.gemm(opa, opb, c, alpha=alpha, beta=beta, kernel=KERNEL[(dtype, c_f32)],
                     params={**TILINGS[tiling], "SPLIT_K": s, "CLUSTER_K": cluster})
        cp.cuda.get_current_stream().synchronize()
        out[mode], runs[mode] = c, last_launch()
    return out, runs, ref


def _check(out, runs, ref, s, dtype, c_f32):
    assert runs["kernel"]["reduce"] == "kernel" and runs["cluster"]["reduce"] == "cluster", runs
    assert runs["kernel"]["splits"] == runs["cluster"]["splits"] == s, runs
    assert runs["cluster"]["grid"][2] == s and runs["cluster"]["rerun_params"]["CLUSTER_K"] == s, runs["cluster"]
    word = cp.uint32 if c_f32 else cp.uint16
    assert bool((out["kernel"].view(word) == out["cluster"].view(word)).all()), \
        "C's bits differ between the cluster sum and the reduce kernel"
    got = _values(out["cluster"], dtype, c_f32)
    assert not bool(cp.isnan(got).any()), "unwritten (NaN) elements in C"
    err = float(cp.linalg.norm(got - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
    assert err < LIMIT[(dtype, c_f32)], f"rel err {err:.3g}"


# (M, N, K, S): the random benchmark's slow small deep-K calls, S as the model picks them (S comes
# out as asked: k_chunk = ceil(K / S) rounded up to 64 keeps S splits), a 3-way split, and the
# 7-way one 8 asked gives at K = 3089 (the catalog's clusters of any S, catalog.py)
SHAPES = [(40, 469, 825, 4), (197, 38, 1310, 4), (6, 152, 2910, 8), (67, 5, 941, 2), (127, 129, 1000, 3),
          (21, 54, 3089, 7)]
IDS = [f"{m}x{n}x{k}_s{s}" for m, n, k, s in SHAPES]


@pytest.mark.parametrize("m,n,k,s", SHAPES, ids=IDS)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_fp16_clusters_give_the_reduce_kernels_bits(m, n, k, s, layout):
    # odd leading dimensions in nn and tt, aligned ones in nt and tn
    out, runs, ref = _both(m, n, k, s, layout, "float16", False, aligned=layout in ("nt", "tn"))
    _check(out, runs, ref, s, "float16", False)


@pytest.mark.parametrize("m,n,k,s", SHAPES[:3] + SHAPES[4:], ids=IDS[:3] + IDS[4:])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_bf16_clusters_give_the_reduce_kernels_bits(m, n, k, s, layout):
    out, runs, ref = _both(m, n, k, s, layout, "bfloat16", False, aligned=layout == "tt", beta=0.25)
    _check(out, runs, ref, s, "bfloat16", False)


@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_fp32_c_clusters_give_the_reduce_kernels_bits(layout):
    out, runs, ref = _both(197, 38, 1310, 4, layout, "float16", True, aligned=layout == "nt", alpha=-1.5, beta=2.0)
    _check(out, runs, ref, 4, "float16", True)


@pytest.mark.parametrize("tiling", ["t128n", "t128"])
def test_the_128_wide_tilings_give_the_same_bits(tiling):
    """The catalog's 128 x 128 tilings (eight warps of 64 x 32 for odd leading dimensions, four of
    64 x 64 for aligned ones: a tile of sums of 68 KB over a 64 KB ring), beta = 0 (C not read)."""
    out, runs, ref = _both(40, 469, 825, 4, "nn", "float16", False, aligned=tiling == "t128", beta=0.0,
                           tiling=tiling)
    _check(out, runs, ref, 4, "float16", False)
    assert runs["cluster"]["tile"] == (128, 128)


def test_a_column_major_c_splits_in_clusters_through_the_operand_swap():
    out, runs, ref = _both(67, 5, 941, 2, "tn", "bfloat16", False, aligned=False, alpha=0.5, beta=1.0, order="F")
    _check(out, runs, ref, 2, "bfloat16", False)


def test_params_naming_the_split_alone_run_in_clusters_and_repeat_the_same_bits():
    """params={'SPLIT_K': S} (S <= 8) run in clusters on sm_90; repeated calls give the same C."""
    rng = np.random.default_rng(4)
    a, _ = _operand(rng, 40, 825, "float16", 825)
    b, _ = _operand(rng, 825, 469, "float16", 469)
    first = asmgemm.gemm(a, b, kernel="hgemm_mma", params={"SPLIT_K": 4, "WN": 32})
    assert last_launch()["reduce"] == "cluster" and last_launch()["splits"] == 4
    for _ in range(3):
        again = asmgemm.gemm(a, b, kernel="hgemm_mma", params={"SPLIT_K": 4, "WN": 32})
        assert bool((again.view(cp.uint16) == first.view(cp.uint16)).all())
