"""The safety check for control-code patches: a patched kernel must be as safe as ptxas's.

`check_patch(kernel, new_words, table)` compares the control fields of the patched words with the
input's (the words of `kernel`, decoded by the SASS inspector) and returns every hazard the
patch *introduces*; an empty list means the patch is accepted. Only the control fields differ
between the two (sass/elf.py refuses any other change), so the instruction text, its registers
and the control flow are the input's.

Paths. A consumer is looked for along every path of the control-flow graph (sass/cfg.py: fall
through, branch targets, loop back edges), not only in program order. A kernel with an indirect
branch has paths the graph does not know, so any patch to it is refused.

Distance. The issue distance from a producer P to a later instruction X on a path is the sum,
over P and every instruction between them, of max(stall, 1): a stall count is the minimum number
of cycles before the warp's next instruction issues (maxas wiki "Control-Codes", Jia et al. 2018,
isa/control_bits.py STALL), and a warp issues at most one instruction per cycle (no dual issue
since Volta, Jia et al. 2018). Scoreboard waits only add cycles, so the sum is a lower bound. It
is the same count as the inspector's issue_cycles estimate (sass/analysis.py).

The four rules, each refusing with the instruction, the hazard and the numbers:
 1. latency: X reads a register that P writes with a fixed latency L (P sets no write
    scoreboard). Refused when the patched distance d is below L *and* below the input's distance
    d0 on that path. L comes from the scheduler's measured table (scheduler/latencies_sm90.py,
    through scheduler/latencies_sm90.py timing_table(): FFMA/FMUL/FADD/IMAD/SHF/ISETP/SEL measured 4 cycles on the
    H100 [H100-UBENCH], DFMA 8, HFMA2 8; others PG-LATENCY / ESTIMATE as the table cites). An
    opcode the table has no fixed latency for is held to the input's distance within a horizon of
    FIXED_HORIZON cycles: a patch may not bring its consumer closer than ptxas did. So is a
    consumer the table does not describe (table_covers): a guard or branch predicate, a control
    or memory instruction. The table was measured on arithmetic chains; ptxas puts 13 cycles
    between an ISETP and the `@P0 EXIT` reading its predicate, as maxas's wiki asks. Comparing with
    d0 keeps ptxas's own spacing acceptable where it is below the table (the report counts those
    pairs: ptxas knows forwarding paths the table does not).
 2. scoreboard: X depends on a variable-latency P (P sets a write scoreboard S: X reads or
    overwrites P's result; or P sets a read scoreboard S: X overwrites one of P's sources). The
    dependencies are (a) every instruction that waited on S in the input, reached from P without an
    earlier wait on S, and (b) every reader/writer of P's registers that the input covered with a
    wait. Refused when, in the patch, P sets no scoreboard of that kind, or some path from P
    reaches X without an instruction (X included) that waits on P's patched scoreboard. A patch
    may not change the scoreboard of a setter whose scoreboard a `DEPBAR.LE SBk` instruction
    counts (the count would no longer include it). And a scoreboard is active only one cycle
    after its setter issues (SCOREBOARD_SETUP): an instruction that waits on it (or a DEPBAR that
    counts it) right after the setter, less than 2 cycles later, does not wait for it. Refused
    where the patch makes such a pair that ptxas's code did not have.
 3. reuse: a reuse flag the patch sets on slot s of instruction I is refused unless I's opcode
    is one ptxas sets reuse flags on (isa/control_bits.py REUSE_OPCODES), I's yield hint is off
    (REUSE_NEEDS_YIELD_OFF: a yield voids the cache), I is not a branch, the
    next instruction I+1 follows I on every path, I+1 reads exactly the same registers in slot
    s, and I does not itself overwrite them (the cache would hold the old value). Flags ptxas
    set are not re-judged.
 4. yield: every loop that had at least one instruction with the yield hint on (bit 109 = 0) in
    the input keeps at least one, so a warp spinning in a loop still offers the scheduler a switch
    point; this is the rule checked, not a proof of forward progress (the yield bit is a hint).

What is not checked: the warpgroup instructions (HGMMA, WARPGROUP.*: ordered by their own
arrive/depbar instructions, not by control codes; isa/sass_registers.py leaves their registers
out), memory ordering (control codes do not order memory; barriers and fences do, and a patch
cannot touch them), and write-after-write between two fixed-latency producers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..isa import control_bits as cb
from ..isa.sass_registers import UNMODELLED_OPCODES, Register, operand_registers, register_name
from .decode import BRANCHES, TERMINATORS, SassInstruction

# The latency source of a measured row of the table (scheduler/latencies_sm90.py)
MEASURED_SOURCE = "H100-UBENCH"
FIXED_HORIZON = 32      # cycles; the table's longest fixed latency on sm_90 is 8 (DFMA, HFMA2)
# Pipes of the timing table whose rows are fixed-latency register results.
_FIXED_PIPES = frozenset({"fma", "fmaheavy", "alu", "fp64"})
_DEPBAR_SB = re.compile(r"\bSB(\d)\b")

# A scoreboard is active one cycle after the instruction that sets it has issued, so an
# instruction that waits on it must issue at least 2 cycles after its setter or it does not wait:
# maxas wiki "Control-Codes", Write Dependency Barriers: "Barriers take one additional clock cycle
# to become active on top of the clock consumed by the instruction doing the setting. So you may
# need to also use a stall count of 2 if you intend to wait with the subsequent instruction" (the
# same for read barriers). ptxas 13 keeps it on sm_90: in the six shipped cubins every one of the 29
# instructions whose scoreboard the next instruction waits on has stall >= 2 (the one exception,
# hgemm's USETMAXREG.DEALLOC with stall 0, is no memory or arithmetic setter). Found on the H100
# (2026-11-27): the reorder pass put `IMAD.WIDE.U32 R138, R149, 0x20, R138` (waiting on read
# scoreboard 0) right after `LDG.E.128 R48, desc[UR10][R138.64]` (setting it) with stall 1 in sgemm
# BK=16 RQ=4 LOAD_AHEAD=1, and sgemm gave a wrong C (rel err 5.9e-2). Since every instruction adds
# at least one cycle, only the next instruction on each path can be closer than 2.
SCOREBOARD_SETUP = 2


@dataclass
class Hazard:
    kernel: str
    address: int
    text: str
    kind: str                    # latency | scoreboard | reuse | yield | depbar | control-flow | encoding
    message: str
    numbers: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.kernel} {self.address:#06x}  {self.text}\n    {self.kind}: {self.message}"

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "address": f"{self.address:#06x}", "instruction": self.text,
                "hazard": self.kind, "message": self.message, **self.numbers}


@dataclass
class CheckReport:
    hazards: list[Hazard]
    checked_pairs: int = 0            # fixed-latency producer/consumer pairs looked at
    below_table: int = 0              # of those, pairs ptxas itself spaced closer than the table
    scoreboard_edges: int = 0         # dependencies checked where a scoreboard or a wait changed

    def to_json(self) -> dict:
        return {"accepted": not self.hazards, "hazards": [h.to_json() for h in self.hazards],
                "fixed_latency_pairs": self.checked_pairs,
                "input_pairs_below_table_latency": self.below_table,
                "scoreboard_dependencies": self.scoreboard_edges}


# Control and memory instructions: consumers the measured latency table does not describe
# (table_covers), and what the stall pass leaves alone (sass/stall_pass.py).
CONTROL_OPCODES = frozenset(BRANCHES | TERMINATORS | {
    "BAR", "BSSY", "BSYNC", "BREAK", "BPT", "CALL", "WARPSYNC", "DEPBAR", "NANOSLEEP", "YIELD",
    "WARPGROUP", "ELECT", "SYNCS", "ARRIVES", "ACQBULK", "BMOV", "PMTRAP", "VOTEU"})
MEMORY_OPCODE = re.compile(r"^(LD|ST|ATOM|RED|SU|TEX|TLD|TMML|TXD|TXQ|UTMA|UBLK|CCTL|MEMBAR|FENCE|ERRBAR|MATCH|QSPC)")


# Producer forms the table's measurements do not describe: the wide, high-half and carry forms of
# IMAD/IADD3/LEA (a 64-bit result or a carry predicate; the chains were measured on plain 32-bit
# results).
_UNMEASURED_FORMS = frozenset({"WIDE", "HI", "X"})


def table_covers(code: CodeFacts, p: int, x: int, hit: set, fixed: dict) -> bool:
    """Whether the table's latency of producer p applies to the read of `hit` by instruction x.
    The table (scheduler/latencies_sm90.py) measured dependent chains of plain arithmetic on the
    H100: FFMA chains, mad.lo chains, a setp+selp chain. It covers only such a pair: a latency
    measured there ([H100-UBENCH]: not the programming guide's figure, which the IADD3/LOP3 chain
    measured above), a plain 32-bit form of the producer (not IMAD.WIDE/.HI, not a carry .X),
    general registers (a predicate result, a carry, is not what was measured), and an arithmetic
    consumer of the producer's pipe reading them as operands. It does not cover a guard predicate (read when the
    instruction is issued or dispatched, not by the operand collector) nor a branch, barrier or
    memory consumer: ptxas puts 13 cycles between an ISETP and the `@P0 BRA` / `@P0 EXIT` that
    reads its predicate (sgemm_naive, ptxas 13), against 4 in the table, which matches maxas's
    "13 ... to immediately use a predicate" (maxas wiki "Control-Codes", Stall Counts). Such pairs
    are held to ptxas's own distance, and so is a warpgroup instruction (HGMMA, WARPGROUP.*),
    whose operands are not modelled. What made the rule this strict (H100, 2026-11-27): the stall
    pass cut IADD3 -> IADD3.X carry and ISETP predicate pairs in mma_gemm from 2 to 1 cycle and
    IMAD.HI from 6 to 4 under the looser rule; the kernel then faulted (cudaErrorInvalidAddressSpace),
    and hgemm hit an illegal instruction."""
    i, prod = code.ins[x], code.ins[p]
    known = fixed.get(prod.opcode)
    if known is None or known[1] != MEASURED_SOURCE or _UNMEASURED_FORMS & set(prod.modifiers):
        return False
    if any(space != "R" for space, _ in hit):
        return False
    if i.opcode not in fixed or i.opcode in CONTROL_OPCODES or MEMORY_OPCODE.match(i.opcode):
        return False
    if fixed[i.opcode][2] != known[2]:
        # the chains were measured within one pipe; a result crossing to another pipe comes later:
        # `IMAD.MOV.U32 R0, RZ, RZ, 0x3` (fmaheavy) -> `SHF.L.U32 R0, R0, UR16` (alu), cut from
        # ptxas's 5 cycles to the table's 4, read a stale R0 as hgemm's multicast mask and hung the
        # cluster (H100, 2026-11-27, fourth session: CLUSTER_N=2 at 7x13x5 tn)
        return False
    guard = i.predicate.lstrip("!") if i.predicate else None
    return not any(register_name(r) == guard for r in hit)


def fixed_latencies(table) -> dict[str, tuple[int, str, str]]:
    """SASS opcode -> (latency, source key, pipe) for the table's fixed-latency register results."""
    out: dict[str, tuple[int, str, str]] = {}
    for timing in table.values():
        if timing.variable or timing.pipe not in _FIXED_PIPES or timing.sass == "?":
            continue
        out.setdefault(timing.sass.split(".")[0], (timing.latency, timing.latency_src, timing.pipe))
    return out


