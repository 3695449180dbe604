"""`asmgemm check`: ptxas -v figures for the built PTX."""
from __future__ import annotations

import sys

import click
from rich.table import Table

from ..errors import format_note
from ..pipeline import assemble, build_file
from ..slow_ops import slow_ops
from .common import build_options, emit_json, make_console, source_options


@click.command("check")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--no-spills", is_flag=True, help="Exit non-zero if any kernel spills or uses local memory.")
@click.option("--max-registers", type=int, default=None, metavar="N", help="Exit non-zero if a kernel uses more than N registers.")
@source_options
def command(file, as_json, no_spills, max_registers, defines, target, include_dirs):
    """Build FILE, run `ptxas -v` on it, and report per kernel: registers, spill stores/loads,
    stack frame, local memory, shared memory, constant banks and barriers.

    Notes follow, at the .sasm line, for instructions ptxas assembles into a long sequence where one
    would do: an unsigned div/rem by an immediate power of two (ptxas 13.0 keeps it a ~15-instruction
    division; a shift or a mask is one). Notes never change the exit status.

    Exits 1 when ptxas rejects the PTX (with the error at the .sasm line), and 2 when a check
    asked for (--no-spills, --max-registers) fails.
    """
    result = build_file(file, build_options(defines, target, include_dirs))
    asm = assemble(result)
    failures = []
    for k in asm.kernels:
        if no_spills and k.spills:
            failures.append(f"{k.name}: spills ({k.spill_stores} bytes stored, {k.spill_loads} bytes loaded, "
                            f"{k.local_bytes} bytes local memory, {k.stack_frame} bytes stack)")
        if max_registers is not None and k.registers > max_registers:
            failures.append(f"{k.name}: {k.registers} registers > {max_registers}")
    notes = slow_ops(result.allocated)
    if as_json:
        emit_json({"source": result.source.path, "target": result.target,
                   "kernels": [k.to_json() for k in asm.kernels], "warnings": asm.warnings, "failures": failures,
                   "notes": [n.to_json() for n in notes]})
    else:
        t = Table(title=f"ptxas -v: {result.source.path} ({result.target})", title_justify="left")
        # ptxas 13 no longer prints constant-bank usage with -v; show the column only when it did.
        show_cmem = any(k.constant_bytes for k in asm.kernels)
        cols = ("kernel", "registers", "spill stores", "spill loads", "stack", "local", "shared", "barriers")
        for col in cols + (("cmem",) if show_cmem else ()):
            t.add_column(col, justify="left" if col == "kernel" else "right")
        for k in asm.kernels:
            row = [k.name, str(k.registers), str(k.spill_stores), str(k.spill_loads), str(k.stack_frame),
                   str(k.local_bytes), str(k.shared_bytes), str(k.barriers)]
            if show_cmem:
                row.append(" ".join(f"{b}={v}" for b, v in k.constant_bytes.items()))
            t.add_row(*row)
        con = make_console()
        con.print(t)
        for w in asm.warnings:
            con.print(f"[yellow]ptxas warning:[/] {w}")
        for n in notes:
            con.print(format_note(n.message(), n.span), markup=False, highlight=False, soft_wrap=True)
        for f in failures:
            con.print(f"[red]check failed:[/] {f}")
    if failures:
        sys.exit(2)
