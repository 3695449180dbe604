"""The Hopper HGEMM's fused epilogue and split-K on the GPU (issue 12 for the 16-bit kernels):
gemm(bias=, activation=) through hgemm, bgemm and hgemm_f32c on the staged (TMA-stored) path and
the pair-store path, with beta and column-major C; split-K's partial pass (persistent walk over S
copies of the tiles, fp32 partial tiles) and reduce, as the catalog's split entries on deep-K shapes
and forced by S, over the layouts, alpha/beta, column-major C, bf16 and fp32 C, bit-identical from
run to run; split-K inside a cluster (CLUSTER_K) the same way, the catalog's entries that split so
too, with K slices left empty and many tiles a cluster.
References: the fp32 values of the same 16-bit inputs multiplied in float64, the epilogue by
PyTorch's formulas (tests/epilogue_reference.py); judged by each spec's rel_err_limit. Skipped
without CuPy, a GPU, or an sm_90 GPU."""
from __future__ import annotations

import numpy as np
import pytest

# hgemm's own route (conftest.hgemm_own_path): no in-place hgemm_mma for odd operands
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hgemm_own_path")]

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402
from asmgemm.kernel_spec import get_spec  # noqa: E402
from asmgemm.runtime.gemm import last_launch  # noqa: E402
from catalog_entries import catalog_entry, entry_params  # noqa: E402
from asmgemm.runtime.gpu import device_facts  # noqa: E402
from epilogue_reference import epilogue  # noqa: E402

if device_facts().target != "sm_90":
    pytest.skip("the HGEMM needs an sm_90 (Hopper) GPU", allow_module_level=True)

KERNEL_OF = {"float16": "hgemm", "bfloat16": "bgemm", "f32c": "hgemm_f32c"}


def _bf16(x32):
    u = x32.view(cp.uint32)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
    return bits, (bits.astype(cp.uint32) << 16).view(cp.float32)


def _as(x32, dtype):
    """(array of `dtype` for gemm, its fp32 values); bfloat16 as uint16 bit patterns."""
    if dtype == "bfloat16":
        return _bf16(x32)
    if dtype == "float32":
        return x32.copy(), x32.copy()
    x = x32.astype(cp.float16)
    return x, x.astype(cp.float32)


def _values(c, dtype):
    c = cp.ascontiguousarray(c)
    return (c.astype(cp.uint32) << 16).view(cp.float32) if dtype == "bfloat16" else c.astype(cp.float32)


def _run(m, n, k, *, kind="float16", act=None, where="none", layout="nn", alpha=1.0, beta=0.0, c_order="C",
         params=None, seed=0):
    """One call; returns (C as given back, rel err)."""
    ab = "bfloat16" if kind == "bfloat16" else "float16"
    cdt = "float32" if kind == "f32c" else ab
    rng = cp.random.default_rng(seed + 7 * m + 13 * n + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a, av = _as(rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32), ab)
    b, bv = _as(rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32), ab)
    c0, c0v = _as(rng.standard_normal((m, n), dtype=cp.float32), cdt)
    c = cp.asfortranarray(c0) if c_order == "F" else c0.copy()
    if beta == 0:       # NaN: beta = 0 never reads C
        if cdt == "float32":
            c[...] = cp.nan
        else:
            c.view(cp.uint16)[...] = 0x7E00 if cdt == "float16" else 0x7FC0
    bias, epi = None, {}
    if where == "cols":
        bias, bvals = _as(rng.standard_normal(n, dtype=cp.float32), cdt)
        epi = {"bias_cols": cp.asnumpy(bvals)}
    elif where == "rows":
        bias, bvals = _as(rng.standard_normal((m, 1), dtype=cp.float32), cdt)
        epi = {"bias_rows": cp.asnumpy(bvals).ravel()}
    kernel = KERNEL_OF[kind]
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, bias=bias, activation=act,
                       params=params, kernel=kernel)
    assert out is c
    acc = (cp.asnumpy(av).astype(np.float64).T if ta else cp.asnumpy(av).astype(np.float64)) @ \
        (cp.asnumpy(bv).astype(np.float64).T if tb else cp.asnumpy(bv).astype(np.float64))
    want = epilogue(acc, alpha, beta, cp.asnumpy(c0v) if beta != 0 else None, activation=act, **epi)
    got = cp.asnumpy(_values(c, cdt)).astype(np.float64)
    assert np.isfinite(got).all(), "non-finite values in C"
    err = float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))
    limit = get_spec(kernel).rel_err_limit
    assert err < limit, (f"{kind} {m}x{n}x{k} {layout} act={act} bias={where} alpha={alpha} beta={beta} "
                         f"C {c_order} params={params}: rel err {err:.3e}")
    return c, err


# ---- the fused epilogue ----------------------------------------------------------------------------
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("where", ["none", "cols", "rows"])
@pytest.mark.parametrize("shape", [(129, 264, 200), (131, 77, 65)], ids=["staged", "pairs"])
def test_each_activation_and_bias_mode(act, where, shape):
    # N = 264 (rows of 16 bytes): the staged TMA stores; N = 77: the guarded pair stores
    _run(*shape, act=act, where=where)


