"""The `.control` directive (issue 35, point 2): its syntax and errors, and a build whose cubin
carries the control fields it states, on exactly the SASS instructions of its `.schedule` region,
checked by the same safety check as `asmgemm patch`.

The kernel is tests/data/control/ffma_chain.sasm: two dependent FFMA chains in one region, the
directive picked with -D CONTROL=n. Which SASS instructions belong to the region is found in
ptxas's own code (the line table of the build without a directive), never hard-coded, and each
test that expects instructions fails if it finds none.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import asmgemm.parse_fast as parse_fast
from asmgemm.errors import AsmError
from asmgemm.isa import control_bits as cb
from asmgemm.parse import parse_source
from asmgemm.pipeline import BuildOptions, assemble, assemble_traced, build_file, build_source
from asmgemm.sass.elf import ElfCubin
from asmgemm.sass.inspect import inspect_build
from asmgemm.sass.listing import disassemble_listing
from asmgemm.source import SourceFile
from asmgemm.toolchain import find_tool

KERNEL = Path(__file__).parent / "data" / "control" / "ffma_chain.sasm"
TWO_REGIONS = KERNEL.with_name("two_regions.sasm")
TOOLS = pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                           reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')")


def region_source(line: str, around: str = "") -> str:
    """A kernel with `line` inside a .schedule region (or at `around`'s place if given)."""
    body = around or f".schedule\n{line}\n    add.f32 a, a, 1.0;\n.endschedule\n"
    return (".visible .entry k(.param .u64 p)\n{\n    .regs .f32 a\n    .regs .u64 q\n    ld.param.u64 q, [p];\n"
            "    mov.f32 a, 0f00000000;\n" + body + "    st.global.f32 [q], a;\n    ret;\n}\n")


def directive_line(control: int) -> int:
    """The line of the kernel's directive for -D CONTROL=n: the line after `.if/.elif CONTROL == n`."""
    return next(n for n, text in enumerate(KERNEL.read_text().splitlines(), 1) if f"CONTROL == {control}" in text) + 1


def build(control: int, **options):
    return build_file(KERNEL, BuildOptions(defines={"CONTROL": str(control)}, **options))


def controls_of(text: str):
    result = build_source(text, "t.sasm")
    return [c for f in result.scheduled.functions() for r in f.body if hasattr(r, "controls") for c in r.controls]


# ---- syntax ------------------------------------------------------------------------------------

def test_fields_are_read_into_the_raw_values_of_the_rules_file():
    first, second = controls_of(region_source(
        '    .control FFMA stall=6 yield=off write_barrier=none read_barrier=2 // why\n'
        '    .control "LDS\\\\..*" wait=[0, 5] reuse=[A, C] yield=on ;'))
    assert first.pattern == "FFMA" and first.written == "FFMA"
    assert first.fields == {"stall": 6, "yield": 1, "write_barrier": cb.NO_BARRIER, "read_barrier": 2}
    assert second.pattern == "LDS\\..*" and second.fields == {"wait_mask": 0b100001, "reuse": 0b101, "yield": 0}
    # a bare opcode is matched as written: its dots are dots, not "any character"
    [bare] = controls_of(region_source("    .control LDS.U.128 stall=2"))
    assert bare.pattern == "LDS\\.U\\.128"


@pytest.mark.parametrize("defines, fields", [({}, {"stall": 3, "yield": 0}), ({"S": "1"}, {"stall": 1, "yield": 1})])
def test_a_value_in_braces_is_evaluated_when_expanded(defines, fields):
    text = ".const S ?= 3 ;\n" + region_source('    .control FFMA stall={S} yield={"on" if S > 2 else "off"}')
    result = build_source(text, "t.sasm", BuildOptions(defines=defines))
    [control] = [c for f in result.scheduled.functions() for r in f.body if hasattr(r, "controls")
                 for c in r.controls]
    assert control.fields == fields


@pytest.mark.parametrize("line, where, message", [
    (".control FFMA stall={S*8}", ":9:22:", "stall wants a cycle count 0-15, not '24'"),
    (".control FFMA read_barrier={S*2}", ":9:29:", "read_barrier wants a scoreboard 0-5 or none, not '6'"),
    (".control FFMA stall={T}", ":9:22:", "undefined name 'T'"),
    (".control FFMA stall={S} stall=2", ":9:25:", "'stall' is given twice"),
    (".control FFMA wait={S}", ":9:20:", "wait wants a list in brackets"),
])
def test_a_value_in_braces_is_checked_at_the_expression(line, where, message):
    with pytest.raises(AsmError) as info:
        build_source(".const S ?= 3 ;\n" + region_source(line), "t.sasm")
    shown = info.value.format()
    assert message in shown and f"t.sasm{where}" in shown, shown


def test_the_directive_shows_in_the_ptx_as_a_comment():
    result = build_source(region_source("    .control FFMA stall=6   // a note"), "t.sasm")
    line = next(ln for ln in result.ptx.splitlines() if ".control" in ln)
    assert line.strip().startswith("// .control FFMA stall=6") and "t.sasm:8:5" in line
    assert "a note" not in line


@pytest.mark.parametrize("line, where, message", [
    (".control FFMA stall=16", ":8:21:", "stall wants a cycle count 0-15, not '16'"),
    (".control FFMA stal=1", ":8:15:", "unknown control field 'stal'"),
    (".control FFMA yield=maybe", ":8:21:", "yield wants on"),
    (".control FFMA write_barrier=6", ":8:29:", "write_barrier wants a scoreboard 0-5 or none"),
    (".control FFMA wait=3", ":8:20:", "wait wants a list in brackets"),
    (".control FFMA wait=[0, 6]", ":8:24:", "'6' is not a scoreboard"),
    (".control FFMA reuse=[A, E]", ":8:25:", "'E' is not a source slot"),
    (".control FFMA reuse=[A, A]", ":8:25:", "'A' is listed twice"),
    (".control FFMA stall=1 stall=2", ":8:23:", "'stall' is given twice"),
    (".control FFMA stall", ":8:20:", "expected '=' and a value after 'stall'"),
    (".control FFMA", ":8:1:", "'.control' sets no field"),
    (".control", ":8:1:", "needs an opcode pattern and at least one field"),
    (".control \"(\" stall=1", ":8:10:", "the opcode pattern is not a regular expression"),
    (".control \"FFMA stall=1", ":8:10:", "an unterminated string"),
    (".control FFMA stall=1; x", ":8:22:", "nothing but a comment may follow the ';'"),
    (".control FFMA stall=1 /* no */", ":8:23:", "block comments are not read"),
])
def test_syntax_errors_point_at_the_word(line, where, message):
    with pytest.raises(AsmError) as info:
        parse_source(SourceFile.from_text("t.sasm", region_source(line)))
    shown = info.value.format()
    assert message in shown and f"t.sasm{where}" in shown, shown
    assert "^" in shown and "Traceback" not in shown


@pytest.mark.parametrize("body", [
    ".control FFMA stall=1\n",                                            # in the body, no region
    "{\n.control FFMA stall=1\n}\n",                                      # in a scope
])
def test_control_outside_a_schedule_region_is_an_error(body):
    with pytest.raises(AsmError) as info:
        build_source(region_source("", around=body), "t.sasm")
    shown = info.value.format()
    assert "'.control' belongs inside a '.schedule' region" in shown and "t.sasm:" in shown and "^" in shown


def test_control_from_a_macro_or_an_if_inside_a_region_counts():
    text = region_source("", around=(".schedule\nSET()\n.if 1\n.control FADD yield=off\n.endif\n"
                                     "    add.f32 a, a, 1.0;\n.endschedule\n"))
    text = ".macro SET()\n.control FFMA stall=4\n.endm\n" + text
    assert [c.written for c in controls_of(text)] == ["FFMA", "FADD"]


@pytest.mark.parametrize("path", [KERNEL, TWO_REGIONS], ids=lambda p: p.name)
def test_the_fast_path_leaves_control_lines_to_the_grammar_and_agrees_with_it(path, monkeypatch):
    source = SourceFile.from_text(str(path), path.read_text())
    fast = parse_fast.parse(source)
    assert fast is not None
    monkeypatch.setattr(parse_fast, "parse", lambda s: None)
    assert fast == parse_source(source)


# ---- the build -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ptxas_code():
    """ptxas's own code for the kernel (no directive) and the SASS instructions it traces to the
    region's fma lines: the index set each directive must act on, found, not hard-coded."""
    traced = assemble_traced(build(0))
    report = inspect_build(traced)
    lines = KERNEL.read_text().splitlines()
    fma_lines = {n for n, text in enumerate(lines, 1) if text.strip().startswith("fma.rn.f32")}
    [kernel] = report.kernels.values()
    region = {k for k, ins in enumerate(kernel.instructions)
              if ins.source and int(ins.source.split(":")[-2]) in fma_lines}
    assert region and all(kernel.instructions[k].opcode == "FFMA" for k in region)
    return kernel, region, traced.assembled.cubin


def control_fields(cubin: bytes) -> list[tuple[str, dict]]:
    """Each instruction's text and control fields, as nvdisasm reads the cubin back."""
    [fn] = disassemble_listing(cubin, line_info=False).functions.values()
    return [(i.text, cb.decode_control(cb.word_of(i.lo, i.hi))) for i in fn.instructions]


@pytest.mark.toolchain
@TOOLS
def test_an_accepted_directive_sets_its_fields_on_exactly_the_region(ptxas_code):
    kernel, region, _ = ptxas_code
    asm = assemble(build(1))
    after = control_fields(asm.cubin)
    assert [t for t, _ in after] == [i.text for i in kernel.instructions]   # the same instructions
    changed = set()
    for k, (ins, (_, fields)) in enumerate(zip(kernel.instructions, after)):
        before = {"stall": ins.stall, "yield": ins.yield_bit,
                  "write_barrier": cb.NO_BARRIER if ins.write_sb is None else ins.write_sb,
                  "read_barrier": cb.NO_BARRIER if ins.read_sb is None else ins.read_sb,
                  "wait_mask": ins.wait_mask, "reuse": ins.reuse}
        if k in region:
            assert fields["stall"] == 6 and fields["yield"] == 1, (k, ins.text, fields)
            rest = {f: fields[f] for f in before if f not in ("stall", "yield")}
            assert rest == {f: before[f] for f in rest}, (k, ins.text)
        else:
            assert {f: fields[f] for f in before} == before, (k, ins.text)
        if any(fields[f] != before[f] for f in before):
            changed.add(k)
    assert changed and changed <= region
    report = asm.control.to_json()
    [directive] = report["directives"]
    assert report["accepted"] and directive["location"].endswith(f"ffma_chain.sasm:{directive_line(1)}:5")
    assert directive["selected"] == [f"{16 * k:#06x}" for k in sorted(region)]
    assert directive["changed"] == len(changed) and directive["fields"] == {"stall": 6, "yield": "off"}


def lines_of(path: Path, start: str) -> set[int]:
    return {n for n, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith(start)}


@pytest.mark.toolchain
@TOOLS
def test_each_directive_acts_on_its_own_region_where_ptxas_interleaves_two():
    traced = assemble_traced(build_file(TWO_REGIONS, BuildOptions()))
    [kernel] = inspect_build(traced).kernels.values()     # the patched code, each instruction's line

    def traced_to(start):
        lines = lines_of(TWO_REGIONS, start)
        return [k for k, i in enumerate(kernel.instructions) if i.source and int(i.source.split(":")[-2]) in lines]

    first, second = traced_to("fma.rn.f32 a"), traced_to("fma.rn.f32 b")
    assert first and second
    assert min(second) < max(first), "ptxas no longer interleaves the regions: the test lost its point"
    directives = traced.assembled.control.to_json()["directives"]
    assert [d["region"] for d in directives] == [0, 1, 1]
    assert [d["selected"] for d in directives] == [[f"{16 * k:#06x}" for k in ks] for ks in (first, second, second)]
    assert all(kernel.instructions[k].stall == 6 for k in first)
    assert all(kernel.instructions[k].stall == 5 for k in second)       # the later directive wins


@pytest.mark.toolchain
@TOOLS
def test_the_line_table_build_has_the_words_of_the_build_that_ships(ptxas_code):
    """The directive patches the plain cubin through the traced build's line table: the two must
    hold the same words, control bits included (sass/control_directive._same_code checks it on
    every build; this keeps the finding in view on the test kernel and on sgemm)."""
    _, _, traced_cubin = ptxas_code
    plain = assemble(build(0)).cubin
    for name in ElfCubin(plain).kernels:
        assert ElfCubin(plain).words(name) == ElfCubin(traced_cubin).words(name)
    sgemm = build_file("sgemm", BuildOptions(target="sm_90"))
    plain, traced = assemble(sgemm).cubin, assemble_traced(sgemm).assembled.cubin
    assert ElfCubin(plain).words("sgemm") == ElfCubin(traced).words("sgemm")
    # and the patched code is the same whichever of the two builds it came from
    assert ElfCubin(assemble(build(1)).cubin).words("ffma_chain") == \
        ElfCubin(assemble(build(1, trace="ptx-lines")).cubin).words("ffma_chain")


@pytest.mark.toolchain
@TOOLS
@pytest.mark.parametrize("control, kind, numbers", [
    (2, "latency", "FFMA latency 4 cycles"),          # stall 1: the chain's FFMAs 2 cycles apart
    (4, "reuse", "in slot B"),                        # the next FFMA reads another register there
])
def test_a_refused_directive_stops_the_build_at_the_directive(control, kind, numbers):
    with pytest.raises(AsmError) as info:
        assemble(build(control))
    shown = info.value.format()
    assert f"ffma_chain.sasm:{directive_line(control)}:5:" in shown, shown
    assert "refused by the safety check" in shown and "nothing written" in shown
    assert f"{kind}: " in shown and numbers in shown and "FFMA" in shown and "^" in shown


@pytest.mark.toolchain
@TOOLS
def test_a_directive_that_selects_nothing_is_an_error():
    with pytest.raises(AsmError) as info:
        assemble(build(3))
    shown = info.value.format()
    assert "selects no SASS instruction" in shown and "the region's opcodes: FFMA" in shown
    assert f"ffma_chain.sasm:{directive_line(3)}:14:" in shown and "^" in shown       # at the pattern


@pytest.mark.toolchain
@TOOLS
def test_a_target_whose_control_codes_are_not_modelled_is_an_error_at_the_directive():
    with pytest.raises(AsmError) as info:
        assemble(build(1, target="sm_80"))
    shown = info.value.format()
    assert "'.control' writes the control codes of sm_90/sm_90a SASS; this build is for sm_80" in shown
    assert f"ffma_chain.sasm:{directive_line(1)}:5:" in shown


# ---- the command line --------------------------------------------------------------------------

@pytest.mark.toolchain
@TOOLS
def test_build_writes_the_patched_cubin_and_reports_it(tmp_path, run_cli, ptxas_code):
    _, region, _ = ptxas_code
    out, ptx = tmp_path / "k.cubin", tmp_path / "k.ptx"
    code, stdout, err = run_cli("build", KERNEL, "-D", "CONTROL=1", "--cubin", out, "-o", ptx, "--json")
    assert code == 0, err
    data = json.loads(stdout)
    [directive] = data["control"]["directives"]
    assert data["control"]["accepted"] and len(directive["selected"]) == len(region)
    assert out.read_bytes() == assemble(build(1)).cubin
    code, stdout, err = run_cli("build", KERNEL, "-D", "CONTROL=1", "--cubin", out, "-o", ptx)
    assert code == 0 and f"{len(region)} of the region's {len(region)} SASS instructions selected" in err
    # without a cubin nothing is patched, and the report says so
    code, stdout, err = run_cli("build", KERNEL, "-D", "CONTROL=1", "-o", ptx, "--json")
    assert code == 0 and "not applied" in json.loads(stdout)["control"]
    # the SASS report shows the patched code and what the directive did
    code, stdout, err = run_cli("sass", KERNEL, "-D", "CONTROL=1", "--json")
    assert code == 0, err
    data = json.loads(stdout)
    assert data["control"]["accepted"]
    stalls = {i["address"] // 16: i for i in data["kernels"][0]["instructions"]}
    assert all(stalls[k]["stall"] == 6 for k in region), [stalls[k] for k in region]


@pytest.mark.toolchain
@TOOLS
def test_a_refused_build_writes_nothing(tmp_path, run_cli):
    out, ptx = tmp_path / "k.cubin", tmp_path / "k.ptx"
    code, stdout, err = run_cli("build", KERNEL, "-D", "CONTROL=2", "--cubin", out, "-o", ptx)
    assert code == 1 and "refused by the safety check" in err and "Traceback" not in err
    assert not out.exists() and not ptx.exists() and not list(tmp_path.iterdir())
