"""What must stay where within the basic blocks of a SASS kernel: the dependency graph that the
reorder pass (sass/reorder_pass.py) schedules and that its checker (sass/reorder_check.py) proves
the result against. Built from ptxas's code alone, never from a schedule.

Anchors, instructions that never move (every other instruction stays on its side of them):
  - the last instruction of every block (branch, EXIT, or the fall-through into the next block);
  - control and synchronisation: branches, calls, EXIT/RET/KILL, BSSY/BSYNC/BREAK/BMOV, WARPSYNC,
    FENCE, NANOSLEEP, YIELD, NOP, LEPC (reads the program counter), ELECT, USETMAXREG (resizes the
    register file), PMTRAP, BPT, and every opcode with BAR in its name (BAR, DEPBAR, MEMBAR,
    ERRBAR, LDGDEPBAR, the cluster barriers UCGABAR_ARV/UCGABAR_WAIT, CGAERRBAR, ...);
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
  scoreboard  a sets scoreboard k (write or read) and b waits on k (its wait mask, or a DEPBAR.LE
            that counts k), or a waits on k and b sets it: each waiter keeps waiting for exactly
            the setters it waited for. A setter -> waiter edge is also enforced by stall counts:
            a scoreboard is active only one cycle after its setter issues, so the waiter stays at
            least min(2, ptxas's distance) cycles after it (hazards.SCOREBOARD_SETUP; the H100
            gave a wrong sgemm when the pass put a waiter 1 cycle after its setter).
  cover     b depends on a variable-latency producer (one with a scoreboard) that ptxas covered with
            a wait on an instruction w of b's block before b: w -> b (w stays before b). The
            dependants are found as sass/hazards.py finds them for its scoreboard rule.
  memory    every memory instruction keeps its order with every other one in the block (loads,
            stores, atomics, async copies, mbarrier operations; constant loads LDC/ULDC excepted,
            the constant banks being read-only in a kernel). Conservative: no address analysis.
  queue     the variable-latency instructions of one pipe (the table's `pipe`: lsu, tensor, xu, ...)
            keep their order. ptxas leaves the write scoreboard off many of them (sgemm's LDS.128,
            mma_gemm's HMMA) and covers their consumers with a wait on the scoreboard of a *later*
            instruction of the same pipe, relying on the pipe completing in order; moving one past
            that later one would uncover its consumers.
  queued    for such a producer without a scoreboard ("queued"), a consumer that ptxas covered
            (every path from the producer passes a wait on a scoreboard set by a later instruction
            of the same pipe: `queued_exposure`) stays after every waiting instruction of its
            block between the two; a consumer ptxas did not cover keeps ptxas's distance, up to
            FIXED_HORIZON, like a fixed-latency one whose latency the table lacks. The same holds
            on the read side ("queued-read"): an instruction that reads its sources after issue
            with no read scoreboard (stores, HMMA) has its overwriters held to ptxas's spacing, and
            those ptxas covered by a wait on a later same-pipe instruction's scoreboard stay after
            that wait too (the wait alone was not enough on the H100: `_war`).

Guard predicates: a predicate read as an instruction's guard (`@P0 IADD3 ...`) is held to ptxas's
spacing, up to FIXED_HORIZON, whatever the table says of its producer. The table's ISETP latency
(4 cycles) was measured with SEL reading the predicate as an operand; in the six shipped cubins
(ptxas 13.0) ptxas never puts the first instruction guarded by an ISETP's predicate closer than 13
cycles after it (779 such pairs within a block; first operand reads go down to 4, 82 of 233), so a
guard read has a longer latency that the table does not have yet (`guard_register`).

Each edge carries a latency for the scheduler: a fixed-latency RAW the table's latency (sass/
hazards.py fixed_latencies; FIXED_HORIZON-capped ptxas spacing for an opcode the table lacks),
a variable-latency RAW the table's latency (a priority only: the scoreboard enforces it), any
other edge 1 (order only). Edges enforced by stall counts (`stall`) are the ones the stall
recomputation must honour: a fixed-latency RAW, a WAW between fixed-latency writers, and a WAR
on a memory instruction that reads its sources after issue and sets no read scoreboard, and a
scoreboard setter -> waiter pair (the set-up delay).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ..isa import control_bits as cb
from ..isa.sass_registers import UNMODELLED_OPCODES
from .code_references import CodeReferences
from .decode import BRANCHES, TERMINATORS
from .hazards import (FIXED_HORIZON, MEASURED_SOURCE, SCOREBOARD_SETUP, CodeFacts, _exposed, _register_consumers,
                      _sb, fixed_latencies, table_covers, waited_scoreboards)

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
    kind: str           # raw | war | waw | scoreboard | cover | memory | queue
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
    code: CodeFacts | None = None                # registers and control fields of ptxas's code
    # (producer, "write"|"read") -> (its scoreboard, the dependants ptxas covered with a wait on it)
    dependants: dict[tuple[int, str], tuple[int, frozenset[int]]] = field(default_factory=dict)


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
    if ins.opcode in ANCHOR_OPCODES:
        return f"{ins.opcode} never moves"
    if "BAR" in ins.opcode:
        return f"{ins.opcode} is a barrier"
    if ins.opcode in _CLOCK_READERS and _CLOCK.search(ins.text):
        return "reads a clock"
    return None


def guard_register(ins) -> tuple[str, int] | None:
    """The predicate register an instruction is guarded by (`@!P3` -> ("P", 3)); None for none/PT."""
    g = (ins.predicate or "").lstrip("!")
    for space in ("UP", "P"):
        if g.startswith(space) and g[len(space):].isdigit() and int(g[len(space):]) != 7:
            return (space, int(g[len(space):]))
    return None


def variable_producer(code: CodeFacts, k: int, variable_ops: frozenset[str]) -> bool:
    """A variable-latency result: it sets a write scoreboard, or its opcode is variable-latency."""
    return _sb(code.old[k], "write") is not None or code.ins[k].opcode in variable_ops


def queued_producer(code: CodeFacts, k: int, variable_ops: frozenset[str]) -> bool:
    """A variable-latency result with no write scoreboard of its own (see `queued` above)."""
    return _sb(code.old[k], "write") is None and code.ins[k].opcode in variable_ops and bool(code.writes[k])


def pipes_of(code: CodeFacts, controls: list[dict], variable_ops, timing, table) -> list[str | None]:
    """The table's pipe of each variable-latency instruction (None for the others)."""
    return [lookup_timing(timing, i, table).pipe
            if i.opcode in variable_ops or controls[k]["write_barrier"] != cb.NO_BARRIER else None
            for k, i in enumerate(code.ins)]


