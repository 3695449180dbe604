"""Human output of the SASS inspector: the annotated listing and the summaries (rich tables)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..isa import control_bits as cb
from .analysis import Summary
from .inspect import ISSUE_NOTE, YIELD_NOTE, SassKernel, SassReport

_SLOTS = cb.REUSE_SLOTS


def _banks_cell(ins) -> Text:
    """Per source slot with a register: `A0` = slot A reads bank 0; `A*` = slot A hit the reuse cache."""
    out = Text()
    for slot, regs in enumerate(ins.source_regs):
        if not regs:
            continue
        name = _SLOTS[slot] if slot < len(_SLOTS) else str(slot)
        if out:
            out.append(" ")
        if slot in ins.reuse_hits:
            out.append(f"{name}*", style="green")
        else:
            style = "bold red" if any(r in v for v in ins.bank_conflict.values() for r in regs) else ""
            out.append(f"{name}{'/'.join(str(b) for b in ins.banks[slot])}", style=style)
    return out


def _notes(ins) -> Text:
    t = Text()
    if ins.bank_conflict:
        desc = "; ".join(f"bank {b}: {', '.join(f'R{r}' for r in regs)}" for b, regs in ins.bank_conflict.items())
        t.append(f"bank conflict ({desc})", style="bold red")
    if ins.reuse_hits:
        if t:
            t.append("  ")
        t.append("reuse " + "".join(_SLOTS[s] for s in ins.reuse_hits if s < len(_SLOTS)), style="green")
    if not ins.reachable:
        if t:
            t.append("  ")
        t.append("unreachable", style="dim")
    return t


def _short_source(loc: str | None) -> str:
    if not loc:
        return ""
    path, _, rest = loc.partition(":")
    return f"{Path(path).name}:{rest.split(':')[0]}" if rest else loc


def listing_table(kernel: SassKernel, indices: list[int], title: str) -> Table:
    has_ptx = any(kernel.instructions[k].ptx_line is not None for k in indices)
    has_src = any(kernel.instructions[k].source for k in indices)
    t = Table(title=title, title_justify="left", box=None, pad_edge=False, show_edge=False, header_style="bold")
    t.add_column("addr", justify="right", style="cyan")
    t.add_column("control", no_wrap=True)
    t.add_column("instruction", no_wrap=True)
    t.add_column("live", justify="right")
    t.add_column("banks", no_wrap=True)
    t.add_column("notes")
    if has_ptx:
        t.add_column("ptx", justify="right")
    if has_src:
        t.add_column("source", no_wrap=True)
    block = None
    heads = {kernel.blocks[lp.header].start: lp for lp in kernel.loops}
    for k in indices:
        ins = kernel.instructions[k]
        if ins.block != block:
            block = ins.block
            b = kernel.blocks[block]
            label = f"block {block}"
            if b.start in heads:
                lp = heads[b.start]
                label += f"  ← loop {lp.index} header (depth {lp.depth}, blocks {lp.blocks})"
            if ins.loops:
                label += f"  in loop {ins.loops[-1]}"
            if k != indices[0]:
                t.add_section()
            t.add_row("", "", Text(label, style="dim"), *[""] * (len(t.columns) - 3))
        # nvdisasm's text, predicate and `.reuse` markers included
        instr = Text(ins.text.rstrip(";").rstrip(), style="dim" if not ins.reachable or ins.predicate == "!PT" else "")
        row = [f"{ins.address:04x}", ins.control, instr,
               "" if ins.live_registers is None else str(ins.live_registers), _banks_cell(ins), _notes(ins)]
        if has_ptx:
            row.append("" if ins.ptx_line is None else str(ins.ptx_line))
        if has_src:
            row.append(_short_source(ins.source))
        t.add_row(*row)
    return t


def summary_table(s: Summary, title: str) -> Table:
    t = Table(title=title, title_justify="left", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    x = s.extra
    if "registers" in x:
        t.add_row("registers (ptxas)", str(x["registers"]))
    if "shared_bytes" in x:
        t.add_row("shared memory, static", f"{x['shared_bytes']} B" +
                  (f" (+{x['reserved_shared_bytes']} B system-reserved)" if x.get("reserved_shared_bytes") else ""))
    if "stack_frame_bytes" in x:
        t.add_row("stack frame (local memory)", f"{x['stack_frame_bytes']} B")
    if "spill_stores_bytes" in x:
        t.add_row("spills (ptxas -v)", f"{x['spill_stores_bytes']} B stored, {x['spill_loads_bytes']} B loaded")
    t.add_row("local memory instructions", f"{s.local_stores} STL, {s.local_loads} LDL",
              style="red" if s.local_loads or s.local_stores else "")
    if "loops" in x:
        t.add_row("loops", str(x["loops"]))
    t.add_row("instructions", str(s.instructions))
    t.add_row("max live registers", "-" if s.max_live_registers is None else str(s.max_live_registers))
    t.add_row("bank conflicts", str(s.bank_conflicts), style="red" if s.bank_conflicts else "green")
    t.add_row("reuse hits / reuse flags", f"{s.reuse_hits} / {s.reuse_flags}")
    t.add_row("stall cycles (sum)", str(s.stall_cycles))
    t.add_row("issue cycles (estimate)", str(s.issue_cycles))
    for g, n in s.groups.items():
        t.add_row(f"  {g}", str(n))
    return t


def mix_text(s: Summary) -> Text:
    t = Text("mix: ", style="bold")
    t.append("  ".join(f"{k}×{v}" for k, v in s.mix.items()), style="")
    return t


def render_report(report: SassReport, kernels: list[SassKernel], only_loops: bool, console: Console) -> None:
    console.print(f"[bold]SASS[/] of {report.source} — {report.target}, bank model {report.bank_model}, "
                  f"nvdisasm {report.nvdisasm}")
    for kernel in kernels:
        if only_loops:
            if not kernel.loops:
                console.print(f"[yellow]{kernel.name}: no loops[/]")
            for lp, s in zip(kernel.loops, kernel.loop_summaries):
                idx = lp.instruction_indices(kernel.blocks)
                console.print(listing_table(kernel, idx, f"{kernel.name}: loop {lp.index} (depth {lp.depth})"))
                console.print(summary_table(s, f"{kernel.name}: loop {lp.index} summary"))
                console.print(mix_text(s), width=min(console.width, 120))
        else:
            console.print(listing_table(kernel, list(range(len(kernel.instructions))), f"{kernel.name}"))
            for lp, s in zip(kernel.loops, kernel.loop_summaries):
                console.print(summary_table(s, f"{kernel.name}: loop {lp.index} (depth {lp.depth}, "
                                               f"{s.instructions} instructions)"))
                console.print(mix_text(s), width=min(console.width, 120))
        console.print(summary_table(kernel.summary, f"{kernel.name}: kernel summary"))
        console.print(mix_text(kernel.summary), width=min(console.width, 120))
    console.print(width=min(console.width, 120))
    console.print(f"[dim]control: [B wait mask : R read scoreboard : W write scoreboard : yield : S stall]; "
                  f"{YIELD_NOTE}. banks: slot letter + bank, `*` = reuse-cache hit. {ISSUE_NOTE}.[/]")