def _variable_opcodes(table) -> frozenset[str]:
    return frozenset(t.sass.split(".")[0] for t in table.values() if t.variable)


class CodeFacts:
    """Per instruction: registers read and written (per source slot too), successors on the
    control-flow graph, and the control fields before (the kernel's) and after (`new_words`)."""

    def __init__(self, ins: list[SassInstruction], blocks, new_words: list[int]):
        self.ins = ins
        n = len(ins)
        self.succ: list[list[int]] = [[] for _ in range(n)]
        for b in blocks:
            for k in range(b.start, b.end - 1):
                self.succ[k] = [k + 1]
            self.succ[b.end - 1] = [blocks[s].start for s in b.successors]
        self.reads: list[set[Register]] = []
        self.writes: list[set[Register]] = []
        self.slot_regs: list[dict[int, set[Register]]] = []
        for i in ins:
            reads: set[Register] = set()
            writes: set[Register] = set()
            slots: dict[int, set[Register]] = {}
            if i.opcode not in UNMODELLED_OPCODES:
                if i.predicate and i.predicate.lstrip("!") not in ("PT", "UPT"):
                    reads |= operand_registers(i.opcode, i.modifiers, i.predicate.lstrip("!"), -1, False)
                for pos, op in enumerate(i.operands):
                    dest = pos < i.destinations
                    regs = operand_registers(i.opcode, i.modifiers, op, pos, dest)
                    if dest:
                        writes |= {r for r in regs if not op.lstrip().startswith("[")}
                        # an address inside a destination operand is read (not the case for
                        # ptxas's forms seen, kept for safety)
                        reads |= {r for r in regs if op.lstrip().startswith("[")}
                    else:
                        reads |= regs
                        slots[cb.source_slot(i.opcode, pos - i.destinations)] = regs
            self.reads.append(reads)
            self.writes.append(writes)
            self.slot_regs.append(slots)
        self.old = [cb.decode_control(i.word) for i in ins]
        self.new = [cb.decode_control(w) for w in new_words]
        # cycles from an instruction's issue to the next one's, at least one (no dual issue)
        self.gap_old = [max(f["stall"], 1) for f in self.old]
        self.gap_new = [max(f["stall"], 1) for f in self.new]

    def unconditional(self, k: int) -> bool:
        return self.ins[k].predicate in (None, "PT")


