"""Split-K inside clusters for the portable kernel (issue 32: mma_gemm.sasm's CLUSTER_K = S), on the CPU:

  * the kernel's PTX run by the interpreter (tests/ptx_sim.py runs a cluster of (1, 1, S) blocks
    together: mapa, ld.shared::cluster, barrier.cluster) gives C bit for bit what the partial pass
    (SPLIT_K=1) and splitk_reduce.sasm give at the same S and k_chunk: fp16, bf16 and fp32 C, alpha
    and beta, partial tiles, odd leading dimensions (2-byte copies), S = 3, 4, 6 and 8; and C is
    close to float64;
  * ptxas: each catalog tiling of hgemm_mma, bgemm_mma and the *_f32c twins with CLUSTER_K = 2, 4, 8
    for sm_90 builds without spills or local memory, and the SASS has the fragments' stores into
    the tile of sums, the two cluster barriers and the cross-block loads; CLUSTER_K = 1 has none;
  * the refusals (a target without clusters, the other split modes, batched, grouped, a fused
    epilogue, past the portable cluster size);
  * the runtime's side: the spec's cluster switch (inherited by the like = kernels), the catalog's
    "/sNc" candidates on sm_90 only, the model ranking them, and which params= run in clusters.

The GPU side (the same bits on the device, against the reduce kernel and float64) is
tests/test_mma_cluster_k_gpu.py."""
from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from asmgemm.pipeline import BuildOptions, assemble, build_file
from asmgemm.runtime import catalog, dispatch, split_k
from asmgemm.toolchain import disassemble, find_tool
from catalog_entries import entries_that_split
from ptx_sim import Kernel, Memory, aligned_array as _aligned
from split_sim import partial_pass
from sweeps import sample_every
from test_splitk_fixup import _operand        # fp16 values or bf16 bit patterns, as the fixup tests draw them

SMALL = dict(BM=64, BN=64, WM=32, WN=32)
SPEC = get_spec("hgemm_mma")
KERNELS = ("hgemm_mma", "bgemm_mma", "hgemm_mma_f32c", "bgemm_mma_f32c")
needs_tools = pytest.mark.skipif(find_tool("ptxas", required=False) is None
                                 or find_tool("nvdisasm", required=False) is None, reason="needs ptxas and nvdisasm")


def _build(name: str, target: str, **defines):
    return build_file(name, BuildOptions(defines={k: str(v) for k, v in defines.items()}, target=target))