def read_pipes_of(code: CodeFacts, controls: list[dict], timing, table) -> list[str | None]:
    """The table's pipe of each instruction that reads its sources after issue (None for others)."""
    return [lookup_timing(timing, i, table).pipe
            if lookup_timing(timing, i, table).read_latency or controls[k]["read_barrier"] != cb.NO_BARRIER
            else None for k, i in enumerate(code.ins)]


def queued_reader(code: CodeFacts, k: int, timing, table) -> bool:
    """Sources read after issue with no read scoreboard of its own (the read side of `queued`:
    ptxas covers an overwriter with a wait on a later same-pipe instruction's scoreboard)."""
    return bool(code.reads[k]) and _sb(code.old[k], "read") is None and \
        bool(lookup_timing(timing, code.ins[k], table).read_latency)


RESULT_RELEASE = ("write_barrier",)                   # a later result landed: p's has too
READ_RELEASE = ("write_barrier", "read_barrier")      # a later instruction read its sources: p did too


def queued_exposure(code: CodeFacts, p: int, pipes: list[str | None], controls: list[dict],
                    release: tuple[str, ...] = RESULT_RELEASE) -> set[int]:
    """Instructions reached from p along some path before any wait on a scoreboard that a later
    instruction of p's pipe set (its `release` fields) on that path."""
    exposed: set[int] = set()
    stack = [(s, frozenset()) for s in code.succ[p]]
    seen: set = set()
    while stack:
        y, armed = stack.pop()
        if (y, armed) in seen or y == p:
            continue
        seen.add((y, armed))
        mask = controls[y]["wait_mask"]
        if any(mask >> k & 1 for k in armed):
            continue
        exposed.add(y)
        if pipes[y] is not None and pipes[y] == pipes[p]:
            armed = armed | {controls[y][f] for f in release if controls[y][f] != cb.NO_BARRIER}
        stack.extend((t, armed) for t in code.succ[y])
    return exposed


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
    out.code = code
    out.dependants = scoreboard_dependants(code)
    fixed = fixed_latencies(table)
    variable_ops = variable_opcodes(table)
    pipes = pipes_of(code, code.old, variable_ops, out.timing, table)
    out.dependants.update(queued_dependants(code, pipes, variable_ops, out.timing, table))
    covers = _cover_edges(kernel, code, out.dependants)
    for b in kernel.blocks:
        if b.reachable:
            out.deps[b.index] = _block_edges(b, code, fixed, variable_ops, covers, out.timing, table,
                                             pipes, out.dependants)
    return out


