"""The Hopper HGEMM (kernels_ptx/hgemm.sasm) on the GPU: the TMA swizzle the kernel assumes, then
fp16 and bf16 results against an fp32 reference of the same inputs over odd shapes, all layouts,
alpha/beta, column-major C and operands TMA cannot read in place. Skipped without CuPy, a GPU, or
when the GPU is not sm_90."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

# hgemm's own route (conftest.hgemm_own_path): no in-place hgemm_mma for odd operands
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hgemm_own_path")]

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402
from asmgemm.errors import AsmError  # noqa: E402
from asmgemm.kernel_spec import get_spec  # noqa: E402
from asmgemm.runtime import kept_launch  # noqa: E402
from asmgemm.runtime.gemm import last_launch  # noqa: E402
from catalog_entries import catalog_entry, entry_params  # noqa: E402
from asmgemm.runtime.gpu import device_facts  # noqa: E402

if device_facts().target != "sm_90":
    pytest.skip("the HGEMM needs an sm_90 (Hopper) GPU", allow_module_level=True)

HERE = Path(__file__).parent
KERNELS = HERE.parent / "kernels_ptx"


# ---- step 1: TMA and the 128-byte swizzle ------------------------------------------------------
def _probe_kernel(tmp_path):
    from asmgemm.pipeline import BuildOptions, assemble, build_file
    result = build_file(HERE / "data" / "hopper" / "tma_swizzle_probe.sasm",
                        BuildOptions(target="sm_90a", include_dirs=[str(KERNELS)]))
    cubin = tmp_path / "probe.cubin"
    cubin.write_bytes(assemble(result).cubin)
    return cp.RawModule(path=str(cubin)).get_function("tma_swizzle_probe")


# Box origins: the contiguous coordinate in 16-byte steps (TMA faults on others: the first run here
# with x0 = 100 halves ended in CUDA_ERROR_ILLEGAL_INSTRUCTION); (96, 190) reaches past both edges.
@pytest.mark.parametrize("x0,y0", [(0, 0), (64, 8), (96, 190)])
def test_tma_box_lands_in_the_128_byte_swizzle(tmp_path, x0, y0):
    """A {64, 64} fp16 box loaded by TMA (runtime/tensor_map.py's map) lands in shared memory as
    hopper.inc says: smem row r, 16-byte chunk j holds matrix row y0 + r, chunk j ^ (r % 8); what
    lies outside the matrix reads as zero."""
    from asmgemm.runtime.tensor_map import encode, tile_map
    rows, cols = 200, 136                               # row stride 272 bytes: a multiple of 16
    bits = cp.arange(rows * cols, dtype=cp.uint16).reshape(rows, cols)
    fn = _probe_kernel(tmp_path)
    out = cp.zeros(64 * 64, dtype=cp.uint16)
    tmap = encode(tile_map("A", bits.data.ptr, "float16", rows, cols, cols, 64))
    fn((1, 1, 1), (128, 1, 1), (tmap, np.int32(x0), np.int32(y0), out), shared_mem=64 * 128 + 2048)
    got = cp.asnumpy(out).reshape(64, 8, 8)             # [smem row][16-byte chunk][half]
    host = cp.asnumpy(bits)
    for r in range(64):
        for j in range(8):
            src = j ^ (r % 8)
            want = np.zeros(8, dtype=np.uint16)
            y, x = y0 + r, x0 + 8 * src
            if y < rows:
                seg = host[y, x:min(x + 8, cols)]
                want[:len(seg)] = seg
            assert (got[r, j] == want).all(), f"smem row {r} chunk {j}: {got[r, j]} != {want}"


# ---- the GEMM ------------------------------------------------------------------------------------
def _bf16_bits(x32):
    """fp32 CuPy array -> bfloat16 bit patterns (round to nearest even), and their fp32 values."""
    u = x32.view(cp.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    bits = rounded.astype(cp.uint16)
    return bits, (bits.astype(cp.uint32) << 16).view(cp.float32)


def _operand(rng, shape, dtype, ld_pad=0):
    """(array handed to gemm, its fp32 values). ld_pad > 0: a strided view, rows ld_pad apart."""
    x32 = rng.standard_normal(shape, dtype=cp.float32)
    if dtype == "bfloat16":
        x, v = _bf16_bits(x32)
    else:
        x = x32.astype(cp.float16)
        v = x.astype(cp.float32)
    if ld_pad:
        big = cp.zeros((shape[0], ld_pad), dtype=x.dtype)
        big[:, :shape[1]] = x
        x = big[:, :shape[1]]
    return x, v


def _values(c, dtype):
    return (c.astype(cp.uint32) << 16).view(cp.float32) if dtype == "bfloat16" else c.astype(cp.float32)


def _check(m, n, k, layout="nn", dtype="float16", alpha=1.0, beta=0.0, c_order="C", pad=False, seed=0, params=None):
    rng = cp.random.default_rng(seed + 7 * m + 13 * n + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a_shape, b_shape = ((k, m) if ta else (m, k)), ((n, k) if tb else (k, n))
    a, av = _operand(rng, a_shape, dtype, ld_pad=(a_shape[1] + 8 - a_shape[1] % 8) if pad else 0)
    b, bv = _operand(rng, b_shape, dtype, ld_pad=(b_shape[1] + 8 - b_shape[1] % 8) if pad else 0)
    c0, c0v = _operand(rng, (m, n), dtype)
    if c_order == "F":
        c = cp.asfortranarray(c0)
    else:
        c = c0.copy()
    if beta == 0:
        c.view(cp.uint16)[...] = 0x7E00 if dtype == "float16" else 0x7FC0   # NaN: beta = 0 must not read C
    # named, and hgemm's own route (the module's fixture): odd operands are copied or loaded by A_LDG
    kernel = "bgemm" if dtype == "bfloat16" else "hgemm"
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, kernel=kernel, params=params)
    assert out is c
    ref = alpha * ((av.T if ta else av) @ (bv.T if tb else bv))
    if beta != 0:
        ref = ref + beta * c0v
    got = _values(cp.ascontiguousarray(c), dtype)
    assert bool(cp.isfinite(got).all()), "non-finite values in C"
    err = float(cp.linalg.norm(got - ref)) / (float(cp.linalg.norm(ref)) or 1.0)
    limit = get_spec(kernel or "hgemm").rel_err_limit
    assert err < limit, f"{dtype} {m}x{n}x{k} {layout} alpha={alpha} beta={beta} C {c_order}: rel err {err:.3e}"


SHAPES = [(1, 1, 1), (7, 7, 7), (127, 127, 127), (129, 129, 129), (1000, 1000, 1000), (3000, 5000, 700),
          (300, 200, 1), (1, 300, 257), (300, 1, 257), (130, 250, 9), (256, 512, 4096), (200, 300, 100)]


@pytest.mark.parametrize("m,n,k", SHAPES)
def test_fp16_shapes_nn(m, n, k):
    _check(m, n, k)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k", [(129, 257, 200), (1000, 520, 136), (64, 64, 64)])
def test_fp16_layouts(layout, m, n, k):
    _check(m, n, k, layout)


@pytest.mark.parametrize("m,n,k,layout,dtype", [(592, 6656, 5456, "tn", "float16"), (544, 9120, 4400, "nt", "bfloat16"),
                                                 (4272, 176, 1120, "nt", "float16"), (3248, 304, 904, "nn", "bfloat16")])
def test_large_odd_shapes_untuned_with_beta(m, n, k, layout, dtype):
    """Large calls whose M and K are no multiple of any tile (N in three of them), in three layouts
    and both dtypes, with alpha and beta: whichever configuration the cost model picks gives the
    reference C."""
    _check(m, n, k, layout, dtype=dtype, alpha=0.5, beta=0.25)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_bf16_layouts(layout):
    _check(333, 517, 300, layout, dtype="bfloat16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_alpha_beta(dtype):
    _check(300, 260, 150, "nn", dtype=dtype, alpha=0.5, beta=-1.5)
    _check(300, 260, 150, "tn", dtype=dtype, alpha=2.0, beta=0.25)


@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_column_major_c(layout):
    _check(257, 130, 96, layout, c_order="F")
    _check(257, 130, 96, layout, c_order="F", beta=1.0)


def test_strided_views_with_aligned_rows():
    _check(127, 129, 65, "nn", pad=True)
    _check(127, 129, 65, "tt", pad=True)


def test_odd_leading_dimensions_are_copied_not_refused():
    """Rows TMA cannot read (tensor_map.py) are copied to padded rows first: B's of 61 halves (A
    stored transposed, rows of 104 halves: read in place), and a K-major A's of 65 (deeper than
    one K tile: no A_LDG)."""
    _check(104, 61, 7, "tn")
    assert last_launch()["copies"] == ("B",) and not last_launch()["a_ldg"]
    _check(100, 64, 65, "nn")
    assert last_launch()["copies"] == ("A",) and not last_launch()["a_ldg"]


@pytest.mark.parametrize("view", ["rows", "strided_rows", "column_major"])
def test_padded_copies_of_views(view):
    """An operand TMA cannot read is copied by one launch of pad_rows where its rows are runs (509 halves,
    contiguous or 517 apart) or elementwise otherwise (a column-major A whose columns are 300
    halves apart); the GEMM is that of the view either way. On a non-blocking stream, inputs
    written on it: the copy must run on the launch's stream, after them."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        rng = cp.random.default_rng(31)
        base = rng.standard_normal((300, 517), dtype=cp.float32).astype(cp.float16)
        a = {"rows": lambda: base[:, :509].copy(), "strided_rows": lambda: base[:, :509],
             "column_major": lambda: cp.asfortranarray(base[:, :509])}[view]()
        b = rng.standard_normal((509, 640), dtype=cp.float32).astype(cp.float16)
        c = asmgemm.gemm(a, b, kernel="hgemm")
        ref = a.astype(cp.float32) @ b.astype(cp.float32)
        err = cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref)
    stream.synchronize()
    assert last_launch()["copies"] == ("A",), last_launch()
    assert float(err) < 2e-3


