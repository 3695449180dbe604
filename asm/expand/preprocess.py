"""Preprocessing: the macro layer PTX does not have. `.const` (and -D overrides), `.macro`
definitions and calls, `.for` unrolling, `.if`/`.elif`/`.else`, `.include`, `.tune` parameter
spaces and `.error`, with the limits that turn runaway input into errors instead of hangs.

The `Preprocessor` methods are part of the `Expander` (expand/__init__.py), which walks the
statements (`_stmts`), keeps the item budget (`_count`, `_check_projected_items`) and lowers names
and operands (operands.py: `_lookup`, `_operand`).
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from .. import ast, ir
from ..errors import AsmError, Note
from ..expr import evaluate
from ..files import read_source
from ..parse import parse_source
from ..parse_tree import parse_expression
from ..toolchain import parse_ptxas_alternative
from ..source import SourceFile, Span
from .scope import Scope

# Limits that turn hostile or mistaken input into errors instead of hangs (the limit on the items one
# build produces, MAX_EXPANDED_ITEMS, is the Expander's own: expand/__init__.py).
MAX_LOOP_TRIPS = 100_000          # iterations of one .for
MAX_MACRO_DEPTH = 64
MAX_INCLUDE_DEPTH = 32


@dataclass
class Macro:
    name: str
    params: list[str]
    body: list
    span: Span


class Preprocessor:
    """`.const`, `.macro`, `.for`, `.if`, `.include`, `.tune` and `.error` statements."""

    def _s_ConstDef(self, s: ast.ConstDef, scope: Scope, out, toplevel):
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
        self.macros[s.name] = Macro(s.name, s.params, s.body, s.span)

    def _s_MacroCall(self, s: ast.MacroCall, scope: Scope, out, toplevel):
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
        inner = Scope(scope)
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

    def _s_For(self, s: ast.For, scope: Scope, out, toplevel):
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
                inner = Scope(scope)
                inner.values[s.var] = i
                inner.spans[s.var] = s.span
                self._stmts(s.body, inner, out, toplevel)
        finally:
            self.loops.pop()
            del self.loop_vars[-1][s.var]

    def _s_If(self, s: ast.If, scope: Scope, out, toplevel):
        look = self._lookup(scope)
        for cond, body in s.branches:
            if evaluate(cond, look):
                self._stmts(body, Scope(scope), out, toplevel)
                return
        if s.orelse is not None:
            self._stmts(s.orelse, Scope(scope), out, toplevel)

    def _s_Include(self, s: ast.Include, scope: Scope, out, toplevel):
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

    def _s_Tune(self, s: ast.Tune, scope: Scope, out, toplevel):
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

    def _s_PtxasAlternative(self, s: ast.PtxasAlternative, scope, out, toplevel):
        if not toplevel or self.fn is not None:
            raise AsmError("'.ptxas_alternative' belongs at the top level of the source (it is about the "
                           "whole module's assembly), not inside a function or a block", s.span)
        try:
            options = parse_ptxas_alternative(s.options)
        except AsmError as exc:
            raise AsmError(exc.message, s.span) from None
        for seen, span in self.ptxas_alternatives:
            if seen == options:
                raise AsmError(f"'.ptxas_alternative \"{s.options}\"' appears twice", s.span,
                               notes=[Note("first here", span)])
        self.ptxas_alternatives.append((options, s.span))


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