def variable_opcodes(table) -> frozenset[str]:
    return frozenset(t.sass.split(".")[0] for t in table.values() if t.variable)


def queued_dependants(code: CodeFacts, pipes, variable_ops, timing, table
                      ) -> dict[tuple[int, str], tuple[None, frozenset[int]]]:
    """(producer, "queued") -> (None, the register consumers ptxas covered) for every queued
    producer, and (reader, "queued-read") -> (None, the overwriters of its sources ptxas covered)."""
    out = {}
    read_pipes = read_pipes_of(code, code.old, timing, table)
    for p, i in enumerate(code.ins):
        if not i.reachable:
            continue
        if queued_producer(code, p, variable_ops):
            consumers = _register_consumers(code, p, code.writes[p], writers_only=False)
            out[(p, "queued")] = (None, frozenset(consumers - queued_exposure(code, p, pipes, code.old)))
        if queued_reader(code, p, timing, table):
            overwriters = _register_consumers(code, p, code.reads[p], writers_only=True)
            exposed = queued_exposure(code, p, read_pipes, code.old, READ_RELEASE)
            out[(p, "queued-read")] = (None, frozenset(overwriters - exposed))
    return out


def scoreboard_dependants(code: CodeFacts) -> dict[tuple[int, str], tuple[int, frozenset[int]]]:
    """The dependants of every variable-latency producer in ptxas's code, found as sass/hazards.py
    rule 2 finds them: every instruction that waited on its scoreboard, reached with no earlier
    wait, and every reader/overwriter of its registers that a wait covered (overwriters of its
    sources for a read scoreboard)."""
    out = {}
    for p, i in enumerate(code.ins):
        if not i.reachable:
            continue
        for kind in ("write", "read"):
            sb = _sb(code.old[p], kind)
            if sb is None:
                continue
            exposed, waiters = _exposed(code, p, sb, code.old)
            regs = code.writes[p] if kind == "write" else code.reads[p]
            by_regs = _register_consumers(code, p, regs, writers_only=kind == "read") if regs else set()
            out[(p, kind)] = (sb, frozenset(waiters | (by_regs - exposed)))
    return out


def _cover_edges(kernel, code: CodeFacts, dependants) -> dict[int, set[int]]:
    """dependant -> the waiters (same block, before it) that cover it, for every variable-latency
    dependency ptxas covered with a wait."""
    block_of = {k: b for b in kernel.blocks for k in range(b.start, b.end)}
    out: dict[int, set[int]] = {}
    for (p, kind), (sb, found) in dependants.items():
        for x in found:
            blk = block_of[x]
            lo = p + 1 if block_of[p] is blk and p < x else blk.start
            if kind.startswith("queued"):
                # which wait covered it is not tracked: every waiting instruction in between
                for y in range(lo, x):
                    if code.old[y]["wait_mask"]:
                        out.setdefault(x, set()).add(y)
                continue
            if code.old[x]["wait_mask"] >> sb & 1:
                continue                    # it waits itself: the scoreboard edges keep it after p
            w = next((y for y in range(lo, x) if code.old[y]["wait_mask"] >> sb & 1), None)
            if w is not None:
                out.setdefault(x, set()).add(w)
    return out


