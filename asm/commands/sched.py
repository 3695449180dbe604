"""`asmgemm sched`: how the scheduler reorders each `.schedule` region, with the modelled cycles."""
from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from ..errors import AsmError
from ..pipeline import assemble, build_file
from ..sass.inspect import inspect_cubin
from ..scheduler import compare_with_sass
from ..scheduler.control_codes import ControlCode
from .common import build_options, emit_json, make_console, source_options


@click.command("sched")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print the same data as JSON (every region, both orders, "
              "per instruction its class, latency, modelled issue cycle and control code, and the dependency edges).")
@click.option("--summary", is_flag=True, help="Only the one-line-per-region summary table.")
@click.option("--region", "region_filter", type=int, default=None, metavar="N",
              help="Only regions with this index (0, 1, ... within each function).")
@click.option("--edges", "show_edges", is_flag=True, help="Also list each region's dependency edges.")
@click.option("--compare-sass", is_flag=True,
              help="Also compile with ptxas and put the model's control codes beside the ones ptxas chose "
                   "(needs ptxas, nvdisasm and the SASS inspector).")
@click.option("--no-schedule", is_flag=True, help="With --compare-sass: compile the source order instead of the scheduled one.")
@source_options
def command(file, as_json, summary, region_filter, show_edges, compare_sass, no_schedule, defines, target, include_dirs):
    """Show, per `.schedule` region of FILE, the source order and the scheduled order side by side,
    each instruction with its modelled issue cycle and control code, and per region the critical
    path and the estimated cycles of both orders.

    \b
    The figures come from a model of one warp on one SM sub-partition (scheduler/list_scheduler.py)
    fed by the latency table scheduler/latencies_sm90.py, whose every figure cites its source:
      cycles       issue span: the cycle the region's last instruction issues, plus one
      drain        when the last result is ready (counts loads whose results leave the region)
      crit. path   longest latency-weighted dependency chain (no order issues in fewer cycles)
      lower bound  max(critical path, one instruction per cycle, busiest pipe)
    Control codes are printed as the SASS inspector prints ptxas's: [B<waits>:R<read SB>:W<write SB>:<Y|->:S<stall>].
    ptxas schedules again: --compare-sass shows how often the model agrees with it.

    \b
    Examples:
      asmgemm sched sgemm --summary
      asmgemm sched tests/data/sched/kstep.sasm --region 0 --json
      asmgemm sched sgemm --compare-sass
    """
    opts = build_options(defines, target, include_dirs, schedule=not no_schedule,
                         trace="ptx-lines" if compare_sass else "none")
    result = build_file(file, opts)
    report = result.schedule_report
    if report is None:
        raise AsmError("the scheduler is not available in this installation (asmgemm.scheduler failed to import)")
    regions = [r for r in report.regions if region_filter is None or r.index == region_filter]
    comparison = None
    if compare_sass:
        comparison = _compare(result, assemble)
    if as_json:
        out = report.to_json()
        out["source"] = result.source.path
        out["regions"] = [r.to_json() for r in regions]
        if comparison is not None:
            out["sass_comparison"] = comparison.to_json()
        emit_json(out)
        return
    _print(result, report, regions, summary, show_edges, comparison)


def _compare(result, assemble):
    asm = assemble(result)
    sass = inspect_cubin(asm.cubin, result.target)
    return compare_with_sass(result, sass)


def _ratio(a: int, b: int) -> str:
    return f"{a / b:.2f}x" if b else "-"


