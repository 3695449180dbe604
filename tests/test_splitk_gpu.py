"""Split-K on the GPU (sgemm.sasm SPLIT_K=1 + splitk_reduce.sasm, through asmgemm.gemm) against a
float64 reference: S in {1, 2, 3, 8} over the four layouts, K not a multiple of k_chunk, K shorter
than k_chunk * S (fewer real splits), alpha/beta (beta != 0 applied once, in the reduce), column-
major C, the decode shapes by the size rule, bit-identical repeated runs; and the reduce kernel
alone for fp32, fp16 and bf16 C. Skipped without CuPy or a GPU."""
from __future__ import annotations

import numpy as np
import pytest

import asmgemm
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime import split_k
from asmgemm.runtime.gemm import last_launch

pytestmark = pytest.mark.gpu

# fp32 accumulation in S partial sums: as accurate as the unsplit kernel (tests/test_sgemm_gpu.py)
REL_TOL = 2e-5


def _rand(cp, rng, shape):
    return rng.standard_normal(shape, dtype=cp.float32)


def _reference(cp, a, b, c0, alpha, beta, ta, tb):
    a64, b64 = a.astype(cp.float64), b.astype(cp.float64)
    out = alpha * ((a64.T if ta else a64) @ (b64.T if tb else b64))
    return out + beta * c0.astype(cp.float64) if beta != 0 else out


def _rel_err(cp, out, ref):
    assert bool(cp.isfinite(out).all()), "non-finite values in C"
    return float(cp.linalg.norm(out.astype(cp.float64) - ref)) / (float(cp.linalg.norm(ref)) or 1.0)


def _check(cp, m, n, k, layout="nn", alpha=1.0, beta=0.0, splits=None, col_major_c=False, seed=0):
    rng = cp.random.default_rng(seed + 7 * m + 13 * n + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = _rand(cp, rng, (k, m) if ta else (m, k))
    b = _rand(cp, rng, (n, k) if tb else (k, n))
    c0 = _rand(cp, rng, (m, n))
    c = c0.copy() if beta != 0 else cp.full((m, n), cp.nan, dtype=cp.float32)     # beta = 0: never read
    if col_major_c:
        c = cp.asfortranarray(c)
    params = None if splits is None else {"SPLIT_K": splits}
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, params=params)
    assert out is c
    err = _rel_err(cp, c, _reference(cp, a, b, c0, alpha, beta, ta, tb))
    assert err < REL_TOL, f"{m}x{n}x{k} {layout} S={splits} alpha={alpha} beta={beta}: rel err {err:.3e}"
    return a, b, c


@pytest.mark.parametrize("splits", [1, 2, 3, 8])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_splits_and_layouts(cuda_gpu, splits, layout):
    _check(cuda_gpu, 33, 200, 1000, layout, splits=splits)        # K = 1000: not a multiple of any k_chunk here
    _check(cuda_gpu, 130, 70, 777, layout, splits=splits)         # two tile rows, odd K, scalar loads of B


@pytest.mark.parametrize("k", [17, 40, 100])
def test_k_shorter_than_the_splits_asked(cuda_gpu, k):
    """K < 16 * S: the runtime makes fewer real splits (each at least one element deep)."""
    _check(cuda_gpu, 20, 90, k, splits=8)


@pytest.mark.parametrize("alpha,beta", [(0.5, 0.0), (1.0, 1.0), (-2.0, 0.25), (0.0, 3.0)])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_alpha_beta_applied_once(cuda_gpu, alpha, beta, layout):
    _check(cuda_gpu, 16, 300, 2048, layout, alpha=alpha, beta=beta, splits=5)


@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_column_major_c(cuda_gpu, layout):
    _check(cuda_gpu, 16, 260, 1500, layout, alpha=2.0, beta=-1.0, splits=3, col_major_c=True)
    _check(cuda_gpu, 1, 4096, 4096, layout, col_major_c=True)                      # by the rule, swapped


@pytest.mark.parametrize("m,n,k", [(1, 4096, 4096), (16, 4096, 14336), (128, 768, 3072), (128, 4096, 4096),
                                   (100, 4100, 4099), (65, 2052, 18950)])
def test_decode_shapes_split_by_the_dispatch(cuda_gpu, m, n, k):
    """Decoding and small-batch shapes (few rows, deep K): the dispatch splits K (the database's
    exact hits and the model both chose splits for these on the H100), through the reduce kernel
    or in clusters, odd sizes too; the result is right either way and last_launch() says how."""
    from asmgemm.runtime.gemm import last_launch
    _check(cuda_gpu, m, n, k)
    ran = last_launch()
    assert ran["splits"] > 1 and ran["config"] and ran["chosen_by"] in ("database", "model"), ran
    _check(cuda_gpu, m, n, k, "tn", alpha=0.5, beta=2.0)


def test_bit_identical_runs(cuda_gpu):
    cp = cuda_gpu
    a, b, c = _check(cp, 16, 4096, 14336)
    again = asmgemm.gemm(a, b)
    assert bool((again == c).all()), "two split-K runs differ"
    c3 = asmgemm.gemm(a, b, params={"SPLIT_K": 7})
    c4 = asmgemm.gemm(a, b, params={"SPLIT_K": 7})
    assert bool((c3 == c4).all())