def _sb(fields: dict, kind: str) -> int | None:
    v = fields["write_barrier" if kind == "write" else "read_barrier"]
    return None if v == cb.NO_BARRIER else v


def _waits(fields: dict, sb: int) -> bool:
    return bool(fields["wait_mask"] >> sb & 1)


def _exposed(code: CodeFacts, p: int, sb: int | None, controls: list[dict]) -> tuple[set[int], set[int]]:
    """From producer p: (instructions reached with no wait on `sb` before or at them,
    instructions that wait on `sb` and are reached with no earlier wait)."""
    exposed: set[int] = set()
    waiters: set[int] = set()
    stack = list(code.succ[p])
    seen: set[int] = set()
    while stack:
        y = stack.pop()
        if y in seen:
            continue
        seen.add(y)
        if sb is not None and _waits(controls[y], sb):
            waiters.add(y)
            continue
        exposed.add(y)
        if y != p:
            stack.extend(code.succ[y])
    return exposed, waiters


def _register_consumers(code: CodeFacts, p: int, regs: set[Register], writers_only: bool) -> set[int]:
    """Instructions on some path from p that read (or, always, overwrite) one of `regs` before an
    unpredicated instruction has overwritten it."""
    out: set[int] = set()
    stack = [(s, frozenset(regs)) for s in code.succ[p]]
    seen: set[tuple[int, frozenset]] = set()
    while stack:
        x, live = stack.pop()
        if (x, live) in seen:
            continue
        seen.add((x, live))
        touched = code.writes[x] if writers_only else code.reads[x] | code.writes[x]
        if touched & live:
            out.add(x)
        if x == p:
            continue
        if code.unconditional(x):
            live = live - code.writes[x]
        if live:
            stack.extend((s, live) for s in code.succ[x])
    return out


