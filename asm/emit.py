"""Stage 5: ir.Module -> PTX text. Deterministic: the same module gives byte-identical text.

Trace modes tie each emitted instruction to where it came from:
  none      – plain PTX
  comments  – a `// file:line` comment whenever the .sasm line changes
  loc       – `.file`/`.loc` directives pointing at the .sasm, so ptxas -lineinfo maps SASS to it
  ptx-lines – `.loc` directives pointing each instruction at its own line of this PTX file, so
              the SASS inspector can match every SASS instruction to one PTX instruction

Plain PTX (trace "none", a `LineLayout` from the pipeline) is emitted line-preserving: every item
lands on the line of the source it came from. ptxas names function-scope variables after the PTX
line of their declaration (`$___ZZ1kPiiE4tile__44` in a relocatable cubin), so only a
line-preserving re-emission gives a cubin identical to the original's, symbol table included.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from . import ir
from .source import Span
from .version import __version__

TRACE_MODES = ("none", "comments", "loc", "ptx-lines")
DEFAULT_VERSION = "9.0"


class EmittedPtx:
    """The PTX and where each of its lines came from. The text is kept as the pieces the emitter
    made (`pieces`; one after another, they are the text) until it is asked for whole (`text`,
    joined then and kept): the command line writes the pieces, so that a large kernel's PTX is
    never held twice, joined and in pieces, nor grown by copies."""

    def __init__(self, text: str | list[str], line_spans: list[Span | None] | None = None):
        self._pieces = [text] if isinstance(text, str) else list(text)
        self.line_spans = line_spans if line_spans is not None else []   # 1-based PTX line -> span (0 unused)

    @property
    def text(self) -> str:
        if len(self._pieces) != 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0]

    def pieces(self) -> tuple[str, ...]:
        return tuple(self._pieces)

    def __repr__(self) -> str:
        return f"EmittedPtx({sum(map(len, self._pieces))} characters, {len(self.line_spans) - 1} lines)"

    def span_for_line(self, line: int) -> Span | None:
        if 0 < line < len(self.line_spans):
            return self.line_spans[line]
        return None


@dataclass
class LineLayout:
    """Emit line-preserving: items of `path` go on their source lines. `header` holds the lines of
    the source's .version/.target/.address_size ('version', 'target', 'address_size')."""
    path: str
    header: dict[str, int] = field(default_factory=dict)


class _Writer:
    """The PTX's lines, in order. Finished lines are joined a few thousand at a time into blocks
    (`blocks`), so that a large kernel's text is never held as a string per line (three times its
    size). Only the last line is ever changed after it was added: `lines` keeps it."""

    FLUSH_LINES = 4096

    def __init__(self, layout: LineLayout | None = None):
        self.blocks: list[str] = []        # the finished lines, each followed by "\n"
        self.joined = 0                    # how many lines the blocks hold
        self.lines: list[str] = []         # the lines after them
        self.spans: list[Span | None] = [None]
        self.layout = layout

    def add(self, text: str, span: Span | None = None):
        if "\n" not in text:
            self.lines.append(text)
            self.spans.append(span)
        else:
            for piece in text.split("\n"):
                self.lines.append(piece)
                self.spans.append(span)
        if len(self.lines) > self.FLUSH_LINES:
            self._finish(self.lines[:-1])
            self.joined += len(self.lines) - 1
            del self.lines[:-1]

    def _finish(self, lines: list[str]) -> None:
        """`lines` as one more block, each followed by a newline."""
        lines.append("")
        self.blocks.append("\n".join(lines))

    @property
    def next_line(self) -> int:
        return self.joined + len(self.lines) + 1

    def pieces(self) -> list[str]:
        """Every line, each ending in a newline, with no blank lines at the end (one newline when
        there is nothing else), as blocks of lines. The writer is spent afterwards."""
        lines, blocks = self.lines, self.blocks
        while lines and not lines[-1]:
            lines.pop()
        if lines:
            self._finish(lines)
        else:
            while blocks and not blocks[-1].rstrip("\n"):     # blocks of blank lines only
                blocks.pop()
            if blocks and blocks[-1].endswith("\n\n"):      # a block ending in blank lines
                blocks[-1] = blocks[-1].rstrip("\n") + "\n"
        self.lines, self.blocks = [], []
        return blocks or ["\n"]

    def line_of(self, span: Span | None, end: bool = False) -> int | None:
        """The source line an item belongs on (its last character's line with end=True), or None
        when not line-preserving or the item comes from another file."""
        if self.layout is None or span is None or span.source.path != self.layout.path:
            return None
        return span.source.line_of(span.end - 1 if end and span.end > span.start else span.start)

    def put(self, text: str, span: Span | None, line: int | None):
        """`text` on source line `line`: blank lines fill the gap up to it; a line already written
        (the source had several items on one line, or a longer rendering went past it) takes the
        text at its end, since PTX is free-form. Never after a // comment, which would swallow it."""
        if line is None or line >= self.next_line:
            while line is not None and self.next_line < line:
                self.lines.append("")
                self.spans.append(None)
            self.add(text, span)
            return
        last = self.lines[-1] if self.lines else ""
        if "//" in last:
            self.add(text, span)
            return
        first, _, rest = text.partition("\n")
        self.lines[-1] = (last + " " + first.lstrip()) if last.strip() else first
        if self.spans[-1] is None:         # ptxas's complaints about this line point at the source
            self.spans[-1] = span
        if rest:
            self.add(rest, span)