@pytest.mark.parametrize("kind", ["bfloat16", "f32c"])
@pytest.mark.parametrize("where", ["cols", "rows"])
def test_bf16_and_fp32_c(kind, where):
    _run(200, 320, 192, kind=kind, act="gelu", where=where)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("c_order", ["C", "F"])
def test_layouts_and_column_major_c_keep_the_users_bias_axis(layout, c_order):
    _run(136, 264, 100, act="silu", where="cols", layout=layout, c_order=c_order)


def test_beta_with_bias_and_activation():
    _run(129, 264, 200, act="gelu", where="cols", alpha=0.5, beta=0.75)
    _run(130, 77, 64, act="relu", where="rows", alpha=-1.0, beta=2.0)


def test_large_problem_on_the_default_tile():
    _run(1024, 2048, 1024, act="gelu_tanh", where="cols")


@pytest.mark.parametrize("act", ["gelu", "silu"])
@pytest.mark.parametrize("params", [None, {"BN": 192, "STAGES": 4}, {"BN": 128, "STAGES": 6, "CLUSTER_M": 1}],
                         ids=["default", "bn192", "bn128"])
def test_activation_warps_over_many_tiles_per_block(act, params):
    """More tiles than blocks (2048x4096: 128 to 512 tiles on 132 SMs): the activation warps hand
    each consumer's staging buffer back tile after tile (FREE_BAR), while the next tile's stmatrix
    waits for it; K = 320 keeps each tile short, so a slow hand-back would show as a race here."""
    _run(2048, 4096, 320, act=act, where="cols", params=params)
    _run(2000, 4000, 136, kind="bfloat16", act=act, where="rows", params=params)


@pytest.mark.parametrize("act", ["relu", "gelu", "gelu_tanh", "silu"])
def test_activation_warps_agree_with_the_consumers(act):
    """ACT_WARPS_ASKED=0 applies the activation in the consumers to fp32 values; 1 (the default) in
    the activation warps to the 16-bit rounding of the same values: both within the spec's limit
    (in _run), and within about one unit of fp16's last place of each other in the Frobenius norm
    (elementwise the extra rounding is scaled by act's condition, ~x^2 for gelu's negative tail)."""
    c0, _ = _run(384, 512, 256, act=act, where="cols", params={"ACT_WARPS_ASKED": 0})
    c1, _ = _run(384, 512, 256, act=act, where="cols")
    a, b = c0.astype(cp.float64), c1.astype(cp.float64)
    assert float(cp.linalg.norm(a - b) / cp.linalg.norm(a)) < 2.0 ** -11


# ---- split-K -------------------------------------------------------------------------------------
# The catalog's entries that split K by the partial pass are the 256-wide ones, 2 ways (the others
# split inside clusters: CLUSTER_K, below). Forced at deep K (8200: no multiple of 64) over three
# tile rows (300: the last partly outside M); in pairs of tile rows (t128x256_cm2) the second
# pair's lower block lies wholly below M.
@pytest.mark.parametrize("shape,entry,cluster", [((300, 3584, 8200), "t128x256_cm2", 2),
                                                 ((384, 4096, 11008), "t128x256_cm2", 2),
                                                 ((300, 3584, 8200), "t128x256", 1)])
def test_256_wide_tiles_split_two_ways_at_deep_k(shape, entry, cluster):
    _run(*shape, params=entry_params(entry, k=shape[2], splits=2))
    ran = last_launch()
    assert ran["splits"] == 2 and ran["reduce"] == "kernel" and ran["tile"] == (128, 256), ran
    assert ran["cluster"] == cluster, ran


@pytest.mark.parametrize("splits", [2, 3, 8])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_forced_splits_over_layouts(splits, layout):
    # K = 1000: not a multiple of 64, the last split shorter
    _run(64, 520, 1000, layout=layout, params={"SPLIT_K": splits})


def test_split_with_alpha_beta_and_column_major_c():
    _run(48, 1024, 2048, alpha=0.5, beta=-1.5, params={"SPLIT_K": 4})
    _run(48, 1024, 2048, c_order="F", params={"SPLIT_K": 4})


@pytest.mark.parametrize("kind", ["bfloat16", "f32c"])
def test_split_bf16_and_fp32_c(kind):
    _run(16, 2048, 4096, kind=kind, params={"SPLIT_K": 5})


@pytest.mark.parametrize("params", [{"SPLIT_K": 4}, entry_params("t128x128_st_k2")], ids=["split-k", "cluster-k"])
def test_split_runs_are_bit_identical(params):
    """Both reductions sum the partial tiles in a fixed order (the workspace slices; the cluster's
    ranks), so two runs give the same bits."""
    c1, _ = _run(128, 4096, 4096, seed=3, params=params)
    c2, _ = _run(128, 4096, 4096, seed=3, params=params)
    assert bool((c1.view(cp.uint16) == c2.view(cp.uint16)).all())


