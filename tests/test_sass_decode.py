"""Reading nvdisasm's text: instruction fields, destinations, listing shapes, CFG/loops (CPU only)."""
from __future__ import annotations

import pytest

from asmgemm.isa.arch import arch_for
from asmgemm.sass.analysis import analyse_banks, mix_key, summarise
from asmgemm.sass.cfg import build_blocks, find_loops, resolve_branch_targets
from asmgemm.sass.decode import decode, registers_in, split_operands
from asmgemm.sass.listing import parse_listing

# A control word with no scoreboards, stall 1, no reuse: hi = 0x000fe2... (seen on plain ALU ops).
HI_PLAIN = 0x000fe20000000000


def plain(text: str, reuse: int = 0, address: int = 0):
    hi = HI_PLAIN | (reuse << (122 - 64))
    return decode(address, text, 0, hi)


@pytest.mark.parametrize("text,pred,opcode,mods,operands,ndest", [
    ("@!P0 BRA `(.L_x_0) ;", "!P0", "BRA", [], ["`(.L_x_0)"], 0),
    ("LDG.E.128 R4, desc[UR4][R2.64+0x10] ;", None, "LDG", ["E", "128"], ["R4", "desc[UR4][R2.64+0x10]"], 1),
    ("ISETP.GE.U32.AND P0, PT, R0, UR7, PT ;", None, "ISETP", ["GE", "U32", "AND"], ["P0", "PT", "R0", "UR7", "PT"], 2),
    ("IADD3 R2, P0, R30.reuse, UR4, RZ ;", None, "IADD3", [], ["R2", "P0", "R30", "UR4", "RZ"], 2),
    ("IADD3.X R3, RZ, UR5, RZ, P0, !PT ;", None, "IADD3", ["X"], ["R3", "RZ", "UR5", "RZ", "P0", "!PT"], 1),
    ("SHFL.BFLY PT, R35, R16, 0x1, 0x1f ;", None, "SHFL", ["BFLY"], ["PT", "R35", "R16", "0x1", "0x1f"], 2),
    ("STG.E desc[UR4][R6.64], R9 ;", None, "STG", ["E"], ["desc[UR4][R6.64]", "R9"], 0),
    ("HGMMA.64x8x16.F32 R24, gdesc[UR4], RZ, !UPT, gsb0 ;", None, "HGMMA", ["64x8x16", "F32"],
     ["R24", "gdesc[UR4]", "RZ", "!UPT", "gsb0"], 1),
    ("@!PT LDS RZ, [RZ] ;", "!PT", "LDS", [], ["RZ", "[RZ]"], 1),
    ("EXIT ;", None, "EXIT", [], [], 0),
    ("NOP;", None, "NOP", [], [], 0),
])
def test_text_fields(text, pred, opcode, mods, operands, ndest):
    ins = plain(text)
    assert (ins.predicate, ins.opcode, ins.modifiers, ins.operands, ins.destinations) == (pred, opcode, mods, operands, ndest)


def test_registers_in_operands():
    assert registers_in("desc[UR4][R2.64+0x10]") == [2]
    assert registers_in("-|R13|") == [13]
    assert registers_in("RZ") == [] and registers_in("UR4") == [] and registers_in("SR_TID.X") == []
    assert split_operands("R1, {R2, R3}, [R4+0x8], c[0x0][0x10]") == ["R1", "{R2, R3}", "[R4+0x8]", "c[0x0][0x10]"]


def test_reuse_hits_and_bank_conflicts():
    # R20 in slot A is flagged for reuse, so the second FFMA reads it from the reuse cache.
    # The first FFMA reads R20, R24, R16: three registers in bank 0 -> a conflict under sm_90.
    instrs = [plain("FFMA R16, R20.reuse, R24, R16 ;", reuse=0b0001, address=0),
              plain("FFMA R18, R20, R26, R18 ;", address=16),
              plain("FFMA R19, R20, R22, R18 ;", address=32),
              plain("EXIT ;", address=48)]
    blocks = build_blocks(instrs)
    analyse_banks(instrs, blocks, arch_for("sm_90").bank_model)
    assert instrs[0].bank_conflict == {0: [20, 24, 16]} and instrs[0].reuse_hits == []
    assert instrs[1].reuse_hits == [0] and instrs[1].bank_conflict == {}     # R26, R18 only
    assert instrs[2].reuse_hits == [] and instrs[2].bank_conflict == {0: [20, 22, 18]}  # flag not set on [1]
    s = summarise(instrs)
    assert (s.bank_conflicts, s.reuse_hits, s.reuse_flags, s.stall_cycles) == (2, 1, 1, 4)
    assert s.issue_cycles == 4 + 2
    # the Maxwell model (4 banks, one read each) sees a conflict in two distinct registers of a bank
    analyse_banks(instrs, blocks, arch_for("sm_61").bank_model)
    assert instrs[1].bank_conflict == {2: [26, 18]}


