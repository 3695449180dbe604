"""One SASS instruction, decoded: nvdisasm's text split into predicate / opcode / modifiers /
operands, and the control bits read from the 128-bit encoding through isa/control_bits.py.

Which operands an instruction writes is not in the encoding tables we have; it is inferred from
the text with a few rules (stated in `split_destinations`) and checked in the tests against the
`.reuse` markers nvdisasm prints: reuse flag i belongs to the i-th *source* operand, so a wrong
destination count shows up as a flag on the wrong operand.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..isa import control_bits as cb

_TEXT = re.compile(r"^(?P<pred>@!?U?P(?:\d+|T))?\s*(?P<op>[A-Z][A-Z0-9_]*)(?P<mods>(?:\.[A-Za-z0-9_]+)*)\s*(?P<rest>.*?)\s*;?\s*$")
_GPR = re.compile(r"(?<![A-Za-z0-9_])R(\d+)(?![0-9])")
_PRED_OPERAND = re.compile(r"^U?P(\d+|T)$")
_LABEL_REF = re.compile(r"`\(([^)]+)\)")

# Instructions that write no register operand: stores, reductions without result, barriers,
# branches and other control, memory-system fences, and the async-copy / TMA issue ops.
NO_DESTINATION = frozenset("""
    ST STG STS STL STSM RED REDG BAR BRA BRX BRXU JMP JMX JMXU EXIT RET CALL BSSY BSYNC BREAK BPT
    DEPBAR WARPSYNC NOP MEMBAR FENCE ERRBAR CCTL CCTLL CCTLT LDGSTS LDGDEPBAR ARRIVES YIELD KILL
    WARPGROUP UTMALDG UTMASTG UTMAPF UTMAREDG UBLKCP UBLKRED UBLKPF UTMACCTL ACQBULK NANOSLEEP
    PMTRAP BMOV ELECT
