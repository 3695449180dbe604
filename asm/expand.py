"""Stage 2: AST -> flat instruction list (ir.Module).

Evaluates `.const`, expands `.macro` calls, unrolls `.for`, resolves `.if`, inlines `.include`,
substitutes {expr} interpolations, collects `.regs`/`.temp` declarations, and resolves every
operand to a concrete ir operand. The result has no macro-layer constructs left.
"""
from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from . import ast, ir
from .errors import AsmError, Note
from .expr import NotANumber, evaluate, format_number, parse_number
from .files import read_source
from .parse import parse_source
from .parse_fast import LazyOperands
from .parse_tree import MAX_EXPR_DEPTH, MAX_NESTING, parse_expression
from .source import SourceFile, Span
from .targets import SUPPORTED_TARGETS

# a PTX identifier (PTX ISA 4.4): what a string computed in { } may name
_IDENTIFIER = re.compile(r"[A-Za-z_$%][A-Za-z0-9_$]*")

# Limits that turn hostile or mistaken input into errors instead of hangs.
MAX_LOOP_TRIPS = 100_000          # iterations of one .for
MAX_EXPANDED_ITEMS = 2_000_000    # body items produced by one build; nested .for loops are checked
                                  # against it up front (_s_For), before their work is done
MAX_MACRO_DEPTH = 64
MAX_INCLUDE_DEPTH = 32
_OPERANDS_KEPT = 100_000          # resolved operands kept per scope (Expander._operands)

PTX_64BIT_TYPES = {".b64", ".u64", ".s64", ".f64"}
REG_TYPES = {".b8", ".b16", ".b32", ".b64", ".u8", ".u16", ".u32", ".u64", ".s8", ".s16", ".s32", ".s64",
             ".f16", ".f16x2", ".bf16", ".bf16x2", ".f32", ".f64", ".pred"}


@dataclass
class _Macro:
    name: str
    params: list[str]
    body: list
    span: Span


class _Scope:
    """A chain of bindings: module constants <- macro parameters / loop variables <- ..."""

    def __init__(self, parent: "_Scope | None" = None):
        self.parent = parent
        self.values: dict[str, object] = {}
        self.spans: dict[str, Span] = {}

    def find(self, name: str):
        s = self
        while s is not None:
            if name in s.values:
                return s.values[name]
            s = s.parent
        raise KeyError(name)

    def has(self, name: str) -> bool:
        try:
            self.find(name)
            return True
        except KeyError:
            return False


class _PlainRegs:
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


# Vector components: PTX ISA "Vectors" (5.4.2): .x .y .z .w, or .r .g .b .a, select elements 0-3.
_COMPONENT_INDEX = {"x": 0, "y": 1, "z": 2, "w": 3, "r": 0, "g": 1, "b": 2, "a": 3}
_VECTOR_QUALIFIERS = {".v2": 2, ".v4": 4}


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


@dataclass
class _FunctionContext:
    named: dict[str, ir.NamedReg] = field(default_factory=dict)
    in_schedule: bool = False
    plain_regs: _PlainRegs = field(default_factory=_PlainRegs)  # what plain `.reg` lines declared
    # `.regs .v4 .f32 q`: q -> its components' named registers ('q.x', 'q.y', 'q.z', 'q.w')
    named_vectors: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass
class ExpandResult:
    module: ir.Module
    tunables: dict[str, list]          # `.const NAME ?= ...` parameters with their declared choices
    parameters: dict[str, object]      # every overridable constant and the value used
    constants: dict[str, object]       # every top-level constant (parameters too) and its value
    includes: tuple[Path, ...] = ()    # every file `.include` read, as found


