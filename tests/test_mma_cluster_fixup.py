"""Split-K past 8 ways in one launch (issue 32's deep-K few-output calls: mma_gemm.sasm's CLUSTER_K = C
with SPLIT_FIXUP = 1, reduce "cluster+in_kernel"), on the CPU:

  * the interpreter (tests/ptx_sim.py: clusters of (1, 1, C), the counters' atomics) runs the
    kernel; C must be, bit for bit, the partial pass's slices (SPLIT_K=1, run in the interpreter
    too) added as the kernel's header says: each cluster's C slices in rank order from -0.0 (a block
    past the split's last chunk adds zeros), then the G clusters' sums in order from -0.0, times
    alpha, rounded to C's type; whatever order the clusters finish in; and twice in a row (the
    counters wrap back to zero). S not a multiple of C, partial tiles, odd leading dimensions;
  * ptxas: the builds have no spills or local memory; the empty blocks' branch comes before any
    global load (their copies' set-up would read before A or B);
  * the runtime: which params= ask for it, its grid, workspace and counters, the catalog's
    "/sNcC" candidates (sm_90, past 8 splits, kernels with a fixup switch), the model's terms,
    rerun_params and last_launch()'s name of it.

The GPU side is tests/test_mma_cluster_fixup_gpu.py."""
from __future__ import annotations

import math
import re
from types import SimpleNamespace

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from asmgemm.pipeline import assemble
from asmgemm.runtime import catalog, cost_model, dispatch, split_k
from asmgemm.runtime.catalog import Candidate
from asmgemm.runtime.cost_model import ConfigFit, DeviceModel
from split_sim import hybrid_runs
from test_mma_cluster_k import SMALL, SPEC, _args, _as_f64, _build, _plan, _problem, needs_tools, partial_slices

# (C mode, TRANS_A, TRANS_B, M, N, K, alpha, beta, k_chunk, pads, C's pad, cluster C): S = ceil(K / 64)
CASES = {
    # S = 10 in clusters of 4: grid z 12, two blocks with no k range; lda 641 (2-byte copies of A)
    "f16_nn_s10c4": ("f16", 0, 0, 70, 40, 640, 0.75, 0.0, 64, (1, 0), 0, 4),
    # S = 9 in clusters of 4 (three empty), B MN-major with odd rows: its copies' last granule
    "f32c_tt_s9c4_ldc": ("f32", 1, 1, 20, 66, 570, -1.5, 0.0, 64, (0, 1), 3, 4),
    # S = 12 in clusters of 8: 16 blocks, G = 2; two tile rows (each rank's rows), partial tiles
    "f16_tn_s12c8": ("f16", 1, 0, 72, 65, 760, 1.0, 0.0, 64, (3, 1), 2, 8),
}


def _slices(case):
    """The partial pass's S slices (alpha 1, beta 0): what each split's block sums."""
    ws, c0, _ = partial_slices(case)
    return ws, c0


