"""Register banks, operand reuse and per-region summaries of decoded SASS.

Bank model: `isa.arch.arch_for(target).bank_model`, the same table the register planner uses.
Per instruction:
  - source_regs: the general-purpose registers each source slot reads (slot A = first source
    operand after the results, B the second, ...); a 64-bit or vector operand (`R2.64`) is
    counted by the register it names.
  - reuse hit: slot s reading R is served by the operand reuse cache when the previous
    instruction *of the same basic block* that read R in slot s had reuse flag s set
    (maxas wiki "Control-Codes"; Jia et al. 2018, sect. 2 — see isa/control_bits.py REUSE), and
    no instruction in between carried the yield hint (which voids the cache, same source). In
    the ptxas 13.0 output we checked, no reuse flag is ever followed by a yield hint, and every
    flag set is used by the next read of its slot (hits == flags in the summaries).
  - bank conflict: the distinct registers left after reuse hits, put through
    `BankModel.conflicts` (sm_90: three distinct sources in one of the two banks).
Summaries (per kernel and per loop) count reachable instructions only. `issue_cycles` is a
dual-issue-free estimate: every instruction holds the issue slot max(stall, 1) cycles and a bank
conflict adds one; scoreboard waits (variable latency: memory, MUFU, tensor cores) are not in it.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from ..isa import control_bits as cb
from ..isa.register_banks import BankModel
from .cfg import BasicBlock
from .decode import SassInstruction, registers_in

# Memory instructions whose access width is worth keeping in the mix (LDS vs LDS.128).
_WIDTH_OPCODES = frozenset({"LDS", "STS", "LDG", "STG", "LDL", "STL", "LD", "ST", "LDGSTS", "ATOMS", "LDC"})
_WIDTHS = ("U8", "S8", "U16", "S16", "64", "128")

# Opcode groups for the headline numbers of a GEMM loop.
GROUPS = {
    "fp32 fma": ("FFMA",),
    "fp32 other": ("FADD", "FMUL", "FMNMX", "FSEL", "FSETP"),
    "tensor core": ("HMMA", "HGMMA", "IMMA", "IGMMA", "DMMA", "BMMA"),
    "shared loads": ("LDS", "LDSM"),
    "shared stores": ("STS", "STSM"),
    "global loads": ("LDG",),
    "global->shared copies": ("LDGSTS", "UBLKCP", "UTMALDG"),
    "global stores": ("STG", "RED", "ATOMG"),
    "local (spill) memory": ("LDL", "STL"),
    "barriers": ("BAR", "WARPSYNC", "DEPBAR", "LDGDEPBAR", "SYNCS", "WARPGROUP"),
    "shuffles": ("SHFL",),
    "integer": ("IMAD", "IADD3", "LEA", "LOP3", "SHF", "ISETP", "IMNMX", "VIADD", "IABS", "SEL", "MOV", "PRMT"),
    "branches": ("BRA", "BRX", "EXIT", "RET", "CALL", "BSSY", "BSYNC"),
}


def mix_key(ins: SassInstruction) -> str:
    key = ins.opcode
    if ins.opcode in _WIDTH_OPCODES:
        width = [m for m in ins.modifiers if m in _WIDTHS]
        if width:
            key += "." + width[-1]
    if ins.predicate == "!PT":
        key = "@!PT " + key        # encoded but never executed (ptxas padding)
    return key


def analyse_banks(instrs: list[SassInstruction], blocks: list[BasicBlock], model: BankModel) -> None:
    for b in blocks:
        last_read: dict[tuple[int, int], bool] = {}    # (slot, reg) -> that read set the reuse flag
        for k in range(b.start, b.end):
            ins = instrs[k]
            ins.source_regs = [registers_in(op) for op in ins.sources]
            ins.banks = [[model.bank_of(r) for r in regs] for regs in ins.source_regs]
            ins.reuse_hits = []
            reads: list[int] = []
            for index, regs in enumerate(ins.source_regs):
                slot = cb.source_slot(ins.opcode, index)
                if len(regs) != 1:
                    reads.extend(regs)
                    continue
                reg = regs[0]
                if slot < len(cb.REUSE_SLOTS) and last_read.get((slot, reg)):
                    ins.reuse_hits.append(slot)
                else:
                    reads.append(reg)
                if slot < len(cb.REUSE_SLOTS):
                    last_read[(slot, reg)] = bool(ins.reuse >> slot & 1)
            ins.bank_conflict = model.conflicts(reads) if ins.predicate != "!PT" else {}
            if ins.yield_:
                # A yield hint lets the scheduler switch warps, which makes the reuse flags
                # ineffective for the next instruction (Jia et al. 2018, sect. 2.2, yield flag).
                last_read.clear()


@dataclass
class Summary:
    instructions: int
    mix: dict[str, int]
    groups: dict[str, int]
    bank_conflicts: int
    conflicting_instructions: list[int]       # addresses
    reuse_hits: int
    reuse_flags: int
    stall_cycles: int
    issue_cycles: int
    max_live_registers: int | None
    local_loads: int
    local_stores: int
    extra: dict = field(default_factory=dict)  # kernel level: registers, shared memory, ...

    def to_json(self) -> dict:
        return {"instructions": self.instructions, "mix": self.mix, "groups": self.groups,
                "bank_conflicts": self.bank_conflicts,
                "conflicting_instructions": [f"{a:#06x}" for a in self.conflicting_instructions],
                "reuse_hits": self.reuse_hits, "reuse_flags": self.reuse_flags,
                "stall_cycles": self.stall_cycles, "issue_cycles": self.issue_cycles,
                "max_live_registers": self.max_live_registers,
                "local_loads": self.local_loads, "local_stores": self.local_stores, **self.extra}


def summarise(instrs: list[SassInstruction]) -> Summary:
    live = [i for i in instrs if i.reachable]
    mix = Counter(mix_key(i) for i in live)
    groups = {}
    for g, ops in GROUPS.items():
        n = sum(1 for i in live if i.opcode in ops and i.predicate != "!PT")
        if n:
            groups[g] = n
    conflicts = [i for i in live if i.bank_conflict]
    lives = [i.live_registers for i in live if i.live_registers is not None]
    return Summary(
        instructions=len(live),
        mix=dict(sorted(mix.items(), key=lambda kv: (-kv[1], kv[0]))),
        groups=groups,
        bank_conflicts=len(conflicts),
        conflicting_instructions=[i.address for i in conflicts],
        reuse_hits=sum(len(i.reuse_hits) for i in live),
        reuse_flags=sum(bin(i.reuse).count("1") for i in live),
        stall_cycles=sum(i.stall for i in live),
        issue_cycles=sum(max(i.stall, 1) for i in live) + len(conflicts),
        max_live_registers=max(lives) if lives else None,
        local_loads=sum(1 for i in live if i.opcode == "LDL"),
        local_stores=sum(1 for i in live if i.opcode == "STL"),
    )