# K-major A whose rows TMA cannot address, K <= 64: the consumers load A themselves (A_LDG, call value
# a_ldg), no padded copy. K = 1, 7, 9, 31, 33 (the second round of loads), 63; edges in M and N; 
# a strided A of 72 halves (rows 144 bytes: aligned) against one of 71; M = 129 (a tile's one row).
@pytest.mark.parametrize("m,n,k", [(100, 60, 7), (300, 200, 1), (130, 250, 9), (2048, 2048, 31), (129, 520, 33),
                                   (515, 1000, 63), (7, 7, 7)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_k_major_a_with_unaligned_rows_is_loaded_by_the_kernel(m, n, k, dtype):
    _check(m, n, k, dtype=dtype)
    ran = last_launch()
    if not ran["c_trans"]:
        assert ran["a_ldg"] and "A" not in ran["copies"], ran
    _check(m, n, k, dtype=dtype, alpha=0.5, beta=-1.5, seed=1, params={"C_T": 0})
    ran = last_launch()
    assert ran["a_ldg"] and "A" not in ran["copies"] and not ran["c_trans"], ran


@pytest.mark.parametrize("params", [{"C_T": 0}, {"BN": 128, "CLUSTER_M": 2, "C_T": 0},
                                    {"BN": 64, "CLUSTER_M": 1, "CLUSTER_K": 2, "C_T": 0},
                                    {"BN": 192, "MMA_IN_FLIGHT": 2, "C_T": 0}])
def test_a_loaded_by_the_kernel_in_other_tilings(params):
    """A_LDG with a cluster sharing B, split K inside a cluster (K slices of one tile each) and the
    other wgmma grouping; an A strided 71 halves apart (K = 40), and a column-major C (the swap)."""
    rng = cp.random.default_rng(5)
    big = rng.standard_normal((600, 71), dtype=cp.float32).astype(cp.float16)
    a = big[:, :40]
    b = rng.standard_normal((40, 336), dtype=cp.float32).astype(cp.float16)
    c = cp.empty((600, 336), dtype=cp.float16)
    asmgemm.gemm(a, b, c, params=params)
    ref = a.astype(cp.float32) @ b.astype(cp.float32)
    assert float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref)) < 2e-3
    assert last_launch()["a_ldg"] and last_launch()["copies"] == ()
    _check(257, 130, 55, c_order="F", params=params)