class Expander:
    def __init__(self, defines: dict[str, str] | None = None, include_dirs: list[str] | None = None):
        self.defines = dict(defines or {})
        self.used_defines: set[str] = set()
        self.include_dirs = [Path(d) for d in (include_dirs or [])]
        self.macros: dict[str, _Macro] = {}
        self.items_emitted = 0
        self.macro_stack: list[tuple[str, Span]] = []
        self.include_stack: list[str] = []
        self.included: list[Path] = []
        self.uid = 0
        self.version: str | None = None
        self.target: list[str] = []
        self.address_size: int | None = None
        self.parameters: dict[str, object] = {}
        self.fn: _FunctionContext | None = None
        self.tunables: dict[str, list] = {}
        self.tune_spans: dict[str, Span] = {}
        # Active .for loops, innermost last: [remaining trips including this one, trips, span].
        self.loops: list[list] = []
        # .for variables bound by the loops around the current statement, per macro body: a macro
        # body gets a fresh frame, since its loops are lexically its own.
        self.loop_vars: list[dict[str, Span]] = [{}]
        self.current: Span | None = None   # the statement being expanded (for RecursionError)
        # Operands already resolved in `_operands_scope`, by their source text: what an operand
        # resolves to depends on that text, the scope's bindings and the function's registers
        # only, and a large source repeats the same few hundred register names and addresses
        # (most of a 20 MB build's expansion was resolving them again). Emptied whenever a
        # binding or a register declaration changes (_forget_operands) or the scope is another.
        self._operands: dict[str, ir.Operand] = {}
        self._operands_scope: _Scope | None = None

    # ---- entry point ---------------------------------------------------------------------------
    def expand(self, module: ast.Module) -> ExpandResult:
        root = _Scope()
        self.include_stack.append(str(Path(module.source.path).resolve()) if module.source.path else "<input>")
        top: list = []
        try:
            self._stmts(module.body, root, top, toplevel=True)
        except RecursionError:
            raise AsmError(f"this is nested too deeply for asmgemm (limits: blocks {MAX_NESTING} deep, "
                           f"macro calls {MAX_MACRO_DEPTH} deep, includes {MAX_INCLUDE_DEPTH} deep, "
                           f"expressions {MAX_EXPR_DEPTH} levels)", self.current) from None
        unknown = sorted(set(self.defines) - self.used_defines)
        if unknown:
            params = ", ".join(sorted(self.parameters)) or "none"
            raise AsmError(f"-D {unknown[0]}: this source has no overridable constant named '{unknown[0]}' "
                           f"(parameters: {params})",
                           hint="declare it with `.const NAME ?= default` to make it a parameter")
        for name, span in self.tune_spans.items():
            if name not in self.parameters:
                raise AsmError(f"'.tune {name}' names no parameter: declare it with `.const {name} ?= default`", span)
        mod = ir.Module(self.version, self.target, self.address_size, top, module.source.path)
        constants = {k: v for k, v in root.values.items() if isinstance(v, (int, float, str))}
        return ExpandResult(mod, dict(self.tunables), dict(self.parameters), constants, tuple(self.included))

    # ---- statements ----------------------------------------------------------------------------
    def _count(self, n: int, span: Span):
        self.items_emitted += n
        if self.items_emitted > MAX_EXPANDED_ITEMS:
            raise AsmError(f"expansion produced more than {MAX_EXPANDED_ITEMS} items; is a loop or macro runaway?", span)

    def _stmts(self, stmts, scope: _Scope, out: list, toplevel: bool = False):
        instr, handle = ast.Instr, self._s_Instr
        for s in stmts:
            if type(s) is instr:           # most statements of a large source: no lookup by name
                self.current = s.span
                handle(s, scope, out, toplevel)
            else:
                self._stmt(s, scope, out, toplevel)

    def _stmt(self, s, scope: _Scope, out: list, toplevel: bool):
        self.current = s.span
        kind = type(s).__name__
        handler = getattr(self, "_s_" + kind)
        handler(s, scope, out, toplevel)

    def _s_Version(self, s: ast.Version, scope, out, toplevel):
        self._need_toplevel(s, toplevel, ".version")
        self.version = s.text

    def _s_Target(self, s: ast.Target, scope, out, toplevel):
        self._need_toplevel(s, toplevel, ".target")
        if s.names and s.names[0] not in SUPPORTED_TARGETS:
            raise AsmError(f"unsupported .target {s.names[0]} (supported: {', '.join(SUPPORTED_TARGETS)})", s.span)
        self.target = s.names

    def _s_AddressSize(self, s: ast.AddressSize, scope, out, toplevel):
        self._need_toplevel(s, toplevel, ".address_size")
        self.address_size = s.bits

    def _s_RawDirective(self, s: ast.RawDirective, scope, out, toplevel):
        self._count(1, s.span)
        text = s.text if s.keyword == ".callprototype" else f"{s.keyword} {s.text}"
        out.append(ir.Directive(text, s.span, kind=s.keyword[1:]))

    def _need_toplevel(self, s, toplevel, what):
        if not toplevel:
            raise AsmError(f"'{what}' belongs at the top level of the file, not inside a block", s.span)

    def _s_ConstDef(self, s: ast.ConstDef, scope: _Scope, out, toplevel):
        if s.name in scope.values:
            raise AsmError(f"'{s.name}' is already defined in this scope", s.span,
                           notes=[Note("first defined here", scope.spans[s.name])])
        if s.name in self.macros:
            raise AsmError(f"'{s.name}' is already the name of a macro", s.span)
        if s.overridable and s.name in self.defines:
            self.used_defines.add(s.name)
            value = _define_value(s.name, self.defines[s.name])
        elif s.name in self.defines and not s.overridable:
            raise AsmError(f"-D {s.name}: '{s.name}' is a fixed constant here",
                           s.span, hint=f"write `.const {s.name} ?= ...` to let -D override it")
        else:
            value = evaluate(s.value, self._lookup(scope))
        if s.overridable:
            self.parameters[s.name] = value
        scope.values[s.name] = value
        self._forget_operands()
        scope.spans[s.name] = s.span

    def _s_MacroDef(self, s: ast.MacroDef, scope, out, toplevel):
        if s.name in self.macros:
            raise AsmError(f"macro '{s.name}' is already defined", s.span,
                           notes=[Note("first defined here", self.macros[s.name].span)])
        self.macros[s.name] = _Macro(s.name, s.params, s.body, s.span)

    def _s_MacroCall(self, s: ast.MacroCall, scope: _Scope, out, toplevel):
        macro = self.macros.get(s.name)
        if macro is None:
            near = _closest(s.name, self.macros)
            raise AsmError(f"undefined macro '{s.name}'" + (f" (did you mean '{near}'?)" if near else ""), s.span)
        if len(s.args) != len(macro.params):
            raise AsmError(f"macro '{s.name}' takes {len(macro.params)} argument(s) "
                           f"({', '.join(macro.params) or 'none'}), got {len(s.args)}", s.span,
                           notes=[Note("defined here", macro.span)])
        if len(self.macro_stack) >= MAX_MACRO_DEPTH:
            chain = " -> ".join(n for n, _ in self.macro_stack[-6:])
            raise AsmError(f"macro calls nested deeper than {MAX_MACRO_DEPTH} (... {chain} -> {s.name}); "
                           "is a macro calling itself without end?", s.span)
        args = [self._macro_arg(a, scope) for a in s.args]
        inner = _Scope(scope)
        for p, a in zip(macro.params, args):
            inner.values[p] = a
            inner.spans[p] = macro.span
        self.uid += 1
        inner.values["__uid__"] = self.uid
        self.macro_stack.append((s.name, s.span))
        self.loop_vars.append({})
        produced: list = []
        try:
            self._stmts(macro.body, inner, produced, toplevel)
        finally:
            self.macro_stack.pop()
            self.loop_vars.pop()
        for item in produced:
            _mark_expansion(item, s.span)
        out.extend(produced)

    def _macro_arg(self, a, scope):
        """Macro arguments are bound as values: numbers stay numbers, everything else an operand."""
        op = self._operand(a, scope)
        if isinstance(op, ir.Imm) and op.value is not None:
            return op.value
        return op

    def _s_For(self, s: ast.For, scope: _Scope, out, toplevel):
        outer = self.loop_vars[-1].get(s.var)
        if outer is not None:
            raise AsmError(f"'.for {s.var}' reuses the variable of an enclosing '.for {s.var}': inside this loop "
                           f"'{s.var}' would no longer mean the outer loop's value", s.span,
                           notes=[Note(f"the enclosing '.for {s.var}'", outer)],
                           hint="give the inner loop its own variable name")
        look = self._lookup(scope)
        args = []
        for a in s.args:
            v = evaluate(a, look)
            if not isinstance(v, int) or isinstance(v, bool):
                raise AsmError("range() arguments must be integers", a.span)
            args.append(v)
        if not 1 <= len(args) <= 3:
            raise AsmError(f"range() takes 1 to 3 arguments, got {len(args)}", s.span)
        if len(args) == 3 and args[2] == 0:
            raise AsmError("range() step must not be zero", s.args[2].span)
        trips = _range_length(*args)      # len(range(...)) overflows past sys.maxsize
        if trips > MAX_LOOP_TRIPS:
            raise AsmError(f"'.for' would run {trips} times (limit {MAX_LOOP_TRIPS})", s.span)
        self._check_projected_items(s, trips)
        frame = [trips, trips, s.span]
        self.loops.append(frame)
        self.loop_vars[-1][s.var] = s.span
        try:
            for n, i in enumerate(range(*args)):
                frame[0] = trips - n
                inner = _Scope(scope)
                inner.values[s.var] = i
                inner.spans[s.var] = s.span
                self._stmts(s.body, inner, out, toplevel)
        finally:
            self.loops.pop()
            del self.loop_vars[-1][s.var]

    def _check_projected_items(self, s: ast.For, trips: int):
        """MAX_EXPANDED_ITEMS before the work is done: this loop's trips, times the trips the
        enclosing loops have left (this iteration included), times a lower bound of what one
        iteration produces (the instructions, labels and declarations directly in the body, at
        least 1), plus what the build has produced so far."""
        if not trips:
            return
        per_trip = max(1, sum(1 for b in s.body if isinstance(b, (ast.Instr, ast.Decl, ast.Label))))
        projected = trips * per_trip
        for remaining, _, _ in self.loops:
            projected *= remaining
        if self.items_emitted + projected <= MAX_EXPANDED_ITEMS:
            return
        counts = " × ".join([str(f[0]) for f in self.loops] + [str(trips)])
        what = f"{counts} iterations" + (f" × {per_trip} statements" if per_trip > 1 else "")
        after = f" after the {self.items_emitted:,} already produced" if self.items_emitted else ""
        raise AsmError(f"'.for' would expand to at least {projected:,} items ({what}){after}, over the limit "
                       f"of {MAX_EXPANDED_ITEMS:,} items per build", s.span,
                       notes=[Note(f"inside this '.for' ({f[1]} iterations, {f[0]} still to run)", f[2])
                              for f in reversed(self.loops)][:4])

    def _s_If(self, s: ast.If, scope: _Scope, out, toplevel):
        look = self._lookup(scope)
        for cond, body in s.branches:
            if evaluate(cond, look):
                self._stmts(body, _Scope(scope), out, toplevel)
                return
        if s.orelse is not None:
            self._stmts(s.orelse, _Scope(scope), out, toplevel)

    def _s_Include(self, s: ast.Include, scope: _Scope, out, toplevel):
        here = Path(s.span.path).parent if s.span.path else Path(".")
        candidates = [here / s.path] + [d / s.path for d in self.include_dirs]
        found = next((c for c in candidates if c.is_file()), None)
        if found is None:
            raise AsmError(f"include file not found: \"{s.path}\" (looked in {', '.join(str(c.parent) for c in candidates)})",
                           s.span)
        key = str(found.resolve())
        if key in self.include_stack:
            chain = " -> ".join(Path(p).name for p in self.include_stack[self.include_stack.index(key):])
            raise AsmError(f"include cycle: {chain} -> {found.name}", s.span)
        if len(self.include_stack) >= MAX_INCLUDE_DEPTH:
            raise AsmError(f"includes nested deeper than {MAX_INCLUDE_DEPTH}", s.span)
        src = read_source(found, shown_as=str(found) if not s.span.path else _display_path(here, s.path, found))
        module = parse_source(src)
        self.included.append(found)
        self.include_stack.append(key)
        try:
            self._stmts(module.body, scope, out, toplevel)
        finally:
            self.include_stack.pop()

    def _s_Schedule(self, s: ast.Schedule, scope: _Scope, out, toplevel):
        if self.fn is None:
            raise AsmError("'.schedule' belongs inside a function body", s.span)
        if self.fn.in_schedule:
            raise AsmError("'.schedule' regions do not nest", s.span)
        self.fn.in_schedule = True
        items: list = []
        try:
            self._stmts(s.body, _Scope(scope), items, toplevel)
        finally:
            self.fn.in_schedule = False
        for it in items:
            if isinstance(it, (ir.Label, ir.ScopeOpen, ir.ScopeClose)):
                raise AsmError("a '.schedule' region must be straight-line code: no labels or { } scopes inside",
                               it.span or s.span)
        out.append(ir.ScheduleRegion(items, s.span))

    def _s_Tune(self, s: ast.Tune, scope: _Scope, out, toplevel):
        if s.name in self.tune_spans:
            raise AsmError(f"'.tune {s.name}' appears twice", s.span, notes=[Note("first here", self.tune_spans[s.name])])
        look = self._lookup(scope)
        args = [evaluate(a, look) for a in s.choices.args]
        if s.choices.func == "range":
            if not 1 <= len(args) <= 3 or not all(isinstance(a, int) for a in args) or (len(args) == 3 and args[2] == 0):
                raise AsmError("range() wants 1 to 3 integers and a non-zero step", s.choices.span)
            count = _range_length(*args)
            if count > 1024:
                raise AsmError(f"'.tune {s.name}' lists {count} values (limit 1024)", s.span)
            values = list(range(*args))
        else:
            values = args
        if not values:
            raise AsmError(f"'.tune {s.name}' lists no values", s.span)
        if len(values) > 1024:
            raise AsmError(f"'.tune {s.name}' lists {len(values)} values (limit 1024)", s.span)
        self.tunables[s.name] = values
        self.tune_spans[s.name] = s.span

    def _s_ErrorDirective(self, s: ast.ErrorDirective, scope, out, toplevel):
        raise AsmError(s.message, s.span)

    def _s_RegsDecl(self, s: ast.RegsDecl, scope: _Scope, out, toplevel):
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
                    inner = _Scope(scope)
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

    def _s_Decl(self, s: ast.Decl, scope: _Scope, out, toplevel):
        quals = " ".join(self._qualifier(q, scope) for q in s.qualifiers)
        decls = ", ".join(self._declarator(d, scope) for d in s.declarators)
        kind = "reg" if s.qualifiers and s.qualifiers[0].word == ".reg" else "decl"
        if kind == "reg" and self.fn is not None:
            self._forget_operands()     # names it declares become registers
            self._check_plain_regs(s, scope)
        self._count(1, s.span)
        out.append(ir.Directive(f"{quals} {decls};", s.span, kind=kind))

    def _check_plain_regs(self, s: ast.Decl, scope: _Scope):
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

    def _s_Function(self, s: ast.Function, scope: _Scope, out, toplevel):
        if not toplevel or self.fn is not None:
            raise AsmError("functions cannot be defined inside other blocks", s.span)
        name = self._name_text(s.name, scope)
        head = " ".join(self._qualifier(q, scope) for q in s.qualifiers)
        head = (head + " " if head else "") + f".{s.kind}"
        if s.ret_params:
            head += " (" + ", ".join(self._param(p, scope) for p in s.ret_params) + ")"
        head += f" {name}"
        params = tuple(self._param_info(p, scope) for p in (s.params or []))
        if s.params is not None:
            if s.params:
                head += "(\n\t" + ",\n\t".join(self._param(p, scope) for p in s.params) + "\n)"
            else:
                head += "()"
        perf = []
        for pd in s.perf:
            vals = [self._operand(v, scope).render() for v in pd.values]
            perf.append(pd.word + (" " + ", ".join(vals) if vals else ""))
        body = None
        named: list[ir.NamedReg] = []
        if s.body is not None:
            self.fn = _FunctionContext()
            body = []
            try:
                self._stmts(s.body, _Scope(scope), body, toplevel=False)
                named = list(self.fn.named.values())
            finally:
                self.fn = None
        out.append(ir.Function(s.kind, name, head, perf, body, named, s.span, params))

    def _param_info(self, p: ast.Param, scope) -> ir.ParamInfo:
        """A parameter as the runtime needs it: name, PTX type, and the byte size of an array
        parameter (`.param .align 64 .b8 tmap[128]`)."""
        words = [q.word for q in p.qualifiers]
        ptype = next((w for w in words if w in REG_TYPES), "")
        dims = [self._operand(d, scope) for d in p.dims if d is not None]
        count = 1
        for d in dims:
            count *= d.value if isinstance(d, ir.Imm) and isinstance(d.value, int) else 1
        return ir.ParamInfo(self._name_text(p.name, scope), ptype, count if p.dims else None)

    def _param(self, p: ast.Param, scope) -> str:
        quals = " ".join(self._qualifier(q, scope) for q in p.qualifiers)
        text = f"{quals} {self._name_text(p.name, scope)}"
        for dim in p.dims:
            text += "[]" if dim is None else f"[{self._operand(dim, scope).render()}]"
        return text

    def _s_Label(self, s: ast.Label, scope, out, toplevel):
        if self.fn is None:
            raise AsmError("a label belongs inside a function body", s.span)
        self._count(1, s.span)
        out.append(ir.Label(self._name_text(s.name, scope), s.span))

    def _s_Scope(self, s: ast.Scope, scope, out, toplevel):
        if self.fn is None:
            raise AsmError("a { } block belongs inside a function body", s.span)
        out.append(ir.ScopeOpen(s.span))
        self._stmts(s.body, _Scope(scope), out, toplevel)
        out.append(ir.ScopeClose(s.span))

    def _forget_operands(self) -> None:
        self._operands.clear()

    def _s_Instr(self, s: ast.Instr, scope, out, toplevel):
        if self.fn is None:
            raise AsmError("an instruction belongs inside a function body", s.span)
        if s.pinned and not self.fn.in_schedule:
            raise AsmError("'.pin' outside a '.schedule' region: only the scheduler moves instructions, "
                           "so there is nothing to pin here", s.span,
                           hint="put it inside '.schedule' ... '.endschedule', or drop the '.pin'")
        parts = s.opcode.parts
        opcode = parts[0] if len(parts) == 1 and type(parts[0]) is str else self._name_text(s.opcode, scope)
        guard = None
        if s.guard is not None:
            g = self._cached_operand(s.guard.reg, scope)
            if isinstance(g, ir.Sym) and not g.offset:
                g = ir.Reg(g.name)  # PTX lets `.reg .pred done;` declare a register without '%'
            if not isinstance(g, ir.Reg):
                raise AsmError("a guard must be a predicate register", s.guard.span)
            guard = ir.Guard(g, s.guard.negated)
        cached = self._operands
        if scope is not self._operands_scope or len(cached) > _OPERANDS_KEPT:
            cached.clear()
            self._operands_scope = scope
        text = s.span.source.text
        ops = None
        nodes = s.operands
        lazy = type(nodes) is LazyOperands and not nodes.built
        if lazy:
            ops = _known_operands(nodes, cached)
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
        self._count(1, s.span)
        out.append(ir.Instruction(opcode, ops, guard, s.span, s.pinned))

    def _cached_operand(self, o, scope: _Scope) -> ir.Operand:
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
    def _lookup(self, scope: _Scope):
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

    def _name_text(self, name: ast.Name, scope: _Scope) -> str:
        """Paste an identifier together; interpolated parts are evaluated."""
        out = []
        for i, part in enumerate(name.parts):
            if isinstance(part, str):
                out.append(self._bound_prefix(part, scope) if i == 0 and len(name.parts) > 1 else part)
                continue
            out.append(self._interpolate(part, scope))
        return "".join(out)

    def _bound_prefix(self, text: str, scope: _Scope) -> str:
        """In `acc{j}` inside a macro whose parameter `acc` is bound to the register or symbol `c`,
        the prefix is the argument: `c{j}`, not the literal `acc`."""
        try:
            v = scope.find(text)
        except KeyError:
            return text
        if isinstance(v, ir.Reg) and not v.negated or isinstance(v, ir.Sym) and not v.offset:
            return v.name
        return text

    def _interpolate(self, e, scope: _Scope) -> str:
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

    def _resolve_name(self, text: str, span: Span, scope: _Scope) -> ir.Operand:
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

    def _component(self, base: str, comp: str, span: Span, scope: _Scope) -> ir.Operand | None:
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

    def _operand(self, e, scope: _Scope) -> ir.Operand:
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

    def _brace(self, e: ast.Brace, scope: _Scope) -> ir.Operand:
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

    def _memref(self, e: ast.MemRef, scope: _Scope) -> ir.Mem:
        base, offset = self._address(e.items[0], scope)
        extra = tuple(self._operand(i, scope) for i in e.items[1:])
        if isinstance(base, ir.Mem):  # a macro parameter bound to a whole address
            return ir.Mem(base.base, base.offset + offset, base.extra + extra, base.explicit_offset)
        first = e.items[0]
        explicit = (base is not None and isinstance(first, ast.BinOp) and first.op == "+"
                    and isinstance(first.right, ast.Num))  # a literal `+0`, as nvcc writes it
        return ir.Mem(base, offset, extra, explicit)

    def _address(self, e, scope: _Scope) -> tuple[ir.Operand | None, int]:
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


