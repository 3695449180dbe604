"""`asmgemm build`: .sasm/.ptx -> PTX (and optionally a cubin)."""
from __future__ import annotations

import gc
from pathlib import Path

import click

from ..files import write_files
from ..pipeline import assemble, build_file
from ..sass.control_directive import has_controls
from .common import build_options, emit_json, source_options


@click.command("build")
@click.argument("file")
@click.option("-o", "--output", metavar="OUT.ptx",
              help="Where to write the PTX. Default: <name>.ptx in the current folder; '-' for standard output.")
@click.option("--cubin", metavar="OUT.cubin", help="Also run ptxas and write the cubin here.")
@click.option("--trace", type=click.Choice(["none", "comments", "loc", "ptx-lines"]), default="none", show_default=True,
              help="Tie PTX to the source: comments (// file:line), loc (.loc lines for ptxas -lineinfo), "
                   "ptx-lines (.loc pointing at the PTX itself, for the SASS inspector).")
@click.option("--no-schedule", is_flag=True, help="Keep .schedule regions in source order (for A/B timing).")
@click.option("--annotate", is_flag=True, help="Write the scheduler's modelled control codes as comments.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary (outputs, target, kernels, ptxas figures).")
@source_options
def command(file, output, cubin, trace, no_schedule, annotate, as_json, defines, target, include_dirs):
    """Assemble FILE (.sasm or plain .ptx, or a shipped kernel name) into PTX.

    Every output is written only after the whole build succeeded, and the PTX and the cubin are
    committed together, so a failed build leaves no file behind (and every old one as it was).
    An output never replaces the source or a file it includes; a character device or FIFO
    (-o /dev/null) is written in place; a folder is an error. With --cubin, ptxas errors are
    reported at the .sasm line they came from.

    \b
    Examples:
      asmgemm build sgemm_naive -o sgemm_naive.ptx
      asmgemm build kernels_ptx/sgemm.sasm -D BK=16 --cubin sgemm.cubin
      asmgemm build my.sasm -o - --trace comments | less
    """
    # The collector stays off until the build's objects are gone: freeing a large build (millions
    # of AST and IR nodes for a 10 MB PTX file) with it on takes three times as long.
    enabled = gc.isenabled()
    gc.disable()
    try:
        _build(file, output, cubin, trace, no_schedule, annotate, as_json, defines, target, include_dirs)
    finally:
        if enabled:
            gc.enable()


def _build(file, output, cubin, trace, no_schedule, annotate, as_json, defines, target, include_dirs):
    opts = build_options(defines, target, include_dirs, trace=trace, schedule=not no_schedule, annotate=annotate)
    result = build_file(file, opts)
    cubin_bytes = None
    kernels = []
    control = choice = None
    if cubin:
        asm = assemble(result)          # with `.control` directives: ptxas's code, patched and checked
        cubin_bytes = asm.cubin
        kernels = [k.to_json() for k in asm.kernels]
        control, choice = asm.control, asm.ptxas_choice
        for w in asm.warnings:
            click.echo(f"ptxas warning: {w}", err=True)
    if output is None:
        output = Path(Path(result.source.path).name).with_suffix(".ptx").name
    # the PTX in the pieces the emitter made: written one after another, never joined
    outputs = [] if output == "-" else [(output, result.emitted.pieces())]
    if cubin_bytes is not None:
        outputs.append((cubin, cubin_bytes))
    # One commit: every output after everything succeeded, or none; never onto the source or an include.
    write_files(outputs, inputs=result.input_files)
    note = result.allocation.note        # a target asmgemm has no bank/latency data for
    if note and not as_json:
        click.echo(f"note: {result.target}: {note}", err=True)
    if output == "-":
        click.echo(result.ptx, nl=False)
        return
    # `.control` acts on ptxas's code: without --cubin there is none, and the report says so
    pending = "not applied: the directives act on the cubin (--cubin)" if control is None and \
        has_controls(result.scheduled) else None
    if as_json:
        emit_json({"source": result.source.path, "ptx": output, "cubin": cubin, "target": result.target,
                   "kernels": result.kernel_names, "parameters": result.parameters, "ptxas": kernels,
                   "note": note, "control": control.to_json() if control else pending,
                   "ptxas_choice": choice.to_json() if choice else None})
    else:
        if choice is not None:
            click.echo(choice.describe(), err=True)
        for line in control.lines() if control else ([f"note: .control {pending}"] if pending else []):
            click.echo(line, err=True)
        extra = f" and {cubin}" if cubin else ""
        names = result.kernel_names
        # A large PTX file has thousands of kernels: name a few, count the rest (--json lists all).
        shown = ", ".join(names[:8]) + (f", ... ({len(names)} kernels)" if len(names) > 8 else "")
        click.echo(f"wrote {output}{extra} ({result.target}; kernels: {shown or 'none'})", err=True)