@pytest.mark.parametrize("kernel,c_dtype", [("hgemm_f32c", "float32"), ("hgemm", "float16")])
def test_a_loaded_by_the_kernel_with_a_fused_epilogue(kernel, c_dtype):
    # unswapped (C_T = 0): as C^T the user's A is the kernel's B, which TMA reads from a padded copy
    ran = _check_bias_activation(kernel, c_dtype, (1500, 512, 31), "gelu", 9, params={"C_T": 0})
    assert ran["a_ldg"] and not ran["c_trans"], ran


def _check_bias_activation(kernel, c_dtype, shape, activation, seed, params=None):
    """fp16 A (M x K) and B (K x N), a bias per column of C's dtype and an activation, against the
    float64 reference; the kernel that ran is `kernel`. Returns last_launch()."""
    m, n, k = shape
    rng = cp.random.default_rng(seed)
    a = rng.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal((k, n), dtype=cp.float32).astype(cp.float16)
    bias = rng.standard_normal(n, dtype=cp.float32).astype(c_dtype)
    c = asmgemm.gemm(a, b, cp.empty((m, n), dtype=c_dtype), bias=bias, activation=activation, params=params,
                     kernel=kernel)
    from epilogue_reference import epilogue
    acc = (a.astype(cp.float64) @ b.astype(cp.float64)).get()
    ref = epilogue(acc, 1.0, 0.0, None, bias_cols=bias.get(), activation=activation)
    got = c.astype(cp.float64).get()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < get_spec(kernel).rel_err_limit
    ran = last_launch()
    assert ran["kernel"] == kernel, ran
    return ran


def _check_tile_shape(layout, params):
    """One tile configuration over edges in M, N and K, bf16, alpha/beta and a column-major C."""
    _check(515, 1000, 300, layout, params=params)
    _check(130, 385, 129, layout, dtype="bfloat16", params=params)
    _check(257, 200, 96, layout, alpha=0.5, beta=-1.5, params=params)
    _check(257, 200, 96, layout, c_order="F", params=params)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("cluster", [1, 2])
def test_192_wide_tiles(layout, cluster):
    """BN=192: three 64-column chunks of B, which a cluster's two blocks load by halves of their
    k-rows (N-major B) or 96 rows each (K-major); edges in M, N and K, bf16, beta, column-major C."""
    params = {"BN": 192, "STAGES": 4, "CLUSTER_M": cluster}
    _check_tile_shape(layout, params)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("cluster", [1, 2])
def test_96_wide_tiles(layout, cluster):
    """BN=96: N-major B as two 64-column chunks, the second half used (a cluster's blocks load one
    each); K-major B 96 rows (48 each); a 16-bit C by pairs; edges, bf16, beta, column-major C."""
    _check_tile_shape(layout, {"BN": 96, "STAGES": 6, "CLUSTER_M": cluster})


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_128x96_tiles_in_pairs_for_an_fp32_c(dtype, layout):
    """The catalog's t128x96_cm2 (128 x 96 tiles in pairs of tile rows sharing B, the width for an
    fp32 C whose staged tile is twice the bytes), forced: the last tile row and column partly
    outside C, K no multiple of 64; beta = 0 through the staged TMA store (C poisoned first), beta != 0
    through the pairs; then a bias per column on the staged path."""
    rng = cp.random.default_rng(96)
    m, n, k = 500, 3000, 700
    ta, tb = layout[0] == "t", layout[1] == "t"
    a, av = _operand(rng, (k, m) if ta else (m, k), dtype)
    b, bv = _operand(rng, (n, k) if tb else (k, n), dtype)
    kernel = "bgemm_f32c" if dtype == "bfloat16" else "hgemm_f32c"
    params = entry_params("t128x96_cm2", kernel)
    prod = (av.T if ta else av) @ (bv.T if tb else bv)
    c0 = rng.standard_normal((m, n), dtype=cp.float32)
    limit = get_spec(kernel).rel_err_limit
    for beta in (0.0, 0.5):
        c = c0.copy() if beta else cp.full((m, n), cp.nan, dtype=cp.float32)
        asmgemm.gemm(a, b, c, alpha=0.75, beta=beta, trans_a=ta, trans_b=tb, kernel=kernel, params=params)
        ran = last_launch()
        assert ran["tile"] == (128, 96) and ran["cluster"] == 2 and ran["splits"] == 1, ran
        ref = 0.75 * prod + (beta * c0 if beta else 0)
        err = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
        assert err < limit, (beta, err)
    if dtype == "float16" and layout == "nn":
        bias = rng.standard_normal(n, dtype=cp.float32)
        c = asmgemm.gemm(a, b, cp.full((m, n), cp.nan, dtype=cp.float32), bias=bias, kernel=kernel, params=params)
        assert last_launch()["tile"] == (128, 96) and last_launch()["cluster"] == 2
        ref = prod + bias[None, :]
        assert float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref)) < limit


