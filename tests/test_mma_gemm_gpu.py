"""The portable tensor-core GEMM (kernels_ptx/mma_gemm.sasm: hgemm_mma, bgemm_mma and their fp32-C
forms) on the GPU, against an fp32 reference of the same 16-bit inputs: odd shapes, all four
layouts, odd leading dimensions read in place (every copy width: 16, 8, 4 bytes and the 2-byte
register path), alpha/beta, column-major C, fp32 C, the fused epilogue, the untuned tilings and
the `.tune` space, the sm_80 build run on this GPU, and the H100's in-place choice for operands
TMA cannot read. Skipped without CuPy and a GPU of sm_80 or later."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402
from asmgemm.runtime.gemm import clear_plan_cache, last_launch  # noqa: E402
from asmgemm.errors import AsmError  # noqa: E402
from asmgemm.kernel_spec import get_spec  # noqa: E402
from asmgemm.runtime.gpu import TARGET_ENV, device_facts  # noqa: E402

if int(device_facts().target[3:].rstrip("af")) < 80:
    pytest.skip("mma_gemm needs sm_80 or later", allow_module_level=True)

KERNEL = {("float16", False): "hgemm_mma", ("bfloat16", False): "bgemm_mma",
          ("float16", True): "hgemm_mma_f32c", ("bfloat16", True): "bgemm_mma_f32c"}


def _bf16_bits(x32):
    """fp32 CuPy array -> bfloat16 bit patterns (round to nearest even), and their fp32 values."""
    u = x32.view(cp.uint32)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)
    return bits, (bits.astype(cp.uint32) << 16).view(cp.float32)


def _matrix(rng, rows, cols, dtype, ld=None, offset=0):
    """(array of `dtype` (bfloat16: uint16 bits) rows x cols with leading dimension ld, starting
    `offset` elements into its storage; its fp32 values)."""
    ld = ld or cols
    x32 = cp.asarray(rng.uniform(-1, 1, (rows, cols)).astype(np.float32))
    if dtype == "bfloat16":
        x, v = _bf16_bits(x32)
    else:
        x = x32.astype(cp.float16)
        v = x.astype(cp.float32)
    store = cp.zeros(offset + rows * ld + cols, dtype=x.dtype)
    view = store[offset:offset + rows * ld].reshape(rows, ld)[:, :cols] if rows else store[:0].reshape(0, cols)
    view[...] = x
    return view, v


def _values(c, dtype, c_f32):
    if c_f32:
        return c.astype(cp.float32)
    if dtype == "bfloat16":
        return (c.view(cp.uint16).astype(cp.uint32) << 16).view(cp.float32)
    return c.astype(cp.float32)


_last_c = [None]      # the C of _check's last call (its bits, for tests that compare two builds)


def _check(m, n, k, layout="nn", dtype="float16", *, c_f32=False, alpha=1.0, beta=0.0, lda_pad=0, ldb_pad=0,
           a_offset=0, b_offset=0, c_order="C", bias=None, activation=None, params=None, kernel=None, seed=0):
    rng = np.random.default_rng(seed)
    ta, tb = layout[0] == "t", layout[1] == "t"
    ar, ac = (k, m) if ta else (m, k)
    br, bc = (n, k) if tb else (k, n)
    a, av = _matrix(rng, ar, ac, dtype, ac + lda_pad, a_offset)
    b, bv = _matrix(rng, br, bc, dtype, bc + ldb_pad, b_offset)
    opa = av.T if ta else av
    opb = bv.T if tb else bv
    ref = alpha * (opa @ opb)
    c0 = cp.asarray(rng.uniform(-1, 1, (m, n)).astype(np.float32))
    if c_f32:
        c = c0.copy(order=c_order)
    elif dtype == "bfloat16":
        c = cp.asfortranarray(_bf16_bits(c0)[0]) if c_order == "F" else _bf16_bits(c0)[0]
    else:
        c = c0.astype(cp.float16, order=c_order)
    if beta:
        ref = ref + beta * _values(c, dtype, c_f32)
    else:
        c.view(cp.uint16 if not c_f32 else cp.uint32)[...] = 0x7E00 if not c_f32 else 0x7FC00000   # NaN: unread
    bias_arr = None
    if bias is not None:
        shape = (n,) if bias == "column" else (m, 1)
        b32 = cp.asarray(rng.uniform(-1, 1, shape).astype(np.float32))
        bias_arr = b32 if c_f32 else (_bf16_bits(b32)[0] if dtype == "bfloat16" else b32.astype(cp.float16))
        ref = ref + _values(bias_arr, dtype, c_f32).reshape(shape)
    if activation is not None:
        import math
        x = cp.asnumpy(ref).astype(np.float64)
        if activation == "relu":
            x = np.maximum(x, 0)
        elif activation == "gelu":
            x = 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
        elif activation == "gelu_tanh":
            x = 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
        elif activation == "silu":
            x = x / (1 + np.exp(-x))
        ref = cp.asarray(x.astype(np.float32))
    kernel = kernel or KERNEL[(dtype, c_f32)]
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, params=params, kernel=kernel,
                       bias=bias_arr, activation=activation)
    assert out is c
    _last_c[0] = c
    got = _values(c, dtype, c_f32)
    assert not bool(cp.isnan(got).any()), "unwritten (NaN) elements in C"
    limit = 2e-3 if dtype == "float16" and not c_f32 else (5e-4 if c_f32 else 1e-2)
    err = float(cp.linalg.norm(got - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
    assert err < limit, f"{m}x{n}x{k} {layout} {dtype}: rel err {err:.3g} (limit {limit})"
    return last_launch()


SHAPES = [(1, 1, 1), (7, 13, 5), (127, 129, 65), (1000, 1000, 1000), (3000, 5000, 700)]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_fp16_shapes_and_layouts(m, n, k, layout):
    run = _check(m, n, k, layout)
    assert run["kernel"] == "hgemm_mma"


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k", [(7, 13, 5), (127, 129, 65), (1000, 1000, 1000)])
def test_bf16(m, n, k, layout):
    _check(m, n, k, layout, "bfloat16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_fp32_c(dtype, layout):
    _check(300, 520, 333, layout, dtype, c_f32=True)
    _check(1000, 1000, 999, layout, dtype, c_f32=True, alpha=0.5, beta=-1.5)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_alpha_beta(dtype):
    _check(127, 129, 65, "nt", dtype, alpha=-0.75, beta=0.5)
    _check(1000, 1000, 1000, "tn", dtype, alpha=2.0, beta=1.0)


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_column_major_c(layout):
    _check(301, 257, 129, layout, c_order="F", beta=0.5)


# Odd leading dimensions, read in place: lda = K + 1 and ldb = N + 3 (the issue's), and pads and
# offsets that give each copy width: 2 bytes (odd), 4 (even, not a multiple of 4), 8, 16.
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k", [(7, 13, 5), (127, 129, 65), (1000, 1000, 1000), (3000, 5000, 700)])
def test_odd_leading_dimensions(m, n, k, layout):
    _check(m, n, k, layout, lda_pad=1, ldb_pad=3)


@pytest.mark.parametrize("pad,offset,align", [(1, 0, 2), (2, 0, 4), (4, 0, 8), (8, 0, 16), (0, 1, 2), (0, 2, 4),
                                              (0, 4, 8)])
@pytest.mark.parametrize("layout", ["nn", "tt"])
def test_each_copy_width(pad, offset, align, layout):
    m, n, k = 200, 136, 264           # row lengths multiples of 8: the pad and offset set the width alone
    _check(m, n, k, layout, lda_pad=pad, ldb_pad=pad, a_offset=offset, b_offset=offset)
    params = last_launch()["params"]
    assert params.get("ALIGN_A") == str(align) and params.get("ALIGN_B") == str(align), params


# ALIGN 2 (odd leading dimensions) through the realigned 16-byte path (REALIGN = 1, the default):
# both operands' rows odd (lda = K + 1 or, for an odd row, + 2; ldb = N + 3 or + 2), so every row
# starts at its own even offset in its 16-byte granule; the same configuration with REALIGN = 0
# (2-byte loads) gives the same bits.
REALIGN_CASES = ([("float16", False, layout, shape) for layout in ("nn", "nt", "tn", "tt")
                  for shape in ((7, 13, 5), (127, 129, 65), (1000, 1000, 999))]
                 + [(dtype, c_f32, layout, shape) for dtype, c_f32 in (("bfloat16", False), ("float16", True),
                                                                       ("bfloat16", True))
                    for layout in ("nn", "tt") for shape in ((127, 129, 65), (1000, 1000, 999))])


@pytest.mark.parametrize("dtype,c_f32,layout,shape", REALIGN_CASES,
                         ids=[f"{d}{'-f32c' if f else ''}-{l}-{'x'.join(map(str, s))}" for d, f, l, s in REALIGN_CASES])
def test_odd_rows_realigned_match_the_2_byte_loads(dtype, c_f32, layout, shape):
    m, n, k = shape
    ac = m if layout[0] == "t" else k
    bc = k if layout[1] == "t" else n
    pads = dict(lda_pad=1 if ac % 2 == 0 else 2, ldb_pad=3 if bc % 2 == 0 else 2)
    run = _check(m, n, k, layout, dtype, c_f32=c_f32, kernel=KERNEL[(dtype, c_f32)], **pads)
    params = run["params"]
    assert params.get("ALIGN_A") == "2" and params.get("ALIGN_B") == "2", params
    assert params.get("REALIGN", "1") == "1", params
    realigned = cp.asnumpy(cp.asarray(_last_c[0]).copy())
    staged = _check(m, n, k, layout, dtype, c_f32=c_f32, kernel=KERNEL[(dtype, c_f32)],
                    params={**run["rerun_params"], "REALIGN": 0}, **pads)
    assert staged["params"].get("REALIGN") == "0", staged["params"]
    assert np.array_equal(realigned.view(np.uint8), cp.asnumpy(_last_c[0]).view(np.uint8)), "REALIGN 0 and 1 differ"
    if dtype == "float16" and not c_f32:
        # REALIGN = 2: the granules through a cp.async ring, realigned in shared memory
        ring = _check(m, n, k, layout, dtype, c_f32=c_f32, kernel=KERNEL[(dtype, c_f32)],
                      params={**run["rerun_params"], "REALIGN": 2}, **pads)
        assert ring["params"].get("REALIGN") == "2", ring["params"]
        assert np.array_equal(realigned.view(np.uint8), cp.asnumpy(_last_c[0]).view(np.uint8)), "REALIGN 1 and 2 differ"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("bias", [None, "column", "row"])
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_fused_epilogue(dtype, bias, activation):
    _check(257, 300, 130, "nt", dtype, bias=bias, activation=activation, beta=0.5 if bias == "row" else 0.0,
           lda_pad=1)
    _check(256, 256, 128, "nn", dtype, c_f32=True, bias=bias, activation=activation)


@pytest.mark.parametrize("layout", ["nn", "tn"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_fused_epilogue_on_the_default_tiling(dtype, layout):
    """128 x 128 tiles (144 of them), a per-column bias and gelu into 16-byte pieces of a 16-bit C:
    the build that once ran out of room in the register plan (tests/test_mma_gemm_build.py). Pinned
    (params={}: the source defaults), since the cost model may pick another tiling for the shape."""
    run = _check(1536, 1536, 200, layout, dtype, bias="column", activation="gelu", beta=0.0, params={})
    assert run["tile"] == (128, 128) and run["params"]["WIDE_C"] == "1", run


@pytest.mark.parametrize("params", [
    {"BM": 128, "BN": 128, "WM": 64, "WN": 64, "STAGES": 4, "BK": 32},
    {"BM": 128, "BN": 128, "WM": 64, "WN": 64, "STAGES": 3, "BK": 64},
    {"BM": 128, "BN": 256, "WM": 64, "WN": 64, "STAGES": 3, "BK": 32},
    {"BM": 256, "BN": 128, "WM": 64, "WN": 64, "STAGES": 3, "BK": 32},
    {"BM": 64, "BN": 64, "WM": 32, "WN": 32, "STAGES": 5, "BK": 32},
    {"BM": 128, "BN": 128, "WM": 64, "WN": 32, "STAGES": 4, "BK": 32},
    {"BM": 64, "BN": 128, "WM": 32, "WN": 64, "STAGES": 4, "BK": 64, "GROUP_M": 1},
])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_tilings(params, layout):
    # leading dimensions multiples of 8 (16-byte copies) in every layout, edges in M, N and K
    _check(520, 392, 304, layout, params=params)
    _check(77, 61, 45, layout, params=params, lda_pad=3, ldb_pad=3)


# every entry of the catalog the cost model ranks (kernels.toml [[hgemm_mma.config]]), as its set= builds it
CATALOG_NAMES = [e.name for e in get_spec("hgemm_mma").configs]
CATALOG_SETS = [dict(e.set) for e in get_spec("hgemm_mma").configs]


def _copies_16_bytes_only(params: dict) -> bool:
    """The eight-warp 64 x 64 warp tiles (128 x 256, 256 x 128) take 16-byte rows only (the kernel's
    guard: narrower copies need more than 255 registers a thread on sm_80-sm_89)."""
    p = {"BM": 128, "BN": 128, "WM": 64, "WN": 64, **params}
    return p["WM"] * p["WN"] >= 64 * 64 and (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]) >= 8


@pytest.mark.parametrize("params", CATALOG_SETS, ids=CATALOG_NAMES)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_every_catalog_entry(params, layout):
    """Each configuration the model may pick, forced, at three shapes with edges in M, N and K: rows
    of 16-byte copies (304, 392, 520 elements), a deep K over a few tiles of C with alpha and beta
    (rows of 48, 296, 2048), and rows of 8-byte (A) and 4-byte (B) copies in every layout (A 204 or
    332 elements, B 518 or 202), which an entry that takes 16-byte rows only refuses with its
    guard's error; odd rows, which the 64 x 64 warp tiles refuse, are test_odd_leading_dimensions'."""
    _check(520, 392, 304, layout, params=params)
    _check(48, 296, 2048, layout, params=params, alpha=0.5, beta=-1.0)
    if _copies_16_bytes_only(params):
        with pytest.raises(AsmError, match="16-byte rows"):
            _check(328, 516, 200, layout, params=params, lda_pad=4, ldb_pad=2)
    else:
        _check(328, 516, 200, layout, params=params, lda_pad=4, ldb_pad=2)


def test_sm80_build_runs_here(monkeypatch):
    """What an A100 runs: with $ASMGEMM_TARGET=sm_80 a float16 call picks hgemm_mma by dtype alone
    (the Hopper kernels are sm_90a only) and its sm_80 cubin runs on this GPU."""
    monkeypatch.setenv(TARGET_ENV, "sm_80")
    clear_plan_cache()
    try:
        for layout in ("nn", "nt", "tn", "tt"):
            rng = np.random.default_rng(1)
            m, n, k = 333, 257, 190
            a = cp.asarray(rng.uniform(-1, 1, (m, k)).astype(np.float16))
            b = cp.asarray(rng.uniform(-1, 1, (k, n)).astype(np.float16))
            a_op = cp.asfortranarray(a) if layout[0] == "t" else a
            b_op = cp.asfortranarray(b) if layout[1] == "t" else b
            c = asmgemm.gemm(a_op, b_op)
            ref = a.astype(cp.float32) @ b.astype(cp.float32)
            err = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
            assert err < 2e-3
            run = last_launch()
            assert run["kernel"] == "hgemm_mma"
            assert run["target"] == "sm_80", run
    finally:
        clear_plan_cache()


@pytest.mark.skipif(device_facts().target != "sm_90", reason="the in-place choice is the Hopper kernels'")
@pytest.mark.parametrize("m,n,k,layout", [(305, 923, 6, "nn"), (652, 415, 148, "nn"), (524, 455, 55, "nt"),
                                          (2833, 2, 89, "nt"), (1000, 1000, 999, "nn")])
def test_odd_operands_run_in_place_on_hopper(m, n, k, layout):
    """Operands TMA cannot read (rows not 16-byte aligned): gemm by dtype alone runs hgemm_mma on
    them in place where the path model says so, with no padded copy. Small K is far on the in-place
    side of the model; at 1000 x 1000 x 999 the model's answer depends on the in-place kernel's pick
    (the H100 ran hgemm on copies there on 2026-11-27), so either consistent route may run: in place
    without copies, or hgemm on padded copies."""
    rng = np.random.default_rng(2)
    a = cp.asarray(rng.uniform(-1, 1, (m, k)).astype(np.float16))
    b = cp.asarray(rng.uniform(-1, 1, (n, k) if layout[1] == "t" else (k, n)).astype(np.float16))
    c = asmgemm.gemm(a, b.T if layout[1] == "t" else b)
    ref = a.astype(cp.float32) @ (b.T if layout[1] == "t" else b).astype(cp.float32)
    err = float(cp.linalg.norm(c.astype(cp.float32) - ref) / max(float(cp.linalg.norm(ref)), 1e-30))
    assert err < 2e-3
    run = last_launch()
    if k >= 512:
        assert (run["kernel"], bool(run["copies"])) in (("hgemm_mma", False), ("hgemm", True)), run
    else:
        assert run["kernel"] == "hgemm_mma" and run["copies"] == (), run


def test_repeated_calls_reuse_the_plan():
    rng = np.random.default_rng(3)
    a = cp.asarray(rng.uniform(-1, 1, (129, 77)).astype(np.float16))
    b = cp.asarray(rng.uniform(-1, 1, (77, 65)).astype(np.float16))
    first = asmgemm.gemm(a, b, kernel="hgemm_mma")
    second = asmgemm.gemm(a, b, kernel="hgemm_mma")
    assert bool((first == second).all())


# ---- narrow C (issue 32): rows of C not in aligned 16-byte pieces (WIDE_C = 0) -----------------------
# An odd N or ldc, or a C that starts off a 16-byte boundary: the epilogue stores one element a
# lane, consecutive lanes at consecutive columns of a row. Tiny K (the epilogue is the whole cost
# there), beta and a bias, against float64 numpy; the padding between C's rows must stay untouched.
def _check_narrow_c(m, n, k, layout="nt", dtype="float16", *, c_f32=False, ldc_pad=0, c_offset=0, alpha=1.0,
                    beta=0.5, bias="column", activation=None, params=None, seed=0):
    rng = np.random.default_rng(seed)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a, av = _matrix(rng, *((k, m) if ta else (m, k)), dtype)
    b, bv = _matrix(rng, *((n, k) if tb else (k, n)), dtype)
    opa, opb = cp.asnumpy(av).astype(np.float64), cp.asnumpy(bv).astype(np.float64)
    ref = alpha * ((opa.T if ta else opa) @ (opb.T if tb else opb))
    ldc = n + ldc_pad
    cdt = cp.float32 if c_f32 else (cp.uint16 if dtype == "bfloat16" else cp.float16)
    nan_bits = 0x7FC00000 if c_f32 else 0x7E00
    store = cp.full(c_offset + m * ldc, nan_bits, cp.uint32 if c_f32 else cp.uint16).view(cdt)
    c = store[c_offset:].reshape(m, ldc)[:, :n]
    c0 = cp.asarray(rng.uniform(-1, 1, (m, n)).astype(np.float32))
    c[...] = c0 if c_f32 else (_bf16_bits(c0)[0] if dtype == "bfloat16" else c0.astype(cp.float16))
    if beta:
        ref = ref + beta * cp.asnumpy(_values(c, dtype, c_f32)).astype(np.float64)
    bias_arr = None
    if bias is not None:
        shape = (n,) if bias == "column" else (m, 1)
        b32 = cp.asarray(rng.uniform(-1, 1, shape).astype(np.float32))
        bias_arr = b32 if c_f32 else (_bf16_bits(b32)[0] if dtype == "bfloat16" else b32.astype(cp.float16))
        ref = ref + cp.asnumpy(_values(bias_arr, dtype, c_f32)).astype(np.float64).reshape(shape)
    if activation == "gelu":
        import math
        ref = 0.5 * ref * (1 + np.vectorize(math.erf)(ref / math.sqrt(2)))
    elif activation == "relu":
        ref = np.maximum(ref, 0)
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, kernel=KERNEL[(dtype, c_f32)],
                       params=params, bias=bias_arr, activation=activation)
    assert out is c
    run = last_launch()
    assert run["params"]["WIDE_C"] == "0", run
    got = cp.asnumpy(_values(c, dtype, c_f32)).astype(np.float64)
    rows = store[c_offset:].reshape(m, ldc).view(cp.uint32 if c_f32 else cp.uint16)
    assert bool((rows[:, n:] == nan_bits).all()), "C's padding between rows (columns N .. ldc) was written"
    assert not np.isnan(got).any(), "unwritten (NaN) elements in C"
    # a 16-bit C: within one unit in the last place (the rounding, after fp32 sums of a few terms);
    # fp32: the sums' own rounding, ~1e-7 of the terms' size, which an element near 0 does not scale
    tol = 1e-5 if c_f32 else (2.0 ** -7 if dtype == "bfloat16" else 2.0 ** -10)
    scale = max(float(np.abs(ref).max()), 1e-30)
    np.testing.assert_allclose(got, ref, rtol=tol, atol=(2e-6 if c_f32 else tol * 1e-2) * scale,
                               err_msg=f"{m}x{n}x{k} {layout} {dtype} c_f32={c_f32} ldc={ldc} offset={c_offset}")
    return run


NARROW_SHAPES = [(37, 45, 2), (129, 67, 7), (532, 4897, 7), (1377, 7949, 21), (301, 1001, 21), (2049, 3001, 2)]


@pytest.mark.parametrize("m,n,k", NARROW_SHAPES)
@pytest.mark.parametrize("dtype,c_f32", [("float16", False), ("bfloat16", False), ("float16", True),
                                         ("bfloat16", True)])
def test_narrow_c_tiny_k_odd_n(m, n, k, dtype, c_f32):
    """Odd N, C contiguous (ldc = N), beta and a per-column bias: the issue's nt shapes and smaller."""
    _check_narrow_c(m, n, k, "nt", dtype, c_f32=c_f32, beta=0.5, bias="column")


