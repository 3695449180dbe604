"""Issue 35, point 3: the stall and yield pass (asm/sass/stall_pass.py), on the CPU.

Every shipped kernel is built and assembled by ptxas once per module. The pass's output must pass
the checker and nvdisasm's re-read on all of them (a hazard is a bug in the pass); a distance
computation written here, independently of the pass and of the checker (shortest paths instead
of path enumeration), confirms that no fixed-latency pair fell below the table's latency or
ptxas's own distance. The instructions looked at are found in ptxas's code, not hard-coded."""
from __future__ import annotations

import heapq
import json

import pytest

from asmgemm.errors import AsmError
from asmgemm.isa import control_bits as cb
from asmgemm.sass.decode import BRANCHES, TERMINATORS
from asmgemm.sass.elf import ElfCubin
from asmgemm.sass.hazards import CodeFacts, fixed_latencies
from asmgemm.sass.patch import load_kernels, plan_patch
from asmgemm.sass.stall_pass import HOT_OPCODES, LEFT_ALONE_REASONS, YIELD_REQUIRED_FROM_STALL
from asmgemm.scheduler.latencies_sm90 import TABLE
from asmgemm.toolchain import find_tool
from sweeps import sample_every

pytestmark = [
    pytest.mark.toolchain,
    pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                       reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')"),
]

HORIZON = 32                      # cycles searched for a consumer; the table's longest latency is 8


@pytest.fixture(scope="module")
def cubins(shipped_cubins) -> dict[str, bytes]:
    return shipped_cubins


@pytest.fixture(scope="module")
def decoded(cubins):
    return {name: load_kernels(data, name)[1] for name, data in cubins.items()}


@pytest.fixture(scope="module")
def stall_plans(cubins):
    return {name: plan_patch(data, None, name, stall_pass=True) for name, data in cubins.items()}


@pytest.fixture(scope="module")
def both_plans(cubins):
    return {name: plan_patch(data, None, name, stall_pass=True, yield_every=2) for name, data in cubins.items()}


def _fields(data: bytes, kernel: str, n: int) -> list[dict]:
    return [cb.decode_control(w) for w in ElfCubin(data).words(kernel)[:n]]


# ---- the checker and nvdisasm accept what the pass writes ------------------------------------------

# the stall pass alone in the default run (its plans serve the tests below too); with yields, which
# plans every kernel again, in the slow set
@pytest.mark.parametrize("passes", sample_every(2, ["stalls", "stalls_and_yields"]))
def test_stall_pass_output_passes_the_checker_and_nvdisasm_on_every_shipped_kernel(cubins, stall_plans, request, passes):
    plans = stall_plans if passes == "stalls" else request.getfixturevalue("both_plans")
    lowered = 0
    for name, plan in plans.items():
        # plan_patch ran check_patch and, where anything changed, nvdisasm on the patched bytes
        assert not plan.hazards, (name, [h.line() for h in plan.hazards[:3]])
        assert [s.kernel for s in plan.stall_pass] == list(ElfCubin(cubins[name]).kernels)
        for s in plan.stall_pass:
            assert set(s.left_alone) <= set(LEFT_ALONE_REASONS)
            assert s.to_json()["measured"] is False
        lowered += sum(s.stalls_lowered for s in plan.stall_pass)
    assert lowered > 0, "the pass lowered no stall in any shipped kernel"


def test_stall_pass_only_lowers_stalls_and_only_where_it_may(decoded, stall_plans):
    fixed = fixed_latencies(TABLE)
    for name, plan in stall_plans.items():
        for change in plan.changes:
            kernel = decoded[name][change.kernel]
            ins = kernel.instructions
            i = ins[change.index]
            assert set(change.fields()) == {"stall"}, (name, change.text)
            before, after = change.fields()["stall"]
            assert 1 <= after < before, (name, change.text)
            assert i.opcode in fixed and i.opcode not in ("CS2R", "NOP") and not i.opcode.startswith("U")
            assert i.write_sb is None and i.read_sb is None and not i.wait_mask, change.text
            code = CodeFacts(ins, kernel.blocks, [x.word for x in ins])
            assert not any(ins[s].wait_mask for s in code.succ[change.index]), \
                f"lowered the stall right before a scoreboard wait: {change.text}"
        summaries = {s.kernel: s for s in plan.stall_pass}
        for kname, s in summaries.items():
            mine = [c for c in plan.changes if c.kernel == kname]
            assert s.stalls_lowered == len(mine)
            assert s.cycles_removed == sum(c.before["stall"] - c.after["stall"] for c in mine)


def _min_distances(code: CodeFacts, gaps: list[int], p: int, touches) -> dict[int, int]:
    """instruction -> the shortest issue distance from producer p to it, for the instructions
    where `touches(x, live)` holds while p's value is still live, over the control-flow graph:
    Dijkstra over (instruction, registers still holding p's value)."""
    best: dict[int, int] = {}
    start = frozenset(code.writes[p])
    heap = [(gaps[p], s, start) for s in code.succ[p]]
    done = set()
    while heap:
        d, x, live = heapq.heappop(heap)
        if d >= HORIZON or (x, live) in done:
            continue
        done.add((x, live))
        if touches(x, live) and d < best.get(x, HORIZON):
            best[x] = d
        if x == p:
            continue
        if code.unconditional(x):
            live = live - code.writes[x]
        if live:
            for s in code.succ[x]:
                heapq.heappush(heap, (d + gaps[x], s, live))
    return best


