"""What must stay where within the basic blocks of a SASS kernel: the dependency graph that the
reorder pass (sass/reorder_pass.py) schedules and that its checker (sass/reorder_check.py) proves
the result against. Built from ptxas's code alone, never from a schedule.

Anchors, instructions that never move (every other instruction stays on its side of them):
  - the last instruction of every block (branch, EXIT, or the fall-through into the next block);
  - control and synchronisation: branches, calls, EXIT/RET/KILL, BSSY/BSYNC/BREAK/BMOV, WARPSYNC,
    BAR, DEPBAR, MEMBAR, FENCE, ERRBAR, NANOSLEEP, YIELD, NOP, LEPC (reads the program counter),
    ELECT, USETMAXREG (resizes the register file), PMTRAP, BPT;
  - the warpgroup instructions (HGMMA and kin, WARPGROUP.*), which ptxas orders with
    arrive/depbar instructions rather than control codes and whose registers are not modelled
    (isa/sass_registers.py);
  - reads of the clocks (S2R/CS2R/S2UR of SR_CLOCK*, SR_GLOBALTIMER*): moving one changes what it
    measures;
  - every instruction whose offset the cubin names (.nv.info attributes, relocations:
    sass/code_references.py).

Edges a -> b (a before b in ptxas's order; b must stay after a), within one block:
  register  b reads what a writes (RAW), b overwrites what a reads (WAR) or writes (WAW), over R,
            UR, P and UP registers as isa/sass_registers.py names them (guards included). A
            predicated write does not end the previous write's live range.
  scoreboard  a sets scoreboard k (write or read) and b waits on k, or a waits on k and b sets it:
            each waiter keeps waiting for exactly the setters it waited for.
  cover     b depends on a variable-latency producer (one with a scoreboard) that ptxas covered with
            a wait on an instruction w of b's block before b: w -> b (w stays before b). The
            dependants are found as sass/hazards.py finds them for its scoreboard rule.
  memory    every memory instruction keeps its order with every other one in the block (loads,
            stores, atomics, async copies, mbarrier operations; constant loads LDC/ULDC excepted,
            the constant banks being read-only in a kernel). Conservative: no address analysis.

Each edge carries a latency for the scheduler: a fixed-latency RAW the table's latency (sass/
hazards.py fixed_latencies; FIXED_HORIZON-capped ptxas spacing for an opcode the table lacks),
a variable-latency RAW the table's latency (a priority only: the scoreboard enforces it), any
other edge 1 (order only). Edges enforced by stall counts (`stall`) are the ones the stall
recomputation must honour: a fixed-latency RAW, a WAW between fixed-latency writers, and a WAR
on a memory instruction that reads its sources after issue and sets no read scoreboard.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..isa import control_bits as cb
from ..isa.sass_registers import UNMODELLED_OPCODES
from .code_references import CodeReferences
from .decode import BRANCHES, TERMINATORS
from .hazards import FIXED_HORIZON, CodeFacts, _exposed, _register_consumers, _sb, fixed_latencies

ANCHOR_OPCODES = frozenset("""
    BRA BRX BRXU JMP JMX JMXU CALL RET EXIT KILL BSSY BSYNC BREAK BMOV WARPSYNC BAR DEPBAR MEMBAR
    FENCE ERRBAR NANOSLEEP YIELD NOP LEPC ELECT USETMAXREG PMTRAP BPT