def _known_operands(nodes: LazyOperands, cached: dict) -> list | None:
    """The operands of an instruction whose operand nodes were never built, when every one of
    them was resolved before (by its text: what the nodes' spans would cover); else None."""
    seg = nodes.text()
    if "{" in seg or "|" in seg:             # commas inside an operand
        return None
    ops = []
    for raw in seg.split(","):
        op = cached.get(raw.strip(" \t"))
        if op is None:
            return None
        ops.append(op)
    return ops


def _range_length(*args: int) -> int:
    """len(range(*args)) for integers of any size (len() itself overflows past sys.maxsize)."""
    start, stop, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // -step)


def _define_value(name: str, text: str):
    """-D NAME=VALUE: a number, or an expression of numbers (evaluated by our own evaluator)."""
    src = SourceFile.from_text(f"<-D {name}>", text)
    tree = parse_expression(text, src, 0)

    def no_names(n, span):
        raise AsmError(f"-D {name}={text}: '{n}' is not defined here; -D values are numbers or expressions of numbers", span)
    return evaluate(tree, no_names)


def _int_value(v, span, what):
    # The evaluator is C-like: a comparison or `not` gives the int 1 or 0, and a bool operand counts
    # as 1/0 (expr._num), so `bank(i % 2 == 0)` is bank 1 or 0. A bool never comes out of a .sasm
    # expression; one handed in from Python is taken the same way, as the int it equals.
    if isinstance(v, bool):
        return int(v)
    if not isinstance(v, int):
        raise AsmError(f"{what} must be an integer, got {v!r}", span)
    return v


def _mark_expansion(item, call_span: Span):
    if isinstance(item, ir.Instruction):
        item.expanded_from = (call_span,) + item.expanded_from
    elif isinstance(item, ir.ScheduleRegion):
        for sub in item.items:
            _mark_expansion(sub, call_span)


def _closest(name: str, options) -> str | None:
    m = difflib.get_close_matches(name, list(options), n=1, cutoff=0.6)
    return m[0] if m else None


def _display_path(here: Path, rel: str, found: Path) -> str:
    p = here / rel
    return str(p) if p == found else str(found)


def expand(module: ast.Module, defines: dict[str, str] | None = None,
           include_dirs: list[str] | None = None) -> ExpandResult:
    return Expander(defines, include_dirs).expand(module)
