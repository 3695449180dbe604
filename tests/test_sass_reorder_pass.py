"""Issue 35, point 3, the reorder pass on the CPU: the pass's output is accepted and read back by
nvdisasm on every shipped kernel; the reorder check refuses hand-made bad permutations (a consumer
above its producer, a consumer above the wait that covered it, an anchor moved, a stall below a
latency); the offsets .nv.info names are found in real cubins and never moved; the writer moves
words only within the ranges it is given.

Every shipped kernel is built and assembled by ptxas once per module, and the instructions each
test moves are found in that code (never hard-coded addresses), so a new ptxas still exercises
the same cases; a test fails if it finds no case."""
from __future__ import annotations

import json
import struct
from collections import Counter

import pytest

from asmgemm.errors import AsmError
from asmgemm.isa import control_bits as cb
from asmgemm.pipeline import shipped_kernels
from asmgemm.sass.block_deps import build_deps
from asmgemm.sass.code_references import CodeReferences, code_references, parse_nv_info
from asmgemm.sass.elf import ElfCubin
from asmgemm.sass.inspect import inspect_cubin
from asmgemm.sass.patch import load_kernels, plan_patch
from asmgemm.sass.reorder_check import check_reordered
from asmgemm.sass.reorder_pass import ReorderLimit, changed_span, limited_order, plan_reorder, prepare_reorder
from asmgemm.scheduler.latencies_sm90 import TABLE
from asmgemm.toolchain import find_tool

pytestmark = [
    pytest.mark.toolchain,
    pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                       reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')"),
]


@pytest.fixture(scope="module")
def cubins(shipped_cubins) -> dict[str, bytes]:
    return shipped_cubins


@pytest.fixture(scope="module")
def decoded(cubins):
    return {name: load_kernels(data, name) for name, data in cubins.items()}


@pytest.fixture(scope="module")
def reordered(cubins):
    """name -> the plan of the reorder pass alone (the slow part: about 100 s on one core)."""
    return {name: plan_patch(data, None, name, reorder_pass=True) for name, data in cubins.items()}


@pytest.fixture(scope="module")
def deps_of(decoded):
    """name -> the dependence graph of that shipped kernel (build_deps on ptxas's code), built on
    first use and kept: one costs ~1.5 s (sgemm) to ~3.5 s (hgemm) and a dozen tests below read the
    same one, none changes it (the determinism test builds its own fresh graph on purpose)."""
    kept = {}

    def get(name: str):
        if name not in kept:
            elf, kernels, _target = decoded[name]
            kept[name] = build_deps(kernels[name], code_references(elf, name), TABLE)
        return kept[name]
    return get


def _sgemm(decoded, deps_of):
    elf, kernels, _target = decoded["sgemm"]
    return elf, kernels["sgemm"], deps_of("sgemm")


def _moved(n: int, src: int, dst: int) -> list[int]:
    """The order that takes instruction src to position dst, the others keeping their order."""
    order = list(range(n))
    order.insert(dst, order.pop(src))
    return order


def _check(kernel, deps, order):
    return check_reordered(kernel, deps, order, [kernel.instructions[j].word for j in order], TABLE)


def _same_stretch(deps, kernel, a: int, b: int) -> bool:
    """a < b in one block with no anchor from a to b (so only the check can refuse the move)."""
    blk = next(bl for bl in kernel.blocks if bl.start <= a < bl.end)
    return b < blk.end and not any(k in deps.anchors for k in range(a, b + 1))


# ---- the pass -------------------------------------------------------------------------------

@pytest.mark.slow     # every shipped kernel reordered (~30 s): a sweep of the experimental pass
def test_reorder_pass_output_is_accepted_on_every_shipped_kernel(reordered, cubins):
    assert set(reordered) == set(shipped_kernels()) and len(reordered) >= 6
    for name, plan in reordered.items():
        assert not plan.hazards, (name, [h.line() for h in plan.hazards[:3]])
        assert [r.kernel for r in plan.reorder_pass] == [name]
        summary = plan.reorder_pass[0].to_json()
        assert summary["measured"] is False
        # a block is kept only where the modelled issue cycles do not grow, so no loop grows
        assert all(lp["issue_cycles"][1] <= lp["issue_cycles"][0] for lp in summary["loops"]), name
        assert len(plan.cubin) == len(cubins[name])
    # the case the pass exists for: sgemm's blocks are really reordered
    assert reordered["sgemm"].reorder_pass[0].moved > 0


