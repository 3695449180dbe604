"""Issue 35 on the CPU: the cubin reader/writer, control-field edits checked against nvdisasm, and
the safety checker refusing each kind of unsafe patch.

Every shipped kernel is built with the pipeline and assembled by ptxas once per module; the
instructions each test edits are found in that code (not hard-coded addresses), so a new ptxas
still exercises the same cases, and a test fails if none is found."""
from __future__ import annotations

import pytest

from asmgemm.isa import control_bits as cb
from asmgemm.pipeline import BuildOptions, assemble, build_file, shipped_kernels
from asmgemm.sass.decode import text_reuse_slots
from asmgemm.sass.elf import ElfCubin
from asmgemm.sass.hazards import CodeFacts, fixed_latencies, table_covers
from asmgemm.sass.inspect import inspect_cubin
from asmgemm.sass.patch import load_kernels, plan_patch
from asmgemm.sass.patch_rules import parse_rules
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
    """name -> (ElfCubin, {kernel: SassKernel}, target), words cross-checked with nvdisasm."""
    return {name: load_kernels(data, name) for name, data in cubins.items()}


def rule(kernel: str, address: int, **fields) -> str:
    """A rules file selecting the one instruction at `address` (any opcode)."""
    lines = [f'kernel = "{kernel}"', "[[rule]]", 'opcode = ".*"', f"addresses = [{address}, {address + 16}]"]
    for key, value in fields.items():
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, list):
            value = "[" + ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value) + "]"
        lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


# ---- the reader / writer -------------------------------------------------------------------

def test_every_shipped_kernel_is_built(cubins):
    assert set(cubins) == set(shipped_kernels()) and len(cubins) >= 6


def test_round_trip_is_byte_identical_on_every_shipped_kernel(cubins):
    for name, data in cubins.items():
        elf = ElfCubin(data, name)
        assert elf.kernels, name
        assert elf.to_bytes() == data, name
        # rewriting every word with the control fields it already has changes no byte either
        for kernel, text in elf.kernels.items():
            for i in range(text.count):
                elf.set_control(kernel, i, **{k: v for k, v in elf.control(kernel, i).items() if k != "unused"})
        assert elf.to_bytes() == data and elf.changed() == [], name


def test_sections_symbols_and_words_agree_with_nvdisasm(decoded, cubins):
    for name, (elf, kernels, _target) in decoded.items():
        assert {s.name for s in elf.sections} >= {".shstrtab", ".strtab", ".symtab", ".nv.info"}
        for kname, kernel in kernels.items():
            text = elf.kernel(kname)
            assert text.section.name == f".text.{kname}" and text.entry
            assert text.symbol.size == text.section.size
            words = elf.words(kname)
            # nvdisasm -c lists every word but the trailing padding, which is all NOPs (opcode 0x918)
            assert len(kernel.instructions) <= len(words)
            assert all(cb.OPCODE.extract(w) == 0x918 for w in words[len(kernel.instructions):]), (name, kname)
            for k, ins in enumerate(kernel.instructions):
                assert words[k] == ins.word, (name, hex(ins.address))
                at = text.section.offset + 16 * k
                assert cubins[name][at: at + 16] == ins.word.to_bytes(16, "little")


def test_an_edit_changes_only_the_control_bits_of_its_word(cubins):
    data = cubins["sgemm"]
    elf = ElfCubin(data)
    text = elf.kernel("sgemm")
    old = elf.word("sgemm", 5)
    fields = cb.decode_control(old)
    new_stall = (fields["stall"] + 3) % 16
    elf.set_control("sgemm", 5, stall=new_stall)
    out = elf.to_bytes()
    at = text.section.offset + 5 * 16
    assert out[:at] == data[:at] and out[at + 16:] == data[at + 16:]
    new = int.from_bytes(out[at: at + 16], "little")
    assert new ^ old == (fields["stall"] ^ new_stall) << cb.STALL.lo
    assert cb.decode_control(new)["stall"] == new_stall
    assert elf.changed() == [("sgemm", 5, old, new)]


