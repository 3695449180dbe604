"""C_T=1 in the skinny kernel (kernels_ptx/gemm_skinny.sasm) and the split-K reduce
(kernels_ptx/splitk_reduce.sasm), on the CPU: the store of a launch through the operand swap
(issue 32: calls with few columns of C, 89x3x10691, run as C^T = op(B)^T op(A)^T with the kernel's
M = the user's N), where element (m, n) of the kernel's C lies at C + n ldc + m.

Every mode builds for sm_90 (and sm_80 without clusters) with C_T=1 and no spills; the built PTX,
run in tests/ptx_sim.py on numpy arrays, stores C transposed for both layouts of B, fp32, fp16 and
bf16, odd shapes, beta (read from the transposed place), both bias modes and activations, clusters,
and the split-K partial pass (still the kernel's orientation, C_T ignored) followed by the reduce
with C_T=1 (VEC 0 and 1); C's padding between ldc and M is never written, and beta = 0 never
reads C (it holds NaN)."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, assemble, build_file
from asmgemm.toolchain import find_tool
from ptx_sim import Kernel, Memory
from sweeps import sample_every
from test_gemm_skinny import LIMITS, _bf16_bits, _values

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="ptxas not installed")

DTYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
NP_TYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": np.uint16}


# ---- builds ------------------------------------------------------------------------------------------
def _modes():
    for target in ("sm_90", "sm_80"):
        for tb in (0, 1):
            for dt in (0, 1, 2):
                for mr in ((4, 8, 16) if tb == 0 else (1, 2, 4, 8, 16)):
                    if dt and mr == 16:
                        continue
                    for ck in ((1, 4) if target == "sm_90" else (1,)):
                        yield target, {"TRANS_B": tb, "DTYPE": dt, "MR": mr, "CLUSTER_K": ck, "BIAS": 1, "ACT": 2}
    yield "sm_90", {"TRANS_B": 1, "DTYPE": 0, "MR": 4, "SPLIT_K": 1}
    yield "sm_90", {"TRANS_B": 0, "DTYPE": 1, "MR": 8, "SPLIT_K": 1}
    yield "sm_90", {"TRANS_B": 1, "DTYPE": 2, "MR": 2, "BIAS": 2, "ACT": 4, "TRANS_A": 1, "VEC_B": 0}


@needs_ptxas
@pytest.mark.parametrize("target, defines", sample_every(16, list(_modes()), unpack=True), ids=lambda x: x if isinstance(x, str) else
                         ",".join(f"{k}={v}" for k, v in x.items()))
def test_every_mode_builds_with_c_t_without_spills(target, defines):
    """C_T=1 changes only the epilogue's addressing: no spills, and within the 128 registers of
    .minnctapersm 2 where the build promises two blocks per SM."""
    d = {k: str(v) for k, v in {**defines, "C_T": 1}.items()}
    result = build_file("gemm_skinny", BuildOptions(defines=d, target=target))
    (k,) = assemble(result).kernels
    assert k.spill_stores == k.local_bytes == 0, (k.spill_stores, k.local_bytes)
    if result.constants["MIN_BLOCKS"] == 2:
        assert k.registers <= 128
    if defines.get("SPLIT_K"):
        # the partial pass writes its workspace slice as without C_T: the same PTX
        plain = build_file("gemm_skinny", BuildOptions(defines={**d, "C_T": "0"}, target=target))
        assert plain.ptx == result.ptx


def test_c_t_without_split_k_changes_the_ptx_and_bad_values_are_refused():
    d = {"TRANS_B": "1", "MR": "4"}
    assert build_file("gemm_skinny", BuildOptions(defines={**d, "C_T": "1"}, target="sm_90")).ptx != \
        build_file("gemm_skinny", BuildOptions(defines=d, target="sm_90")).ptx
    with pytest.raises(AsmError, match="C_T is 0"):
        build_file("gemm_skinny", BuildOptions(defines={"C_T": "2"}, target="sm_90"))
    with pytest.raises(AsmError, match="C_T is 0"):
        build_file("splitk_reduce", BuildOptions(defines={"C_T": "2"}, target="sm_90"))


@needs_ptxas
@pytest.mark.parametrize("vec", [0, 1])
@pytest.mark.parametrize("c_type", [0, 1, 2])
def test_the_reduce_builds_with_c_t(vec, c_type):
    result = build_file("splitk_reduce", BuildOptions(defines={"C_T": "1", "VEC": str(vec), "C_TYPE": str(c_type)},
                                                      target="sm_80"))
    (k,) = assemble(result).kernels
    assert k.spill_stores == k.local_bytes == 0
    # C's elements one at a time (a transposed row of 4 is 4 rows of C); W's loads stay 128-bit with VEC=1
    assert "v4.b16" not in result.ptx and "st.global.v4" not in result.ptx
    assert ("ld.global.nc.v4.f32" in result.ptx) == bool(vec)


# ---- the interpreter -----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _build(name: str, defines: tuple) -> tuple[Kernel, dict]:
    result = build_file(name, BuildOptions(defines=dict(defines), target="sm_90"))
    return Kernel(result.ptx), dict(result.constants)


PAD = 77.0      # C's padding between M and ldc: never written


def _simulate_ct(m, n, k, dtype="float32", *, trans_b, mr=None, trans_a=False, ldc_pad=3, ldb_pad=0, alpha=1.0,
                 beta=0.0, bias=0, act=0, cluster=1, splits=1, reduce_vec=0, defines=None, seed=0):
    """The kernel's M x N result of a C_T=1 launch, run in the interpreter, against float64: the
    relative error. C is stored N x (M + ldc_pad) (element (i, j) at j ldc + i); beta = 0 fills it
    with NaN (never read). splits > 1: the partial pass (SPLIT_K=1, C_T=1: the workspace in the
    kernel's orientation), then splitk_reduce with C_T=1 into the transposed C."""
    from epilogue_reference import BY_CODE
    np_type = NP_TYPES[dtype]
    rng = np.random.default_rng(seed + 7 * m + 13 * n + k + 101 * trans_b)

    def make(*shape):
        x = rng.standard_normal(shape).astype(np.float32)
        return _bf16_bits(x) if dtype == "bfloat16" else x.astype(np_type)

    def fill(shape, value):
        x = np.full(shape, value, np.float32)
        return _bf16_bits(x) if dtype == "bfloat16" else x.astype(np_type)

    a = make(*((k, m) if trans_a else (m, k)))
    b_store = make(*((n, k + ldb_pad) if trans_b else (k, n + ldb_pad)))
    b = b_store[:, :k] if trans_b else b_store[:, :n]
    ldc = m + ldc_pad
    c = make(n, ldc) if beta else fill((n, ldc), np.nan)
    c[:, m:] = fill((n, ldc_pad), PAD)
    c0 = c.copy()
    v = 16 // a.itemsize
    ldb = b_store.shape[1]
    vec = int(b.ctypes.data % 16 == 0 and ldb % v == 0 and (trans_b or n % v == 0))
    d = {"TRANS_B": str(int(trans_b)), "DTYPE": str(DTYPES[dtype]), "TRANS_A": str(int(trans_a)), "VEC_B": str(vec),
         "BIAS": str(bias), "ACT": str(act), "SPLIT_K": str(int(splits > 1)), "CLUSTER_K": str(cluster), "C_T": "1",
         **(defines or {})}
    if mr is not None:
        d["MR"] = str(mr)
    kernel, const = _build("gemm_skinny", tuple(sorted(d.items())))
    mem = Memory()
    for x in (a, b_store, c):
        mem.add(x)
    bvec = make(n if bias == 1 else m) if bias else np.zeros(1, np_type)
    mem.add(bvec)
    grid = (-(-n // const["TN"]), -(-m // const["TM"]), 1)
    args = dict(A=a.ctypes.data, B=b.ctypes.data, C=c.ctypes.data, M=m, N=n, K=k, lda=a.shape[1], ldb=ldb, ldc=ldc,
                alpha=alpha, beta=beta, bias=bvec.ctypes.data if bias else 0, k_chunk=0, split_stride=0)
    if splits > 1:
        # as runtime/split_k.py: k_chunk whole 256s, the workspace M x N (ld = N), alpha 1, beta 0
        chunk = -(-(-(-k // splits)) // 256) * 256
        s = -(-k // chunk)
        ws = np.full((s, m, n), np.nan, np.float32)
        mem.add(ws)
        kernel.run((grid[0], grid[1], s), (const["THREADS"], 1, 1),
                   {**args, "C": ws.ctypes.data, "ldc": n, "k_chunk": chunk, "split_stride": m * n, "alpha": 1.0,
                    "beta": 0.0}, mem, const["SMEM_BYTES"])
        assert np.isfinite(ws).all()            # every element of every slice written, untransposed
        rk, rc = _build("splitk_reduce", (("C_T", "1"), ("C_TYPE", str(DTYPES[dtype])), ("VEC", str(reduce_vec))))
        rk.run((-(-n // rc["COLS"]), m, 1), (rc["THREADS"], 1, 1),
               dict(W=ws.ctypes.data, C=c.ctypes.data, M=m, N=n, ldc=ldc, splits=s, split_stride=m * n, alpha=alpha,
                    beta=beta), mem)
    else:
        kernel.run((grid[0], grid[1], cluster), (const["THREADS"], 1, 1), args, mem, const["SMEM_BYTES"],
                   cluster=(1, 1, cluster))
    assert c[:, m:].tobytes() == c0[:, m:].tobytes(), "C's padding past M was written"
    got = _values(c[:, :m], dtype).T
    av, bv = _values(a, dtype), _values(b, dtype)
    want = alpha * ((av.T if trans_a else av) @ (bv.T if trans_b else bv))
    if beta:
        want = want + beta * _values(c0[:, :m], dtype).T
    if bias:
        bb = _values(bvec, dtype)
        want = want + (bb[None, :] if bias == 1 else bb[:, None])     # BIAS=1: per kernel column n
    want = BY_CODE[act](want)
    assert np.isfinite(got).all()
    return float(np.linalg.norm(got - want) / (np.linalg.norm(want) or 1.0))


@pytest.mark.parametrize("dtype", sample_every(2, ["float32", "float16"]))
@pytest.mark.parametrize("trans_b", sample_every(2, [0, 1]))
@pytest.mark.parametrize("m", sample_every(2, [1, 3, 16]))
@pytest.mark.parametrize("k", sample_every(2, [7, 300]))
def test_c_t_stores_transposed_at_odd_shapes(dtype, trans_b, m, k):
    """M = 1, 3, 16 (16-bit: 8, its largest block), N = 5 and 130 (partial and more than one
    column block), K = 7 and 300, both layouts of B; C's ldc = M + 3."""
    mr = None
    if dtype != "float32" and m == 16:
        m = 8
    if trans_b:
        mr = 1 if m == 1 else (4 if m <= 4 else 16 if m > 8 else 8)
    else:
        mr = 4 if m <= 4 else 16 if m > 8 else 8
    for n in (5, 130):
        err = _simulate_ct(m, n, k, dtype, trans_b=trans_b, mr=mr)
        assert err < LIMITS[dtype], (m, n, k, dtype, trans_b, err)


@pytest.mark.parametrize("case", sample_every(6, [
    dict(m=3, n=89, k=700, trans_b=1, mr=4, alpha=0.5, beta=-1.5),               # issue 32's shape, smaller K
    dict(m=5, n=70, k=600, trans_b=1, mr=8, bias=1, act=2, beta=0.5, ldc_pad=0),
    dict(m=2, n=70, k=600, trans_b=1, mr=2, bias=2, act=4, trans_a=True),
    dict(m=14, n=40, k=1029, trans_b=1, mr=16, ldb_pad=3, beta=2.0),             # K tail, B unaligned rows
    dict(m=3, n=33, k=5000, trans_b=1, mr=4, cluster=3, alpha=1.5, beta=0.25),
    dict(m=6, n=70, k=2100, trans_b=1, mr=8, dtype="float16", cluster=2, bias=1, act=3),
    dict(m=4, n=40, k=700, trans_b=1, mr=4, dtype="bfloat16", ldb_pad=3, bias=2, act=1, beta=2.0),
    dict(m=3, n=130, k=300, trans_b=0, mr=4, alpha=2.0, beta=0.5, bias=1, act=2),
    dict(m=11, n=300, k=300, trans_b=0, mr=16, bias=2, act=4, ldb_pad=1),       # B element by element
    dict(m=5, n=200, k=600, trans_b=0, mr=8, cluster=2, beta=1.0, ldc_pad=0),
    dict(m=7, n=260, k=300, trans_b=0, mr=8, dtype="bfloat16", beta=-1.0, bias=1, act=1, trans_a=True),
    dict(m=3, n=37, k=2100, trans_b=1, mr=4, splits=3, alpha=2.0, beta=0.5),     # partial pass + reduce C_T
    dict(m=5, n=64, k=1500, trans_b=1, mr=8, splits=2, reduce_vec=1, beta=-1.0),
    dict(m=6, n=70, k=2100, trans_b=1, mr=8, dtype="float16", splits=2, beta=0.5),
    dict(m=3, n=130, k=600, trans_b=0, mr=4, splits=2, reduce_vec=0, alpha=0.5),
    dict(m=4, n=256, k=800, trans_b=0, mr=4, dtype="bfloat16", splits=3, reduce_vec=1, beta=1.0),
]), ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_c_t_with_beta_bias_activations_clusters_and_splits(case):
    case = dict(case)
    dtype = case.pop("dtype", "float32")
    m, n, k = case.pop("m"), case.pop("n"), case.pop("k")
    err = _simulate_ct(m, n, k, dtype, **case)
    assert err < LIMITS[dtype], err


@pytest.mark.parametrize("c_type, vec", [(0, 0), (0, 1), (1, 1), (2, 0)])
def test_the_reduce_alone_stores_transposed(c_type, vec):
    """splitk_reduce with C_T=1 on a given workspace: C[j, i] (ldc = M + 2) = alpha sum_s W[s, i, j]
    + beta C[j, i], in split order; beta = 0 never reads C, the padding stays."""
    dtype = {0: "float32", 1: "float16", 2: "bfloat16"}[c_type]
    m, n, s = 3, 260 if vec else 259, 5
    rng = np.random.default_rng(c_type)
    ws = rng.standard_normal((s, m, n)).astype(np.float32)
    kernel, const = _build("splitk_reduce", (("C_T", "1"), ("C_TYPE", str(c_type)), ("VEC", str(vec))))
    for beta in (0.0, 0.75):
        x = rng.standard_normal((n, m + 2)).astype(np.float32)
        if not beta:
            x[:, :m] = np.nan
        c = _bf16_bits(x) if dtype == "bfloat16" else x.astype(NP_TYPES[dtype])
        c0 = c.copy()
        mem = Memory()
        mem.add(ws)
        mem.add(c)
        kernel.run((-(-n // const["COLS"]), m, 1), (const["THREADS"], 1, 1),
                   dict(W=ws.ctypes.data, C=c.ctypes.data, M=m, N=n, ldc=m + 2, splits=s, split_stride=m * n,
                        alpha=1.5, beta=beta), mem)
        acc = ws[0].copy()
        for i in range(1, s):
            acc += ws[i]
        want = np.float32(1.5) * acc
        if beta:
            want = want + np.float32(beta) * _values(c0[:, :m], dtype).T.astype(np.float32)
        err = np.linalg.norm(_values(c[:, :m], dtype).T - want) / np.linalg.norm(want)
        assert err < LIMITS[dtype], err
        assert c[:, m:].tobytes() == c0[:, m:].tobytes()