@pytest.mark.parametrize("shape,entry,cluster", [((512, 4608, 3584), "t128x192_cm2", 2),
                                                ((4096, 2304, 768), "t128x192", 1)])
def test_192_wide_tiles_over_many_full_tiles(shape, entry, cluster):
    """The catalog's 192-wide tiles, forced on shapes of whole tiles: t128x192_cm2 (pairs of tile
    rows sharing B) over 96 tiles at deep K (56 K tiles), t128x192 over 384 tiles, about three a
    block in the persistent walk (test_192_wide_tiles has the edges)."""
    _check(*shape, params=entry_params(entry))
    ran = last_launch()
    assert ran["kernel"] == "hgemm" and ran["tile"] == (128, 192) and ran["cluster"] == cluster, ran


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("cluster", [1, 2])
def test_64_wide_tiles(layout, cluster):
    """BN=64 with either B orientation: one 64-column chunk of N-major B (a cluster's two blocks load
    half its k-rows each), 64 rows of K-major B; edges, bf16, beta, column-major C, wide stores."""
    params = {"BN": 64, "STAGES": 8, "CLUSTER_M": cluster, "C_T": 0}
    _check_tile_shape(layout, params)


@pytest.mark.parametrize("shape", [(768, 768, 1536), (1024, 1024, 64)])
def test_128x64_tiles_in_one_wave(shape):
    """The catalog's t128x64 (128 x 64 tiles, 8 stages, groups of 4 tile rows), forced where its
    tiles make one wave: 72 tiles at K = 1536, and 128 tiles of a single K step (K = 64)."""
    _check(*shape, params=entry_params("t128x64"))
    ran = last_launch()
    assert ran["tile"] == (128, 64) and not ran["c_trans"] and ran["cluster"] == 1, ran


@pytest.mark.parametrize("shape,layout,dtype", [((1024, 1024, 1024), "nn", "float16"), ((1009, 1013, 1019), "nn", "float16"),
                                                ((896, 1024, 1024), "tt", "bfloat16"), ((1024, 1024, 512), "tn", "float16")])
def test_64x128_tiles_in_pairs(shape, layout, dtype):
    """The catalog's t64x128_cm2 (64 x 128 tiles, one consumer warpgroup, in pairs of tile rows
    sharing B), forced where its tiles make one wave of 112-128: the last tiles partly outside M and
    N at 1009x1013 (nn: A's rows of 1019 halves are copied to a 128-byte pitch), 14 tile rows at M =
    896; with beta, and a fused bias + relu into an fp32 C."""
    _check(*shape, layout=layout, dtype=dtype, beta=0.5, params=entry_params("t64x128_cm2"))
    ran = last_launch()
    assert ran["tile"] == (64, 128) and not ran["c_trans"] and ran["cluster"] == 2, ran
    with_fp32_c = _check_bias_activation("hgemm_f32c", "float32", shape, "relu", 21,
                                         params=entry_params("t64x128_cm2", "hgemm_f32c"))
    assert with_fp32_c["tile"] == (64, 128) and with_fp32_c["cluster"] == 2, with_fp32_c


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_128_wide_tiles_in_clusters(layout):
    """BN=128 with CLUSTER_M=2 (the catalog's t128x128_cm2): each block of a cluster loads one of B's
    two 64-column chunks (N-major) or 64 of its rows (K-major) into both; edges, bf16, beta,
    column-major C."""
    _check_tile_shape(layout, entry_params("t128x128_cm2"))


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("bn,cluster_m", [(64, 1), (128, 2), (192, 1), (256, 2)])
def test_tiles_sharing_a_in_clusters(layout, bn, cluster_m):
    """CLUSTER_N=2: the two blocks of a tile row each load 64 of A's 128 rows (K-major A) or one of its
    two 64-wide chunks (M-major) into both; with CLUSTER_M=2 too, 2 x 2 tiles of 4 blocks whose B is
    shared down the columns. Edges, bf16, beta, column-major C, an odd count of tile columns (330)
    and a partner block wholly right of N (BN=256 at N=200)."""
    params = {"BN": bn, "STAGES": 4 if bn >= 192 else 6, "CLUSTER_M": cluster_m, "CLUSTER_N": 2, "C_T": 0}
    _check_tile_shape(layout, params)
    _check(300, 330, 200, layout, params=params)
    assert last_launch()["cluster"] == 2 * cluster_m


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("cluster_m,cluster_n", [(4, 1), (1, 2), (2, 2), (4, 2)])
def test_64_row_tiles_in_clusters_of_up_to_eight(layout, cluster_m, cluster_n):
    """64 x 64 tiles (one consumer) in units of CLUSTER_M x CLUSTER_N tiles: each block loads a
    quarter (CLUSTER_M = 4: 16 k-rows of N-major B, 16 rows of K-major B) or a half of B, and half
    of A (32 rows of K-major A, 32 k-rows of M-major A's one chunk) into every block sharing it.
    Edges in M, N and K, bf16, alpha/beta, column-major C; 300 x 330 leaves whole blocks of a unit
    outside M and N."""
    params = {"BN": 64, "STAGES": 13, "CONSUMERS": 1, "MMA_IN_FLIGHT": 1, "CLUSTER_M": cluster_m,
              "CLUSTER_N": cluster_n, "C_T": 0}
    _check_tile_shape(layout, params)
    _check(300, 330, 200, layout, params=params)
    ran = last_launch()
    assert ran["cluster"] == cluster_m * cluster_n and ran["tile"] == (64, 64), ran


