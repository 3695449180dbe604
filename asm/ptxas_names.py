"""Where a ptxas message without a PTX line points in the source: at the declaration of what it names.

ptxas reports some errors against a function or a variable rather than a line:

    Entry function 'k' uses too much shared data (0x100000 bytes, 0xc000 max)
    Entry function 'k' uses too much local data (...)
    Unresolved extern function 'f'
    File uses too much global constant data (0x11170 bytes, 0x10000 max)

The emitted module (ir.Module, after expansion, so names are final) still knows the span of every
function and declaration. A message about too much shared, local or constant data points at the
largest declaration of that state space that counts (the function's own, else a module-level one
it uses), with a note at the function; any other message points at the first function or variable
it names.
"""
from __future__ import annotations

import re

from . import ir
from .errors import Note
from .source import Span

_QUOTED = re.compile(r"'([^'\s]+)'")
_TOO_MUCH = re.compile(r"uses too much (shared|local|global constant|constant) data")
_SPACE = {"shared": ".shared", "local": ".local", "global constant": ".const", "constant": ".const"}
# A declaration as expand renders it: qualifiers, then declarators (`name<n>`, `name[a][b]`, `= init`).
_QUALS = re.compile(r"\s*((?:\.[A-Za-z_][\w$]*(?:\s+\d+)?\s+)+)")
_DECLARATOR = re.compile(r"\s*(%?[A-Za-z_$][\w$]*)\s*(?:<\s*\d+\s*>)?((?:\s*\[\s*\d*\s*\])*)\s*(?:=[^,;]*)?\s*[,;]")
_DIM = re.compile(r"\[\s*(\d*)\s*\]")
_BITS = re.compile(r"\.[bsuf](8|16|32|64)$|\.(pred)$|\.[bf]16x2$|\.bf16$|\.e4m3|\.e5m2")
_LANES = {".v2": 2, ".v4": 4, ".v8": 8}


class _Decl:
    __slots__ = ("name", "space", "size", "span")

    def __init__(self, name: str, space: str, size: int, span: Span | None):
        self.name, self.space, self.size, self.span = name, space, size, span


def locate(message: str, module: ir.Module) -> tuple[Span | None, list[Note]]:
    """(span, notes) for a ptxas message without a line: (None, []) when it names nothing the
    module declares."""
    functions = {}
    for f in module.functions():
        # the definition, not a prototype that came before it
        if f.name not in functions or functions[f.name].body is None:
            functions[f.name] = f
    top = [d for item in module.items if isinstance(item, ir.Directive) for d in _declarations(item)]
    names = _QUOTED.findall(message)
    too_much = _TOO_MUCH.search(message)
    if too_much is not None:
        space = _SPACE[too_much.group(1)]
        fn = next((functions[n] for n in names if n in functions), None)
        own = [d for item in ir.iter_body(fn.body or []) if isinstance(item, ir.Directive)
               for d in _declarations(item)] if fn is not None else []
        used = _symbols(fn) if fn is not None else None
        candidates = [d for d in own if d.space == space] or \
                     [d for d in top if d.space == space and (used is None or d.name in used)]
        biggest = max(candidates, key=lambda d: d.size, default=None)
        if biggest is not None and biggest.span is not None:
            notes = [Note(f"in {fn.kind} '{fn.name}', declared here", fn.span)] if fn is not None else []
            return biggest.span, notes
    for n in names:
        if n in functions and functions[n].span is not None:
            return functions[n].span, []
        hit = next((d for d in top if d.name == n and d.span is not None), None)
        if hit is None:
            hit = next((d for f in functions.values() for item in ir.iter_body(f.body or [])
                        if isinstance(item, ir.Directive) for d in _declarations(item)
                        if d.name == n and d.span is not None), None)
        if hit is not None:
            return hit.span, []
    return None, []


def _declarations(item: ir.Directive) -> list[_Decl]:
    if item.kind != "decl":
        return []
    text = item.text
    m = _QUALS.match(text)
    if m is None:
        return []
    quals = m.group(1).split()
    space = next((q for q in quals if q in (".shared", ".local", ".global", ".const", ".param")), "")
    width, lanes = 1, 1
    for q in quals:
        b = _BITS.match(q)
        if b is not None:
            width = int(b.group(1)) // 8 if b.group(1) else 1
        lanes = _LANES.get(q, lanes)
    elem = width * lanes
    out = []
    pos = m.end()
    while True:
        d = _DECLARATOR.match(text, pos)
        if d is None:
            return out
        size = elem
        for dim in _DIM.findall(d.group(2)):
            size *= int(dim) if dim else 0
        out.append(_Decl(d.group(1), space, size, item.span))
        pos = d.end()


def _symbols(fn: ir.Function) -> set[str]:
    """The names a function's instructions mention (module variables it uses)."""
    out = set()
    todo = [op for ins in fn.instructions() for op in ins.operands]
    while todo:
        op = todo.pop()
        if isinstance(op, ir.Sym):
            out.add(op.name)
        elif isinstance(op, ir.Mem):
            if op.base is not None:
                todo.append(op.base)
            todo.extend(op.extra)
        elif isinstance(op, (ir.Vector, ir.Paren)):
            todo.extend(op.elems if isinstance(op, ir.Vector) else op.items)
        elif isinstance(op, ir.Pair):
            todo += (op.first, op.second)
    return out