@pytest.mark.slow     # every shipped kernel reordered (~30 s): a sweep of the experimental pass
def test_nvdisasm_reads_each_block_as_the_same_instructions(reordered, decoded):
    moved_somewhere = False
    for name, plan in reordered.items():
        _elf, kernels, _target = decoded[name]
        after = inspect_cubin(plan.cubin, source=name, line_info=False).kernels
        for kname, kernel in kernels.items():
            new = after[kname].instructions
            assert len(new) == len(kernel.instructions)
            for b in kernel.blocks:
                def texts(instrs):
                    return Counter(i.text.replace(".reuse", "") for i in instrs[b.start:b.end])
                assert texts(new) == texts(kernel.instructions), (name, b.index)
                moved_somewhere |= [i.text for i in new[b.start:b.end]] != \
                    [i.text for i in kernel.instructions[b.start:b.end]]
            # every block still ends with the instruction it ended with (branch targets unchanged)
            assert all(new[b.end - 1].text.replace(".reuse", "") ==
                       kernel.instructions[b.end - 1].text.replace(".reuse", "") for b in kernel.blocks)
    assert moved_somewhere


@pytest.mark.slow     # every shipped kernel reordered (~30 s): a sweep of the experimental pass
def test_offsets_named_by_nv_info_are_found_and_never_moved(decoded, reordered):
    exits = 0
    for name, (elf, kernels, _target) in decoded.items():
        after = inspect_cubin(reordered[name].cubin, source=name, line_info=False).kernels
        for kname, kernel in kernels.items():
            refs = code_references(elf, kname)
            assert not refs.unknown, (name, refs.unknown)
            named_exit = {k for k, why in refs.anchored.items() if "EIATTR_EXIT_INSTR_OFFSETS" in why}
            reachable_exits = {k for k, i in enumerate(kernel.instructions) if i.opcode == "EXIT" and i.reachable}
            # ptxas names exactly its reachable EXITs (the unreachable tail is padding)
            assert named_exit == reachable_exits, name
            exits += len(named_exit)
            for k, why in refs.anchored.items():
                if "EIATTR_MBARRIER_INSTR_OFFSETS" in why:
                    assert kernel.instructions[k].opcode == "SYNCS", (name, hex(16 * k))
                assert after[kname].instructions[k].text.replace(".reuse", "") == \
                    kernel.instructions[k].text.replace(".reuse", ""), (name, hex(16 * k), why)
    assert exits >= 6
    # hgemm's mbarrier records are found (16-byte records, offset first)
    elf, kernels, _ = decoded["hgemm"]
    assert any("EIATTR_MBARRIER_INSTR_OFFSETS" in why for why in code_references(elf, "hgemm").anchored.values())


def test_barriers_warpgroup_instructions_and_clock_reads_are_anchors(decoded, deps_of):
    """Checked on ptxas's real code, so a barrier opcode the list does not know (hgemm's cluster
    barriers UCGABAR_ARV/UCGABAR_WAIT were one) shows up here."""
    seen = set()
    for name, (elf, kernels, _target) in decoded.items():
        kernel = kernels[name]
        deps = deps_of(name)
        for k, i in enumerate(kernel.instructions):
            if not i.reachable:
                continue
            if "BAR" in i.opcode or i.opcode in ("HGMMA", "WARPGROUP", "WARPSYNC", "BSSY", "BSYNC", "EXIT",
                                                 "BRA", "ELECT", "USETMAXREG", "FENCE") \
                    or "SR_CLOCK" in i.text:
                assert k in deps.anchors, (name, hex(i.address), i.text)
                seen.add(i.opcode)
    assert {"BAR", "UCGABAR_ARV", "UCGABAR_WAIT", "HGMMA", "WARPGROUP", "DEPBAR"} <= seen


def test_the_schedule_is_deterministic_and_passes_a_fresh_check(decoded, deps_of):
    elf, kernel, _deps = _sgemm(decoded, deps_of)
    runs = [plan_reorder(kernel, elf.words("sgemm"), code_references(elf, "sgemm"), TABLE, "sm_90")
            for _ in range(2)]
    (origin, words, summary, _report), again = runs[0], runs[1]
    assert (origin, words) == again[:2] and summary.moved == again[2].moved > 0
    fresh = build_deps(kernel, code_references(elf, "sgemm"), TABLE)
    assert not check_reordered(kernel, fresh, origin, words, TABLE).hazards