def test_a_persistent_grid_holds_no_more_clusters_than_the_gpu_runs_at_once():
    """Clusters of 8 (4 x 2 tiles of 64 x 64) over 128 units: the grid is the driver's count of
    such clusters that fit at once (cuOccupancyMaxActiveClusters), at most SMs / 8; correct."""
    from asmgemm.runtime import cluster_capacity
    params = {"BN": 64, "STAGES": 13, "CONSUMERS": 1, "MMA_IN_FLIGHT": 1, "CLUSTER_M": 4, "CLUSTER_N": 2, "C_T": 0}
    _check(2048, 2048, 512, params=params)
    ran, kept = last_launch(), kept_launch._last_launch[0]
    cap = cluster_capacity.max_active_clusters(kept.fn, kept.built, cp.cuda.Device().id)
    sms = device_facts().sm_count
    assert cap is not None and 1 <= cap <= sms // 8, cap
    assert ran["cluster"] == 8 and ran["grid"] == (min(128, sms // 8, cap) * 8, 1, 1), (ran, cap)


@pytest.mark.parametrize("shape,layout,dtype,entry", [
    ((512, 768, 3072), "nn", "float16", "t64x64_cm4"), ((512, 896, 2048), "nn", "bfloat16", "t64x64_cm4"),
    ((500, 768, 3000), "nn", "float16", "t64x64_cm2cn2"), ((712, 500, 3000), "tn", "bfloat16", "t64x64_cm2cn2"),
    ((300, 1000, 3000), "tt", "float16", "t64x64_cm2cn2")])
def test_64x64_tiles_in_clusters_of_four(shape, layout, dtype, entry):
    """The catalog's 64 x 64 tiles in clusters of four, forced at deep K: t64x64_cm4 (four tile rows
    sharing B, 13 stages) with A's rows on 128-byte lines, eight tile rows; t64x64_cm2cn2 (2 x 2
    tiles sharing A and B) with A's rows of 3000 or, stored K x M, 712 halves (16-byte but not
    128-byte multiples: most box rows cost two L2 lines), 300 rows leaving the last unit half
    outside M and 500 columns the last tile column partly outside N. With beta, and a fused bias +
    relu into an fp32 C."""
    _check(*shape, layout=layout, dtype=dtype, alpha=0.5, beta=-1.5, params=entry_params(entry))
    ran = last_launch()
    assert ran["tile"] == (64, 64) and ran["cluster"] == 4 and ran["splits"] == 1 and not ran["c_trans"], ran
    with_fp32_c = _check_bias_activation("hgemm_f32c", "float32", shape, "relu", 23,
                                         params=entry_params(entry, "hgemm_f32c"))
    assert with_fp32_c["tile"] == (64, 64) and with_fp32_c["cluster"] == 4, with_fp32_c


@pytest.mark.parametrize("kernel,c_dtype,n", [("hgemm_f32c", "float32", 999), ("hgemm", "float16", 1000)])
def test_tiles_sharing_a_with_a_fused_epilogue(kernel, c_dtype, n):
    """A bias and gelu behind CLUSTER_N=2: an fp32 C of odd width (pair stores) and a 16-bit C of
    16-byte rows (staged; the activation warps)."""
    ran = _check_bias_activation(kernel, c_dtype, (1000, n, 520), "gelu", 11,
                                 params={"BN": 64, "STAGES": 8, "CLUSTER_M": 1, "CLUSTER_N": 2})
    assert ran["cluster"] == 2


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("tiling", [{"BN": 64, "STAGES": 8, "CLUSTER_M": 1}, {"BN": 128, "STAGES": 8, "CLUSTER_M": 2},
                                    {"BN": 192, "STAGES": 6, "CLUSTER_M": 1}, {"BN": 256, "STAGES": 4, "CLUSTER_M": 2},
                                    {"BN": 128, "STAGES": 8, "CLUSTER_M": 1, "CLUSTER_K": 2},
                                    {"BN": 64, "STAGES": 8, "CLUSTER_M": 1, "CLUSTER_K": 4},
                                    {"BN": 64, "STAGES": 8, "CLUSTER_M": 1, "MMA_IN_FLIGHT": 1},
                                    {"BN": 64, "STAGES": 10, "CLUSTER_M": 2, "MMA_IN_FLIGHT": 1}],
                         ids=["64", "128-cm2", "192", "256-cm2", "128-ck2", "64-ck4", "64-mif1", "64-cm2-mif1"])
def test_64_row_tiles(layout, tiling):
    """CONSUMERS=1: one consumer warpgroup, 64 x BN tiles, 256 threads; with B shared in clusters,
    and K split in clusters (the 4 consumer warps' rows dealt out 2 or 4 ways). Edges in M (a last
    tile row of 3 rows at M = 515), N and K, bf16, beta, column-major C."""
    params = {**tiling, "CONSUMERS": 1, "C_T": 0}
    _check_tile_shape(layout, params)
    ran = last_launch()
    assert ran["tile"][0] == 64, ran


@pytest.mark.parametrize("kernel,c_dtype,n", [("hgemm_f32c", "float32", 999), ("hgemm", "float16", 1000),
                                              ("hgemm_f32c", "float32", 1000)])
def test_64_row_tiles_with_a_fused_epilogue(kernel, c_dtype, n):
    """A bias and gelu_tanh on 64-row tiles: pair stores (fp32 C, odd width), the activation warps
    (16-bit C of 16-byte rows), and the fp32 C's pair path beside a staged width."""
    ran = _check_bias_activation(kernel, c_dtype, (515, n, 700), "gelu_tanh", 12,
                                 params={"BN": 128, "STAGES": 6, "CLUSTER_M": 1, "CONSUMERS": 1})
    assert ran["tile"] == (64, 128)


@pytest.mark.parametrize("shape,entry,tile", [
    ((512, 768, 3072), "t64x64", (64, 64)), ((384, 768, 3072), "t64x64", (64, 64)),
    ((512, 1024, 2048), "t64x64_cm2", (64, 64)), ((16, 768, 768), "ct_t64x16_st", (64, 16)),
    ((127, 129, 1000), "ct_t64x16_st", (64, 16)), ((100, 700, 900), "ct_t64x16_st", (64, 16)),
    ((512, 768, 768), "ct_t64x64_st", (64, 64)), ((100, 3000, 700), "ct_t64x64_st", (64, 64))])
def test_64_row_tile_entries(shape, entry, tile):
    """The catalog's 64-row tiles (one consumer warpgroup, one wgmma group in flight), forced:
    t64x64 and t64x64_cm2 unswapped over 72-128 tiles at deep K; as C^T, ct_t64x16_st at short K
    over one to eight kernel tile columns of 16 user rows (127: the last one partly outside), and
    ct_t64x64_st into 512 or 100 user rows (100: the kernel's second tile column partly outside its
    N). fp16, then bf16 with alpha/beta."""
    params = entry_params(entry)
    _check(*shape, params=params)
    _check(*shape, dtype="bfloat16", alpha=0.5, beta=-1.5, params=params)
    ran = last_launch()
    assert ran["tile"] == tile and ran["splits"] == 1 and ran["c_trans"] == catalog_entry(entry).swap, ran


@pytest.mark.parametrize("layout", ["nn", "tn", "tt"])
def test_64x192_tiles_in_pairs_at_short_k(layout):
    """The catalog's t64x192_cm2 (64 x 192 tiles, one consumer, eight tile rows in pairs sharing B
    and leaving through the producer's tail), forced where its 96 tiles make one wave: K = 768 and
    1000 (no multiple of 64), fp16 and bf16, alpha/beta (test_64x192_tiles_in_pairs_with_a_fused_epilogue
    adds a fused bias + gelu into fp16, the activation warps, and into an fp32 C)."""
    params = entry_params("t64x192_cm2")
    _check(512, 2304, 768, layout, params=params)
    _check(512, 2304, 1000, layout, dtype="bfloat16", alpha=0.5, beta=-1.5, params=params)
    ran = last_launch()
    assert ran["tile"] == (64, 192) and ran["splits"] == 1 and ran["cluster"] == 2 and not ran["c_trans"], ran


@pytest.mark.parametrize("shape,dtype", [((100, 16384, 1536), "float16"), ((128, 12288, 4096), "bfloat16"),
                                         ((77, 9000, 2000), "float16")])
def test_128x128_tiles_stream_b_for_one_tile_row(shape, dtype):
    """The catalog's t128x128_st (STREAM=1), forced on one tile row of 128 x 128 tiles, 77 to 128
    rows: the kernel finds B read once by its tile counts and loads it evict-first; the last tile
    column partly outside N where N is no multiple of 128, with beta."""
    _check(*shape, dtype=dtype, beta=0.25, params=entry_params("t128x128_st"))
    ran = last_launch()
    assert ran["params"]["STREAM"] == "1", ran
    assert ran["tile"] == (128, 128) and ran["cluster"] == 1 and ran["splits"] == 1 and not ran["c_trans"], ran


@pytest.mark.parametrize("kernel,c_dtype", [("hgemm", "float16"), ("hgemm_f32c", "float32")])
def test_64x192_tiles_in_pairs_with_a_fused_epilogue(kernel, c_dtype):
    ran = _check_bias_activation(kernel, c_dtype, (512, 2304, 768), "gelu", 14,
                                 params=entry_params("t64x192_cm2", kernel))
    assert ran["tile"] == (64, 192) and ran["cluster"] == 2, ran


def test_64_row_tiles_load_a_misaligned_a_themselves():
    """A_LDG (K = 40, rows 71 halves apart) with one consumer: it fills its 64 rows alone."""
    rng = cp.random.default_rng(13)
    a = rng.standard_normal((600, 71), dtype=cp.float32).astype(cp.float16)[:, :40]
    b = rng.standard_normal((40, 336), dtype=cp.float32).astype(cp.float16)
    c = asmgemm.gemm(a, b, cp.empty((600, 336), dtype=cp.float16),
                     params={"BN": 64, "STAGES": 8, "CLUSTER_M": 1, "CONSUMERS": 1, "C_T": 0})
    ref = a.astype(cp.float32) @ b.astype(cp.float32)
    assert float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref)) < 2e-3
    assert last_launch()["a_ldg"] and last_launch()["tile"] == (64, 64)


