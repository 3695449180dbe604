"""Register declarations: `.regs`/`.temp` (named registers asmgemm allocates, with their banks and
vector groups) and plain PTX declarations (`.reg`, `.shared`, `.param`, ...: passed on as written,
with the names a plain `.reg` declares remembered, so that a name is never declared both ways).

The `RegisterDeclarations` methods are part of the `Expander` (expand/__init__.py); they evaluate
and lower through operands.py (`_lookup`, `_name_text`, `_operand`) and drop its operand cache when
a declaration turns names into registers (`_forget_operands`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import ast, ir
from ..errors import AsmError, Note
from ..expr import evaluate
from ..source import Span
from .scope import Scope

PTX_64BIT_TYPES = {".b64", ".u64", ".s64", ".f64"}
REG_TYPES = {".b8", ".b16", ".b32", ".b64", ".u8", ".u16", ".u32", ".u64", ".s8", ".s16", ".s32", ".s64",
             ".f16", ".f16x2", ".bf16", ".bf16x2", ".f32", ".f64", ".pred"}
# `.regs .v2 .f32 q` / `.regs .v4 .f32 q`: the number of components
_VECTOR_QUALIFIERS = {".v2": 2, ".v4": 4}


class PlainRegs:
    """The registers one function declares with plain `.reg` lines ('%' or not), by name, each
    with (span of its declarator, vector lanes: 0 for a scalar, 2/4 for `.v2`/`.v4`). A
    `.reg .f32 acc<4>;` range covers acc0..acc3 and is looked up without listing its names."""

    def __init__(self):
        self.exact: dict[str, tuple[Span, int]] = {}
        self.ranges: dict[str, tuple[int, Span, int]] = {}     # base -> (count, span, lanes)

    def __bool__(self) -> bool:
        return bool(self.exact or self.ranges)

    def add(self, name: str, count: int | None, span: Span, lanes: int) -> None:
        if count is None:
            self.exact.setdefault(name, (span, lanes))
        else:
            self.ranges.setdefault(name, (count, span, lanes))

    def find(self, name: str) -> tuple[Span, int] | None:
        hit = self.exact.get(name)
        if hit is not None or not self.ranges:
            return hit
        # acc12 may be acc<13>'s 12 or acc1<3>'s 2: try every split of the trailing digits.
        k = len(name)
        while k and name[k - 1].isdigit():
            k -= 1
        for cut in range(k, len(name)):
            digits = name[cut:]
            r = self.ranges.get(name[:cut])
            if r is not None and str(int(digits)) == digits and int(digits) < r[0]:
                return r[1], r[2]
        return None


@dataclass
class FunctionContext:
    named: dict[str, ir.NamedReg] = field(default_factory=dict)
    in_schedule: bool = False
    plain_regs: PlainRegs = field(default_factory=PlainRegs)  # what plain `.reg` lines declared
    # `.regs .v4 .f32 q`: q -> its components' named registers ('q.x', 'q.y', 'q.z', 'q.w')
    named_vectors: dict[str, tuple[str, ...]] = field(default_factory=dict)


class RegisterDeclarations:
    """`.regs`/`.temp` and plain declarations, into the current function's registers (`self.fn`)."""

    def _s_RegsDecl(self, s: ast.RegsDecl, scope: Scope, out, toplevel):
        self._forget_operands()         # names it declares become registers
        if self.fn is None:
            raise AsmError(f"'.{s.kind}' declares registers of a function: put it inside the function body", s.span)
        ptx_type = s.types[-1] if s.types else None
        if ptx_type not in REG_TYPES:
            raise AsmError(f"'.{s.kind}' needs a register type such as .f32, .b32, .u64 or .pred, got {ptx_type}", s.span)
        # `.regs .v4 .f32 q`: a vector register; its components q.x .. q.w are named registers of an
        # aligned group (as with `: vec4`), and `q` alone is the vector {q.x, q.y, q.z, q.w}.
        lanes = 0
        for t in s.types[:-1]:
            if t not in _VECTOR_QUALIFIERS or lanes:
                raise AsmError(f"'.{s.kind}' takes one register type, optionally after .v2 or .v4 "
                               f"(as in `.{s.kind} .v4 .f32 q`); got {' '.join(s.types)}", s.span)
            lanes = _VECTOR_QUALIFIERS[t]
        look = self._lookup(scope)
        names: list[tuple[str, int, Span]] = []
        for item in s.items:
            if item.lo is None:
                names.append((item.base, -1, item.span))
                continue
            lo, hi = evaluate(item.lo, look), evaluate(item.hi, look)
            if not isinstance(lo, int) or not isinstance(hi, int) or hi < lo:
                raise AsmError(f"register range {item.base}<{lo}-{hi}> must run from a low to a high integer", item.span)
            if hi - lo >= 256:
                raise AsmError(f"register range {item.base}<{lo}-{hi}> has more than 256 registers", item.span)
            names.extend((f"{item.base}{k}", k, item.span) for k in range(lo, hi + 1))
        vec = 1
        banks: list[int | None] = [None] * len(names)
        for attr in s.attrs:
            if attr.name in ("vec2", "vec4"):
                vec = int(attr.name[3:])
            elif attr.name == "bank":
                if len(attr.args) != 1:
                    raise AsmError("bank(expr) takes one expression of i (position) and n (range number)", attr.span)
                for pos, (nm, num, _) in enumerate(names):
                    inner = Scope(scope)
                    inner.values["i"] = pos
                    inner.values["n"] = num if num >= 0 else pos
                    banks[pos] = _int_value(evaluate(attr.args[0], self._lookup(inner)), attr.span, "bank")
            elif attr.name == "banks":
                vals = [_int_value(evaluate(a, look), a.span, "bank") for a in attr.args]
                if len(vals) != len(names):
                    raise AsmError(f"banks(...) lists {len(vals)} banks for {len(names)} registers", attr.span)
                banks = vals
            else:
                raise AsmError(f"unknown register attribute '{attr.name}' (known: bank(expr), banks(b0, b1, ...), vec2, vec4)",
                               attr.span)
        if lanes:
            if vec > 1:
                raise AsmError(f"a .v{lanes} register is already a vector group: drop vec{vec}", s.span)
            if ptx_type == ".pred":
                raise AsmError("predicate registers have no banks or vectors", s.span)
            if any(b is not None for b in banks):
                # The components take consecutive registers from an index aligned to the vector
                # size, so their banks are not each free; scalars with `: vecN, banks(...)` say
                # exactly which bank each element wants, and the planner checks them all.
                raise AsmError(f"bank()/banks() do not apply to a .v{lanes} register: its components take "
                               "consecutive registers from an aligned index", s.span,
                               hint=f"to choose banks, declare scalar registers with `: vec{lanes}, banks(...)`")
            # Each vector becomes its components, in order, as one aligned group.
            for nm, _, span in names:
                if nm in self.fn.named_vectors or nm in self.fn.named:
                    first = self.fn.named.get(nm) or self.fn.named[self.fn.named_vectors[nm][0]]
                    raise AsmError(f"register '{nm}' is already declared", span,
                                   notes=[Note("first declared here", first.span)])
                plain = self._plain_reg_span(nm)
                if plain is not None:
                    raise AsmError(f"register '{nm}' is declared twice: by this '.{s.kind}' and by a plain '.reg'",
                                   span, notes=[Note("first declared here", plain)],
                                   hint="declare it once: `.regs` for a named register asmgemm allocates, or `.reg`")
            vec = lanes
            for nm, _, _ in names:
                self.fn.named_vectors[nm] = tuple(f"{nm}.{c}" for c in "xyzw"[:lanes])
            banks = [None] * (len(names) * lanes)
            names = [(f"{nm}.{c}", num, span) for nm, num, span in names for c in "xyzw"[:lanes]]
        if ptx_type == ".pred" and (vec > 1 or any(b is not None for b in banks)):
            raise AsmError("predicate registers have no banks or vectors", s.span)
        if vec > 1 and len(names) % vec:
            raise AsmError(f"vec{vec} needs a multiple of {vec} registers, got {len(names)}", s.span)
        width_align = 2 if ptx_type in PTX_64BIT_TYPES else 1
        for pos, (nm, _, span) in enumerate(names):
            if nm in self.fn.named:
                raise AsmError(f"register '{nm}' is already declared", span,
                               notes=[Note("first declared here", self.fn.named[nm].span)])
            if nm in self.fn.named_vectors and not lanes:
                raise AsmError(f"register '{nm}' is already declared", span,
                               notes=[Note("first declared here", self.fn.named[self.fn.named_vectors[nm][0]].span)])
            plain = self._plain_reg_span(nm)
            if plain is not None:
                raise AsmError(f"register '{nm}' is declared twice: by this '.{s.kind}' and by a plain '.reg'", span,
                               notes=[Note("first declared here", plain)],
                               hint="declare it once: `.regs` for a named register asmgemm allocates, or `.reg`")
            group = tuple(n for n, _, _ in names[pos - pos % vec: pos - pos % vec + vec]) if vec > 1 else ()
            align = vec * width_align if (vec > 1 and pos % vec == 0) else width_align
            self.fn.named[nm] = ir.NamedReg(nm, ptx_type, s.kind == "temp", banks[pos], group, align, span)

    def _plain_reg_span(self, name: str) -> Span | None:
        hit = self.fn.plain_regs.find(name) if self.fn.plain_regs else None
        return hit[0] if hit is not None else None

    def _s_Decl(self, s: ast.Decl, scope: Scope, out, toplevel):
        quals = " ".join(self._qualifier(q, scope) for q in s.qualifiers)
        decls = ", ".join(self._declarator(d, scope) for d in s.declarators)
        kind = "reg" if s.qualifiers and s.qualifiers[0].word == ".reg" else "decl"
        if kind == "reg" and self.fn is not None:
            self._forget_operands()     # names it declares become registers
            self._check_plain_regs(s, scope)
        self._count(1, s.span)
        out.append(ir.Directive(f"{quals} {decls};", s.span, kind=kind))

    def _check_plain_regs(self, s: ast.Decl, scope: Scope):
        """A name declared both by `.regs`/`.temp` and by a plain `.reg` is an error: the two
        mechanisms would give one name two registers."""
        lanes = max((_VECTOR_QUALIFIERS.get(q.word, 0) for q in s.qualifiers), default=0)
        for d in s.declarators:
            name = self._name_text(d.name.name if isinstance(d.name, ast.RegRef) else d.name, scope)
            if name.startswith("%"):
                # `.regs` names never start with '%'; kept for its vector components (%q.x).
                self.fn.plain_regs.add(name, d.count, d.span, lanes)
                continue
            if d.count is None:
                clash = name if name in self.fn.named or name in self.fn.named_vectors else None
            else:                       # `.reg .f32 acc<4>;` declares acc0..acc3
                clash = next((n for n in self.fn.named if n.startswith(name) and n[len(name):].isdigit()
                              and str(int(n[len(name):])) == n[len(name):] and int(n[len(name):]) < d.count), None)
            if clash is not None:
                named = self.fn.named[self.fn.named_vectors[clash][0] if clash in self.fn.named_vectors else clash]
                raise AsmError(f"register '{clash}' is declared twice: by '.{'temp' if named.temp else 'regs'}' "
                               "and by this plain '.reg'", d.span,
                               notes=[Note("first declared here", named.span)],
                               hint="declare it once: `.regs` for a named register asmgemm allocates, or `.reg`")
            self.fn.plain_regs.add(name, d.count, d.span, lanes)

    def _qualifier(self, q: ast.Qualifier, scope) -> str:
        if q.arg is None:
            return q.word
        return f"{q.word} {self._operand(q.arg, scope).render()}"

    def _declarator(self, d: ast.Declarator, scope) -> str:
        name = self._name_text(d.name.name if isinstance(d.name, ast.RegRef) else d.name, scope)
        text = name
        if d.count is not None:
            text += f"<{d.count}>"
        for dim in d.dims:
            if dim is None:
                text += "[]"
            else:
                v = self._operand(dim, scope)
                if not isinstance(v, ir.Imm):
                    raise AsmError("an array size must be a constant", dim.span if hasattr(dim, "span") else d.span)
                text += f"[{v.render()}]"
        if d.init:
            text += " " + d.init
        return text


def _int_value(v, span, what):
    # The evaluator is C-like: a comparison or `not` gives the int 1 or 0, and a bool operand counts
    # as 1/0 (expr._num), so `bank(i % 2 == 0)` is bank 1 or 0. A bool never comes out of a .sasm
    # expression; one handed in from Python is taken the same way, as the int it equals.
    if isinstance(v, bool):
        return int(v)
    if not isinstance(v, int):
        raise AsmError(f"{what} must be an integer, got {v!r}", span)
    return v