def test_no_fixed_latency_pair_falls_below_the_table_or_ptxas(decoded, stall_plans):
    """Independent of the pass and of the checker: for every fixed-latency producer with a table
    latency L, the shortest distance to each reader after the pass is at least min(L, ptxas's
    shortest distance); a predicate read by a branch/EXIT keeps ptxas's distance in full, and so
    does a later overwrite by an instruction of shorter latency (it could land first)."""
    fixed = fixed_latencies(TABLE)
    pairs = held = overwrites = 0
    for name, plan in stall_plans.items():
        for kname, kernel in decoded[name].items():
            ins = kernel.instructions
            if not any(c.kernel == kname for c in plan.changes):
                continue
            words = ElfCubin(plan.cubin).words(kname)[:len(ins)]
            code = CodeFacts(ins, kernel.blocks, words)
            for p, i in enumerate(ins):
                if not i.reachable or i.write_sb is not None or i.opcode not in fixed or not code.writes[p]:
                    continue
                latency = fixed[i.opcode][0]
                def reads(x, live):
                    return bool(code.reads[x] & live)

                def overtakes(x, live):
                    later = fixed.get(ins[x].opcode)
                    return bool(code.writes[x] & live) and not code.reads[x] & live \
                        and not (later and later[0] >= latency)

                before = _min_distances(code, code.gap_old, p, reads)
                after = _min_distances(code, code.gap_new, p, reads)
                waw_before = _min_distances(code, code.gap_old, p, overtakes)
                for x, d in _min_distances(code, code.gap_new, p, overtakes).items():
                    overwrites += 1
                    assert d >= waw_before.get(x, HORIZON), \
                        f"{name} {ins[x].text}: overwrites {i.text} {d} cycles after it, ptxas had {waw_before.get(x)}"
                assert set(before) <= set(after)        # distances only shrink
                for x, d in after.items():
                    pairs += 1
                    was = before.get(x, HORIZON)        # beyond the horizon before the pass
                    assert d >= min(latency, was), \
                        (f"{name} {ins[x].address:#06x} {ins[x].text}: {d} cycles after {i.address:#06x} {i.text} "
                         f"(latency {latency}, ptxas {was})")
                    predicates = [r for r in code.reads[x] & code.writes[p] if r[0] == "P"]
                    if ins[x].opcode in BRANCHES | TERMINATORS and predicates:
                        held += 1
                        assert d >= was, f"{name} {ins[x].text}: predicate distance {was} -> {d}"
    assert pairs > 100 and held > 0 and overwrites > 0, (pairs, held, overwrites)


def test_sgemm_main_loop_stalls_are_lowered(decoded, stall_plans):
    """ptxas 13 gives sgemm's FFMA stream stall 1 almost everywhere; the few 2s it leaves where no
    scoreboard wait follows are lowered, and the loop's modelled issue cycles drop by as much."""
    kernel = decoded["sgemm"]["sgemm"]
    ins = kernel.instructions
    main = max(kernel.loops, key=lambda lp: sum(ins[k].opcode == "FFMA" for k in lp.instruction_indices(kernel.blocks)))
    body = set(main.instruction_indices(kernel.blocks))
    plan = stall_plans["sgemm"]
    in_loop = [c for c in plan.changes if c.index in body]
    assert in_loop, "no stall lowered in sgemm's main loop"
    removed = sum(c.before["stall"] - c.after["stall"] for c in in_loop)
    summary = plan.stall_pass[0]
    loop = next(lp for lp in summary.loops if lp["loop"] == main.index)
    before, after = loop["issue_cycles"]
    assert before - after == removed, (before, after, removed)    # stalls only: no bank model change
    # what was left: most of the loop already sits at stall 1
    ffma = [ins[k] for k in body if ins[k].opcode == "FFMA"]
    assert sum(i.stall <= 1 for i in ffma) > 0.9 * len(ffma)


# ---- yield placement ---------------------------------------------------------------------------

def _hot_by_loop(kernel) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for k, i in enumerate(kernel.instructions):
        if i.reachable and i.loops and i.opcode in HOT_OPCODES and i.predicate != "!PT":
            out.setdefault(i.loops[-1], []).append(k)
    return out