@pytest.mark.parametrize("shape,dtype", [((512, 4096, 4096), "float16"), ((500, 3584, 8200), "float16"),
                                         ((512, 4096, 11008), "bfloat16")])
def test_128x128_tiles_in_pairs_at_deep_k(shape, dtype):
    """The catalog's t128x128_cm2 (128 x 128 tiles in clusters of two tile rows sharing B), forced
    where four tile rows of its tiles make about one wave at K = 4096 to 11008, unsplit: the last
    row of 500 partly outside M, K = 8200 no multiple of 64."""
    _check(*shape, dtype=dtype, params=entry_params("t128x128_cm2"))
    ran = last_launch()
    assert ran["tile"] == (128, 128) and ran["cluster"] == 2 and ran["splits"] == 1 and not ran["c_trans"], ran


@pytest.mark.parametrize("k", [16, 7])
def test_128x128_tiles_for_an_fp32_c_at_tiny_k(k):
    """The catalog's t128x128, forced for an fp32 C at K <= 64, where the GEMM is its C stores
    (staged and stored by TMA, C poisoned first): 256 tiles, two waves; K = 7: A loaded by the
    consumers."""
    rng = cp.random.default_rng(41 + k)
    a = rng.standard_normal((2048, k), dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal((k, 2000), dtype=cp.float32).astype(cp.float16)
    c = asmgemm.gemm(a, b, cp.full((2048, 2000), cp.nan, dtype=cp.float32),
                     params=entry_params("t128x128", "hgemm_f32c"))
    ran = last_launch()
    assert ran["kernel"] == "hgemm_f32c" and ran["tile"] == (128, 128) and ran["cluster"] == 1, ran
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    assert float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref)) < get_spec("hgemm_f32c").rel_err_limit


