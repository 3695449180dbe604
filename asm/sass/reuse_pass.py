"""The reuse pass (issue 35, point 3, first of three): set every operand-reuse flag that the checker
can prove valid, maxas-style, and say what it changes in the bank model. Opt-in only
(`asmgemm patch CUBIN --reuse-pass -o OUT`, a table's `sass_patch`); nothing loads its output unless
asked. On the H100 (2026-11-27) it changed nothing measurable: ptxas 13 already sets the flags it
would (sgemm 51.5 = 51.5 TFLOP/s; docs/design/sass-patching.md).

maxas (MaxAs.pm, "reuse" in its scheduler) sets a reuse flag on every source operand that the next
instruction reads again in the same slot. ptxas 13 already does this in most places; what it
leaves off is what this pass adds. A flag is set on slot s of instruction I when (the checker's
rule 3, sass/hazards.py): I's opcode is one ptxas sets reuse on (isa/control_bits.py
REUSE_OPCODES), I's yield hint is off, I is not a branch and falls through to I+1 on every path,
I+1 reads exactly the same registers in slot s, and I does not overwrite them.

Bank awareness: on sm_90 a read served by the reuse cache does not go to the register-file banks,
so a flag matters where the next instruction would otherwise have a bank conflict
(isa/register_banks.py; sass/analysis.py counts conflicts after reuse hits). The pass sets every
valid flag (the caches are per slot, so flags do not compete for space) and reports the modelled
bank conflicts before and after, per kernel and in loops: the only number it can give without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..isa import control_bits as cb
from ..isa.arch import arch_for
from .analysis import analyse_banks
from .decode import BRANCHES, TERMINATORS
from .hazards import CodeFacts
from .inspect import SassKernel


@dataclass
class ReuseSummary:
    kernel: str
    flags_added: int
    conflicts_before: int            # instructions with a modelled bank conflict (all reachable code)
    conflicts_after: int
    loop_conflicts_before: int       # the same, inside loops only
    loop_conflicts_after: int

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "flags_added": self.flags_added,
                "bank_conflicts": [self.conflicts_before, self.conflicts_after],
                "loop_bank_conflicts": [self.loop_conflicts_before, self.loop_conflicts_after],
                "measured": False}


def reuse_flags(kernel: SassKernel) -> dict[int, int]:
    """instruction index -> its new reuse field, for every instruction that gains a flag."""
    ins = kernel.instructions
    code = CodeFacts(ins, kernel.blocks, [i.word for i in ins])
    out: dict[int, int] = {}
    for k, i in enumerate(ins[:-1]):
        if not i.reachable or i.opcode not in cb.REUSE_OPCODES or i.yield_ \
                or i.opcode in BRANCHES or i.opcode in TERMINATORS or code.succ[k] != [k + 1]:
            continue
        reuse = i.reuse
        for slot, regs in code.slot_regs[k].items():
            if slot >= len(cb.REUSE_SLOTS) or not regs or any(space != "R" for space, _ in regs):
                continue
            if code.slot_regs[k + 1].get(slot) == regs and not regs & code.writes[k]:
                reuse |= 1 << slot
        if reuse != i.reuse:
            out[k] = reuse
    return out


def bank_conflicts(kernel: SassKernel, reuse: dict[int, int], target: str) -> tuple[int, int]:
    """(conflicting instructions, of which in loops) under the target's bank model, with the reuse
    fields of `reuse` in place of the kernel's; the kernel's own fields are restored after."""
    saved = {k: kernel.instructions[k].reuse for k in reuse}
    try:
        for k, value in reuse.items():
            kernel.instructions[k].reuse = value
        analyse_banks(kernel.instructions, kernel.blocks, arch_for(target).bank_model)
        live = [i for i in kernel.instructions if i.reachable and i.bank_conflict]
        return len(live), sum(1 for i in live if i.loops)
    finally:
        for k, value in saved.items():
            kernel.instructions[k].reuse = value
        analyse_banks(kernel.instructions, kernel.blocks, arch_for(target).bank_model)


def plan_reuse(kernel: SassKernel, target: str) -> tuple[dict[int, int], ReuseSummary]:
    flags = reuse_flags(kernel)
    before, loop_before = bank_conflicts(kernel, {}, target)
    after, loop_after = bank_conflicts(kernel, flags, target)
    added = sum(bin(v & ~kernel.instructions[k].reuse).count("1") for k, v in flags.items())
    return flags, ReuseSummary(kernel.name, added, before, after, loop_before, loop_after)
