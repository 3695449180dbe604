"""Operand lowering: names, `{expr}` interpolations, registers (named, plain, vector components,
byte selectors), vectors, addresses and immediates, from AST expressions to concrete ir operands,
with the cache of operands already resolved in a scope.

The `OperandLowering` methods are part of the `Expander` (expand/__init__.py), whose current
function (`self.fn`: registers.py's FunctionContext) tells registers from symbols.
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

from .. import ast, ir
from ..errors import AsmError, Note
from ..expr import NotANumber, evaluate, format_number, parse_number
from ..parse_fast import LazyOperands
from ..source import Span
from .scope import Scope

# a PTX identifier (PTX ISA 4.4): what a string computed in { } may name
_IDENTIFIER = re.compile(r"[A-Za-z_$%][A-Za-z0-9_$]*")
_OPERANDS_KEPT = 100_000          # resolved operands kept per scope (Expander._operands)
_OPERAND_LISTS_KEPT = 20_000      # operand lists kept per scope (Expander._operand_lists)

# Vector components: PTX ISA "Vectors" (5.4.2): .x .y .z .w, or .r .g .b .a, select elements 0-3.
_COMPONENT_INDEX = {"x": 0, "y": 1, "z": 2, "w": 3, "r": 0, "g": 1, "b": 2, "a": 3}

# Video instructions' byte and half-word selectors and masks (PTX ISA "Scalar Video Instructions",
# "SIMD Video Instructions"): %r1.b0, %r1.b3210, %r1.h10. They name part of the register.
_SELECTOR = re.compile(r"\.(b[0-7]{1,4}|h[0-3]{1,2})$")


def _split_component(text: str) -> tuple[str, str] | None:
    """'q.x' -> ('q', 'x'), '%r1.b0' -> ('%r1', 'b0'); None when `text` ends in neither."""
    if len(text) > 2 and text[-2] == "." and text[-1] in _COMPONENT_INDEX:
        return text[:-2], text[-1]
    m = _SELECTOR.search(text)
    if m is not None and m.start():
        return text[:m.start()], m.group(1)
    return None


class OperandLowering:
    """AST operands and names, in a scope, to ir operands and texts."""

    # ---- an instruction's guard and operands, and the cache of those already resolved ----------
    # What an operand resolves to depends on its source text, the scope's bindings and the
    # function's registers only; `self._operands` keeps them by text for `self._operands_scope`.
    def _forget_operands(self) -> None:
        self._operands.clear()
        self._operand_lists.clear()

    def _instruction_guard(self, s: ast.Instr, scope: Scope) -> ir.Guard:
        """The `@p` / `@!p` of an instruction that has one."""
        g = self._cached_operand(s.guard.reg, scope)
        if isinstance(g, ir.Sym) and not g.offset:
            g = ir.Reg(g.name)  # PTX lets `.reg .pred done;` declare a register without '%'
        if not isinstance(g, ir.Reg):
            raise AsmError("a guard must be a predicate register", s.guard.span)
        return ir.Guard(g, s.guard.negated)

    def _instruction_operands(self, s: ast.Instr, scope: Scope) -> list[ir.Operand]:
        """The operands of one instruction, each resolved once per scope by its source text (its
        operand nodes may not be built yet: parse_fast.LazyOperands)."""
        cached = self._operands
        lists = self._operand_lists
        if scope is not self._operands_scope or len(cached) > _OPERANDS_KEPT:
            cached.clear()
            lists.clear()
            self._operands_scope = scope
        text = s.span.source.text
        ops = None
        nodes = s.operands
        lazy = type(nodes) is LazyOperands and not nodes.built
        if lazy:
            # the same operand text, the same list: instructions share it (no stage changes an
            # instruction's list, they give it a new one: regalloc._rewrite)
            seg = nodes.text()
            ops = lists.get(seg)
            if ops is not None:
                return ops
            ops = _known_operands(seg, cached)
        if ops is None:
            ops = []
            for o in nodes:
                sp = o.span
                key = text[sp.start:sp.end]
                op = cached.get(key)
                if op is None:
                    op = cached[key] = self._operand(o, scope)
                ops.append(op)
            if lazy:
                nodes.forget()
        if lazy:
            if len(lists) >= _OPERAND_LISTS_KEPT:
                lists.clear()
            lists[seg] = ops
        return ops

    def _cached_operand(self, o, scope: Scope) -> ir.Operand:
        cached = self._operands
        if scope is not self._operands_scope:
            cached.clear()
            self._operands_scope = scope
        sp = o.span
        key = sp.source.text[sp.start:sp.end]
        op = cached.get(key)
        if op is None:
            op = cached[key] = self._operand(o, scope)
        return op

    # ---- names and operands --------------------------------------------------------------------
    def _lookup(self, scope: Scope):
        def lookup(name: str, span: Span):
            try:
                v = scope.find(name)
            except KeyError:
                if self.fn is not None and name in self.fn.named:
                    raise NotANumber(f"the register {name}") from None
                raise AsmError(f"undefined name '{name}'", span) from None
            if isinstance(v, (int, float, str)):
                return v
            if isinstance(v, ir.Imm) and v.value is not None:
                return v.value
            raise NotANumber(f"bound to the operand {v.render()}")
        return lookup

    def _name_text(self, name: ast.Name, scope: Scope) -> str:
        """Paste an identifier together; interpolated parts are evaluated."""
        out = []
        for i, part in enumerate(name.parts):
            if isinstance(part, str):
                out.append(self._bound_prefix(part, scope) if i == 0 and len(name.parts) > 1 else part)
                continue
            out.append(self._interpolate(part, scope))
        return "".join(out)

    def _bound_prefix(self, text: str, scope: Scope) -> str:
        """In `acc{j}` inside a macro whose parameter `acc` is bound to the register or symbol `c`,
        the prefix is the argument: `c{j}`, not the literal `acc`."""
        try:
            v = scope.find(text)
        except KeyError:
            return text
        if isinstance(v, ir.Reg) and not v.negated or isinstance(v, ir.Sym) and not v.offset:
            return v.name
        return text

    def _interpolate(self, e, scope: Scope) -> str:
        # {p} where p is a macro parameter bound to a register or symbol pastes its name.
        if isinstance(e, ast.Name) and e.plain is not None:
            try:
                v = scope.find(e.plain)
            except KeyError:
                v = None
            if isinstance(v, (ir.Reg, ir.Sym)):
                return v.render()
        v = evaluate(e, self._lookup(scope))
        if isinstance(v, float):
            if not math.isfinite(v) or v != int(v):
                raise AsmError(f"cannot paste the non-integer {v} into a name", e.span)
            v = int(v)
        return str(v)

    def _resolve_name(self, text: str, span: Span, scope: Scope) -> ir.Operand:
        try:
            v = scope.find(text)
        except KeyError:
            v = None
        else:
            if isinstance(v, bool):
                v = int(v)
            if isinstance(v, (int, float)):
                return ir.Imm(format_number(v), v)
            if isinstance(v, str):
                return ir.Str(f'"{v}"')
            return v  # a macro parameter bound to an operand
        if text == "_":
            return ir.Reg("_")
        if self.fn is None:
            return ir.Sym(text)
        if text in self.fn.named:
            return ir.Reg(text, named=True)
        members = self.fn.named_vectors.get(text)
        if members is not None:                 # a `.regs .v4` register used whole
            return ir.Vector(tuple(ir.Reg(m, named=True) for m in members))
        if self.fn.plain_regs and self.fn.plain_regs.find(text) is not None:
            # PTX lets `.reg .b32 t;` declare a register without '%': it is a register all the
            # same (for `!t`, for `{t}`, and for the scheduler's dependencies), not a symbol.
            return ir.Reg(text)
        split = _split_component(text)
        if split is not None:
            found = self._component(split[0], split[1], span, scope)
            if found is not None:
                return found
        return ir.Sym(text)

    def _component(self, base: str, comp: str, span: Span, scope: Scope) -> ir.Operand | None:
        """`base.comp` where `base` is a vector register: a macro parameter bound to one, a
        `.regs .v4` register, or a plain `.reg .v4` register. None when `base` is none of these
        (the text then goes to ptxas as written)."""
        try:
            bound = scope.find(base)
        except KeyError:
            bound = None
        if comp not in _COMPONENT_INDEX:        # a byte/half selector: part of a scalar register
            if isinstance(bound, ir.Reg) and not bound.negated and not bound.component:
                return replace(bound, component=comp)
            if bound is None and base in self.fn.named:
                return ir.Reg(base, named=True, component=comp)
            if bound is None and self.fn.plain_regs and self.fn.plain_regs.find(base) is not None:
                return ir.Reg(base, component=comp)
            return None
        index = _COMPONENT_INDEX[comp]
        if isinstance(bound, ir.Vector):
            if index >= len(bound.elems):
                raise AsmError(f"'{base}.{comp}': '{base}' is a vector of {len(bound.elems)} elements, "
                               f"so it has no .{comp}", span)
            return bound.elems[index]
        if isinstance(bound, ir.Reg) and not bound.negated and not bound.component:
            if bound.named:
                raise AsmError(f"'{base}.{comp}': '{base}' is bound to the scalar register {bound.name}", span)
            return self._plain_component(bound.name, comp, span)
        if bound is not None:
            return None
        members = self.fn.named_vectors.get(base)
        if members is not None:
            if index >= len(members):
                raise AsmError(f"'{base}.{comp}': '{base}' is a .v{len(members)} register, so it has no .{comp}",
                               span)
            return ir.Reg(members[index], named=True)
        if base in self.fn.named:
            raise AsmError(f"'{base}.{comp}': '{base}' is a scalar register (declare it `.regs .v4 ...` "
                           "to give it components)", span)
        return self._plain_component(base, comp, span)

    def _plain_component(self, base: str, comp: str, span: Span) -> ir.Reg | None:
        """A component of a register declared by a plain `.reg .v2`/`.v4` (None when `base` is not
        such a register: `%tid.x` and friends stay the special registers they are)."""
        hit = self.fn.plain_regs.find(base) if self.fn.plain_regs else None
        if hit is None or not hit[1]:
            return None
        if _COMPONENT_INDEX[comp] >= hit[1]:
            raise AsmError(f"'{base}.{comp}': '{base}' is a .v{hit[1]} register, so it has no .{comp}", span,
                           notes=[Note("declared here", hit[0])])
        return ir.Reg(base, component=comp)

    def _operand(self, e, scope: Scope) -> ir.Operand:
        if isinstance(e, ast.Num):
            return ir.Imm(e.text, parse_number(e.text, e.span))
        if isinstance(e, ast.Name):
            return self._resolve_name(self._name_text(e, scope), e.span, scope)
        if isinstance(e, ast.RegRef):
            text = self._name_text(e.name, scope)
            split = _split_component(text) if self.fn is not None else None
            if split is not None:
                if split[1] not in _COMPONENT_INDEX:        # %r1.b0: a part of %r1
                    return ir.Reg(split[0], component=split[1])
                found = self._plain_component(split[0], split[1], e.span)
                if found is not None:
                    return found
            return ir.Reg(text)
        if isinstance(e, ast.Str):
            return ir.Str(e.value)
        if isinstance(e, ast.Pair):
            return ir.Pair(self._operand(e.first, scope), self._operand(e.second, scope))
        if isinstance(e, ast.Paren):
            return ir.Paren(tuple(self._operand(i, scope) for i in e.items))
        if isinstance(e, ast.MemRef):
            return self._memref(e, scope)
        if isinstance(e, ast.Brace):
            return self._brace(e, scope)
        if isinstance(e, ast.UnOp) and e.op == "!":
            inner = self._operand(e.operand, scope)
            if not isinstance(inner, ir.Reg):
                why = (f": '{inner.name}' is not a register this function declares" if isinstance(inner, ir.Sym)
                       and not inner.offset else "")
                raise AsmError("'!' negates a predicate register" + why, e.span)
            return ir.Reg(inner.name, inner.named, not inner.negated, inner.component)
        if isinstance(e, ast.UnOp) and e.op == "-" and isinstance(e.operand, ast.Num):
            return ir.Imm("-" + e.operand.text, -parse_number(e.operand.text, e.operand.span))
        if isinstance(e, (ast.BinOp, ast.UnOp)):
            base, offset = self._address(e, scope)
            if base is None:
                return ir.Imm(format_number(offset), offset)
            if isinstance(base, ir.Sym):
                return ir.Sym(base.name, base.offset + offset)
            raise AsmError("arithmetic on a register is only valid inside [ ] addresses", e.span)
        if isinstance(e, ast.NameRange):
            raise AsmError("NAME<lo-hi> is only valid inside { } vectors and register declarations", e.span)
        value = evaluate(e, self._lookup(scope))
        return ir.Imm(format_number(value), value)

    def _brace(self, e: ast.Brace, scope: Scope) -> ir.Operand:
        if not e.items:
            raise AsmError("empty { }", e.span)
        if len(e.items) == 1 and not isinstance(e.items[0], ast.NameRange):
            item = e.items[0]
            # {x}: a one-register vector when x names a register, else an interpolated value.
            if isinstance(item, (ast.RegRef, ast.Name)):
                op = self._operand(item, scope)
                if isinstance(op, ir.Reg):
                    return ir.Vector((op,))
                if isinstance(op, ir.Vector):
                    return op
                if isinstance(op, ir.Sym):
                    raise AsmError(f"undefined name '{op.name}'", item.span)
                return op
            value = evaluate(item, self._lookup(scope))
            if isinstance(value, str):
                # {"acc" if c else "zero"}: a computed name stands for that register or symbol
                if not _IDENTIFIER.fullmatch(value):
                    raise AsmError(f"{{...}} gives the string {value!r}, which is not a name an operand can be",
                                   item.span)
                return self._resolve_name(value, item.span, scope)
            return ir.Imm(format_number(value), value)
        elems: list[ir.Operand] = []
        for item in e.items:
            if isinstance(item, ast.NameRange):
                look = self._lookup(scope)
                lo, hi = evaluate(item.lo, look), evaluate(item.hi, look)
                if not isinstance(lo, int) or not isinstance(hi, int) or hi < lo:
                    raise AsmError(f"{item.base}<{lo}-{hi}> must run from a low to a high integer", item.span)
                if hi - lo >= 256:
                    raise AsmError("a register range in a vector is limited to 256 elements", item.span)
                for k in range(lo, hi + 1):
                    elems.append(self._resolve_name(f"{item.base}{k}", item.span, scope))
            else:
                elems.append(self._operand(item, scope))
        return ir.Vector(tuple(elems))

    def _memref(self, e: ast.MemRef, scope: Scope) -> ir.Mem:
        base, offset = self._address(e.items[0], scope)
        extra = tuple(self._operand(i, scope) for i in e.items[1:])
        if isinstance(base, ir.Mem):  # a macro parameter bound to a whole address
            return ir.Mem(base.base, base.offset + offset, base.extra + extra, base.explicit_offset)
        first = e.items[0]
        explicit = (base is not None and isinstance(first, ast.BinOp) and first.op == "+"
                    and isinstance(first.right, ast.Num))  # a literal `+0`, as nvcc writes it
        return ir.Mem(base, offset, extra, explicit)

    def _address(self, e, scope: Scope) -> tuple[ir.Operand | None, int]:
        """Split an address expression into (base register/symbol or None, constant offset)."""
        if isinstance(e, ast.BinOp) and e.op in ("+", "-"):
            lb, lo = self._address(e.left, scope)
            rb, ro = self._address(e.right, scope)
            if e.op == "-":
                if rb is not None:
                    raise AsmError("cannot subtract a register or symbol in an address", e.right.span)
                ro = -ro
            if lb is not None and rb is not None:
                raise AsmError("an address has at most one register or symbol (plus a constant)", e.span)
            return (lb if lb is not None else rb), lo + ro
        if isinstance(e, ast.UnOp) and e.op in ("-", "+"):
            b, o = self._address(e.operand, scope)
            if b is not None and e.op == "-":
                raise AsmError("cannot negate a register or symbol in an address", e.span)
            return b, (-o if e.op == "-" else o)
        if isinstance(e, (ast.Name, ast.RegRef, ast.Brace, ast.Num)):
            op = self._operand(e, scope)
            if isinstance(op, ir.Imm):
                if not isinstance(op.value, int):
                    raise AsmError("an address offset must be an integer", e.span)
                return None, op.value
            if isinstance(op, ir.Sym) and op.offset:
                return ir.Sym(op.name), op.offset
            return op, 0
        value = evaluate(e, self._lookup(scope))
        if not isinstance(value, int):
            raise AsmError("an address offset must be an integer", e.span)
        return None, value


def _known_operands(seg: str, cached: dict) -> list | None:
    """The operands of an instruction whose operand nodes were never built (`seg`: their text),
    when every one of them was resolved before (by its text: what the nodes' spans would cover);
    else None."""
    if "{" in seg or "|" in seg:             # commas inside an operand
        return None
    ops = []
    for raw in seg.split(","):
        op = cached.get(raw.strip(" \t"))
        if op is None:
            return None
        ops.append(op)
    return ops
