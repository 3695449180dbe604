"""The SASS inspector on real ptxas output (ptxas + nvdisasm from the cuda-tools extra)."""
from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from asmgemm.pipeline import BuildOptions, assemble, assemble_traced, build_file
from asmgemm.sass.cubin import read_cubin
from asmgemm.sass.decode import text_reuse_slots
from asmgemm.sass.inspect import inspect_build, inspect_cubin
from asmgemm.toolchain import find_tool, run_ptxas

DATA = Path(__file__).parent / "data" / "sass"
CORPUS = Path(__file__).parent / "corpus" / "ptx"

pytestmark = [
    pytest.mark.toolchain,
    pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                       reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')"),
]

_CACHE: dict = {}


def report_for(name: str):
    if name not in _CACHE:
        result = build_file(str(DATA / name))
        _CACHE[name] = (result, inspect_build(assemble_traced(result)))
    return _CACHE[name]


def test_ldg_feeding_ffma_sets_and_waits_on_one_scoreboard():
    _, report = report_for("ldg_ffma.ptx")
    k = report.kernels["ldg_ffma"]
    ldgs = [i for i in k.instructions if i.opcode == "LDG"]
    (ffma,) = [i for i in k.instructions if i.opcode == "FFMA"]
    assert len(ldgs) == 2
    for ldg in ldgs:
        assert ldg.write_sb is not None and 0 <= ldg.write_sb <= 5       # variable latency: a scoreboard
        loaded = ldg.dest_regs[0]
        assert loaded in [r for regs in ffma.source_regs for r in regs]   # the FFMA reads the loaded value
        assert ffma.wait_mask >> ldg.write_sb & 1, (ldg.text, ffma.control)
    # between the LDGs and the FFMA nothing else waited on (and so released) that scoreboard
    sb = {ldg.write_sb for ldg in ldgs}
    between = [i for i in k.instructions if ldgs[-1].address < i.address < ffma.address]
    assert not any(i.wait_mask >> s & 1 for i in between for s in sb)
    # a fixed-latency ALU op sets no scoreboard
    assert ffma.write_sb is None and ffma.read_sb is None


def test_encodings_are_the_bytes_of_the_text_section():
    result = build_file(str(DATA / "ldg_ffma.ptx"))
    cubin = assemble(result).cubin
    info = read_cubin(cubin)
    report = inspect_cubin(cubin, "sm_90")
    fn = info.functions["ldg_ffma"]
    for ins in report.kernels["ldg_ffma"].instructions:
        raw = cubin[fn.code_offset + ins.address: fn.code_offset + ins.address + 16]
        assert int.from_bytes(raw, "little") == ins.word, hex(ins.address)


# The inspector decodes sm_90 cubins: corpus files for later targets (sm_100a, sm_120) cannot be built for it.
REUSE_INPUTS = sorted(DATA.glob("*.ptx")) + sorted(p for p in CORPUS.glob("*.ptx") if "_G" not in p.name
                                                   and not re.search(r"^\.target sm_1\d\d", p.read_text(), re.M))


# each ptxas run is the cost: the default run takes every other file (about 1,650 instructions,
# 57 reuse flags), `-m slow` the others (about 2,050 and 133); each half clears the bar on its own
@pytest.mark.parametrize("inputs", [pytest.param(REUSE_INPUTS[::2], id="even_files"),
                                    pytest.param(REUSE_INPUTS[1::2], id="odd_files", marks=pytest.mark.slow)])
def test_reuse_bits_agree_with_nvdisasm_reuse_markers(inputs):
    """Reuse flag i must sit on the i-th source operand nvdisasm marks `.reuse`: this checks the
    bit positions of the reuse field and the decoder's destination rules together."""
    checked = flagged = 0
    for path in inputs:
        text = path.read_text()
        code, log, cubin = run_ptxas(text, "sm_90a" if "sm_90a" in text else "sm_90")
        assert code == 0, log
        report = inspect_cubin(cubin, line_info=False)
        for k in report.kernels.values():
            for ins in k.instructions:
                assert text_reuse_slots(ins.text, ins.destinations) == ins.reuse_slots, (path.name, ins.text)
                checked += 1
                flagged += bool(ins.reuse)
    assert checked > 500 and flagged > 20


