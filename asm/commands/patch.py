"""`asmgemm patch`: set control codes in a cubin from a rules file, after proving them safe."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import AsmError
from ..sass.patch import plan_patch, write_patched
from ..sass.patch_rules import load_rules
from .common import emit_json

SHOWN_HAZARDS = 20


@click.command("patch")
@click.argument("cubin", type=click.Path(dir_okay=False))
@click.argument("rules", type=click.Path(dir_okay=False), required=False)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The patched cubin to write (only when the check passes; never a partial file).")
@click.option("--reuse-pass", "reuse_pass", is_flag=True,
              help="Also set every operand-reuse flag the checker can prove valid (maxas-style; after the "
                   "rules) and report the modelled bank conflicts before/after. No gain on the H100 (ptxas sets them).")
@click.option("--stall-pass", "stall_pass", is_flag=True,
              help="Also lower stall counts to the measured fixed latencies (never raising one; scoreboard, "
                   "memory, control, uniform and unmeasured instructions left alone) and report the modelled "
                   "issue cycles of each loop before/after. No gain on the H100 (2026-11-27).")
@click.option("--yield-every", "yield_every", type=int, default=None, metavar="N",
              help="Also put the yield hint on every N-th FFMA/HMMA of each loop and take it off the others, "
                   "clearing reuse flags under a yield (DeepGEMM's interleave). Costs up to 13% on the H100's sgemm.")
@click.option("--reorder-pass", "reorder_pass", is_flag=True,
              help="EXPERIMENTAL, UNSAFE: also list-schedule each basic block again (anchors, branch targets "
                   "and every offset the cubin names stay put), recompute stalls and reuse flags. Its check "
                   "accepted an sgemm that faulted on the H100; it runs only with --experimental-reorder.")
@click.option("--experimental-reorder", "experimental_reorder", is_flag=True,
              help="Allow --reorder-pass, knowing its check missed a hazard on the GPU "
                   "(docs/design/sass-patching.md, 'Reorder pass').")
@click.option("--json", "as_json", is_flag=True,
              help="Print the plan as JSON: every changed instruction with its fields before and after, "
                   "and the check (accepted, hazards with their numbers).")
def command(cubin, rules, output, reuse_pass, stall_pass, yield_every, reorder_pass, experimental_reorder,
            as_json):
    """Set the control codes (stall, yield, scoreboards, wait mask, reuse) of chosen instructions
    of a sm_90/sm_90a CUBIN, as a RULES file (TOML) says, and write the result to -o.

    Before anything is written, the patched code is checked against the input: fixed-latency
    consumers stay at least their latency away along every path (latencies: the scheduler's
    measured sm_90 table), consumers of variable-latency results still wait on the producer's
    scoreboard, reuse flags are set only where the next instruction reads the same register in
    the same slot with the yield hint off, every loop that had a yield hint keeps one, and
    nvdisasm reads the patched words back as the same instructions (some opcodes accept only some
    stall values). A patch that fails is refused with each hazard, its instruction and its
    numbers, and nothing is written (exit status 1).

    \b
    Rules file:
      kernel = "sgemm"            # default kernel of every rule
      [[rule]]
      opcode = "FFMA"             # regex, matched in full against FFMA, LDS.U.128, ...
      loop = 0                    # or addresses = [0x400, 0x800], instructions = [a, b],
                                  #    labels = [".L_x_3", ".L_x_4"]; none: the whole kernel
      stall = 2                   # fields: stall, yield (true = `Y`), write_barrier, read_barrier
      reuse = ["A"]               #   ("none" or 0-5), wait = [scoreboards], reuse = [slots]

    --reorder-pass (EXPERIMENTAL: needs --experimental-reorder; a reordered sgemm faulted on the
    H100 although the check accepted it) list-schedules every basic block again with the project's scheduler (the
    dependency graph over SASS registers, scoreboards and memory order; nothing crosses a branch,
    barrier, warpgroup instruction, clock read or an offset the cubin's .nv.info or relocations
    name), recomputes stalls and reuse flags, and keeps a block only where its own check passes
    and the modelled issue cycles do not grow.

    --reuse-pass sets, in addition, every reuse flag the checker's reuse rule allows (the next
    instruction reads the same register in the same slot) and prints the bank conflicts the
    register-bank model counts before and after; its effect on speed is not measured.

    --stall-pass lowers each stall count to the least that keeps every fixed-latency result at
    least its measured latency (or ptxas's own spacing, where the table has no latency or does
    not cover the consumer) from its readers, and --yield-every N places the yield hint on every
    N-th FFMA/HMMA of each loop (sass/stall_pass.py says what is left alone and why); both print
    the modelled issue cycles of each loop before and after, and neither is measured.

    Compare the result with `asmgemm sass --diff CUBIN OUT`. The patched cubin is not used by
    asmgemm.gemm unless a caller loads it explicitly.
    """
    path = Path(cubin)
    if not path.is_file():
        raise AsmError(f"no such file: {cubin}")
    if Path(output).resolve() == path.resolve():
        raise AsmError("-o names the input cubin; write the patched cubin to another file")
    if reorder_pass and not experimental_reorder:
        raise AsmError("--reorder-pass is experimental and unsafe: on the H100 a reordered sgemm (BK=16 RQ=4 "
                       "LOAD_AHEAD=1) that the reorder check accepted faulted, and after a fix still computed "
                       "a wrong C",
                       hint="add --experimental-reorder to run it anyway (for study, never for a kernel you ship)")
    if yield_every is not None and yield_every < 1:
        raise AsmError(f"--yield-every must be at least 1 (a yield on every N-th FFMA/HMMA), not {yield_every}")
    if rules is None and not (reuse_pass or stall_pass or yield_every or reorder_pass):
        raise AsmError("nothing to do: give a RULES file, --reuse-pass, --stall-pass, --yield-every N, "
                       "--reorder-pass, or several")
    plan = plan_patch(path.read_bytes(), load_rules(rules) if rules else None, source=str(cubin),
                      reuse_pass=reuse_pass, stall_pass=stall_pass, yield_every=yield_every or 0,
                      reorder_pass=reorder_pass)
    if as_json:
        out = plan.to_json()
        out["output"] = None if plan.hazards else str(output)
        if not plan.hazards:
            write_patched(plan, output)
        emit_json(out)
        if plan.hazards:
            sys.exit(1)     # the JSON says why; the status says refused (click's Exit is swallowed by cli.main)
        return
    if plan.hazards:
        lines = [h.line() for h in plan.hazards[:SHOWN_HAZARDS]]
        more = len(plan.hazards) - SHOWN_HAZARDS
        if more > 0:
            lines.append(f"... and {more} more (--json lists them all)")
        raise AsmError(f"{cubin}: patch refused, {len(plan.hazards)} hazard(s); nothing written\n"
                       + "\n".join(lines))
    write_patched(plan, output)
    fields: dict[str, int] = {}
    for change in plan.changes:
        for name in change.fields():
            fields[name] = fields.get(name, 0) + 1
    counts = ", ".join(f"{n} {k}" for k, n in fields.items()) or "no field changed"
    for r in plan.reuse_pass:
        click.echo(f"reuse pass, {r.kernel}: {r.flags_added} flag(s) added; modelled bank conflicts "
                   f"{r.conflicts_before} -> {r.conflicts_after} ({r.loop_conflicts_before} -> "
                   f"{r.loop_conflicts_after} in loops); not measured on a GPU")
    for summary in plan.stall_pass:
        click.echo(summary.line())
    for r in plan.reorder_pass:
        loops = "; ".join(f"loop {lp['loop']} {lp['issue_cycles'][0]} -> {lp['issue_cycles'][1]}"
                          for lp in r.loops)
        why = f" (not reordered: {r.unmovable})" if r.unmovable else ""
        click.echo(f"reorder pass, {r.kernel}: {r.moved} instruction(s) moved in {r.blocks_reordered} "
                   f"block(s){why}; modelled issue cycles {loops or 'no loops'}; not measured on a GPU")
    click.echo(f"{output}: {len(plan.changes)} of {plan.selected} selected instruction(s) changed "
               f"({counts}); check passed")