def test_the_writer_refuses_bits_outside_the_control_fields(cubins):
    elf = ElfCubin(cubins["sgemm"])
    word = elf.word("sgemm", 3)
    for bit in (0, 12, 64, 104, 126):          # opcode, guard, an operand, below and above the control field
        with pytest.raises(ValueError, match="outside the control fields"):
            elf.set_word("sgemm", 3, word ^ (1 << bit))
    assert elf.to_bytes() == cubins["sgemm"]


# ---- finding cases in ptxas's code -----------------------------------------------------------

def _codes(decoded, names=None):
    for name, (elf, kernels, _t) in decoded.items():
        if names and name not in names:
            continue
        for kernel in kernels.values():
            ins = kernel.instructions
            yield name, kernel, CodeFacts(ins, kernel.blocks, [i.word for i in ins])


def _reuse_candidate(decoded, cubins):
    """(cubin, kernel, instruction, slot): an instruction whose reuse flag in `slot` is off and valid
    to set: the next instruction reads the same register in the same slot, on an opcode ptxas sets
    reuse on, with the yield hint off. ptxas sets every such flag in today's shipped kernels, so the
    case is made: one it set is cleared (always safe) by a patch of that one instruction, and the
    patched cubin is the one returned (the kernel's other flags stay as ptxas set them)."""
    for name, kernel, code in _codes(decoded):
        for k, i in enumerate(kernel.instructions[:-1]):
            if not i.reachable or i.opcode not in cb.REUSE_OPCODES or code.succ[k] != [k + 1] or i.yield_:
                continue
            for slot, regs in code.slot_regs[k].items():
                if slot < 4 and regs and all(r[0] == "R" for r in regs) and code.slot_regs[k + 1].get(slot) == regs \
                        and not regs & code.writes[k]:
                    if not i.reuse >> slot & 1:
                        return cubins[name], kernel, i, slot
                    cleared = plan_patch(cubins[name], parse_rules(rule(kernel.name, i.address, reuse=[])), name)
                    assert not cleared.hazards
                    kernels = load_kernels(cleared.cubin, name)[1]
                    again = kernels[kernel.name]
                    return cleared.cubin, again, next(x for x in again.instructions if x.address == i.address), slot
    raise AssertionError("no instruction in the shipped kernels reads a register its predecessor read in the same slot")


# ---- edits checked against nvdisasm's rendering --------------------------------------------------