# ---- the kernel in the interpreter -------------------------------------------------------------
def _as_f64(x, bf16: bool) -> np.ndarray:
    if x.dtype == np.uint16 and bf16:
        return (x.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    return x.astype(np.float64)


def _align(ld: int) -> int:
    """The copy width of rows of ld halves (the runtime's align_a/align_b on 256-byte aligned data)."""
    return next(w for w in (16, 8, 4, 2) if ld * 2 % w == 0)


def _args(mem, a, b, c, m, n, k, lda, ldb, ldc, **extra):
    args = dict(A=mem.add(a), B=mem.add(b), C=mem.add(c), M=m, N=n, K=k, lda=lda, ldb=ldb, ldc=ldc, alpha=1.0,
                beta=0.0, bias=0, batch_stride_a=0, batch_stride_b=0, batch_stride_c=0, offs=0, groups=0, k_chunk=k,
                split_stride=0, workspace=0, tile_counters=0)
    args.update(extra)
    return args


# (C mode, TRANS_A, TRANS_B, M, N, K, alpha, beta, k_chunk, A's and B's row padding, C's): partial
# tiles both ways, K no multiple of the chunk (a shorter last split), S = ceil(K / k_chunk)
CASES = {
    "f16_nn_beta_s4": ("f16", 0, 0, 70, 75, 200, 0.75, -1.25, 64, (1, 0), 0),    # lda 201, ldb 75: 2-byte copies
    "bf16_tt_s3": ("bf16", 1, 1, 33, 40, 150, 1.0, 0.0, 64, (0, 0), 0),
    "f32c_nt_beta_ldc_s6": ("f32", 0, 1, 20, 130, 330, -0.5, 2.0, 64, (0, 3), 3),
    "f16_tn_s8": ("f16", 1, 0, 9, 66, 500, 1.5, 0.5, 64, (3, 1), 2),
}


def _problem(c_mode, ta, tb, m, n, k, pads, c_pad):
    bf16 = c_mode == "bf16"
    rows_a, cols_a = (k, m) if ta else (m, k)
    rows_b, cols_b = (n, k) if tb else (k, n)
    lda, ldb = cols_a + pads[0], cols_b + pads[1]
    # (stored with their padding, which the kernel may read: mem.add registers the whole rows)
    a = _operand((rows_a, lda), bf16, 1)
    b = _operand((rows_b, ldb), bf16, 2)
    if c_mode == "f32":
        c0 = _aligned((m, n + c_pad), np.float32)
        c0[...] = np.random.default_rng(3).uniform(-1, 1, c0.shape)
    else:
        c0 = _operand((m, n + c_pad), bf16, 3)
    kind = dict(SMALL, TRANS_A=ta, TRANS_B=tb, BF16=int(bf16), C_F32=int(c_mode == "f32"), ALIGN_A=_align(lda),
                ALIGN_B=_align(ldb))
    return kind, a, b, c0, lda, ldb


def partial_slices(case):
    """The partial pass's S slices (alpha 1, beta 0, into a workspace), C's initial value and the
    interpreter's memory they live in."""
    c_mode, ta, tb, m, n, k, alpha, beta, chunk, pads, c_pad = case[:11]
    kind, a, b, c0, lda, ldb = _problem(c_mode, ta, tb, m, n, k, pads, c_pad)
    built = _build("mma_gemm", "sm_80", **kind, SPLIT_K=1)
    ws, mem = partial_pass(built, (built.constants["BM"], built.constants["BN"]), m, n, math.ceil(k / chunk),
                           lambda mem, ws: _args(mem, a, b, ws, m, n, k, lda, ldb, n, k_chunk=chunk,
                                                 split_stride=m * n))
    return ws, c0, mem


def _two_launches(case):
    """C from the partial pass (alpha 1, beta 0, into the workspace) and splitk_reduce.sasm."""
    c_mode, ta, tb, m, n, k, alpha, beta, chunk, pads, c_pad = case
    ws, c0, mem = partial_slices(case)
    splits = ws.shape[0]
    reduce = _build("splitk_reduce", "sm_80", C_TYPE={"f32": 0, "f16": 1, "bf16": 2}[c_mode], VEC=0)
    c = c0.copy()
    mem.add(c)
    Kernel(reduce.ptx).run((math.ceil(n / reduce.constants["COLS"]), m, 1), (reduce.constants["THREADS"], 1, 1),
                           dict(W=ws.ctypes.data, C=c.ctypes.data, M=m, N=n, ldc=n + c_pad, splits=splits,
                                split_stride=m * n, alpha=alpha, beta=beta), mem)
    return c


def _in_clusters(case):
    """C from one launch of CLUSTER_K = S: grid z = S, the S blocks of a tile one cluster."""
    c_mode, ta, tb, m, n, k, alpha, beta, chunk, pads, c_pad = case
    kind, a, b, c0, lda, ldb = _problem(c_mode, ta, tb, m, n, k, pads, c_pad)
    splits = math.ceil(k / chunk)
    built = _build("mma_gemm", "sm_90", **kind, CLUSTER_K=splits)
    p = built.constants
    c = c0.copy()
    mem = Memory()
    Kernel(built.ptx).run((math.ceil(n / p["BN"]), math.ceil(m / p["BM"]), splits), (p["THREADS"], 1, 1),
                          _args(mem, a, b, c, m, n, k, lda, ldb, n + c_pad, alpha=alpha, beta=beta,
                                k_chunk=chunk),
                          mem, p["SMEM_BYTES"], cluster=(1, 1, splits))
    return c, a, b, c0


@pytest.mark.parametrize("case", sample_every(len(CASES), list(CASES.values())), ids=list(CASES))
def test_clusters_give_the_two_launch_bits(case):
    want = _two_launches(case)
    got, a, b, c0 = _in_clusters(case)
    word = np.uint32 if case[0] == "f32" else np.uint16
    assert np.array_equal(got.view(word), want.view(word)), "C's bits differ from the partial pass + reduce kernel's"
    # and both are the product (the columns past N, C's padding, untouched)
    c_mode, ta, tb, m, n, k, alpha, beta = case[:8]
    bf16 = c_mode == "bf16"
    a64 = _as_f64(a, bf16)[:, :k if not ta else m]
    b64 = _as_f64(b, bf16)[:, :n if not tb else k]
    ref = alpha * ((a64.T if ta else a64) @ (b64.T if tb else b64)) + beta * _as_f64(c0[:, :n], bf16)
    tol = 1e-5 if c_mode == "f32" else (2e-2 if bf16 else 4e-3)
    np.testing.assert_allclose(_as_f64(got[:, :n], bf16), ref, rtol=tol, atol=tol * math.sqrt(k))
    assert np.array_equal(got[:, n:].view(word), c0[:, n:].view(word))


# ---- the builds --------------------------------------------------------------------------------
def _ops(cubin: bytes) -> Counter:
    """The SASS opcodes and how often each occurs (guard predicates left out)."""
    ops = Counter()
    for line in disassemble(cubin).splitlines():
        words = line.split()
        if line.strip().startswith("/*") and len(words) > 1:
            ops[words[2] if words[1].startswith("@") and len(words) > 2 else words[1]] += 1
    return ops


def _kernel_defines(name: str) -> dict:
    """The -D values the spec gives its kernel (BF16, C_F32)."""
    return {k: int(v) for k, v in dict(get_spec(name).defines).items()}


SPLIT_ENTRIES = entries_that_split("hgemm_mma")
# each of their tilings x kernel x S, in a layout and with copy widths that vary along the sweep (the
# eight-warp tiling with 2-byte copies of both operands: the odd leading dimensions it is there for)
BUILDS = [(entry.name, name, s) for entry in SPLIT_ENTRIES for name in KERNELS for s in (2, 4, 8)]


@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("config,name,s", sample_every(12, BUILDS, unpack=True),
                         ids=[f"{c}-{n}-s{s}" for c, n, s in BUILDS])
def test_cluster_builds_have_no_spills_and_load_across_the_cluster(config, name, s):
    entry = next(e for e in SPEC.configs if e.name == config)
    i = BUILDS.index((config, name, s))
    align = 2 if dict(entry.set).get("WN") == 32 and entry.tile[0] == 128 else 16
    defines = {**dict(entry.set), **_kernel_defines(name), "CLUSTER_K": s, "TRANS_A": i % 2, "TRANS_B": i // 2 % 2,
               "ALIGN_A": align, "ALIGN_B": align}
    result = _build("mma_gemm", "sm_90", **defines)
    c = result.constants
    ptx = result.ptx
    assert f".reqnctapercluster 1, 1, {s}" in ptx and "[param_k_chunk]" in ptx and "[param_split_stride]" not in ptx
    fix_v = c["BN"] // 32
    assert ptx.count("mapa.shared::cluster") == s and ptx.count("ld.shared::cluster") == s * fix_v
    assert ptx.count("barrier.cluster.arrive.release") == 2 == ptx.count("barrier.cluster.wait.acquire")
    assert c["SMEM_BYTES"] >= c["BM"] * (c["BN"] + 8) * 4                    # the tile of sums fits
    asm = assemble(result)
    assert not asm.warnings, asm.warnings
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == k.stack_frame == 0, k
    ops = _ops(asm.cubin)
    # every fragment pair into the tile of sums (8-byte stores), both barriers, the rank's loads of
    # the S blocks' sums (ld.shared::cluster is a generic LD in the SASS), the C stores
    frags = 2 * (c["WM"] // 16) * (c["WN"] // 8)
    assert ops["STS.64"] == frags, ops
    assert ops["UCGABAR_ARV"] == 2 and ops["UCGABAR_WAIT"] == 2, ops
    assert sum(n for op, n in ops.items() if op == "LD.E" or op.startswith("LD.E.")) >= s * fix_v, ops
    assert any(op.startswith("HMMA.16816.F32") for op in ops)
    assert any(op.startswith("STG.E") for op in ops)


@pytest.mark.toolchain
@needs_tools
def test_an_unsplit_build_has_no_cluster():
    result = _build("mma_gemm", "sm_90", **SMALL)
    assert ".reqnctapercluster" not in result.ptx and "shared::cluster" not in result.ptx
    assert "barrier.cluster" not in result.ptx and result.constants["CL_BYTES"] == 0
    # the 128 x 128 tile of sums is a little more than the ring: the build grows its shared memory
    assert _build("mma_gemm", "sm_90", CLUSTER_K=2).constants["SMEM_BYTES"] == 128 * 136 * 4


@pytest.mark.parametrize("defines,message", [
    ({"CLUSTER_K": 9}, "portable cluster size"),
    ({"CLUSTER_K": 0}, "CLUSTER_K is 1"),
    ({"CLUSTER_K": 2, "SPLIT_K": 1}, "not with SPLIT_K"),
    ({"CLUSTER_K": 2, "SPLIT_K": 1, "SPLIT_FIXUP": 1}, "not with SPLIT_K"),
    ({"CLUSTER_K": 2, "BATCHED": 1}, "nor with BATCHED or GROUPED"),
    ({"CLUSTER_K": 4, "GROUPED": 1}, "nor with BATCHED or GROUPED"),
    ({"CLUSTER_K": 2, "BIAS": 1}, "no fused epilogue"),
    ({"CLUSTER_K": 8, "ACT": 2}, "no fused epilogue"),
    ({"CLUSTER_K": 2, "BN": 16, "WN": 16, "TRANS_B": 1}, "BN is a multiple of 32"),     # (builds at CLUSTER_K = 1)
])
def test_impossible_cluster_splits_are_refused(defines, message):
    with pytest.raises(AsmError, match=message):
        _build("mma_gemm", "sm_90", **defines)


@pytest.mark.parametrize("target", sample_every(3, ["sm_80", "sm_86", "sm_89"]))
def test_targets_without_clusters_refuse_them(target):
    """The kernel builds for sm_80 and later; a cluster split needs sm_90's clusters, which the
    target's feature data (asm/isa/arch.py) says these lack: a located error naming the feature."""
    with pytest.raises(AsmError, match=f"clusters needs sm_90; this build targets {target}"):
        _build("mma_gemm", target, CLUSTER_K=2, **SMALL)
    _build("mma_gemm", target, CLUSTER_K=1, **SMALL)           # CLUSTER_K = 1: the directive is left out


# ---- the runtime's side ------------------------------------------------------------------------
def _plan(m, n, k):
    from types import SimpleNamespace

    from asmgemm.runtime.plan import plan_launch

    def mat(r, c):
        return SimpleNamespace(shape=(r, c), ndim=2, strides=(c * 2, 2), dtype=SimpleNamespace(itemsize=2))
    return plan_launch(mat(m, k), mat(k, n), mat(m, n), trans_a=False, trans_b=False, ptr_of=lambda x: 256)


@pytest.mark.parametrize("name", KERNELS)
def test_every_mma_kernel_may_split_in_clusters(name):
    sk = get_spec(name).split_k
    assert (sk.switch, sk.cluster_switch, sk.fixup_switch, sk.cluster_when) == ("SPLIT_K", "CLUSTER_K", "SPLIT_FIXUP",
                                                                                None)


def test_the_catalog_offers_cluster_splits_where_the_target_has_clusters():
    """6x152x2910: each tiling's splits of at most 8 (S = 2, 3, 4, 6, 8 of the entries' asks) in
    clusters on sm_90 (beside the reduce kernel's), none on sm_80 nor for a fused call; the model
    ranks them (a cluster term, no second launch). At K = 825 the asks land on whole chunks of 64:
    6 asked gives 5 (k_chunk 192), 8 gives 7 (128), and those are the clusters offered, so the
    8-way cluster is not lost to the rounding (it was while only S = 2, 4, 8 ran in clusters)."""
    on90 = catalog.candidates(SPEC, 6, 2910, "sm_90", plain=True)
    clustered = {c.label for c in on90 if c.reduce == "cluster"}
    assert clustered == {f"{e.name}/s{s}c" for e in SPLIT_ENTRIES for s in (2, 3, 4, 6, 8)}
    assert all(c.params()["CLUSTER_K"] == c.splits and c.params()["SPLIT_FIXUP"] == 0 for c in on90
               if c.reduce == "cluster")
    assert {c.label for c in catalog.candidates(SPEC, 40, 825, "sm_90", plain=True) if c.reduce == "cluster"} == \
        {f"{e.name}/s{s}c" for e in SPLIT_ENTRIES for s in (2, 3, 4, 5, 7)}
    assert not any(c.reduce == "cluster" for c in catalog.candidates(SPEC, 6, 2910, "sm_80", plain=True))
    assert not any(c.splits > 1 for c in catalog.candidates(SPEC, 6, 2910, "sm_90", plain=False))
    choice = dispatch.choose(SPEC, "nn", 6, 152, 2910, gpu="NVIDIA H100 80GB HBM3", target="sm_90", sms=132,
                             plain=True)
    ranked = {e.candidate.label: e for e in choice.ranked}
    assert clustered <= set(ranked)
    for label in clustered:
        est = ranked[label]
        assert est.split_s > 0 and math.isfinite(est.call_s), est
        # the same split through the reduce kernel pays its second launch on the host besides
        assert est.host_s < ranked[label[:-1]].host_s


def test_params_split_in_clusters_unless_they_name_a_workspace_mode():
    """params= naming SPLIT_K = S <= 8 run in clusters of S on sm_90; CLUSTER_K = 1, or a named
    SPLIT_FIXUP (0: the reduce kernel, 1: the in-kernel sum), keep the workspace; a catalog
    candidate names both switches; past 8 blocks and on sm_80 the reduce kernel."""
    plan = _plan(40, 469, 825)
    cases = [({"SPLIT_K": 4}, 4), ({"SPLIT_K": 3, "BM": 64}, 3), ({"SPLIT_K": 4, "CLUSTER_K": 1}, 0),
             ({"SPLIT_K": 4, "SPLIT_FIXUP": 0}, 0), ({"SPLIT_K": 4, "SPLIT_FIXUP": 1}, 0),
             ({"SPLIT_K": 4, "CLUSTER_K": 4, "SPLIT_FIXUP": 0}, 4), ({"SPLIT_K": 13}, 0)]
    for params, want in cases:
        split = split_k.choose_split(SPEC, plan, params, None, 132)
        assert split is not None, params
        assert split_k.cluster_splits(SPEC, split, "sm_90", params, plan, 132) == want, params
        assert split_k.cluster_splits(SPEC, split, "sm_80", params, plan, 132) == 0, params
    split = split_k.choose_split(SPEC, plan, {"SPLIT_K": 4}, None, 132)
    assert split_k.switch_define(SPEC, split, 4) == {"SPLIT_K": 0, "CLUSTER_K": 4, "SPLIT_FIXUP": 0}
    # the fixup asked for with a cluster split: clusters win, the fixup switch stays 0
    assert not split_k.in_kernel_fixup(SPEC, split, {"SPLIT_K": 4, "SPLIT_FIXUP": 1}, 4)


def test_a_cluster_launchs_rerun_params_name_its_split():
    """last_launch()["rerun_params"] of a cluster launch (whose build has SPLIT_K = 0, CLUSTER_K = S)
    name the split by its count, so that params= run it again (without SPLIT_K they would ask for
    no split, and the cluster build would launch on an unsplit grid)."""
    from types import SimpleNamespace

    from asmgemm.runtime.kept_launch import _rerun_params
    kept = SimpleNamespace(spec_name="hgemm_mma", split=None, fixup=None, cluster_splits=4)
    params = {"BM": "64", "SPLIT_K": "0", "CLUSTER_K": "4", "SPLIT_FIXUP": "0", "ALIGN_A": "2"}
    assert _rerun_params(kept, params) == {"BM": 64, "SPLIT_K": 4, "CLUSTER_K": 4, "ALIGN_A": 2}
    unsplit = SimpleNamespace(spec_name="hgemm_mma", split=None, fixup=None, cluster_splits=0)
    assert _rerun_params(unsplit, {**params, "CLUSTER_K": "1"}) == {"BM": 64, "CLUSTER_K": 1, "ALIGN_A": 2}