# ---- split-K inside a cluster (hgemm.sasm CLUSTER_K: partial rows summed through DSMEM) ---------------
CK = {"CLUSTER_M": 1, "BN": 128, "STAGES": 6}


@pytest.mark.parametrize("shape,entry,ck", [
    ((128, 768, 3072), "t128x128_st_k4", 4), ((200, 3584, 3584), "t128x128_st_k2", 2),
    ((128, 4096, 4096), "t128x64_st_k2", 2), ((16, 768, 3072), "ct_t128x16_st_k4", 4),
    ((128, 768, 3072), "ct_t128x32_st_k4", 4), ((48, 3584, 3584), "ct_t128x64_st_k2", 2),
    ((256, 768, 3072), "ct_t128x64_st_k4", 4), ((100, 1000, 2100), "ct_t128x64_st_k4", 4)])
def test_cluster_k_entries_at_deep_k(shape, entry, ck):
    """Each catalog entry that splits K inside its clusters, forced on a deep-K shape with few
    tiles, the kind it is for; as C^T the user's 16 to 256 rows fill one to four kernel tile
    columns (48, 100: the last partly outside); K = 2100 no multiple of 64."""
    _run(*shape, params=entry_params(entry))
    launch = last_launch()
    assert launch["cluster"] == ck and launch["splits"] == 1, launch
    assert launch["c_trans"] == catalog_entry(entry).swap, launch


@pytest.mark.parametrize("ck", [2, 4, 8])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_cluster_splits_over_layouts(ck, layout):
    # K = 1000: 16 K tiles, the slices one tile apart in length
    _run(130, 520, 1000, layout=layout, params={**CK, "CLUSTER_K": ck})


@pytest.mark.parametrize("ck", [2, 4, 8])
@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 9, 63), (129, 257, 65), (300, 200, 130)])
def test_cluster_split_with_fewer_k_tiles_than_blocks(ck, shape):
    """K tiles < CLUSTER_K: the blocks without a K slice send zeros."""
    _run(*shape, params={**CK, "CLUSTER_K": ck})


@pytest.mark.parametrize("ck", [2, 8])
def test_cluster_split_walks_many_tiles_per_cluster(ck):
    """More tiles than clusters (the persistent walk): every block's receive area is reused tile
    after tile, after the owners have read it (red_empty)."""
    _run(1000, 2000, 700, params={**CK, "CLUSTER_K": ck})
    _run(1000, 2000, 700, params={**CK, "CLUSTER_K": ck, "BN": 256, "STAGES": 4})


@pytest.mark.parametrize("kind", ["float16", "bfloat16", "f32c"])
@pytest.mark.parametrize("act,where", [(None, "none"), ("gelu", "cols"), ("silu", "rows")])
def test_cluster_split_with_epilogue_alpha_beta(kind, act, where):
    _run(300, 520, 2048, kind=kind, act=act, where=where, alpha=0.5, beta=-1.5, params={**CK, "CLUSTER_K": 4})
    _run(300, 520, 2048, kind=kind, act=act, where=where, c_order="F", params={**CK, "CLUSTER_K": 2})


@pytest.mark.parametrize("bn,ck", [(16, 4), (32, 2), (64, 8)])
def test_cluster_split_on_the_swapped_launch(bn, ck):
    params = {"C_T": 1, "BN": bn, "STAGES": 8, "CLUSTER_M": 1, "GROUP_M": 4, "CLUSTER_K": ck}
    _run(50, 1000, 2100, params=params, act="gelu", where="cols")
    assert last_launch()["c_trans"] and last_launch()["cluster"] == ck
    _run(17, 300, 257, params=params, beta=0.5)


# ---- the fused epilogue on the swapped launch (small M: C^T stored transposed) ---------------------
@pytest.mark.parametrize("act", [None, "gelu", "silu"])
@pytest.mark.parametrize("where", ["cols", "rows"])
@pytest.mark.parametrize("kind", ["float16", "bfloat16", "f32c"])
def test_small_m_swapped_keeps_the_users_bias_axis(act, where, kind):
    """The catalog's C^T entries, forced, with a bias along the user's columns or rows (the kernel's
    rows or columns): 16 rows in one 16-wide kernel tile column; 33 in two 32-wide ones, the
    second holding one row, with alpha/beta; 200 in four 64-wide ones of 64-row tiles, the last
    partly outside."""
    family = KERNEL_OF[kind]
    _run(16, 520, 136, kind=kind, act=act, where=where, params=entry_params("ct_t128x16_st", family))
    assert last_launch()["c_trans"]
    _run(33, 300, 200, kind=kind, act=act, where=where, alpha=0.5, beta=0.75,
         params=entry_params("ct_t128x32_st", family))
    assert last_launch()["c_trans"]
    _run(200, 600, 300, kind=kind, act=act, where=where, params=entry_params("ct_t64x64_st", family))
    assert last_launch()["c_trans"]
