"""The control field of sm_70+ SASS instructions, as data: the one place its bit layout lives.

Since Volta every SASS instruction is one 128-bit word; the scheduling information that Maxwell and
Pascal kept in a separate control word (one per three instructions) sits in the word's top bits.
nvdisasm `-hex` prints the word as two 64-bit halves, low half first:

    /*0090*/  LDG.E R2, desc[UR4][R2.64] ;   /* 0x0000000402027981 */   <- bits   0..63  (lo)
                                             /* 0x000ee8000c1e1900 */   <- bits  64..127 (hi)

Sources for the layout:
  [JIA18]  Z. Jia, M. Maggioni, B. Staiger, D. P. Scarpazza, "Dissecting the NVIDIA Volta GPU
           Architecture via Microbenchmarking", arXiv:1804.06826 (2018), chapter 2 "Instruction
           encoding", its "Control information" part: at least 23 bits of control
           information at the top of the 128-bit word, most significant first: 2 unused zero bits,
           reuse flags (4), wait barrier mask (6), read barrier index (3), write barrier index (3),
           yield flag (1), stall cycles (4). Reuse flag bit 0 (the least significant) belongs to the
           first source operand slot. When the yield bit is *set* the scheduler prefers to keep
           issuing from the current warp; when it is *cleared* it prefers to switch warps, which
           makes the reuse flags ineffective for the next instruction.
  [JIA19]  Z. Jia, M. Maggioni, J. Smith, D. P. Scarpazza, "Dissecting the NVidia Turing T4 GPU via
           Microbenchmarking", arXiv:1903.07486 (2019), section 2: the same layout on Turing.
  [CUASM]  CuAssembler (github.com/cloudcores/CuAssembler), CuAsm/common.py `decodeCtrlCodes`: the
           same field order in the 23-bit code, barrier index 7 meaning "no barrier", and the
           notation `[B------:R-:W-:Y:S04]`, where `Y` is printed when the yield bit is 0.
  [MAXAS]  S. Gray, maxas wiki "Control-Codes" (github.com/NervanaSystems/maxas/wiki/Control-Codes):
           the meaning of the fields on Maxwell (stall count, yield hint, write/read dependency
           barriers, wait mask, reuse), from which the Volta fields descend.
  [AMP]    H. Abdelkhalik, Y. Arafa, N. Santhi, A. Badawy, "Demystifying the Nvidia Ampere
           Architecture through Microbenchmarking and Instruction-level Analysis", arXiv:2208.11174
           (2022): Ampere keeps Volta's 128-bit encoding and control section.
  [HERE]   Checked against ptxas 13.0.88 / nvdisasm 13.5 output for sm_90 and sm_90a:
           tests/test_sass_control_bits.py decodes words copied from a real listing and compares
           them with fields decoded by hand (an LDG setting write scoreboard 3 and the FFMA that
           consumes it waiting on bit 3; an LDGSTS releasing read scoreboard 1; a `.reuse` in
           slot A = reuse bit 0). tests/test_sass_inspect.py checks on every instruction of the test
           inputs and of tests/corpus/ptx (3333 instructions with ptxas 13.0.88) that the reuse bits
           sit exactly on the operands nvdisasm marks `.reuse`, and that the words equal the bytes
           of the cubin's .text section (low half first).

The same tests pin the few *instruction* fields the decoder cross-checks (guard predicate, opcode,
the register fields of the common ALU form); these are observations on sm_90 ([HERE]), not
documented facts, and the decoder only uses them to verify its reading of nvdisasm's text.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BitField:
    """`width` bits starting at bit `lo` of the 128-bit instruction word (bit 0 = lsb of lo half)."""

    name: str
    lo: int
    width: int
    meaning: str
    source: str

    @property
    def hi(self) -> int:
        return self.lo + self.width - 1

    @property
    def mask(self) -> int:
        return (1 << self.width) - 1

    def extract(self, word: int) -> int:
        return (word >> self.lo) & self.mask

    def insert(self, word: int, value: int) -> int:
        if not 0 <= value <= self.mask:
            raise ValueError(f"{self.name}: {value} does not fit in {self.width} bits")
        return (word & ~(self.mask << self.lo)) | (value << self.lo)


# The control code as a whole: bits 105..127, i.e. `hi >> 41` (23 bits, the top two always zero).
CONTROL_LO = 105
CONTROL_WIDTH = 23

STALL = BitField("stall", 105, 4,
                 "cycles the scheduler waits before issuing this warp's next instruction (0-15)",
                 "[JIA18] ch. 2, [CUASM]")
YIELD = BitField("yield", 109, 1,
                 "yield hint, inverted: 0 = prefer switching to another warp after this "
                 "instruction (printed `Y`), 1 = keep issuing from this warp (printed `-`)",
                 "[JIA18] ch. 2, [CUASM] (s_yield = '-' if bit else 'Y'), [MAXAS]")
WRITE_BARRIER = BitField("write_barrier", 110, 3,
                         "scoreboard (0-5) this variable-latency instruction releases when its "
                         "result is written; 7 = none",
                         "[JIA18] ch. 2, [CUASM]")
READ_BARRIER = BitField("read_barrier", 113, 3,
                        "scoreboard (0-5) released once this instruction has read its source "
                        "registers (so they may be overwritten); 7 = none",
                        "[JIA18] ch. 2, [CUASM]")
WAIT_MASK = BitField("wait_mask", 116, 6,
                     "scoreboards (bit i = scoreboard i) that must be released before this "
                     "instruction issues",
                     "[JIA18] ch. 2, [CUASM]")
REUSE = BitField("reuse", 122, 4,
                 "operand reuse-cache flags: bit i keeps source slot i (A, B, C, D) in the reuse "
                 "cache for the next instruction",
                 "[JIA18] ch. 2, [CUASM]")
UNUSED = BitField("unused", 126, 2, "always zero in the words seen", "[JIA18] ch. 2, [HERE]")

CONTROL_FIELDS: tuple[BitField, ...] = (STALL, YIELD, WRITE_BARRIER, READ_BARRIER, WAIT_MASK, REUSE)

NO_BARRIER = 7       # barrier index meaning "none" [CUASM]
NUM_SCOREBOARDS = 6  # wait mask width [JIA18]
REUSE_SLOTS = ("A", "B", "C", "D")

# Opcodes whose text leaves out a hardware source slot: text source i reads slot TEXT_SOURCE_SLOTS[op][i]
# (default: slot i). HADD2 is an HFMA2 with the multiplier implied: `HADD2.F32 R4, -RZ,
# R16.reuse.H0_H0` sets the reuse bit of slot C for R16 ([HERE]: nvdisasm's `.reuse` against the
# bits, tests/corpus/ptx/fp8_video_sm89.ptx).
# MOV's one source is encoded in slot B (bits 32-39): `MOV R5, R9.reuse` carries reuse bit 1 and
# Rb = 9, Ra = 0 ([HERE]: hgemm sm_90a builds with BN=256, ptxas 13.0; found when a stall patch of
# hgemm failed the nvdisasm read-back on `MOV R14, R12.reuse`, whose flag was read as slot A).
TEXT_SOURCE_SLOTS: dict[str, tuple[int, ...]] = {"HADD2": (0, 2), "MOV": (1,)}


# Opcodes on which ptxas sets reuse flags ([HERE], ptxas 13.0, counted 2026-11-27): in the six
# shipped kernels' sm_90/sm_90a cubins FFMA 3454, ISETP 241, HMMA 214, PRMT 30, IMAD 27, VIADD 25,
# IADD3 17, SEL 10, LEA 5, LOP3 4, VIADDMNMX 4, SHF 3; in tests/data + tests/corpus/ptx (the inputs
# of tests/test_sass_inspect.py) also FMUL 8, FSETP 5, F2FP 3, FMNMX 2, VABSDIFF4, HADD2, DFMA and
# VIMNMX; in hgemm's BN=256 builds MOV (its source in slot B: TEXT_SOURCE_SLOTS). Memory, branch and uniform-datapath instructions never carry one there; the patch checker
# (sass/hazards.py) accepts a new reuse flag only on these opcodes, since what the hardware does
# with a flag elsewhere is unknown.
# [HERE] nvdisasm 13 prints no `.reuse` on an instruction whose yield hint is on (bit 109 = 0),
# whatever its reuse bits (bit 0 set on sgemm 0x0430 `ISETP.GT.AND P0, PT, R6, RZ, PT`, which has
# `Y`: no marker; on gemm_skinny 0x02a0 `ISETP.GE.U32.AND P5, PT, R7, UR4, PT`, no `Y`: `R7.reuse`),
# which agrees with [JIA18]: a yield voids the reuse cache. The patch checker refuses a reuse flag on an instruction with the yield hint on.
REUSE_NEEDS_YIELD_OFF = True
REUSE_OPCODES = frozenset({"FFMA", "ISETP", "HMMA", "PRMT", "IMAD", "VIADD", "IADD3", "SEL", "LEA",
                           "LOP3", "VIADDMNMX", "SHF", "FMUL", "FSETP", "F2FP", "FMNMX", "VABSDIFF4",
                           "HADD2", "DFMA", "VIMNMX", "MOV"})


def source_slot(opcode: str, index: int) -> int:
    """The hardware source slot (0 = A) that text source `index` of `opcode` reads."""
    slots = TEXT_SOURCE_SLOTS.get(opcode)
    return slots[index] if slots is not None and index < len(slots) else index

# Instruction fields observed on sm_90 ([HERE]); used to cross-check the text, never as ISA facts.
GUARD_PREDICATE = BitField("guard", 12, 3, "guard predicate index (7 = PT)", "[HERE]")
GUARD_NEGATE = BitField("guard_negate", 15, 1, "guard predicate negated (@!P)", "[HERE]")
OPCODE = BitField("opcode", 0, 12, "major opcode of the form (e.g. 0x223 = FFMA R,R,R,R)", "[HERE]")
REG_D = BitField("Rd", 16, 8, "destination register of the common ALU forms", "[HERE]")
REG_A = BitField("Ra", 24, 8, "first source register (slot A)", "[HERE]")
REG_B = BitField("Rb", 32, 8, "second source register (slot B) of the register-register form",
                 "[HERE]")
REG_C = BitField("Rc", 64, 8, "third source register (slot C) of the register-register form",
                 "[HERE]")


def word_of(lo: int, hi: int) -> int:
    """The 128-bit instruction word from nvdisasm's two printed halves (low half first)."""
    for half in (lo, hi):
        if not 0 <= half < 1 << 64:
            raise ValueError(f"not a 64-bit half: {half:#x}")
    return (hi << 64) | lo


def halves_of(word: int) -> tuple[int, int]:
    return word & ((1 << 64) - 1), word >> 64


def decode_control(word: int) -> dict[str, int]:
    """Raw field values of one instruction word: {field name: integer}."""
    return {f.name: f.extract(word) for f in CONTROL_FIELDS + (UNUSED,)}


def encode_control(word: int, *, stall: int, yield_bit: int, write_barrier: int,
                   read_barrier: int, wait_mask: int, reuse: int) -> int:
    """`word` with its control field replaced (the inverse of decode_control; used by tests)."""
    for field, value in ((STALL, stall), (YIELD, yield_bit), (WRITE_BARRIER, write_barrier),
                         (READ_BARRIER, read_barrier), (WAIT_MASK, wait_mask), (REUSE, reuse)):
        word = field.insert(word, value)
    return word


def layout_table() -> list[dict]:
    """The layout as rows (for documentation and `--json` consumers)."""
    return [{"field": f.name, "bits": f"{f.hi}:{f.lo}", "width": f.width, "meaning": f.meaning,
             "source": f.source} for f in CONTROL_FIELDS + (UNUSED,)]