def emit_ptx(module: ir.Module, target: str, *, trace: str = "none", source_name: str = "",
             ptx_name: str = "out.ptx", layout: LineLayout | None = None) -> EmittedPtx:
    """`layout` (plain PTX, trace "none" only): keep every item on its source line."""
    if trace not in TRACE_MODES:
        raise ValueError(f"trace must be one of {TRACE_MODES}")
    if trace != "none":
        layout = None
    if layout is not None:
        return _emit_line_preserving(module, target, source_name, layout)
    w = _Writer()
    _banner(w, source_name)
    w.add("")
    w.add(f".version {module.version or DEFAULT_VERSION}")
    extra = [t for t in module.target[1:]] if module.target else []
    w.add(".target " + ", ".join([target] + extra))
    w.add(f".address_size {module.address_size or 64}")
    w.add("")
    files: dict[str, int] = {}
    if trace == "loc":
        for fn in module.functions():
            for ins in fn.instructions():
                if ins.span is not None and ins.span.path not in files:
                    files[ins.span.path] = len(files) + 1
        for path, fid in files.items():
            w.add(f'.file {fid} "{path}"')
    elif trace == "ptx-lines":
        w.add(f'.file 1 "{ptx_name}"')
    for item in module.items:
        if isinstance(item, ir.Function):
            _function(w, item, trace, files)
        elif isinstance(item, ir.Directive):
            if trace in ("loc", "ptx-lines") and item.kind in ("loc", "file"):
                continue  # our own line table replaces the source's
            w.add(item.render(), item.span)
    return EmittedPtx(w.pieces(), w.spans)


def _banner(w: _Writer, source_name: str):
    w.add("//")
    w.add(f"// Generated by asmgemm {__version__}" + (f" from {source_name}" if source_name else ""))
    w.add("// Edit the .sasm source, not this file.")
    w.add("//")


BANNER_LINES = 4


def _emit_line_preserving(module: ir.Module, target: str, source_name: str, layout: LineLayout) -> EmittedPtx:
    w = _Writer(layout)
    header = layout.header
    extra = [t for t in module.target[1:]] if module.target else []
    lines = [("version", f".version {module.version or DEFAULT_VERSION}"),
             ("target", ".target " + ", ".join([target] + extra)),
             ("address_size", f".address_size {module.address_size or 64}")]
    # The first line written: the header's when the source has one (it is written first, so an item
    # the source put above it moves below it anyway), else the first item's.
    placed = [n for n in header.values() if n]
    first_item = next((w.line_of(_item_span(it)) for it in module.items if w.line_of(_item_span(it))), None)
    first = min(placed) if placed else (first_item or 1)
    # The banner goes above the first source line when it fits there (nvcc's own 7-line banner
    # leaves room), in one line when only that fits, else at the end: it never shifts a line.
    top = first > 1
    if first > BANNER_LINES:
        _banner(w, source_name)
    elif top:
        w.add(f"// Generated by asmgemm {__version__}" + (f" from {source_name}" if source_name else "")
              + "; edit the .sasm source, not this file.")
    for key, text in lines:
        w.put(text, None, header.get(key))
    for item in module.items:
        if isinstance(item, ir.Function):
            _function_placed(w, item)
        elif isinstance(item, ir.Directive):
            w.put(item.render(), item.span, w.line_of(item.span))
    if not top:
        w.add("")
        _banner(w, source_name)
    return EmittedPtx(w.pieces(), w.spans)


def _item_span(item) -> Span | None:
    return getattr(item, "span", None)


