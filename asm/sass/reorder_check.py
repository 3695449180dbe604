"""The safety check for reordered code: a kernel whose words the reorder pass moved within basic
blocks (sass/reorder_pass.py) must be as safe as ptxas's. sass/hazards.py `check_patch` assumes
every instruction stays at its index; this check maps each instruction of the input to where it
went and proves, from the dependency graph of the *input* (sass/block_deps.py: built from
ptxas's code, not from the schedule):

 1. permutation: every block holds the same instructions as before, and every anchor (block
    ends, branches, barriers, clock reads, offsets named by .nv.info or a relocation) is at its
    own index;
 2. order: every dependency edge (register, scoreboard, cover, memory) is kept, and an edge
    enforced by stall counts inside a block (a WAW between fixed-latency writers, a WAR on a
    memory instruction with no read scoreboard) keeps its distance;
 3. latency: along every path of the control-flow graph, a consumer of a fixed-latency result is
    at least min(table latency, ptxas's distance on that path) cycles away (sass/hazards.py rule
    1; FIXED_HORIZON and ptxas's distance for an opcode the table lacks), and an overwriter of
    the sources of a memory instruction with no read scoreboard at least ptxas's distance, up to
    FIXED_HORIZON. Distances sum max(stall, 1), both codes walked along the same blocks;
 4. scoreboards: every dependant of a variable-latency producer that ptxas covered with a wait is
    still covered on every path in the new code (sass/hazards.py rule 2, dependants found in the
    input, coverage searched in the output), producers keep their scoreboards, setters a DEPBAR
    counts keep theirs, and no instruction waits on a scoreboard less than 2 cycles after its
    setter (hazards.SCOREBOARD_SETUP: the wait would not see it) where ptxas's code did not;
 5. reuse: every reuse flag on an instruction whose next instruction changed is judged afresh by
    sass/hazards.py rule 3 on the new order; flags ptxas set between two instructions that are
    still neighbours are not re-judged;
 6. yield: sass/hazards.py rule 4 (yields move with their instruction within a block, so a loop
    cannot lose one; checked anyway).
nvdisasm reading the result back as these instructions is sass/patch.py verify_encoding's part.
"""
from __future__ import annotations

import dataclasses

from ..isa.sass_registers import register_name
from .block_deps import (READ_RELEASE, RESULT_RELEASE, BlockDeps, guard_register, lookup_timing, pipes_of,
                         queued_exposure, queued_producer, read_pipes_of, variable_opcodes,
                         variable_producer)
from .hazards import (FIXED_HORIZON, CheckReport, CodeFacts, Hazard, _check_reuse, _check_yield,
                      _exposed, _mask, _sb, depbar_hazard, depbar_scoreboards, fixed_latencies, setup_hazard,
                      setup_pairs, table_covers)


def moved_instructions(kernel, origin: list[int]) -> list:
    """The input's instructions in their new order, each at its new address."""
    ins = kernel.instructions
    return [dataclasses.replace(ins[j], address=16 * i) for i, j in enumerate(origin[:len(ins)])]


def check_reordered(kernel, deps: BlockDeps, origin: list[int], new_words: list[int], table) -> CheckReport:
    ins = kernel.instructions
    n = len(ins)
    origin = list(origin[:n])
    report = CheckReport([])
    name = kernel.name
    if sorted(origin) != list(range(n)) or len(new_words) != n:
        report.hazards.append(Hazard(name, 0, "", "order", "the new order is not a permutation of the kernel"))
        return report
    if origin == list(range(n)):
        return report
    pos = [0] * n
    for i, j in enumerate(origin):
        pos[j] = i
    if deps.unmovable:
        k = next(i for i in range(n) if origin[i] != i)
        report.hazards.append(Hazard(name, 16 * k, ins[origin[k]].text, "anchor",
                                     f"no instruction of this kernel may move: {deps.unmovable}"))
        return report
    for b in kernel.blocks:
        if sorted(origin[b.start:b.end]) != list(range(b.start, b.end)):
            report.hazards.append(Hazard(name, 16 * b.start, ins[b.start].text, "order",
                                         f"block {b.index} does not hold the same instructions after the move"))
            return report
        if not b.reachable and origin[b.start:b.end] != list(range(b.start, b.end)):
            report.hazards.append(Hazard(name, 16 * b.start, ins[b.start].text, "order",
                                         f"block {b.index} is unreachable and may not be reordered"))
    for k, why in sorted(deps.anchors.items()):
        if pos[k] != k:
            report.hazards.append(Hazard(name, ins[k].address, ins[k].text, "anchor",
                                         f"moved to {16 * pos[k]:#06x}, but it may not move ({why})",
                                         {"moved_to": f"{16 * pos[k]:#06x}"}))
    new_ins = moved_instructions(kernel, origin)
    new = CodeFacts(new_ins, kernel.blocks, new_words)
    old = deps.code
    _check_edges(name, deps, old, new, pos, report)
    _check_paths(name, kernel, deps, old, new, pos, table, report)
    _check_scoreboards(name, deps, old, new, pos, report)
    _check_queued(name, deps, old, new, pos, table, report)
    _check_setup(name, old, new, origin, report)
    # reuse: flags between instructions that are no longer neighbours are judged afresh
    for k in range(n):
        still_next = origin[k] == k and (k + 1 >= n or origin[k + 1] == k + 1)
        if not still_next:
            new.old[k] = dict(new.old[k], reuse=0)
    _check_reuse(name, new, report)
    _check_yield(kernel, new, report)
    return report


