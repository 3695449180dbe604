"""The catalog dispatch on the CPU (asm/runtime/catalog.py, cost_model.py, dispatch.py,
dispatch_db.py, asm/tuning/fit.py, `asmgemm explain`, [[NAME.config]] in kernel specs): which
candidates a call has, the cost model's terms on hand-computed cases, the precedence of an exact
database hit over the model's ranking, the database's fallbacks and errors, the catalog entries'
checks, the fit recovering known coefficients, and asmgemm.gemm running what dispatch chose
(through the stand-in CuPy) and saying so in last_launch()."""
from __future__ import annotations

import dataclasses
import json
import math
import textwrap
from dataclasses import replace

import numpy as np
import pytest

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import ConfigEntry, get_spec, load_spec_file
from asmgemm.runtime import cost_model, dispatch, dispatch_db, split_k
from asmgemm.runtime.catalog import Candidate, candidates, entry_candidates
from asmgemm.runtime.split_k import MAX_CLUSTER_SPLITS
from asmgemm.runtime.cost_model import ConfigFit, DeviceModel, estimate, rank
from asmgemm.runtime.plan import fresh_plan
from asmgemm.toolchain import find_tool
from dispatch_helpers import database, dispatch_dir  # noqa: F401  (the fixture)
from fake_cupy import FakeArray
from sweeps import sample_every

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="ptxas not installed")
SGEMM = get_spec("sgemm")
T64 = (("THREADS", 64), ("BK", 16))


def labels(cands) -> list[str]:
    return [c.label for c in cands]


# ---- the catalog's candidates --------------------------------------------------------------------
def test_max_m_keeps_an_entry_to_its_rows():
    """An entry with max_m is a candidate up to that many kernel rows and not one more; the others
    are candidates at any M."""
    bounded = [e for e in SGEMM.configs if e.max_m is not None and not e.swap]
    assert bounded, "sgemm's catalog has no entry with max_m (the skinny kernel's)"
    for e in bounded:
        at = {c.config for c in candidates(SGEMM, e.max_m, 4096, "sm_90", plain=True)}
        above = {c.config for c in candidates(SGEMM, e.max_m + 1, 4096, "sm_90", plain=True)}
        assert e.name in at and e.name not in above
    # a swap entry's max_m bounds the call's N (its rows as C^T), and it is a candidate only where
    # the call may run as C^T
    for e in (e for e in SGEMM.configs if e.swap):
        at = {c.config for c in candidates(SGEMM, 100000, 4096, "sm_90", plain=True, swapped_m=e.max_m)}
        above = {c.config for c in candidates(SGEMM, 100000, 4096, "sm_90", plain=True, swapped_m=e.max_m + 1)}
        never = {c.config for c in candidates(SGEMM, 1, 4096, "sm_90", plain=True)}
        assert e.name in at and e.name not in above and e.name not in never
    unbounded = {e.name for e in SGEMM.configs if e.max_m is None}
    assert {c.config for c in candidates(SGEMM, 100000, 4096, "sm_90", plain=True)} == unbounded


def test_splits_only_for_plain_calls():
    """A fused epilogue or a batch (plain=False): one unsplit candidate per entry, in catalog order;
    a plain call with deep K adds splits, all of whose params name the split-K switch."""
    fused = candidates(SGEMM, 16, 4096, "sm_90", plain=False)
    assert labels(fused) == [e.name for e in SGEMM.configs if not e.swap]     # (swap entries: with swapped_m only)
    assert all(c.splits == 1 and c.reduce is None for c in fused)
    plain = candidates(SGEMM, 16, 4096, "sm_90", plain=True)
    assert any(c.splits > 1 for c in plain)
    assert [c for c in plain if c.splits == 1] == fused


def test_clusters_only_where_the_target_has_them():
    """sm_90 pairs a split of 2..8 with the clusters' sum as well as the reduce kernel, and a
    split past 8 with clusters whose sums the kernel adds (sgemm's fixup switch); sm_80 has no
    clusters: the reduce kernel only."""
    hopper = candidates(SGEMM, 512, 4096, "sm_90", plain=True)
    ampere = candidates(SGEMM, 512, 4096, "sm_80", plain=True)
    clustered = [c for c in hopper if c.reduce == "cluster"]
    assert clustered and all(2 <= c.splits <= MAX_CLUSTER_SPLITS for c in clustered)
    for c in clustered:              # each beside the same split through the reduce kernel
        assert any(o.config == c.config and o.splits == c.splits and o.reduce == "kernel" for o in hopper)
        assert c.label.endswith("c")
    assert not any(c.reduce == "cluster" for c in ampere)
    hybrid = [c for c in hopper if c.reduce == "cluster+in_kernel"]
    assert hybrid and all(c.splits > MAX_CLUSTER_SPLITS and c.cluster in (4, 8) for c in hybrid)
    assert not any(c.reduce == "cluster+in_kernel" for c in ampere)
    assert [c for c in hopper if c.reduce not in ("cluster", "cluster+in_kernel")] == ampere


def test_usable_and_the_target_filter_entries():
    """usable(kernel) (gemm's check of the fused epilogue) drops an entry's kernel; a target the
    family does not build for has no candidates at all."""
    without = candidates(SGEMM, 4, 4096, "sm_90", plain=True, usable=lambda k: k != "sgemm_skinny")
    assert without and not any(c.kernel == "sgemm_skinny" for c in without)
    assert any(c.kernel == "sgemm_skinny" for c in candidates(SGEMM, 4, 4096, "sm_90", plain=True))
    assert candidates(SGEMM, 4, 4096, "sm_70", plain=True) == []


def test_split_counts_that_land_on_the_same_split_are_one_candidate():
    """split_for(K, S) gives whole chunks of the kernel's k multiple: with K = 48 (multiple 16) the
    asks 2, 3, 5, 8 give 2 (chunks of 32), 3 (16), 3 and 3; the candidate is named by the split
    that results, in clusters too (any S up to MAX_CLUSTER_SPLITS); K of one chunk: no split at all."""
    e = ConfigEntry("e", "sgemm", T64, (64, 64, 16), (1, 2, 3, 5, 8))
    assert labels(entry_candidates(e, "sgemm", 48, plain=True, clusters=True)) == ["e", "e/s2", "e/s2c", "e/s3",
                                                                                  "e/s3c"]
    assert labels(entry_candidates(e, "sgemm", 48, plain=True, clusters=False)) == ["e", "e/s2", "e/s3"]
    assert labels(entry_candidates(e, "sgemm", 48, plain=False, clusters=True)) == ["e"]
    assert labels(entry_candidates(e, "sgemm", 16, plain=True, clusters=True)) == ["e"]
    # sgemm_skinny's k multiple is 256: K = 512 asked 2 or 4 ways splits 2 ways either way
    s = ConfigEntry("r4", "sgemm_skinny", (("MR", 4),), (4, 128, 256), (1, 2, 4))
    assert labels(entry_candidates(s, "sgemm", 512, plain=True, clusters=True)) == ["r4", "r4/s2", "r4/s2c"]


SWAP_FAMILY = """
[[k.config]]
name = "plain"
kernel = "sgemm"
set = { THREADS = 64, BK = 16 }
tile = [64, 64, 16]
[[k.config]]
name = "ct"
kernel = "hgemm"
set = { BN = 16 }
tile = [128, 16, 64]
max_m = 64
swap = true
"""


def test_swap_entries_only_where_the_call_may_run_as_c_transposed(tmp_path, dispatch_dir):
    """An entry with swap = true runs the call as C^T: a candidate only where the caller offers that
    launch (swapped_m: its M, the call's N), within max_m of that M; its params ask the kernel's
    transposed store; choose prices it at the C^T launch's sizes."""
    _, (fam,) = _load(tmp_path, SWAP_FAMILY)
    dispatch_dir("Test GPU")
    assert labels(candidates(fam, 4096, 512, "sm_90", plain=False)) == ["plain"]
    both = candidates(fam, 4096, 512, "sm_90", plain=False, swapped_m=16)
    assert labels(both) == ["plain", "ct"] and [c.swap for c in both] == [False, True]
    assert labels(candidates(fam, 4096, 512, "sm_90", plain=False, swapped_m=65)) == ["plain"]
    assert labels(candidates(fam, 16, 512, "sm_90", plain=False, swapped_m=4096)) == ["plain"]
    assert both[1].params()["C_T"] == 1 and "C_T" not in both[0].params()
    ch = dispatch.choose(fam, "nn", 4096, 16, 512, gpu="Test GPU", target="sm_90", sms=132, plain=False,
                         swapped=("nn", {}))
    tiles = {e.candidate.label: e.tiles for e in ch.ranked}
    assert tiles == {"plain": 64 * 1, "ct": 1 * 256}       # 4096 x 16 in 64 x 64; C^T 16 x 4096 in 128 x 16


def test_a_tie_between_a_launch_and_its_c_transposed_launch_goes_to_the_cheaper_blocks(tmp_path, dispatch_dir,
                                                                                         monkeypatch):
    """The plain and the C^T candidates are ranked apart and merged (dispatch.choose): the merged
    order is rank's (cost_model.rank_key), so where a DRAM floor ties them the one whose blocks take
    less leads, not the plain list that comes first (7 x 15739 x 6600 nt bf16 on the H200 took
    t64x128 for 7 rows, 76.7 us, over ct_t128x16_st's 62.7). Each list's estimates are made here:
    both at an 8 us floor, the C^T launch's blocks 2 us against 5."""
    _, (fam,) = _load(tmp_path, SWAP_FAMILY)
    dispatch_dir("Test GPU")
    real_rank = cost_model.rank

    def tied(cands, *args, **kw):
        ests = real_rank(cands, *args, **kw)
        return [replace(e, compute_s=2e-6 if e.candidate.swap else 5e-6, memory_s=8e-6, load_s=0.0, split_s=0.0,
                        correction=1.0) for e in ests]
    monkeypatch.setattr(dispatch, "rank", tied)
    ch = dispatch.choose(fam, "nn", 4096, 16, 512, gpu="Test GPU", target="sm_90", sms=132, plain=False,
                         swapped=("nn", {}))
    assert ch.ranked[0].call_s == ch.ranked[1].call_s
    assert [e.candidate.label for e in ch.ranked] == ["ct", "plain"]


def test_a_candidates_params_say_split_and_reduce():
    """params() is what runs exactly this candidate through gemm(params=...): the set, S under the
    split-K switch, the cluster switch 1 (the reduce kernel) or the cluster's size, and the fixup
    switch 1 where the kernel adds the clusters' sums itself."""
    one = Candidate("sgemm", "e", "sgemm", T64, (64, 64, 16))
    red = Candidate("sgemm", "e", "sgemm", T64, (64, 64, 16), 6, "kernel")
    clu = Candidate("sgemm", "e", "sgemm", T64, (64, 64, 16), 4, "cluster")
    hyb = Candidate("sgemm", "e", "sgemm", T64, (64, 64, 16), 13, "cluster+in_kernel", cluster=4)
    assert one.params() == {"THREADS": 64, "BK": 16, "SPLIT_K": 1, "CLUSTER_K": 1, "SPLIT_FIXUP": 0}
    assert one.label == "e"
    assert red.params() == {"THREADS": 64, "BK": 16, "SPLIT_K": 6, "CLUSTER_K": 1, "SPLIT_FIXUP": 0}
    assert red.label == "e/s6"
    assert clu.params() == {"THREADS": 64, "BK": 16, "SPLIT_K": 4, "CLUSTER_K": 4, "SPLIT_FIXUP": 0}
    assert clu.label == "e/s4c"
    assert hyb.params() == {"THREADS": 64, "BK": 16, "SPLIT_K": 13, "CLUSTER_K": 4, "SPLIT_FIXUP": 1}
    assert hyb.label == "e/s13c4"


# ---- the cost model on hand-computed cases -----------------------------------------------------
def _model(dram=1e12) -> DeviceModel:
    """4 SMs, a = 1 us, b = 0.5 us a K step, f = 0.5, r = 2 (8 slots); host 10 us, a further
    launch 5 us, the reduce 2 us + bytes at 100 GB/s, clusters 1 us a wave, 6 slots for 2-block
    clusters at 2 blocks an SM."""
    return DeviceModel("Hand GPU", sms=4, clock_hz=1e9, dram_bytes_per_s=dram, host_s=10e-6, launch_s=5e-6,
                       reduce_fixed_s=2e-6, reduce_bytes_per_s=1e11, cluster_block_s=1e-6,
                       configs={"sgemm:t": ConfigFit(1e-6, 0.5e-6, 0.5, 2, samples=5, variants={"tn:11:16/16": 1.5})},
                       cluster_slots={"2x2": 6})


def _cand(splits=1, reduce=None) -> Candidate:
    return Candidate("sgemm", "t", "sgemm", (("BK", 16),), (128, 128, 16), splits, reduce)


def test_full_waves():
    """512 x 512 x 256: 16 tiles on 8 slots, 2 full waves of blocks of 1 + 16 x 0.5 = 9 us: 18 us;
    the DRAM floor ((2 x 512 x 256 + 512 x 512) x 4 bytes at 1 TB/s) is 2.1 us; + 10 us host."""
    e = estimate(_cand(), 512, 512, 256, _model(), "float32", 4, 4)
    assert (e.tiles, e.slots, e.steps, e.full_waves, e.last_wave_blocks) == (16, 8, 16, 2, 0)
    assert e.block_s == pytest.approx(9e-6) and e.compute_s == pytest.approx(18e-6)
    assert e.memory_s == pytest.approx(2.097152e-6) and e.split_s == 0
    assert e.gpu_s == pytest.approx(18e-6) and e.call_s == pytest.approx(28e-6) and e.waves == 2.0
    assert e.fitted


