"""Basic blocks and loops of one SASS function, from its branch targets.

Blocks start at the entry, at every direct-branch target and after every branch or thread-ending
instruction; they end before the next start. Edges: fall-through (unless the block ends in an
unpredicated branch or EXIT/RET), and the branch target. Indirect branches (BRX/JMX) have unknown
targets, so such a block gets no branch edge and the function is marked as having one.

Loops are natural loops: a back edge u -> h where h dominates u; the loop is h plus every block
that reaches u without passing through h. Blocks unreachable from the entry (the `BRA` to itself
that ptxas appends after the last EXIT, and the NOP padding) are left out of blocks' edges, loops
and summaries.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .decode import BRANCHES, TERMINATORS, SassInstruction, label_reference


@dataclass
class BasicBlock:
    index: int
    start: int                      # instruction indices [start, end)
    end: int
    successors: list[int] = field(default_factory=list)
    predecessors: list[int] = field(default_factory=list)
    reachable: bool = True

    def to_json(self, instrs: list[SassInstruction]) -> dict:
        return {"index": self.index, "start_address": instrs[self.start].address,
                "end_address": instrs[self.end - 1].address, "instructions": self.end - self.start,
                "successors": self.successors, "predecessors": self.predecessors, "reachable": self.reachable}


@dataclass
class Loop:
    index: int
    header: int                     # block index
    latches: list[int]              # blocks with the back edge
    blocks: list[int]               # sorted block indices
    depth: int = 1                  # 1 = outermost
    parent: int | None = None

    def instruction_indices(self, blocks: list[BasicBlock]) -> list[int]:
        return [i for b in self.blocks for i in range(blocks[b].start, blocks[b].end)]


def resolve_branch_targets(instrs: list[SassInstruction], labels: dict[str, int]) -> bool:
    """Fill in `branch_target`; True when the function has an indirect branch."""
    indirect = False
    for ins in instrs:
        if ins.opcode not in BRANCHES:
            continue
        target = None
        for op in ins.operands:
            lab = label_reference(op)
            if lab is not None and lab in labels:
                target = labels[lab]
                break
        if target is None:
            for op in ins.operands:
                if op.startswith("0x"):
                    try:
                        target = int(op, 16)
                    except ValueError:
                        pass
        ins.branch_target = target
        if target is None:
            indirect = True
    return indirect


def _ends_block(ins: SassInstruction) -> bool:
    return ins.opcode in BRANCHES or ins.opcode in TERMINATORS


def _unconditional(ins: SassInstruction) -> bool:
    return ins.predicate in (None, "PT")


def build_blocks(instrs: list[SassInstruction]) -> list[BasicBlock]:
    if not instrs:
        return []
    by_addr = {ins.address: k for k, ins in enumerate(instrs)}
    starts = {0}
    for k, ins in enumerate(instrs):
        if ins.branch_target is not None and ins.branch_target in by_addr:
            starts.add(by_addr[ins.branch_target])
        if _ends_block(ins) and k + 1 < len(instrs):
            starts.add(k + 1)
    order = sorted(starts)
    blocks = [BasicBlock(i, s, order[i + 1] if i + 1 < len(order) else len(instrs)) for i, s in enumerate(order)]
    block_of_instr = {}
    for b in blocks:
        for k in range(b.start, b.end):
            block_of_instr[k] = b.index
            instrs[k].block = b.index
    for b in blocks:
        last = instrs[b.end - 1]
        succ: list[int] = []
        if last.opcode in BRANCHES:
            if last.branch_target is not None and last.branch_target in by_addr:
                succ.append(block_of_instr[by_addr[last.branch_target]])
            if not _unconditional(last) and b.end < len(instrs):
                succ.append(block_of_instr[b.end])
        elif last.opcode in TERMINATORS:
            if not _unconditional(last) and b.end < len(instrs):
                succ.append(block_of_instr[b.end])
        elif b.end < len(instrs):
            succ.append(block_of_instr[b.end])
        b.successors = list(dict.fromkeys(succ))
    # reachability from the entry
    seen = {0}
    stack = [0]
    while stack:
        n = stack.pop()
        for s in blocks[n].successors:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    for b in blocks:
        b.reachable = b.index in seen
        for k in range(b.start, b.end):
            instrs[k].reachable = b.reachable
    for b in blocks:
        if not b.reachable:
            continue
        for s in b.successors:
            blocks[s].predecessors.append(b.index)
    return blocks


def dominators(blocks: list[BasicBlock]) -> dict[int, set[int]]:
    reach = [b.index for b in blocks if b.reachable]
    if not reach:
        return {}
    all_nodes = set(reach)
    dom = {n: set(all_nodes) for n in reach}
    dom[0] = {0}
    changed = True
    while changed:
        changed = False
        for n in reach:
            if n == 0:
                continue
            preds = [p for p in blocks[n].predecessors if p in dom]
            new = set.intersection(*(dom[p] for p in preds)) if preds else set()
            new = new | {n}
            if new != dom[n]:
                dom[n] = new
                changed = True
    return dom


def find_loops(blocks: list[BasicBlock]) -> list[Loop]:
    dom = dominators(blocks)
    by_header: dict[int, tuple[set[int], list[int]]] = {}
    for b in blocks:
        if not b.reachable:
            continue
        for s in b.successors:
            if s in dom.get(b.index, ()):             # back edge b -> s
                body, latches = by_header.setdefault(s, ({s}, []))
                latches.append(b.index)
                stack = [b.index]
                while stack:
                    n = stack.pop()
                    if n in body:
                        continue
                    body.add(n)
                    stack.extend(p for p in blocks[n].predecessors)
    loops = [Loop(0, h, sorted(l), sorted(body)) for h, (body, l) in sorted(by_header.items())]
    # nesting: the parent is the smallest other loop that contains this one's blocks
    for lp in loops:
        containing = [o for o in loops if o is not lp and set(lp.blocks) < set(o.blocks)]
        if containing:
            parent = min(containing, key=lambda o: len(o.blocks))
            lp.parent = parent.header
        lp.depth = 1 + len(containing)
    loops.sort(key=lambda lp: (blocks[lp.header].start, -len(lp.blocks)))
    header_to_index = {}
    for i, lp in enumerate(loops):
        lp.index = i
        header_to_index[lp.header] = i
    for lp in loops:
        if lp.parent is not None:
            lp.parent = header_to_index[lp.parent]
    return loops
