"""kernels_ptx/udiv.inc: UDIV_CONST / UREM_CONST give a / c and a % c for every unsigned a, as a
shift and a mask where c is a power of two (ptxas 13.0 does not strength-reduce div.u32/rem.u32 by
an immediate, not even 2: a ~15-instruction reciprocal sequence each), div.u32/rem.u32 otherwise.
Run by the interpreter of tests/ptx_sim.py over values up to 2^32 - 1; and, where ptxas and
nvdisasm are installed, the SASS of the power-of-two form holds no MUFU.RCP (the reciprocal) while
the plain div.u32 by the same immediate does: the reason the macros exist."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asmgemm.pipeline import BuildOptions, assemble, build_source
from asmgemm.toolchain import find_tool
from ptx_sim import Kernel, Memory, aligned_array

KERNELS = Path(__file__).parent.parent / "kernels_ptx"


def _source(body: str) -> str:
    return f""".include "udiv.inc"
.const C ?= 2
.visible .entry udiv_probe(.param .u64 param_A, .param .u64 param_Q, .param .u64 param_R)
.reqntid 256, 1, 1
{{
    .temp .u64  pa, pq, pr, off
    .temp .u32  tid, a, q, r
    ld.param.u64        pa, [param_A];
    ld.param.u64        pq, [param_Q];
    ld.param.u64        pr, [param_R];
    cvta.to.global.u64  pa, pa;
    cvta.to.global.u64  pq, pq;
    cvta.to.global.u64  pr, pr;
    mov.u32             tid, %tid.x;
    mul.wide.u32        off, tid, 4;
    add.u64             pa, pa, off;
    add.u64             pq, pq, off;
    add.u64             pr, pr, off;
    ld.global.u32       a, [pa];
{body}
    st.global.u32       [pq], q;
    st.global.u32       [pr], r;
    ret;
}}
"""


MACROS = "    UDIV_CONST(q, a, C)\n    UREM_CONST(r, a, C)"
PLAIN = "    div.u32             q, a, C;\n    rem.u32             r, a, C;"


def _build(body: str, c: int):
    return build_source(_source(body), "udiv_probe.sasm",
                        BuildOptions(defines={"C": str(c)}, include_dirs=[str(KERNELS)], target="sm_90"))


@pytest.mark.parametrize("c", [1, 2, 4, 8, 32, 64, 256, 1 << 31, 3, 5, 6, 7, 12, 100])
def test_quotient_and_remainder_for_any_unsigned(c):
    result = _build(MACROS, c)
    power = c & (c - 1) == 0
    assert ("div.u32" in result.ptx) != power and ("rem.u32" in result.ptx) != power
    rng = np.random.default_rng(c)
    values = np.concatenate([np.array([0, 1, c - 1, c, c + 1, 2**31, 2**32 - 1], np.uint64),
                             rng.integers(0, 2**32, 256 - 7, dtype=np.uint64)]).astype(np.uint32)
    mem = Memory()
    a = aligned_array((256,), np.uint32)
    a[...] = values
    q, r = aligned_array((256,), np.uint32), aligned_array((256,), np.uint32)
    Kernel(result.ptx).run((1, 1, 1), (256, 1, 1), dict(A=mem.add(a), Q=mem.add(q), R=mem.add(r)), mem)
    np.testing.assert_array_equal(q, values // np.uint32(c))
    np.testing.assert_array_equal(r, values % np.uint32(c))


def _sass_text(body: str, c: int) -> str:
    from asmgemm.sass.listing import disassemble_listing
    listing = disassemble_listing(assemble(_build(body, c)).cubin, line_info=False)
    return "\n".join(i.text for f in listing.functions.values() for i in f.instructions)


@pytest.mark.toolchain
@pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                    reason="needs ptxas and nvdisasm")
def test_ptxas_leaves_a_division_by_an_immediate_power_of_two_a_division():
    assert "MUFU.RCP" in _sass_text(PLAIN, 4), "ptxas now strength-reduces div.u32 by 4: udiv.inc may go"
    assert "MUFU.RCP" not in _sass_text(MACROS, 4)