# ---- partial application, for bisecting on the GPU (tools/reorder_bisect.py) ----------------

def _limited_cases(kernel, prepared):
    """(block, moves, limited order) for each candidate block at a few prefix lengths."""
    for bi in prepared.candidates(kernel):
        b = kernel.blocks[bi]
        order = prepared.schedules[bi][0]
        _first, span = changed_span(b, order)
        for moves in sorted({1, max(1, span // 3), max(1, span // 2), span}):
            yield b, moves, limited_order(b, order, moves)


def test_a_limited_order_keeps_every_edge_and_anchor_of_the_block(decoded, deps_of):
    """ReorderLimit.moves: the first M positions of the new order, the rest in ptxas's order, is a
    legal order under the graph (a prefix of a topological order holds every predecessor of what it
    holds), anchors in place, on every candidate block of ptxas's sgemm."""
    elf, kernel, _deps = _sgemm(decoded, deps_of)
    prepared = prepare_reorder(kernel, code_references(elf, "sgemm"), TABLE, "sm_90")
    cases = 0
    for b, moves, order in _limited_cases(kernel, prepared):
        cases += 1
        assert sorted(order) == list(range(b.start, b.end)), (b.index, moves)
        pos = {k: b.start + i for i, k in enumerate(order)}
        for e in prepared.deps.deps[b.index]:
            assert pos[e.src] < pos[e.dst], (b.index, moves, e)
        assert all(pos[k] == k for k in prepared.deps.anchors if b.start <= k < b.end), (b.index, moves)
        first, span = changed_span(b, order)
        assert first == changed_span(b, prepared.schedules[b.index][0])[0]
        assert 0 < span <= changed_span(b, prepared.schedules[b.index][0])[1]
    assert cases >= 4


def test_plan_patch_applies_only_the_limited_blocks_and_moves(cubins, decoded, deps_of):
    elf, kernel, _deps = _sgemm(decoded, deps_of)
    prepared = prepare_reorder(kernel, code_references(elf, "sgemm"), TABLE, "sm_90")
    candidates = prepared.candidates(kernel)
    assert candidates
    b = kernel.blocks[candidates[0]]
    first, span = changed_span(b, prepared.schedules[b.index][0])
    moves = max(1, span // 2)
    plan = plan_patch(cubins["sgemm"], None, "sgemm", reorder_pass=True, reorder_blocks=1, reorder_moves=moves)
    assert not plan.hazards, [h.line() for h in plan.hazards[:3]]
    summary = plan.reorder_pass[0].to_json()
    assert summary["limit"] == {"blocks": 1, "moves": moves}
    assert [c["block"] for c in summary["candidates"]] == candidates
    # the instructions moved lie in the first candidate block only, in the limited order
    moved = {c.address // 16: int(c.to_json()["moved_from"], 16) // 16 for c in plan.changes
             if c.moved_from is not None}
    assert moved and all(b.start <= k < b.end for k in moved)
    expected = limited_order(b, prepared.schedules[b.index][0], moves)
    assert all(expected[k - b.start] == j for k, j in moved.items())
    assert summary["blocks_reordered"] == 1


def test_reorder_limits_are_refused_without_the_pass_or_below_one(cubins):
    with pytest.raises(AsmError, match="need reorder_pass"):
        plan_patch(cubins["sgemm_naive"], None, "sgemm_naive", reorder_blocks=1)
    with pytest.raises(ValueError, match="whole number >= 1"):
        ReorderLimit(blocks=-1)
    with pytest.raises(ValueError, match="whole number >= 1"):
        ReorderLimit(moves=True)


# ---- the check refuses bad permutations -----------------------------------------------------

def test_check_refuses_a_consumer_moved_above_its_producer(decoded, deps_of):
    _elf, kernel, deps = _sgemm(decoded, deps_of)
    case = next((e for edges in deps.deps.values() for e in edges
                 if e.kind == "raw" and e.stall and _same_stretch(deps, kernel, e.src, e.dst)), None)
    assert case is not None, "no fixed-latency producer/consumer pair between two anchors in sgemm"
    report = _check(kernel, deps, _moved(len(kernel.instructions), case.dst, case.src))
    kinds = {h.kind for h in report.hazards}
    assert "order" in kinds, [h.line() for h in report.hazards]
    hit = next(h for h in report.hazards if h.kind == "order")
    assert hit.address == 16 * case.src and hit.numbers["dependency"] == "raw"


def test_check_refuses_a_consumer_moved_above_the_wait_that_covered_it(decoded, deps_of):
    _elf, kernel, deps = _sgemm(decoded, deps_of)
    ins = kernel.instructions
    case = None
    for edges in deps.deps.values():
        for e in edges:
            if e.kind == "cover" and _same_stretch(deps, kernel, e.src, e.dst):
                case = e
                break
        if case:
            break
    assert case is not None, "no variable-latency consumer covered by an earlier wait in sgemm"
    assert not ins[case.dst].wait_mask & ins[case.src].wait_mask
    report = _check(kernel, deps, _moved(len(ins), case.dst, case.src))
    # proven on the paths of the new code, not only as a broken edge
    sb = [h for h in report.hazards if h.kind == "scoreboard"]
    assert sb, [h.line() for h in report.hazards]
    assert any(h.address == 16 * case.src for h in sb)
    assert any(h.kind == "order" and h.numbers["dependency"] == "cover" for h in report.hazards)


@pytest.mark.parametrize("kind", ["queued", "queued-read"])
def test_check_refuses_a_dependant_moved_above_a_later_instructions_wait(decoded, kind, deps_of):
    """ptxas leaves the scoreboard off many instructions (sgemm's LDS.128 results, the sources of
    its stores) and covers their dependants with a wait on a later same-pipe instruction's
    scoreboard (the pipe works in order): a consumer ("queued") or an overwriter of the sources
    ("queued-read") moved above that wait is refused."""
    case = None
    for name, (elf, kernels, _target) in sorted(decoded.items(), key=lambda kv: kv[0] != "sgemm"):
        kernel = kernels[name]
        deps = deps_of(name)
        if deps.unmovable:
            continue
        ins = kernel.instructions
        for (p, k), (_sb, covered) in sorted(deps.dependants.items()):
            if k != kind:
                continue
            for x in sorted(covered):
                waits = [y for y in range(p + 1, x) if ins[y].wait_mask]
                if p < x and waits and not ins[x].wait_mask and _same_stretch(deps, kernel, waits[0], x):
                    case = (kernel, deps, p, waits[0], x)
                    break
            if case:
                break
        if case:
            break
    assert case is not None, f"no {kind} dependant covered by a later wait in the shipped kernels"
    kernel, deps, p, w, x = case
    sb = kernel.instructions[p].write_sb if kind == "queued" else kernel.instructions[p].read_sb
    assert sb is None
    report = _check(kernel, deps, _moved(len(kernel.instructions), x, w))
    found = [h for h in report.hazards if h.kind == "scoreboard" and h.numbers.get("kind") == kind]
    assert found and found[0].address == 16 * w, [h.line() for h in report.hazards]


def test_check_holds_a_guard_predicate_read_to_ptxas_spacing(decoded, deps_of):
    """The table's ISETP latency (4) was measured with the predicate read as an operand; ptxas never
    puts an instruction guarded by it closer than 13 cycles. A guarded consumer moved up next to
    its ISETP is refused even though 4 cycles would pass the table."""
    from asmgemm.sass.block_deps import guard_register
    case = None
    for name, (elf, kernels, _target) in sorted(decoded.items()):
        kernel = kernels[name]
        deps = deps_of(name)
        if deps.unmovable:
            continue
        ins, gaps = kernel.instructions, deps.code.gap_old
        case = next((e for edges in deps.deps.values() for e in edges
                     if e.kind == "raw" and ins[e.src].opcode == "ISETP" and e.what.endswith("(guard)")
                     and guard_register(ins[e.dst]) is not None and e.dst > e.src + 1
                     and 4 <= gaps[e.src] < sum(gaps[e.src:e.dst]) and _same_stretch(deps, kernel, e.src, e.dst)),
                    None)
        if case:
            break
    assert case is not None, "no ISETP with a guarded consumer a few instructions later in any shipped kernel"
    report = _check(kernel, deps, _moved(len(ins), case.dst, case.src + 1))
    guard = [h for h in report.hazards if h.kind == "latency" and "guard predicate" in h.message]
    assert guard and guard[0].address == 16 * (case.src + 1), [h.line() for h in report.hazards]
    assert guard[0].numbers["distance"] >= 4        # the table's latency alone would have passed it


def test_check_refuses_moving_an_exit_named_by_nv_info(decoded, deps_of):
    _elf, kernel, deps = _sgemm(decoded, deps_of)
    exits = [k for k, why in deps.anchors.items() if "EIATTR_EXIT_INSTR_OFFSETS" in why]
    k = next((k for k in exits if k - 1 not in deps.anchors), None)
    assert k is not None, "no EXIT with a movable instruction before it in sgemm"
    report = _check(kernel, deps, _moved(len(kernel.instructions), k, k - 1))
    hit = [h for h in report.hazards if h.kind == "anchor" and h.address == 16 * k]
    assert hit and "EIATTR_EXIT_INSTR_OFFSETS" in hit[0].message


def test_check_refuses_moving_an_instruction_a_cubin_reference_names(decoded, deps_of):
    """Any offset .nv.info or a relocation names is an anchor, whatever its opcode: here an FFMA
    is named by a reference built for the test, and moving it is refused."""
    elf, kernel, _ = _sgemm(decoded, deps_of)
    refs = code_references(elf, "sgemm")
    plain = deps_of("sgemm")
    k = next((k for k, i in enumerate(kernel.instructions)
              if i.opcode == "FFMA" and k not in plain.anchors and k - 1 not in plain.anchors
              and _same_stretch(plain, kernel, k - 1, k)), None)
    assert k is not None
    named = CodeReferences("sgemm", {**refs.anchored, k: ["relocation in .rela.text.sgemm"]})
    deps = build_deps(kernel, named, TABLE)
    assert "relocation" in deps.anchors[k]
    report = _check(kernel, deps, _moved(len(kernel.instructions), k, k - 1))
    assert any(h.kind == "anchor" and h.address == 16 * k for h in report.hazards)
    # without the reference the same move is not an anchor hazard
    unnamed = _check(kernel, plain, _moved(len(kernel.instructions), k, k - 1))
    assert not any(h.kind == "anchor" for h in unnamed.hazards)


def test_check_refuses_stalls_below_a_latency_in_a_reordered_block(decoded, deps_of):
    elf, kernel, deps = _sgemm(decoded, deps_of)
    origin, words, summary, report = plan_reorder(kernel, elf.words("sgemm"), code_references(elf, "sgemm"),
                                                  TABLE, "sm_90")
    assert not report.hazards and summary.moved
    moved = [i for i, j in enumerate(origin) if i != j]
    squeezed = list(words)
    for i in moved:
        squeezed[i] = cb.STALL.insert(squeezed[i], 1)
    bad = check_reordered(kernel, deps, origin, squeezed, TABLE)
    lat = [h for h in bad.hazards if h.kind == "latency"]
    assert lat, "stall 1 everywhere in the reordered blocks must bring some consumer below its latency"
    assert all(h.numbers["distance"] < h.numbers["input_distance"] for h in lat if "distance" in h.numbers)


def test_a_kernel_with_an_unknown_nv_info_attribute_does_not_move(cubins):
    data = bytearray(cubins["sgemm"])
    elf = ElfCubin(bytes(data))
    sh = elf.section_named(".nv.info.sgemm")
    attrs = parse_nv_info(bytes(data[sh.offset: sh.offset + sh.size]), sh.name)
    assert attrs[0].ident == 0x37           # EIATTR_CUDA_API_VERSION comes first in ptxas 13.0's output
    data[sh.offset + 1] = 0x7E              # an id no table here knows
    elf, kernels, target = load_kernels(bytes(data), "sgemm")
    refs = code_references(elf, "sgemm")
    assert refs.unknown and "0x7e" in refs.unknown[0]
    origin, _words, summary, report = plan_reorder(kernels["sgemm"], elf.words("sgemm"), refs, TABLE, target)
    assert summary.unmovable and summary.moved == 0 and origin == list(range(len(origin)))
    deps = build_deps(kernels["sgemm"], refs, TABLE)
    k = next(k for k, i in enumerate(kernels["sgemm"].instructions) if i.opcode == "FFMA")
    assert any(h.kind == "anchor" and "may move" in h.message
               for h in _check(kernels["sgemm"], deps, _moved(len(origin), k, k - 1)).hazards)


def test_nv_info_records_that_run_past_the_end_are_refused():
    good = struct.pack("<BBH", 4, 0x1C, 8) + struct.pack("<II", 0x80, 0x100)
    assert [a.name for a in parse_nv_info(good, "x")] == ["EIATTR_EXIT_INSTR_OFFSETS"]
    with pytest.raises(ValueError, match="past the end"):
        parse_nv_info(good[:-4], "x")
    with pytest.raises(ValueError, match="unknown record format"):
        parse_nv_info(struct.pack("<BBH", 9, 0x1C, 0), "x")


# ---- the writer -------------------------------------------------------------------------------

def test_permuting_words_within_blocks_keeps_every_other_byte(decoded, cubins, deps_of):
    elf0, kernel, deps = _sgemm(decoded, deps_of)
    data = cubins["sgemm"]
    elf = ElfCubin(data)
    count = elf.kernel("sgemm").count
    ranges = [(b.start, b.end) for b in kernel.blocks]
    elf.permute("sgemm", list(range(count)), ranges)
    assert elf.to_bytes() == data                    # the identity writes the same bytes
    b = next(b for b in kernel.blocks if b.end - b.start >= 3)
    swap = list(range(count))
    swap[b.start], swap[b.start + 1] = b.start + 1, b.start
    elf.permute("sgemm", swap, ranges)
    assert elf.origin("sgemm")[b.start] == b.start + 1
    assert elf.word("sgemm", b.start) == elf0.word("sgemm", b.start + 1)
    text = elf.kernel("sgemm").section
    out = elf.to_bytes()
    lo, hi = text.offset + 16 * b.start, text.offset + 16 * (b.start + 2)
    assert out[:lo] == data[:lo] and out[hi:] == data[hi:]
    # a control edit is judged against the word that moved there, not the one that was there
    moved = elf.word("sgemm", b.start)
    elf.set_control("sgemm", b.start, stall=(cb.decode_control(moved)["stall"] + 1) % 16)
    with pytest.raises(ValueError, match="outside the control fields"):
        elf.set_word("sgemm", b.start, elf0.word("sgemm", b.start))
    elf.permute("sgemm", swap, ranges)               # and back: the edited word is at b.start + 1 again
    elf.set_control("sgemm", b.start + 1, stall=cb.decode_control(elf0.word("sgemm", b.start + 1))["stall"])
    assert elf.to_bytes() == data and elf.origin("sgemm") == list(range(count))


def test_the_writer_refuses_moves_out_of_a_block(cubins, decoded, deps_of):
    _elf, kernel, _deps = _sgemm(decoded, deps_of)
    elf = ElfCubin(cubins["sgemm"])
    count = elf.kernel("sgemm").count
    ranges = [(b.start, b.end) for b in kernel.blocks]
    b = kernel.blocks[1]
    across = list(range(count))
    across[b.start - 1], across[b.start] = b.start, b.start - 1
    with pytest.raises(ValueError, match="out of its basic block"):
        elf.permute("sgemm", across, ranges)
    with pytest.raises(ValueError, match="not a permutation"):
        elf.permute("sgemm", [0] * count, ranges)
    assert elf.to_bytes() == cubins["sgemm"]


# ---- the command line -------------------------------------------------------------------------

def test_patch_reorder_pass_from_the_command_line(cubins, tmp_path, run_cli):
    src = tmp_path / "sgemm_naive.cubin"
    src.write_bytes(cubins["sgemm_naive"])
    out = tmp_path / "reordered.cubin"
    code, stdout, err = run_cli("patch", src, "--reorder-pass", "-o", out)
    assert code != 0 and "experimental and unsafe" in err and not out.exists()
    code, stdout, err = run_cli("patch", src, "--reorder-pass", "--experimental-reorder", "-o", out, "--json")
    assert code == 0, err
    data = json.loads(stdout)
    assert data["accepted"] and data["output"] == str(out) and out.is_file()
    (summary,) = data["reorder_pass"]
    assert summary["kernel"] == "sgemm_naive" and summary["measured"] is False
    assert {"instructions_moved", "blocks_reordered", "loops"} <= set(summary)
    if summary["instructions_moved"]:
        assert any("moved_from" in c for c in data["changes"])
    code, stdout, err = run_cli("patch", src, "--reorder-pass", "--experimental-reorder", "-o", tmp_path / "again.cubin")
    assert code == 0, err
    assert "reorder pass, sgemm_naive:" in stdout and "not measured on a GPU" in stdout