""".split()) | UNMODELLED_OPCODES | BRANCHES | TERMINATORS
_CLOCK = re.compile(r"\bSR_(?:CLOCK|GLOBALTIMER)")
_CLOCK_READERS = frozenset({"S2R", "CS2R", "S2UR"})

# Memory instructions by opcode prefix [NVDIS: nvdisasm 13 opcodes]; LDC/ULDC read the constant
# banks, which no instruction of a kernel writes.
_MEMORY_PREFIXES = ("LD", "ST", "ATOM", "RED", "SULD", "SUST", "SUATOM", "SURED", "TEX", "TLD", "TMML",
                    "TXD", "TXQ", "CCTL", "SYNCS", "ARRIVES", "UTMA", "UBLK", "ACQBULK", "MATCH")
_NOT_MEMORY = frozenset({"LDC", "ULDC", "LEPC"})


def is_memory(opcode: str) -> bool:
    return opcode not in _NOT_MEMORY and opcode.startswith(_MEMORY_PREFIXES)


@dataclass(frozen=True)
class Dep:
    src: int            # kernel instruction indices, src before dst in ptxas's order
    dst: int
    kind: str           # raw | war | waw | scoreboard | cover | memory
    latency: int        # for the scheduler
    stall: bool         # enforced by stall counts (the checker measures the distance)
    what: str = ""


@dataclass
class BlockDeps:
    """The dependency facts of one kernel, as ptxas wrote it."""
    anchors: dict[int, str]                      # instruction index -> why it never moves
    deps: dict[int, list[Dep]]                   # block index -> its edges
    unmovable: str | None = None                 # why no instruction of the kernel may move
    timing: dict = field(default_factory=dict)   # opcode -> the table's Timing (scheduler's nodes)


def timing_by_opcode(table) -> dict[str, object]:
    """SASS opcode (with a width where the table tells widths apart: LDS.128) -> Timing row."""
    out: dict[str, object] = {}
    for t in table.values():
        if t.sass != "?":
            out.setdefault(t.sass, t)
            out.setdefault(t.sass.split(".")[0], t)
    return out


def lookup_timing(timing: dict, ins, table):
    for m in ins.modifiers:
        if f"{ins.opcode}.{m}" in timing:
            return timing[f"{ins.opcode}.{m}"]
    return timing.get(ins.opcode, table["OTHER"])


def anchor_reason(ins) -> str | None:
    if ins.opcode in ANCHOR_OPCODES or ins.opcode.split(".")[0] in ANCHOR_OPCODES:
        return f"{ins.opcode} never moves"
    if ins.opcode in _CLOCK_READERS and _CLOCK.search(ins.text):
        return "reads a clock"
    return None


def variable_producer(code: CodeFacts, k: int, variable_ops: frozenset[str]) -> bool:
    return _sb(code.old[k], "write") is not None or code.ins[k].opcode in variable_ops


def distance(gaps: list[int], a: int, b: int) -> int:
    """Issue distance from instruction a to a later instruction b of the same block."""
    return sum(gaps[a:b])


def build_deps(kernel, refs: CodeReferences, table) -> BlockDeps:
    ins = kernel.instructions
    anchors: dict[int, str] = {}
    out = BlockDeps(anchors, {}, timing=timing_by_opcode(table))
    if kernel.indirect_branches:
        out.unmovable = "the kernel has an indirect branch (BRX/JMX): its paths are unknown"
        return out
    if refs.unknown:
        out.unmovable = "; ".join(refs.unknown)
        return out
    for k, why in refs.anchored.items():
        if k < len(ins):
            anchors[k] = "named by " + ", ".join(why)
    for b in kernel.blocks:
        anchors.setdefault(b.end - 1, "last instruction of its block")
        for k in range(b.start, b.end):
            why = anchor_reason(ins[k])
            if why:
                anchors.setdefault(k, why)
    code = CodeFacts(ins, kernel.blocks, [i.word for i in ins])
    fixed = fixed_latencies(table)
    variable_ops = frozenset(t.sass.split(".")[0] for t in table.values() if t.variable)
    covers = _cover_edges(kernel, code)
    for b in kernel.blocks:
        if b.reachable:
            out.deps[b.index] = _block_edges(b, code, fixed, variable_ops, covers, out.timing, table)
    return out


def _cover_edges(kernel, code: CodeFacts) -> dict[int, set[int]]:
    """dependant -> the waiters (same block, before it) that cover it, for every variable-latency
    dependency ptxas covered with a wait."""
    ins = code.ins
    block_of = {k: b for b in kernel.blocks for k in range(b.start, b.end)}
    out: dict[int, set[int]] = {}
    for p, i in enumerate(ins):
        if not i.reachable:
            continue
        for kind in ("write", "read"):
            sb = _sb(code.old[p], kind)
            if sb is None:
                continue
            exposed, waiters = _exposed(code, p, sb, code.old)
            regs = code.writes[p] if kind == "write" else code.reads[p]
            by_regs = _register_consumers(code, p, regs, writers_only=kind == "read") if regs else set()
            for x in (by_regs - exposed) | waiters:
                if code.old[x]["wait_mask"] >> sb & 1:
                    continue                    # it waits itself: the scoreboard edges keep it after p
                blk = block_of[x]
                lo = p + 1 if block_of[p] is blk and p < x else blk.start
                w = next((y for y in range(lo, x) if code.old[y]["wait_mask"] >> sb & 1), None)
                if w is not None:
                    out.setdefault(x, set()).add(w)
    return out


def _block_edges(b, code: CodeFacts, fixed, variable_ops, covers, timing, table) -> list[Dep]:
    ins = code.ins
    gaps = code.gap_old
    edges: list[Dep] = []
    last_writers: dict = {}          # register -> writers since (and including) the last unconditional one
    readers: dict = {}               # register -> readers since the last write
    setters: dict[int, list[int]] = {}
    waiters: dict[int, list[int]] = {}
    last_memory: int | None = None
    for x in range(b.start, b.end):
        for r in code.reads[x]:
            for p in last_writers.get(r, ()):
                edges.append(_raw(code, p, x, r, fixed, variable_ops, timing, table, gaps))
        for r in code.writes[x]:
            for p in last_writers.get(r, ()):
                edges.append(_waw(code, p, x, r, fixed, variable_ops, gaps))
            for p in readers.get(r, ()):
                if p != x:
                    edges.append(_war(code, p, x, r, timing, table, gaps))
        mask = code.old[x]["wait_mask"]
        for sb in range(cb.NUM_SCOREBOARDS):
            if mask >> sb & 1:
                edges.extend(Dep(s, x, "scoreboard", 1, False, f"SB{sb}") for s in setters.get(sb, ()))
        for sb in {_sb(code.old[x], "write"), _sb(code.old[x], "read")} - {None}:
            edges.extend(Dep(w, x, "scoreboard", 1, False, f"SB{sb}") for w in waiters.get(sb, ()) if w != x)
        for w in covers.get(x, ()):
            edges.append(Dep(w, x, "cover", 1, False, "wait covering a variable-latency dependency"))
        if is_memory(ins[x].opcode):
            if last_memory is not None:
                edges.append(Dep(last_memory, x, "memory", 1, False, "memory order"))
            last_memory = x
        # bookkeeping after the edges, so an instruction never depends on itself
        for sb in range(cb.NUM_SCOREBOARDS):
            if mask >> sb & 1:
                waiters.setdefault(sb, []).append(x)
        for sb in {_sb(code.old[x], "write"), _sb(code.old[x], "read")} - {None}:
            setters.setdefault(sb, []).append(x)
        for r in code.reads[x]:
            readers.setdefault(r, []).append(x)
        for r in code.writes[x]:
            if code.unconditional(x):
                last_writers[r] = [x]
            else:
                last_writers.setdefault(r, []).append(x)
            readers[r] = []
    return edges


def _fixed_need(code: CodeFacts, p: int, fixed, gaps, x: int) -> int:
    known = fixed.get(code.ins[p].opcode)
    d0 = distance(gaps, p, x)
    # ptxas's own spacing where it is closer than the table (it knows forwarding paths the table
    # does not: sass/hazards.py rule 1); FIXED_HORIZON-capped ptxas spacing where the table is silent
    return min(d0, known[0] if known else FIXED_HORIZON)


def _raw(code, p, x, r, fixed, variable_ops, timing, table, gaps) -> Dep:
    name = f"{r[0]}{r[1]}"
    if variable_producer(code, p, variable_ops):
        return Dep(p, x, "raw", lookup_timing(timing, code.ins[p], table).latency, False, name)
    return Dep(p, x, "raw", _fixed_need(code, p, fixed, gaps, x), True, name)


def _waw(code, p, x, r, fixed, variable_ops, gaps) -> Dep:
    name = f"{r[0]}{r[1]}"
    if variable_producer(code, p, variable_ops):
        return Dep(p, x, "waw", 1, False, name)
    # two fixed-latency writers: the later must not land first
    return Dep(p, x, "waw", _fixed_need(code, p, fixed, gaps, x), True, name)


def _war(code, p, x, r, timing, table, gaps) -> Dep:
    name = f"{r[0]}{r[1]}"
    row = lookup_timing(timing, code.ins[p], table)
    if row.read_latency and _sb(code.old[p], "read") is None:
        # sources read after issue with no read scoreboard: ptxas's spacing protects them
        return Dep(p, x, "war", min(distance(gaps, p, x), FIXED_HORIZON), True, name)
    return Dep(p, x, "war", 1, False, name)
