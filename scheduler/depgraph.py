"""The dependency graph of one .schedule region: which instruction must stay before which, and how
many cycles apart.

Nodes are the region's instructions in source order. An edge a -> b says "b may not issue before
a has issued plus `latency` cycles"; `enforce` says what enforces it on the hardware, which the
control-code model needs:
  'stall'        a fixed-latency result: the stall counts of the instructions in between
  'scoreboard-w' a variable-latency result (RAW, WAW): b waits on a's write scoreboard
  'scoreboard-r' a variable-latency source read (WAR): b waits on a's read scoreboard
  'hardware'     cp.async.wait_group waiting for copies (the wait instruction itself blocks)
  'order'        only the order matters (memory order, barriers, pinned instructions)

Registers are compared by name (the module is register-allocated): a vector operand counts each
element, a `p|q` pair both halves, an address its base register, and a guard its predicate.
Memory: accesses in different state spaces never conflict; two accesses to the same space
conflict unless both only read, one space is read-only in a kernel (param, const, .nc), or the
addresses provably differ: the same symbol or the same base register (not redefined in between)
with non-overlapping [offset, offset+size), or two different symbols. `generic` conflicts with
shared, global and local.

Instructions that never move (bar/barrier, anything .pin'ned, calls, wgmma, clock reads) are
edges to everything: every instruction before one stays before it, every one after stays after.
Memory fences (membar/fence, mbarrier, acquire/release accesses, unclassified opcodes) keep their
order with every memory operation but let register-only instructions move across them.
Labels and branches inside a region are errors: a region is straight-line code.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from asmgemm import ir
from asmgemm.errors import AsmError
from asmgemm.isa.ptx_operands import defs_and_uses

from .classify import FENCE, FIXED, Kind, MemAccess, classify
from .latencies_sm90 import Timing


@dataclass
class Node:
    index: int                      # position in the region's source order
    instr: ir.Instruction
    kind: Kind
    timing: Timing
    defs: tuple[str, ...]
    uses: tuple[str, ...]
    issue: int                      # pipe occupancy, cycles
    placement: str                  # FREE / FENCE / FIXED (pinned instructions are FIXED)

    @property
    def latency(self) -> int:
        return self.timing.latency

    @property
    def variable(self) -> bool:
        return self.timing.variable

    @property
    def pipe(self) -> str:
        return self.timing.pipe

    def text(self) -> str:
        return self.instr.render()


@dataclass(frozen=True)
class Edge:
    src: int
    dst: int
    kind: str          # 'raw', 'war', 'waw', 'mem', 'fixed', 'fence', 'order', 'async'
    latency: int
    enforce: str       # 'stall', 'scoreboard-w', 'scoreboard-r', 'hardware', 'order'
    what: str = ""     # register name or memory description, for reports and tests


@dataclass
class DepGraph:
    nodes: list[Node]
    edges: list[Edge] = field(default_factory=list)
    preds: list[list[Edge]] = field(default_factory=list)
    succs: list[list[Edge]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.nodes)

    def add(self, e: Edge) -> None:
        if e.src == e.dst:
            return
        assert e.src < e.dst, "edges follow source order"
        self.edges.append(e)

    def finish(self) -> None:
        # Merge parallel edges with the same enforcement, keeping the longest latency, so the
        # graph stays small; the kinds are kept for explanations.
        best: dict[tuple[int, int, str], Edge] = {}
        for e in self.edges:
            k = (e.src, e.dst, e.enforce)
            if k not in best or e.latency > best[k].latency:
                best[k] = e
        self.edges = sorted(best.values(), key=lambda e: (e.src, e.dst, e.enforce))
        self.preds = [[] for _ in self.nodes]
        self.succs = [[] for _ in self.nodes]
        for e in self.edges:
            self.preds[e.dst].append(e)
            self.succs[e.src].append(e)

    def respects(self, order: list[int]) -> list[Edge]:
        """The edges that `order` (a permutation of node indices) violates; empty when valid."""
        pos = {n: i for i, n in enumerate(order)}
        return [e for e in self.edges if pos[e.src] >= pos[e.dst]]

    def heights(self) -> list[int]:
        """Latency-weighted longest path from each node to the end of the region (its own latency
        included): the list scheduler's priority."""
        h = [0] * len(self.nodes)
        for i in range(len(self.nodes) - 1, -1, -1):
            best = max(1, self.nodes[i].latency)
            for e in self.succs[i]:
                best = max(best, e.latency + h[e.dst])
            h[i] = best
        return h

    def critical_path(self) -> int:
        """The longest latency-weighted path, counting one cycle for the last instruction's
        issue (not its result latency): no order can issue the region in fewer cycles. Comparable
        with the issue span (Timeline.cycles)."""
        h = [1] * len(self.nodes)
        for i in range(len(self.nodes) - 1, -1, -1):
            for e in self.succs[i]:
                h[i] = max(h[i], e.latency + h[e.dst])
        return max(h, default=0)

    def lower_bound(self) -> int:
        """No order issues faster than its critical path, than one instruction per cycle, or than
        the busiest pipe allows."""
        busy: dict[str, int] = {}
        for n in self.nodes:
            busy[n.pipe] = busy.get(n.pipe, 0) + n.issue
        last_issue = {p: min(n.issue for n in self.nodes if n.pipe == p) for p in busy}
        pipe_bound = max((b - last_issue[p] + 1 for p, b in busy.items()), default=0)
        return max(self.critical_path(), len(self.nodes), pipe_bound)