def check_patch(kernel, new_words: list[int], table) -> CheckReport:
    """Hazards introduced by replacing the words of `kernel` (a sass.inspect.SassKernel of the
    input cubin) with `new_words`, one per instruction."""
    ins = kernel.instructions
    if len(new_words) != len(ins):
        raise ValueError(f"{kernel.name}: {len(new_words)} words for {len(ins)} instructions")
    report = CheckReport([])
    changed = [k for k, i in enumerate(ins) if i.word != new_words[k]]
    if not changed:
        return report
    if kernel.indirect_branches:
        k = changed[0]
        report.hazards.append(Hazard(kernel.name, ins[k].address, ins[k].text, "control-flow",
                                     "the kernel has an indirect branch (BRX/JMX): its paths are unknown, "
                                     "so no control-code patch to it can be checked"))
        return report
    code = CodeFacts(ins, kernel.blocks, new_words)
    _check_latency(kernel.name, code, table, report)
    _check_late_reads(kernel.name, code, table, report)
    _check_scoreboards(kernel.name, code, report)
    _check_setup(kernel.name, code, report)
    _check_reuse(kernel.name, code, report)
    _check_yield(kernel, code, report)
    return report


def next_steps(code: CodeFacts, p: int, x: int, path: tuple, live: frozenset) -> list[tuple]:
    """The search states after x on the forward paths from p: none back at p itself, and x's
    unconditional writes no longer live (a predicated write may not happen, so it ends nothing)."""
    if x == p:
        return []
    if code.unconditional(x):
        live = live - code.writes[x]
    return [(s, path + (x,), live) for s in code.succ[x]] if live else []


