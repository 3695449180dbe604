"""The control codes a region's instruction order needs under the model: per instruction the stall
count, the yield hint, the scoreboard it sets for a variable-latency result or source read, and the
scoreboards it waits on. This is what ptxas writes into each SASS instruction's control field
(layout and meaning: asm/isa/control_bits.py); here it is *predicted* from the dependency graph and
the latency table, so that it can be shown beside the PTX (`build --annotate`) and compared with
what ptxas chose (`sched --compare-sass`).

The model, one warp on one SMSP (the same issue model as list_scheduler.simulate):
  stall    cycles from this instruction's issue to the next one's, as far as fixed-latency results
           (edges enforced by 'stall'), pipe occupancy and the one-instruction-per-cycle limit
           require; variable-latency waits are left to scoreboards, as on the hardware. Clamped to
           1..15 (4 bits). The last instruction of a region gets 1: what follows is unknown here.
  yield    'Y' (bit cleared: prefer switching warps) when the warp is about to wait: a stall above
           4 cycles, a next instruction that waits on a scoreboard, or a barrier — the maxas rule
           (MAXAS in latencies_sm90.SOURCES) extended to scoreboard waits.
  write SB a variable-latency instruction that produces registers sets one of the 6 scoreboards;
           consumers of the result (RAW, WAW) wait on it.
  read SB  an instruction that reads its sources after issue (memory, MIO) sets one when a later
           instruction of the region overwrites one of those sources (WAR).
  wait     the scoreboards of this instruction's producers that no earlier instruction (after
           the producer) already waited on.

Scoreboards are given out in order; a scoreboard is busy from its setter's issue until the first
instruction of the region that waits on it has issued, or, with no waiter in the region, until
the setter's latency has elapsed (a consumer after the region will wait on it). With all six busy,
the setter shares the one that frees soonest (the hardware counts outstanding setters per
scoreboard, so sharing is legal; a waiter then also waits for the other setter).
"""
from __future__ import annotations

from dataclasses import dataclass

from .depgraph import DepGraph
from .latencies_sm90 import MAX_STALL, SCOREBOARDS
from .list_scheduler import Timeline

YIELD_STALL = 4      # stalls above this set the yield hint (maxas)


@dataclass(frozen=True)
class ControlCode:
    stall: int
    yield_: bool                 # True: 'Y' (prefer switching warps)
    write_sb: int | None
    read_sb: int | None
    wait_mask: int               # bit i: waits on scoreboard i

    def render(self) -> str:
        """maxas/CuAssembler notation, as the SASS inspector prints it: [B------:R-:W2:Y:S02]."""
        waits = "".join(str(i) if self.wait_mask >> i & 1 else "-" for i in range(SCOREBOARDS))
        r = "-" if self.read_sb is None else str(self.read_sb)
        w = "-" if self.write_sb is None else str(self.write_sb)
        return f"[B{waits}:R{r}:W{w}:{'Y' if self.yield_ else '-'}:S{self.stall:02d}]"

    def to_json(self) -> dict:
        return {"stall": self.stall, "yield": self.yield_, "write_sb": self.write_sb,
                "read_sb": self.read_sb, "wait_mask": self.wait_mask, "text": self.render()}


def _fixed_next_issue(g: DepGraph, tl: Timeline, pos: int) -> int:
    """Earliest issue of the instruction after position `pos` counting only what stall counts
    enforce: the previous issue + 1, fixed-latency and order edges, and pipe occupancy."""
    nxt = tl.order[pos + 1]
    t = tl.issue[tl.order[pos]] + 1
    for e in g.preds[nxt]:
        if e.enforce in ("stall", "order"):
            t = max(t, tl.issue[e.src] + e.latency)
    pipe = g.nodes[nxt].pipe
    for prev in reversed(tl.order[:pos + 1]):
        if g.nodes[prev].pipe == pipe:
            t = max(t, tl.issue[prev] + g.nodes[prev].issue)
            break
    return t


def control_codes(g: DepGraph, tl: Timeline) -> dict[int, ControlCode]:
    """Modelled control code of every node of `g` for the order and issue times in `tl`."""
    pos_of = {n: p for p, n in enumerate(tl.order)}
    # Which producers need a scoreboard: variable-latency writers (their consumers may be after
    # the region) and late source readers whose sources a later instruction of the region writes.
    needs_write = {n for n in tl.order if g.nodes[n].variable and g.nodes[n].defs}
    read_waiters: dict[int, list[int]] = {}
    write_waiters: dict[int, list[int]] = {}
    for e in g.edges:
        if e.enforce == "scoreboard-w" and e.src in needs_write:
            write_waiters.setdefault(e.src, []).append(e.dst)
        elif e.enforce == "scoreboard-r":
            read_waiters.setdefault(e.src, []).append(e.dst)

    busy_until = [-1] * SCOREBOARDS       # issue cycle after which the scoreboard is free
    write_sb: dict[int, int] = {}
    read_sb: dict[int, int] = {}

    def release_time(setter: int, waiters: list[int], latency: int) -> int:
        if waiters:       # the first waiter clears it; later consumers find the result there
            return min(tl.issue[w] for w in waiters)
        return tl.issue[setter] + latency

    def take(now: int, until: int) -> int:
        free = [i for i in range(SCOREBOARDS) if busy_until[i] < now]
        sb = free[0] if free else min(range(SCOREBOARDS), key=lambda i: (busy_until[i], i))
        busy_until[sb] = max(busy_until[sb], until)
        return sb

    for n in tl.order:
        now = tl.issue[n]
        node = g.nodes[n]
        if n in needs_write:
            write_sb[n] = take(now, release_time(n, write_waiters.get(n, []), node.latency))
        if n in read_waiters:
            read_sb[n] = take(now, release_time(n, read_waiters[n], node.timing.read_latency))

    # A wait on scoreboard k waits for every setter of k issued so far, so a later instruction
    # needs no wait for a setter that issued before an earlier wait on k.
    last_wait = [-1] * SCOREBOARDS        # position of the latest instruction that waited on k
    masks: dict[int, int] = {}
    for p, n in enumerate(tl.order):
        mask = 0
        for e in g.preds[n]:
            sb = None
            if e.enforce == "scoreboard-w" and e.src in write_sb:
                sb = write_sb[e.src]
            elif e.enforce == "scoreboard-r" and e.src in read_sb:
                sb = read_sb[e.src]
            if sb is not None and last_wait[sb] < pos_of[e.src]:
                mask |= 1 << sb
        for k in range(SCOREBOARDS):
            if mask >> k & 1:
                last_wait[k] = p
        masks[n] = mask
    codes: dict[int, ControlCode] = {}
    for p, n in enumerate(tl.order):
        last = p + 1 == len(tl.order)
        stall = 1 if last else _fixed_next_issue(g, tl, p) - tl.issue[n]
        stall = max(1, min(MAX_STALL, stall))
        next_waits = not last and masks[tl.order[p + 1]] != 0
        yield_ = stall > YIELD_STALL or next_waits or g.nodes[n].kind.cls == "BAR"
        codes[n] = ControlCode(stall, yield_, write_sb.get(n), read_sb.get(n), masks[n])
    return codes