def test_a_last_wave_costs_the_busiest_sms_share():
    """640 x 512: 20 tiles, 2 full waves and 4 blocks left, one on each of the busiest SMs: the
    last wave takes 9 (0.5 + 0.5 x 1 / 2) = 6.75 us. 1408 x 256: 22 tiles, 6 left, two on the
    busiest SM (r = 2): a whole block time, 27 us in all."""
    e = estimate(_cand(), 640, 512, 256, _model(), "float32", 4, 4)
    assert (e.tiles, e.full_waves, e.last_wave_blocks) == (20, 2, 4)
    assert e.compute_s == pytest.approx(24.75e-6)
    e = estimate(_cand(), 1408, 256, 256, _model(), "float32", 4, 4)
    assert (e.tiles, e.full_waves, e.last_wave_blocks) == (22, 2, 6)
    assert e.compute_s == pytest.approx(27e-6)


def test_a_lone_block_sheds_its_steps_share_but_not_its_fixed_part():
    """g = 1, f = 0.5: 640 x 512's last wave (one block on each busiest SM, r = 2) takes a = 1 us
    whole and its 16 K steps (8 us) at 0.5 + 0.5 / 2: 7 us, 25 in all (one share for both, f: 24.75).
    A variant's factor (tn:11:16/16, 1.5) scales the K steps alone: blocks of 1 + 12 us."""
    dm = _model()
    dm.configs["sgemm:t"] = replace(dm.configs["sgemm:t"], alone_block=1.0)
    e = estimate(_cand(), 640, 512, 256, dm, "float32", 4, 4)
    assert e.compute_s == pytest.approx(2 * 9e-6 + 1e-6 + 8e-6 * 0.75)
    e = estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4, "tn:11:16/16")
    assert e.block_s == pytest.approx(13e-6) and e.compute_s == pytest.approx(26e-6)


def test_a_fit_of_before_the_two_shares_reads_as_it_was_fitted():
    """A database entry without "alone_block" (fitted before the two shares): g = f and the variant's
    factor on the whole block, as its coefficients were fitted; one with it keeps both."""
    dm = _model()
    old = estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4, "tn:11:16/16")
    assert old.block_s == pytest.approx(9e-6 * 1.5)
    doc = {"gpu": "Hand GPU", "sms": 4, "clock_hz": 1e9, "dram_bytes_per_s": 1e12,
           "model": dispatch_db.model_to_json(dm)}
    assert "alone_block" not in doc["model"]["configs"]["sgemm:t"]
    assert dispatch_db.model_from(doc, "test").configs["sgemm:t"].alone_block is None
    dm.configs["sgemm:t"] = replace(dm.configs["sgemm:t"], alone_block=0.8)
    back = dispatch_db.model_from({**doc, "model": dispatch_db.model_to_json(dm)}, "test")
    assert back.configs["sgemm:t"].alone_block == 0.8 and back.configs["sgemm:t"].alone_fixed == 0.8


def test_a_split_through_the_reduce_kernel():
    """S = 2: 32 tiles of 8 K steps (5 us) in 4 waves, 20 us; the reduce 2 us + (2 x 512 x 512 x 4 x 2
    + 512 x 512 x 4) bytes at 100 GB/s = 54.4288 us; the host a further launch (15 us)."""
    e = estimate(_cand(2, "kernel"), 512, 512, 256, _model(), "float32", 4, 4)
    assert (e.tiles, e.steps, e.full_waves) == (32, 8, 4)
    assert e.compute_s == pytest.approx(20e-6) and e.split_s == pytest.approx(54.4288e-6)
    assert e.host_s == pytest.approx(15e-6) and e.call_s == pytest.approx(89.4288e-6)


def test_a_split_in_clusters_fills_the_slots_the_driver_gives():
    """S = 2 in clusters: 6 slots (cluster_slots), 32 tiles: 5 full waves of 5 us and 2 blocks left
    (0.75 of a block): 28.75 us; the clusters' extra 1 us x ceil(32 / 6) = 6 us; no further launch."""
    e = estimate(_cand(2, "cluster"), 512, 512, 256, _model(), "float32", 4, 4)
    assert (e.slots, e.full_waves, e.last_wave_blocks) == (6, 5, 2)
    assert e.compute_s == pytest.approx(28.75e-6) and e.split_s == pytest.approx(6e-6)
    assert e.call_s == pytest.approx(44.75e-6)


def test_a_cluster_splits_last_wave_spreads_only_as_far_as_the_driver_places_clusters():
    """S = 2 in clusters, 256 x 128: 4 blocks of 5 us, all a last wave. Where the driver places two
    clusters of 2 a block an SM ("2x1": 4) the busiest SM holds one of its r = 2 (f = g = 0.5):
    3.75 us. Where it places one ("2x1": 2, as the H100 does 105 blocks of clusters of 7, not 132),
    the other shares an SM with it: a whole block's time, though 4 blocks would fit 4 SMs."""
    dm = _model()
    dm.cluster_slots["2x1"] = 4
    spread = estimate(_cand(2, "cluster"), 256, 128, 256, dm, "float32", 4, 4)
    assert (spread.tiles, spread.full_waves, spread.last_wave_blocks) == (4, 0, 4)
    assert spread.compute_s == pytest.approx(3.75e-6)
    dm.cluster_slots["2x1"] = 2
    packed = estimate(_cand(2, "cluster"), 256, 128, 256, dm, "float32", 4, 4)
    assert packed.compute_s == pytest.approx(5e-6)
    # the unclustered launch of the same blocks spreads over every SM
    assert estimate(_cand(), 256, 256, 128, dm, "float32", 4, 4).compute_s == pytest.approx(3.75e-6)


def test_an_entrys_own_clusters_are_walked_whole_and_split_its_k():
    """An entry's cluster (ConfigEntry.cluster): 2 tile rows sharing B round 5 tile rows of 128 up to
    6 (24 tiles, not 20), in the slots clusters of 2 fill (6 at r = 2): 4 full waves of 9 us; 4 blocks
    splitting each tile's K are 4 blocks a tile (80) of a quarter of the K steps, in the slots of
    clusters of 4 (none recorded: the next larger size's, else r x SMs = 8)."""
    from dataclasses import replace as swap
    rows = swap(_cand(), tile_cluster=(2, 1, 1))
    e = estimate(rows, 640, 512, 256, _model(), "float32", 4, 4)
    assert (e.tiles, e.slots, e.steps, e.full_waves, e.last_wave_blocks) == (24, 6, 16, 4, 0)
    assert rows.cluster_size == 2 and e.compute_s == pytest.approx(36e-6)
    ks = swap(_cand(), tile_cluster=(1, 1, 4))
    e = estimate(ks, 640, 512, 256, _model(), "float32", 4, 4)
    assert (e.tiles, e.slots, e.steps) == (80, 8, 4) and ks.cluster_size == 4
    assert _cand().cluster_size == 0 and e.split_s == 0


def test_a_launchs_own_time_is_counted_once_a_launch():
    """ConfigFit.launch_fixed_s (c, a launch's start and drain): added once to compute whatever the
    blocks and waves, and kept through the database's JSON."""
    dm = _model()
    base = estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4)
    dm.configs["sgemm:t"] = dataclasses.replace(dm.configs["sgemm:t"], launch_fixed_s=5e-6)
    e = estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4)
    assert e.compute_s == pytest.approx(base.compute_s + 5e-6) and e.launch_s == 5e-6
    assert e.to_json()["launch_us"] == 5.0
    big = estimate(_cand(), 4096, 4096, 256, dm, "float32", 4, 4)
    assert big.full_waves > 1 and big.launch_s == 5e-6
    back = dispatch_db.model_from({"gpu": "g", "sms": 132, "clock_hz": 1.98e9, "dram_bytes_per_s": 3.35e12,
                                   "model": dispatch_db.model_to_json(dm)}, "test")
    assert back.configs["sgemm:t"].launch_fixed_s == 5e-6


def test_a_tie_at_the_dram_floor_goes_to_the_candidate_whose_blocks_take_least():
    """rank: two configurations both under a DRAM floor of 2 ms (1 GB/s) model the same call time;
    the one whose blocks take less (a 3x cheaper K step) ranks first, whichever the catalog lists
    first (32 x (2048 x 2048 . 2048 x 64) on the H100's facts took a 192-wide tile for 64 columns)."""
    dm = _model(dram=1e9)
    dm.configs["sgemm:u"] = ConfigFit(1e-6, 0.5e-6 / 3, 0.5, 2, samples=5)
    slow, fast = _cand(), replace(_cand(), config="u")
    ests = cost_model.rank([slow, fast], 512, 512, 256, dm, "float32", 4, 4)
    assert ests[0].call_s == ests[1].call_s and ests[0].compute_s < ests[1].compute_s
    assert [e.candidate.config for e in ests] == ["u", "t"]


def test_the_fit_finds_a_launchs_own_time():
    """fit._best_fit: samples made by c + a (c0 + c1 g) + b steps (c0 + c1 f) give back c, a, b, f
    and g (c0 waves of blocks, c1 what a lone block adds, as _wave_terms makes them)."""
    from asmgemm.tuning import fit
    c, a, b, f, g = 5e-6, 1e-6, 0.3e-6, 0.25, 0.5
    terms = []
    for c0, c1, steps in [(0.5, 0.5, 4), (1.0, 0.0, 16), (0.25, 0.75, 64), (3.0, 0.0, 8), (0.5, 0.5, 200),
                          (8.0, 0.0, 100), (0.125, 0.875, 2), (2.0, 0.0, 1)]:
        y = c + a * (c0 + c1 * g) + b * steps * (c0 + c1 * f)
        terms.append((c0, c1, steps, 1 / y, 1 / y, 1.0))
    got = fit._best_fit(terms)
    assert got == pytest.approx((c, a, b, f, g), rel=1e-6)


def test_cluster_capacity_is_the_drivers_count_for_the_size_and_blocks_an_sm():
    """cluster_slots: the recorded count for (S, r) whatever the kernel; an untimed r of a timed
    size scales the nearest timed r's count; an untimed size takes the next larger size's at r;
    nothing recorded: the slots r x SMs give. Keys of another form (an older database's
    "kernel:config:S") match nothing."""
    dm = _model()
    dm.cluster_slots = {"3x1": 117, "3x4": 489, "8x2": 240, "hgemm_mma:t128x128_w64x32:6": 120}
    three, six = _cand(3, "cluster"), _cand(6, "cluster")
    assert cost_model.cluster_slots(dm, three, 1, 132) == 117
    assert cost_model.cluster_slots(dm, three, 2, 264) == 234        # 3x1 scaled: 117 x 2
    assert cost_model.cluster_slots(dm, three, 5, 660) == 611        # the nearest r (4): 489 x 5 // 4
    assert cost_model.cluster_slots(dm, six, 2, 264) == 240          # the next larger size at r = 2
    assert cost_model.cluster_slots(dm, six, 3, 396) == 396          # nothing for 6 or larger at r = 3
    assert cost_model.cluster_key(6, 3) == "6x3"


def test_a_load_variants_factor_scales_the_block():
    """A fitted factor of 1.5 for A stored transposed ('tn:11:16/16'): blocks of 13.5 us, 27 us in
    two waves; another variant, or none, 1."""
    e = estimate(_cand(), 512, 512, 256, _model(), "float32", 4, 4, "tn:11:16/16")
    assert e.block_s == pytest.approx(13.5e-6) and e.compute_s == pytest.approx(27e-6)
    assert estimate(_cand(), 512, 512, 256, _model(), "float32", 4, 4, "nn:11:16/16").block_s == pytest.approx(9e-6)
    assert cost_model.variant_of("tn", {"vec_a": 0, "vec_b": 1}) == "tn:01:16/16"


def test_a_variant_the_sweep_never_saw_takes_its_layouts_factor():
    """ConfigFit.factor: the variant's own factor; a variant never swept, its layout's ('tn', which
    fit._variant_factors stores beside the variants); a layout never swept either, 1."""
    fit = ConfigFit(1e-6, 0.5e-6, 0.5, 2, variants={"tn:11:16/16": 1.5, "tn": 1.4})
    assert fit.factor("tn:11:16/16") == 1.5 and fit.factor("tn:00:4/4") == 1.4
    assert fit.factor("nn:00:4/4") == 1.0 and fit.factor(None) == 1.0


def test_a_variants_factor_is_shrunk_toward_its_layouts():
    """fit._variant_factors: log step factors nn:00:4/4 [ln 2] x 3 and nn:11:16/16 [0], each of
    weight 1: the layout's mean 3 ln 2 / (4 + 3) is the nn factor; each variant's mean is shrunk
    toward it as if 3 more samples had it (nn:00:4/4: (3 ln 2 + 3 x 3 ln 2 / 7) / 6); a lone
    layout's variant, toward its own layout's (tt: ln 3 / 4, then (ln 3 + 3 ln 3 / 4) / 4)."""
    from asmgemm.tuning.fit import VARIANT_PRIOR, _variant_factors
    assert VARIANT_PRIOR == 3
    ln2, ln3 = math.log(2), math.log(3)
    got = _variant_factors({"nn:00:4/4": [(1.0, ln2)] * 3, "nn:11:16/16": [(1.0, 0.0)], "tt:00:8/8": [(1.0, ln3)]})
    nn = 3 * ln2 / 7
    assert got["nn"] == pytest.approx(math.exp(nn))
    assert got["nn:00:4/4"] == pytest.approx(math.exp((3 * ln2 + 3 * nn) / 6))
    assert got["nn:11:16/16"] == pytest.approx(math.exp(3 * nn / 4))
    assert got["tt"] == pytest.approx(math.exp(ln3 / 4))
    assert got["tt:00:8/8"] == pytest.approx(math.exp((ln3 + 3 * ln3 / 4) / 4))


