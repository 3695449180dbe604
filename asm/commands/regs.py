"""`asmgemm regs`: the register plan and its bank-conflict report."""
from __future__ import annotations

import click
from rich.table import Table

from ..errors import AsmError
from ..pipeline import assemble_traced, build_file
from ..sass.inspect import inspect_build
from ..sass.plan_compare import compare_plan, render_comparison
from .common import build_options, emit_json, make_console, source_options


@click.command("regs")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--sass", "with_sass", is_flag=True,
              help="Also compile with ptxas and show where each planned register really ended up (needs nvdisasm).")
@click.option("--function", "only", metavar="NAME", help="Only this function/kernel.")
@source_options
def command(file, as_json, with_sass, only, defines, target, include_dirs):
    """Show the register plan of FILE: every `.regs`/`.temp` register with its PTX name, planned
    physical index and bank, first and last use, and every FMA-class instruction whose three
    sources fall into one bank under the target's bank model (sm_90: bank = index mod 2,
    a conflict needs three distinct sources in one bank; sm_5x/6x: index mod 4, two).

    The plan is a model: ptxas re-allocates registers. --sass compares it with the final SASS:
    it assembles with line information, pairs the operands of every FMA-class SASS instruction
    with the PTX fma/mad line it came from, and shows which physical register (and bank) each
    planned register ended in and, per FMA, whether the plan's conflict-freedom survived once
    reuse-cache hits are counted. That mapping is inferred, not reported by ptxas.
    """
    opts = build_options(defines, target, include_dirs, trace="ptx-lines" if with_sass else "none")
    result = build_file(file, opts)
    plan = result.allocation
    functions = [f for f in plan.functions.values() if only is None or f.name == only]
    if only is not None and not functions:
        raise AsmError(f"no function named '{only}' (functions: {', '.join(plan.functions) or 'none'})")
    comparison = None
    if with_sass:
        comparison = compare_plan(result, inspect_build(assemble_traced(result)))
    if as_json:
        data = plan.to_json()
        data["functions"] = [f.to_json() for f in functions]
        if comparison is not None:
            data["sass"] = comparison
        emit_json(data)
        return
    con = make_console(piped_width=200 if with_sass else 160)
    con.print(f"[bold]register plan[/] for {result.source.path} — target {plan.target}, bank model {plan.model}")
    for fn in functions:
        t = Table(title=f"{fn.name}: {len(fn.regs)} named registers, planned R0..R{max(fn.registers_used - 1, 0)}",
                  title_justify="left")
        for col in ("name", "type", "PTX register", "index", "bank", "kind", "first", "last", "uses", "declared"):
            t.add_column(col, justify="right" if col in ("index", "bank", "first", "last", "uses") else "left")
        for r in fn.regs:
            bank = "-" if r.bank is None else str(r.bank)
            if r.constraint is not None:
                bank += f" (={r.constraint})"
            t.add_row(r.name, r.ptx_type, r.ptx_name, str(r.index), bank, "temp" if r.temp else "fixed",
                      "-" if r.first_use is None else str(r.first_use), "-" if r.last_use is None else str(r.last_use),
                      str(r.uses), r.location)
        con.print(t)
        if fn.conflicts:
            con.print(f"[red]{len(fn.conflicts)} bank conflict(s)[/] among {fn.three_source_checked} three-source instructions:")
            for c in fn.conflicts:
                banks = "; ".join(f"bank {b}: {', '.join(ns)}" for b, ns in c.banks.items())
                con.print(f"  {c.location}: {c.text}  [red]{banks}[/]")
        else:
            con.print(f"[green]no bank conflicts[/] among {fn.three_source_checked} three-source instructions")
    if comparison is not None:
        render_comparison(comparison, con)
