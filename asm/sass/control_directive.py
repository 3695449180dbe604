"""The `.control` directive after ptxas: each directive's SASS instructions, found through the line
table, and its control fields written on them through the patcher (sass/patch.py), so that the
same safety check as `asmgemm patch` runs before a patched cubin is returned.

    apply_controls(module, cubin, traced_cubin, traced_ptx, source) -> ControlReport

`module` is the scheduled ir.Module whose `.schedule` regions carry the directives
(ir.ScheduleRegion.controls); `cubin` is the build that ships (plain PTX, ptxas without
-lineinfo, unless the build asked for line information itself); `traced_cubin` is ptxas's code for
the same module emitted in trace mode "ptx-lines" (a `.loc` per PTX instruction pointing at its
own PTX line, `traced_ptx`) and assembled with -lineinfo.

Which instructions a directive selects. nvdisasm -g gives each SASS instruction of the traced
cubin the PTX line it came from; sass/inspect.ptx_positions turns that line into the position of
the PTX instruction in its function (program order), and the module says which positions lie in
which region. A directive selects the SASS instructions traced to a PTX instruction of its own
region whose opcode (with modifiers, as nvdisasm prints it) matches its pattern in full.
Instructions ptxas moved into the region from outside keep their own lines and are not selected;
those it moved out of the region still are.

Which cubin is patched: the one the build ships, never the traced one. The line table describes
the traced cubin, so the two must hold the same code: every word of every kernel's .text is
compared, control bits included, and a difference stops the build. ptxas 13.0 gives identical
words with and without -lineinfo on the test kernel and on sgemm (tests/test_control_directive.py
checks both); should a later ptxas not, the directive fails loudly instead of patching the wrong
instructions.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .. import ir
from ..errors import AsmError, Note
from ..isa import control_bits as cb
from .elf import ElfCubin
from .decode import decode
from .inspect import DECODABLE_TARGETS, ptx_positions
from .listing import disassemble_listing
from .patch import Change, PatchPlan, plan_patch
from .patch_rules import Rule, Rules

SHOWN_HAZARDS = 6           # hazards listed in an error; the JSON report has them all


@dataclass
class Directive:
    """One `.control` of the build, where it stands, and what it selected."""
    control: ir.ControlDirective
    kernel: str
    region: int                              # the region's index in its function
    region_instructions: list[int] = field(default_factory=list)   # SASS indices traced to the region
    selected: list[int] = field(default_factory=list)              # ... whose opcode matches
    # the selected instructions whose fields differ from ptxas's once every directive is applied
    # (a later directive's field wins, so two directives may share, or undo, a change)
    changes: list[Change] = field(default_factory=list)

    def location(self) -> str:
        return self.control.span.location() if self.control.span else "?"

    def to_json(self, instructions) -> dict:
        return {"directive": self.control.span.text().strip() if self.control.span else self.control.written,
                "location": self.location(), "kernel": self.kernel, "region": self.region,
                "pattern": self.control.pattern, "fields": _readable(self.control.fields),
                "region_instructions": len(self.region_instructions),
                "selected": [f"{16 * k:#06x}" for k in self.selected],
                "opcodes": sorted({instructions[k] for k in self.selected}),
                "changed": len(self.changes), "changes": [c.to_json() for c in self.changes]}


@dataclass
class ControlReport:
    directives: list[Directive]
    plan: PatchPlan
    names: dict[str, list[str]]              # kernel -> opcode of each SASS instruction

    @property
    def cubin(self) -> bytes:
        return self.plan.cubin

    def to_json(self) -> dict:
        return {"accepted": not self.plan.hazards, "changed": len(self.plan.changes),
                "directives": [d.to_json(self.names[d.kernel]) for d in self.directives],
                "hazards": [h.to_json() for h in self.plan.hazards]}

    def lines(self) -> list[str]:
        """One line per directive, for the build's text output."""
        out = []
        for d in self.directives:
            fields: dict[str, int] = {}
            for c in d.changes:
                for name in c.fields():
                    fields[name] = fields.get(name, 0) + 1
            counts = ", ".join(f"{n} {k}" for k, n in fields.items()) or "no field changed"
            out.append(f"{d.location()}: .control {d.control.written}: {len(d.selected)} of the region's "
                       f"{len(d.region_instructions)} SASS instructions selected in {d.kernel}, "
                       f"{len(d.changes)} now differ from ptxas's ({counts}); check passed")
        return out