def _region_error(item, what: str) -> AsmError:
    span = getattr(item, "span", None)
    return AsmError(f"{what} inside a .schedule region: regions must be straight-line code "
                    "(move it outside .schedule/.endschedule)", span)


def check_region_item(item) -> None:
    """Raise an AsmError for anything a region may not contain (labels, control flow, scopes)."""
    if isinstance(item, ir.Label):
        raise _region_error(item, f"label '{item.name}'")
    if isinstance(item, (ir.ScopeOpen, ir.ScopeClose)):
        raise _region_error(item, "a { } scope")
    if isinstance(item, ir.ScheduleRegion):
        raise _region_error(item, "a nested .schedule region")
    if isinstance(item, ir.Instruction):
        kind = classify(item)
        if kind.control:
            raise _region_error(item, f"control transfer '{item.opcode}'")


def _disjoint(a: MemAccess, va: int, b: MemAccess, vb: int) -> bool:
    """True when two accesses provably touch different bytes."""
    if a.base is None or b.base is None:
        return False
    if a.base_is_reg != b.base_is_reg:
        return False
    if not a.base_is_reg:
        if a.base != b.base:
            return a.base != "<absolute>" and b.base != "<absolute>"   # two different variables
    elif a.base != b.base or va != vb:
        return False
    if a.size is None or b.size is None:
        return False
    return a.offset + a.size <= b.offset or b.offset + b.size <= a.offset


def _conflict(a: MemAccess, va: int, b: MemAccess, vb: int) -> bool:
    if not (a.writes or b.writes):
        return False
    if a.read_only or b.read_only:
        return False
    if a.space != b.space and "generic" not in (a.space, b.space) and "all" not in (a.space, b.space):
        return False
    if {a.space, b.space} & {"param", "const"}:
        return False
    return not _disjoint(a, va, b, vb)


_ALL = MemAccess("all", True, True)


def build_graph(instrs: list[ir.Instruction], table: dict[str, Timing]) -> DepGraph:
    """The dependency graph of a region's instructions (source order)."""
    nodes: list[Node] = []
    for i, ins in enumerate(instrs):
        check_region_item(ins)
        kind = classify(ins)
        timing = table.get(kind.cls, table["OTHER"])
        d, u = defs_and_uses(ins)
        placement = FIXED if ins.pinned else kind.placement
        issue = kind.issue_override if kind.issue_override is not None else timing.issue
        nodes.append(Node(i, ins, kind, timing, tuple(dict.fromkeys(r.name for r in d)),
                          tuple(dict.fromkeys(r.name for r in u)), issue, placement))
    g = DepGraph(nodes)
    _register_edges(g)
    _memory_edges(g)
    _placement_edges(g)
    _order_tag_edges(g)
    _async_copy_edges(g)
    g.finish()
    return g


def _register_edges(g: DepGraph) -> None:
    # writers[r]: the writes a later reader may see (the last unconditional one and the guarded
    # ones after it); readers[r]: reads since the last unconditional write.
    writers: dict[str, list[int]] = {}
    readers: dict[str, list[int]] = {}
    for j, nj in enumerate(g.nodes):
        for r in nj.uses:
            for p in writers.get(r, ()):
                np_ = g.nodes[p]
                g.add(Edge(p, j, "raw", np_.latency,
                           "scoreboard-w" if np_.variable else "stall", r))
        for r in nj.defs:
            for p in readers.get(r, ()):
                if p == j:
                    continue
                np_ = g.nodes[p]
                if np_.timing.read_latency > 0:
                    g.add(Edge(p, j, "war", np_.timing.read_latency, "scoreboard-r", r))
                else:
                    g.add(Edge(p, j, "war", 1, "order", r))
            for p in writers.get(r, ()):
                np_ = g.nodes[p]
                lat = max(1, np_.latency - nj.latency + 1)
                g.add(Edge(p, j, "waw", lat, "scoreboard-w" if np_.variable else "stall", r))
        for r in nj.uses:
            readers.setdefault(r, []).append(j)
        for r in nj.defs:
            if nj.instr.guard is None:
                writers[r] = [j]
                readers[r] = []
            else:
                writers.setdefault(r, []).append(j)


