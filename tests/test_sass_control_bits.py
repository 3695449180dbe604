"""The control-bit layout (asm/isa/control_bits.py) against encodings taken from a real cubin.

How the expected numbers were checked: tests/data/sass/ldg_ffma.ptx and sgemm_loop.ptx were
assembled with ptxas 13.0.88 (-arch=sm_90) and listed with `nvdisasm -c -hex` (13.5). The words
below are copied from that listing (low half first, as nvdisasm prints them). The fields were
then decoded by hand, not with the code under test: bits 105..127 of the instruction are bits
41..63 of the high half, i.e. (hi >> 40) >> 1. For the LDG.E at 0x0090, hi = 0x000ee8000c1e1900:
hi >> 40 = 0x000ee8, >> 1 = 0x774 = 0b0_0000_0000_0111_0111_0100 -> stall 0b0100 = 4, yield bit 1,
write scoreboard 0b011 = 3, read scoreboard 0b111 (none), wait mask 0, reuse 0. The FFMA at 0x00c0
(hi = 0x008fca0008000005) gives 0x47e5 -> stall 5, yield bit 0, no scoreboards set, wait mask
0b001000 (scoreboard 3, the LDGs'), reuse 0. The IMAD.WIDE.U32 at 0x0080, printed by nvdisasm
with `R9.reuse` in its first source, gives 0x217f2 -> reuse 0b0001 (slot A), wait mask 0b000010.
The LDGSTS at 0x0200 of sgemm_loop (hi = 0x0003e2000b921c48) gives 0x1f1 -> read scoreboard 1.
"""
from __future__ import annotations

import pytest

from asmgemm.isa import control_bits as cb
from asmgemm.sass.decode import control_string, decode

# (name, lo, hi, expected fields) — see the module docstring for how each was decoded by hand.
HAND_CHECKED = [
    ("LDG.E R2, desc[UR4][R2.64] ;", 0x0000000402027981, 0x000ee8000c1e1900,
     dict(stall=4, yield_bit=1, write_sb=3, read_sb=None, wait_mask=0, reuse=0), "[B------:R-:W3:-:S04]"),
    ("LDG.E R5, desc[UR4][R4.64] ;", 0x0000000404057981, 0x000ee2000c1e1900,
     dict(stall=1, yield_bit=1, write_sb=3, read_sb=None, wait_mask=0, reuse=0), "[B------:R-:W3:-:S01]"),
    ("FFMA R9, R2, R5, UR6 ;", 0x0000000602097e23, 0x008fca0008000005,
     dict(stall=5, yield_bit=0, write_sb=None, read_sb=None, wait_mask=0b001000, reuse=0), "[B---3--:R-:W-:Y:S05]"),
    ("IMAD.WIDE.U32 R4, R9.reuse, 0x4, R4 ;", 0x0000000409047825, 0x042fe400078e0004,
     dict(stall=2, yield_bit=1, write_sb=None, read_sb=None, wait_mask=0b000010, reuse=0b0001), "[B-1----:R-:W-:-:S02]"),
    ("LDC.64 R6, c[0x0][0x220] ;", 0x00008800ff067b82, 0x000ea20000000a00,
     dict(stall=1, yield_bit=1, write_sb=2, read_sb=None, wait_mask=0, reuse=0), "[B------:R-:W2:-:S01]"),
    ("LDGSTS.E.128 [R31], desc[UR8][R2.64] ;", 0x00000000021f7fae, 0x0003e2000b921c48,
     dict(stall=1, yield_bit=1, write_sb=None, read_sb=1, wait_mask=0, reuse=0), "[B------:R1:W-:-:S01]"),
]


@pytest.mark.parametrize("text,lo,hi,expected,control", HAND_CHECKED, ids=[h[0].split()[0] for h in HAND_CHECKED])
def test_hand_checked_words_decode_to_the_hand_decoded_fields(text, lo, hi, expected, control):
    ins = decode(0, text, lo, hi)
    got = {k: getattr(ins, k) for k in expected}
    assert got == expected
    assert ins.yield_ == (expected["yield_bit"] == 0)
    assert ins.control == control


def test_layout_fields_tile_bits_105_to_125_without_overlap():
    bits = []
    for f in cb.CONTROL_FIELDS:
        bits.extend(range(f.lo, f.lo + f.width))
    assert sorted(bits) == list(range(105, 126))
    assert (cb.STALL.lo, cb.YIELD.lo, cb.WRITE_BARRIER.lo, cb.READ_BARRIER.lo, cb.WAIT_MASK.lo, cb.REUSE.lo) == \
        (105, 109, 110, 113, 116, 122)


def test_encode_then_decode_round_trips_every_field():
    word = cb.word_of(0x0000000402027981, 0x000ee8000c1e1900)
    new = cb.encode_control(word, stall=11, yield_bit=0, write_barrier=5, read_barrier=2, wait_mask=0b101001, reuse=0b1010)
    fields = cb.decode_control(new)
    assert (fields["stall"], fields["yield"], fields["write_barrier"], fields["read_barrier"],
            fields["wait_mask"], fields["reuse"]) == (11, 0, 5, 2, 0b101001, 0b1010)
    # the instruction part of the word is untouched
    mask = ((1 << cb.CONTROL_WIDTH) - 1) << cb.CONTROL_LO
    assert new & ~mask == word & ~mask


def test_control_string_notation():
    assert control_string(0b100001, 4, None, True, 15) == "[B0----5:R4:W-:Y:S15]"
    assert control_string(0, None, 2, False, 0) == "[B------:R-:W2:-:S00]"


def test_observed_instruction_fields_match_the_text():
    # guard predicate bits 12..15: `@!P0 BRA` (sgemm_loop 0x01b0) and an unguarded FFMA (7 = PT).
    bra = cb.word_of(0x0000000000948947, 0x000fea0003800000)
    assert cb.GUARD_PREDICATE.extract(bra) == 0 and cb.GUARD_NEGATE.extract(bra) == 1
    ffma = cb.word_of(0x0000001814107223, 0x042fe20000000010)     # FFMA R16, R20.reuse, R24, R16
    assert cb.GUARD_PREDICATE.extract(ffma) == 7 and cb.GUARD_NEGATE.extract(ffma) == 0
    assert cb.OPCODE.extract(ffma) == 0x223
    assert (cb.REG_D.extract(ffma), cb.REG_A.extract(ffma), cb.REG_B.extract(ffma), cb.REG_C.extract(ffma)) == \
        (16, 20, 24, 16)
    assert decode(0, "FFMA R16, R20.reuse, R24, R16 ;", *cb.halves_of(ffma)).reuse_slots == [0]