def regions_with_controls(module: ir.Module) -> list[tuple[ir.Function, ir.ScheduleRegion]]:
    return [(fn, item) for fn in module.functions() if fn.body
            for item in fn.body if isinstance(item, ir.ScheduleRegion) and item.controls]


def has_controls(module: ir.Module) -> bool:
    return bool(regions_with_controls(module))


def apply_controls(module: ir.Module, cubin: bytes, traced_cubin: bytes, traced_ptx: str,
                   source: str, target: str) -> ControlReport:
    """The patched cubin and what each directive did; an AsmError at the directive when a
    directive selects nothing, or when the check refuses the patch (nothing is returned then)."""
    found = regions_with_controls(module)
    first = found[0][1].controls[0]
    if target not in DECODABLE_TARGETS:
        # the control-field layout and the check's latencies are sm_90's (isa/control_bits.py)
        raise AsmError(f"'.control' writes the control codes of {'/'.join(DECODABLE_TARGETS)} SASS; this build "
                       f"is for {target}", first.span, hint="build with --target sm_90 (or sm_90a)")
    _same_code(cubin, traced_cubin, source, first)
    listing = disassemble_listing(traced_cubin, line_info=True)
    positions = ptx_positions(traced_ptx)
    directives: list[Directive] = []
    rules: list[Rule] = []
    names: dict[str, list[str]] = {}
    for fn, region in found:
        raw = listing.functions.get(fn.name)
        if raw is None:
            raise AsmError(f"'.control': ptxas made no code section for '{fn.name}' (a device function that "
                           "was inlined has no SASS of its own), so its regions have no SASS instructions",
                           region.controls[0].span)
        names[fn.name] = [_name(fn.name, ins, source) for ins in raw.instructions]
        in_region = _region_positions(fn, region)
        traced = [k for k, ins in enumerate(raw.instructions)
                  if ins.line is not None and (ins.line_file or "").endswith(".ptx")
                  and positions.get(ins.line, (None, -1))[0] == fn.name
                  and positions[ins.line][1] in in_region]
        for control in region.controls:
            pattern = re.compile(control.pattern)
            d = Directive(control, fn.name, region.index, traced,
                          [k for k in traced if pattern.fullmatch(names[fn.name][k])])
            if not d.selected:
                raise _selects_nothing(d, names[fn.name])
            spans = {"[[rule]]": control.span, "opcode": control.pattern_span}
            rules.append(Rule(len(rules), fn.name, pattern, "indices", frozenset(d.selected),
                              dict(control.fields), spans))
            directives.append(d)
    plan = plan_patch(cubin, Rules(source, rules), source)
    for change in plan.changes:
        for number in change.rules:
            directives[number - 1].changes.append(change)
    report = ControlReport(directives, plan, names)
    if plan.hazards:
        raise _refused(report)
    return report


def _name(kernel: str, ins, source: str) -> str:
    """The opcode with its modifiers, as plan_patch matches rules against it (LDS.U.128)."""
    try:
        return decode(ins.address, ins.text, ins.lo, ins.hi).name
    except ValueError as exc:
        raise AsmError(f"{source}: {kernel} {ins.address:#06x}: {exc}") from None