# ---- a split summed inside clusters (sgemm.sasm CLUSTER_K = S): the same bits as the reduce ----------
@pytest.mark.parametrize("m,n,k,layout,tile", [
    (512, 768, 3072, "nn", {"THREADS": 256, "BK": 16}),     # size rule 0s's kernel, S = 5
    (130, 70, 777, "tn", {}),                                # one partial tile column, odd K, scalar B
    (127, 129, 1000, "nt", {"THREADS": 64, "BK": 16, "ASYNC": 1}),
    (300, 260, 2000, "tt", {"RQ": 4, "BK": 16, "LOAD_AHEAD": 1}),
])
@pytest.mark.parametrize("splits", [2, 5, 8])
@pytest.mark.parametrize("beta", [0.0, -0.5])
def test_cluster_sum_matches_the_reduce_kernel(cuda_gpu, m, n, k, layout, tile, splits, beta):
    """One launch of S blocks a cluster against the partial pass + splitk_reduce.sasm at the same
    split: equal bits (same k ranges, same order of the adds, same roundings), and both near the
    float64 reference; beta != 0 reads C once, beta = 0 never (C starts as NaN)."""
    cp = cuda_gpu
    rng = cp.random.default_rng(m + n + k + splits)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = _rand(cp, rng, (k, m) if ta else (m, k))
    b = _rand(cp, rng, (n, k) if tb else (k, n))
    c0 = _rand(cp, rng, (m, n))
    outs, real = {}, split_k.split_for(k, splits).splits
    for mode, extra in (("cluster", {"CLUSTER_K": splits}), ("kernel", {"CLUSTER_K": 1})):
        c = c0.copy() if beta != 0 else cp.full((m, n), cp.nan, dtype=cp.float32)
        asmgemm.gemm(a, b, c, alpha=1.5, beta=beta, trans_a=ta, trans_b=tb,
                     params={**tile, "SPLIT_K": splits, **extra})
        launch = last_launch()
        assert launch["reduce"] == mode and launch["splits"] == real, launch
        outs[mode] = c
    err = _rel_err(cp, outs["cluster"], _reference(cp, a, b, c0, 1.5, beta, ta, tb))
    assert err < REL_TOL, f"{m}x{n}x{k} {layout} S={splits}: rel err {err:.3e}"
    differ = int((outs["cluster"] != outs["kernel"]).sum())
    assert differ == 0, f"{differ} elements differ between the cluster sum and the reduce kernel"


def test_torch_tensors(cuda_gpu):
    torch = pytest.importorskip("torch")
    a = torch.randn(16, 3072, device="cuda")
    b = torch.randn(3072, 768, device="cuda")
    c = asmgemm.gemm(a, b)
    ref = a.double() @ b.double()
    assert float((c.double() - ref).norm() / ref.norm()) < REL_TOL


# ---- the reduce kernel alone: fp32, fp16, bf16 C --------------------------------------------------
def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 bit patterns, round to nearest even (what cvt.rn.bf16.f32 does for finite values)."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def _bf16_value(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


@pytest.mark.parametrize("c_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("vec", [0, 1])
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_reduce_kernel_c_types(cuda_gpu, c_dtype, vec, beta):
    from dataclasses import replace
    from asmgemm.runtime.build_cache import build_kernel
    from asmgemm.runtime.gpu import device_facts
    cp = cuda_gpu
    sgemm = get_spec("sgemm")
    spec = replace(sgemm, dtypes=replace(sgemm.dtypes, c=c_dtype))
    target = sgemm.build_target(device_facts().target)
    built = build_kernel(split_k.reduce_spec(spec), {"C_TYPE": split_k.C_TYPES[c_dtype], "VEC": vec}, target)
    fn = cp.RawModule(path=built.cubin_path).get_function(built.name)
    s, m, n, ldc = 6, 37, 520, 528
    rs = np.random.default_rng(3)
    w = rs.standard_normal((s, m, n)).astype(np.float32)
    c_host = rs.standard_normal((m, ldc)).astype(np.float32)
    if c_dtype == "float16":
        c_host = c_host.astype(np.float16)
    elif c_dtype == "bfloat16":
        c_host = _bf16_bits(c_host)
    if beta == 0:
        c_host[:, :n] = np.float16(np.nan) if c_dtype == "float16" else (0x7FC0 if c_dtype == "bfloat16" else np.nan)
    c_in = np.array(c_host)
    wd, cd = cp.asarray(w), cp.asarray(c_host)
    args = (np.uint64(wd.data.ptr), np.uint64(cd.data.ptr), np.uint32(m), np.uint32(n), np.uint32(ldc), np.uint32(s),
            np.uint64(m * n), np.float32(1.5), np.float32(beta))
    fn((-(-n // built.tile_n), m, 1), (built.threads, 1, 1), args)
    out = cp.asnumpy(cd)
    acc = w[0].copy()
    for i in range(1, s):                       # the kernel's order, in fp32
        acc += w[i]
    acc *= np.float32(1.5)
    if beta != 0:
        c_val = _bf16_value(c_in[:, :n]) if c_dtype == "bfloat16" else c_in[:, :n].astype(np.float32)
        acc = (c_val.astype(np.float64) * beta + acc).astype(np.float32)
    got = _bf16_value(out[:, :n]) if c_dtype == "bfloat16" else out[:, :n].astype(np.float32)
    tol = {"float32": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}[c_dtype]
    np.testing.assert_allclose(got, acc, rtol=tol, atol=tol)
    assert np.array_equal(out[:, n:], c_in[:, n:]), "wrote past N"