@pytest.mark.parametrize("k,dtype", [(16, "float16"), (40, "float16"), (8, "bfloat16"), (64, "bfloat16")])
def test_128x128_tiles_for_a_16_bit_c_at_tiny_k(k, dtype):
    """The catalog's t128x128, forced for a 16-bit C at K <= 64 with A read by TMA: its tiles staged
    and stored by TMA (beta = 0, C poisoned first) or by pairs (beta != 0); and t128x256 (128 x 256
    tiles, unclustered) at K = 31, A (rows of 31 halves) loaded by the consumers."""
    for alpha, beta in ((1.0, 0.0), (0.5, -1.5)):
        _check(2048, 2000, k, dtype=dtype, alpha=alpha, beta=beta, params=entry_params("t128x128"))
        ran = last_launch()
        assert ran["tile"] == (128, 128) and ran["cluster"] == 1 and ran["splits"] == 1, ran
    _check(2048, 2000, 31, dtype=dtype, params=entry_params("t128x256"))
    assert last_launch()["tile"] == (128, 256) and last_launch()["a_ldg"], last_launch()


def test_large_square():
    _check(2048, 2048, 2048)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nn", "tn"])
def test_64x256_tiles_for_an_fp32_c_by_pairs(dtype, layout):
    """The catalog's t64x256 (one consumer, one wgmma group in flight), forced for an fp32 C of rows
    that are no whole 16-byte pieces (N = 4093: the pair stores) over about 8 waves of tiles, the
    last tile row and column partly outside C, K = 509: alpha/beta, fp16 and bf16 operands; and a
    fused bias + gelu_tanh."""
    rng = cp.random.default_rng(15)
    m, n, k = 4099, 4093, 509
    ta = layout[0] == "t"
    a, av = _operand(rng, (k, m) if ta else (m, k), dtype)
    b, bv = _operand(rng, (k, n), dtype)
    c0 = rng.standard_normal((m, n), dtype=cp.float32)
    ref = 0.75 * ((av.T if ta else av) @ bv) + 0.5 * c0
    kernel = "bgemm_f32c" if dtype == "bfloat16" else "hgemm_f32c"
    c = c0.copy()
    asmgemm.gemm(a, b, c, alpha=0.75, beta=0.5, trans_a=ta, kernel=kernel, params=entry_params("t64x256", kernel))
    err = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
    assert err < get_spec(kernel).rel_err_limit, err
    assert last_launch()["tile"] == (64, 256), last_launch()
    if dtype == "float16" and layout == "nn":
        ran = _check_bias_activation("hgemm_f32c", "float32", (m, n, k), "gelu_tanh", 16,
                                     params=entry_params("t64x256", "hgemm_f32c"))
        assert ran["tile"] == (64, 256), ran


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_fp32_c_from_16_bit_operands(dtype, layout):
    """C float32 picks hgemm_f32c / bgemm_f32c: alpha * op(A) op(B) + beta * C in fp32, no rounding to 16 bits."""
    rng = cp.random.default_rng(5)
    m, n, k = 257, 130, 200
    ta, tb = layout[0] == "t", layout[1] == "t"
    a, av = _operand(rng, (k, m) if ta else (m, k), dtype)
    b, bv = _operand(rng, (n, k) if tb else (k, n), dtype)
    c0 = rng.standard_normal((m, n), dtype=cp.float32)
    ref = 1.5 * ((av.T if ta else av) @ (bv.T if tb else bv)) - 0.5 * c0
    kernel = "bgemm_f32c" if dtype == "bfloat16" else None
    c = c0.copy()
    out = asmgemm.gemm(a, b, c, alpha=1.5, beta=-0.5, trans_a=ta, trans_b=tb, kernel=kernel)
    assert out is c and c.dtype == cp.float32
    err = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
    assert err < get_spec(kernel or "hgemm_f32c").rel_err_limit, err
    if dtype == "float16":                       # a new C: float32 when the kernel is named
        new = asmgemm.gemm(a, b, trans_a=ta, trans_b=tb, kernel="hgemm_f32c")
        assert new.dtype == cp.float32
        prod = (av.T if ta else av) @ (bv.T if tb else bv)
        assert float(cp.linalg.norm(new - prod) / cp.linalg.norm(prod)) < get_spec("hgemm_f32c").rel_err_limit