def test_field_edits_show_in_nvdisasm_rendering_of_the_patched_cubin(decoded, cubins):
    data, kernel, ins, slot = _reuse_candidate(decoded, cubins)
    flagged = next(i for i in kernel.instructions if i.reuse and i.reachable)
    load = next(i for i in kernel.instructions if i.reachable and i.write_sb is not None and i.opcode in ("LDG", "LDS"))
    stall = min(load.stall + 2, 14)
    rules = (rule(kernel.name, ins.address, reuse=[cb.REUSE_SLOTS[s] for s in sorted({slot, *ins.reuse_slots})])
             + rule(kernel.name, flagged.address, reuse=[]).split("\n", 1)[1]
             + rule(kernel.name, load.address, stall=stall, wait=sorted({*load.wait_scoreboards, 5})).split("\n", 1)[1])
    plan = plan_patch(data, parse_rules(rules), kernel.name)
    assert not plan.hazards, [h.line() for h in plan.hazards]
    assert len(plan.changes) == 3
    report = inspect_cubin(plan.cubin, line_info=False)
    after = {i.address: i for i in report.kernels[kernel.name].instructions}
    before = {i.address: i for i in kernel.instructions}
    # nvdisasm's encoding of every instruction is the word written; its text changed only where
    # the reuse flags changed
    elf = ElfCubin(plan.cubin)
    for address, i in after.items():
        assert i.word == elf.word(kernel.name, address // 16)
        if address not in (ins.address, flagged.address):
            assert i.text == before[address].text, hex(address)
    assert slot in text_reuse_slots(after[ins.address].text, after[ins.address].destinations)
    assert ".reuse" in before[flagged.address].text and ".reuse" not in after[flagged.address].text
    assert after[load.address].stall == stall
    assert after[load.address].wait_scoreboards == sorted({*load.wait_scoreboards, 5})
    assert after[load.address].write_sb == load.write_sb


# ---- the checker refuses ------------------------------------------------------------------------

def test_checker_refuses_a_stall_shortened_below_a_fixed_latency(decoded, cubins):
    fixed = fixed_latencies(TABLE)
    for name, kernel, code in _codes(decoded):
        for k, p in enumerate(kernel.instructions[:-1]):
            if not p.reachable or p.write_sb is not None or p.opcode not in fixed or code.succ[k] != [k + 1]:
                continue
            latency = fixed[p.opcode][0]
            hit = code.reads[k + 1] & code.writes[k]
            if hit and p.stall >= latency > 1 and table_covers(code, k, k + 1, hit, fixed):
                plan = plan_patch(cubins[name], parse_rules(rule(kernel.name, p.address, stall=1)), name)
                hazards = [h for h in plan.hazards if h.kind == "latency" and h.numbers["producer"] == f"{p.address:#06x}"]
                assert hazards, f"accepted stall 1 on {p.text} with its consumer next"
                h = hazards[0]
                assert h.address == kernel.instructions[k + 1].address
                assert h.numbers["distance"] == 1 and h.numbers["latency"] == latency
                assert h.numbers["input_distance"] == p.stall
                assert f"latency {latency} cycles" in h.message
                return
    raise AssertionError("no adjacent fixed-latency producer/consumer pair found")


# what the dispatcher ran for hgemm at 4096^3 on the H100 (last_launch()["params"], 2026-11-27)
HGEMM_4096 = {"MMA_IN_FLIGHT": "0", "BN": "256", "STAGES": "4", "GROUP_M": "8", "CLUSTER_M": "2", "CLUSTER_N": "1",
              "VEC_C": "1", "WIDE_C": "1"}


def test_a_mov_reuse_flag_is_read_in_slot_b_so_patching_its_kernel_verifies():
    """MOV's one source sits in slot B: nvdisasm's `MOV R14, R12.reuse` is reuse bit 1. Read as
    slot A, every patch of a kernel holding such a MOV failed the read-back (hgemm with BN=256, as
    the dispatcher runs it at 4096^3, on the H100)."""
    result = build_file("hgemm", BuildOptions(target="sm_90a", defines=HGEMM_4096))
    data = assemble(result).cubin
    elf, kernels, _t = load_kernels(data, "hgemm")
    movs = [i for k in kernels.values() for i in k.instructions if i.opcode == "MOV" and ".reuse" in i.text]
    assert movs, "hgemm BN=256 has a MOV with a reuse flag (ptxas 13.0)"
    mov = movs[0]
    assert text_reuse_slots(mov.text, mov.destinations) == [1] == [s for s in range(4) if mov.reuse >> s & 1]
    kernel = next(iter(kernels))
    plan = plan_patch(data, parse_rules(rule(kernel, mov.address, stall=min(mov.stall + 1, 11))), "hgemm")
    assert plan.changes and not plan.hazards, [h.line() for h in plan.hazards]


def test_checker_holds_a_branch_predicate_to_ptxas_spacing_not_the_table(decoded, cubins):
    """ISETP's 4 cycles in the table were measured into an arithmetic consumer; ptxas keeps 13
    before the `@P EXIT`/`@P BRA` that reads the predicate (maxas: 13 to use a predicate). A patch
    cutting that stall to the table's latency is refused (found by h35s: it used to pass)."""
    fixed = fixed_latencies(TABLE)
    for name, kernel, code in _codes(decoded):
        for k, p in enumerate(kernel.instructions[:-1]):
            nxt = kernel.instructions[k + 1]
            if (not p.reachable or p.opcode != "ISETP" or code.succ[k] != [k + 1] or not nxt.predicate
                    or nxt.opcode not in ("EXIT", "BRA") or p.stall <= fixed["ISETP"][0]):
                continue
            if not code.reads[k + 1] & code.writes[k]:
                continue
            latency = fixed["ISETP"][0]
            plan = plan_patch(cubins[name], parse_rules(rule(kernel.name, p.address, stall=latency)), name)
            hazards = [h for h in plan.hazards if h.kind == "latency" and h.address == nxt.address]
            assert hazards, f"accepted stall {latency} on {p.text} before {nxt.text}"
            assert hazards[0].numbers["distance"] == latency and hazards[0].numbers["input_distance"] == p.stall
            assert "does not cover a read by" in hazards[0].message
            return
    raise AssertionError("no ISETP directly before a predicated EXIT/BRA reading it")


def test_checker_holds_a_result_crossing_pipes_to_ptxas_spacing(decoded, cubins):
    """The table's chains were measured within one pipe. On the H100 the stall pass cut
    `IMAD.MOV.U32 R0, RZ, RZ, 0x3` (fmaheavy) -> `SHF.L.U32 R0, R0, UR16` (alu) from ptxas's 5
    cycles to IMAD's 4; SHF read a stale R0 as hgemm's cluster multicast mask and the kernel hung
    (CLUSTER_N=2, 7x13x5 tn). A patch cutting such a pair to the producer's latency is refused."""
    fixed = fixed_latencies(TABLE)
    for name, kernel, code in _codes(decoded):
        for k, p in enumerate(kernel.instructions[:-1]):
            nxt = kernel.instructions[k + 1]
            if (not p.reachable or p.opcode not in fixed or nxt.opcode not in fixed or code.succ[k] != [k + 1]
                    or fixed[p.opcode][1] != "H100-UBENCH" or fixed[p.opcode][2] == fixed[nxt.opcode][2]
                    or p.stall <= fixed[p.opcode][0] or p.write_sb is not None or set(p.modifiers) & {"WIDE", "HI", "X"}):
                continue
            hit = code.reads[k + 1] & code.writes[k]
            if not hit or any(space != "R" for space, _ in hit) or nxt.predicate:
                continue
            latency = fixed[p.opcode][0]
            assert not table_covers(code, k, k + 1, hit, fixed)
            plan = plan_patch(cubins[name], parse_rules(rule(kernel.name, p.address, stall=latency)), name)
            hazards = [h for h in plan.hazards if h.kind == "latency" and h.address == nxt.address]
            assert hazards, f"accepted stall {latency} on {p.text} before {nxt.text} (another pipe)"
            assert hazards[0].numbers["distance"] == latency and hazards[0].numbers["input_distance"] == p.stall
            return
    raise AssertionError("no measured producer directly before a consumer of another pipe reading its result")


def test_checker_refuses_bringing_an_overwrite_closer_to_a_read_without_scoreboard(decoded, cubins):
    """HMMA/LDS read their sources late and often set no read scoreboard: only ptxas's spacing
    keeps a later writer off those registers. Cutting a stall on that path is refused (on the H100
    the stall pass's cut between mma_gemm's HMMAs and a SEL overwriting their fragment faulted)."""
    from asmgemm.sass.hazards import FIXED_HORIZON, _variable_opcodes, late_read_paths
    variable = _variable_opcodes(TABLE)
    for name, kernel, code in _codes(decoded):
        for p, x, path in late_read_paths(code, variable):
            d0 = sum(code.gap_old[k] for k in path)
            cut = [k for k in path[1:] if kernel.instructions[k].stall > 1]
            if d0 >= FIXED_HORIZON or not cut:
                continue
            k = cut[0]
            plan = plan_patch(cubins[name], parse_rules(rule(kernel.name, kernel.instructions[k].address, stall=1)),
                              name)
            hits = [h for h in plan.hazards if "sets no read scoreboard" in h.message]
            assert hits, f"accepted a cut between {kernel.instructions[p].text} and {kernel.instructions[x].text}"
            assert hits[0].numbers["distance"] < hits[0].numbers["input_distance"]
            return
    raise AssertionError("no overwrite of a scoreboard-less late read within the horizon")


def test_checker_refuses_a_dropped_scoreboard_wait(decoded, cubins):
    for name, kernel, code in _codes(decoded, {"sgemm"}):
        for k, x in enumerate(kernel.instructions):
            if x.reachable and x.opcode == "FFMA" and x.wait_mask:
                plan = plan_patch(cubins[name], parse_rules(rule(kernel.name, x.address, wait=[])), name)
                hazards = [h for h in plan.hazards if h.kind == "scoreboard"]
                assert hazards, f"accepted dropping the waits of {x.text}"
                assert hazards[0].numbers["input_scoreboard"] in x.wait_scoreboards
                assert "no wait on scoreboard" in hazards[0].message
                return
    raise AssertionError("no FFMA waiting on a scoreboard in sgemm")


def test_checker_refuses_a_producer_that_stops_setting_its_scoreboard(decoded, cubins):
    _elf, kernels, _t = decoded["sgemm"]
    load = next(i for i in kernels["sgemm"].instructions if i.reachable and i.opcode == "LDS" and i.write_sb is not None)
    plan = plan_patch(cubins["sgemm"], parse_rules(rule("sgemm", load.address, write_barrier="\"none\"")), "sgemm")
    hazards = [h for h in plan.hazards if h.kind == "scoreboard"]
    assert hazards and "no longer sets a write scoreboard" in hazards[0].message
    assert hazards[0].numbers["producer"] == f"{load.address:#06x}"


def test_checker_refuses_reuse_on_a_mismatched_slot(decoded, cubins):
    for name, kernel, code in _codes(decoded, {"sgemm"}):
        for k, i in enumerate(kernel.instructions[:-1]):
            nxt = code.slot_regs[k + 1].get(1)
            if i.reachable and i.opcode == "FFMA" and not i.reuse & 2 and code.slot_regs[k].get(1) \
                    and nxt and nxt != code.slot_regs[k][1]:
                plan = plan_patch(cubins[name], parse_rules(rule(kernel.name, i.address, reuse=["B"])), name)
                hazards = [h for h in plan.hazards if h.kind == "reuse"]
                assert hazards, f"accepted reuse of slot B on {i.text}"
                assert hazards[0].address == i.address and "slot B" in hazards[0].message
                return
    raise AssertionError("no FFMA pair reading different registers in slot B")


def test_checker_refuses_reuse_where_the_instruction_overwrites_the_register(decoded, cubins):
    for name, kernel, code in _codes(decoded):
        for k, i in enumerate(kernel.instructions[:-1]):
            if not i.reachable or i.opcode not in cb.REUSE_OPCODES or code.succ[k] != [k + 1]:
                continue
            for slot, regs in code.slot_regs[k].items():
                if slot < 4 and regs and regs & code.writes[k] and not i.reuse >> slot & 1:
                    plan = plan_patch(cubins[name], parse_rules(rule(kernel.name, i.address,
                                                                      reuse=[cb.REUSE_SLOTS[slot]])), name)
                    assert any(h.kind == "reuse" and "overwrites" in h.message for h in plan.hazards), i.text
                    return
    raise AssertionError("no instruction reading and writing the same register")


def test_checker_refuses_reuse_under_a_yield_hint(decoded, cubins):
    for name, kernel, code in _codes(decoded):
        for k, i in enumerate(kernel.instructions[:-1]):
            if i.reachable and i.yield_ and i.opcode in cb.REUSE_OPCODES and code.slot_regs[k].get(0):
                plan = plan_patch(cubins[name], parse_rules(rule(kernel.name, i.address, reuse=["A"])), name)
                assert any(h.kind == "reuse" and "yield hint is on" in h.message for h in plan.hazards), i.text
                return
    raise AssertionError("no reuse-capable instruction with the yield hint on")


def test_checker_refuses_reuse_on_memory_instructions(decoded, cubins):
    _elf, kernels, _t = decoded["sgemm"]
    store = next(i for i in kernels["sgemm"].instructions if i.reachable and i.opcode == "STS")
    plan = plan_patch(cubins["sgemm"], parse_rules(rule("sgemm", store.address, reuse=["A"])), "sgemm")
    assert any(h.kind == "reuse" and "never sets reuse on STS" in h.message for h in plan.hazards)


def test_checker_refuses_taking_the_last_yield_out_of_a_loop(decoded, cubins):
    _elf, kernels, _t = decoded["sgemm"]
    kernel = kernels["sgemm"]
    loop = kernel.loops[0]
    assert any(kernel.instructions[k].yield_ for k in loop.instruction_indices(kernel.blocks))
    rules = 'kernel = "sgemm"\n[[rule]]\nopcode = ".*"\nloop = 0\nyield = false\n'
    plan = plan_patch(cubins["sgemm"], parse_rules(rules), "sgemm")
    assert [h.kind for h in plan.hazards] == ["yield"]


def test_a_control_value_nvdisasm_cannot_decode_is_refused(decoded, cubins):
    """nvdisasm 13 decodes S2R's stall/yield bits through a table without stall 15; the patch is
    disassembled again and refused instead of written."""
    _elf, kernels, _t = decoded["sgemm_naive"]
    s2r = next(i for i in kernels["sgemm_naive"].instructions if i.opcode == "S2R")
    plan = plan_patch(cubins["sgemm_naive"], parse_rules(rule("sgemm_naive", s2r.address, stall=15)), "sgemm_naive")
    assert [(h.kind, h.address) for h in plan.hazards] == [("encoding", s2r.address)]
    assert "TABLES_opex" in plan.hazards[0].message


# ---- the checker accepts -------------------------------------------------------------------------

def test_checker_accepts_longer_stalls_added_waits_and_cleared_reuse(decoded, cubins):
    rules = ('kernel = "sgemm"\n'
             '[[rule]]\nopcode = "LDS\\\\..*"\nloop = 0\nstall = 6\n'
             '[[rule]]\nopcode = "FFMA"\nloop = 0\nreuse = []\n')
    plan = plan_patch(cubins["sgemm"], parse_rules(rules), "sgemm")
    assert not plan.hazards, [h.line() for h in plan.hazards[:3]]
    fields = {k for c in plan.changes for k in c.fields()}
    assert fields == {"stall", "reuse"}


def test_checker_accepts_a_valid_new_reuse_flag(decoded, cubins):
    data, kernel, ins, slot = _reuse_candidate(decoded, cubins)
    plan = plan_patch(data, parse_rules(rule(kernel.name, ins.address,
                                             reuse=[cb.REUSE_SLOTS[s] for s in {slot, *ins.reuse_slots}])), kernel.name)
    assert not plan.hazards, [h.line() for h in plan.hazards]


# ---- the reuse pass (opt-in, not measured) ---------------------------------------------------------

@pytest.mark.slow     # the opt-in pass over every shipped kernel; on sgemm it runs by default (the next test)
def test_reuse_pass_output_passes_the_checker_on_every_shipped_kernel(cubins):
    for name, data in cubins.items():
        plan = plan_patch(data, None, name, reuse_pass=True)
        assert not plan.hazards, (name, [h.line() for h in plan.hazards[:3]])
        assert [r.kernel for r in plan.reuse_pass] == list(ElfCubin(data).kernels)


def test_reuse_pass_on_stripped_sgemm_sets_only_flags_ptxas_had(cubins):
    """Strip every reuse flag from sgemm (always safe), run the pass on the result: each flag it
    sets is one ptxas set too, and it sets most of them back (the rest ptxas set under a looser
    rule than the checker's: docs/design/sass-patching.md)."""
    strip = parse_rules('kernel = "sgemm"\n[[rule]]\nopcode = ".*"\nreuse = []\n')
    stripped = plan_patch(cubins["sgemm"], strip, "sgemm")
    assert not stripped.hazards
    plan = plan_patch(stripped.cubin, None, "sgemm", reuse_pass=True)
    assert not plan.hazards
    original, again = ElfCubin(cubins["sgemm"]), ElfCubin(plan.cubin)
    ptxas = [cb.REUSE.extract(w) for w in original.words("sgemm")]
    ours = [cb.REUSE.extract(w) for w in again.words("sgemm")]
    assert all(o & ~p == 0 for o, p in zip(ours, ptxas))
    restored, had = sum(bin(o).count("1") for o in ours), sum(bin(p).count("1") for p in ptxas)
    assert plan.reuse_pass[0].flags_added == restored
    assert restored > had // 2, (restored, had)