def late_read_paths(code: CodeFacts, variable: frozenset):
    """(reader p, overwriter x, path) for every write of a register that a variable-latency
    instruction with no read scoreboard reads: p reads its sources some cycles after it issues
    (HMMA's fragments, a load's address), and nothing but ptxas's spacing keeps x from overwriting
    them first. "Variable-latency" is the table's flag, so fixed-issue stores (STS, STG) are not
    among the readers here, though the table gives them a read latency (sass/block_deps.py holds
    those too, for the reorder pass). `path` holds p and every instruction before x on one control-flow path within
    FIXED_HORIZON instructions; the distance it must keep is ptxas's. Found on the H100: the stall
    pass brought `SEL R132, ...` closer to an `HMMA ... R132` above it in mma_gemm's main loop (the
    HMMAs there set no read scoreboard), and the kernel faulted."""
    for p, i in enumerate(code.ins):
        if not i.reachable or i.opcode not in variable or _sb(code.old[p], "read") is not None:
            continue
        live0 = frozenset(r for r in code.reads[p] if r[0] == "R")
        if not live0:
            continue
        stack = [(s, (p,), live0) for s in code.succ[p]]
        seen = set()
        while stack:
            x, path, live = stack.pop()
            if len(path) >= FIXED_HORIZON or (x, len(path), live) in seen:
                continue
            seen.add((x, len(path), live))
            if code.writes[x] & live:
                yield p, x, path
            stack.extend(next_steps(code, p, x, path, live))


def set_scoreboards(fields: dict) -> set[int]:
    """The scoreboards an instruction sets (write and read)."""
    return {v for v in (fields["write_barrier"], fields["read_barrier"]) if v != cb.NO_BARRIER}


def waited_scoreboards(ins: SassInstruction, fields: dict) -> set[int]:
    """The scoreboards an instruction waits on: its wait mask, and those a `DEPBAR.LE SBk, n` counts."""
    out = {k for k in range(cb.NUM_SCOREBOARDS) if fields["wait_mask"] >> k & 1}
    if ins.opcode == "DEPBAR":
        out |= {int(m) for m in _DEPBAR_SB.findall(ins.text)}
    return out


def setup_pairs(code: CodeFacts, fields: list[dict], gaps: list[int]):
    """(setter k, next instruction s, scoreboards) for every s that waits on a scoreboard k sets,
    on some path, less than SCOREBOARD_SETUP cycles after k issues (so the wait misses k)."""
    for k, i in enumerate(code.ins):
        if not i.reachable or gaps[k] >= SCOREBOARD_SETUP:
            continue
        sets = set_scoreboards(fields[k])
        if not sets:
            continue
        for s in code.succ[k]:
            hit = waited_scoreboards(code.ins[s], fields[s]) & sets
            if hit:
                yield k, s, hit