def _check_edges(name, deps: BlockDeps, old: CodeFacts, new: CodeFacts, pos, report) -> None:
    ins = old.ins
    for edges in deps.deps.values():
        for e in edges:
            a, b = pos[e.src], pos[e.dst]
            if a >= b:
                report.hazards.append(Hazard(
                    name, 16 * b, ins[e.dst].text, "order",
                    f"now before {16 * a:#06x} {ins[e.src].text}, on which it depends ({e.kind}"
                    f"{', ' + e.what if e.what else ''}); ptxas had them at {ins[e.src].address:#06x} and "
                    f"{ins[e.dst].address:#06x}",
                    {"producer": f"{16 * a:#06x}", "dependency": e.kind, "what": e.what}))
            elif e.stall and e.kind != "raw":
                d, d0 = sum(new.gap_new[a:b]), sum(old.gap_old[e.src:e.dst])
                if d < e.latency and e.kind == "scoreboard":
                    report.hazards.append(setup_hazard(name, 16 * b, ins[e.dst].text, 16 * a, ins[e.src].text,
                                                       {int(e.what[2:])}, d, d0))
                elif d < e.latency:
                    report.hazards.append(Hazard(
                        name, 16 * b, ins[e.dst].text, "latency",
                        f"{e.kind} on {e.what} {d} cycles after {16 * a:#06x} {ins[e.src].text}, below "
                        f"the {e.latency} cycles required (ptxas had {d0})",
                        {"producer": f"{16 * a:#06x}", "distance": d, "input_distance": d0,
                         "latency": e.latency}))


def _offsets(gaps: list[int], blocks) -> list[int]:
    """Issue offset of each index from the start of its block."""
    out = [0] * len(gaps)
    for b in blocks:
        t = 0
        for k in range(b.start, b.end):
            out[k] = t
            t += gaps[k]
    return out


def _check_paths(name, kernel, deps: BlockDeps, old: CodeFacts, new: CodeFacts, pos, table, report) -> None:
    """Rule 3: walk both codes along the same blocks from each fixed-latency producer."""
    ins = old.ins
    blocks = kernel.blocks
    block_of = [0] * len(ins)
    for b in blocks:
        for k in range(b.start, b.end):
            block_of[k] = b.index
    off_old = _offsets(old.gap_old, blocks)
    off_new = _offsets(new.gap_new, blocks)
    len_old = {b.index: sum(old.gap_old[b.start:b.end]) for b in blocks}
    len_new = {b.index: sum(new.gap_new[b.start:b.end]) for b in blocks}
    fixed = fixed_latencies(table)
    variable_ops = variable_opcodes(table)
    for p, i in enumerate(ins):
        if not i.reachable:
            continue
        watches = []
        if old.writes[p] and not variable_producer(old, p, variable_ops):
            known = fixed.get(i.opcode)
            watches.append(("raw", frozenset(old.writes[p]), known[0] if known else FIXED_HORIZON, known, ()))
        elif queued_producer(old, p, variable_ops):
            # consumers ptxas covered with a wait are rule 4's; the others keep ptxas's spacing
            watches.append(("raw", frozenset(old.writes[p]), FIXED_HORIZON, None,
                            deps.dependants[(p, "queued")][1]))
        if old.reads[p] and lookup_timing(deps.timing, i, table).read_latency and _sb(old.old[p], "read") is None:
            # every overwriter keeps ptxas's spacing, also one that ptxas covered with a later
            # same-pipe wait (rule 4 checks that wait too): the graph holds them so since the H100
            # showed the wait alone is not enough (block_deps._war)
            watches.append(("war", frozenset(old.reads[p]), FIXED_HORIZON, None, ()))
        for kind, regs, need, known, skip in watches:
            _walk(name, p, kind, regs, need, known, skip, old, new, pos, blocks, block_of, off_old, off_new,
                  len_old, len_new, report, fixed)


