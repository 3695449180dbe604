"""Enumerating a kernel's .tune space and pruning candidates (ptxas on the CPU)."""
from pathlib import Path

import pytest

from asmgemm.isa.arch import arch_for, blocks_per_sm
from asmgemm.tuning.space import (BuildJob, Candidate, build_candidates, dynamic_shared_bytes,
                                      enumerate_space, mark_duplicates, prune_verdict, threads_per_entry)
from asmgemm.errors import AsmError
from asmgemm.pipeline import build_file
from asmgemm.toolchain import find_tool

DATA = Path(__file__).parent / "data" / "tune"
TUNE_SUM = DATA / "tune_sum.sasm"
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")


def test_enumerate_is_the_cartesian_product_in_declaration_order():
    space = enumerate_space({"A": [1, 2], "B": [8, 16, 32]})
    assert space == [{"A": 1, "B": 8}, {"A": 1, "B": 16}, {"A": 1, "B": 32},
                     {"A": 2, "B": 8}, {"A": 2, "B": 16}, {"A": 2, "B": 32}]


def test_enumerate_leaves_fixed_parameters_out():
    assert enumerate_space({"A": [1, 2], "B": [8, 16]}, fixed={"A": "2"}) == [{"B": 8}, {"B": 16}]


def test_enumerate_refuses_huge_spaces():
    with pytest.raises(AsmError) as e:
        enumerate_space({"A": list(range(100)), "B": list(range(100))}, limit=1000)
    assert "10000" in e.value.message and "-D" in e.value.hint


def test_tunables_come_from_the_source():
    r = build_file(str(TUNE_SUM))
    assert r.tunables == {"THREADS": [128, 256], "LIVE": [4, 96]}
    assert len(enumerate_space(r.tunables)) == 4


def test_threads_and_dynamic_shared_from_ptx():
    ptx = """
.visible .entry k1(.param .u64 a) .reqntid 16, 8, 1 .minnctapersm 2 { ret; }
.visible .entry k2(.param .u64 a)
.maxntid 256, 1, 1
{ ret; }
.entry k3() { ret; }
"""
    assert threads_per_entry(ptx) == {"k1": 128, "k2": 256, "k3": None}
    assert dynamic_shared_bytes({"SMEM_BYTES": 16896}) == 16896
    assert dynamic_shared_bytes({"SMEM": 512}, "SMEM") == 512
    assert dynamic_shared_bytes({}) == 0 and dynamic_shared_bytes({"SMEM_BYTES": "x"}) == 0


def fig(**kw):
    base = {"name": "k", "registers": 32, "spill_stores": 0, "spill_loads": 0, "stack_frame": 0, "local_bytes": 0,
            "shared_bytes": 0, "threads": 256}
    base.update(kw)
    lim = arch_for("sm_90").limits
    if base["threads"]:
        base["occupancy"] = blocks_per_sm(lim, base["threads"], base["registers"], base.get("total_shared_bytes", base["shared_bytes"]))
    return base


@pytest.mark.parametrize("kw, reason", [
    ({}, None),
    ({"spill_stores": 8}, "spills"),
    ({"stack_frame": 16}, "local memory"),
    ({"threads": 2048}, "threads"),
    ({"registers": 255, "threads": 1024}, "registers"),          # 255 regs x 1024 threads > 64K
    ({"total_shared_bytes": 228 * 1024}, "shared memory"),
])
def test_prune_verdict(kw, reason):
    got, detail = prune_verdict([fig(**kw)], arch_for("sm_90").limits)
    assert got == reason
    assert (detail == "") == (reason is None)


def test_blocks_per_sm_matches_the_occupancy_rules():
    lim = arch_for("sm_90").limits
    # 128 regs x 256 threads = 32K registers: 2 blocks; 16.5 KB shared: 13 by shared memory
    occ = blocks_per_sm(lim, 256, 124, 16896)
    assert occ["registers"] == 2 and occ["shared"] == 228 * 1024 // (16896 + 1024) and occ["resident"] == 2
    assert blocks_per_sm(lim, 64, 128, 8704)["resident"] == 8
    assert blocks_per_sm(lim, 1024, 255, 0)["registers"] == 0


