"""How operands are written back as PTX: a symbol with a negative offset must be PTX that ptxas
takes (`arr+-4`: ptxas 13.0 rejects `arr-4` with a parsing error), and a register-based address
keeps nvcc's own form (`[%rd4+-4]`) so that plain PTX round-trips."""
import pytest

from asmgemm import ir
from asmgemm.pipeline import assemble, build_source
from asmgemm.toolchain import find_tool, run_ptxas

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")

SOURCE = """.version 8.7
.target sm_90
.address_size 64

.global .align 4 .b32 arr[16];

.visible .entry k(.param .u64 p)
{
  .reg .b64 %rd<4>;
  .reg .b32 %r<4>;
  ld.param.u64 %rd2, [p];
  mov.u64 %rd1, arr-4;
  ld.global.u32 %r1, [arr-4];
  ld.global.u32 %r2, [%rd1+-4];
  mov.u64 %rd3, arr+-8;
  st.global.u64 [%rd2], %rd1;
  st.global.u32 [%rd2+8], %r1;
  st.global.u32 [%rd2+12], %r2;
  st.global.u64 [%rd2+16], %rd3;
  ret;
}
"""


def test_symbol_offsets_render():
    assert ir.Sym("arr").render() == "arr"
    assert ir.Sym("arr", 4).render() == "arr+4"
    assert ir.Sym("arr", -4).render() == "arr+-4"
    assert ir.Mem(ir.Sym("arr"), -4).render() == "[arr+-4]"
    assert ir.Mem(ir.Reg("%rd4"), -4).render() == "[%rd4+-4]"


def test_negative_symbol_offsets_become_ptx_form():
    ptx = build_source(SOURCE, "neg.sasm").ptx
    assert "mov.u64 %rd1, arr+-4;" in ptx
    assert "ld.global.u32 %r1, [arr+-4];" in ptx
    assert "ld.global.u32 %r2, [%rd1+-4];" in ptx
    assert "mov.u64 %rd3, arr+-8;" in ptx
    assert "arr-" not in ptx


@pytest.mark.toolchain
@needs_ptxas
def test_negative_symbol_offsets_assemble():
    result = build_source(SOURCE, "neg.sasm")
    assert assemble(result).cubin[:4] == b"\x7fELF"


@pytest.mark.toolchain
@needs_ptxas
def test_ptxas_rejects_the_other_spelling():
    """Why Sym.render writes `+-`: the same PTX with `arr-4` does not parse."""
    ptx = build_source(SOURCE, "neg.sasm").ptx
    for bad in (ptx.replace("mov.u64 %rd1, arr+-4;", "mov.u64 %rd1, arr-4;"),
                ptx.replace("[arr+-4]", "[arr-4]")):
        assert bad != ptx
        code, log, _ = run_ptxas(bad, "sm_90")
        assert code != 0 and "Parsing error" in log, log
