"""`asmgemm regs --sass`: the register plan next to ptxas's final allocation.

Method (an inference, and labelled as one in every output):
  1. The build is emitted in "ptx-lines" trace mode and assembled with -lineinfo, so every SASS
     instruction names the PTX line it came from (sass/inspect.py).
  2. For each SASS FMA-class instruction (FFMA, IMAD, HFMA2, DFMA, ...) whose PTX line is an
     FMA-class instruction (fma, mad, ... — isa/ptx_operands.py THREE_SOURCE_BASES), the operands
     are paired position by position: destination, A, B, C. Where the PTX operand is a planned
     register (%R12_f32) and the SASS operand a plain register (R37), the planned register is
     taken to live in R37 there. ptxas may commute A and B, fold an operand into an immediate or
     constant, or split one PTX instruction into several: those pairs are reported as unmatched,
     not guessed.
  3. Per planned register: the physical registers it was seen in, and whether their bank equals
     the planned bank. Per matched FMA: the planned sources' banks and conflict under the model,
     the SASS sources' banks and conflict once reuse-cache hits are counted, and a verdict.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from rich.table import Table

from ..isa.arch import arch_for
from ..isa.ptx_operands import THREE_SOURCE_BASES
from .decode import split_operands

SASS_THREE_SOURCE = frozenset({"FFMA", "IMAD", "HFMA2", "DFMA", "HFMA", "IDP", "FFMA2"})
_PTX_INSTR = re.compile(r"^\s*(?:@!?%?[\w$]+\s+)?(?P<op>[a-z][\w.:]*)\s+(?P<rest>.*?)\s*;")
_PLANNED = re.compile(r"^[-!]?(%R\d+_\w+|%P\d+)$")
_SASS_REG = re.compile(r"^[-|]*R(\d+)(?:\.reuse)?\|?$")

INFERRED_NOTE = ("inferred: planned registers are matched to SASS registers by pairing the operands "
                 "of each FMA-class SASS instruction with the PTX fma/mad line it came from "
                 "(ptxas -lineinfo), position by position; ptxas does not report this mapping")


def _ptx_instruction(line: str) -> tuple[str, list[str]] | None:
    m = _PTX_INSTR.match(line)
    if m is None:
        return None
    return m["op"], split_operands(m["rest"])


def compare_plan(result, report) -> dict:
    """JSON-able comparison of `result.allocation` with the SASS in `report` (from inspect_build)."""
    model = arch_for(report.target).bank_model
    ptx_lines = (report.ptx or result.ptx).splitlines()
    functions = []
    for name, plan in result.allocation.functions.items():
        kernel = report.kernels.get(name)
        if kernel is None:
            continue
        # `.temp`s with disjoint live ranges share one PTX register: they are one row, `av0/av1`.
        by_ptx_name: dict[str, object] = {}
        names_of: dict[str, list[str]] = {}
        for r in plan.regs:
            by_ptx_name.setdefault(r.ptx_name, r)
            names_of.setdefault(r.ptx_name, []).append(r.name)
        seen: dict[str, Counter] = {r.ptx_name: Counter() for r in plan.regs}
        fmas = []
        unmatched = 0
        for ins in kernel.instructions:
            if ins.opcode not in SASS_THREE_SOURCE or ins.ptx_line is None or not ins.reachable:
                continue
            if not 0 < ins.ptx_line <= len(ptx_lines):
                continue
            parsed = _ptx_instruction(ptx_lines[ins.ptx_line - 1])
            if parsed is None or parsed[0].split(".")[0] not in THREE_SOURCE_BASES:
                continue
            op, ptx_ops = parsed
            sass_ops = ins.operands
            if len(ptx_ops) != len(sass_ops) or len(ptx_ops) < 4:
                unmatched += 1
                continue
            pairs = []
            for k, (p, s) in enumerate(zip(ptx_ops[:4], sass_ops[:4])):
                pm = _PLANNED.match(p.strip())
                planned = by_ptx_name.get(pm.group(1)) if pm else None
                sm = _SASS_REG.match(s.strip())
                physical = int(sm.group(1)) if sm else None
                if planned is not None and physical is not None:
                    seen[planned.ptx_name][physical] += 1
                pairs.append({"slot": "D" if k == 0 else "ABC"[k - 1], "ptx": p, "sass": s,
                              "planned": "/".join(names_of[planned.ptx_name]) if planned else None,
                              "planned_index": planned.index if planned else None,
                              "planned_bank": planned.bank if planned else None,
                              "physical": physical,
                              "physical_bank": model.bank_of(physical) if physical is not None else None})
            srcs = pairs[1:4]
            planned_idx = [p["planned_index"] for p in srcs if p["planned_index"] is not None]
            plan_conflict = bool(model.conflicts(planned_idx)) if len(planned_idx) == 3 else None
            sass_conflict = bool(ins.bank_conflict)
            if plan_conflict is None:
                verdict = "not fully planned"
            elif not plan_conflict and not sass_conflict:
                verdict = "survived"
            elif not plan_conflict and sass_conflict:
                verdict = "lost"
            elif plan_conflict and not sass_conflict:
                verdict = "fixed by ptxas"
            else:
                verdict = "conflict as planned"
            fmas.append({"address": f"{ins.address:#06x}", "sass": ins.text, "ptx_line": ins.ptx_line,
                         "ptx": ptx_lines[ins.ptx_line - 1].strip(), "source": ins.source,
                         "operands": pairs, "reuse_hits": ["ABCD"[s] for s in ins.reuse_hits if s < 4],
                         "planned_conflict": plan_conflict, "sass_conflict": sass_conflict,
                         "sass_conflict_banks": {str(b): r for b, r in ins.bank_conflict.items()},
                         "verdict": verdict})
        regs = []
        for ptx_name, r in by_ptx_name.items():
            if r.bank is None:
                continue
            phys = seen[ptx_name]
            banks = sorted({model.bank_of(p) for p in phys})
            regs.append({"name": "/".join(names_of[ptx_name]), "ptx_name": r.ptx_name, "planned_index": r.index, "planned_bank": r.bank,
                         "physical": {f"R{p}": n for p, n in sorted(phys.items())},
                         "physical_banks": banks,
                         "same_bank": (banks == [r.bank]) if banks else None})
        verdicts = Counter(f["verdict"] for f in fmas)
        functions.append({"name": name, "registers": regs, "fmas": fmas, "unmatched_fmas": unmatched,
                          "verdicts": dict(verdicts),
                          "ptxas_registers": kernel.summary.extra.get("registers")})
    return {"method": INFERRED_NOTE, "bank_model": model.name, "functions": functions}


def render_comparison(comparison: dict, console) -> None:

    console.print(f"\n[bold]plan vs ptxas[/] ({comparison['bank_model']}) — [italic]{comparison['method']}[/]")
    for fn in comparison["functions"]:
        t = Table(title=f"{fn['name']}: planned registers → SASS registers (ptxas used {fn['ptxas_registers']})",
                  title_justify="left")
        for col in ("name", "PTX register", "planned", "bank", "seen in SASS as", "SASS bank(s)", "bank kept"):
            t.add_column(col)
        for r in fn["registers"]:
            kept = {True: "[green]yes[/]", False: "[red]no[/]", None: "[dim]not seen in an FMA[/]"}[r["same_bank"]]
            t.add_row(r["name"], r["ptx_name"], f"R{r['planned_index']}", str(r["planned_bank"]),
                      " ".join(f"{p}×{n}" for p, n in r["physical"].items()) or "-",
                      ",".join(map(str, r["physical_banks"])) or "-", kept)
        console.print(t)
        if fn["fmas"]:
            f = Table(title=f"{fn['name']}: FMA-class instructions, plan vs SASS", title_justify="left")
            for col in ("addr", "SASS", "PTX line", "source", "planned banks A B C", "SASS banks A B C", "verdict"):
                f.add_column(col)
            for x in fn["fmas"]:
                pb = " ".join("-" if p["planned_bank"] is None else str(p["planned_bank"]) for p in x["operands"][1:])
                sb = " ".join(("*" if p["slot"] in x["reuse_hits"] else "") +
                              ("-" if p["physical_bank"] is None else str(p["physical_bank"])) for p in x["operands"][1:])
                style = {"survived": "green", "lost": "red", "fixed by ptxas": "yellow"}.get(x["verdict"], "")
                src = x["source"] or ""
                if src:
                    path, _, rest = src.partition(":")
                    src = f"{Path(path).name}:{rest.split(':')[0]}"
                f.add_row(x["address"], x["sass"].rstrip(" ;"), str(x["ptx_line"]), src, pb, sb,
                          f"[{style}]{x['verdict']}[/]" if style else x["verdict"])
            console.print(f)
        v = fn["verdicts"]
        console.print(f"{fn['name']}: {len(fn['fmas'])} FMA-class SASS instructions matched to PTX "
                      f"({fn['unmatched_fmas']} unmatched); " +
                      (", ".join(f"{k}: {n}" for k, n in v.items()) or "none") +
                      "   [dim](`*`: operand served by the reuse cache, no bank read)[/]")