def test_duplicates_are_pruned_after_the_first():
    cands = [Candidate(0, {"X": 0}, "ok", ptx_hash="h1"), Candidate(1, {"X": 1}, "ok", ptx_hash="h1"),
             Candidate(2, {"X": 2}, "ok", ptx_hash="h2"), Candidate(3, {"X": 3}, "pruned", "spills", ptx_hash="h2")]
    mark_duplicates(cands)
    assert [(c.status, c.reason) for c in cands] == [("ok", None), ("pruned", "duplicate"), ("ok", None),
                                                     ("pruned", "spills")]
    assert "#0" in cands[1].detail


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("jobs", [1, 2])
def test_build_and_prune_the_test_kernel(jobs):
    space = enumerate_space(build_file(str(TUNE_SUM)).tunables)
    cands = build_candidates([BuildJob(i, str(TUNE_SUM), p, {}, None) for i, p in enumerate(space)], jobs=jobs)
    verdicts = {(c.params["THREADS"], c.params["LIVE"]): (c.status, c.reason) for c in cands}
    assert verdicts == {(128, 4): ("ok", None), (128, 96): ("pruned", "spills"),
                        (256, 4): ("ok", None), (256, 96): ("pruned", "error")}
    by = {(c.params["THREADS"], c.params["LIVE"]): c for c in cands}
    assert "THREADS * LIVE must stay <= 20000" in by[(256, 96)].detail
    assert by[(128, 4)].figure("threads") == 128 and by[(256, 4)].figure("threads") == 256
    assert by[(128, 96)].figure("spill_stores") > 0


@pytest.mark.toolchain
@needs_ptxas
def test_parameter_that_changes_nothing_gives_duplicates(tmp_path):
    src = tmp_path / "dup.sasm"
    src.write_text(TUNE_SUM.read_text().replace(".tune LIVE in choices(4, 96)",
                                                ".const UNUSED ?= 0\n.tune UNUSED in choices(0, 1)")
                   .replace(".tune THREADS in choices(128, 256)", ""))
    space = enumerate_space(build_file(str(src)).tunables)
    cands = build_candidates([BuildJob(i, str(src), p, {}, None) for i, p in enumerate(space)], jobs=1)
    assert [(c.status, c.reason) for c in cands] == [("ok", None), ("pruned", "duplicate")]


@pytest.mark.toolchain
@needs_ptxas
def test_ptxas_rejection_is_an_error_verdict(tmp_path):
    src = tmp_path / "big.sasm"
    src.write_text("""
.const WORDS ?= 1024
.tune WORDS in choices(1024, 20000)
.visible .entry big(.param .u64 p)
{
    .shared .align 4 .b32 buf[WORDS];
    .regs .u64 ptr
    .regs .f32 x
    ld.param.u64 ptr, [p];
    ld.shared.f32 x, [buf+{4 * (WORDS - 1)}];
    st.global.f32 [ptr], x;
    ret;
}
""")
    space = enumerate_space(build_file(str(src)).tunables)
    cands = build_candidates([BuildJob(i, str(src), p, {}, None) for i, p in enumerate(space)], jobs=1)
    assert cands[0].ok
    assert cands[1].reason == "error" and "ptxas" in cands[1].detail


@pytest.mark.toolchain
@needs_ptxas
def test_interrupt_during_builds_propagates_and_stops_the_pool():
    space = enumerate_space(build_file(str(TUNE_SUM)).tunables)
    jobs = [BuildJob(i, str(TUNE_SUM), p, {}, None) for i, p in enumerate(space)]
    done = []

    def interrupt(c):
        done.append(c.index)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_candidates(jobs, jobs=2, on_done=interrupt)
    assert len(done) == 1