def test_a_sample_counts_toward_its_variants_factor_by_the_share_its_k_steps_take():
    """A sample whose time is mostly its fixed part (weight: its steps' share of it) says little
    about how its steps load: [(3, ln 2), (1, 0)] has the weighted mean 3 ln 2 / 4, shrunk toward the
    layout's as if 3 more samples of the mean weight (2) had it: the layout 3 ln 2 / (4 + 6), the
    variant (3 ln 2 + 6 x 3 ln 2 / 10) / 10."""
    from asmgemm.tuning.fit import _variant_factors
    ln2 = math.log(2)
    got = _variant_factors({"nn:00:4/4": [(3.0, ln2), (1.0, 0.0)]})
    assert got["nn"] == pytest.approx(math.exp(3 * ln2 / 10))
    assert got["nn:00:4/4"] == pytest.approx(math.exp((3 * ln2 + 6 * 3 * ln2 / 10) / 10))


def test_a_variants_own_occupancy_sets_the_slots_of_a_wave():
    """r = 2 (8 slots) for the configuration, 1 for the builds of 'nn:00:2r/2r' (their registers):
    512 x 512 x 256's 16 tiles then take 4 full waves of one block an SM, 36 us, where the aligned
    variant takes 2 (18 us). A variant never swept takes the occupancy of one with its copy widths,
    in another layout; else r."""
    dm = _model()
    dm.configs["sgemm:t"] = replace(dm.configs["sgemm:t"], variant_blocks={"nn:00:2r/2r": 1})
    e = estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4, "nn:00:2r/2r")
    assert (e.slots, e.full_waves) == (4, 4) and e.compute_s == pytest.approx(36e-6)
    assert estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4, "nn:11:16/16").compute_s == pytest.approx(18e-6)
    fit = dm.configs["sgemm:t"]
    assert fit.blocks("tt:00:2r/2r") == 1 and fit.blocks("tt:00:2r/4") == 2 and fit.blocks(None) == 2
    # the database keeps them
    back = dispatch_db.model_from({"gpu": "Hand GPU", "sms": 4, "clock_hz": 1e9, "dram_bytes_per_s": 1e12,
                                   "model": dispatch_db.model_to_json(dm)}, "test")
    assert back.configs["sgemm:t"].variant_blocks == {"nn:00:2r/2r": 1}


def test_a_2_byte_aligned_operand_is_the_realigned_variant_and_the_old_one_is_retired():
    assert cost_model.variant_of("nn", {"align_a": 2, "align_b": 4}) == "nn:11:2r/4"
    assert cost_model.RETIRED_VARIANT.search("nn:00:2/4") and cost_model.RETIRED_VARIANT.search("tt:00:4/2")
    assert not cost_model.RETIRED_VARIANT.search("nn:00:2r/2r") and not cost_model.RETIRED_VARIANT.search("nn:11:16/16")


def _residual_model(label: str) -> DeviceModel:
    """_model() with three measured calls: 512 x 512 x 256 nn, where `label` ran 2x the model (log 2),
    the same in tn (another layout: never a neighbour), and 64 times the rows (past the radius)."""
    dm = _model()
    near = {"family": "sgemm", "variant": "nn:11:16/16", "m": 512, "n": 512, "k": 256, "plain": True,
            "gpu_res": {label: math.log(2)}}
    dm.residuals = [near, {**near, "variant": "tn:11:16/16", "gpu_res": {label: math.log(8)}},
                    {**near, "m": 512 * 64, "gpu_res": {label: math.log(8)}}]
    return dm


def test_the_nearest_sweep_call_scales_a_candidates_estimate():
    """One measured call at distance 0 (weight 1), shrunk by the prior's 0.5: 2 ** (1 / 1.5) =
    1.5874 on the candidate's modelled blocks, and on its split with them (the blocks bind there);
    not on the host's 15 us (the call's and the reduce kernel's launch); a fused call has no plain
    neighbours."""
    dm = _residual_model("t/s2")
    ranked = rank([_cand(2, "kernel")], 512, 512, 256, dm, "float32", 4, 4, "nn:11:16/16", "sgemm", True)
    assert ranked[0].correction == pytest.approx(2 ** (1 / 1.5)) and ranked[0].floor_correction == 1.0
    e = estimate(_cand(2, "kernel"), 512, 512, 256, dm, "float32", 4, 4, "nn:11:16/16")
    assert e.compute_s > e.memory_s and e.host_s == pytest.approx(15e-6)
    assert ranked[0].call_s == pytest.approx((e.compute_s + e.split_s) * 2 ** (1 / 1.5) + 15e-6)
    assert e.call_s == pytest.approx(89.4288e-6)
    fused = rank([_cand(2, "kernel")], 512, 512, 256, dm, "float32", 4, 4, "nn:11:16/16", "sgemm", False)
    assert fused[0].correction == 1.0


def test_an_unsplit_candidate_is_shrunk_as_a_split_one():
    """An unsplit label is its own kind: its residual counts once, as a split label's does."""
    dm = _residual_model("t")
    ranked = rank([_cand()], 512, 512, 256, dm, "float32", 4, 4, "nn:11:16/16", "sgemm", True)
    assert ranked[0].correction == pytest.approx(2 ** (1 / 1.5))


def test_an_untimed_split_count_takes_its_kinds_factor():
    """The sweep timed t/s4 (log 2) and t/s8c (log 4) near here, at distance 0 (weight 1): t/s6,
    which it did not, takes the kind t/s*'s factor, t/s3c the kind t/s*c's; the unsplit t, which it
    did not time either, the configuration's at any split, t/* (log 8 over weight 2, shrunk by
    NEIGHBOUR_PRIOR 0.5); another configuration, 1. A cluster split's kind is t/s*c, and an unsplit
    label is its own kind."""
    assert cost_model.split_kind("t64x64_k16/s12") == "t64x64_k16/s*"
    assert cost_model.split_kind("t64x64_k16/s4c") == "t64x64_k16/s*c"
    assert cost_model.split_kind("t64x64_k16") == "t64x64_k16"


def test_a_label_reads_back_into_the_candidate_it_names():
    """catalog.label_parts is Candidate.label's inverse for every split kind (the sweep's samples,
    the neighbours and the fit read labels only through it)."""
    from asmgemm.runtime.catalog import Candidate, label_parts
    for splits, reduce, cluster in ((1, None, 0), (4, "kernel", 0), (4, "cluster", 0), (53, "cluster+in_kernel", 8),
                                    (6, "in_kernel", 0)):
        cand = Candidate("sgemm", "t64x64_k16", "sgemm", (), (64, 64, 16), splits, reduce, False, cluster)
        parts = label_parts(cand.label)
        assert (parts.config, parts.splits) == ("t64x64_k16", splits)
        assert parts.clustered == (reduce in ("cluster", "cluster+in_kernel"))
        assert parts.cluster == (cluster if reduce == "cluster+in_kernel" else None)
    assert {cost_model.config_kind(x) for x in ("t64x64_k16/s12", "t64x64_k16/s4c", "t64x64_k16")} == {"t64x64_k16/*"}
    factors = cost_model.neighbour_factors(
        DeviceModel("G", 4, 1e9, 1e12, residuals=[{"family": "sgemm", "variant": "nn:11:16/16", "m": 64, "n": 64,
                                                   "k": 64, "plain": True,
                                                   "gpu_res": {"t/s4": math.log(2), "t/s8c": math.log(4)}}]),
        "sgemm", "nn:11:16/16", 64, 64, 64, True).blocks
    assert cost_model.factor_for(factors, "t/s6") == pytest.approx(2 ** (1 / 1.5))
    assert cost_model.factor_for(factors, "t/s3c") == pytest.approx(4 ** (1 / 1.5))
    assert cost_model.factor_for(factors, "t") == pytest.approx(8 ** (1 / 2.5))
    assert cost_model.factor_for(factors, "u/s4") == 1.0 and cost_model.factor_for(factors, "u") == 1.0


def test_a_blocks_factor_leaves_a_floor_alone():
    """The neighbour measured the blocks 2x the model (they bound it there); at 1 GB/s the call is
    DRAM-bound (2.097 ms against 18 us of blocks): the blocks' factor, x1.587, leaves the floor as
    it is, where a factor of call times scaled the floor with it (8 x 28672 x 4096 nt on the H100's
    facts: docs/log/dispatch.md, "The neighbours' factor on its own term")."""
    dm = _residual_model("t")
    dm.dram_bytes_per_s = 1e9
    e = rank([_cand()], 512, 512, 256, dm, "float32", 4, 4, "nn:11:16/16", "sgemm", True)[0]
    assert e.correction == pytest.approx(2 ** (1 / 1.5)) and e.floor_binds
    assert e.corrected_gpu_s == pytest.approx(e.memory_s) and e.call_s == pytest.approx(e.memory_s + 10e-6)


def test_a_floor_bound_neighbour_scales_the_floor():
    """A neighbour whose model the DRAM floor bound ("floor" names it for its label) measured the
    floor 2x: the floor takes the factor, the blocks none; where the blocks bind, nothing changes."""
    dm = _residual_model("t")
    dm.residuals[0] = {**dm.residuals[0], "floor": {"t": "dram"}}
    dm.dram_bytes_per_s = 1e9
    e = rank([_cand()], 512, 512, 256, dm, "float32", 4, 4, "nn:11:16/16", "sgemm", True)[0]
    assert (e.correction, e.floor_correction) == (1.0, pytest.approx(2 ** (1 / 1.5)))
    assert e.corrected_gpu_s == pytest.approx(e.memory_s * 2 ** (1 / 1.5))
    dm.dram_bytes_per_s = 1e12
    e = rank([_cand()], 512, 512, 256, dm, "float32", 4, 4, "nn:11:16/16", "sgemm", True)[0]
    assert not e.floor_binds and e.call_s == pytest.approx(28e-6)


def test_a_residual_is_of_gpu_time_and_says_which_term_bound():
    """cost_model.residual_entry: log(measured / modelled GPU time), host time out of it, and the
    floor that bound the model: none at 1 TB/s (the blocks), DRAM at 1 GB/s, the configuration's
    load floor where its load rate is slow enough."""
    blocks = estimate(_cand(), 512, 512, 256, _model(), "float32", 4, 4)
    assert cost_model.residual_entry(blocks, 36e-6) == (pytest.approx(math.log(2)), None)
    floor = estimate(_cand(), 512, 512, 256, _model(dram=1e9), "float32", 4, 4)
    assert cost_model.residual_entry(floor, floor.memory_s) == (pytest.approx(0.0), "dram")
    dm = _model()
    dm.configs["sgemm:t"] = replace(dm.configs["sgemm:t"], load_bytes_per_s=1e9)
    load = estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4)
    assert cost_model.residual_entry(load, load.load_s)[1] == "load"


def test_a_dram_floor_never_measured_for_a_candidate_takes_the_others():
    """A neighbour measured configuration u at the DRAM floor 2x and t only where its blocks bound:
    at a call where the floor binds both, t takes u's floor factor (ANY_CONFIG), so a candidate
    the sweep never saw at the floor does not win the floor's tie on a factor of 1; a load floor
    (the configuration's own rate) is not lent."""
    dm = _residual_model("t")
    dm.residuals[0] = {**dm.residuals[0], "gpu_res": {"t": math.log(2), "u": math.log(2)}, "floor": {"u": "dram"}}
    factors = cost_model.neighbour_factors(dm, "sgemm", "nn:11:16/16", 512, 512, 256, True)
    dm.dram_bytes_per_s = 1e9
    e = factors.applied(estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4))
    assert e.floor_correction == pytest.approx(2 ** (1 / 1.5)) and e.correction == pytest.approx(2 ** (1 / 1.5))
    dm.residuals[0]["floor"] = {"u": "load"}
    factors = cost_model.neighbour_factors(dm, "sgemm", "nn:11:16/16", 512, 512, 256, True)
    assert factors.applied(estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4)).floor_correction == 1.0


def test_neighbours_of_the_earlier_form_are_not_read():
    """A database whose residuals are ratios of call times ("res", before 2026-11-30) keeps its
    coefficients; its neighbours are dropped and the model's source says so."""
    db = database("Old GPU", residuals=[{"family": "sgemm", "variant": "nn:11:16/16", "m": 64, "n": 64, "k": 64,
                                         "plain": True, "res": {"t128x128_k8": 0.1}}])
    dm = dispatch_db.model_from(db, "fitted")
    assert dm.residuals == [] and "1 of its neighbours are of an earlier form" in dm.source


def test_dram_is_a_floor():
    """At 1 GB/s the 2 MiB of 512 x 512 x 256 take 2.097 ms: the call is memory bound."""
    e = estimate(_cand(), 512, 512, 256, _model(dram=1e9), "float32", 4, 4)
    assert e.memory_s == pytest.approx(2.097152e-3) and e.gpu_s == pytest.approx(2.097152e-3)


def test_loaded_bytes_count_a_per_tile_column_and_b_per_tile_row():
    """cost_model.loaded_bytes: 300 x 500 x 64 in 128 x 128 tiles is 4 tile columns each reading
    all 300 rows of A and 3 tile rows each reading all 500 columns of B, over all 64 of K, at 4
    bytes: (4 x 300 + 3 x 500) x 64 x 4; a batch of 2 doubles it; a grouped launch's 2 extra tile
    rows read B twice more."""
    assert cost_model.loaded_bytes(_cand(), 300, 500, 64, 4) == (4 * 300 + 3 * 500) * 64 * 4
    assert cost_model.loaded_bytes(_cand(), 300, 500, 64, 4, batch=2) == 2 * (4 * 300 + 3 * 500) * 64 * 4
    assert cost_model.loaded_bytes(_cand(), 300, 500, 64, 2, extra_tile_rows=2) == (4 * 300 + 5 * 500) * 64 * 2
    # a split reads its share of K: the same bytes in all
    assert cost_model.loaded_bytes(_cand(4, "kernel"), 300, 500, 64, 4) == cost_model.loaded_bytes(_cand(), 300, 500, 64, 4)


