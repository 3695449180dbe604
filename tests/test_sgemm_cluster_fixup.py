"""sgemm.sasm's split-K past 8 ways in one launch (CLUSTER_K = C with SPLIT_FIXUP = 1, the runtime's
"cluster+in_kernel"), on the CPU:

  * the interpreter (tests/ptx_sim.py: clusters of (1, 1, C), the counters' atomics) runs the
    kernel; C must be, bit for bit, the partial pass's slices (SPLIT_K=1, run in the interpreter
    too) added as the kernel's header says: each cluster's C slices in rank order (a block past the
    split's last chunk adds zeros), then the G clusters' sums in order from -0.0, times alpha, beta *
    C added; whatever order the clusters finish in, and twice in a row (the counters wrap back to 0).
    Partial tiles, S not a multiple of C, odd leading dimensions, the cp.async and 128-wide builds;
  * ptxas: the builds have no spills or local memory;
  * the runtime: sgemm's catalog offers "/sNcC" past 8 splits on sm_90, the model ranks them, and
    a plain in-kernel sum (SPLIT_K=1 with the fixup switch) is the kernel's own refusal.

The GPU side is tests/test_sgemm_cluster_fixup_gpu.py."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from asmgemm.pipeline import BuildOptions, assemble, build_file
from asmgemm.runtime import catalog, dispatch, split_k
from asmgemm.runtime.plan import fresh_plan
from asmgemm.toolchain import find_tool
from ptx_sim import aligned_array
from split_sim import hybrid_runs, partial_pass

SPEC = get_spec("sgemm")
T64 = dict(THREADS=64, BK=16)                      # the catalog's t64x64_k16
T64_ASYNC = dict(THREADS=64, BK=16, ASYNC=1)       # t64x64_k16_cpasync
T128 = dict(THREADS=256, RQ=2, BK=16)              # t128x128_k16

# (set, TRANS_A, TRANS_B, M, N, K, alpha, beta, k_chunk, A's and B's row padding, C's padding, C)
CASES = {
    # S = 13 in clusters of 4: grid z 16, three blocks with no k; lda 201 (scalar loads of A)
    "t64_nn_s13c4": (T64, 0, 0, 70, 66, 200, 0.75, 0.0, 16, (1, 0), 0, 4),
    # S = 10 in clusters of 8: grid z 16, six empty; beta and a padded C
    "t64async_tt_s10c8_beta": (T64_ASYNC, 1, 1, 20, 40, 150, -1.5, 0.5, 16, (0, 3), 3, 8),
    # S = 10 in clusters of 4 (G = 3): a 128 x 128 tile over two column tiles
    "t128_tn_s10c4": (T128, 1, 0, 33, 130, 300, 1.0, 0.0, 32, (0, 1), 0, 4),
}


def _build(target: str, **defines):
    return build_file("sgemm", BuildOptions(defines={k: str(v) for k, v in defines.items()}, target=target))


def _problem(case):
    st, ta, tb, m, n, k, alpha, beta, chunk, pads, c_pad, cl = case
    rows_a, cols_a = (k, m) if ta else (m, k)
    rows_b, cols_b = (n, k) if tb else (k, n)
    lda, ldb = cols_a + pads[0], cols_b + pads[1]
    rng = np.random.default_rng(7)
    a = aligned_array((rows_a, lda), np.float32)
    a[...] = rng.uniform(-1, 1, a.shape)
    b = aligned_array((rows_b, ldb), np.float32)
    b[...] = rng.uniform(-1, 1, b.shape)
    c0 = aligned_array((m, n + c_pad), np.float32)
    c0[...] = rng.uniform(-1, 1, c0.shape)
    # the runtime's call values: 128-bit loads only where rows are whole 16-byte pieces
    kind = dict(st, TRANS_A=ta, TRANS_B=tb, VEC_A=int(lda % 4 == 0 and (not ta or m % 4 == 0)),
                VEC_B=int(ldb % 4 == 0 and (tb or n % 4 == 0)))
    return kind, a, b, c0, lda, ldb


def _args(mem, a, b, c, m, n, k, lda, ldb, ldc, **extra):
    args = dict(A=mem.add(a), B=mem.add(b), C=mem.add(c), M=m, N=n, K=k, lda=lda, ldb=ldb, ldc=ldc, alpha=1.0,
                beta=0.0, bias=0, batch_stride_a=0, batch_stride_b=0, batch_stride_c=0, k_chunk=k, split_stride=0,
                workspace=0, tile_counters=0)
    args.update(extra)
    return args


def _partial_slices(case):
    """The partial pass's S slices (SPLIT_K=1, alpha 1, beta 0) and C's initial value."""
    st, ta, tb, m, n, k, alpha, beta, chunk, pads, c_pad, cl = case
    kind, a, b, c0, lda, ldb = _problem(case)
    built = _build("sm_80", **kind, SPLIT_K=1)
    ws, _ = partial_pass(built, (built.constants["TM"], built.constants["TN"]), m, n, math.ceil(k / chunk),
                         lambda mem, ws: _args(mem, a, b, ws, m, n, k, lda, ldb, n, k_chunk=chunk, split_stride=m * n))
    return ws, c0


def _expected(case, ws, c0):
    """C as the kernel's header says it adds the slices (numpy float32, one rounding an add)."""
    alpha, beta, cl = np.float32(case[6]), np.float32(case[7]), case[11]
    splits, m, n = ws.shape
    total = np.full((m, n), -0.0, np.float32)
    for g in range(-(-splits // cl)):
        part = ws[g * cl]
        for r in range(1, cl):
            s = g * cl + r
            part = part + (ws[s] if s < splits else np.float32(0.0))
        total = total + part
    total = total * alpha
    if beta != 0:
        total = (c0[:, :n].astype(np.float64) * beta + total).astype(np.float32)   # one fma: exact product
    c = c0.copy()
    c[:, :n] = total
    return c


def _hybrid(case, order=None, runs=1):
    """C from `runs` launches of CLUSTER_K = C, SPLIT_FIXUP = 1 on one workspace and counters."""
    st, ta, tb, m, n, k, alpha, beta, chunk, pads, c_pad, cl = case
    kind, a, b, c0, lda, ldb = _problem(case)
    built = _build("sm_90", **kind, CLUSTER_K=cl, SPLIT_FIXUP=1)
    c = c0.copy()
    out, grid_ = hybrid_runs(built, (built.constants["TM"], built.constants["TN"]), m, n, math.ceil(k / chunk), cl, c,
                             lambda mem, ws, ctr: _args(mem, a, b, c, m, n, k, lda, ldb, n + c_pad, alpha=alpha,
                                                        beta=beta, k_chunk=chunk, split_stride=m * n, workspace=ws,
                                                        tile_counters=ctr), order, runs)
    return out, c0, grid_


@pytest.mark.parametrize("name", list(CASES))
def test_clusters_summed_in_the_kernel_give_the_grouped_sum_bit_for_bit(name):
    case = CASES[name]
    ws, c0 = _partial_slices(case)
    want = _expected(case, ws, c0)
    (got,), _, _ = _hybrid(case)
    n = case[4]
    assert np.array_equal(got[:, :n].view(np.uint32), want[:, :n].view(np.uint32)), \
        "C's bits differ from the grouped sum of the slices"
    assert np.array_equal(got[:, n:].view(np.uint32), c0[:, n:].view(np.uint32)), "C's padding written"


def test_the_sum_does_not_depend_on_the_order_clusters_finish_in_and_repeats():
    case = CASES["t64_nn_s13c4"]
    ws, c0 = _partial_slices(case)
    want = _expected(case, ws, c0)
    gx, gy = 2, 2                                  # 70 x 66 in 64 x 64 tiles
    clusters = [(x, y, z) for z in range(0, 16, 4) for y in range(gy) for x in range(gx)]
    got, _, grid_ = _hybrid(case, order=list(reversed(clusters)), runs=2)
    assert grid_ == (gx, gy, 16)
    for c in got:
        assert np.array_equal(c.view(np.uint32), want.view(np.uint32))


def test_the_sum_is_close_to_float64():
    case = CASES["t64async_tt_s10c8_beta"]
    (got,), c0, _ = _hybrid(case)
    _, a, b, _, _, _ = _problem(case)
    m, n, k = case[3:6]
    a64, b64 = a[:k, :m].astype(np.float64).T, b[:n, :k].astype(np.float64).T
    ref = -1.5 * (a64 @ b64) + 0.5 * c0[:, :n].astype(np.float64)
    np.testing.assert_allclose(got[:, :n], ref, rtol=1e-5, atol=1e-5 * math.sqrt(k))


# ---- the builds --------------------------------------------------------------------------------
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("cfg", ["t128x128_k16", "t64x64_k16", "t64x64_k16_cpasync"])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_builds_have_no_spills(cfg, layout):
    entry = next(e for e in SPEC.configs if e.name == cfg)
    result = _build("sm_90", **dict(entry.set), TRANS_A=int(layout[0] == "t"), TRANS_B=int(layout[1] == "t"),
                    CLUSTER_K=8, SPLIT_FIXUP=1)
    (k,) = assemble(result).kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == k.stack_frame == 0, k
    ptx = result.ptx
    assert "atom.global.inc.u32" in ptx and "[param_workspace]" in ptx and ptx.count("barrier.cluster.wait") == 2


def test_a_plain_in_kernel_sum_is_refused_by_the_kernel():
    with pytest.raises(AsmError, match="SPLIT_FIXUP sums the clusters' sums"):
        _build("sm_90", SPLIT_K=1, SPLIT_FIXUP=1)


# ---- the runtime -------------------------------------------------------------------------------
def test_the_catalog_offers_it_past_eight_splits_on_sm_90_only():
    cands = catalog.candidates(SPEC, 80, 5152, "sm_90", plain=True)
    hybrid = [c for c in cands if c.reduce == "cluster+in_kernel"]
    assert hybrid and all(c.splits > split_k.MAX_CLUSTER_SPLITS and c.kernel == "sgemm" for c in hybrid)
    assert {(c.config, c.splits) for c in hybrid} == {(c.config, c.splits) for c in cands
                                                      if c.kernel == "sgemm" and c.reduce == "kernel" and c.splits > 8}
    assert not any(c.reduce == "cluster+in_kernel" for c in catalog.candidates(SPEC, 80, 5152, "sm_80", plain=True))
    c = next(c for c in hybrid if c.config == "t64x64_k16" and c.splits == 16)
    assert c.label == "t64x64_k16/s16c8"
    build = dispatch.candidate_build(c, fresh_plan(80, 96, 5152, "nn", 4), 132, "sm_90", True)
    assert build.in_cluster == 8 and build.fixup and build.split.splits == 16
    assert {k: build.defines[k] for k in ("SPLIT_K", "CLUSTER_K", "SPLIT_FIXUP")} == \
        {"SPLIT_K": 0, "CLUSTER_K": 8, "SPLIT_FIXUP": 1}