def _memory_edges(g: DepGraph) -> None:
    # Version of each register at each instruction, so that "same base register" means "same
    # address value" only while the base is not redefined.
    version: dict[str, int] = {}
    accesses: list[tuple[int, MemAccess, int]] = []      # (node, access, base version)
    for j, nj in enumerate(g.nodes):
        mine = list(nj.kind.mem)
        if nj.placement == FENCE:
            mine.append(_ALL)
        if nj.kind.cls == "DEPBAR":
            # cp.async.wait_*: makes the copies visible; shared accesses keep their side of it.
            mine.append(MemAccess("shared", True, True))
        cur = [(m, version.get(m.base, 0) if m.base_is_reg else 0) for m in mine]
        for (a_node, a, va) in accesses:
            for (b, vb) in cur:
                if _conflict(a, va, b, vb):
                    g.add(Edge(a_node, j, "mem", 1, "order",
                               f"{a.space}:{'w' if a.writes else 'r'}->{'w' if b.writes else 'r'}"))
                    break
        for (b, vb) in cur:
            accesses.append((j, b, vb))
        for r in nj.defs:
            version[r] = version.get(r, 0) + 1


def _placement_edges(g: DepGraph) -> None:
    """Fixed instructions: everything between two fixed instructions stays between them."""
    fixed = [i for i, n in enumerate(g.nodes) if n.placement == FIXED]
    if not fixed:
        return
    bounds = [-1] + fixed + [len(g.nodes)]
    for k, f in enumerate(fixed):
        lo, hi = bounds[k], bounds[k + 2]
        for i in range(lo + 1, f):
            g.add(Edge(i, f, "fixed", 1, "order"))
        for i in range(f + 1, hi):
            g.add(Edge(f, i, "fixed", 1, "order"))
        if lo >= 0:
            g.add(Edge(lo, f, "fixed", 1, "order"))


def _order_tag_edges(g: DepGraph) -> None:
    """Same-tag instructions: chain instructions keep their order among themselves; a member stays
    after the chain instruction before it and before the one after it (a cp.async copy stays in
    the group its commit closes) but members move freely among themselves."""
    last_chain: dict[str, int] = {}
    members: dict[str, list[int]] = {}
    for j, nj in enumerate(g.nodes):
        tag = nj.kind.order_tag
        if not tag:
            continue
        if nj.kind.order_role == "member":
            if tag in last_chain:
                g.add(Edge(last_chain[tag], j, "order", 1, "order", tag))
            members.setdefault(tag, []).append(j)
            continue
        if tag in last_chain:
            g.add(Edge(last_chain[tag], j, "order", 1, "order", tag))
        for m in members.pop(tag, []):
            g.add(Edge(m, j, "order", 1, "order", tag))
        last_chain[tag] = j


def _imm_int(op) -> int | None:
    if isinstance(op, ir.Imm):
        if isinstance(op.value, int):
            return op.value
        try:
            return int(op.text, 0)
        except ValueError:
            return None
    return None


def _async_copy_edges(g: DepGraph) -> None:
    """cp.async.wait_group N waits for every committed group but the newest N (wait_all: for every
    copy): those copies' completion latency becomes an edge to the wait."""
    groups: list[list[int]] = []       # committed groups in this region, oldest first
    open_group: list[int] = []
    for j, nj in enumerate(g.nodes):
        if nj.kind.cls == "LDGSTS":
            open_group.append(j)
        elif nj.kind.cls == "LDGDEPBAR":
            groups.append(open_group)
            open_group = []
        elif nj.kind.cls == "DEPBAR":
            mods = nj.instr.modifiers
            if "wait_all" in mods:
                waited = [c for grp in groups for c in grp] + open_group
                groups, open_group = [], []
            else:
                n = _imm_int(nj.instr.operands[0]) if nj.instr.operands else 0
                n = 0 if n is None else n
                keep = groups[len(groups) - n:] if n else []
                done = groups[:len(groups) - n] if n else groups
                waited = [c for grp in done for c in grp]
                groups = keep
            for c in waited:
                g.add(Edge(c, j, "async", g.nodes[c].latency, "hardware", "cp.async"))