def _walk(name, p, kind, regs, need, known, skip, old, new, pos, blocks, block_of, off_old, off_new,
          len_old, len_new, report, fixed) -> None:
    ins = old.ins
    b0 = blocks[block_of[p]]
    flagged: set[int] = set()
    # a predicate may be read as a guard further away than the producer's latency
    prune_at = FIXED_HORIZON if kind == "raw" and any(r[0] in ("P", "UP") for r in regs) else need
    # state: (block, first old index to look at, distance from p's issue to the block's start in
    # ptxas's code and in the new code, registers still live, whether this is p's own pass)
    stack = [(b0.index, p + 1, -off_old[p], -off_new[pos[p]], regs, True)]
    seen = set()
    while stack:
        bi, first, base_old, base_new, live, own = stack.pop()
        key = (bi, first, base_old, base_new, live)
        if key in seen:
            continue
        seen.add(key)
        b = blocks[bi]
        if not own and base_new >= prune_at:
            continue                    # every later distance is at least this one
        stopped = False
        for x in range(first, b.end):
            if x == p and not own:
                stopped = True
                break
            d0 = base_old + off_old[x]
            d = base_new + off_new[pos[x]]
            touched = old.reads[x] if kind == "raw" else old.writes[x]
            hit = touched & live
            if hit and x not in skip and (not own or pos[x] > pos[p]):
                report.checked_pairs += 1
                if known and d0 < known[0]:
                    report.below_table += 1
                guard = kind == "raw" and guard_register(ins[x]) in hit
                # the table's latency only for a pair it describes (hazards.table_covers); ptxas's
                # spacing for the rest, as block_deps._raw holds them
                uncovered = kind == "raw" and known is not None and not table_covers(old, p, x, hit, fixed)
                need_x = FIXED_HORIZON if guard or uncovered else need
                if d < d0 and d < need_x and x not in flagged:
                    flagged.add(x)
                    reg = register_name(sorted(hit)[0])
                    if guard:
                        where = (f"read as the guard predicate: held to ptxas's spacing up to {FIXED_HORIZON} "
                                 "cycles (sass/block_deps.py, guard predicates)")
                    elif uncovered:
                        where = (f"a pair the latency table does not describe: held to ptxas's spacing up to "
                                 f"{FIXED_HORIZON} cycles (sass/hazards.py, table_covers)")
                    elif known:
                        where = f"{ins[p].opcode} latency {known[0]} cycles [{known[1]}, scheduler/latencies_sm90.py]"
                    else:
                        where = f"{ins[p].opcode}: held to ptxas's spacing up to {FIXED_HORIZON} cycles"
                    verb = "reads" if kind == "raw" else "overwrites"
                    report.hazards.append(Hazard(
                        name, 16 * pos[x], ins[x].text, "latency",
                        f"{verb} {reg} {d} cycles after {16 * pos[p]:#06x} {ins[p].text} "
                        f"({'wrote' if kind == 'raw' else 'read'} it; {where}; ptxas had {d0} cycles on this path)",
                        {"producer": f"{16 * pos[p]:#06x}", "register": reg, "distance": d,
                         "input_distance": d0, "latency": None if guard or uncovered or not known else known[0]}))
            if old.unconditional(x):
                live = live - old.writes[x]
            if not live:
                stopped = True
                break
        if stopped:
            continue
        out_old = base_old + len_old[bi]
        out_new = base_new + len_new[bi]
        for s in b.successors:
            stack.append((s, blocks[s].start, out_old, out_new, live, False))


def _check_setup(name, old: CodeFacts, new: CodeFacts, origin: list[int], report) -> None:
    """Rule 4's set-up delay on every path, block ends included: no instruction waits on a
    scoreboard less than hazards.SCOREBOARD_SETUP cycles after its setter unless ptxas's code had
    that very pair so (within a block the graph's scoreboard edges say the same; this also sees a
    setter that ends a block and a waiter moved to the start of the next)."""
    had = {(k, s): hit for k, s, hit in setup_pairs(old, old.old, old.gap_old)}
    # a pair within a block is a scoreboard edge of the graph, which _check_edges reported already
    reported = {(h.address, h.numbers.get("producer")) for h in report.hazards if h.kind == "latency"}
    for q, r, hit in setup_pairs(new, new.new, new.gap_new):
        k, s = origin[q], origin[r]
        if hit <= had.get((k, s), set()) or (16 * r, f"{16 * q:#06x}") in reported:
            continue
        d0 = sum(old.gap_old[k:s]) if k < s and old.ins[k].block == old.ins[s].block else None
        report.hazards.append(setup_hazard(name, 16 * r, new.ins[r].text, 16 * q, new.ins[q].text, hit,
                                           new.gap_new[q], d0))


