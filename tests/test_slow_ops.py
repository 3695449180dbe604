"""asmgemm/slow_ops.py and `asmgemm check`'s notes: an unsigned div/rem by an immediate power of two
is reported at its .sasm line (once per line, with how many instructions of the expanded kernel it
became), and nothing else is: signed division, a divisor that is not a power of two, a register
divisor. The premise is checked against the ptxas in use: `div.u32` by 4 assembles to a MUFU.RCP
sequence, a shift to none (if a ptxas learns the reduction, that test says the note may go)."""
from __future__ import annotations

import json

import pytest

from asmgemm.pipeline import BuildOptions, assemble, build_source
from asmgemm.slow_ops import slow_ops
from asmgemm.toolchain import find_tool
from test_cli import asmgemm

SOURCE = """\
.const W ?= 4
.macro QUARTER(d, a)
    div.u32             d, a, W;
.endm
.visible .entry k(.param .u64 p)
{
    .temp .u32 a, b, c, d, e
    .temp .s32 s
    .temp .u64 ptr, ptr2
    ld.param.u64        ptr, [p];
    ld.global.u32       a, [ptr];
    div.u32             b, a, 2;
    rem.u64             ptr2, ptr, 64;
    div.s32             s, a, 4;
    div.u32             c, a, 3;
    rem.u32             d, a, b;
    QUARTER(e, a)
    QUARTER(e, e)
    add.u32             a, b, c;
    add.u32             a, a, d;
    add.u32             a, a, e;
    add.u32             a, a, s;
    cvt.u32.u64         b, ptr2;
    add.u32             a, a, b;
    st.global.u32       [ptr], a;
    ret;
}
"""


def test_the_notes_name_each_unsigned_power_of_two_divisor_once_a_line():
    result = build_source(SOURCE, "k.sasm", BuildOptions(target="sm_90"))
    found = [(n.span.line, n.opcode, n.divisor, n.count) for n in slow_ops(result.allocated)]
    assert found == [(12, "div.u32", 2, 1), (13, "rem.u64", 64, 1), (3, "div.u32", 4, 2)]
    by_line = {n.span.line: n.message() for n in slow_ops(result.allocated)}
    assert "shr.u32 by 1" in by_line[12] and "and.b64 with 63" in by_line[13] and "2 instructions" in by_line[3]


@pytest.mark.toolchain
@pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")
def test_check_prints_the_notes_at_the_line_and_keeps_its_exit_status(tmp_path):
    p = tmp_path / "k.sasm"
    p.write_text(SOURCE)
    proc = asmgemm("check", p)
    assert proc.returncode == 0, proc.stderr
    assert f"{p}:12:5: note: div.u32 by 2" in proc.stdout and "^" in proc.stdout
    assert ":14:" not in proc.stdout and ":15:" not in proc.stdout       # signed, and not a power of two
    data = json.loads(asmgemm("check", p, "--json").stdout)
    assert [(n["line"], n["divisor"], n["count"]) for n in data["notes"]] == [(12, 2, 1), (13, 64, 1), (3, 4, 2)]


PROBE = """\
.visible .entry probe(.param .u64 p)
{
    .temp .u32 a, q
    .temp .u64 ptr
    ld.param.u64        ptr, [p];
    ld.global.u32       a, [ptr];
    BODY
    st.global.u32       [ptr], q;
    ret;
}
"""


@pytest.mark.toolchain
@pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                    reason="needs ptxas and nvdisasm")
def test_ptxas_keeps_a_division_by_an_immediate_power_of_two():
    from asmgemm.sass.listing import disassemble_listing

    def sass(body):
        result = build_source(PROBE.replace("BODY", body), "probe.sasm", BuildOptions(target="sm_90"))
        listing = disassemble_listing(assemble(result).cubin, line_info=False)
        return " ".join(i.text for f in listing.functions.values() for i in f.instructions)
    assert "MUFU.RCP" in sass("div.u32             q, a, 4;"), \
        "this ptxas strength-reduces div.u32 by a power of two: slow_ops' note may go"
    assert "MUFU.RCP" not in sass("shr.u32             q, a, 2;")
