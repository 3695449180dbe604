"""The skinny kernels on the GPU (kernels_ptx/gemm_skinny.sasm): sgemm_skinny for the decoding
shapes sgemm routes to it (M <= 16, B row-major), against a float64 reference. M across the three row counts per block
(MR = 4, 8, 16) and their edges, N not a multiple of the 128-column block nor of 4 (scalar loads
of B), K shorter than a round, across rounds and across forced splits, A transposed, alpha/beta,
column-major C (the operand swap: routed only when the swapped B is row-major), every fused
epilogue, and that untuned calls really run it (the kept launch plan names the kernel) while
params= keep sgemm; then hgemm_skinny and bgemm_skinny the same way against fp64 references of the
rounded 16-bit inputs. Skipped without CuPy or a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import asmgemm
from asmgemm.runtime import gemm as gemm_module

from epilogue_reference import epilogue

pytestmark = pytest.mark.gpu

REL_TOL = 2e-5


def _check(cp, m, n, k, *, layout="nn", alpha=1.0, beta=0.0, kernel=None, params=None, c_order="C",
           bias=None, act=None, seed=0):
    rng = cp.random.default_rng(seed + 7 * m + 13 * n + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32)
    c0 = rng.standard_normal((m, n), dtype=cp.float32)
    c = c0.copy() if beta != 0 else cp.full((m, n), cp.nan, dtype=cp.float32)     # beta = 0: never read
    if c_order == "F":
        c = cp.asfortranarray(c)
    bvec, epi = None, {}
    if bias == "cols":
        bvec = rng.standard_normal(n, dtype=cp.float32)
        epi = {"bias_cols": cp.asnumpy(bvec).astype(np.float64)}
    elif bias == "rows":
        bvec = rng.standard_normal((m, 1), dtype=cp.float32)
        epi = {"bias_rows": cp.asnumpy(bvec).astype(np.float64).ravel()}
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, kernel=kernel, params=params,
                       bias=bvec, activation=act)
    assert out is c
    a64, b64 = cp.asnumpy(a).astype(np.float64), cp.asnumpy(b).astype(np.float64)
    acc = (a64.T if ta else a64) @ (b64.T if tb else b64)
    want = epilogue(acc, alpha, beta, cp.asnumpy(c0).astype(np.float64) if beta != 0 else None, activation=act, **epi)
    got = cp.asnumpy(cp.ascontiguousarray(c)).astype(np.float64)
    assert np.isfinite(got).all(), "non-finite values in C"
    err = float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))
    assert err < REL_TOL, (f"{m}x{n}x{k} {layout} alpha={alpha} beta={beta} C {c_order} bias={bias} act={act} "
                           f"kernel={kernel} params={params}: rel err {err:.3e}")
    return c


def _kernels_run():
    return {kept.spec_name for kept in gemm_module._cache.plans.values()}


@pytest.mark.parametrize("m", [1, 3, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 300), (129, 257), (1000, 1000), (4099, 2049), (4096, 4096)])
def test_rows_and_sizes_by_the_route(cuda_gpu, m, n, k):
    _check(cuda_gpu, m, n, k)


@pytest.mark.parametrize("layout", ["nn", "tn"])
@pytest.mark.parametrize("m,n,k", [(1, 130, 700), (13, 517, 3000)])
def test_transposed_a_alpha_beta(cuda_gpu, layout, m, n, k):
    _check(cuda_gpu, m, n, k, layout=layout)
    _check(cuda_gpu, m, n, k, layout=layout, alpha=0.5, beta=-1.5)


@pytest.mark.parametrize("splits", [2, 3, 7])
@pytest.mark.parametrize("mr", [4, 16])
def test_forced_splits(cuda_gpu, splits, mr):
    """k_chunk is whole rounds of 256: K = 2000 with S = 7 gives 4 splits of 512, the last one short
    (on sm_90 these run in clusters: test_splits_in_clusters_and_through_the_reduce)."""
    _check(cuda_gpu, 3, 700, 2000, kernel="sgemm_skinny", params={"SPLIT_K": splits, "MR": mr})
    _check(cuda_gpu, 3, 700, 2000, kernel="sgemm_skinny", params={"SPLIT_K": splits, "MR": mr}, alpha=2.0, beta=0.5)


@pytest.mark.parametrize("mr", [4, 8, 16])
@pytest.mark.parametrize("k,splits,reduce", [(4000, 16, "kernel"), (4000, 8, "cluster"), (1000, 8, "cluster"),
                                             (3000, 5, "cluster"), (300, 2, "cluster")])
def test_splits_in_clusters_and_through_the_reduce(cuda_gpu, mr, k, splits, reduce):
    """On sm_90 a split of at most 8 adds its blocks' sums inside a cluster (CLUSTER_K, one launch);
    16 splits of K = 4000 take the workspace and the reduce kernel. K = 1000 asked for 8 splits gets
    4 of 256 (k_chunk is whole rounds), K = 3000 in 5 leaves the last rank one short round, K = 300
    in 2 a rank of 44. Rows past M and columns past N (13 of 16 rows, 700 columns) too."""
    from asmgemm.runtime.gemm import last_launch
    for alpha, beta in ((1.0, 0.0), (2.0, 0.5)):
        _check(cuda_gpu, min(mr, 13), 700, k, kernel="sgemm_skinny", params={"SPLIT_K": splits, "MR": mr},
               alpha=alpha, beta=beta)
        ran = last_launch()
        assert ran["reduce"] == reduce and ran["splits"] == ran["grid"][2] > 1, ran
        if reduce == "cluster":
            assert ran["cluster"] == ran["splits"], ran


@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [None, "cols", "rows"])
def test_fused_epilogues(cuda_gpu, act, bias):
    _check(cuda_gpu, 5, 300, 600, bias=bias, act=act)
    _check(cuda_gpu, 5, 300, 600, bias=bias, act=act, beta=0.5)


def test_column_major_c_swaps_into_a_skinny_or_a_tiled_launch(cuda_gpu):
    """A column-major C swaps the operands (the kernel computes C^T = op(B)^T op(A)^T): 8 x 300 runs
    sgemm with the kernel's M = 300; 300 x 8 has the kernel's M = 8 and, for layout tn, a row-major
    kernel B (the user's stored A), so it is routed; for nn the kernel's B is transposed (sgemm)."""
    _check(cuda_gpu, 8, 300, 500, c_order="F")
    _check(cuda_gpu, 300, 8, 500, c_order="F")
    _check(cuda_gpu, 300, 8, 500, layout="tn", c_order="F", alpha=0.5, beta=2.0)


def test_untuned_calls_run_it_and_params_keep_sgemm(cuda_gpu):
    cp = cuda_gpu
    gemm_module._cache.plans.clear()
    _check(cp, 4, 2048, 2048)
    assert _kernels_run() == {"sgemm_skinny"}
    gemm_module._cache.plans.clear()
    _check(cp, 4, 2048, 2048, params={"THREADS": 64, "BK": 16})
    assert _kernels_run() == {"sgemm"}
    gemm_module._cache.plans.clear()
    _check(cp, 4, 2048, 2048, layout="nt")          # B transposed (nn.Linear's): the K-major skinny build
    assert _kernels_run() == {"sgemm_skinny"}
    gemm_module._cache.plans.clear()
    _check(cp, 17, 2048, 2048)                       # 17-64 rows: the cost model's choice, correct either way
    assert _kernels_run() <= {"sgemm", "sgemm_skinny"}
    gemm_module._cache.plans.clear()
    _check(cp, 65, 2048, 2048)                       # past every skinny entry's max_m (64): the tiled kernel
    assert _kernels_run() == {"sgemm"}


# ---- fp16 and bf16: hgemm_skinny / bgemm_skinny, named (hgemm and bgemm route only M <= 4 with a
# large B to them; the tests below name them to cover every M they take) ----------------------------
SKINNY = {"float16": "hgemm_skinny", "bfloat16": "bgemm_skinny"}
def _half(cp, x32, dtype):
    """(array handed to gemm, its values as float64 numpy): fp16, or bf16 as its uint16 patterns."""
    if dtype == "bfloat16":
        u = x32.view(cp.uint32)
        bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
        vals = (bits.astype(cp.uint32) << 16).view(cp.float32)
        return bits, cp.asnumpy(vals).astype(np.float64)
    h = x32.astype(cp.float16)
    return h, cp.asnumpy(h).astype(np.float64)


def _check_half(cp, m, n, k, dtype="float16", *, layout="nn", alpha=1.0, beta=0.0, params=None, kernel=None,
                c_order="C", bias=None, act=None):
    from asmgemm.kernel_spec import get_spec
    rng = cp.random.default_rng(3 + 7 * m + 13 * n + k)
    ta = layout[0] == "t"
    a, av = _half(cp, rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32), dtype)
    b, bv = _half(cp, rng.standard_normal((k, n), dtype=cp.float32), dtype)
    c0, c0v = _half(cp, rng.standard_normal((m, n), dtype=cp.float32), dtype)
    c = c0.copy()
    if beta == 0:
        c.view(cp.uint16)[...] = 0x7E00 if dtype == "float16" else 0x7FC0     # NaN: never read
    if c_order == "F":
        c = cp.asfortranarray(c)
    bvec, epi = None, {}
    if bias == "cols":
        bvec, bvals = _half(cp, rng.standard_normal(n, dtype=cp.float32), dtype)
        epi = {"bias_cols": bvals}
    elif bias == "rows":
        bvec, bvals = _half(cp, rng.standard_normal((m, 1), dtype=cp.float32), dtype)
        epi = {"bias_rows": bvals.ravel()}
    tiled = kernel or ("bgemm" if dtype == "bfloat16" else None)
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, kernel=tiled, params=params, bias=bvec,
                       activation=act)
    assert out is c
    acc = (av.T if ta else av) @ bv
    want = epilogue(acc, alpha, beta, c0v if beta != 0 else None, activation=act, **epi)
    got = cp.ascontiguousarray(c)
    got = cp.asnumpy((got.astype(cp.uint32) << 16).view(cp.float32) if dtype == "bfloat16" else got.astype(cp.float32))
    got = got.astype(np.float64)
    assert np.isfinite(got).all(), "non-finite values in C"
    err = float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))
    limit = get_spec("bgemm_skinny" if dtype == "bfloat16" else "hgemm_skinny").rel_err_limit
    assert err < limit, (f"{dtype} {m}x{n}x{k} {layout} alpha={alpha} beta={beta} C {c_order} bias={bias} "
                         f"act={act} params={params}: rel err {err:.3e}")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m", [1, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(1, 1), (7, 300), (264, 257), (1000, 1000), (4104, 2049)])
def test_half_rows_and_sizes_by_the_route(cuda_gpu, dtype, m, n, k):
    """N of 1, 7 and 1000 (not a multiple of 8: B element by element) and 264, 4104 (16-byte rows)."""
    _check_half(cuda_gpu, m, n, k, dtype, kernel=SKINNY[dtype])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_transposed_a_alpha_beta_column_major_c(cuda_gpu, dtype):
    _check_half(cuda_gpu, 3, 520, 700, dtype, layout="tn", alpha=0.5, beta=-1.5, kernel=SKINNY[dtype])
    _check_half(cuda_gpu, 13, 1000, 3000, dtype, alpha=2.0, beta=0.25, kernel=SKINNY[dtype])
    # the kernel's M = 3 after the swap, N * K = 2.4M: hgemm's route does not take it, so named
    _check_half(cuda_gpu, 300, 3, 8000, dtype, layout="tn", c_order="F", kernel=SKINNY[dtype])
    _check_half(cuda_gpu, 4096, 2, 4096, dtype, layout="tn", c_order="F", alpha=0.5, beta=1.0)   # routed


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("splits", [2, 5])
def test_half_forced_splits(cuda_gpu, dtype, splits):
    kernel = SKINNY[dtype]
    _check_half(cuda_gpu, 6, 1000, 2000, dtype, kernel=kernel, params={"SPLIT_K": splits})
    _check_half(cuda_gpu, 6, 1000, 2000, dtype, kernel=kernel, params={"SPLIT_K": splits, "MR": 4}, alpha=0.5, beta=2.0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", ["cols", "rows"])
def test_half_fused_epilogues(cuda_gpu, dtype, act, bias):
    _check_half(cuda_gpu, 5, 264, 600, dtype, bias=bias, act=act, kernel=SKINNY[dtype])
    _check_half(cuda_gpu, 5, 263, 600, dtype, bias=bias, act=act, beta=0.5, kernel=SKINNY[dtype])   # element by element
    _check_half(cuda_gpu, 2, 4096, 4096, dtype, layout="tn", bias=bias, act=act)   # routed from hgemm / bgemm


def test_hgemm_untuned_calls_run_it(cuda_gpu):
    """hgemm's route sends up to four rows with an M-major A (layout tn) and a large B to the skinny
    kernel; a K-contiguous A stays on hgemm, whose catalog runs it (kernels.toml, [[hgemm.route]])."""
    from asmgemm.runtime.gemm import last_launch
    _check_half(cuda_gpu, 4, 4096, 4096, layout="tn")
    assert last_launch()["kernel"] == "hgemm_skinny" and last_launch()["splits"] > 1
    _check_half(cuda_gpu, 4, 4096, 4096, "bfloat16", layout="tn")
    assert last_launch()["kernel"] == "bgemm_skinny"
    _check_half(cuda_gpu, 5, 4096, 4096, layout="tn")
    # five rows, past the route's four: a tiled kernel, hgemm on a padded copy of A (rows of 5 halves)
    # or hgemm_mma reading it in place, as the path model decides
    assert last_launch()["kernel"] in ("hgemm", "hgemm_mma")
    _check_half(cuda_gpu, 4, 4096, 4096)
    assert last_launch()["kernel"] == "hgemm", last_launch()


# ---- TRANS_B = 1: B stored N x K (torch.nn.Linear's weight), the K-major path -------------------
# Named kernels (the routes still send only a row-major B here); every dtype at M = 1 (and the
# MR = 1, 2 blocks that exist only on this path), N = 1, K tails, B rows not 16-byte aligned (a
# sliced view: VEC_B = 0) or padded (K tails with 16-byte loads), A transposed, alpha/beta,
# split-K in clusters and through the reduce, every fused epilogue, the decode shapes of issue 32,
# and bit-identical reruns.
def _kmajor_operand(cp, x32, dtype):
    """(array handed to gemm, float64 values): x32 itself, or its 16-bit version (_half)."""
    if dtype == "float32":
        return x32, cp.asnumpy(x32).astype(np.float64)
    return _half(cp, x32, dtype)


def _check_kmajor(cp, m, n, k, dtype="float32", *, params=None, alpha=1.0, beta=0.0, ldb_pad=0, b_offset=0,
                  trans_a=False, c_order="C", bias=None, act=None, seed=0):
    """C = act(alpha A B^T + beta C + bias) through kernel=sgemm/hgemm/bgemm_skinny with trans_b=True,
    B the columns [b_offset, b_offset + K) of an N x (K + ldb_pad + b_offset) array, against float64
    of the (rounded) inputs; returns (C as float64, last_launch())."""
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.gemm import last_launch
    kernel = {"float32": "sgemm_skinny", "float16": "hgemm_skinny", "bfloat16": "bgemm_skinny"}[dtype]
    rng = cp.random.default_rng(seed + 7 * m + 13 * n + k)
    a, av = _kmajor_operand(cp, rng.standard_normal((k, m) if trans_a else (m, k), dtype=cp.float32), dtype)
    bs, bsv = _kmajor_operand(cp, rng.standard_normal((n, k + ldb_pad + b_offset), dtype=cp.float32), dtype)
    b, bv = bs[:, b_offset:b_offset + k], bsv[:, b_offset:b_offset + k]
    c0, c0v = _kmajor_operand(cp, rng.standard_normal((m, n), dtype=cp.float32), dtype)
    c = c0.copy()
    if beta == 0:                                    # NaN: never read
        if dtype == "float32":
            c[...] = cp.nan
        else:
            c.view(cp.uint16)[...] = 0x7E00 if dtype == "float16" else 0x7FC0
    if c_order == "F":
        c = cp.asfortranarray(c)
    bvec, epi = None, {}
    if bias == "cols":
        bvec, bvals = _kmajor_operand(cp, rng.standard_normal(n, dtype=cp.float32), dtype)
        epi = {"bias_cols": bvals}
    elif bias == "rows":
        bvec, bvals = _kmajor_operand(cp, rng.standard_normal((m, 1), dtype=cp.float32), dtype)
        epi = {"bias_rows": bvals.ravel()}
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=True, kernel=kernel, params=params,
                       bias=bvec, activation=act)
    assert out is c
    ran = last_launch()
    want = epilogue((av.T if trans_a else av) @ bv.T, alpha, beta, c0v if beta != 0 else None, activation=act, **epi)
    got = cp.ascontiguousarray(c)
    if dtype == "bfloat16":
        got = (got.astype(cp.uint32) << 16).view(cp.float32)
    got = cp.asnumpy(got.astype(cp.float32)).astype(np.float64)
    assert np.isfinite(got).all(), "non-finite values in C"
    err = float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))
    limit = REL_TOL if dtype == "float32" else get_spec(kernel).rel_err_limit
    assert err < limit, (f"{dtype} {m}x{n}x{k} tn={trans_a} pad={ldb_pad} off={b_offset} alpha={alpha} beta={beta} "
                         f"C {c_order} bias={bias} act={act} params={params}: rel err {err:.3e} ({ran})")
    assert ran["kernel"] == kernel and ran["params"]["TRANS_B"] == "1", ran
    return got, ran


KMAJOR_DTYPES = ["float32", "float16", "bfloat16"]


@pytest.mark.parametrize("dtype", KMAJOR_DTYPES)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16])
@pytest.mark.parametrize("n,k", [(1, 1), (1, 4096), (5, 7), (130, 300), (1000, 1029), (4099, 2049), (4096, 4096)])
def test_kmajor_rows_and_sizes(cuda_gpu, dtype, m, n, k):
    """The spec's MR for M (4, 8, 16; 16-bit: 4, 8 and two row blocks from 9 rows) and its split
    rule; K rows of odd length take the element path (ldb = K not a multiple of the vector)."""
    _check_kmajor(cuda_gpu, m, n, k, dtype)


@pytest.mark.parametrize("dtype", KMAJOR_DTYPES)
@pytest.mark.parametrize("mr", [1, 2, 4, 8, 16])
def test_kmajor_every_block_height(cuda_gpu, dtype, mr):
    """MR = 1 and 2 (decoding) exist only on this path; M below, at and past MR."""
    if mr == 16 and dtype != "float32":
        pytest.skip("MR = 16 is fp32 only")
    for m in sorted({1, max(1, mr - 1), mr, mr + 1}):
        _, ran = _check_kmajor(cuda_gpu, m, 700, 3000, dtype, params={"MR": mr}, ldb_pad=5)
        assert ran["tile"] == (mr, 32) and ran["grid"][:2] == (-(-700 // 32), -(-m // mr)), ran


@pytest.mark.parametrize("dtype", KMAJOR_DTYPES)
@pytest.mark.parametrize("ldb_pad, b_offset", [(0, 0), (1, 0), (3, 0), (8, 0), (0, 1), (5, 3)])
@pytest.mark.parametrize("k", [7, 300, 1029, 4100])
def test_kmajor_k_tails_and_unaligned_b(cuda_gpu, dtype, ldb_pad, b_offset, k):
    """16-byte loads of B wherever its rows start 16-byte aligned (ldb a multiple of the vector,
    the view aligned), then the last K % V elements by element; else B element by element."""
    _, ran = _check_kmajor(cuda_gpu, 3, 77, k, dtype, ldb_pad=ldb_pad, b_offset=b_offset, alpha=0.5, beta=-1.5)
    v = 4 if dtype == "float32" else 8
    aligned = b_offset % v == 0 and (k + ldb_pad + b_offset) % v == 0
    assert ran["params"]["VEC_B"] == str(int(aligned)), ran


@pytest.mark.parametrize("dtype", KMAJOR_DTYPES)
def test_kmajor_transposed_a_and_column_major_c(cuda_gpu, dtype):
    """A stored K x M (staged element by element); a column-major C through the operand swap: the
    kernel's B is then the user's A, M x K: K-major again (kernel M = the user's N)."""
    _check_kmajor(cuda_gpu, 5, 300, 1029, dtype, trans_a=True, alpha=2.0, beta=0.25)
    _check_kmajor(cuda_gpu, 16 if dtype == "float32" else 8, 130, 4096, dtype, trans_a=True, ldb_pad=4)
    got, ran = _check_kmajor(cuda_gpu, 300, 3, 500, dtype, c_order="F")
    assert ran["grid"][:2] == (-(-300 // 32), 1) and ran["params"]["TRANS_A"] == "0", ran


@pytest.mark.parametrize("dtype", KMAJOR_DTYPES)
@pytest.mark.parametrize("splits, cluster", [(2, None), (3, None), (7, None), (16, None), (4, 1), (8, 1)])
def test_kmajor_splits(cuda_gpu, dtype, splits, cluster):
    """k_chunk is whole 256s: K = 3000 in 7 gives 6 of 512, the last short; up to 8 splits sum in
    clusters of grid z (CLUSTER_K, on sm_90 where the spec's cluster_when holds), 16 or
    CLUSTER_K = 1 through the workspace and the reduce kernel; M = 1 (MR = 1) and 13 rows."""
    from asmgemm.runtime.gemm import last_launch
    params = {"SPLIT_K": splits, **({"CLUSTER_K": cluster} if cluster else {})}
    for m, mr in ((1, 1), (13, 16 if dtype == "float32" else 8)):
        for alpha, beta in ((1.0, 0.0), (2.0, 0.5)):
            _check_kmajor(cuda_gpu, m, 700, 3000, dtype, params={**params, "MR": mr}, alpha=alpha, beta=beta,
                          ldb_pad=1 if m == 13 else 0)
            ran = last_launch()
            assert ran["splits"] == ran["grid"][2] > 1, ran
            if cluster == 1 or splits > 8:
                assert ran["reduce"] == "kernel", ran


@pytest.mark.parametrize("dtype", KMAJOR_DTYPES)
@pytest.mark.parametrize("act", [None, "relu", "gelu", "gelu_tanh", "silu"])
@pytest.mark.parametrize("bias", [None, "cols", "rows"])
def test_kmajor_fused_epilogues(cuda_gpu, dtype, act, bias):
    """torch.nn.Linear with its bias (cols) and an activation, fused into the K-major kernel."""
    _check_kmajor(cuda_gpu, 5, 300, 600, dtype, bias=bias, act=act)
    _check_kmajor(cuda_gpu, 1, 263, 1029, dtype, bias=bias, act=act, beta=0.5, params={"MR": 1})


@pytest.mark.parametrize("dtype", KMAJOR_DTYPES)
@pytest.mark.parametrize("m,n,k", [(1, 4096, 14336), (1, 6144, 4096), (8, 4096, 4096), (16, 4096, 4096),
                                   (1, 14336, 4096), (4, 4096, 11008)])
def test_kmajor_decode_shapes_of_issue_32(cuda_gpu, dtype, m, n, k):
    """The nn.Linear decode shapes (x W^T, W stored out x in), by the spec's untuned choices for the
    named kernel and with MR = 1 at one row."""
    if m == 16 and dtype != "float32":
        m = 8
    _check_kmajor(cuda_gpu, m, n, k, dtype)
    if m == 1:
        _check_kmajor(cuda_gpu, m, n, k, dtype, params={"MR": 1, "SPLIT_K": 4})


def test_kmajor_runs_are_bit_identical(cuda_gpu):
    """Fixed summation orders (lane butterfly, ranks in order, the reduce's splits in order): two
    runs give the same bits, in clusters and through the reduce."""
    for params in ({"MR": 1, "SPLIT_K": 6}, {"MR": 1, "SPLIT_K": 6, "CLUSTER_K": 1}, {"MR": 16}):
        first, _ = _check_kmajor(cuda_gpu, 1 if params["MR"] == 1 else 16, 4096, 4096, params=params)
        again, _ = _check_kmajor(cuda_gpu, 1 if params["MR"] == 1 else 16, 4096, 4096, params=params)
        assert first.tobytes() == again.tobytes(), params