def setup_hazard(name: str, address: int, text: str, setter_address: int, setter_text: str,
                 scoreboards: set[int], distance: int, input_distance: int | None) -> Hazard:
    sbs = ", ".join(str(k) for k in sorted(scoreboards))
    had = f"ptxas had {input_distance}" if input_distance is not None else "ptxas did not put it there"
    return Hazard(name, address, text, "latency",
                  f"waits on scoreboard {sbs} {distance} cycle(s) after {setter_address:#06x} {setter_text} sets "
                  f"it, below the {SCOREBOARD_SETUP} cycles a scoreboard takes to become active (the wait "
                  f"would not see it; {had})",
                  {"producer": f"{setter_address:#06x}", "scoreboards": sorted(scoreboards), "distance": distance,
                   "input_distance": input_distance if input_distance is not None else SCOREBOARD_SETUP,
                   "latency": SCOREBOARD_SETUP})


def _check_setup(name: str, code: CodeFacts, report: CheckReport) -> None:
    """Rule 2's set-up delay: no pair of a setter and a waiter closer than SCOREBOARD_SETUP that
    the input did not have."""
    had = {(k, s): hit for k, s, hit in setup_pairs(code, code.old, code.gap_old)}
    for k, s, hit in setup_pairs(code, code.new, code.gap_new):
        if not hit <= had.get((k, s), set()):
            ins = code.ins
            report.hazards.append(setup_hazard(name, ins[s].address, ins[s].text, ins[k].address, ins[k].text,
                                               hit, code.gap_new[k], code.gap_old[k]))


def _check_late_reads(name: str, code: CodeFacts, table, report: CheckReport) -> None:
    if not any(n < o for o, n in zip(code.gap_old, code.gap_new)):
        return
    ins = code.ins
    flagged = set()
    for p, x, path in late_read_paths(code, _variable_opcodes(table)):
        d = sum(code.gap_new[k] for k in path)
        d0 = sum(code.gap_old[k] for k in path)
        if d < min(d0, FIXED_HORIZON) and (p, x) not in flagged:
            flagged.add((p, x))
            reg = register_name(sorted(code.writes[x] & code.reads[p])[0])
            report.hazards.append(Hazard(
                name, ins[x].address, ins[x].text, "latency",
                f"overwrites {reg} {d} cycles after {ins[p].address:#06x} {ins[p].text} read it, which sets no "
                f"read scoreboard (a variable-latency read, kept apart by ptxas's spacing: {d0} cycles on "
                f"this path)",
                {"producer": f"{ins[p].address:#06x}", "register": reg, "distance": d, "input_distance": d0,
                 "latency": None}))


def _check_latency(name: str, code: CodeFacts, table, report: CheckReport) -> None:
    if not any(n < o for o, n in zip(code.gap_old, code.gap_new)):
        return          # no stall shortened: no distance can fall below the input's
    fixed = fixed_latencies(table)
    variable = _variable_opcodes(table)
    ins = code.ins
    for p, i in enumerate(ins):
        if not i.reachable or not code.writes[p]:
            continue
        if _sb(code.old[p], "write") is not None:
            continue                                  # scoreboard-tracked: rule 2
        # a variable-latency result with no write scoreboard (ptxas leaves it off LDS, HMMA, LDSM
        # and covers their consumers by spacing or a later same-pipe wait: found by h35r) is held
        # to ptxas's spacing, as an opcode without a table latency is
        known = None if i.opcode in variable else fixed.get(i.opcode)
        # the search goes on past the table's latency: a consumer the table does not cover
        # (table_covers) is held to the input's spacing within the horizon
        need = FIXED_HORIZON
        stack = [(s, code.gap_new[p], code.gap_old[p], frozenset(code.writes[p])) for s in code.succ[p]]
        seen = set()
        flagged: set[int] = set()
        while stack:
            x, d, d0, live = stack.pop()
            if d >= need or (x, d, d0, live) in seen:
                continue
            seen.add((x, d, d0, live))
            hit = code.reads[x] & live
            if hit:
                report.checked_pairs += 1
                if known and d0 < known[0]:
                    report.below_table += 1
                # a pair the table does not describe (a guard or branch predicate, a control or
                # memory consumer: table_covers) is held to the input's spacing, as an opcode
                # without a table latency is
                covered = known is not None and table_covers(code, p, x, hit, fixed)
                bad = d < d0 and (d < known[0] if covered else d < FIXED_HORIZON)
                if bad and x not in flagged:
                    flagged.add(x)
                    reg = register_name(sorted(hit)[0])
                    where = (f"{i.opcode} latency {known[0]} cycles [{known[1]}, scheduler/latencies_sm90.py]"
                             if covered else f"{i.opcode} has no latency in the table: held to the input's spacing"
                             if not known else f"the table's {i.opcode} latency does not cover a read by "
                             f"{ins[x].opcode} (a predicate, control or memory consumer): held to the input's spacing")
                    report.hazards.append(Hazard(
                        name, ins[x].address, ins[x].text, "latency",
                        f"reads {reg} {d} cycles after {ins[p].address:#06x} {ins[p].text} wrote it "
                        f"({where}; the input had {d0} cycles on this path)",
                        {"producer": f"{ins[p].address:#06x}", "register": reg, "distance": d,
                         "input_distance": d0, "latency": known[0] if known else None}))
            if x == p:
                continue
            if code.unconditional(x):
                live = live - code.writes[x]
            if live:
                for s in code.succ[x]:
                    stack.append((s, d + code.gap_new[x], d0 + code.gap_old[x], live))