def _check_queued(name, deps: BlockDeps, old: CodeFacts, new: CodeFacts, pos, table, report) -> None:
    """Rule 4 for producers with no scoreboard of their own (block_deps `queued`, `queued-read`):
    every consumer (overwriter) ptxas covered is still reached only after a wait on a scoreboard
    that a later instruction of the producer's pipe set, on every path of the new code."""
    result_pipes = pipes_of(new, new.new, variable_opcodes(table), deps.timing, table)
    read_pipes = read_pipes_of(new, new.new, deps.timing, table)
    for (p, kind), (_sb_none, covered) in deps.dependants.items():
        if not kind.startswith("queued") or not covered:
            continue
        report.scoreboard_edges += len(covered)
        reads = kind == "queued-read"
        pipes = read_pipes if reads else result_pipes
        exposed = queued_exposure(new, pos[p], pipes, new.new, READ_RELEASE if reads else RESULT_RELEASE)
        bad = sorted({pos[x] for x in covered} & exposed)
        if not bad:
            continue
        x = bad[0]
        i = old.ins[p]
        others = f"; {len(bad) - 1} more consumer(s) exposed" if len(bad) > 1 else ""
        what = ("overwrites a source of" if reads else "reads the result of")
        report.hazards.append(Hazard(
            name, 16 * x, new.ins[x].text, "scoreboard",
            f"{what} {16 * pos[p]:#06x} {i.text} (no {'read' if reads else 'write'} scoreboard of its own: "
            f"ptxas covered it with a wait on a later {pipes[pos[p]]} instruction's scoreboard) but a path "
            f"of the reordered code reaches it with no such wait{others}",
            {"producer": f"{16 * pos[p]:#06x}", "kind": kind, "exposed": [f"{16 * k:#06x}" for k in bad]}))


def _check_scoreboards(name, deps: BlockDeps, old: CodeFacts, new: CodeFacts, pos, report) -> None:
    """Rule 4: dependants found in ptxas's code (the graph's), coverage searched in the new code."""
    ins = old.ins
    depbar_sbs = depbar_scoreboards(ins)
    for p, i in enumerate(ins):
        if not i.reachable:
            continue
        q = pos[p]
        for kind in ("write", "read"):
            old_sb, new_sb = _sb(old.old[p], kind), _sb(new.new[q], kind)
            if old_sb is None:
                continue
            moved_sb = depbar_hazard(name, 16 * q, i.text, kind, old_sb, new_sb, depbar_sbs)
            if moved_sb is not None:
                report.hazards.append(moved_sb)
                continue
            dependants = deps.dependants[(p, kind)][1]
            report.scoreboard_edges += len(dependants)
            if not dependants:
                continue
            moved = {pos[x] for x in dependants}
            if new_sb is None:
                bad = sorted(moved)
            else:
                new_exposed, _ = _exposed(new, q, new_sb, new.new)
                bad = sorted(moved & new_exposed)
            if not bad:
                continue
            x = bad[0]
            what = "overwrites a source of" if kind == "read" else "depends on the result of"
            others = f"; {len(bad) - 1} more dependant(s) exposed" if len(bad) > 1 else ""
            msg = (f"{what} {16 * q:#06x} {i.text} (variable latency, {kind} scoreboard "
                   f"{'none' if new_sb is None else new_sb}) but a path of the reordered code reaches it "
                   f"with no wait on that scoreboard: its wait mask is {_mask(new.new[x]['wait_mask'])}, "
                   f"and ptxas covered it with a wait on scoreboard {old_sb}{others}")
            report.hazards.append(Hazard(
                name, 16 * x, new.ins[x].text, "scoreboard", msg,
                {"producer": f"{16 * q:#06x}", "kind": kind, "input_scoreboard": old_sb,
                 "scoreboard": new_sb, "wait_mask": new.new[x]["wait_mask"],
                 "exposed": [f"{16 * k:#06x}" for k in bad]}))