# An fp32 C with whole 16-byte rows (N, ldc multiples of 4, beta = 0) is staged in 64 x 32 boxes of
# floats and stored by TMA (hgemm.sasm STAGED_C with C_F32), in rounds where the tile has more boxes
# than the buffer holds. Edges in M and N (N = 300: the last box partly outside), every tile width,
# both kernels, a bias, a strided C (ldc 308), and C NaN-poisoned first.
@pytest.mark.parametrize("params", [None, {"BN": 256, "CLUSTER_M": 1, "C_T": 0}, {"BN": 192, "CLUSTER_M": 2, "C_T": 0},
                                    {"BN": 128, "C_T": 0}, {"BN": 64, "STAGES": 8, "C_T": 0},
                                    {"BN": 256, "C_BOXES_ASKED": 2, "C_T": 0}])
@pytest.mark.parametrize("kernel", ["hgemm_f32c", "bgemm_f32c"])
def test_fp32_c_stored_by_tma(kernel, params):
    dtype = "bfloat16" if kernel.startswith("b") else "float16"
    rng = cp.random.default_rng(11)
    for m, n, k, ld in [(515, 300, 200, 300), (1000, 1024, 136, 1024), (257, 296, 96, 308)]:
        a, av = _operand(rng, (m, k), dtype)
        b, bv = _operand(rng, (k, n), dtype)
        big = cp.full((m, ld), float("nan"), dtype=cp.float32)
        c = big[:, :n]
        bias = rng.standard_normal(n, dtype=cp.float32) if m == 257 else None
        asmgemm.gemm(a, b, c, alpha=0.75, kernel=kernel, params=params, bias=bias)
        ref = 0.75 * (av @ bv) + (bias[None, :] if bias is not None else 0)
        assert bool(cp.isfinite(c).all()), (m, n, k)
        err = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
        assert err < get_spec(kernel).rel_err_limit, (m, n, k, err)
        if ld > n:
            assert bool(cp.isnan(big[:, n:]).all())        # nothing written past N


# ---- small M as C^T (the catalog's ct_ entries: C^T = B^T A^T, stored transposed) ----------------
# The user's rows are the kernel's BN = 16, 32 or 64 columns, its B the user's A. The cost model may
# run a small-M call through any of these entries, so each unclustered one (the K-split ones are
# test_hgemm_fused_gpu.py's) meets every shape. Edges in every direction: M = 1, 3, 17, 33 (part of
# a kernel tile column), M above the tile's width (several columns), N not a multiple of the
# 128-row tile, K odd (A's rows are then not 16-byte aligned: the padded copy), K = 1.
SWAP_ENTRIES = ["ct_t128x16_st", "ct_t64x16_st", "ct_t128x32_st", "ct_t128x64_st", "ct_t64x64_st", "ct_t128x192_st"]
SWAP_SHAPES = [(1, 768, 768), (3, 100, 64), (16, 3072, 768), (17, 300, 257), (33, 1000, 700), (64, 520, 136),
               (50, 77, 1), (16, 7, 9), (64, 4096, 1000)]


@pytest.mark.parametrize("entry", SWAP_ENTRIES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", SWAP_SHAPES)
def test_small_m_as_c_transposed(m, n, k, dtype, entry):
    _check(m, n, k, dtype=dtype, params=entry_params(entry))
    launch = last_launch()
    assert launch["c_trans"] and launch["tile"] == catalog_entry(entry).tile[:2], launch


# Up to 1024 rows at K <= 1024 as C^T: many kernel tile columns (up to 63 of 16), tile edges in
# both directions, odd K.
@pytest.mark.parametrize("entry", SWAP_ENTRIES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("m,n,k", [(128, 768, 768), (300, 700, 500), (512, 768, 768), (1000, 130, 1000),
                                   (97, 1500, 333)])
def test_rows_up_to_1024_as_c_transposed_at_short_k(m, n, k, dtype, entry):
    params = entry_params(entry)
    _check(m, n, k, dtype=dtype, params=params)
    assert last_launch()["c_trans"], last_launch()
    _check(m, n, k, dtype=dtype, alpha=0.5, beta=-0.75, params=params)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_c_transposed_64_wide_in_every_layout(layout):
    """As C^T the kernel's B is the user's A: K-major where A is K-contiguous (nn, nt), N-major
    where it is stored K x M (tn, tt). 64-wide tiles read either."""
    _check(20, 300, 200, layout=layout, params=entry_params("ct_t128x64_st"))
    assert last_launch()["c_trans"], last_launch()


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("entry", ["ct_t128x16_st", "ct_t128x32_st"])
def test_narrow_c_transposed_tiles_need_a_k_contiguous_a(entry, layout):
    """16- and 32-wide tiles only with a K-major kernel B: as C^T, a K-contiguous user A (nn, nt)
    runs; an A stored K x M (tn, tt) the kernel's own guard refuses, and gemm raises its reason."""
    params = entry_params(entry)
    if layout[0] == "n":
        _check(20, 300, 200, layout=layout, params=params)
        assert last_launch()["c_trans"], last_launch()
    else:
        with pytest.raises(AsmError, match="K-major B"):
            _check(20, 300, 200, layout=layout, params=params)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_swapped_alpha_beta(dtype):
    _check(16, 520, 136, dtype=dtype, alpha=0.5, beta=-1.25, params=entry_params("ct_t128x16_st"))
    assert last_launch()["c_trans"]


@pytest.mark.parametrize("bn", [16, 32, 64])
def test_forced_swap_over_many_tile_columns(bn):
    """params= swap when they name C_T: M = 100 rows over 7, 4 or 2 columns of kernel tiles."""
    _check(100, 264, 300, params={"C_T": 1, "BN": bn, "STAGES": 8, "CLUSTER_M": 1, "GROUP_M": 4})
    _check(100, 264, 300, beta=0.5, params={"C_T": 1, "BN": bn, "STAGES": 8, "CLUSTER_M": 2})
    assert last_launch()["c_trans"] and last_launch()["cluster"] == 2