def _region_positions(fn: ir.Function, region: ir.ScheduleRegion) -> set[int]:
    """The program-order positions of the region's instructions among the function's (the order
    the emitter writes them in, and ptx_positions counts)."""
    out, pos = set(), 0
    for item in fn.body:
        if isinstance(item, ir.ScheduleRegion):
            for it in item.items:
                if isinstance(it, ir.Instruction):
                    if item is region:
                        out.add(pos)
                    pos += 1
        elif isinstance(item, ir.Instruction):
            pos += 1
    return out


def _same_code(cubin: bytes, traced: bytes, source: str, where: ir.ControlDirective) -> None:
    """The traced build's code must be the shipped build's, word for word, or its line table
    does not describe the instructions being patched."""
    plain, lined = ElfCubin(cubin, source), ElfCubin(traced, source)
    for name in plain.kernels:
        a = plain.words(name)
        b = lined.words(name) if name in lined.kernels else []
        if a == b:
            continue
        k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        raise AsmError(f"'.control' cannot be mapped: ptxas made different code for '{name}' with line "
                       f"information (-lineinfo) than without it (first difference at {16 * k:#06x}; "
                       f"{len(a)} and {len(b)} words), so the line table does not describe the code that "
                       "ships", where.span,
                       hint="build with --trace ptx-lines, whose cubin carries its own line table")


def _selects_nothing(d: Directive, names: list[str]) -> AsmError:
    if not d.region_instructions:
        return AsmError(f"'.control' selects no SASS instruction: no instruction of {d.kernel}'s SASS is "
                        f"traced to this '.schedule' region (ptxas folded or moved all of it)",
                        d.control.pattern_span or d.control.span)
    seen = sorted({names[k] for k in d.region_instructions})
    shown = ", ".join(seen[:12]) + (", ..." if len(seen) > 12 else "")
    how = "a regular expression, matched in full" if d.control.written.startswith('"') else \
        "matched exactly; write a regular expression in quotes to match several"
    return AsmError(f"'.control' selects no SASS instruction: no opcode of the region's "
                    f"{len(d.region_instructions)} SASS instructions matches {d.control.written} ({how}); "
                    f"the region's opcodes: {shown}", d.control.pattern_span or d.control.span)


def _refused(report: ControlReport) -> AsmError:
    """The error for a refused patch: at the directive that changed the instruction the first
    hazard names, or, when the hazard lies elsewhere (a consumer brought too close by stalls cut
    before it), at the first directive that changed something in that kernel."""
    hazards = sorted(report.plan.hazards, key=lambda h: (h.kernel, h.address))
    first = hazards[0]
    index = first.address // 16
    culprits = [d for d in report.directives if d.kernel == first.kernel and index in
                {c.index for c in d.changes}] or \
        [d for d in report.directives if d.kernel == first.kernel and d.changes] or report.directives
    lines = [h.line() for h in hazards[:SHOWN_HAZARDS]]
    if len(hazards) > SHOWN_HAZARDS:
        lines.append(f"... and {len(hazards) - SHOWN_HAZARDS} more")
    notes = [Note("this directive changed instructions of the same kernel too", d.control.span)
             for d in report.directives if d is not culprits[0] and d.kernel == first.kernel and d.changes][:3]
    return AsmError(f"'.control' refused by the safety check, {len(hazards)} hazard(s); nothing written\n"
                    + "\n".join(lines), culprits[0].control.span, notes=notes)


def _readable(fields: dict[str, int]) -> dict:
    """The raw field values the directive sets, in the directive's own words."""
    out: dict = {}
    for key, value in fields.items():
        if key == "yield":
            out["yield"] = "on" if value == 0 else "off"
        elif key in ("write_barrier", "read_barrier"):
            out[key] = "none" if value == cb.NO_BARRIER else value
        elif key == "wait_mask":
            out["wait"] = [s for s in range(cb.NUM_SCOREBOARDS) if value >> s & 1]
        elif key == "reuse":
            out["reuse"] = [s for i, s in enumerate(cb.REUSE_SLOTS) if value >> i & 1]
        else:
            out[key] = value
    return out