def test_a_configurations_load_rate_is_a_floor():
    """512 x 512 x 256 (18 us of blocks, test_full_waves) loads (4 x 512 + 4 x 512) x 256 x 4 bytes
    = 4 MiB: at 1 TB/s that is 4.2 us, under the blocks' time, so nothing changes; at 0.1 TB/s
    it is 41.9 us and bounds the call, and explain says why; a rate of 0 is no floor."""
    loaded = (4 * 512 + 4 * 512) * 256 * 4
    for rate, gpu in ((0.0, 18e-6), (1e12, 18e-6), (0.1e12, loaded / 0.1e12)):
        dm = _model()
        dm.configs["sgemm:t"] = replace(dm.configs["sgemm:t"], load_bytes_per_s=rate)
        e = estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4)
        assert e.load_s == pytest.approx(loaded / rate if rate else 0.0) and e.gpu_s == pytest.approx(gpu)
        assert e.to_json()["load_us"] == pytest.approx(round(e.load_s * 1e6, 3))
    other = estimate(_cand(), 512, 512, 256, _model(), "float32", 4, 4)
    assert "L2 traffic" in cost_model.why_slower(e, replace(other, compute_s=1e-6))


def test_the_prior_from_peak_rates():
    """No fitted entry: a = 3 us, f = 0.6, r = 1, and b the larger of the FMAs of a K step at 75%
    of 256 fp32 flops a cycle (128 x 128 x 16 at 1 GHz: 2.7307 us) and its B tile read at the SM's
    share of DRAM (a 4 x 128 x 256 skinny tile: 128 x 256 x 4 bytes at 1 TB / 132: 17.3015 us)."""
    dm = DeviceModel("Prior GPU", sms=132, clock_hz=1e9, dram_bytes_per_s=1e12)
    fit = dm.fit_of(_cand(), "float32")
    assert (fit.block_s, fit.alone, fit.blocks_per_sm, fit.samples) == (3e-6, 0.6, 1, 0)
    assert fit.step_s == pytest.approx(2.730667e-6, rel=1e-5)
    skinny = Candidate("sgemm", "r4", "sgemm_skinny", (("MR", 4),), (4, 128, 256))
    assert dm.fit_of(skinny, "float32").step_s == pytest.approx(17.301504e-6, rel=1e-6)
    assert not estimate(_cand(), 512, 512, 256, dm, "float32", 4, 4).fitted


def test_a_configuration_the_sweep_never_timed_ranks_after_every_fitted_one():
    """A catalog entry added after a GPU's sweep (no fit there: the prior's peak rates) ranks after
    the configurations the sweep fitted, however fast the prior makes it, and explain says why; where
    no configuration was fitted (a GPU with no sweep) the prior alone orders them by time."""
    dm = _model()
    dm.configs = {"sgemm:t": ConfigFit(100e-6, 50e-6, 0.5, 2, samples=5)}     # a slow fit: 0.9 ms a block
    fitted = _cand()
    new = Candidate("sgemm", "new", "sgemm", (("BK", 16), ("BN", 256)), (128, 256, 16))
    prior_alone = estimate(new, 512, 512, 256, dm, "float32", 4, 4)
    assert not prior_alone.fitted and prior_alone.call_s < estimate(fitted, 512, 512, 256, dm, "float32", 4, 4).call_s
    ranked = rank([new, fitted], 512, 512, 256, dm, "float32", 4, 4)
    assert [e.candidate for e in ranked] == [fitted, new]
    assert "never swept on this GPU" in cost_model.why_slower(ranked[1], ranked[0])
    nothing_fitted = DeviceModel("Prior GPU", sms=4, clock_hz=1e9, dram_bytes_per_s=1e12)
    by_prior = rank([fitted, new], 512, 512, 256, nothing_fitted, "float32", 4, 4)
    assert [e.candidate for e in by_prior] == sorted([fitted, new], key=lambda c: estimate(
        c, 512, 512, 256, nothing_fitted, "float32", 4, 4).call_s)
    assert "never swept" not in cost_model.why_slower(by_prior[1], by_prior[0])


def test_rank_orders_by_call_time_and_keeps_catalog_order_on_ties():
    dm = _model()
    c_a = _cand()
    c_b = Candidate("sgemm", "t", "sgemm", (("BK", 16), ("X", 1)), (128, 128, 16))     # the same fit and tile
    c_s = _cand(2, "kernel")
    ranked = rank([c_s, c_a, c_b], 512, 512, 256, dm, "float32", 4, 4)
    assert [e.candidate for e in ranked] == [c_a, c_b, c_s]
    assert ranked[0].call_s == ranked[1].call_s < ranked[2].call_s
    assert cost_model.why_slower(ranked[0], ranked[0]) == "the pick"
    assert "its split costs 54.4 us" in cost_model.why_slower(ranked[2], ranked[0])
    assert "host work" not in cost_model.why_slower(ranked[2], ranked[0])
    # a split that loses by its host work says so, and which work
    lean = replace(ranked[2], split_s=ranked[0].split_s, compute_s=ranked[0].compute_s)
    assert "5.0 us more host work (the reduce kernel's launch and workspace)" in cost_model.why_slower(lean, ranked[0])


# ---- dispatch.choose: exact hit, else the model ---------------------------------------------------
def _choose(gpu="Test GPU", m=512, n=768, k=768, plain=True, exact=True, target="sm_90"):
    return dispatch.choose(SGEMM, "nn", m, n, k, gpu=gpu, target=target, sms=132, plain=plain, exact=exact)


def test_without_a_hit_the_order_is_the_models_ranking(dispatch_dir):
    path = dispatch_dir("Test GPU")
    ch = _choose()
    assert ch.chosen_by == "model" and ch.key == "sgemm|nn|512x768x768|plain" and ch.family == "sgemm"
    assert ch.order == [e.candidate for e in ch.ranked] and ch.pick == ch.order[0]
    times = [e.call_s for e in ch.ranked]
    assert times == sorted(times) and len(ch.ranked) == len(candidates(SGEMM, 512, 768, "sm_90", plain=True))
    assert ch.model_source.startswith("fitted on this GPU") and str(path) in ch.model_source


def test_an_exact_hit_goes_first_and_the_rest_keep_the_models_order(dispatch_dir):
    dispatch_dir("Test GPU")
    model = _choose()
    last = model.order[-1].label                  # the model's slowest: nothing else puts it first
    dispatch_dir("Test GPU", best={"sgemm|nn|512x768x768|plain": last})
    ch = _choose()
    assert ch.chosen_by == "database" and ch.pick.label == last
    assert labels(ch.order[1:]) == labels(model.order[:-1])
    assert _choose(m=513).chosen_by == "model"                       # another call: its own key
    assert _choose(plain=False).chosen_by == "model"                 # a fused call's key differs
    held = _choose(exact=False)                                      # the held-out check: the model alone
    assert held.chosen_by == "model" and labels(held.order) == labels(model.order)


def test_a_hit_naming_a_configuration_the_catalog_lacks_is_ignored(dispatch_dir):
    dispatch_dir("Test GPU")
    model = _choose()
    dispatch_dir("Test GPU", best={"sgemm|nn|512x768x768|plain": "t999x999_gone/s2",
                                   "sgemm|nn|512x768x768|fused": model.order[-1].label})
    ch = _choose()
    assert ch.chosen_by == "model" and labels(ch.order) == labels(model.order)
    # a fused call has no split candidates: a split label there is no candidate either
    split = next(c.label for c in model.order if c.splits > 1)
    dispatch_dir("Test GPU", best={"sgemm|nn|512x768x768|fused": split})
    assert _choose(plain=False).chosen_by == "model"


# ---- dispatch_db: where a GPU's model comes from -------------------------------------------------
H100_FIT = {"block_s": 2e-6, "step_s": 1e-6, "alone": 0.5, "blocks_per_sm": 2, "samples": 10,
            "load_bytes_per_s": 3e12}


def test_another_gpu_of_the_same_target_lends_its_coefficients_scaled_by_clock(dispatch_dir):
    dispatch_dir("NVIDIA H100 80GB HBM3", clock_hz=1.98e9, dram_bytes_per_s=3.35e12,
                 configs={"sgemm:t128x128_k8": H100_FIT}, best={"sgemm|nn|512x768x768|plain": "t128x128_k8"})
    dm, best = dispatch_db.device_model("NVIDIA H200", "sm_90a", 132, 1.5e9, 4.8e12)
    assert best == {}                                   # the H100's hits were timed on the H100
    fit = dm.configs["sgemm:t128x128_k8"]
    assert fit.block_s == pytest.approx(2.64e-6) and fit.step_s == pytest.approx(1.32e-6)    # x 1.98 / 1.5
    assert (fit.alone, fit.blocks_per_sm) == (0.5, 2)
    assert fit.load_bytes_per_s == pytest.approx(3e12 * 1.5 / 1.98)      # the load rate follows the clock
    assert (dm.gpu, dm.sms, dm.clock_hz, dm.dram_bytes_per_s) == ("NVIDIA H200", 132, 1.5e9, 4.8e12)
    assert dm.source.startswith("the model alone") and "NVIDIA H100 80GB HBM3" in dm.source
    dm, _ = dispatch_db.device_model("NVIDIA H200", "sm_90", 114, 0.0, 0.0)     # clock unknown: unscaled
    assert dm.configs["sgemm:t128x128_k8"].step_s == pytest.approx(1e-6) and dm.sms == 114
    assert _choose(gpu="NVIDIA H200").chosen_by == "model"
    assert _choose(gpu="NVIDIA H100 80GB HBM3").chosen_by == "database"


def test_each_family_is_priced_by_the_database_that_swept_it(dispatch_dir):
    """An H200 database of the TMA family alone: hgemm (and its twin bgemm) from it with its exact
    hits; sgemm from the H100's database as the model alone, with the H100's shared terms (its host
    time), not the H200's; hgemm on the H100 likewise from the H200's."""
    dispatch_dir("NVIDIA H100 80GB HBM3", clock_hz=1.98e9, configs={"sgemm:t128x128_k8": H100_FIT}, host_s=13e-6)
    h200 = dispatch_dir.dir / "nvidia_h200.json"
    h200.write_text(json.dumps(dict(database("NVIDIA H200", clock_hz=1.98e9, host_s=20e-6,
                                             configs={"hgemm:t128x256_cm2": H100_FIT},
                                             best={"hgemm|nn|64x64x64|plain": "t128x256_cm2"}),
                                    families=["hgemm"])))
    priced = {}
    for gpu in ("NVIDIA H200", "NVIDIA H100 80GB HBM3"):
        for fam in ("hgemm", "bgemm", "sgemm"):
            dm, best = dispatch_db.device_model(gpu, "sm_90", 132, 1.98e9, 4.8e12, fam)
            priced[gpu, fam] = (dm.host_s, dm.source.split(":")[0], bool(best))
    assert priced["NVIDIA H200", "hgemm"] == (20e-6, "fitted on this GPU (" + str(h200) + ")", True)
    assert priced["NVIDIA H200", "bgemm"][0] == 20e-6 and priced["NVIDIA H200", "bgemm"][2]
    assert priced["NVIDIA H200", "sgemm"] == (13e-6, "the model alone", False)
    assert priced["NVIDIA H100 80GB HBM3", "hgemm"] == (20e-6, "the model alone", False)
    assert priced["NVIDIA H100 80GB HBM3", "sgemm"][:2] == (13e-6, priced["NVIDIA H100 80GB HBM3", "sgemm"][1])
    assert priced["NVIDIA H100 80GB HBM3", "sgemm"][1].startswith("fitted on this GPU")


def test_no_database_of_the_gpu_or_its_target_is_the_prior(dispatch_dir):
    dispatch_dir("NVIDIA H100 80GB HBM3", configs={"sgemm:t128x128_k8": H100_FIT})
    dm, best = dispatch_db.device_model("NVIDIA A100-SXM4-80GB", "sm_80", 108, 1.41e9, 2e12)
    assert dm.source.startswith("the prior") and best == {} and dm.configs == {}
    assert (dm.sms, dm.clock_hz, dm.dram_bytes_per_s) == (108, 1.41e9, 2e12)


def test_a_damaged_database_is_an_error_naming_its_file(dispatch_dir):
    path = dispatch_dir.dir / "test_gpu.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(AsmError) as err:
        dispatch_db.device_model("Test GPU", "sm_90", 132, 0.0, 0.0)
    assert str(path) in err.value.message and "not valid JSON" in err.value.message
    path.write_text(json.dumps({**database("Test GPU"), "format": 99}), encoding="utf-8")
    with pytest.raises(AsmError) as err:
        dispatch.forget()
        _choose()
    assert str(path) in err.value.message and "format 1" in err.value.message


def test_a_malformed_model_entry_names_its_file(dispatch_dir):
    path = dispatch_dir("Test GPU", configs={"sgemm:t128x128_k8": {"block_s": 1e-6}})     # no step_s
    with pytest.raises(AsmError) as err:
        dispatch_db.device_model("Test GPU", "sm_90", 132, 0.0, 0.0)
    assert "malformed" in err.value.message
    assert str(path) in err.value.message


def test_write_is_whole_and_reads_back(tmp_path):
    doc = database("Test GPU", best={"k": "v"})
    path = tmp_path / "sub" / "test_gpu.json"
    dispatch_db.write(path, doc)
    assert dispatch_db.read(path) == doc and [p.name for p in path.parent.iterdir()] == ["test_gpu.json"]


# ---- [[NAME.config]] in a spec ---------------------------------------------------------------------
from test_kernel_spec import GOOD as SPEC     # noqa: E402  (the minimal kernel table test_kernel_spec checks)
ENTRY = '[[k.config]]\nname = "t64"\nset = { T = 64 }\ntile = [64, 64, 16]\n'


def _load(tmp_path, extra: str):
    (tmp_path / "k.sasm").write_text("// k\n")
    p = tmp_path / "specs.toml"
    p.write_text(textwrap.dedent(SPEC) + extra)
    return p, load_spec_file(p)


