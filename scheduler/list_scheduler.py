"""List scheduling of one region's dependency graph, and the single-warp issue model that both the
scheduler and the cycle estimates use.

The issue model (one warp on one SMSP, as the control codes see it): an instruction issues no
earlier than
  - one cycle after the previous instruction (one instruction per cycle per warp scheduler),
  - each predecessor's issue time plus the edge latency,
  - the cycle its pipe is free again (the previous instruction on that pipe plus its issue cost).
Two figures per order: `cycles`, the issue span (the cycle the last instruction issues, plus one:
how long the warp spends in the region, waiting inside it for what the region itself produces), and
`drain`, when the last result is ready (max(issue + latency)), which also counts results that leave
the region (a global load issued in the last k-step is waited for by a later iteration, not here).

The scheduler is cycle-driven list scheduling with critical-path priority, in the manner of
maxas's Scheduler (MaxAs.pm): at each step, of the instructions whose predecessors are all placed,
take those that can issue earliest, and among them the one with the longest latency-weighted path
to the end of the region; ties go to an instruction on a different pipe from the previous one
(maxas's "mix": interleaves shared loads with FFMAs), then to source order. Long loads (LDG, LDS)
head long paths, so they are issued as early as their dependencies allow: global loads first, and
the shared loads of step k+1 spread among the FFMAs of step k, whose path is shorter. Every edge
is respected by construction (a node becomes a candidate only after all its predecessors), and
every choice is a pure function of the graph, so the result is deterministic.
"""
from __future__ import annotations

from dataclasses import dataclass

from .depgraph import DepGraph


@dataclass
class Timeline:
    order: list[int]          # node indices in issue order
    issue: dict[int, int]     # node -> issue cycle
    cycles: int               # issue span: last issue cycle + 1
    drain: int                # when the last result is ready

    def gaps(self) -> list[int]:
        t = [self.issue[n] for n in self.order]
        return [b - a for a, b in zip(t, t[1:])]


def earliest_issue(g: DepGraph, node: int, issue: dict[int, int], last: int | None,
                   pipe_free: dict[str, int]) -> int:
    t = 0 if last is None else last + 1
    for e in g.preds[node]:
        t = max(t, issue[e.src] + e.latency)
    return max(t, pipe_free.get(g.nodes[node].pipe, 0))


def simulate(g: DepGraph, order: list[int]) -> Timeline:
    """Issue times of `order` under the model (the order must respect the graph)."""
    issue: dict[int, int] = {}
    pipe_free: dict[str, int] = {}
    last = None
    for n in order:
        t = earliest_issue(g, n, issue, last, pipe_free)
        issue[n] = t
        node = g.nodes[n]
        pipe_free[node.pipe] = t + node.issue
        last = t
    span = max(issue.values()) + 1 if issue else 0
    return Timeline(list(order), issue, span, _makespan(g, issue))


def _makespan(g: DepGraph, issue: dict[int, int]) -> int:
    if not issue:
        return 0
    return max(t + max(1, g.nodes[n].latency) for n, t in issue.items())


def list_schedule(g: DepGraph) -> list[int]:
    n = len(g.nodes)
    if n == 0:
        return []
    height = g.heights()
    # Several edges may join the same pair of nodes: count distinct predecessors.
    pred_sets = [sorted({e.src for e in p}) for p in g.preds]
    remaining = [len(s) for s in pred_sets]
    succ_sets = [sorted({e.dst for e in s}) for s in g.succs]
    ready = [i for i in range(n) if remaining[i] == 0]
    issue: dict[int, int] = {}
    pipe_free: dict[str, int] = {}
    order: list[int] = []
    last = None
    last_pipe = None
    while ready:
        est = {c: earliest_issue(g, c, issue, last, pipe_free) for c in ready}
        soonest = min(est.values())
        best = min((c for c in ready if est[c] == soonest),
                   key=lambda c: (-height[c], g.nodes[c].pipe == last_pipe, c))
        ready.remove(best)
        t = est[best]
        issue[best] = t
        node = g.nodes[best]
        pipe_free[node.pipe] = t + node.issue
        last, last_pipe = t, node.pipe
        order.append(best)
        for s in succ_sets[best]:
            remaining[s] -= 1
            if remaining[s] == 0:
                ready.append(s)
    if len(order) != n:      # a cycle would be a bug in the graph builder (edges go forward)
        raise AssertionError("dependency graph has a cycle")
    return order
