"""The model's control codes next to the ones ptxas actually chose.

ptxas schedules again and allocates its own registers, so this is a comparison of two schedulers,
not a check of ours: how often does the model predict the stall count (and yield hint) that ptxas
wrote for the same instruction?

Matching a region's instructions (in emitted order) to SASS instructions, best effort:
  'ptx-lines'     when the build used `--trace ptx-lines` and ptxas ran with -lineinfo, every SASS
                  instruction names the PTX line it came from: a PTX instruction matches the SASS
                  instructions of its line, preferring the one whose opcode is the SASS opcode of
                  its timing class (an `ld.shared.v4.f32` -> `LDS.128`);
  'opcode-order'  otherwise: the region's expected SASS opcodes are aligned in order with the
                  kernel's SASS (the start that matches most instructions, each next match within
                  a short look-ahead).
Unmatched instructions (ptxas folded or split them) are listed and not counted.

The SASS side is the inspector's report (asmgemm.sass.inspect.inspect_cubin), read through the
attributes `.kernels[name].instructions[i]` with `.opcode`, `.stall`, `.yield_`, `.write_sb`,
`.read_sb`, `.wait_mask`, `.ptx_line`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from .control_codes import ControlCode, control_codes
from .depgraph import DepGraph
from .list_scheduler import simulate

LOOKAHEAD = 8
_FUNC_RE = re.compile(r"\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([A-Za-z_$%][\w$]*)")
_REGION_RE = re.compile(r"^\s*// \.schedule region (\d+)")
_END_RE = re.compile(r"^\s*// \.endschedule")


@dataclass
class MatchRow:
    function: str
    region: int
    node: int
    ptx: str
    ptx_line: int | None
    expected_sass: str
    sass_index: int | None = None
    sass_opcode: str | None = None
    model: ControlCode | None = None
    sass_stall: int | None = None
    sass_yield: bool | None = None
    sass_write_sb: int | None = None
    sass_read_sb: int | None = None
    sass_wait_mask: int | None = None

    @property
    def matched(self) -> bool:
        return self.sass_index is not None

    @property
    def stall_match(self) -> bool:
        return self.matched and self.model is not None and self.model.stall == self.sass_stall

    @property
    def yield_match(self) -> bool:
        return self.matched and self.model is not None and self.model.yield_ == self.sass_yield

    def to_json(self) -> dict:
        return {"function": self.function, "region": self.region, "node": self.node, "ptx": self.ptx,
                "ptx_line": self.ptx_line, "expected_sass": self.expected_sass,
                "sass_index": self.sass_index, "sass_opcode": self.sass_opcode,
                "model": self.model.to_json() if self.model else None,
                "sass": None if not self.matched else {
                    "stall": self.sass_stall, "yield": self.sass_yield, "write_sb": self.sass_write_sb,
                    "read_sb": self.sass_read_sb, "wait_mask": self.sass_wait_mask},
                "stall_match": self.stall_match, "yield_match": self.yield_match}


@dataclass
class SassComparison:
    method: str
    rows: list[MatchRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # The model evaluated on ptxas's own order of each region: (stall equal, compared), counting
    # only instructions whose next SASS instruction is the next region instruction in ptxas's
    # order, so both stalls describe the same pair. This tests the latency table, not the order.
    same_order_stalls: tuple[int, int] = (0, 0)
    same_order_by_opcode: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def matched(self) -> int:
        return sum(r.matched for r in self.rows)

    @property
    def stall_matches(self) -> int:
        return sum(r.stall_match for r in self.rows)

    @property
    def yield_matches(self) -> int:
        return sum(r.yield_match for r in self.rows)

    def by_opcode(self) -> dict[str, tuple[int, int]]:
        """SASS opcode -> (stall matches, matched): a high overall figure can hide that only the
        FFMAs (stall 1 on both sides) agree."""
        out: dict[str, list[int]] = {}
        for r in self.rows:
            if r.matched:
                c = out.setdefault(_base(r.sass_opcode), [0, 0])
                c[0] += r.stall_match
                c[1] += 1
        return {k: (v[0], v[1]) for k, v in sorted(out.items())}

    def order_kept(self) -> tuple[int, int]:
        """(pairs in order, pairs): of the consecutive matched instructions of each region (in the
        order asmgemm emitted), how many ptxas also placed in that order."""
        kept = total = 0
        prev = None
        for r in self.rows:
            if not r.matched:
                continue
            if prev is not None and (prev.function, prev.region) == (r.function, r.region):
                total += 1
                kept += r.sass_index > prev.sass_index
            prev = r
        return kept, total

    def to_json(self) -> dict:
        kept, pairs = self.order_kept()
        return {"method": self.method, "instructions": len(self.rows), "matched": self.matched,
                "stall_matches": self.stall_matches, "yield_matches": self.yield_matches,
                "order_kept_pairs": kept, "order_pairs": pairs,
                "stall_matches_by_opcode": {k: {"equal": a, "matched": b} for k, (a, b) in self.by_opcode().items()},
                "model_on_ptxas_order": {
                    "stall_equal": self.same_order_stalls[0], "compared": self.same_order_stalls[1],
                    "by_opcode": {k: {"equal": a, "compared": b} for k, (a, b) in self.same_order_by_opcode.items()}},
                "notes": self.notes, "rows": [r.to_json() for r in self.rows]}


def region_ptx_lines(ptx: str) -> dict[tuple[str, int], list[int]]:
    """(function, region index) -> 1-based PTX line of each instruction of the region, in the
    order emitted, found from the `// .schedule region N` markers emit.py writes."""
    out: dict[tuple[str, int], list[int]] = {}
    function = None
    current: list[int] | None = None
    for no, line in enumerate(ptx.splitlines(), start=1):
        if current is None:
            m = _FUNC_RE.search(line)
            if m and not line.lstrip().startswith("//"):
                function = m.group(1)
            m = _REGION_RE.match(line)
            if m and function is not None:
                current = out.setdefault((function, int(m.group(1))), [])
            continue
        if _END_RE.match(line):
            current = None
            continue
        text = line.strip()
        if not text or text.startswith("//") or text.startswith("."):
            continue
        current.append(no)
    return out


def _base(opcode: str | None) -> str:
    return (opcode or "").split(".", 1)[0].upper()


def _sb(value) -> int | None:
    if value is None or value == 7 or value == "-":
        return None
    return int(value)


def _fill(row: MatchRow, index: int, ins) -> None:
    row.sass_index = index
    row.sass_opcode = getattr(ins, "opcode", None)
    row.sass_stall = getattr(ins, "stall", None)
    y = getattr(ins, "yield_", None)
    row.sass_yield = None if y is None else bool(y)
    row.sass_write_sb = _sb(getattr(ins, "write_sb", None))
    row.sass_read_sb = _sb(getattr(ins, "read_sb", None))
    row.sass_wait_mask = getattr(ins, "wait_mask", None)


def compare_with_sass(build_result, sass_report) -> SassComparison:
    """Match every scheduled region's instructions to the SASS of `sass_report` and compare the
    modelled control codes with ptxas's. `build_result` is a pipeline.BuildResult."""
    report = build_result.schedule_report
    if report is None or not report.regions:
        return SassComparison("none", notes=["no .schedule regions in this build"])
    lines = region_ptx_lines(build_result.ptx)
    kernels = getattr(sass_report, "kernels", {}) or {}
    have_lines = any(getattr(i, "ptx_line", None) for k in kernels.values() for i in k.instructions)
    method = "ptx-lines" if have_lines else "opcode-order"
    cmp = SassComparison(method)
    if not have_lines:
        cmp.notes.append("the SASS carries no PTX line numbers (build with --trace ptx-lines): "
                         "matched by opcode order, which can pick the wrong copy of a repeated pattern")
    for reg in report.regions:
        sass = kernels.get(reg.function)
        ptx_lines = lines.get((reg.function, reg.index), [])
        codes = reg.control_emitted
        rows = []
        for k, n in enumerate(reg.emitted_order):
            node = reg.graph.nodes[n]
            rows.append(MatchRow(reg.function, reg.index, n, node.text(),
                                 ptx_lines[k] if k < len(ptx_lines) else None,
                                 _base(node.timing.sass), model=codes[n]))
        if sass is None:
            cmp.notes.append(f"kernel {reg.function} is not in the SASS report (a device function "
                             f"inlined by ptxas?): region {reg.index} not compared")
        elif have_lines:
            _match_by_lines(rows, sass.instructions)
        else:
            _match_by_order(rows, sass.instructions)
        cmp.rows.extend(rows)
        _model_on_ptxas_order(cmp, reg, rows)
    return cmp