def test_small_kernel_summary():
    result, report = report_for("ldg_ffma.ptx")
    k = report.kernels["ldg_ffma"]
    s = k.summary
    ptxas = {r.name: r for r in report.ptxas_kernels}["ldg_ffma"]
    assert s.extra["registers"] == ptxas.registers            # cubin attribute == ptxas -v
    assert (s.mix["FFMA"], s.mix["LDG"], s.mix["STG"], s.mix["EXIT"]) == (1, 2, 1, 1)
    assert s.groups["global loads"] == 2 and "shared loads" not in s.groups
    assert s.extra["loops"] == 0 and k.loops == []
    assert s.local_loads == s.local_stores == 0 and s.extra["stack_frame_bytes"] == 0
    assert s.extra["shared_bytes"] == 0
    reachable = [i for i in k.instructions if i.reachable]
    assert s.instructions == len(reachable)
    assert s.stall_cycles == sum(i.stall for i in reachable)
    assert all(i.live_registers is not None and 0 < i.live_registers <= ptxas.registers for i in reachable)
    assert s.max_live_registers == max(i.live_registers for i in reachable)
    # every SASS instruction maps back to its PTX line, and that line holds an instruction
    ptx = report.ptx.splitlines()
    for i in reachable:
        assert i.ptx_line is not None and i.ptx_index is not None
    (ffma,) = [i for i in reachable if i.opcode == "FFMA"]
    assert ptx[ffma.ptx_line - 1].strip().startswith("fma.rn.f32")


def test_loop_detection_on_the_sgemm_loop():
    result, report = report_for("sgemm_loop.ptx")
    k = report.kernels["sgemm_loop"]
    assert len(k.loops) == 1
    lp = k.loops[0]
    body = k.loop_instructions(lp)
    header = k.instructions[k.blocks[lp.header].start]
    # the loop is closed by a backward conditional branch to its header
    back = [i for i in body if i.opcode == "BRA" and i.branch_target == header.address]
    assert len(back) == 1 and back[0].predicate is not None and back[0].address > header.address
    s = k.loop_summaries[0]
    assert s.mix["FFMA"] == 16 and s.mix["LDS.128"] == 2 and s.mix["LDGSTS.128"] == 2
    assert s.mix["SHFL"] == 1 and s.mix["BAR"] == 2
    outside = [i for i in k.instructions if i.reachable and i not in body]
    assert not any(i.opcode in ("FFMA", "LDS", "LDGSTS", "SHFL") for i in outside)
    # each loop FFMA comes from one of the 16 fma lines of the loop body in the PTX
    ptx = report.ptx.splitlines()
    assert all(ptx[i.ptx_line - 1].strip().startswith("fma.rn.f32") for i in body if i.opcode == "FFMA")
    assert k.summary.extra["shared_bytes"] == 4096
    assert s.reuse_hits <= s.reuse_flags + 1 and s.issue_cycles == sum(max(i.stall, 1) for i in body) + s.bank_conflicts


def test_tensor_core_instructions_in_the_mix():
    _, hmma = report_for("hmma_tile.ptx")
    assert hmma.kernels["hmma_tile"].summary.groups.get("tensor core") == 1
    assert "LDSM" in hmma.kernels["hmma_tile"].summary.mix
    _, hgmma = report_for("hgmma_sm90a.ptx")
    assert hgmma.target == "sm_90a"
    assert hgmma.kernels["hgmma_tile"].summary.mix.get("HGMMA") == 1


def test_traced_assembly_adds_line_info_when_the_build_had_none():
    result = build_file(str(DATA / "ldg_ffma.ptx"), BuildOptions(trace="none"))
    traced = assemble_traced(result)
    assert traced.build.options.trace == "ptx-lines" and result.options.trace == "none"
    report = inspect_build(traced)
    assert all(i.ptx_line is not None for i in report.kernels["ldg_ffma"].instructions if i.reachable)
    # the PTX line numbers refer to the PTX that was assembled, which the report keeps
    assert report.ptx is not None and ".loc" in report.ptx


def test_the_inspector_does_not_build_an_untraced_build():
    with pytest.raises(ValueError):
        inspect_build(SimpleNamespace(build=build_file(str(DATA / "ldg_ffma.ptx")), assembled=None))


def test_json_has_named_fields_per_instruction():
    _, report = report_for("sgemm_loop.ptx")
    data = report.to_json()
    ins = data["kernels"][0]["instructions"][0]
    for key in ("address", "opcode", "modifiers", "predicate", "operands", "control", "stall", "yield",
                "write_sb", "read_sb", "wait_mask", "reuse", "live_registers", "source_banks", "bank_conflict",
                "reuse_hits", "ptx_line", "block", "loops"):
        assert key in ins
    assert data["kernels"][0]["loops"][0]["summary"]["mix"]["FFMA"] == 16