@pytest.mark.parametrize("dtype,c_f32", [("float16", False), ("bfloat16", False), ("float16", True)])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n,k,ldc_pad,c_offset", [(129, 67, 7, 2, 0), (300, 520, 21, 3, 0), (77, 64, 2, 0, 1),
                                                     (1000, 999, 21, 4, 3)])
def test_narrow_c_odd_ldc(m, n, k, ldc_pad, c_offset, layout, dtype, c_f32):
    """An odd ldc (N + 3 with an even N: every other row starts at an odd element), a C starting off
    a 16-byte boundary, or both; beta != 0, a per-row bias, every layout."""
    _check_narrow_c(m, n, k, layout, dtype, c_f32=c_f32, ldc_pad=ldc_pad, c_offset=c_offset, alpha=-0.75,
                    beta=-1.0, bias="row")


@pytest.mark.parametrize("params", CATALOG_SETS, ids=CATALOG_NAMES)
@pytest.mark.parametrize("dtype,c_f32", [("float16", False), ("bfloat16", False), ("float16", True)])
@pytest.mark.parametrize("bias,activation", [("column", "gelu"), ("row", "relu"), (None, None)])
def test_narrow_c_catalog_tilings(params, dtype, c_f32, bias, activation):
    """Each catalog tiling's narrow epilogue (WN = 64: two 32-column groups a row; WN = 32: one, with
    odd staged rows' chunk pairs swapped for a 16-bit C), with and without beta, bias and activation."""
    # K = 24: rows of A of 48 bytes (16-byte copies), which the 64 x 64 warp tile needs
    _check_narrow_c(613, 389, 24, "nt", dtype, c_f32=c_f32, ldc_pad=2, beta=0.5 if bias else 0.0, bias=bias,
                    activation=activation, params={**{"BM": 128, "BN": 128, "WM": 64, "WN": 64}, **params})
    run = last_launch()
    assert run["params"].get("WN", "64") == str(params.get("WN", 64)), run