def _model_on_ptxas_order(cmp: SassComparison, reg, rows: list[MatchRow]) -> None:
    matched = [r for r in rows if r.matched]
    if len(matched) != len(rows) or len({r.sass_index for r in rows}) != len(rows):
        return                    # ptxas folded or merged some: no order of the whole region
    order = [r.node for r in sorted(rows, key=lambda r: r.sass_index)]
    # ptxas allocates its own registers, so PTX-level WAR/WAW edges do not bind it: keep the true
    # dependencies (RAW, memory, barriers) only.
    g = DepGraph(reg.graph.nodes, [e for e in reg.graph.edges if e.kind not in ("war", "waw")])
    g.finish()
    if g.respects(order):
        return                    # ptxas proved an independence the graph does not know
    codes = control_codes(g, simulate(g, order))
    by_node = {r.node: r for r in rows}
    equal, compared = cmp.same_order_stalls
    per_op = dict(cmp.same_order_by_opcode)
    for a, b in zip(order, order[1:]):
        ra, rb = by_node[a], by_node[b]
        if rb.sass_index != ra.sass_index + 1:
            continue              # something outside the region sits between them in the SASS
        hit = codes[a].stall == ra.sass_stall
        equal += hit
        compared += 1
        op = _base(ra.sass_opcode)
        e, c = per_op.get(op, (0, 0))
        per_op[op] = (e + hit, c + 1)
    cmp.same_order_stalls = (equal, compared)
    cmp.same_order_by_opcode = dict(sorted(per_op.items()))