def test_a_catalog_entry_loads(tmp_path):
    _, (spec,) = _load(tmp_path, ENTRY + 'splits = [4, 1, 2, 2]\nmax_m = 64\nnote = "n"\n'
                                         '[[k.config]]\nname = "d"\nset = {}\ntile = [128, 128, 8]\n')
    assert spec.configs == (ConfigEntry("t64", "k", (("T", 64),), (64, 64, 16), (1, 2, 4), 64, "n"),
                            ConfigEntry("d", "k", (), (128, 128, 8)))
    shown = spec.to_json()["configs"][0]
    assert {k: shown[k] for k in ("name", "kernel", "set", "tile", "splits", "max_m", "note", "swap")} == {
        "name": "t64", "kernel": "k", "set": {"T": 64}, "tile": [64, 64, 16], "splits": [1, 2, 4], "max_m": 64,
        "note": "n", "swap": False}


def test_an_entry_may_name_its_tile_for_a_k_major_b(tmp_path):
    """tile_kmajor_b: the tile of a launch whose B is K-major (the skinny kernel lays its work out
    otherwise there), the model's unit of work for such calls; absent, the one tile serves both."""
    _, (spec,) = _load(tmp_path, ENTRY + "tile_kmajor_b = [64, 32, 128]\n")
    loaded = spec.configs[0]
    assert loaded.tile_for(0) == (64, 64, 16) and loaded.tile_for(1) == (64, 32, 128)
    e = ConfigEntry("e", "sgemm", T64, (64, 64, 16), tile_kmajor_b=(64, 32, 128))
    assert entry_candidates(e, "sgemm", 4096, plain=False, clusters=False, trans_b=1)[0].tile == (64, 32, 128)
    assert entry_candidates(e, "sgemm", 4096, plain=False, clusters=False, trans_b=0)[0].tile == (64, 64, 16)
    _, (plain,) = _load(tmp_path, ENTRY)
    assert plain.configs[0].tile_for(1) == (64, 64, 16)


@pytest.mark.parametrize("entry, message", [
    (ENTRY.replace('"t64"', '"t 64"'), "may hold only letters, digits and '_'"),
    (ENTRY.replace("tile = [64, 64, 16]\n", ""), "needs 'tile'"),
    (ENTRY.replace("tile = [64, 64, 16]", "tile = [64, 64]"), r"tile: \[rows, columns, k\]"),
    (ENTRY.replace("tile = [64, 64, 16]", "tile = [64, 0, 16]"), r"tile: \[rows, columns, k\]"),
    (ENTRY + "splits = [2, 4]\n", "includes 1"),
    (ENTRY + "splits = [1, 65]\n", "from 1 to 64"),
    (ENTRY + "splits = []\n", "includes 1"),
    (ENTRY + "max_m = 0\n", "max_m: a positive integer"),
    (ENTRY + "swap = 1\n", "swap: true or false"),
    (ENTRY + "tile_kmajor_b = [1, 32]\n", r"tile_kmajor_b: \[rows, columns, k\]"),
    (ENTRY + "cluster = [2, 1]\n", r"cluster: \[rows, columns, k\] blocks"),
    (ENTRY + "cluster = [4, 2, 2]\n", "at most 8"),
    (ENTRY.replace("set = { T = 64 }", 'set = { T = "x" }'), "PARAM = integer"),
    (ENTRY.replace("tile =", "tiles ="), "unknown key 'tiles'"),
    (ENTRY + ENTRY, "two entries share a name"),
    (ENTRY + '[[k.size_rule]]\nwhen = "M > 1"\nset = { T = 128 }\n', "dispatched by the cost model"),
    ("[k.config]\nname = 1\n", r"array of tables \(\[\[NAME.config\]\]\)"),
])
def test_bad_catalog_entries_are_refused_with_the_file(tmp_path, entry, message):
    with pytest.raises(AsmError, match=message) as err:
        _load(tmp_path, entry)
    assert str(tmp_path / "specs.toml") in err.value.message and "[k]" in err.value.message


def test_the_shipped_catalogs_name_real_kernels_of_their_dtypes():
    """Every entry of every shipped catalog names a spec with the family's dtypes and a split-K
    table where it lists splits; the families with a catalog have no size, swap or split rules
    (routes stay: they send a call to another kernel, hgemm's decoding rows to hgemm_skinny)."""
    from asmgemm.kernel_spec import all_specs
    families = [s for s in all_specs().values() if s.configs]
    assert {"sgemm", "hgemm_mma", "hgemm", "bgemm", "hgemm_f32c", "bgemm_f32c"} <= {s.name for s in families}
    for fam in families:
        assert not fam.size_rules and not fam.swap_rules and not (fam.split_k and fam.split_k.rules), fam.name
        for e in fam.configs:
            spec = get_spec(e.kernel)
            assert spec.dtypes == fam.dtypes, (fam.name, e.name)
            assert e.splits == (1,) or spec.split_k is not None, (fam.name, e.name)
            assert not e.swap or spec.call_value_param("c_trans"), (fam.name, e.name)    # a transposed store


@pytest.mark.toolchain
@pytest.mark.parametrize("entry", sample_every(16, SGEMM.configs), ids=lambda e: e.name)
def test_each_sgemm_entry_builds_with_the_tile_it_names(entry):
    """The model's unit of work is the entry's tile for the call's layout of B (tile_for): the
    build's own launch constants (TM, TN and its k step: BK; the skinny kernel's staged round KC,
    or with a K-major B its KSTEP) say the same, for each layout the entry's kernel accepts (one at
    least; a kernel's guard may refuse the other, as the skinny kernel's MR = 1, 2 a row-major B)."""
    from asmgemm.pipeline import BuildOptions, build_file
    spec = get_spec(entry.kernel)
    built = 0
    for trans_b in (0, 1):
        defines = {**dict(spec.defines), **dict(entry.set), "TRANS_B": trans_b}
        if entry.swap:
            defines[spec.call_value_param("c_trans")] = 1
        try:
            result = build_file(spec.source, BuildOptions(defines={k: str(v) for k, v in defines.items()},
                                                          target="sm_90"))
        except AsmError as exc:
            assert exc.span is not None and ".error" in exc.span.source.line_text(exc.span.line), exc
            continue
        c = result.constants
        k = c["KSTEP"] if trans_b and "KSTEP" in c else c.get("BK", c.get("KC"))
        assert (c["TM"], c["TN"], k) == entry.tile_for(trans_b), (entry.name, trans_b)
        built += 1
    assert built, f"{entry.name} builds for no layout of B"


# ---- asmgemm explain -----------------------------------------------------------------------------
def test_explain_names_the_pick_and_the_family(dispatch_dir, run_cli):
    dispatch_dir("Test GPU")
    model = _choose()
    hit = model.order[-1].label
    dispatch_dir("Test GPU", best={"sgemm|nn|512x768x768|plain": hit})
    code, out, err = run_cli("explain", 512, 768, 768, "--gpu", "Test GPU", "--no-build")
    assert code == 0, err
    assert "family sgemm" in out and hit in out and "exact hit in the database" in out and "Test GPU" in out
    code, out, err = run_cli("explain", 512, 768, 768, "--gpu", "test_gpu", "--no-build", "--json", "--top", 5)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["family"] == "sgemm" and rep["pick"] == hit and rep["chosen_by"] == "database"
    assert rep["kernel_call"] == {"m": 512, "n": 768, "k": 768, "layout": "nn", "swapped": False}
    assert rep["candidates"] == len(model.ranked) and 1 <= len(rep["rows"]) <= 5
    assert all(r["why"] for r in rep["rows"])
    assert rep["rows"][0]["config"] == hit and rep["rows"][0]["why"] == "the pick (exact database hit)"


def test_explain_takes_a_layout_in_either_case(dispatch_dir, run_cli):
    """`--layout NT` as the issues and BLAS write it: the same call as `--layout nt`; a layout that
    is none of the four is refused by name."""
    dispatch_dir("Test GPU")
    reps = []
    for layout in ("NT", "nt", "Nt"):
        code, out, err = run_cli("explain", 8, 4096, 4096, "--gpu", "Test GPU", "--no-build", "--json",
                                 "--layout", layout)
        assert code == 0, err
        reps.append(json.loads(out))
    assert reps[0]["call"]["layout"] == "nt" and reps[0] == reps[1] == reps[2]
    code, _, err = run_cli("explain", 8, 4096, 4096, "--gpu", "Test GPU", "--no-build", "--layout", "NX")
    assert code == 2 and "'NX' is not one of 'nn', 'nt', 'tn', 'tt'" in err