def _expected(case, ws, c0):
    """C as the kernel's header says it adds the slices (numpy float32, one rounding an add)."""
    c_mode, alpha, cl = case[0], np.float32(case[6]), case[11]
    splits, m, n = ws.shape
    groups = -(-splits // cl)
    total = np.full((m, n), -0.0, np.float32)
    for g in range(groups):
        part = np.full((m, n), -0.0, np.float32)
        for r in range(cl):
            s = g * cl + r
            part = part + (ws[s] if s < splits else np.float32(0.0))
        total = total + part
    total = total * alpha
    c = c0.copy()
    c[:, :n] = total if c_mode == "f32" else total.astype(np.float16)
    return c


def _hybrid(case, ws_c0, order=None, runs=1):
    """C from `runs` launches of CLUSTER_K = C, SPLIT_FIXUP = 1 on one workspace and counters."""
    c_mode, ta, tb, m, n, k, alpha, beta, chunk, pads, c_pad, cl = case
    kind, a, b, c0, lda, ldb = _problem(c_mode, ta, tb, m, n, k, pads, c_pad)
    built = _build("mma_gemm", "sm_90", **kind, CLUSTER_K=cl, SPLIT_FIXUP=1)
    c = c0.copy()
    out, grid_ = hybrid_runs(built, (built.constants["BM"], built.constants["BN"]), m, n, math.ceil(k / chunk), cl, c,
                             lambda mem, ws, ctr: _args(mem, a, b, c, m, n, k, lda, ldb, n + c_pad, alpha=alpha,
                                                        beta=beta, k_chunk=chunk, split_stride=m * n, workspace=ws,
                                                        tile_counters=ctr), order, runs)
    return out, c0, grid_


@pytest.mark.parametrize("name", list(CASES))
def test_clusters_summed_in_the_kernel_give_the_grouped_sum_bit_for_bit(name):
    case = CASES[name]
    ws, c0 = _slices(case)
    want = _expected(case, ws, c0)
    (got,), c0_again, grid_ = _hybrid(case, None)
    word = np.uint32 if case[0] == "f32" else np.uint16
    assert np.array_equal(got.view(word), want.view(word)), "C's bits differ from the grouped sum of the slices"
    n = case[4]
    assert np.array_equal(got[:, n:].view(word), c0[:, n:].view(word)), "C's padding written"


def test_the_sum_does_not_depend_on_the_order_clusters_finish_in_and_repeats():
    case = CASES["f16_tn_s12c8"]
    ws, c0 = _slices(case)
    want = _expected(case, ws, c0)
    gx, gy = 2, 2                                  # 72 x 65 in 64 x 64 tiles
    clusters = [(x, y, z) for z in range(0, 16, 8) for y in range(gy) for x in range(gx)]
    order = list(reversed(clusters))
    got, _, grid_ = _hybrid(case, None, order=order, runs=2)
    assert grid_ == (gx, gy, 16)
    for c in got:
        assert np.array_equal(c.view(np.uint16), want.view(np.uint16))


def test_beta_adds_c_and_stays_close_to_float64():
    case = ("f16", 0, 1, 33, 40, 700, 0.5, -1.25, 64, (0, 0), 0, 4)
    (got,), c0, _ = _hybrid(case, None)
    kind, a, b, _c0, lda, ldb = _problem(*case[:3], *case[3:6], case[9], case[10])
    a64, b64 = _as_f64(a, False)[:, :700], _as_f64(b, False)[:, :700]
    ref = 0.5 * (a64 @ b64.T) - 1.25 * _as_f64(c0, False)
    np.testing.assert_allclose(_as_f64(got, False), ref, rtol=4e-3, atol=4e-3 * math.sqrt(700))


# ---- the builds --------------------------------------------------------------------------------
@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("entry,name,cl,align", [(0, "hgemm_mma", 8, 16), (1, "bgemm_mma", 4, 2),
                                                (2, "hgemm_mma_f32c", 8, 2)])
def test_builds_have_no_spills_and_the_empty_blocks_load_nothing(entry, name, cl, align):
    e = SPEC.configs[entry]
    defines = {**dict(e.set), **{k: int(v) for k, v in dict(get_spec(name).defines).items()}, "CLUSTER_K": cl,
               "SPLIT_FIXUP": 1, "TRANS_B": 0, "ALIGN_A": align, "ALIGN_B": align}
    result = _build("mma_gemm", "sm_90", **defines)
    asm = assemble(result)
    (k,) = asm.kernels
    assert k.spill_stores == k.spill_loads == k.local_bytes == k.stack_frame == 0, k
    ptx = result.ptx
    body = ptx[ptx.index("[param_k_chunk]"):]
    branch = re.search(r"@%\w+ bra k_nonempty;", body)
    assert branch and "ld.global" not in body[:branch.start()], "a global load before the K' = 0 branch"
    assert "atom.global.inc.u32" in ptx and "[param_workspace]" in ptx and ptx.count("barrier.cluster.wait") == 2
    # the cluster's rows go to its slice, guarded to columns inside N (past N: the next row's)
    assert re.search(r"@%\w+ st\.global\.f32 \[", ptx)


def test_the_kernel_refuses_a_cluster_past_the_portable_size():
    with pytest.raises(AsmError, match="CLUSTER_K is 1"):
        _build("mma_gemm", "sm_90", **SMALL, CLUSTER_K=9, SPLIT_FIXUP=1)


# ---- the runtime -------------------------------------------------------------------------------
def test_params_naming_both_switches_ask_for_it():
    plan = _plan(21, 7, 13520)
    ask = {"SPLIT_K": 53, "CLUSTER_K": 8, "SPLIT_FIXUP": 1}
    split = split_k.choose_split(SPEC, plan, ask, None, 132)
    assert split == split_k.Split(53, 256)
    assert split_k.cluster_splits(SPEC, split, "sm_90", ask, plan, 132) == 8
    assert split_k.in_kernel_fixup(SPEC, split, ask, 8)
    assert split_k.switch_define(SPEC, split, 8, True) == {"SPLIT_K": 0, "CLUSTER_K": 8, "SPLIT_FIXUP": 1}
    # without clusters on the target: the tile's last block alone sums the 53 slices
    assert split_k.cluster_splits(SPEC, split, "sm_80", ask, plan, 132) == 0
    assert split_k.in_kernel_fixup(SPEC, split, ask, 0)
    # clusters of S that the cluster rule chose (nothing named): their sum is C's, no fixup
    assert not split_k.in_kernel_fixup(SPEC, split_k.Split(4, 3392), None, 4)
    # the fixup without the cluster switch: the plain in-kernel sum; the cluster switch alone past 8: none
    assert split_k.cluster_splits(SPEC, split, "sm_90", {"SPLIT_K": 53, "SPLIT_FIXUP": 1}, plan, 132) == 0
    assert split_k.cluster_splits(SPEC, split, "sm_90", {"SPLIT_K": 53, "CLUSTER_K": 8}, plan, 132) == 0
    with pytest.raises(AsmError, match="2 to 8 blocks"):
        split_k.cluster_splits(SPEC, split, "sm_90", {**ask, "CLUSTER_K": 16}, plan, 132)


def test_grid_workspace_and_counters():
    split = split_k.Split(53, 256)
    assert split_k.grid_splits(53, 8) == 56 and split_k.slices(53, 8) == 7
    assert split_k.grid_splits(53, 0) == 53 and split_k.slices(53) == 53
    assert split_k.fixup_counters((2, 3, 56), 8) == 48 and split_k.fixup_counters((2, 3, 53)) == 6
    plan = _plan(21, 7, 13520)
    assert split_k.fixup_workspace_elems(split, plan, 64, 8) == 7 * 21 * 7 + 64
    assert [split_k.hybrid_cluster(s) for s in (9, 12, 16, 28, 53, 64)] == [4, 4, 8, 4, 8, 8]


def test_the_catalog_offers_it_past_eight_splits_on_sm_90_only():
    cands = catalog.candidates(SPEC, 21, 13520, "sm_90", plain=True)
    hybrid = [c for c in cands if c.reduce == "cluster+in_kernel"]
    assert hybrid and all(c.splits > split_k.MAX_CLUSTER_SPLITS for c in hybrid)
    assert {c.splits for c in hybrid} == {c.splits for c in cands if c.reduce == "kernel" and c.splits > 8}
    c = next(c for c in hybrid if c.splits == 53)
    assert c.cluster == 8 and c.cluster_size == 8 and c.label.endswith("/s53c8")
    assert {k: c.params()[k] for k in ("SPLIT_K", "CLUSTER_K", "SPLIT_FIXUP")} == \
        {"SPLIT_K": 53, "CLUSTER_K": 8, "SPLIT_FIXUP": 1}
    build = dispatch.candidate_build(c, _plan(21, 7, 13520), 132, "sm_90", True)
    assert build.in_cluster == 8 and build.fixup and build.split.splits == 53
    assert {k: build.defines[k] for k in ("SPLIT_K", "CLUSTER_K", "SPLIT_FIXUP")} == \
        {"SPLIT_K": 0, "CLUSTER_K": 8, "SPLIT_FIXUP": 1}
    assert not any(c.reduce == "cluster+in_kernel" for c in catalog.candidates(SPEC, 21, 13520, "sm_80", plain=True))
    # a kernel without a fixup switch: none (sgemm_skinny's clusters add only up to 8 splits)
    assert not any(c.reduce == "cluster+in_kernel" and c.kernel == "sgemm_skinny"
                   for c in catalog.candidates(get_spec("sgemm"), 8, 13520, "sm_90", plain=True))


def test_the_model_prices_clusters_then_slices_spread_over_the_ranks():
    """128 x 64 x 4096 in 64 x 64 tiles (2 tiles of C), S = 12 in clusters of 4 (G = 3): 24 blocks;
    the split term is the cluster term, the hand-off, and 3 slices written and read (C written) at
    the reduce bandwidth, the reading share 2 x 4 / 4 SMs = 1; the host the call's and the kept
    scratch's (no second launch)."""
    dm = DeviceModel("Hand GPU", sms=4, clock_hz=1e9, dram_bytes_per_s=1e12, host_s=10e-6, launch_s=5e-6,
                     scratch_s=2e-6, reduce_fixed_s=2e-6, reduce_bytes_per_s=1e11, cluster_block_s=1e-6,
                     fixup_fixed_s=1.5e-6,
                     configs={"hgemm_mma:t": ConfigFit(1e-6, 0.5e-6, 0.5, 2, samples=5)})
    cand = Candidate("hgemm_mma", "t", "hgemm_mma", (), (64, 64, 32), 12, "cluster+in_kernel", cluster=4)
    e = cost_model.estimate(cand, 128, 64, 4096, dm, "float16", 2, 2)
    assert e.tiles == 24 and e.host_s == pytest.approx(12e-6)      # host and the kept scratch
    slots = e.slots
    want = 1e-6 * math.ceil(24 / slots) + 1.5e-6 + 3 * 128 * 64 * 4 / 1e11 + (3 * 128 * 64 * 4 + 128 * 64 * 2) / 1e11
    assert e.split_s == pytest.approx(want)
    # S = 9 in clusters of 4 rounds the grid up to 12 a tile
    e9 = cost_model.estimate(Candidate("hgemm_mma", "t", "hgemm_mma", (), (64, 64, 32), 9, "cluster+in_kernel",
                                       cluster=4), 128, 64, 4096, dm, "float16", 2, 2)
    assert e9.tiles == 24
    assert cost_model.split_kind("t/s53c8") == "t/s*c*" and cost_model.split_kind("t/s4c") == "t/s*c"
    assert cost_model.split_kind("t/s12") == "t/s*"


def test_rerun_params_and_the_reduce_name():
    from asmgemm.runtime.kept_launch import FixupNeeds, _reduce_kind, _rerun_params
    split = split_k.Split(53, 256)
    kept = SimpleNamespace(spec_name="hgemm_mma", split=None, fixup=FixupNeeds(split, 0, 0), cluster_splits=8)
    params = {"BM": "64", "SPLIT_K": "0", "CLUSTER_K": "8", "SPLIT_FIXUP": "1"}
    assert _rerun_params(kept, params) == {"BM": 64, "SPLIT_K": 53, "CLUSTER_K": 8, "SPLIT_FIXUP": 1}
    assert _reduce_kind(kept) == "cluster+in_kernel"
    assert _reduce_kind(SimpleNamespace(split=None, fixup=FixupNeeds(split, 0, 0), cluster_splits=0)) == "in_kernel"