@pytest.mark.parametrize("dtype,c_f32", [("float16", False), ("bfloat16", False), ("float16", True)])
@pytest.mark.parametrize("m,n,k,ldc_pad,c_offset,layout,params", [
    (300, 520, 21, 2, 0, "nt", None),         # rows of 1044 bytes (fp32 C: 2088): 4- (8-) byte pieces
    (300, 520, 21, 4, 0, "tn", None),         # 1048 bytes: 8-byte pieces (fp32 C: 16, the wide path)
    (129, 68, 7, 0, 2, "nn", None),           # C 4 bytes off a 16-byte boundary
    (613, 390, 24, 0, 0, "nt", {"WN": 64}),   # the 64-column warp tile: 32 lanes a row
    (4543, 4546, 3, 0, 0, "nn", None),        # the random seed's store-bound call
])
def test_c_in_narrower_pieces(m, n, k, ldc_pad, c_offset, layout, params, dtype, c_f32):
    """Rows of C that are whole 8- or 4-byte pieces but not 16-byte ones (call value c_piece):
    stored a piece a lane (C_PIECE), beta, a per-column bias and gelu, the padding untouched."""
    from asmgemm.runtime.plan import c_piece
    item = 4 if c_f32 else 2
    want = c_piece(n, n + ldc_pad, 256 + c_offset * item, 0, item)
    if want == 16:
        pytest.skip("this C's rows are whole 16-byte pieces: the wide path (WIDE_C), not a narrow piece")
    run = _check_narrow_c(m, n, k, layout, dtype, c_f32=c_f32, ldc_pad=ldc_pad, c_offset=c_offset, beta=-0.5,
                          bias="column", activation="gelu", params=params)
    assert run["params"]["C_PIECE"] == str(want), run