def depbar_scoreboards(ins) -> set[int]:
    """The scoreboards a reachable `DEPBAR.LE SBk, n` counts."""
    return {int(m) for i in ins if i.opcode == "DEPBAR" and i.reachable for m in _DEPBAR_SB.findall(i.text)}


def depbar_hazard(name: str, address: int, text: str, kind: str, old_sb: int, new_sb: int | None,
                  depbar_sbs: set[int]) -> Hazard | None:
    """A setter whose scoreboard a DEPBAR counts may not change scoreboard (the count would no
    longer include it); None when this one keeps it or no DEPBAR counts it."""
    if old_sb not in depbar_sbs or new_sb == old_sb:
        return None
    return Hazard(name, address, text, "depbar",
                  f"its {kind} scoreboard changes from {old_sb} to {_fmt(new_sb)}, but a DEPBAR "
                  f"counts scoreboard {old_sb}'s outstanding setters",
                  {"kind": kind, "input_scoreboard": old_sb, "scoreboard": new_sb})


def _check_scoreboards(name: str, code: CodeFacts, report: CheckReport) -> None:
    ins = code.ins
    dropped = 0         # scoreboards some instruction no longer waits on
    for o, n in zip(code.old, code.new):
        dropped |= o["wait_mask"] & ~n["wait_mask"]
    depbar_sbs = depbar_scoreboards(ins)
    for p, i in enumerate(ins):
        if not i.reachable:
            continue
        for kind in ("write", "read"):
            old_sb, new_sb = _sb(code.old[p], kind), _sb(code.new[p], kind)
            if old_sb is None:
                continue
            moved = depbar_hazard(name, i.address, i.text, kind, old_sb, new_sb, depbar_sbs)
            if moved is not None:
                report.hazards.append(moved)
                continue
            if new_sb == old_sb and not dropped >> old_sb & 1:
                continue        # same scoreboard, and waits on it only added: nothing newly exposed
            old_exposed, old_waiters = _exposed(code, p, old_sb, code.old)
            regs = code.writes[p] if kind == "write" else code.reads[p]
            by_regs = _register_consumers(code, p, regs, writers_only=kind == "read") if regs else set()
            deps = old_waiters | (by_regs - old_exposed)
            report.scoreboard_edges += len(deps)
            if not deps:
                continue
            new_exposed, _ = _exposed(code, p, new_sb, code.new) if new_sb is not None else (deps, set())
            bad = sorted(deps & new_exposed)
            if not bad:
                continue
            # One hazard per producer, at its first exposed dependant; the others are counted.
            x = bad[0]
            what = "overwrites a source of" if kind == "read" else "depends on the result of"
            others = f"; {len(bad) - 1} more dependant(s) exposed" if len(bad) > 1 else ""
            if new_sb is None:
                msg = (f"{what} {i.address:#06x} {i.text}, which no longer sets a {kind} scoreboard "
                       f"(the input set scoreboard {old_sb}){others}")
            else:
                msg = (f"{what} {i.address:#06x} {i.text} (variable latency, {kind} scoreboard {new_sb}) "
                       f"but a path reaches it with no wait on scoreboard {new_sb}: its wait mask is "
                       f"{_mask(code.new[x]['wait_mask'])}, the input's {_mask(code.old[x]['wait_mask'])}, "
                       f"and the input covered it with a wait on scoreboard {old_sb}{others}")
            report.hazards.append(Hazard(
                name, ins[x].address, ins[x].text, "scoreboard", msg,
                {"producer": f"{i.address:#06x}", "kind": kind, "input_scoreboard": old_sb,
                 "scoreboard": new_sb, "wait_mask": code.new[x]["wait_mask"],
                 "input_wait_mask": code.old[x]["wait_mask"],
                 "exposed": [f"{ins[k].address:#06x}" for k in bad]}))


