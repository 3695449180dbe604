"""Which PTX operands an instruction writes and which it reads.

Source: the PTX ISA 9.0 instruction descriptions (docs.nvidia.com/cuda/parallel-thread-execution),
section 9.7 "Instructions": for nearly every instruction operand `d` (the first) is the destination.
The tables below list the exceptions; each entry names the ISA section it comes from.
"""
from __future__ import annotations

from ..ir import Instruction, Mem, Pair, Paren, Reg, Vector, operand_regs

# Instructions whose first operand is not a register destination (stores, barriers, control flow,
# asynchronous copies whose destination is memory, fences).
NO_DESTINATION = {
    "st",            # 9.7.9.10 st
    "st.async",      # 9.7.9.12
    "red",           # 9.7.13.6 red
    "red.async",
    "bar", "barrier",  # 9.7.13.1
    "bra", "brx", "ret", "exit", "trap", "brkpt", "call",  # 9.7.12; call is special-cased below
    "membar", "fence",  # 9.7.13.4
    "prefetch", "prefetchu", "applypriority", "discard",
    "cp",            # cp.async*, cp.reduce.async.bulk*: 9.7.9.25 — destination is memory
    "stmatrix",      # 9.7.14.5.16
    "wgmma.fence", "wgmma.commit_group", "wgmma.wait_group",  # 9.7.15.6
    "nanosleep", "pmevent", "setmaxnreg", "griddepcontrol", "tensormap",
    "mbarrier.init", "mbarrier.inval", "mbarrier.expect_tx", "mbarrier.complete_tx",
    "mbarrier.arrive_drop.noComplete",
    "elect",         # handled below: writes d and the optional pred of a pair
    "multimem.st", "multimem.red",
}

# Instructions that read their destination too (accumulate in place).
READS_DESTINATION = {
    "wgmma.mma_async",   # 9.7.15.5.2: d = A*B + d (scale-d selects whether d is read; assume it is)
}


def _key(ins: Instruction) -> list[str]:
    parts = ins.opcode.split(".")
    return [".".join(parts[:n]) for n in range(len(parts), 0, -1)]


def _matches(ins: Instruction, table: set[str]) -> bool:
    return any(k in table for k in _key(ins))


def defs_and_uses(ins: Instruction) -> tuple[list[Reg], list[Reg]]:
    """(registers written, registers read) by one instruction, in operand order.

    Vector operands count element by element; a `p|q` pair writes both; memory operands only read
    their address registers; the guard predicate is read.
    """
    defs: list[Reg] = []
    uses: list[Reg] = []
    if ins.guard is not None:
        uses.append(ins.guard.reg)
    ops = list(ins.operands)
    if not ops:
        return defs, uses
    base = ins.base
    if base == "call":
        # call (ret), func, (args): the first parenthesised list is written, the rest read.
        if isinstance(ops[0], Paren) and len(ops) > 1:
            defs.extend(operand_regs(ops[0]))
            ops = ops[1:]
        for op in ops:
            uses.extend(operand_regs(op))
        return defs, uses
    first = ops[0]
    if _matches(ins, NO_DESTINATION) or isinstance(first, Mem):
        for op in ops:
            uses.extend(operand_regs(op))
        return defs, uses
    if isinstance(first, (Reg, Vector, Pair)):
        written = list(operand_regs(first))
        defs.extend(r for r in written if r.name != "_")
        if _matches(ins, READS_DESTINATION):
            uses.extend(r for r in written if r.name != "_")
        rest = ops[1:]
    else:
        rest = ops
    for op in rest:
        uses.extend(operand_regs(op))
    return defs, uses


# FMA-class instructions: three register sources read in one issue. Used by the bank-conflict
# report (PTX ISA 9.7.3.x fma/mad, 9.7.4.x half-precision fma, 9.7.1.x integer mad).
THREE_SOURCE_BASES = {"fma", "mad", "mad24", "madc", "dp4a", "dp2a"}


def is_three_source(ins: Instruction) -> bool:
    return ins.base in THREE_SOURCE_BASES
