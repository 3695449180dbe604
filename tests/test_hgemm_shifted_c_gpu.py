"""hgemm's SHIFTED_C on the GPU: a 16-bit C whose rows are not whole, aligned 16-byte pieces (odd N,
odd ldc, a base off 16 bytes) leaves the staged tile by 16-byte stores of aligned pieces, each
staged row shifted by its own misalignment, and by elements at the rows' two ends
(kernels_ptx/hgemm/epilogue_staged.inc, STORE_TILE_SHIFTED). Against an fp32 reference of the same
inputs, C poisoned with NaN first (beta = 0 never reads it) and its neighbours checked untouched:
every tiling that stages C (BN 128, 192, 256; one or two consumers; clusters), the fused epilogue,
a batch, and beta != 0 (the pair stores, unchanged). Skipped without CuPy, a GPU, or off sm_90."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("hgemm_own_path")]

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402
from asmgemm.kernel_spec import get_spec  # noqa: E402
from asmgemm.runtime.gemm import last_launch  # noqa: E402
from asmgemm.runtime.gpu import device_facts  # noqa: E402

if device_facts().target != "sm_90":
    pytest.skip("the HGEMM needs an sm_90 (Hopper) GPU", allow_module_level=True)

_NAN = {"float16": 0x7E00, "bfloat16": 0x7FC0}
_GUARD = 0x1234                                   # what C's buffer holds outside the view


def _as_dtype(x32, dtype):
    """(stored 16-bit array, its fp32 values)."""
    if dtype == "bfloat16":
        bits = (x32.view(cp.uint32) >> 16).astype(cp.uint16)
        return bits, (bits.astype(cp.uint32) << 16).view(cp.float32)
    h = x32.astype(cp.float16)
    return h, h.astype(cp.float32)


def _values(c, dtype):
    c = cp.ascontiguousarray(c)
    return (c.astype(cp.uint32) << 16).view(cp.float32) if dtype == "bfloat16" else c.astype(cp.float32)


def _run(m, n, k, *, ldc=None, c_off=0, layout="nn", dtype="float16", params=None, alpha=1.0, beta=0.0,
         bias=False, activation=None, seed=0):
    rng = cp.random.default_rng(seed + m + 5 * n + 11 * k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a, av = _as_dtype(rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32), dtype)
    b, bv = _as_dtype(rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32), dtype)
    ldc = ldc or n
    buf = cp.full((m * ldc + c_off + 16,), _GUARD, dtype=cp.uint16)
    c = buf[c_off:c_off + m * ldc].reshape(m, ldc)[:, :n]
    if dtype == "float16":
        c = c.view(cp.float16)
    c0 = None
    if beta:
        c0_32 = rng.standard_normal((m, n), dtype=cp.float32)
        c_init, c0 = _as_dtype(c0_32, dtype)
        c[...] = c_init
    else:
        c.view(cp.uint16)[...] = _NAN[dtype]
    bias_arr, bias_ref = None, 0.0
    if bias:
        bias_arr, bias_ref = _as_dtype(rng.standard_normal((n,), dtype=cp.float32), dtype)
    kernel = "bgemm" if dtype == "bfloat16" else "hgemm"
    asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb, kernel=kernel, params=params,
                 bias=bias_arr, activation=activation)
    ran = last_launch()
    ref = alpha * ((av.T if ta else av) @ (bv.T if tb else bv)) + bias_ref
    if beta:
        ref = ref + beta * c0
    if activation == "relu":
        ref = cp.maximum(ref, 0)
    got = _values(c.view(cp.uint16) if dtype == "bfloat16" else c, dtype)
    assert bool(cp.isfinite(got).all()), f"non-finite values in C ({ran['params']})"
    err = float(cp.linalg.norm(got - ref)) / (float(cp.linalg.norm(ref)) or 1.0)
    assert err < get_spec(kernel).rel_err_limit, f"{m}x{n}x{k} {layout} ldc={ldc} off={c_off}: rel err {err:.3e}"
    # nothing outside the view written: the buffer's head, each row's tail past N, the end
    whole = buf[:c_off + m * ldc + 16]
    mask = cp.ones(whole.shape, dtype=bool)
    rows = cp.arange(m)[:, None] * ldc + c_off + cp.arange(n)[None, :]
    mask[rows.ravel()] = False
    assert bool((whole[mask] == _GUARD).all()), f"C's neighbours written ({ran['params']})"
    return ran


def _shifted(ran):
    """The call ran SHIFTED_C, unless the dispatch split it (a split's partial pass writes fp32
    slices and a reduce or cluster sum writes C) or swapped it (C_T: C^T's pairs stored transposed):
    last_launch() says no shifted C then."""
    if ran["splits"] == 1 and not ran["c_trans"]:
        assert ran["c_shifted"], ran
    else:
        assert not ran["c_shifted"], ran


@pytest.mark.parametrize("m,n,k,ldc,c_off", [
    (1000, 999, 1000, None, 0), (1000, 1000, 1000, 1001, 0), (1000, 1000, 1000, None, 3),
    (257, 255, 200, 263, 5), (300, 7, 130, None, 0), (130, 65, 64, 67, 1), (129, 257, 65, None, 0),
    (2047, 1025, 777, 1029, 7), (64, 520, 300, 523, 2),
])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_odd_c_in_place(m, n, k, ldc, c_off, layout):
    ran = _run(m, n, k, ldc=ldc, c_off=c_off, layout=layout, params={"C_T": 0} if n < 64 else None)
    if not ran["c_trans"]:
        _shifted(ran)


@pytest.mark.parametrize("params", [{"BN": 128}, {"BN": 192}, {"BN": 256, "CLUSTER_M": 1},
                                    {"CONSUMERS": 1, "BN": 128}, {"BN": 128, "CLUSTER_N": 2, "CLUSTER_M": 1},
                                    {"BN": 64, "CLUSTER_M": 2}])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_tilings(params, dtype):
    _shifted(_run(515, 333, 301, ldc=341, c_off=3, dtype=dtype, params={**params, "C_T": 0}))
    _shifted(_run(200, 1031, 129, dtype=dtype, params={**params, "C_T": 0}, layout="tt"))


@pytest.mark.parametrize("activation", [None, "relu"])
def test_fused_epilogue(activation):
    # (C_T = 0: the catalog may run this shape as C^T, whose C leaves by pairs)
    _shifted(_run(515, 333, 301, ldc=341, bias=True, activation=activation, alpha=0.5, params={"C_T": 0}))


def test_beta_takes_the_pair_stores():
    ran = _run(300, 261, 150, alpha=0.5, beta=-1.5, params={"C_T": 0})
    _shifted(ran)                                   # built with it; beta != 0 runs the pairs


def test_batched():
    rng = cp.random.default_rng(9)
    # (A's and B's rows 144 bytes apart: TMA reads them; a batch gets no padded copies)
    a = rng.standard_normal((3, 130, 72), dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal((3, 333, 72), dtype=cp.float32).astype(cp.float16)
    c = asmgemm.gemm(a, b, trans_b=True, kernel="hgemm")
    ref = cp.matmul(a.astype(cp.float32), b.astype(cp.float32).transpose(0, 2, 1))
    assert float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref)) < 2e-3
    _shifted(last_launch())


def test_repeated_calls():
    """A kept launch, new operands and a new C each call (C's misalignment per row is the kernel's own)."""
    rng = cp.random.default_rng(4)
    for i in range(3):
        a = rng.standard_normal((700, 300), dtype=cp.float32).astype(cp.float16)
        b = rng.standard_normal((300, 517), dtype=cp.float32).astype(cp.float16)
        c = asmgemm.gemm(a, b, kernel="hgemm", params={"C_T": 0})     # (unswapped: the catalog may run it as C^T)
        ref = a.astype(cp.float32) @ b.astype(cp.float32)
        assert float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref)) < 2e-3, i
        assert last_launch()["c_shifted"], i