def test_explain_of_the_models_pick(dispatch_dir, run_cli):
    dispatch_dir("Test GPU")
    code, out, err = run_cli("explain", 1, 4096, 4096, "--gpu", "Test GPU", "--no-build", "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["chosen_by"] == "model" and rep["pick"] == _choose(m=1, n=4096, k=4096).pick.label
    assert rep["rows"][0]["why"] == "the pick (least modelled call time)"
    assert rep["model"].startswith("fitted on this GPU")


def test_explain_shows_the_load_variant_and_where_each_factor_came_from(dispatch_dir, run_cli):
    """The call's load variant (3001 x 5000 x 700 tn: A's rows of 3001 floats, not whole 16-byte
    pieces: 'tn:01:4/16'), and per candidate the block's factor for it: the variant's own where the
    sweep timed it (1.5), the layout's where it did not ('tn': 1.25, marked '(layout)'), none ('-')."""
    fit = {"block_s": 2e-6, "step_s": 1e-6, "alone": 0.5, "blocks_per_sm": 2, "samples": 10}
    dispatch_dir("Test GPU", configs={"sgemm:t128x128_k8": dict(fit, variants={"tn:01:4/16": 1.5, "tn": 1.2}),
                                      "sgemm:t64x64_k16": dict(fit, variants={"tn:11:16/16": 1.1, "tn": 1.25})})
    code, out, err = run_cli("explain", 3001, 5000, 700, "--layout", "tn", "--gpu", "Test GPU", "--no-build",
                             "--json", "--top", 1000)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["load_variant"] == "tn:01:4/16"
    rows = {r["config"]: r for r in rep["rows"]}
    assert (rows["t128x128_k8"]["variant_factor"], rows["t128x128_k8"]["factor_from"]) == (1.5, "variant")
    assert (rows["t64x64_k16"]["variant_factor"], rows["t64x64_k16"]["factor_from"]) == (1.25, "layout")
    assert (rows["t128x128_k16"]["variant_factor"], rows["t128x128_k16"]["factor_from"]) == (1.0, "none")
    code, out, err = run_cli("explain", 3001, 5000, 700, "--layout", "tn", "--gpu", "Test GPU", "--no-build",
                             "--top", 1000)
    assert code == 0, err
    assert "load variant tn:01:4/16" in out and "1.25 (layout)" in out and "1.50" in out


@pytest.mark.toolchain
@needs_ptxas
def test_explain_builds_its_pick(dispatch_dir, run_cli, private_cache):
    """Without --no-build the pick is the first candidate whose build the kernel accepts (a
    hit naming skinny_r1 for a row-major B, which gemm_skinny's guard refuses: MR = 1 reads a
    K-major B only, is passed over)."""
    dispatch_dir("Test GPU", best={"sgemm|nn|1x256x512|plain": "skinny_r1"})
    code, out, err = run_cli("explain", 1, 256, 512, "--gpu", "Test GPU", "--json", "--top", 1000)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["pick"] != "skinny_r1" and "MR must be" in rep["refused"]["skinny_r1"]
    assert rep["runs"]["kernel"].startswith("sgemm") and rep["runs"]["config"] == rep["pick"] and rep["runs"]["path"] is None
    assert any(r["config"] == "skinny_r1" and r["why"].startswith("refused by the kernel") for r in rep["rows"])


@pytest.mark.toolchain
@needs_ptxas
def test_explain_says_what_runs_for_16_bit_calls(run_cli, private_cache):
    """On the shipped databases: 4096^3 fp16 runs the TMA kernel's catalog pick, weighed against the
    in-place kernel's (nothing copied; the in-place kernel would have to win by the margin); 5546 x
    2800 x 14 bf16 nt (B's rows are 28 bytes) shows the path model's two times, its terms adding
    up, and runs what they chose."""
    h100 = "NVIDIA H100 80GB HBM3"
    code, out, err = run_cli("explain", 4096, 4096, 4096, "--dtype", "float16", "--gpu", h100, "--json", "--top", 1)
    assert code == 0, err
    runs = json.loads(out)["runs"]
    assert runs["kernel"] == "hgemm" and runs["chosen_by"] in ("model", "database") and runs["config"]
    assert runs["copies"] == [] and runs["tile"][0] >= 64 and runs["size_rule"] is None
    p = runs["path"]
    assert p["copies"] == 0 and not p["narrow_c"] and not p["in_place"] and p["margin"] > 1
    assert p["in_place_us"] * p["margin"] > p["tma_kernel_us"] > 0
    code, out, err = run_cli("explain", 4096, 4096, 4096, "--dtype", "float16", "--gpu", h100, "--top", 1)
    assert code == 0 and "path: TMA reads A, B and C in place" in out and "(GPU): the TMA kernel" in out
    code, out, err = run_cli("explain", 5546, 2800, 14, "--dtype", "bfloat16", "--layout", "nt", "--gpu", h100,
                             "--json", "--top", 1)
    assert code == 0, err
    rep = json.loads(out)
    p = rep["runs"]["path"]
    assert p["copies"] == 1 and p["copied_bytes"] == 2800 * 14 * 2
    assert p["copy_path_us"] == pytest.approx(p["copy_host_us"] + p["copy_bytes_us"] + p["tma_kernel_us"], abs=2e-3)
    assert p["in_place"] == (p["in_place_us"] <= p["copy_path_us"])
    assert rep["runs"]["kernel"] == ("bgemm_mma" if p["in_place"] else "bgemm")
    assert rep["runs"]["copies"] == ([] if p["in_place"] else ["B"])
    code, out, err = run_cli("explain", 5546, 2800, 14, "--dtype", "bfloat16", "--layout", "nt", "--gpu", h100,
                             "--top", 1)
    assert code == 0 and "path: TMA cannot read 1 operand" in out
    # the table is the TMA kernel's catalog; its pick is named as that family's where the in-place kernel runs
    assert ("bgemm's pick (where it runs)" in out) == p["in_place"]
    # a narrow C, nothing copied: the line names the TMA kernel's store, not copies
    code, out, err = run_cli("explain", 4417, 2901, 16, "--dtype", "float16", "--layout", "nt", "--gpu", h100,
                             "--top", 1)
    assert code == 0 and "path: TMA reads A and B but would write C in elements or pairs" in out
    assert "copies +" not in out and "(GPU): in place" in out


@pytest.mark.toolchain
@needs_ptxas
def test_explain_names_the_size_rule_a_routed_kernel_took(run_cli, private_cache):
    """A launch chosen by size rules (the route of hgemm's decoding rows to hgemm_skinny: one row,
    an M-major A) names the rule (numbered as docs/kernel-selection.md numbers them: 1-based
    positions), its condition and -D set, which the build's own -D values carry, and the DRAM rate
    the rules saw; a launch of a catalog names its configuration and no rule; the text output
    prints both lines."""
    from asmgemm.kernel_spec import get_spec
    h100 = "NVIDIA H100 80GB HBM3"
    code, out, err = run_cli("explain", 1, 4096, 14336, "--dtype", "float16", "--layout", "tn", "--gpu", h100,
                             "--json", "--top", 1)
    assert code == 0, err
    runs = json.loads(out)["runs"]
    rule = runs["size_rule"]
    assert runs["chosen_by"] == "size rules" and rule["spec"] == runs["kernel"] == "hgemm_skinny"
    taken = get_spec("hgemm_skinny").size_rules[rule["number"] - 1]
    assert rule["when"] == taken.when and rule["set"] == dict(taken.set) and rule["dram_per_sm_cycle"] == 12
    assert all(runs["params"][k] == str(v) for k, v in rule["set"].items())
    code, out, err = run_cli("explain", 1, 4096, 14336, "--dtype", "float16", "--layout", "TN", "--gpu", h100,
                             "--top", 1)
    assert code == 0 and f"size rule {rule['number']} of hgemm_skinny: when {taken.when}" in out
    assert "built with: " in out and "MR=4" in out
    # the catalogs' picks: no size rule to name
    for shape in ((4096, 4096, 4096), (305, 923, 6)):
        code, out, err = run_cli("explain", *shape, "--dtype", "float16", "--gpu", h100, "--json", "--top", 1)
        assert code == 0 and json.loads(out)["runs"]["size_rule"] is None and json.loads(out)["runs"]["config"]


@pytest.mark.toolchain
@needs_ptxas
def test_explain_plans_a_batch_as_gemm_does(run_cli, private_cache):
    """--batch: 3-D operands of that many matrices. Attention's Q.K^T (128 x 4096 x 4096 x 128 fp16
    nt) runs hgemm's batched mode by its catalog's pick for the batch (no clusters); a small odd
    bf16 batch runs the in-place kernel with its batch as grid z; the batch is in the report, and a
    batched call is never split (no candidate of the table splits K)."""
    h100 = "NVIDIA H100 80GB HBM3"
    code, out, err = run_cli("explain", 4096, 4096, 128, "--dtype", "float16", "--layout", "nt", "--batch", 128,
                             "--gpu", h100, "--json", "--top", 5)
    assert code == 0, err
    rep = json.loads(out)
    runs = rep["runs"]
    assert rep["call"]["batch"] == 128 and runs["kernel"] == "hgemm" and runs["params"]["BATCHED"] == "1"
    assert runs["params"]["CLUSTER_M"] == "1" and runs["params"].get("CLUSTER_N", "1") == "1"
    assert runs["chosen_by"] == "model" and runs["size_rule"] is None
    # the database knows no L2 size: the runtime's C_STREAM for this 4 GB C is named as unknown
    assert "C_STREAM" not in runs["params"] and runs["c_stream_unknown"] is True
    code, out, err = run_cli("explain", 77, 65, 33, "--dtype", "bfloat16", "--batch", 12, "--gpu", h100, "--json",
                             "--top", 1)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["runs"]["kernel"] == "bgemm_mma" and rep["runs"]["params"]["BATCHED"] == "1"
    # deep K: one such product alone splits K ("/sN" candidates, the pick among them); a batch of them not
    splits = {}
    for batch in (1, 2):
        code, out, err = run_cli("explain", 77, 65, 8000, "--dtype", "bfloat16", "--batch", batch, "--gpu", h100,
                                 "--json", "--no-build", "--top", 100)
        assert code == 0, err
        splits[batch] = sum("/s" in r["config"] for r in json.loads(out)["rows"])
    assert splits[1] > 0 and splits[2] == 0
    code, out, _ = run_cli("explain", 77, 65, 33, "--dtype", "bfloat16", "--batch", 12, "--gpu", h100, "--top", 1)
    assert code == 0 and out.startswith("a batch of 12 x 77 x 65 x 33 bfloat16")


@pytest.mark.toolchain
@needs_ptxas
def test_explain_of_a_named_kernels_catalog(run_cli, private_cache):
    """--kernel NAME explains that kernel's catalog as gemm(kernel=NAME) plans the call: the in-place
    kernel at 4096^3 on the H100's database (which sends 16-bit calls to the TMA kernel by dtype),
    its dtype taken from the kernel, the entries that database never timed (the 256-wide tiles)
    ranked last with that reason; a dtype the kernel does not take is refused in its words."""
    h100 = "NVIDIA H100 80GB HBM3"
    code, out, err = run_cli("explain", 4096, 4096, 4096, "--kernel", "hgemm_mma", "--gpu", h100, "--json",
                             "--no-build", "--top", 1000)
    assert code == 0, err
    rep = json.loads(out)
    assert rep["family"] == "hgemm_mma" and rep["call"]["dtype"] == "float16" and rep["call"]["kernel"] == "hgemm_mma"
    fitted = [r["fitted"] for r in rep["rows"]]
    assert not all(fitted) and fitted == sorted(fitted, reverse=True)       # the never-timed ones last
    assert all("never swept on this GPU" in r["why"] for r in rep["rows"] if not r["fitted"])
    assert {r["config"] for r in rep["rows"] if not r["fitted"]} == {"t128x256_w64x64", "t256x128_w64x64"}
    code, out, err = run_cli("explain", 4096, 4096, 4096, "--kernel", "hgemm_mma", "--gpu", h100, "--json", "--top", 1)
    assert code == 0, err
    assert json.loads(out)["runs"]["kernel"] == "hgemm_mma" and json.loads(out)["runs"]["copies"] == []
    code, out, err = run_cli("explain", 64, 64, 64, "--kernel", "hgemm_mma", "--dtype", "float32", "--gpu", h100,
                             "--no-build")
    assert code != 0 and "takes A/B float16" in err and "Traceback" not in err + out


@pytest.mark.parametrize("args, words", [(("--dtype", "float64"), "float64"), (("--layout", "xx"), "xx")])
def test_explain_refuses_bad_options_without_a_traceback(run_cli, args, words):
    code, out, err = run_cli("explain", 64, 64, 64, *args)
    assert code != 0 and words in err and "Traceback" not in err + out


def test_explain_of_a_gpu_without_a_database(dispatch_dir, run_cli):
    dispatch_dir("Test GPU")
    code, out, err = run_cli("explain", 64, 64, 64, "--gpu", "Other GPU", "--no-build")
    assert code == 1 and "no dispatch database of that GPU" in err and "Test GPU" in err and "Traceback" not in err


# ---- tuning/fit.py on samples of a known model ------------------------------------------------------
TRUE = {"t128x128_k8": (2e-6, 0.3e-6, 0.6, 2), "t64x64_k16": (1e-6, 0.32e-6, 0.6, 4)}    # a, b, f, r
FIT_SMS = 8


def _true_ms(m, n, k, tile, a, b, f, r) -> float:
    """The modelled GPU time written out again (module docstring of cost_model.py): full waves of
    blocks of a + b K steps, then the busiest SM's share of the last wave."""
    bm, bn, bk = tile
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    slots = FIT_SMS * r
    block = a + b * math.ceil(k / bk)
    full, rest = divmod(tiles, slots)
    t = full * block
    if rest:
        j = min(r, math.ceil(rest / FIT_SMS))
        t += block * (f + (1 - f) * j / r)
    return t * 1e3


def _sweep_doc() -> dict:
    entries = {e.name: e for e in SGEMM.configs}
    samples = []
    for m in (128, 384, 640, 1000, 1500):
        for n in (256, 700, 1300):
            for k in (256, 1024, 3000):
                for name, (a, b, f, r) in TRUE.items():
                    e = entries[name]
                    samples.append({"family": "sgemm", "config": name, "kernel": e.kernel, "label": name,
                                    "splits": 1, "reduce": None, "layout": "nn", "m": m, "n": n, "k": k,
                                    "gpu_ms": _true_ms(m, n, k, e.tile, a, b, f, r), "host_us": 10.0,
                                    "blocks_per_sm": r})
    return {"format": 1, "gpu": "Synthetic GPU", "target": "sm_90", "sms": FIT_SMS, "clock_hz": 1e9,
            "dram_bytes_per_s": 1e18, "family": "sgemm", "samples": samples}


def test_the_fit_recovers_known_coefficients():
    from asmgemm.tuning.fit import fit_model
    dm = fit_model(_sweep_doc())
    for name, (a, b, f, r) in TRUE.items():
        fit = dm.configs[f"sgemm:{name}"]
        assert fit.block_s == pytest.approx(a, rel=0.03) and fit.step_s == pytest.approx(b, rel=0.03), name
        assert fit.alone == pytest.approx(f) and fit.alone_fixed == pytest.approx(f)
        assert fit.blocks_per_sm == r and fit.samples == 45
    assert dm.host_s == pytest.approx(10e-6)


def test_the_fit_recovers_a_lone_blocks_two_shares():
    """Samples made with g = 0.9 for the fixed part and f = 0.3 for the K steps (the module
    docstring's last wave): the fit finds both, and a and b (centred: the samples are exact)."""
    from asmgemm.tuning.fit import fit_model
    a, b, f, g, r = 2e-6, 0.3e-6, 0.3, 0.9, 2
    name = "t128x128_k8"
    doc = _sweep_doc()
    doc["samples"] = [s for s in doc["samples"] if s["config"] == name]
    for s in doc["samples"]:
        bm, bn, bk = (128, 128, 8)
        tiles, slots = math.ceil(s["m"] / bm) * math.ceil(s["n"] / bn), FIT_SMS * r
        steps = math.ceil(s["k"] / bk)
        full, rest = divmod(tiles, slots)
        t = full * (a + b * steps)
        if rest:
            share = min(r, math.ceil(rest / FIT_SMS)) / r
            t += a * (g + (1 - g) * share) + b * steps * (f + (1 - f) * share)
        s["gpu_ms"] = t * 1e3
    fit = fit_model(doc).configs[f"sgemm:{name}"]
    assert (fit.alone, fit.alone_fixed) == (pytest.approx(f), pytest.approx(g))
    assert fit.block_s == pytest.approx(a, rel=0.01) and fit.step_s == pytest.approx(b, rel=0.01)


def test_the_fit_takes_each_configurations_fastest_load_rate_where_it_has_enough_samples():
    """fit.load_rates: the largest loaded_bytes / GPU time over a configuration's samples (so none
    of them runs under its own floor); a configuration with fewer than LOAD_RATE_MIN_SAMPLES
    samples gets no floor; the database keeps the rate."""
    from asmgemm.tuning import fit
    doc = _sweep_doc()
    dm = fit.fit_model(doc)
    entries = {e.name: e for e in SGEMM.configs}
    for name in TRUE:
        rows = [s for s in doc["samples"] if s["config"] == name]
        cand = Candidate("sgemm", name, "sgemm", entries[name].set, entries[name].tile)
        want = max(cost_model.loaded_bytes(cand, s["m"], s["n"], s["k"], 4) / (s["gpu_ms"] * 1e-3) for s in rows)
        assert dm.configs[f"sgemm:{name}"].load_bytes_per_s == pytest.approx(want)
        for s in rows:
            e = estimate(cand, s["m"], s["n"], s["k"], dm, "float32", 4, 4)
            assert e.load_s <= s["gpu_ms"] * 1e-3 * (1 + 1e-9)
    few = dict(doc, samples=[s for s in doc["samples"] if s["config"] != "t64x64_k16"]
               + [s for s in doc["samples"] if s["config"] == "t64x64_k16"][:fit.LOAD_RATE_MIN_SAMPLES - 1])
    assert fit.fit_model(few).configs["sgemm:t64x64_k16"].load_bytes_per_s == 0.0
    # the database keeps it
    back = dispatch_db.model_from(fit.make_database([doc])[0], "test")
    assert back.configs["sgemm:t64x64_k16"].load_bytes_per_s == pytest.approx(
        dm.configs["sgemm:t64x64_k16"].load_bytes_per_s)


def test_the_fit_keys_cluster_capacity_by_size_and_blocks_an_sm():
    """fit_model: clusters_at_once x S under cluster_key(S, blocks_per_sm), whichever configuration
    recorded it (the largest where two share a key); a sample without blocks_per_sm records nothing."""
    from asmgemm.tuning.fit import fit_model
    doc = _sweep_doc()
    one, two = list(TRUE)[:2]
    base = {"family": "sgemm", "kernel": "sgemm", "reduce": "cluster", "layout": "nn", "m": 384, "n": 700,
            "k": 3000, "gpu_ms": 0.05, "host_us": 10.0}
    doc["samples"] += [{**base, "config": one, "label": f"{one}/s3c", "splits": 3, "blocks_per_sm": 2,
                        "clusters_at_once": 2},
                       {**base, "config": two, "label": f"{two}/s3c", "splits": 3, "blocks_per_sm": 2,
                        "clusters_at_once": 3},
                       {**base, "config": one, "label": f"{one}/s5c", "splits": 5, "blocks_per_sm": None,
                        "clusters_at_once": 1}]
    assert fit_model(doc).cluster_slots == {"3x2": 9}


def test_the_fit_reads_a_hybrid_splits_cluster_from_its_label():
    """A "cluster+in_kernel" sample (S past the cluster limit, clusters of C summed in the kernel)
    fits as that candidate, clusters of C: before, the fit built it with no cluster and its slice
    sum divided by a zero share (an H200 sweep of hgemm_mma, 2026-11-29), and its capacity goes
    under cluster_key(C, r), not S."""
    from asmgemm.tuning import fit
    doc = _sweep_doc()
    name = list(TRUE)[0]
    base = {"family": "sgemm", "kernel": "sgemm", "reduce": "cluster+in_kernel", "layout": "nn", "m": 384,
            "n": 700, "k": 3000, "gpu_ms": 0.05, "host_us": 10.0, "config": name, "blocks_per_sm": 2}
    hybrid = [{**base, "label": f"{name}/s12c4", "splits": 12, "clusters_at_once": 5},
              {**base, "label": f"{name}/s16", "splits": 16, "clusters_at_once": 2}]
    assert [fit._candidate(s).cluster for s in hybrid] == [4, split_k.hybrid_cluster(16)]
    assert fit._candidate(doc["samples"][0]).cluster == 0
    doc["samples"] += hybrid
    dm = fit.fit_model(doc)
    assert dm.cluster_slots == {"4x2": 20, "8x2": 16}
    assert all(math.isfinite(v) for r in dm.residuals for v in r["gpu_res"].values())


def test_the_fit_reads_the_in_kernel_sums_hand_off_from_hybrids_beside_cluster_splits():
    """fit._fit_fixup_fixed: a hybrid ("cluster+in_kernel") timed beside the same configuration's
    cluster split takes what the model's difference between the two leaves over (a one-wave hybrid,
    here 5 us over the modelled difference); without such pairs the prior stays; the estimate of
    both in-kernel sums carries it and no other reduce's does."""
    from asmgemm.tuning import fit
    doc = _sweep_doc()
    name = list(TRUE)[0]
    base = {"family": "sgemm", "kernel": "sgemm", "layout": "nn", "m": 128, "n": 128, "k": 3000, "host_us": 10.0,
            "config": name, "blocks_per_sm": 2}
    plain = fit.fit_model(doc)
    assert plain.fixup_fixed_s == cost_model.PRIOR_FIXUP_FIXED_S
    cl = {**base, "reduce": "cluster", "label": f"{name}/s8c", "splits": 8, "gpu_ms": 0.04}
    hy = {**base, "reduce": "cluster+in_kernel", "label": f"{name}/s12c4", "splits": 12}
    bare = replace(plain, fixup_fixed_s=0.0)
    e_cl, e_hy = (estimate(fit._candidate(x), 128, 128, 3000, bare, "float32", 4, 4) for x in (cl, hy))
    assert e_hy.full_waves == 0
    hy["gpu_ms"] = (0.04e-3 + e_hy.gpu_s - e_cl.gpu_s + 5e-6) * 1e3
    doc["samples"] += [cl, hy]
    dm = fit.fit_model(doc)
    assert dm.fixup_fixed_s == pytest.approx(5e-6, rel=0.05)
    back = dispatch_db.model_from(fit.make_database([doc])[0], "test")
    assert back.fixup_fixed_s == pytest.approx(dm.fixup_fixed_s)
    for reduce, cluster, carries in (("cluster+in_kernel", 4, True), ("in_kernel", 0, True), ("cluster", 0, False),
                                     ("kernel", 0, False)):
        cand = replace(fit._candidate(cl), splits=12 if cluster else 8, reduce=reduce, cluster=cluster)
        with_it = estimate(cand, 128, 128, 3000, dm, "float32", 4, 4).split_s
        without = estimate(cand, 128, 128, 3000, replace(dm, fixup_fixed_s=0.0), "float32", 4, 4).split_s
        assert with_it - without == pytest.approx(dm.fixup_fixed_s if carries else 0.0), reduce


def test_the_fit_takes_the_kept_scratchs_host_time_from_in_kernel_sums():
    """fit.fit_model: the in-kernel sums' host time over the unsplit calls' (median against median)
    is scratch_s; without such samples the prior stays. The estimate charges it to both in-kernel
    sums' host time, the reduce kernel's split launch_s, a cluster split nothing more than an
    unsplit call; the database keeps it."""
    from asmgemm.tuning import fit
    doc = _sweep_doc()
    name = list(TRUE)[0]
    assert fit.fit_model(doc).scratch_s == cost_model.PRIOR_SCRATCH_S
    base = {"family": "sgemm", "kernel": "sgemm", "layout": "nn", "m": 128, "n": 128, "k": 3000, "config": name,
            "blocks_per_sm": 2, "gpu_ms": 0.04}
    doc["samples"] += [{**base, "reduce": "cluster+in_kernel", "label": f"{name}/s12c4", "splits": 12,
                        "host_us": 10.0 + extra} for extra in (5.5, 6.5, 6.0)]
    dm = fit.fit_model(doc)
    assert dm.scratch_s == pytest.approx(6e-6)             # every unsplit sample of the doc: 10 us
    assert dispatch_db.model_from(fit.make_database([doc])[0], "test").scratch_s == pytest.approx(6e-6)
    cand = fit._candidate({**base, "reduce": "cluster", "label": f"{name}/s8c", "splits": 8})
    for reduce, cluster, extra in (("cluster+in_kernel", 4, dm.scratch_s), ("in_kernel", 0, dm.scratch_s),
                                   ("kernel", 0, dm.launch_s), ("cluster", 0, 0.0), (None, 0, 0.0)):
        c = replace(cand, splits=12 if cluster else (1 if reduce is None else 8), reduce=reduce, cluster=cluster)
        assert estimate(c, 128, 128, 3000, dm, "float32", 4, 4).host_s == pytest.approx(dm.host_s + extra), reduce


def test_rebuilt_residuals_are_the_fits_and_only_its_own_sweeps_rebuild_them():
    """fit.rebuild_residuals: a database whose neighbours are of the earlier form (call times,
    "res") gets the fit's present ones back from the sweep it was fitted on, coefficients and hits
    untouched; a sweep of other timings, or without one of its calls, is refused."""
    from asmgemm.tuning import fit
    doc = _sweep_doc()
    db, _ = fit.make_database([doc])
    dm = dispatch_db.model_from(db, "test")
    earlier = []
    for r in db["model"]["residuals"]:
        rows = [s for s in doc["samples"] if (s["m"], s["n"], s["k"]) == (r["m"], r["n"], r["k"])]
        earlier.append({**{k: v for k, v in r.items() if k != "gpu_res"}, "res": {
            s["label"]: math.log(fit._call_ms(s, dm) * 1e-3 / estimate(fit._candidate(s), s["m"], s["n"], s["k"], dm,
                                                                       "float32", 4, 4, fit._variant(s)).call_s)
            for s in rows}})
    old = {**db, "model": {**db["model"], "residuals": earlier}}
    new, report = fit.rebuild_residuals(old, [doc])
    assert new == db and report["calls"] == 45 and report["residuals_checked"] == 90
    slower = {**doc, "samples": [{**s, "gpu_ms": s["gpu_ms"] * 1.1} for s in doc["samples"]]}
    with pytest.raises(AsmError, match="not the samples these coefficients were fitted on"):
        fit.rebuild_residuals(old, [slower])
    fewer = {**doc, "samples": [s for s in doc["samples"] if s["m"] != 128]}
    with pytest.raises(AsmError, match="in none of the sweeps"):
        fit.rebuild_residuals(old, [fewer])


def test_the_fitted_model_picks_the_measured_best_and_the_database_says_so():
    from asmgemm.tuning.fit import evaluate, fit_model, make_database
    doc = _sweep_doc()
    ev = evaluate(fit_model(doc), doc["samples"])
    assert ev["calls"] == 45 and ev["within_5pct"] == 45 and ev["share_within_5pct"] == 1.0
    assert ev["geomean_pick_over_best"] == pytest.approx(1.0) and ev["worst"] == []
    db, report = make_database([doc])
    want = {}
    for s in doc["samples"]:
        key = f"sgemm|nn|{s['m']}x{s['n']}x{s['k']}|plain"
        if key not in want or s["gpu_ms"] < want[key][0]:
            want[key] = (s["gpu_ms"], s["label"])
    assert db["best"] == {key: label for key, (_, label) in want.items()}
    assert set(db["best"].values()) == set(TRUE)           # each configuration wins somewhere
    assert (db["format"], db["gpu"], db["target"], db["sms"]) == (1, "Synthetic GPU", "sm_90", FIT_SMS)
    assert report["in_sample"]["sgemm"]["share_within_5pct"] == 1.0
    held = report["held_out"]["sgemm"]
    assert 0 < held["calls"] < 45 and held["share_within_5pct"] == 1.0
    # the database reads back as this GPU's model
    dm = dispatch_db.model_from(db, "test")
    assert dm.configs["sgemm:t64x64_k16"].step_s == pytest.approx(0.32e-6, rel=0.03)


def test_the_fit_keeps_each_variants_occupancy_and_drops_retired_samples():
    """The same samples, half of them of a variant whose builds hold one block an SM less and run
    as the model says for that occupancy: the fit keeps the configuration's r, that variant's own,
    and the same coefficients; samples of a retired variant ('2': loads no call makes now) are
    left out of the database and counted."""
    from asmgemm.tuning.fit import fit_model, make_database
    doc = _sweep_doc()
    entries = {e.name: e for e in SGEMM.configs}
    extra = []
    for s in doc["samples"]:
        a, b, f, r = TRUE[s["config"]]
        extra.append({**s, "variant": "nn:00:2r/16", "blocks_per_sm": r - 1,
                      "gpu_ms": _true_ms(s["m"], s["n"], s["k"], entries[s["config"]].tile, a, b, f, r - 1)})
    retired = [{**s, "variant": "nn:00:2/16", "m": s["m"] + 1} for s in doc["samples"][:5]]
    both = {**doc, "samples": [{**s, "variant": "nn:11:16/16"} for s in doc["samples"]] + extra + retired}
    dm = fit_model({**both, "samples": both["samples"][:-5]})
    for name, (a, b, f, r) in TRUE.items():
        fit = dm.configs[f"sgemm:{name}"]
        assert fit.blocks_per_sm == r and fit.variant_blocks == {"nn:00:2r/16": r - 1}, name
        assert fit.step_s == pytest.approx(b, rel=0.03) and fit.factor("nn:00:2r/16") == pytest.approx(1.0, abs=0.02)
    db, report = make_database([both])
    assert report["retired"] == 5 and not any(f"|{s['m']}x" in key for s in retired for key in db["best"])


def test_each_wave_regime_weighs_toward_the_same_total(monkeypatch):
    """Six samples under one wave, two of a few waves, one of many: balanced fully, each regime's
    weights sum to a third of the samples; at REGIME_BALANCE the fewer samples still weigh more
    each, and the samples' order does not matter."""
    from asmgemm.runtime.cost_model import DeviceModel
    from asmgemm.tuning import fit
    dm = DeviceModel("Synthetic GPU", FIT_SMS, 1e9, 1e18)
    name = "t64x64_k16"           # 64 x 64 tiles; FIT_SMS x 4 = 32 slots
    tiles_n = [1, 2, 4, 8, 16, 31] + [40, 100] + [300]
    rows = [{"family": "sgemm", "config": name, "layout": "nn", "splits": 1, "reduce": None, "m": 64, "n": 64 * t,
             "k": 64} for t in tiles_n]
    monkeypatch.setattr(fit, "REGIME_BALANCE", 1.0)
    w = fit.regime_weights(rows, dm, 4)
    assert sum(w[:6]) == pytest.approx(3.0) and sum(w[6:8]) == pytest.approx(3.0) and w[8] == pytest.approx(3.0)
    monkeypatch.setattr(fit, "REGIME_BALANCE", 0.5)
    half = fit.regime_weights(rows, dm, 4)
    assert half[0] < 1 < half[6] < half[8] < w[8]
    assert fit.regime_weights(rows[::-1], dm, 4) == half[::-1]
    monkeypatch.setattr(fit, "REGIME_BALANCE", 0.0)
    assert fit.regime_weights(rows, dm, 4) == [1.0] * len(rows)


def test_sweeps_of_two_gpus_are_not_fitted_together():
    from asmgemm.tuning.fit import make_database
    doc = _sweep_doc()
    with pytest.raises(AsmError, match="2 GPUs"):
        make_database([doc, {**doc, "gpu": "Other GPU"}])


# ---- asmgemm.gemm runs what dispatch chose ---------------------------------------------------------
def _rand(*shape, seed=0):
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype(np.float32).view(FakeArray)


def _run(m, n, k, **kw):
    import asmgemm
    a, b = _rand(m, k), _rand(k, n, seed=1)
    c = asmgemm.gemm(a, b, **kw)
    np.testing.assert_allclose(np.asarray(c), np.asarray(a, np.float64) @ np.asarray(b, np.float64),
                               rtol=1e-4, atol=1e-3)


def _fake_choice(m, n, k, plain=True):
    """What dispatch.choose says for the stand-in GPU (Fake GPU: sm_90, 132 SMs, no clock or DRAM
    rate) and a fresh row-major call."""
    return dispatch.choose(SGEMM, "nn", m, n, k, gpu="Fake GPU", target="sm_90", sms=132, plain=plain)


@pytest.mark.toolchain
@needs_ptxas
def test_an_untuned_call_runs_the_first_candidate_that_builds(fake_fp32_gemm, dispatch_dir):
    from asmgemm.runtime.gemm import last_launch
    dispatch_dir("Fake GPU")
    _run(200, 300, 600)
    ran = last_launch()
    ch = _fake_choice(200, 300, 600)
    order = labels(ch.order)
    assert ran["chosen_by"] == "model" and ran["config"] in order
    plan = fresh_plan(200, 300, 600, "nn", 4)
    for cand in ch.order[:order.index(ran["config"])]:       # whatever came before was refused by a guard
        assert dispatch.refusal(dispatch.candidate_build(cand, plan, 132, "sm_90", True).key)
    picked = ch.order[order.index(ran["config"])]
    assert ran["kernel"] == picked.kernel and ran["splits"] == picked.splits and ran["reduce"] == picked.reduce
    assert {k: ran["params"][k] for k in dict(picked.set)} == {k: str(v) for k, v in picked.set}
    assert "blocks_per_sm" in ran and "clusters_at_once" in ran      # the driver's word: None on the stand-in
    assert ran["blocks_per_sm"] is None


@pytest.mark.toolchain
@needs_ptxas
def test_an_exact_hit_runs_and_last_launch_says_so(fake_fp32_gemm, dispatch_dir):
    """17 x 576 x 2000 with the database's hit t64x64_k16/s21 (asked 24 ways: chunks of 96, 21
    splits): the partial pass on (9, 1, 21) and the reduce."""
    from asmgemm.runtime.gemm import last_launch
    _, launches = fake_fp32_gemm
    dispatch_dir("Fake GPU", best={"sgemm|nn|17x576x2000|plain": "t64x64_k16/s21"})
    _run(17, 576, 2000)
    ran = last_launch()
    assert (ran["config"], ran["chosen_by"], ran["kernel"]) == ("t64x64_k16/s21", "database", "sgemm")
    assert (ran["splits"], ran["reduce"], ran["tile"]) == (21, "kernel", (64, 64))
    assert len(launches) == 2 and launches[0][0] == (9, 1, 21)
    assert int(dict(zip(SGEMM.abi, launches[0][2]))["k_chunk"]) == 96


@pytest.mark.toolchain
@needs_ptxas
def test_params_and_a_tuning_entry_decide_before_the_catalog(fake_fp32_gemm, dispatch_dir, monkeypatch):
    from asmgemm.runtime import gemm as gemm_module
    from asmgemm.runtime import launch_config
    from asmgemm.runtime.gemm import last_launch
    dispatch_dir("Fake GPU", best={"sgemm|nn|17x576x2000|plain": "t64x64_k16/s21"})
    _run(17, 576, 2000, params={"THREADS": 64, "BK": 16})
    ran = last_launch()
    assert (ran["chosen_by"], ran["config"], ran["splits"], ran["tile"]) == ("params", None, 1, (64, 64))
    monkeypatch.setattr(gemm_module, "lookups_disabled", lambda: False)
    monkeypatch.setattr(launch_config, "lookups_disabled", lambda: False)
    monkeypatch.setattr(launch_config, "lookup_tuned_choice", lambda *a: {"RQ": 2, "BK": 16})
    gemm_module.clear_plan_cache()
    _run(17, 576, 2000)
    ran = last_launch()
    assert (ran["chosen_by"], ran["config"], ran["splits"], ran["tile"]) == ("tuning cache", None, 1, (128, 128))
    assert ran["params"]["BK"] == "16"


@pytest.mark.toolchain
@needs_ptxas
def test_a_refused_build_is_skipped_for_the_next(fake_fp32_gemm, dispatch_dir):
    """A hit naming skinny_r1 for a row-major B: gemm_skinny's guard refuses MR = 1 there (a
    K-major B only), the refusal is remembered, and the model's first buildable candidate runs."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    dispatch_dir("Fake GPU", best={"sgemm|nn|1x256x512|plain": "skinny_r1"})
    a, b = _rand(1, 512), _rand(512, 256, seed=1)
    c = asmgemm.gemm(a, b)
    np.testing.assert_allclose(np.asarray(c), np.asarray(a, np.float64) @ np.asarray(b, np.float64),
                               rtol=1e-4, atol=1e-3)
    ran = last_launch()
    assert ran["config"] != "skinny_r1"
    plan = fresh_plan(1, 256, 512, "nn", 4)
    skinny = next(c for c in dispatch.choose(SGEMM, "nn", 1, 256, 512, gpu="Fake GPU", target="sm_90", sms=132,
                                             plain=True, call_values=plan.call_values).order
                  if c.label == "skinny_r1")
    assert "MR must be" in dispatch.refusal(dispatch.candidate_build(skinny, plan, 132, "sm_90", True).key)


@pytest.mark.toolchain
@needs_ptxas
def test_a_refused_hit_is_not_reported_as_the_databases_choice(fake_fp32_gemm, dispatch_dir):
    """The hit's build refused, the model's next candidate ran: last_launch() says the model chose."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    dispatch_dir("Fake GPU", best={"sgemm|nn|1x256x512|plain": "skinny_r1"})
    asmgemm.gemm(_rand(1, 512), _rand(512, 256, seed=1))
    assert last_launch()["config"] != "skinny_r1"
    assert last_launch()["chosen_by"] == "model"


@pytest.mark.toolchain
@needs_ptxas
def test_a_fused_call_never_splits(fake_fp32_gemm, dispatch_dir):
    """The same shape plain runs the database's split; with a bias, or a bias and an activation,
    its fused key's hit, unsplit; a fused call without a hit runs the model's unsplit pick."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    _, launches = fake_fp32_gemm
    dispatch_dir("Fake GPU", best={"sgemm|nn|512x768x768|plain": "t64x64_k16/s12",
                                   "sgemm|nn|512x768x768|fused": "t128x128_k8"})
    a, b = _rand(512, 768), _rand(768, 768, seed=1)
    bias = _rand(768, seed=2)
    asmgemm.gemm(a, b)
    assert (last_launch()["config"], last_launch()["splits"]) == ("t64x64_k16/s12", 12) and len(launches) == 2
    asmgemm.gemm(a, b, bias=bias)
    ran = last_launch()
    assert (ran["config"], ran["chosen_by"], ran["splits"], ran["tile"]) == ("t128x128_k8", "database", 1, (128, 128))
    asmgemm.gemm(a, b, bias=bias, activation="relu")          # one key for every fused call
    assert (last_launch()["config"], last_launch()["chosen_by"]) == ("t128x128_k8", "database")
    a = _rand(512, 700)
    asmgemm.gemm(a, _rand(700, 768, seed=3), activation="relu")
    ran = last_launch()
    assert ran["chosen_by"] == "model" and ran["splits"] == 1 and "/" not in ran["config"]
    assert ran["config"] in labels(_fake_choice(512, 768, 700, plain=False).order)


@pytest.mark.parametrize("m, n, k", [(0, 4, 8), (5, 0, 8), (5, 4, 0)])
def test_an_empty_call_returns_before_the_model(fake_fp32_gemm, dispatch_dir, m, n, k):
    """M, N or K of 0 (no epilogue): nothing to launch, C untouched or scaled by beta, whatever the
    GPU's model holds (here a measured call near this one: the neighbours' log2 of the sizes)."""
    import asmgemm
    near = {"family": "sgemm", "variant": "nn:11:16/16", "m": 8, "n": 8, "k": 8, "plain": True,
            "gpu_res": {"t128x128_k8": 0.1}}
    dispatch_dir("Fake GPU", residuals=[near])
    _, launches = fake_fp32_gemm
    a = np.zeros((8, 8), np.float32)[:m, :k].view(FakeArray)      # views of real rows: a stride of their own
    b = np.zeros((8, 8), np.float32)[:k, :n].view(FakeArray)
    c = np.ones((8, 8), np.float32)[:m, :n].view(FakeArray)
    asmgemm.gemm(a, b, c, beta=0.5)
    np.testing.assert_array_equal(np.asarray(c), np.full((m, n), 0.5 if k == 0 else 1.0, np.float32))
    assert launches == []


@pytest.mark.toolchain
@needs_ptxas
def test_a_batched_call_runs_only_a_kernel_that_takes_the_batch(fake_fp32_gemm, dispatch_dir):
    """A batch that does not fold into rows runs one launch with grid z = the batch, which only a
    kernel with a `batched` call parameter (sgemm's BATCHED) reads; sgemm_skinny has none, so its
    entries are no candidates there, whatever the database or the model say."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    dispatch_dir("Fake GPU", best={"sgemm|nn|4x6x5|fused": "skinny_r4"})
    _, launches = fake_fp32_gemm
    a, b = _rand(3, 4, 5), _rand(3, 5, 6, seed=1)
    out = asmgemm.gemm(a, b)
    assert last_launch()["kernel"] == "sgemm" and launches[-1][0][2] == 3
    for i in range(3):
        np.testing.assert_allclose(np.asarray(out[i]), np.asarray(a[i], np.float64) @ np.asarray(b[i], np.float64),
                                   rtol=1e-4, atol=1e-3)


def test_a_fit_keeps_the_other_families_of_the_gpus_database(tmp_path, run_cli):
    """`asmgemm tune sgemm --fit` into a GPU's database that holds another family's fit (hgemm_mma,
    swept before) keeps that family whole: its configurations, exact hits, neighbours and the shared
    terms it was fitted with (model.family_terms), which it is priced by (and its twin bgemm_mma);
    sgemm takes the new fit's. A second fit of sgemm replaces sgemm's alone."""
    out = tmp_path / "db.json"
    old = dict(database("Synthetic GPU", configs={"hgemm_mma:t128x128_w64x64": H100_FIT},
                        best={"hgemm_mma|nn|64x64x64|plain": "t128x128_w64x64"}, host_s=30e-6,
                        residuals=[{"family": "hgemm_mma", "variant": "nn:11:16/16", "m": 64, "n": 64, "k": 64,
                                    "plain": True, "gpu_res": {"t128x128_w64x64": 0.1}}]),
               families=["hgemm_mma"], clock_hz=1e9, sms=FIT_SMS)
    out.write_text(json.dumps(old))
    samples = tmp_path / "sweep.json"
    samples.write_text(json.dumps(_sweep_doc()))
    for _ in range(2):
        code, _, err = run_cli("tune", "sgemm", "--fit", str(samples), "--out", str(out))
        assert code == 0, err
        db = json.loads(out.read_text())
        assert db["families"] == ["hgemm_mma", "sgemm"]
        assert "hgemm_mma:t128x128_w64x64" in db["model"]["configs"] and "sgemm:t64x64_k16" in db["model"]["configs"]
        assert db["best"]["hgemm_mma|nn|64x64x64|plain"] == "t128x128_w64x64"
        assert any(k.startswith("sgemm|") for k in db["best"])
        assert {r["family"] for r in db["model"]["residuals"]} == {"hgemm_mma", "sgemm"}
        assert sum(r["family"] == "hgemm_mma" for r in db["model"]["residuals"]) == 1
        assert db["model"]["host_s"] == pytest.approx(10e-6)            # the synthetic sweep's host time
        priced = {fam: dispatch_db.model_from(db, "test", None, dispatch_db.swept_family(db, fam)).host_s
                  for fam in ("sgemm", "hgemm_mma", "bgemm_mma")}
        assert priced == pytest.approx({"sgemm": 10e-6, "hgemm_mma": 30e-6, "bgemm_mma": 30e-6})
    # a database of another GPU is not merged into
    assert dispatch_db.merge_fit(dict(old, gpu="Other GPU"), db) == db


def test_a_sweep_stopped_by_a_time_limit_keeps_the_calls_it_timed(tmp_path, monkeypatch, run_cli):
    """`tune --sweep --samples FILE` checkpoints FILE as the calls are timed (whole, atomically, at
    most every CHECKPOINT_S): a sweep killed by `timeout` on the GPU machine leaves the calls it
    finished, marked calls_timed < calls; `--fit` fits them and says the sweep stopped."""
    from asmgemm.commands import tune_sweep
    from asmgemm.runtime.gpu import DeviceFacts
    from asmgemm.tuning import sweep as sweep_module
    facts = DeviceFacts(0, "Synthetic GPU", "sm_90", FIT_SMS, 1e9, 3.35e12, 50 << 20)
    monkeypatch.setattr(sweep_module, "require_gpu", lambda what: object())
    monkeypatch.setattr(sweep_module, "device_facts", lambda: facts)
    monkeypatch.setattr(sweep_module, "plan_calls", lambda family, shapes, facts, exhaustive: ["c0", "c1", "c2"])
    monkeypatch.setattr(sweep_module, "prebuild", lambda calls, facts, jobs, on_done: {})
    full = _sweep_doc()["samples"]

    def time_two_then_stop(cp, family, calls, facts, *, reps, warmup, on_call=None, checkpoint=None):
        samples = []
        for i, _ in enumerate(calls):
            samples += full[i::3]
            checkpoint(samples, i + 1)
            if i == 1:
                raise KeyboardInterrupt          # what the time limit's signal ends the sweep with
        return samples
    monkeypatch.setattr(sweep_module, "time_calls", time_two_then_stop)
    monkeypatch.setattr(tune_sweep, "CHECKPOINT_S", 0.0)
    out = tmp_path / "sweep.json"
    with pytest.raises(KeyboardInterrupt):
        tune_sweep.run_sweep_or_fit("sgemm", "64x64x64", [], "nn", 1, 1, 0, str(out), str(tmp_path / "x.json"), False)
    doc = json.loads(out.read_text())
    assert (doc["calls"], doc["calls_timed"]) == (3, 2) and doc["gpu"] == "Synthetic GPU"
    assert doc["samples"] == full[0::3] + full[1::3]
    assert not list(tmp_path.glob("*.tmp*")) and not (tmp_path / "x.json").exists()
    code, _, err = run_cli("tune", "sgemm", "--fit", str(out), "--out", str(tmp_path / "db.json"))
    assert code == 0, err
    assert "a sweep stopped after 2 of its 3 calls" in err
    assert json.loads((tmp_path / "db.json").read_text())["fit"]["samples"] == len(doc["samples"])