def _print(result, report, regions, summary, show_edges, comparison):
    console = make_console(piped_width=200)
    console.print(f"[bold]{result.source.path}[/bold]: {len(report.regions)} .schedule region(s); target "
                  f"{report.target} ({report.table_note}); emitted order: "
                  f"{'scheduled' if report.enabled else 'source (--no-schedule)'}")
    if not regions:
        console.print("no .schedule regions" + (" with that index" if report.regions else ""))
        return
    t = Table(title="regions (cycles, drain: source order → scheduled order)",
              title_justify="left")
    t.add_column("region", no_wrap=True)
    for col in ("instrs", "crit.", "bound", "cycles", "gain", "drain"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("where", overflow="fold", min_width=12)
    for r in regions:
        t.add_row(f"{r.function}#{r.index}", str(len(r.instructions)), str(r.critical_path),
                  str(r.lower_bound), f"{r.cycles_source}→{r.cycles_scheduled}",
                  _ratio(r.cycles_source, r.cycles_scheduled), f"{r.drain_source}→{r.drain_scheduled}",
                  r.location)
    console.print(t)
    if not summary:
        for r in regions:
            _print_orders(console, r)
            if show_edges:
                _print_edges(console, r)
    if comparison is not None:
        _print_comparison(console, comparison, summary)


def _print_orders(console, r):
    g = r.graph
    t = Table(title=f"{r.function} region {r.index} ({r.location}): source order | scheduled order",
              title_justify="left", show_lines=False)
    t.add_column("#", justify="right")
    t.add_column("source order", overflow="fold")
    t.add_column("t", justify="right")
    t.add_column("control (model)", no_wrap=True)
    t.add_column("src#", justify="right", style="dim")
    t.add_column("scheduled order", overflow="fold")
    t.add_column("t", justify="right")
    t.add_column("control (model)", no_wrap=True)
    for k in range(len(r.instructions)):
        n = r.scheduled_order[k]
        moved = n != k
        t.add_row(str(k), escape(g.nodes[k].text()), str(r.issue_source[k]), escape(r.control_source[k].render()),
                  str(n), ("[cyan]" if moved else "") + escape(g.nodes[n].text()) + ("[/cyan]" if moved else ""),
                  str(r.issue_scheduled[n]), escape(r.control_scheduled[n].render()))
    console.print(t)


def _print_edges(console, r):
    t = Table(title=f"{r.function} region {r.index}: dependency edges", title_justify="left")
    for col in ("from", "to", "kind", "latency", "enforced by", "what"):
        t.add_column(col, justify="right" if col in ("from", "to", "latency") else "left")
    for e in r.graph.edges:
        t.add_row(str(e.src), str(e.dst), e.kind, str(e.latency), e.enforce, escape(e.what))
    console.print(t)


def _print_comparison(console, cmp, summary):

    n = len(cmp.rows)
    kept, pairs = cmp.order_kept()
    console.print(f"[bold]model vs ptxas[/bold] (matched by {cmp.method}): {cmp.matched}/{n} instructions matched; "
                  f"stall counts equal in {cmp.stall_matches}/{cmp.matched}, yield hints in {cmp.yield_matches}/{cmp.matched}; "
                  f"ptxas kept {kept}/{pairs} consecutive pairs in the emitted order")
    by_op = cmp.by_opcode()
    if by_op:
        console.print("stall counts equal, by SASS opcode: " +
                      ", ".join(f"{op} {a}/{b}" for op, (a, b) in by_op.items()))
    eq, n_same = cmp.same_order_stalls
    if n_same:
        console.print(f"the model on ptxas's own order (same neighbours): stall counts equal in {eq}/{n_same}: " +
                      ", ".join(f"{op} {a}/{b}" for op, (a, b) in cmp.same_order_by_opcode.items()))
    for note in cmp.notes:
        console.print(f"note: {note}")
    if summary:
        return
    t = Table(title="per instruction (JSON adds PTX lines, scoreboards and the SASS index)", title_justify="left")
    t.add_column("rg", justify="right")
    t.add_column("PTX", overflow="fold", min_width=24)
    t.add_column("model", no_wrap=True)
    t.add_column("SASS", no_wrap=True)
    t.add_column("ptxas", no_wrap=True)
    t.add_column("stall", no_wrap=True)
    for row in cmp.rows:
        if row.matched:
            ptxas = ControlCode(row.sass_stall or 0, bool(row.sass_yield), row.sass_write_sb, row.sass_read_sb,
                                row.sass_wait_mask or 0).render()
            mark = "[green]=[/green]" if row.stall_match else f"[red]{row.model.stall}≠{row.sass_stall}[/red]"
        else:
            ptxas, mark = "-", "unmatched"
        t.add_row(str(row.region), escape(row.ptx), escape(row.model.render()) if row.model else "-",
                  row.sass_opcode or "-", escape(ptxas), mark)
    console.print(t)