""".split())

# Instructions whose first operand is a predicate result and whose second is a register result
# (SHFL's `PT, R35, ...`: in-range predicate and value; LOP3's `P0, R3, ...`).
PREDICATE_THEN_REGISTER = frozenset({"SHFL", "LOP3"})

# Opcodes that end a basic block. BRA/BRX/JMP/JMX transfer control; EXIT/RET/KILL end the thread
# unless predicated; calls return to the next instruction, so they do not.
BRANCHES = frozenset({"BRA", "BRX", "BRXU", "JMP", "JMX", "JMXU"})
TERMINATORS = frozenset({"EXIT", "RET", "KILL"})


def split_operands(rest: str) -> list[str]:
    """Split on commas that are not inside [], {} or ()."""
    out, depth, cur = [], 0, []
    for ch in rest:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    tail = "".join(cur).strip()
    if tail:
        out.append(tail)
    return out


TWO_CARRY_OUTS = frozenset({"IADD3"})


def split_destinations(opcode: str, operands: list[str]) -> int:
    """How many leading operands are results. Rules (checked against `.reuse` markers in tests):
    none for stores/branches/barriers (NO_DESTINATION); otherwise the first operand, plus one
    predicate right after it (ISETP `P0, PT`, IADD3 `R2, P0` carry-out; IADD3's second carry-out
    too), plus the register after a
    leading predicate for SHFL/LOP3."""
    if opcode in NO_DESTINATION or opcode.startswith("U") and opcode[1:] in NO_DESTINATION or not operands:
        return 0
    n = 1
    first_is_pred = bool(_PRED_OPERAND.match(operands[0]))
    if first_is_pred and opcode in PREDICATE_THEN_REGISTER and len(operands) > 1:
        return 2
    if len(operands) > 1 and _PRED_OPERAND.match(operands[1]):
        n = 2
        # IADD3 has two carry-outs: `IADD3 R64, P3, P4, R91.reuse, UR4, R66` (Triton's PTX; the
        # reuse bit is slot A's, so R91 is the first source)
        if opcode in TWO_CARRY_OUTS and len(operands) > 2 and _PRED_OPERAND.match(operands[2]):
            n = 3
    return n


def registers_in(operand: str) -> list[int]:
    """General-purpose register indices named in an operand (`R12.reuse`, `[R2.64+0x10]`, `-|R3|`);
    RZ, uniform registers (UR) and special registers (SR_*) are not register-file reads."""
    return [int(x) for x in _GPR.findall(operand)]


@dataclass
class SassInstruction:
    address: int
    opcode: str                      # 'FFMA'
    modifiers: list[str]             # ['E', '128'] for LDG.E.128
    predicate: str | None            # 'P0', '!P0', 'PT', '!PT' or None
    operands: list[str]              # as printed, `.reuse` markers removed
    text: str                        # nvdisasm's text, unchanged
    lo: int                          # the 128-bit word's halves, as nvdisasm -hex prints them
    hi: int
    stall: int
    yield_: bool                     # True: the yield hint is on (bit 109 clear, printed `Y`)
    yield_bit: int                   # the raw bit 109
    write_sb: int | None             # scoreboard set when the result is written; None for 7
    read_sb: int | None              # scoreboard released when the sources are read; None for 7
    wait_mask: int                   # bit i: waits on scoreboard i
    reuse: int                       # bit i: keep source slot i (A, B, C, D) in the reuse cache
    destinations: int                # how many leading operands are results
    live_registers: int | None = None   # GPR column of nvdisasm -lrm count
    live_predicates: int | None = None
    live_uniform: int | None = None
    ptx_line: int | None = None      # line of the assembled PTX this instruction came from
    ptx_index: int | None = None     # position of that PTX instruction in its function (program order)
    source: str | None = None        # the .sasm location behind that PTX line
    debug_line: str | None = None    # "file:line" from the cubin's .debug_line, as nvdisasm -g prints it
    branch_target: int | None = None  # address, for direct branches
    block: int | None = None         # basic block index
    loops: list[int] = field(default_factory=list)  # loops (innermost last) containing it
    reachable: bool = True
    # filled in by the bank / reuse analysis
    source_regs: list[list[int]] = field(default_factory=list)  # per source slot, GPR indices read
    reuse_hits: list[int] = field(default_factory=list)          # source slots served by the reuse cache
    banks: list[list[int]] = field(default_factory=list)         # per source slot, banks of source_regs
    bank_conflict: dict[int, list[int]] = field(default_factory=dict)  # bank -> registers, if any

    # ---- derived views ---------------------------------------------------------------------
    @property
    def word(self) -> int:
        return cb.word_of(self.lo, self.hi)

    @property
    def name(self) -> str:
        """Opcode with modifiers: 'LDS.128'."""
        return ".".join([self.opcode, *self.modifiers])

    @property
    def wait_scoreboards(self) -> list[int]:
        return [i for i in range(cb.NUM_SCOREBOARDS) if self.wait_mask >> i & 1]

    @property
    def sources(self) -> list[str]:
        return self.operands[self.destinations:]

    @property
    def dests(self) -> list[str]:
        return self.operands[: self.destinations]

    @property
    def dest_regs(self) -> list[int]:
        return [r for op in self.dests for r in registers_in(op)]

    @property
    def reuse_slots(self) -> list[int]:
        return [i for i in range(len(cb.REUSE_SLOTS)) if self.reuse >> i & 1]

    @property
    def control(self) -> str:
        return control_string(self.wait_mask, self.read_sb, self.write_sb, self.yield_, self.stall)

    def to_json(self) -> dict:
        return {
            "address": self.address, "address_hex": f"{self.address:#06x}",
            "predicate": self.predicate, "opcode": self.opcode, "modifiers": self.modifiers,
            "operands": self.operands, "destinations": self.destinations, "text": self.text,
            "encoding": [f"{self.lo:#018x}", f"{self.hi:#018x}"],
            "control": self.control, "stall": self.stall, "yield": self.yield_, "yield_bit": self.yield_bit,
            "write_sb": self.write_sb, "read_sb": self.read_sb, "wait_mask": self.wait_mask,
            "wait_scoreboards": self.wait_scoreboards, "reuse": self.reuse,
            "reuse_slots": [cb.REUSE_SLOTS[i] for i in self.reuse_slots],
            "live_registers": self.live_registers, "live_predicates": self.live_predicates,
            "live_uniform_registers": self.live_uniform,
            "source_registers": self.source_regs, "source_banks": self.banks,
            "reuse_hits": [cb.REUSE_SLOTS[i] if i < len(cb.REUSE_SLOTS) else i for i in self.reuse_hits],
            "bank_conflict": {str(b): regs for b, regs in self.bank_conflict.items()},
            "block": self.block, "loops": self.loops, "reachable": self.reachable,
            "branch_target": self.branch_target,
            "ptx_line": self.ptx_line, "ptx_index": self.ptx_index, "source": self.source,
            "debug_line": self.debug_line,
        }


def control_string(wait_mask: int, read_sb: int | None, write_sb: int | None, yield_: bool, stall: int) -> str:
    """maxas / CuAssembler notation: `[B0-----:R-:W2:Y:S04]` (wait mask as scoreboard digits,
    read and write scoreboards, `Y` when the yield hint is on, stall cycles)."""
    wait = "".join(str(i) if wait_mask >> i & 1 else "-" for i in range(cb.NUM_SCOREBOARDS))
    rd = "-" if read_sb is None else str(read_sb)
    wr = "-" if write_sb is None else str(write_sb)
    return f"[B{wait}:R{rd}:W{wr}:{'Y' if yield_ else '-'}:S{stall:02d}]"


def decode(address: int, text: str, lo: int, hi: int) -> SassInstruction:
    m = _TEXT.match(text.strip())
    if m is None:
        raise ValueError(f"cannot read SASS instruction text: {text!r}")
    pred = m["pred"][1:] if m["pred"] else None
    operands_raw = split_operands(m["rest"]) if m["rest"] else []
    operands = [o.replace(".reuse", "") for o in operands_raw]
    opcode = m["op"]
    mods = [x for x in m["mods"].split(".") if x]
    word = cb.word_of(lo, hi)
    fields = cb.decode_control(word)
    wsb = fields["write_barrier"]
    rsb = fields["read_barrier"]
    return SassInstruction(
        address=address, opcode=opcode, modifiers=mods, predicate=pred, operands=operands,
        text=text, lo=lo, hi=hi,
        stall=fields["stall"], yield_=fields["yield"] == 0, yield_bit=fields["yield"],
        write_sb=None if wsb == cb.NO_BARRIER else wsb, read_sb=None if rsb == cb.NO_BARRIER else rsb,
        wait_mask=fields["wait_mask"], reuse=fields["reuse"],
        destinations=split_destinations(opcode, operands),
    )


def text_reuse_slots(text: str, destinations: int) -> list[int]:
    """Source slots that nvdisasm marks `.reuse` in the text (for cross-checking the bits)."""
    m = _TEXT.match(text.strip())
    if m is None or not m["rest"]:
        return []
    ops = split_operands(m["rest"])[destinations:]
    return sorted(cb.source_slot(m["op"], i) for i, o in enumerate(ops) if ".reuse" in o)


def label_reference(operand: str) -> str | None:
    m = _LABEL_REF.search(operand)
    return m.group(1) if m else None
