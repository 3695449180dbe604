"""The reorder pass (issue 35, point 3, third of three): list-schedule the instructions of each
basic block of ptxas's SASS again, recompute their stall counts and reuse flags, and keep only
what the reorder checker (sass/reorder_check.py) proves safe. Opt-in (`asmgemm patch CUBIN
--reorder-pass --experimental-reorder -o OUT`, `plan_patch(..., reorder_pass=True)`). EXPERIMENTAL:
on the H100 (2026-11-27) a reordered sgemm faulted, and after one fix to the graph it still gave a
wrong result at BK=16 RQ=4 LOAD_AHEAD=1 (8192³'s configuration: right, 2.6% slower). The CPU audit
then found the missed dependency, the scoreboard set-up delay (a waiter put 1 cycle after its
setter: hazards.SCOREBOARD_SETUP), now in the graph and the check; the GPU has not confirmed it, so
the pass stays experimental. `limit` (ReorderLimit) applies part of it, for bisecting a wrong
result on the GPU (tools/reorder_bisect.py). The summary gives only the modelled issue cycles of
each loop body (sass/analysis.py), with "measured": false.

Per block (sass/cfg.py), bytes in, bytes out:
  1. The dependency graph of ptxas's code (sass/block_deps.py): register, scoreboard, cover,
     memory and pipe-order edges, and the anchors nothing crosses (the block's last instruction, branches,
     barriers, warpgroup instructions, clock reads, offsets named by .nv.info or a relocation).
  2. The stretches between anchors are list-scheduled with the project's PTX scheduler
     (scheduler/list_scheduler.py `list_schedule`: cycle-driven, critical-path priority with the
     measured latency table, ties to a pipe change and then to ptxas's order; deterministic). Its
     graph type is reused with SASS nodes (opcode -> the table's Timing row).
  3. Control fields travel with their instruction (scoreboards set and waited on, yield). Stall
     counts of a reordered block are recomputed: the gap the issue model (list_scheduler
     `simulate`) leaves after each instruction under the stall-enforced edges alone (pipes are not
     modelled there: the hardware holds an instruction whose pipe is busy by itself), at least 1;
     an instruction the table has no fixed latency for keeps at least ptxas's stall, and the
     block's last instruction keeps ptxas's stall (it feeds the next block). The pass runs after
     the rules and the other passes, so a stall a rule set inside a reordered block is replaced. The value is rounded
     up to one ptxas wrote on that opcode with that yield bit (`legal_stall`: nvdisasm decodes
     the stall and yield bits of some opcodes through tables of allowed values).
  4. Reuse flags are cleared wherever an instruction's next instruction changed and set again by
     the reuse pass's rule (sass/reuse_pass.py reuse_flags) on the new order.
  5. A block is kept only when the scheduler's model says its new order is faster (`simulate` of
     the whole block, variable latencies included) and its modelled issue cycles (sass/analysis.py:
     max(stall, 1) summed, plus bank conflicts) do not grow. The checker then judges the whole
     kernel: a latency hazard inside a block is first met by raising the stall just before the
     consumer; any block still involved in a hazard is put back as ptxas wrote it, and the check
     runs again until it passes (ptxas's own order always does). Last, `encodable` (nvdisasm, given
     by sass/patch.py) must read every word back as the moved instruction, or its block is put
     back. So the pass never hands out what the checker refuses; the summary counts the blocks it
     had to put back and those without a modelled gain.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable
from types import SimpleNamespace

from ..isa import control_bits as cb
from ..isa.arch import arch_for
from ..scheduler.depgraph import DepGraph, Edge
from ..scheduler.list_scheduler import list_schedule, simulate
from .analysis import analyse_banks, summarise
from .block_deps import BlockDeps, build_deps, lookup_timing
from .code_references import CodeReferences
from .hazards import FIXED_HORIZON, CheckReport, fixed_latencies
from .reorder_check import check_reordered, moved_instructions
from .reuse_pass import reuse_flags

FIXUP_ROUNDS = 3        # stall raises before a block is put back


@dataclass
class SassNode:
    """A scheduler node for one SASS instruction (the fields list_scheduler reads)."""
    index: int          # kernel instruction index
    latency: int
    issue: int
    pipe: str


@dataclass(frozen=True)
class ReorderLimit:
    """Apply only part of the pass, deterministically, to find which move breaks a kernel on the GPU
    (tools/reorder_bisect.py bisects over these). `blocks` = N: only the first N candidate blocks
    (the blocks whose new order the model says is faster, in block-index order) are reordered.
    `moves` = M: in the last of them, the new order is kept for the M positions from its first
    changed position on, and the rest of the block follows in ptxas's order. That is a legal order
    under the graph: a prefix of a topological order holds every predecessor of what it holds, the
    rest keeps ptxas's (topological) order, and anchors stay at their index (every instruction of the
    prefix comes from before the first anchor it has not reached). Stalls are recomputed for it as for
    any order, and the check judges it as any other. The limited block skips only the modelled-gain
    test (a probe is about correctness, not speed). None: no limit."""
    blocks: int | None = None
    moves: int | None = None

    def __post_init__(self):
        for name in ("blocks", "moves"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"reorder limit {name}: a whole number >= 1 (or None: no limit), not {v!r}")

    def to_json(self) -> dict:
        return {"blocks": self.blocks, "moves": self.moves}


@dataclass
class ReorderSummary:
    kernel: str
    moved: int = 0                       # instructions now at another index
    blocks_reordered: int = 0
    blocks_put_back: int = 0             # scheduled, but refused by the check and restored
    blocks_no_gain: int = 0              # the scheduler found another order, not faster in its model
    stalls_raised: int = 0               # latency fix-ups
    anchors: int = 0
    unmovable: str | None = None
    loops: list[dict] = field(default_factory=list)   # {"loop", "issue_cycles": [before, after]}
    # the blocks a ReorderLimit counts, in its order: {"block", "start" address, "first_change" (its
    # first position the new order changes), "span" (positions from there to its last change)}
    candidates: list[dict] = field(default_factory=list)
    limit: ReorderLimit | None = None

    def to_json(self) -> dict:
        return {"kernel": self.kernel, "instructions_moved": self.moved,
                "blocks_reordered": self.blocks_reordered, "blocks_put_back": self.blocks_put_back,
                "blocks_without_modelled_gain": self.blocks_no_gain,
                "stalls_raised": self.stalls_raised, "anchors": self.anchors,
                "unmovable": self.unmovable, "loops": self.loops, "candidates": self.candidates,
                "limit": self.limit.to_json() if self.limit else None, "measured": False}


def _segments(b, anchors) -> list[list[int]]:
    """Maximal runs of movable instructions of block b between its anchors."""
    out, cur = [], []
    for k in range(b.start, b.end):
        if k in anchors:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(k)
    if cur:
        out.append(cur)
    return out


def _graph(members: list[int], edges, kernel, deps: BlockDeps, table, stall_only: bool) -> DepGraph:
    """The scheduler's graph over `members`. stall_only: only the edges stall counts enforce, and
    no shared pipes (each node its own): the hardware holds an instruction whose pipe is busy by
    itself (a throttle stall), so a stall count need not."""
    local = {k: i for i, k in enumerate(members)}
    nodes = []
    for k in members:
        row = lookup_timing(deps.timing, kernel.instructions[k], table)
        nodes.append(SassNode(k, row.latency, row.issue, f"own{k}" if stall_only else row.pipe))
    g = DepGraph(nodes)
    for e in edges:
        if e.src in local and e.dst in local and (e.stall or not stall_only):
            g.add(Edge(local[e.src], local[e.dst], e.kind, e.latency, "stall" if e.stall else "order", e.what))
    g.finish()
    return g


def schedule_block(b, kernel, deps: BlockDeps, table) -> tuple[list[int], int, int]:
    """(the block's instruction indices in the scheduler's order, anchors in place; the modelled
    cycles of ptxas's order; of the new order). The model is the scheduler's issue model over the
    whole block (variable latencies and pipes included): list_scheduler `simulate`."""
    ptxas = list(range(b.start, b.end))
    order = list(ptxas)
    edges = deps.deps.get(b.index, [])
    for seg in _segments(b, deps.anchors):
        if len(seg) < 2:
            continue
        g = _graph(seg, edges, kernel, deps, table, stall_only=False)
        new = [seg[i] for i in list_schedule(g)]
        order[seg[0] - b.start: seg[-1] - b.start + 1] = new
    if order == ptxas:
        return order, 0, 0
    whole = _graph(ptxas, edges, kernel, deps, table, stall_only=False)
    before = simulate(whole, [k - b.start for k in ptxas]).cycles
    after = simulate(whole, [k - b.start for k in order]).cycles
    return order, before, after


def stall_values(kernel) -> dict[tuple[str, int], list[int]]:
    """(opcode, yield bit) -> the stall counts ptxas wrote on it in this kernel."""
    out: dict[tuple[str, int], set[int]] = {}
    for i in kernel.instructions:
        out.setdefault((i.opcode, i.yield_bit), set()).add(i.stall)
    return {k: sorted(v) for k, v in out.items()}


# nvdisasm decodes the stall and yield bits of some opcodes through a table of allowed values, and
# which values a table holds differs by opcode class (nvdisasm 13: S2R refuses stall 0 and 15 with
# the yield bit set, LDG refuses 15, LDS 14: "undefined value 0x1e for table 'TABLES_opex_0'").
# So a new stall is a value ptxas itself wrote on that opcode with that yield bit in this kernel:
# those are known to decode. verify_encoding (sass/patch.py) stays the last word.
def legal_stall(values: dict, ins, stall: int) -> int:
    """The least value >= `stall` that ptxas wrote on this opcode with this yield bit; when it wrote
    none that high, `stall` itself up to 14 (15 is the value refused most often), left to
    nvdisasm: a block whose words it cannot decode is put back (`encodable` of plan_reorder)."""
    seen = values.get((ins.opcode, ins.yield_bit), [ins.stall])
    return next((v for v in seen if v >= stall), min(max(stall, 1), cb.STALL.mask - 1))


def block_stalls(b, order: list[int], kernel, deps: BlockDeps, table, fixed, values) -> list[int]:
    """New stall of each position of block b under `order` (kernel indices)."""
    ins = kernel.instructions
    members = list(range(b.start, b.end))
    g = _graph(members, deps.deps.get(b.index, []), kernel, deps, table, stall_only=True)
    timeline = simulate(g, [k - b.start for k in order])
    gaps = timeline.gaps()
    out = []
    for i, k in enumerate(order):
        if i == len(order) - 1:
            out.append(ins[k].stall)
            continue
        stall = min(max(gaps[i], 1), cb.STALL.mask)
        if ins[k].opcode not in fixed:
            stall = max(stall, ins[k].stall)
        out.append(legal_stall(values, ins[k], stall))
    return out


class _Plan:
    """The kernel's words under a per-block choice of order; rebuilt as blocks are put back."""

    def __init__(self, kernel, words: list[int], deps: BlockDeps, table, target: str):
        self.kernel, self.words, self.deps, self.table, self.target = kernel, words, deps, table, target
        self.fixed = fixed_latencies(table)
        self.values = stall_values(kernel)
        self.orders: dict[int, list[int]] = {}       # block index -> order, for reordered blocks
        self.stalls: dict[int, list[int]] = {}
        self.raised = 0

    def origin(self) -> list[int]:
        out = list(range(len(self.words)))
        for bi, order in self.orders.items():
            b = self.kernel.blocks[bi]
            out[b.start:b.end] = order
        return out

    def set_block(self, b, order: list[int]) -> None:
        self.orders[b.index] = order
        self.stalls[b.index] = block_stalls(b, order, self.kernel, self.deps, self.table, self.fixed,
                                             self.values)

    def put_back(self, bi: int) -> None:
        self.orders.pop(bi, None)
        self.stalls.pop(bi, None)

    def new_words(self) -> list[int]:
        n = len(self.kernel.instructions)
        origin = self.origin()
        words = [self.words[origin[i]] for i in range(n)]
        for bi, stalls in self.stalls.items():
            b = self.kernel.blocks[bi]
            for i, stall in zip(range(b.start, b.end), stalls):
                words[i] = cb.STALL.insert(words[i], stall)
        # reuse: clear flags whose next instruction changed, then set what the reuse rule allows
        cleared = [k for k in range(n) if not (origin[k] == k and (k + 1 >= n or origin[k + 1] == k + 1))]
        for k in cleared:
            words[k] = cb.REUSE.insert(words[k], 0)
        moved = moved_instructions(self.kernel, origin)
        for k, w in enumerate(words):
            lo, hi = cb.halves_of(w)
            f = cb.decode_control(w)
            moved[k].lo, moved[k].hi, moved[k].reuse, moved[k].stall = lo, hi, f["reuse"], f["stall"]
        flags = reuse_flags(SimpleNamespace(instructions=moved, blocks=self.kernel.blocks))
        for k in cleared:
            if k in flags:
                words[k] = cb.REUSE.insert(words[k], flags[k])
        return words


def ptxas_issue_cycles(kernel, bi: int) -> int:
    """sass/analysis.py's issue cycles of one block of ptxas's code (the inspector's bank analysis)."""
    b = kernel.blocks[bi]
    return sum(max(i.stall, 1) + (1 if i.bank_conflict else 0) for i in kernel.instructions[b.start:b.end])


def _with_words(kernel, origin: list[int], new_words: list[int]) -> list:
    """The moved instructions carrying their new control fields."""
    moved = moved_instructions(kernel, origin)
    for k, w in enumerate(new_words):
        f = cb.decode_control(w)
        moved[k].lo, moved[k].hi = cb.halves_of(w)
        moved[k].stall, moved[k].reuse, moved[k].yield_ = f["stall"], f["reuse"], f["yield"] == 0
    return moved


def block_issue_cycles(kernel, origin, new_words, target: str, blocks: list[int]) -> dict[int, int]:
    moved = _with_words(kernel, origin, new_words)
    chosen = [kernel.blocks[bi] for bi in blocks]
    analyse_banks(moved, chosen, arch_for(target).bank_model)
    return {b.index: sum(max(i.stall, 1) + (1 if i.bank_conflict else 0) for i in moved[b.start:b.end])
            for b in chosen}


def _hazard_blocks(report: CheckReport, kernel) -> set[int]:
    """Blocks a hazard points at: the instruction's, and its producer's where it names one."""
    block_of = {}
    for b in kernel.blocks:
        for k in range(b.start, b.end):
            block_of[k] = b.index
    out = set()
    for h in report.hazards:
        out.add(block_of.get(h.address // 16, 0))
        producer = h.numbers.get("producer")
        if producer:
            out.add(block_of.get(int(producer, 16) // 16, 0))
        for a in h.numbers.get("exposed", []):
            out.add(block_of.get(int(a, 16) // 16, 0))
    return out


def _raise_stalls(plan: _Plan, report: CheckReport) -> bool:
    """Meet latency hazards inside reordered blocks by raising the stall just before the consumer.
    True when something was raised."""
    raised = False
    for h in report.hazards:
        if h.kind != "latency" or h.numbers.get("distance") is None:
            continue
        x = h.address // 16
        for bi in plan.orders:
            b = plan.kernel.blocks[bi]
            if b.start < x < b.end:
                need = min(h.numbers["input_distance"], h.numbers.get("latency") or FIXED_HORIZON)
                deficit = need - h.numbers["distance"]
                i = x - 1 - b.start
                before = plan.kernel.instructions[plan.orders[bi][i]]
                stall = legal_stall(plan.values, before, plan.stalls[bi][i] + deficit)
                if deficit > 0 and stall >= plan.stalls[bi][i] + deficit:
                    plan.stalls[bi][i] = stall
                    plan.raised += 1
                    raised = True
                break
    return raised


@dataclass
class PreparedReorder:
    """What the pass derives from ptxas's code alone: the graph and each block's scheduled order."""
    deps: BlockDeps
    schedules: dict[int, tuple[list[int], int, int]]    # block -> (order, modelled before, after)

    def candidates(self, kernel) -> list[int]:
        """Blocks whose new order the model says is faster, in block-index order (ReorderLimit's)."""
        return [bi for bi, (order, before, after) in sorted(self.schedules.items())
                if order != list(range(kernel.blocks[bi].start, kernel.blocks[bi].end)) and after < before]


# The graph and the schedules are the slow part (tens of seconds for sgemm) and depend only on
# ptxas's code, so a bisect (tools/reorder_bisect.py: one plan_patch per probe, the same input each
# time) derives them once per process. Keyed by everything they are computed from.
_PREPARED: OrderedDict = OrderedDict()
_PREPARED_KEPT = 4


def prepare_reorder(kernel, refs: CodeReferences, table, target: str) -> PreparedReorder:
    h = hashlib.sha256()
    for i in kernel.instructions:
        h.update(i.word.to_bytes(16, "little"))
    key = (kernel.name, target, h.hexdigest(), tuple(sorted((k, tuple(v)) for k, v in refs.anchored.items())),
           tuple(refs.unknown), hashlib.sha256(repr(sorted(table.items())).encode()).hexdigest())
    hit = _PREPARED.get(key)
    if hit is not None:
        _PREPARED.move_to_end(key)
        return hit
    deps = build_deps(kernel, refs, table)
    schedules = {}
    if deps.unmovable is None:
        for b in kernel.blocks:
            if b.reachable:
                schedules[b.index] = schedule_block(b, kernel, deps, table)
    prepared = PreparedReorder(deps, schedules)
    _PREPARED[key] = prepared
    while len(_PREPARED) > _PREPARED_KEPT:
        _PREPARED.popitem(last=False)
    return prepared


def changed_span(b, order: list[int]) -> tuple[int, int]:
    """(first position of block b where `order` differs from ptxas's, positions from there to the
    last one that differs); (0, 0) for ptxas's own order."""
    changed = [i for i, k in enumerate(order) if k != b.start + i]
    return (changed[0], changed[-1] - changed[0] + 1) if changed else (0, 0)


def limited_order(b, order: list[int], moves: int) -> list[int]:
    """ReorderLimit.moves: `order` kept for `moves` positions from its first change, the rest of
    block b in ptxas's order."""
    first, _span = changed_span(b, order)
    head = order[:first + moves]
    taken = set(head)
    return head + [k for k in range(b.start, b.end) if k not in taken]


def plan_reorder(kernel, words: list[int], refs: CodeReferences, table, target: str,
                 encodable: Callable[[list[int], list[int]], list[int]] | None = None,
                 limit: ReorderLimit | None = None
                 ) -> tuple[list[int], list[int], ReorderSummary, CheckReport]:
    """(origin, new words, summary, check) for one kernel. `words` are its current words (rules and
    other passes applied); origin[i] is the index whose word now sits at i. `encodable(origin,
    words)`, when given, returns the indices nvdisasm cannot read back as the moved instructions
    (sass/patch.py passes one); their blocks are put back."""
    ins = kernel.instructions
    words = list(words[:len(ins)])
    prepared = prepare_reorder(kernel, refs, table, target)
    deps = prepared.deps
    summary = ReorderSummary(kernel.name, anchors=len(deps.anchors), unmovable=deps.unmovable, limit=limit)
    plan = _Plan(kernel, words, deps, table, target)
    candidates = prepared.candidates(kernel)
    for bi in candidates:
        b = kernel.blocks[bi]
        first, span = changed_span(b, prepared.schedules[bi][0])
        summary.candidates.append({"block": bi, "start": f"{16 * b.start:#06x}", "first_change": first, "span": span})
    # only a block the model says gains is reordered: the pass ships only where it wins
    summary.blocks_no_gain = sum(1 for bi, (order, _b, _a) in prepared.schedules.items()
                                 if bi not in candidates and order != list(range(kernel.blocks[bi].start,
                                                                                  kernel.blocks[bi].end)))
    chosen = candidates[:limit.blocks] if limit and limit.blocks else candidates
    partial = None                      # the block a moves limit cuts: exempt from the gain test only
    for bi in chosen:
        order = list(prepared.schedules[bi][0])
        if limit and limit.moves and bi == chosen[-1]:
            order, partial = limited_order(kernel.blocks[bi], order, limit.moves), bi
        plan.set_block(kernel.blocks[bi], order)
    scheduled = len(plan.orders)
    rounds = 0
    while True:
        origin, new_words = plan.origin(), plan.new_words()
        report = check_reordered(kernel, deps, origin, new_words, table)
        if report.hazards and plan.orders:
            if rounds < FIXUP_ROUNDS and _raise_stalls(plan, report):
                rounds += 1
                continue
            blocks = _hazard_blocks(report, kernel) & set(plan.orders)
            for bi in (blocks or list(plan.orders)):
                plan.put_back(bi)
            continue
        # a block whose modelled issue cycles (stalls and bank conflicts, sass/analysis.py) now
        # exceed ptxas's is no win: put it back
        cycles = block_issue_cycles(kernel, origin, new_words, target, list(plan.orders))
        worse = [bi for bi, c in cycles.items() if c > ptxas_issue_cycles(kernel, bi) and bi != partial]
        if not worse and encodable is not None and plan.orders:
            bad = encodable(origin, new_words)
            worse = sorted({bi for bi in plan.orders for k in bad
                            if kernel.blocks[bi].start <= k < kernel.blocks[bi].end}) or \
                (list(plan.orders) if bad else [])
            for bi in worse:
                plan.put_back(bi)
            if worse:
                continue
        if not worse:
            break
        for bi in worse:
            plan.put_back(bi)
            summary.blocks_no_gain += 1
            scheduled -= 1
    summary.moved = sum(1 for i, j in enumerate(origin) if i != j)
    summary.blocks_reordered = len(plan.orders)
    summary.blocks_put_back = scheduled - len(plan.orders)
    summary.stalls_raised = plan.raised
    summary.loops = loop_issue_cycles(kernel, origin, new_words, target)
    return origin, new_words, summary, report


def loop_issue_cycles(kernel, origin: list[int], new_words: list[int], target: str) -> list[dict]:
    """Each loop body's modelled issue cycles (sass/analysis.py: max(stall, 1) summed, plus one per
    bank conflict) in ptxas's code and in the new one."""
    moved = _with_words(kernel, origin, new_words)
    analyse_banks(moved, kernel.blocks, arch_for(target).bank_model)
    out = []
    for lp, before in zip(kernel.loops, kernel.loop_summaries):
        after = summarise([moved[k] for k in lp.instruction_indices(kernel.blocks)])
        out.append({"loop": lp.index, "instructions": after.instructions,
                    "issue_cycles": [before.issue_cycles, after.issue_cycles]})
    return out
