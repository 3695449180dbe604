"""Which registers an sm_90 SASS operand names, with their widths: the facts the control-code
checker (sass/hazards.py) needs to find a result's consumers. Data plus the small function that
applies it.

The encoding tables of sm_90 are not public, so the widths come from nvdisasm's text and are
*over*-approximated where the text is silent: a checker that thinks an instruction reads one
register too many refuses a patch it could have accepted; one that misses a register would accept
a hazard. Sources:
  [NVDIS]  nvdisasm 13.x text of ptxas 13.0 sm_90 code: `R2.64` names the pair R2:R3 (addresses,
           64-bit values), memory opcodes carry their access width as a modifier (`LDS.128`,
           `LDG.E.64`, `STS.128`), `IMAD.WIDE` writes a pair and its last operand (the addend C)
           is a pair too, `CS2R Rd, SRZ` writes a pair (ptxas zeroes accumulators with CS2R on
           every second register; `CS2R.32` writes one), an integer ALU opcode with a `.64`
           modifier (`UIADD3.64 UR26, UR22, 0x80, URZ`) works on pairs, DADD/DFMA/DMUL work on pairs,
           `LDSM.16.M88.4` loads four registers (`.2` two), and the register-namespace prefixes
           R (GPR), UR (uniform), P (predicate), UP (uniform predicate); RZ, URZ, PT and UPT are
           constants, not registers.
  [PTXISA] PTX ISA 8.x, `mma.sync` fragment sizes: m16n8k16 f16/bf16 -> f32 takes A in 4
           registers, B in 2, C and D in 4 (HMMA.16816.F32); smaller shapes take fewer, so 4/2/4
           covers every HMMA/IMMA form ptxas emits for sm_90 mma.sync.
Not covered (the checker says so and leaves such instructions' registers out): the warpgroup
instructions (HGMMA and its accumulator ranges), whose ordering ptxas enforces with
WARPGROUP.ARRIVE/DEPBAR instructions rather than control codes.
"""
from __future__ import annotations

import re

# (namespace, index) pairs; R and UR up to 255 / 63, P and UP up to 6 (7 is PT / UPT).
_REGISTER = re.compile(r"(?<![A-Za-z0-9_])(UR|UP|R|P)(\d+)(\.64|\.128)?(?![0-9])")

# Memory opcodes whose width modifier sizes their data operand (not the address) [NVDIS].
MEMORY_DATA_OPCODES = frozenset({"LD", "ST", "LDG", "STG", "LDS", "STS", "LDL", "STL", "LDC", "ULDC",
                                 "ATOM", "ATOMG", "ATOMS", "RED", "REDG", "LDSM", "STSM", "SHFL"})
WIDTH_MODIFIERS = {"64": 2, "128": 4}
PAIR_OPCODES = frozenset({"DADD", "DFMA", "DMUL", "DMNMX", "DSETP"})      # every register a pair [NVDIS]
TENSOR_OPCODES = frozenset({"HMMA", "IMMA", "DMMA", "BMMA"})
TENSOR_WIDTHS = (4, 4, 2, 4)     # D, A, B, C of mma.sync at its largest (m16n8k16 f32 acc) [PTXISA]
UNMODELLED_OPCODES = frozenset({"HGMMA", "IGMMA", "QGMMA", "BGMMA", "WARPGROUP"})
WIDE_ADDEND_OPCODES = frozenset({"IMAD", "UIMAD"})   # `.WIDE`: Rd (pair), Ra, Rb, Rc (pair) [NVDIS]
PAIR_RESULT_OPCODES = frozenset({"CS2R"})            # a pair unless `.32` [NVDIS]

Register = tuple[str, int]       # ("R", 12), ("P", 0), ("UR", 4), ("UP", 1)


def _memory_width(modifiers: list[str]) -> int:
    width = 1
    for m in modifiers:
        width = max(width, WIDTH_MODIFIERS.get(m, 1))
    if "4" in modifiers:        # LDSM .4 / STSM .4
        width = max(width, 4)
    elif "2" in modifiers:
        width = max(width, 2)
    return width


def operand_registers(opcode: str, modifiers: list[str], operand: str, position: int,
                      is_destination: bool) -> set[Register]:
    """Registers named by one operand, each pair/quad expanded to its members. `position` is the
    operand's index among all operands (destinations first)."""
    out: set[Register] = set()
    bracketed = operand.lstrip("-|!~").startswith(("[", "desc[", "gdesc["))
    for m in _REGISTER.finditer(operand):
        space, index, suffix = m.group(1), int(m.group(2)), m.group(3)
        if space in ("P", "UP") and index == 7:
            continue
        width = 1
        if suffix:
            width = 2 if suffix == ".64" else 4
        elif space in ("R", "UR") and not bracketed:
            if opcode in PAIR_OPCODES:
                width = 2
            elif opcode in TENSOR_OPCODES:
                width = TENSOR_WIDTHS[min(position, len(TENSOR_WIDTHS) - 1)]
            elif opcode in MEMORY_DATA_OPCODES or opcode.startswith("LD") or opcode.startswith("ST"):
                width = _memory_width(modifiers)
            elif is_destination and "WIDE" in modifiers:
                width = 2
            elif "WIDE" in modifiers and opcode in WIDE_ADDEND_OPCODES and position == 3:
                width = 2
            elif is_destination and opcode in PAIR_RESULT_OPCODES and "32" not in modifiers:
                width = 2
            elif "64" in modifiers:          # a 64-bit integer ALU form (memory opcodes are above)
                width = 2
            elif is_destination and opcode in ("F2F", "I2F", "F2I") and "F64" in modifiers:
                width = 2
        if space in ("R", "UR") and index == (255 if space == "R" else 63):
            continue        # RZ / URZ printed by number never happens, but never a real register
        for k in range(width):
            out.add((space, index + k))
    return out


def register_name(reg: Register) -> str:
    return f"{reg[0]}{reg[1]}"