def _block_edges(b, code: CodeFacts, fixed, variable_ops, covers, timing, table, pipes, dependants) -> list[Dep]:
    ins = code.ins
    gaps = code.gap_old
    edges: list[Dep] = []
    last_writers: dict = {}          # register -> writers since (and including) the last unconditional one
    readers: dict = {}               # register -> readers since the last write
    setters: dict[int, list[int]] = {}
    waiters: dict[int, list[int]] = {}
    last_memory: int | None = None
    last_of_pipe: dict[str, int] = {}
    for x in range(b.start, b.end):
        for r in code.reads[x]:
            for p in last_writers.get(r, ()):
                edges.append(_raw(code, p, x, r, fixed, variable_ops, timing, table, gaps, dependants))
        for r in code.writes[x]:
            for p in last_writers.get(r, ()):
                edges.append(_waw(code, p, x, r, fixed, variable_ops, gaps, dependants))
            for p in readers.get(r, ()):
                if p != x:
                    edges.append(_war(code, p, x, r, timing, table, gaps))
        waited = waited_scoreboards(ins[x], code.old[x])
        for sb in sorted(waited):
            # the wait sees a setter only SCOREBOARD_SETUP cycles after it issued
            edges.extend(Dep(s, x, "scoreboard", min(SCOREBOARD_SETUP, distance(gaps, s, x)), True, f"SB{sb}")
                         for s in setters.get(sb, ()))
        for sb in {_sb(code.old[x], "write"), _sb(code.old[x], "read")} - {None}:
            edges.extend(Dep(w, x, "scoreboard", 1, False, f"SB{sb}") for w in waiters.get(sb, ()) if w != x)
        for w in covers.get(x, ()):
            edges.append(Dep(w, x, "cover", 1, False, "wait covering a variable-latency dependency"))
        if is_memory(ins[x].opcode):
            if last_memory is not None:
                edges.append(Dep(last_memory, x, "memory", 1, False, "memory order"))
            last_memory = x
        if pipes[x] is not None:
            if pipes[x] in last_of_pipe:
                edges.append(Dep(last_of_pipe[pipes[x]], x, "queue", 1, False, f"{pipes[x]} pipe order"))
            last_of_pipe[pipes[x]] = x
        # bookkeeping after the edges, so an instruction never depends on itself
        for sb in waited:
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


def _uncovered_queued(code, p, x, variable_ops, dependants) -> bool:
    """p is a queued producer whose consumer x ptxas did not cover with a wait."""
    return queued_producer(code, p, variable_ops) and x not in dependants[(p, "queued")][1]


def _raw(code, p, x, r, fixed, variable_ops, timing, table, gaps, dependants) -> Dep:
    name = f"{r[0]}{r[1]}"
    if _uncovered_queued(code, p, x, variable_ops, dependants):
        return Dep(p, x, "raw", min(distance(gaps, p, x), FIXED_HORIZON), True, name)
    if variable_producer(code, p, variable_ops):
        return Dep(p, x, "raw", lookup_timing(timing, code.ins[p], table).latency, False, name)
    if guard_register(code.ins[x]) == r:
        return Dep(p, x, "raw", min(distance(gaps, p, x), FIXED_HORIZON), True, name + " (guard)")
    if not table_covers(code, p, x, {r}, fixed):
        # a pair the measured table does not describe (a carry, a wide or high product, another
        # pipe, a memory or control consumer: hazards.table_covers) keeps ptxas's spacing, as the
        # stall pass and the patch check hold it
        return Dep(p, x, "raw", min(distance(gaps, p, x), FIXED_HORIZON), True, name + " (not in the table)")
    return Dep(p, x, "raw", _fixed_need(code, p, fixed, gaps, x), True, name)


def _waw(code, p, x, r, fixed, variable_ops, gaps, dependants) -> Dep:
    name = f"{r[0]}{r[1]}"
    if _uncovered_queued(code, p, x, variable_ops, dependants):
        return Dep(p, x, "waw", min(distance(gaps, p, x), FIXED_HORIZON), True, name)
    if variable_producer(code, p, variable_ops):
        return Dep(p, x, "waw", 1, False, name)
    # two fixed-latency writers: the later must not land first; the table's latency says when only
    # for two writers of one measured pipe (the pipes' forwarding differs: hazards.table_covers)
    mine, later = fixed.get(code.ins[p].opcode), fixed.get(code.ins[x].opcode)
    if mine is None or later is None or mine[2] != later[2] or mine[1] != MEASURED_SOURCE:
        return Dep(p, x, "waw", min(distance(gaps, p, x), FIXED_HORIZON), True, name)
    return Dep(p, x, "waw", _fixed_need(code, p, fixed, gaps, x), True, name)


def _war(code, p, x, r, timing, table, gaps) -> Dep:
    name = f"{r[0]}{r[1]}"
    row = lookup_timing(timing, code.ins[p], table)
    if row.read_latency and _sb(code.old[p], "read") is None:
        # Sources read after issue with no read scoreboard: ptxas's spacing protects them, even
        # where a later same-pipe wait also covers the overwrite. Trusting that wait alone (an
        # order-only edge) let the pass put `IADD3 R9, R9, UR4` 3 cycles after `LDS.128 R48,
        # [R9+UR4+0x100]` (ptxas: 18) in sgemm BK=16 RQ=4 LOAD_AHEAD=1, which faulted on the H100.
        return Dep(p, x, "war", min(distance(gaps, p, x), FIXED_HORIZON), True, name)
    return Dep(p, x, "war", 1, False, name)