def _match_by_lines(rows: list[MatchRow], sass: list) -> None:
    by_line: dict[int, list[int]] = {}
    for i, ins in enumerate(sass):
        ln = getattr(ins, "ptx_line", None)
        if ln:
            by_line.setdefault(int(ln), []).append(i)
    for row in rows:
        cands = by_line.get(row.ptx_line or -1, [])
        if not cands:
            continue
        pick = next((i for i in cands if _base(sass[i].opcode) == row.expected_sass), cands[0])
        _fill(row, pick, sass[pick])


def _align(rows: list[MatchRow], opcodes: list[str], start: int) -> list[int | None]:
    out: list[int | None] = []
    j = start
    for row in rows:
        hit = None
        for i in range(j, min(len(opcodes), j + LOOKAHEAD)):
            if opcodes[i] == row.expected_sass:
                hit = i
                break
        out.append(hit)
        if hit is not None:
            j = hit + 1
    return out


def _match_by_order(rows: list[MatchRow], sass: list) -> None:
    if not rows:
        return
    opcodes = [_base(i.opcode) for i in sass]
    first = rows[0].expected_sass
    starts = [i for i, op in enumerate(opcodes) if op == first] or list(range(len(opcodes)))
    best, best_count = None, -1
    for s in starts:
        got = _align(rows, opcodes, s)
        count = sum(h is not None for h in got)
        if count > best_count:
            best, best_count = got, count
    for row, hit in zip(rows, best or []):
        if hit is not None:
            _fill(row, hit, sass[hit])