def _function_placed(w: _Writer, fn: ir.Function):
    start = w.line_of(fn.span)
    first_body = None
    for item in ir.iter_body(fn.body or []):
        first_body = w.line_of(_item_span(item))
        if first_body is not None:
            break
    if first_body is None:
        first_body = w.line_of(fn.span, end=True)
    head = [fn.header, *fn.perf]
    needed = sum(h.count("\n") + 1 for h in head) + (1 if fn.body is not None else 0)
    if start is not None and first_body is not None and start + needed > first_body:
        # The source wrote the header on fewer lines than the usual rendering takes: one line,
        # so that the body's declarations keep their lines.
        flat = " ".join(p.strip() for h in head for p in h.split("\n"))
        w.put(flat.replace("( ", "(").replace(" )", ")") + (" {" if fn.body is not None else ";"), fn.span, start)
    else:
        w.put(fn.header, fn.span, start)
        for p in fn.perf:
            w.add(p, fn.span)
        if fn.body is None:
            w.lines[-1] += ";"
        else:
            w.add("{", fn.span)
    if fn.body is None:
        return
    depth = 1
    rendered = _Rendered()
    for item in fn.body:
        for it in (item.items if isinstance(item, ir.ScheduleRegion) else (item,)):
            ind = "\t" * depth
            if isinstance(it, ir.Instruction):
                text = ind + _render(it, rendered)
                if it.note:
                    text = f"{text:<72} // {it.note}"
                w.put(text, it.span, w.line_of(it.span))
            elif isinstance(it, ir.Label):
                w.put(it.render(), it.span, w.line_of(it.span))
            elif isinstance(it, ir.ScopeOpen):
                w.put(ind + "{", it.span, w.line_of(it.span))
                depth += 1
            elif isinstance(it, ir.ScopeClose):
                depth -= 1
                w.put("\t" * depth + "}", it.span, w.line_of(it.span, end=True))
            elif isinstance(it, ir.Directive):
                w.put(ind + it.render(), it.span, w.line_of(it.span))
    w.put("}", None, w.line_of(fn.span, end=True))


def _function(w: _Writer, fn: ir.Function, trace: str, files: dict[str, int]):
    w.add("")
    w.add(fn.header, fn.span)
    for p in fn.perf:
        w.add(p, fn.span)
    if fn.body is None:
        w.lines[-1] += ";"
        return
    w.add("{", fn.span)
    state = {"depth": 1, "last_line": None, "files": files}
    _body(w, fn.body, trace, state)
    w.add("}")


def _body(w: _Writer, items, trace, state):
    for item in items:
        ind = "\t" * state["depth"]
        if isinstance(item, ir.ScheduleRegion):
            w.add(f"{ind}// .schedule region {item.index}" + (f" ({item.span.location()})" if item.span else ""), item.span)
            for control in item.controls:
                w.add(ind + control.render(), control.span)
            _body(w, item.items, trace, state)
            w.add(f"{ind}// .endschedule", item.span)
        elif isinstance(item, ir.Instruction):
            _trace(w, item, trace, state, ind)
            text = ind + _render(item, state.setdefault("rendered", _Rendered()))
            if item.note:
                text = f"{text:<72} // {item.note}"
            w.add(text, item.span)
        elif isinstance(item, ir.Label):
            w.add(item.render(), item.span)
        elif isinstance(item, ir.ScopeOpen):
            w.add(ind + "{", item.span)
            state["depth"] += 1
        elif isinstance(item, ir.ScopeClose):
            state["depth"] -= 1
            w.add("\t" * state["depth"] + "}", item.span)
        elif isinstance(item, ir.Directive):
            if trace in ("loc", "ptx-lines") and item.kind in ("loc", "file"):
                continue
            w.add(ind + item.render(), item.span)


class _Rendered:
    """What _render has rendered: each operand object (by id; expansion and the register plan
    share an operand object among all its uses), and the operand lists most recently met (by id;
    expansion shares a list among the instructions that read the same operands). Both live as
    long as the module being emitted, so their ids are theirs."""

    LISTS_KEPT = 20_000            # a source whose lists are all different keeps no more than this

    def __init__(self):
        self.operands: dict[int, str] = {}
        self.lists: dict[int, str] = {}


def _render(item: ir.Instruction, rendered: _Rendered) -> str:
    """item.render(), from what was rendered before."""
    head = (item.guard.render() + " " if item.guard else "") + item.opcode
    ops = item.operands
    if not ops:
        return head + ";"
    lists = rendered.lists
    text = lists.get(id(ops))
    if text is None:
        done = rendered.operands
        texts = []
        for o in ops:
            t = done.get(id(o))
            if t is None:
                t = done[id(o)] = o.render()
            texts.append(t)
        text = ", ".join(texts)
        if len(lists) >= rendered.LISTS_KEPT:
            lists.clear()
        lists[id(ops)] = text
    return head + " " + text + ";"


def _trace(w: _Writer, item: ir.Instruction, trace: str, state, ind: str):
    span = item.span
    if trace == "comments" and span is not None:
        key = (span.path, span.line)
        if key != state["last_line"]:
            via = "".join(f" (via {s.location()})" for s in item.expanded_from[:1])
            w.add(f"{ind}// {span.location()}{via}", span)
            state["last_line"] = key
    elif trace == "loc" and span is not None:
        key = (span.path, span.line)
        if key != state["last_line"]:
            w.add(f"{ind}.loc {state['files'][span.path]} {span.line} {span.col}", span)
            state["last_line"] = key
    elif trace == "ptx-lines":
        w.add(f"{ind}.loc 1 {w.next_line + 1} 1", span)