def test_narrow_c_beta_zero_never_reads_c():
    """beta == 0: C holds NaN before the call and none survives (C is not read)."""
    rng = np.random.default_rng(5)
    m, n, k = 333, 77, 7
    a, _ = _matrix(rng, m, k, "float16")
    b, _ = _matrix(rng, k, n, "float16")
    store = cp.full(m * (n + 2), 0x7E00, cp.uint16).view(cp.float16)
    c = store.reshape(m, n + 2)[:, :n]
    asmgemm.gemm(a, b, c, beta=0.0, kernel="hgemm_mma")
    assert last_launch()["params"]["WIDE_C"] == "0"
    assert not bool(cp.isnan(c).any())


# ---- split-K (SPLIT_K=1: the partial pass into an fp32 workspace, summed by each tile's last block) --
# Forced by params= (S splits asked; the runtime rounds k_chunk up to 64 elements, so S may come out
# smaller): every layout, odd leading dimensions (each copy width moved by k0 along K), K that is no
# multiple of the chunk, fp16 / bf16 / fp32 C, alpha and beta, a column-major C (the operand swap).
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("dtype,c_f32", [("float16", False), ("bfloat16", False), ("float16", True)])
@pytest.mark.parametrize("m,n,k,splits", [(31, 747, 7681, 11), (2, 306, 933, 4), (130, 70, 4100, 32)])
def test_split_k(m, n, k, splits, layout, dtype, c_f32):
    run = _check(m, n, k, layout, dtype, c_f32=c_f32, params={"SPLIT_K": splits, "BM": 64, "BN": 64, "WM": 32,
                                                               "WN": 32, "CLUSTER_K": 1})
    # (the reduce kernel unless SPLIT_FIXUP=1 asks for the one-launch sum or, S <= 8 on a GPU with
    # clusters, CLUSTER_K = 1 is left out; tests/test_splitk_fixup_gpu.py and
    # tests/test_mma_cluster_k_gpu.py check that each gives the reduce kernel's bits)
    assert run["splits"] > 1 and run["reduce"] == "kernel", run


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_split_k_alpha_beta_odd_leading_dimensions_column_major_c(dtype):
    # (odd leading dimensions: the 2-byte staged copies, which need the eight-warp tiling, WN = 32)
    run = _check(77, 500, 3001, "nt", dtype, alpha=-0.5, beta=1.25, lda_pad=3, ldb_pad=5, a_offset=1,
                 params={"SPLIT_K": 8, "WN": 32})
    assert run["splits"] > 1, run
    run = _check(300, 45, 2500, "tn", dtype, alpha=0.75, beta=0.5, c_order="F", params={"SPLIT_K": 6, "WN": 32})
    assert run["splits"] > 1, run


def test_the_model_splits_a_few_tiles_over_a_deep_k():
    """Untuned, a few tiles of C over a deep K (the random benchmark's slowest, 0.09x cuBLAS's GPU
    time unsplit): the cost model's pick splits K, and the result is right."""
    run = _check(31, 747, 7681, "tt", kernel="hgemm_mma")
    assert run["splits"] > 1 and run["chosen_by"] in ("model", "database"), run


def test_split_k_is_deterministic():
    rng = np.random.default_rng(5)
    a = cp.asarray(rng.uniform(-1, 1, (40, 5001)).astype(np.float16))
    b = cp.asarray(rng.uniform(-1, 1, (5001, 300)).astype(np.float16))
    first = asmgemm.gemm(a, b, params={"SPLIT_K": 16, "WN": 32}, kernel="hgemm_mma")
    assert last_launch()["splits"] > 1
    for _ in range(3):
        again = asmgemm.gemm(a, b, params={"SPLIT_K": 16, "WN": 32}, kernel="hgemm_mma")
        assert bool((again.view(cp.uint16) == first.view(cp.uint16)).all())
