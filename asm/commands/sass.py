"""`asmgemm sass`: what ptxas really produced — control codes, register banks, reuse, loops."""
from __future__ import annotations

from pathlib import Path

import click

from ..errors import AsmError
from ..pipeline import assemble_traced, build_file, resolve_input
from ..sass.diff import diff_cubins, render_diff
from ..sass.inspect import check_target, inspect_build, inspect_cubin
from ..sass.listing import disassemble_listing
from ..sass.render import render_report
from .common import build_options, emit_json, make_console, source_options

_ELF_MAGIC = b"\x7fELF"


def _is_cubin(path) -> bool:
    p = Path(path)
    if p.suffix == ".cubin":
        return True
    if not p.is_file():
        return False
    with open(p, "rb") as fh:
        return fh.read(4) == _ELF_MAGIC


@click.command("sass")
@click.argument("files", nargs=-1, required=True, metavar="FILE")
@click.option("--diff", "diff", is_flag=True,
              help="Compare two cubins (FILE A.cubin B.cubin): every changed instruction with its control "
                   "fields before and after, and any other section that differs.")
@click.option("--kernel", "kernel_name", metavar="NAME", help="Only this kernel.")
@click.option("--loop", "only_loops", is_flag=True, help="Only the loop bodies, each with its summary.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the same data as JSON: per kernel its summary, blocks, loops, and one object "
                   "per instruction with named fields.")
@source_options
def command(files, diff, kernel_name, only_loops, as_json, defines, target, include_dirs):
    """Disassemble the SASS of FILE (.sasm, .ptx, a shipped kernel name, or a sm_90/sm_90a .cubin)
    and annotate every instruction.

    A .sasm/.ptx is built and assembled with ptxas -lineinfo (PTX emitted with a `.loc` per
    instruction, which does not change the code), so each SASS instruction shows the PTX line
    and the .sasm line it came from. Needs ptxas and nvdisasm (`pip install 'asmgemm[cuda-tools]'`).

    \b
    Columns of the listing:
      control  maxas/CuAssembler notation [B012345:R#:W#:Y:S##]: the scoreboards the instruction
               waits on (B), the scoreboard released when its sources are read (R) and when its
               result is written (W), `Y` when the yield hint is on (bit 109 = 0), and the stall
               count (cycles before the warp's next instruction may issue). Bit layout and sources:
               asmgemm/isa/control_bits.py.
      live     live general-purpose registers (nvdisasm -lrm count).
      banks    per source slot A/B/C: the register-file bank of the register it reads under the
               target's bank model (asmgemm/isa/register_banks.py); `*` = served by the reuse cache
               (the previous instruction of the block that read it in that slot set its reuse flag).
      notes    bank conflicts (after reuse hits), reuse hits, unreachable padding.

    The summaries (per kernel and per loop) give the instruction mix, bank conflicts, reuse hits,
    the sum of stall counts, an issue-cycle estimate (sum of max(stall, 1) plus one per bank
    conflict; no dual issue, scoreboard waits not counted), local-memory (spill) instructions,
    registers and shared memory.

    \b
    Examples:
      asmgemm sass sgemm_naive --loop
      asmgemm sass kernel.cubin --kernel my_kernel --json > sass.json
      asmgemm sass --diff kernel.cubin patched.cubin
    """
    if diff:
        _diff(files, kernel_name, as_json)
        return
    if len(files) != 1:
        raise AsmError(f"give one FILE (got {len(files)}); to compare two cubins use --diff A.cubin B.cubin")
    file = files[0]

    control = choice = None
    if _is_cubin(file):
        path = Path(file)
        if not path.is_file():
            raise AsmError(f"no such file: {file}")
        if defines:
            raise AsmError("-D applies to .sasm sources, not to a cubin")
        report = inspect_cubin(path.read_bytes(), target, source=str(file))
    else:
        resolve_input(file)
        if target is not None:
            check_target(target)
        result = build_file(file, build_options(defines, target, include_dirs, trace="ptx-lines"))
        traced = assemble_traced(result)
        report = inspect_build(traced)
        control = traced.assembled.control      # the listing is of the code with its `.control`s applied
        choice = traced.assembled.ptxas_choice  # and of the ptxas run that ships (.ptxas_alternative)
    kernels = list(report.kernels.values())
    if kernel_name is not None:
        kernels = [k for k in kernels if k.name == kernel_name]
        if not kernels:
            raise AsmError(f"no kernel named '{kernel_name}' (kernels: {', '.join(report.kernels) or 'none'})")
    if as_json:
        data = report.to_json(only_loops)
        data["kernels"] = [k.to_json(only_loops) for k in kernels]
        if control is not None:
            data["control"] = control.to_json()
        if choice is not None:
            data["ptxas_choice"] = choice.to_json()
        emit_json(data)
        return
    console = make_console(piped_width=240)    # piped listings keep one instruction per line
    render_report(report, kernels, only_loops, console)
    for line in control.lines() if control is not None else []:
        click.echo(line, err=True)
    if choice is not None:
        click.echo(choice.describe(), err=True)


def _diff(files, kernel_name, as_json) -> None:
    if len(files) != 2:
        raise AsmError(f"--diff compares two cubins: give A.cubin B.cubin (got {len(files)} file(s))")
    data = []
    for f in files:
        p = Path(f)
        if not p.is_file():
            raise AsmError(f"no such file: {f}")
        if not _is_cubin(p):
            raise AsmError(f"{f}: --diff compares cubins; this is not one",
                           hint="build one with `asmgemm build FILE --cubin OUT.cubin`")
        data.append(p.read_bytes())
    listing = disassemble_listing(data[0], line_info=False)
    texts = {name: {i.address: i.text for i in fn.instructions} for name, fn in listing.functions.items()}
    result = diff_cubins(data[0], data[1], files[0], files[1], texts)
    if kernel_name is not None:
        result.words = [w for w in result.words if w.kernel == kernel_name]
    if as_json:
        emit_json(result.to_json())
        return
    click.echo("\n".join(render_diff(result)))