def test_a_yield_hint_voids_the_reuse_cache():
    # hi = 0x000fc2...: stall 1, yield bit 0 (hint on), no scoreboards; reuse bit 0 set on top.
    yielding = decode(0, "FFMA R16, R20.reuse, R25, R17 ;", 0, 0x000fc20000000000 | 1 << 58)
    assert yielding.yield_ and yielding.reuse_slots == [0]
    instrs = [yielding, plain("FFMA R18, R20, R26, R18 ;", address=16), plain("EXIT ;", address=32)]
    analyse_banks(instrs, build_blocks(instrs), arch_for("sm_90").bank_model)
    assert instrs[1].reuse_hits == [] and instrs[1].bank_conflict == {0: [20, 26, 18]}


def test_blocks_and_loops_from_branch_targets():
    text = """
\t.target\tsm_90
\t.section\t.text.k,"ax",@progbits
k:
        /*0000*/                   MOV R0, RZ ;                 /* 0x000000ff00007202 */
                                                                /* 0x000fe20000000f00 */
.L_x_1:
        /*0010*/                   IADD3 R0, R0, 0x1, RZ ;      /* 0x0000000100007810 */
                                                                /* 0x000fe20007ffe0ff */
.L_x_2:
        /*0020*/                   FFMA R2, R0, R0, R2 ;        /* 0x0000000000027223 */
                                                                /* 0x000fe20000000002 */
        /*0030*/              @P1 BRA `(.L_x_2) ;               /* 0xfffffffc00001947 */
                                                                /* 0x000fea000383ffff */
        /*0040*/              @P0 BRA `(.L_x_1) ;               /* 0xfffffffc00000947 */
                                                                /* 0x000fea000383ffff */
        /*0050*/                   EXIT ;                       /* 0x000000000000794d */
                                                                /* 0x000fea0003800000 */
.L_x_3:
        /*0060*/                   BRA `(.L_x_3);               /* 0xfffffffc00fc7947 */
                                                                /* 0x000fc0000383ffff */
"""
    listing = parse_listing(text)
    assert listing.target == "sm_90"
    raw = listing.functions["k"]
    assert raw.labels[".L_x_1"] == 0x10 and raw.labels[".L_x_2"] == 0x20
    instrs = [decode(r.address, r.text, r.lo, r.hi) for r in raw.instructions]
    assert not resolve_branch_targets(instrs, raw.labels)
    blocks = build_blocks(instrs)
    assert [(b.start, b.end) for b in blocks] == [(0, 1), (1, 2), (2, 4), (4, 5), (5, 6), (6, 7)]
    assert not blocks[5].reachable and not instrs[6].reachable    # ptxas's trailing self-branch
    loops = find_loops(blocks)
    assert [(lp.header, lp.blocks, lp.depth) for lp in loops] == [(1, [1, 2, 3], 1), (2, [2], 2)]
    assert loops[1].parent == 0
    assert summarise(instrs).instructions == 6


def test_mix_keys_keep_memory_widths():
    assert mix_key(plain("LDS.128 R20, [R30+UR4] ;")) == "LDS.128"
    assert mix_key(plain("LDS R20, [R30] ;")) == "LDS"
    assert mix_key(plain("LDGSTS.E.BYPASS.128 [R31], desc[UR8][R2.64] ;")) == "LDGSTS.128"
    assert mix_key(plain("@!PT LDS RZ, [RZ] ;")) == "@!PT LDS"
    assert mix_key(plain("FFMA R1, R2, R3, R4 ;")) == "FFMA"