def _mask(mask: int) -> str:
    """A wait mask as the inspector prints it: B01-3-- (scoreboard digits, `-` for not waited)."""
    return "B" + "".join(str(i) if mask >> i & 1 else "-" for i in range(cb.NUM_SCOREBOARDS))


def _fmt(sb: int | None) -> str:
    return "none" if sb is None else str(sb)


def _check_reuse(name: str, code: CodeFacts, report: CheckReport) -> None:
    ins = code.ins
    for k, i in enumerate(ins):
        added = code.new[k]["reuse"] & ~code.old[k]["reuse"]
        for slot in range(len(cb.REUSE_SLOTS)):
            if not added >> slot & 1:
                continue
            slot_name = cb.REUSE_SLOTS[slot]
            regs = code.slot_regs[k].get(slot)
            problem = None
            if not regs or any(space != "R" for space, _ in regs):
                problem = f"slot {slot_name} reads no general-purpose register"
            elif i.opcode not in cb.REUSE_OPCODES:
                problem = (f"ptxas never sets reuse on {i.opcode} in the code examined "
                           "(isa/control_bits.py REUSE_OPCODES): its effect there is unknown")
            elif cb.REUSE_NEEDS_YIELD_OFF and code.new[k]["yield"] == 0:
                problem = ("its yield hint is on, which voids the reuse cache (nvdisasm does not even "
                           "show the flag; isa/control_bits.py REUSE_NEEDS_YIELD_OFF)")
            elif i.opcode in BRANCHES or i.opcode in TERMINATORS:
                problem = f"{i.opcode} transfers control: the next instruction is not known"
            elif code.succ[k] != [k + 1]:
                problem = "the next instruction does not follow it on every path"
            elif regs & code.writes[k]:
                problem = (f"it overwrites {', '.join(register_name(r) for r in sorted(regs))}: the cache "
                           "would keep the old value")
            else:
                nxt = code.slot_regs[k + 1].get(slot)
                if nxt != regs:
                    got = ", ".join(register_name(r) for r in sorted(nxt)) if nxt else "nothing"
                    problem = (f"slot {slot_name} holds {', '.join(register_name(r) for r in sorted(regs))} "
                               f"but the next instruction ({ins[k + 1].address:#06x} {ins[k + 1].text}) "
                               f"reads {got} in slot {slot_name}")
            if problem:
                report.hazards.append(Hazard(name, i.address, i.text, "reuse",
                                             f"reuse flag on slot {slot_name}: {problem}",
                                             {"slot": slot_name}))


def _check_yield(kernel, code: CodeFacts, report: CheckReport) -> None:
    for lp in kernel.loops:
        body = lp.instruction_indices(kernel.blocks)
        had = [k for k in body if code.old[k]["yield"] == 0]
        has = [k for k in body if code.new[k]["yield"] == 0]
        if had and not has:
            first = kernel.instructions[body[0]]
            report.hazards.append(Hazard(
                kernel.name, first.address, first.text, "yield",
                f"loop {lp.index} ({len(body)} instructions) had {len(had)} instruction(s) with the yield "
                "hint on and the patch leaves none: a spinning warp would offer no switch point",
                {"loop": lp.index, "input_yields": len(had)}))