@pytest.mark.parametrize("every", sample_every(2, [1, 4]))
def test_yield_every_sets_the_pattern_and_clears_reuse_under_yields(cubins, decoded, every):
    plan = plan_patch(cubins["sgemm"], None, "sgemm", yield_every=every)
    assert not plan.hazards, [h.line() for h in plan.hazards[:3]]
    kernel = decoded["sgemm"]["sgemm"]
    ins = kernel.instructions
    after = _fields(plan.cubin, "sgemm", len(ins))
    hot = _hot_by_loop(kernel)
    assert hot and max(len(v) for v in hot.values()) >= 64
    hot_set = {k for v in hot.values() for k in v}
    for ks in hot.values():
        for j, k in enumerate(ks):
            on = after[k]["yield"] == 0
            if (j + 1) % every == 0:
                assert on and after[k]["reuse"] == 0, ins[k].text
            elif ins[k].stall < YIELD_REQUIRED_FROM_STALL:
                assert not on, ins[k].text
                assert after[k]["reuse"] == ins[k].reuse        # reuse kept where no yield goes on
    for k, i in enumerate(ins):
        if k not in hot_set:
            assert ElfCubin(plan.cubin).word("sgemm", k) == i.word, i.text
    for change in plan.changes:
        assert set(change.fields()) <= {"yield", "reuse"}
    s = plan.stall_pass[0]
    assert s.yield_every == every and s.stalls_lowered == 0
    assert s.yields_set == sum(1 for k in hot_set if ins[k].yield_bit == 1 and after[k]["yield"] == 0)
    assert s.yields_cleared == sum(1 for k in hot_set if ins[k].yield_bit == 0 and after[k]["yield"] == 1)
    assert s.reuse_flags_cleared == sum(bin(ins[k].reuse & ~after[k]["reuse"]).count("1") for k in hot_set)
    assert s.yields_set > 0 and s.reuse_flags_cleared > 0
    for lp in kernel.loops:
        assert any(after[k]["yield"] == 0 for k in lp.instruction_indices(kernel.blocks))


def test_yields_placed_after_the_reuse_pass_clear_the_flags_it_set(cubins):
    """The runtime may ask for ["reuse", "stall"]: the reuse pass runs first, and a yield placed
    after it takes off any flag it set on that instruction (the checker refuses reuse under a yield)."""
    for name in ("mma_gemm", "sgemm"):
        plan = plan_patch(cubins[name], None, name, reuse_pass=True, stall_pass=True, yield_every=1)
        assert not plan.hazards, (name, [h.line() for h in plan.hazards[:3]])
        for kname in ElfCubin(plan.cubin).kernels:
            for f in _fields(plan.cubin, kname, len(ElfCubin(plan.cubin).words(kname))):
                assert not (f["yield"] == 0 and f["reuse"]), name


def test_a_loop_with_fewer_hot_instructions_than_n_keeps_a_yield(cubins, decoded):
    """With N larger than any loop's FFMA count the pattern would take every FFMA's yield off; a
    loop that had a yield keeps one (the checker's rule 4), on its last hot instruction."""
    for name in ("sgemm_naive", "sgemm"):
        plan = plan_patch(cubins[name], None, name, yield_every=100_000)
        assert not plan.hazards, (name, [h.line() for h in plan.hazards[:3]])
        for kname, kernel in decoded[name].items():
            after = _fields(plan.cubin, kname, len(kernel.instructions))
            for lp in kernel.loops:
                body = lp.instruction_indices(kernel.blocks)
                if any(kernel.instructions[k].yield_ for k in body):
                    assert any(after[k]["yield"] == 0 for k in body), (name, lp.index)


def test_yield_every_below_zero_is_an_error(cubins):
    with pytest.raises(AsmError, match="at least 1"):
        plan_patch(cubins["sgemm_naive"], None, "sgemm_naive", yield_every=-2)


# ---- the command line ----------------------------------------------------------------------------

def test_stall_pass_from_the_command_line(cubins, tmp_path, run_cli):
    cubin = tmp_path / "sgemm_naive.cubin"
    cubin.write_bytes(cubins["sgemm_naive"])
    out = tmp_path / "stall.cubin"
    code, stdout, err = run_cli("patch", cubin, "--stall-pass", "-o", out)
    assert code == 0, err
    assert "stall/yield pass, sgemm_naive:" in stdout and "not measured on a GPU" in stdout and out.is_file()
    assert not plan_patch(out.read_bytes(), None, "again", stall_pass=True).changes    # a fixed point

    code, stdout, err = run_cli("patch", cubin, "--stall-pass", "--yield-every", "4", "-o", out, "--json")
    assert code == 0, err
    doc = json.loads(stdout)
    summary = doc["stall_pass"][0]
    assert summary["measured"] is False and summary["yield_every"] == 4 and summary["stall_tightening"]
    assert all(len(lp["issue_cycles"]) == 2 for lp in summary["loops"]) and summary["loops"]

    code, stdout, err = run_cli("patch", cubin, "--yield-every", "2", "-o", out)
    assert code == 0 and "yield every 2" in stdout, err


@pytest.mark.parametrize("value", ["0", "-3"])
def test_yield_every_below_one_is_refused_on_the_command_line(cubins, tmp_path, run_cli, value):
    cubin = tmp_path / "sgemm_naive.cubin"
    cubin.write_bytes(cubins["sgemm_naive"])
    out = tmp_path / "o.cubin"
    code, _, err = run_cli("patch", cubin, "--stall-pass", "--yield-every", value, "-o", out)
    assert code == 1 and "--yield-every must be at least 1" in err and "Traceback" not in err
    assert not out.exists()
