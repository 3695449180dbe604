"""`schedule_module`: the pipeline stage between register allocation and PTX emission.

For every `.schedule` region of every function: build the dependency graph of its instructions,
list-schedule it, model the control codes of both the source order and the scheduled order, and
return a module whose regions hold the chosen order (the scheduled one, or the source order when
scheduling is off), with the modelled control code in `Instruction.note` when asked to annotate.
The input module is never modified. The report carries everything `asmgemm sched` shows.

Directives inside a region (`.loc`, `.pragma`, declarations) travel with the instruction that
follows them, so that a `.loc` keeps describing its instruction; trailing ones stay at the end.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from asmgemm import ir
from asmgemm.errors import AsmError
from asmgemm.isa.arch import arch_for

from .control_codes import ControlCode, control_codes
from .depgraph import DepGraph, build_graph, check_region_item
from .latencies_sm90 import Timing, timing_table
from .list_scheduler import list_schedule, simulate


@dataclass
class RegionReport:
    function: str
    index: int                           # 0, 1, ... within its function
    location: str                        # 'file:line:col' of `.schedule`, or ''
    instructions: list[ir.Instruction]   # source order (as handed in, without notes)
    graph: DepGraph
    scheduled_order: list[int]
    emitted_order: list[int]             # scheduled_order, or source order with scheduling off
    issue_source: dict[int, int]
    issue_scheduled: dict[int, int]
    cycles_source: int                   # issue span (list_scheduler.Timeline.cycles)
    cycles_scheduled: int
    drain_source: int                    # when the last result is ready
    drain_scheduled: int
    critical_path: int
    lower_bound: int
    control_source: dict[int, ControlCode]
    control_scheduled: dict[int, ControlCode]

    @property
    def source_order(self) -> list[int]:
        return list(range(len(self.instructions)))

    @property
    def control_emitted(self) -> dict[int, ControlCode]:
        return self.control_scheduled if self.emitted_order == self.scheduled_order else self.control_source

    @property
    def issue_emitted(self) -> dict[int, int]:
        return self.issue_scheduled if self.emitted_order == self.scheduled_order else self.issue_source

    def to_json(self) -> dict:
        g = self.graph

        def row(n: int, issue: dict[int, int], codes: dict[int, ControlCode]) -> dict:
            node = g.nodes[n]
            return {"node": n, "text": node.text(), "sass_class": node.kind.cls, "sass": node.timing.sass,
                    "latency": node.latency, "variable": node.variable,
                    "line": node.instr.span.location() if node.instr.span else None,
                    "issue_cycle": issue[n], "control": codes[n].to_json()}

        return {
            "function": self.function, "region": self.index, "location": self.location,
            "instructions": len(self.instructions),
            "critical_path": self.critical_path, "lower_bound": self.lower_bound,
            "cycles_source": self.cycles_source, "cycles_scheduled": self.cycles_scheduled,
            "drain_source": self.drain_source, "drain_scheduled": self.drain_scheduled,
            "scheduled_order": self.scheduled_order, "emitted_order": self.emitted_order,
            "source": [row(n, self.issue_source, self.control_source) for n in self.source_order],
            "scheduled": [row(n, self.issue_scheduled, self.control_scheduled) for n in self.scheduled_order],
            "edges": [{"src": e.src, "dst": e.dst, "kind": e.kind, "latency": e.latency,
                       "enforce": e.enforce, "what": e.what} for e in g.edges],
        }


@dataclass
class ScheduleReport:
    target: str
    enabled: bool
    table_note: str
    regions: list[RegionReport] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"target": self.target, "scheduling": self.enabled, "latency_table": self.table_note,
                "regions": [r.to_json() for r in self.regions]}


def schedule_module(module: ir.Module, target: str, enabled: bool = True,
                    annotate: bool = False) -> tuple[ir.Module, ScheduleReport]:
    regions = [(fn, item) for fn in module.functions() for item in (fn.body or [])
               if isinstance(item, ir.ScheduleRegion)]
    try:
        table, note = timing_table(arch_for(target))
    except ValueError as exc:
        if regions and (enabled or annotate):
            raise AsmError(f"cannot schedule for {target}: {exc}", regions[0][1].span,
                           hint="build with --no-schedule (and without --annotate) to keep source order") from None
        return module, ScheduleReport(target, enabled, f"no latency table for {target}")
    report = ScheduleReport(target, enabled, note)
    if not regions:
        return module, report
    items = []
    for it in module.items:
        if isinstance(it, ir.Function) and it.body is not None:
            it = replace(it, body=_function_body(it, table, enabled, annotate, report))
        items.append(it)
    return module.copy_with(items=items), report


def _function_body(fn: ir.Function, table: dict[str, Timing], enabled: bool, annotate: bool,
                   report: ScheduleReport) -> list[ir.BodyItem]:
    out: list[ir.BodyItem] = []
    index = 0
    for item in fn.body:
        if isinstance(item, ir.ScheduleRegion):
            region, rep = schedule_region(item, fn.name, index, table, enabled, annotate)
            report.regions.append(rep)
            out.append(region)
            index += 1
        else:
            out.append(item)
    return out


def schedule_region(region: ir.ScheduleRegion, function: str, index: int, table: dict[str, Timing],
                    enabled: bool = True, annotate: bool = False) -> tuple[ir.ScheduleRegion, RegionReport]:
    """One region: (the region in its new order, the report)."""
    instrs: list[ir.Instruction] = []
    before: dict[int, list[ir.BodyItem]] = {}    # directives that precede instruction i
    pending: list[ir.BodyItem] = []
    for item in region.items:
        check_region_item(item)
        if isinstance(item, ir.Instruction):
            before[len(instrs)] = pending
            pending = []
            instrs.append(item)
        else:
            pending.append(item)
    g = build_graph(instrs, table)
    source = list(range(len(instrs)))
    order = list_schedule(g)
    bad = g.respects(order)
    if bad:   # list_schedule places a node only after its predecessors; this is a bug guard
        raise AssertionError(f"scheduler broke {len(bad)} dependencies in {function} region {index}")
    tl_src, tl_sch = simulate(g, source), simulate(g, order)
    emitted = order if enabled else source
    rep = RegionReport(function, index, region.span.location() if region.span else "", instrs, g, order,
                       emitted, tl_src.issue, tl_sch.issue, tl_src.cycles, tl_sch.cycles, tl_src.drain,
                       tl_sch.drain, g.critical_path(), g.lower_bound(), control_codes(g, tl_src),
                       control_codes(g, tl_sch))
    items: list[ir.BodyItem] = []
    codes, issue = rep.control_emitted, rep.issue_emitted
    for n in emitted:
        items.extend(before[n])
        ins = instrs[n]
        if annotate:
            ins = replace(ins, note=f"{codes[n].render()} t={issue[n]}")
        items.append(ins)
    items.extend(pending)
    return ir.ScheduleRegion(items, region.span, index, region.controls), rep
