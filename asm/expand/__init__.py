"""Stage 2: AST -> flat instruction list (ir.Module).

Evaluates `.const`, expands `.macro` calls, unrolls `.for`, resolves `.if`, inlines `.include`,
substitutes {expr} interpolations, collects `.regs`/`.temp` declarations, and resolves every
operand to a concrete ir operand. The result has no macro-layer constructs left.

The `Expander` walks the statements and builds the module's structure (version and target,
functions, labels, { } scopes, `.schedule` regions, instructions); its three other jobs live in
modules of their own, whose methods it takes on:

  preprocess.py  `.const`, `.macro`, `.for`, `.if`, `.include`, `.tune`, `.error` (Preprocessor)
  registers.py   `.regs`/`.temp` and plain declarations such as `.reg` (RegisterDeclarations)
  operands.py    names, interpolations and operands to ir operands (OperandLowering)
  scope.py       the chain of bindings they all evaluate names in
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import ast, ir
from ..control_line import RAW_FIELD, field_value
from ..errors import AsmError, Note
from ..parse_tree import MAX_EXPR_DEPTH, MAX_NESTING
from ..source import Span
from ..targets import SUPPORTED_TARGETS
from .operands import OperandLowering
from .preprocess import MAX_INCLUDE_DEPTH, MAX_LOOP_TRIPS, MAX_MACRO_DEPTH, Macro, Preprocessor
from .registers import REG_TYPES, FunctionContext, RegisterDeclarations
from .registers import _int_value  # noqa: F401  (tests/test_expand.py takes it from here)
from .scope import Scope

__all__ = ["ExpandResult", "Expander", "expand", "MAX_EXPANDED_ITEMS", "MAX_INCLUDE_DEPTH", "MAX_LOOP_TRIPS",
           "MAX_MACRO_DEPTH"]

# The item budget of one build: a limit that turns hostile or mistaken input into an error instead
# of a hang. Nested .for loops are checked against it up front (_check_projected_items), before
# their work is done. Read from this module when checked (tests lower it here).
MAX_EXPANDED_ITEMS = 2_000_000    # body items produced by one build


@dataclass
class ExpandResult:
    module: ir.Module
    tunables: dict[str, list]          # `.const NAME ?= ...` parameters with their declared choices
    parameters: dict[str, object]      # every overridable constant and the value used
    constants: dict[str, object]       # every top-level constant (parameters too) and its value
    includes: tuple[Path, ...] = ()    # every file `.include` read, as found
    ptxas_alternatives: tuple[tuple[str, ...], ...] = ()   # `.ptxas_alternative` option sets, in order


class Expander(Preprocessor, RegisterDeclarations, OperandLowering):
    """One build's expansion. Each statement goes to its `_s_<ast class>` handler, here or in one of
    the three parts; all the state they share is set up here."""

    def __init__(self, defines: dict[str, str] | None = None, include_dirs: list[str] | None = None):
        self.defines = dict(defines or {})
        self.used_defines: set[str] = set()
        self.include_dirs = [Path(d) for d in (include_dirs or [])]
        self.macros: dict[str, Macro] = {}
        self.items_emitted = 0
        self.macro_stack: list[tuple[str, Span]] = []
        self.include_stack: list[str] = []
        self.included: list[Path] = []
        self.uid = 0
        self.version: str | None = None
        self.target: list[str] = []
        self.address_size: int | None = None
        self.parameters: dict[str, object] = {}
        self.fn: FunctionContext | None = None
        self.tunables: dict[str, list] = {}
        self.tune_spans: dict[str, Span] = {}
        self.ptxas_alternatives: list[tuple[tuple[str, ...], Span]] = []
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
        # ... and whole operand lists by the text of all of them, shared by the instructions
        # that read them (a list per instruction was a fifth of a large build's memory)
        self._operand_lists: dict[str, list] = {}
        self._operands_scope: Scope | None = None

    # ---- entry point ---------------------------------------------------------------------------
    def expand(self, module: ast.Module) -> ExpandResult:
        root = Scope()
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
        return ExpandResult(mod, dict(self.tunables), dict(self.parameters), constants, tuple(self.included),
                            tuple(options for options, _ in self.ptxas_alternatives))

    # ---- statements ----------------------------------------------------------------------------
    def _count(self, n: int, span: Span):
        self.items_emitted += n
        if self.items_emitted > MAX_EXPANDED_ITEMS:
            raise AsmError(f"expansion produced more than {MAX_EXPANDED_ITEMS} items; is a loop or macro runaway?", span)

    def _stmts(self, stmts, scope: Scope, out: list, toplevel: bool = False):
        instr, handle = ast.Instr, self._s_Instr
        for s in stmts:
            if type(s) is instr:           # most statements of a large source: no lookup by name
                self.current = s.span
                handle(s, scope, out, toplevel)
            else:
                self._stmt(s, scope, out, toplevel)

    def _stmt(self, s, scope: Scope, out: list, toplevel: bool):
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

    def _s_Schedule(self, s: ast.Schedule, scope: Scope, out, toplevel):
        if self.fn is None:
            raise AsmError("'.schedule' belongs inside a function body", s.span)
        if self.fn.in_schedule:
            raise AsmError("'.schedule' regions do not nest", s.span)
        self.fn.in_schedule = True
        items: list = []
        try:
            self._stmts(s.body, Scope(scope), items, toplevel)
        finally:
            self.fn.in_schedule = False
        controls = [it for it in items if isinstance(it, ir.ControlDirective)]
        if controls:
            items = [it for it in items if not isinstance(it, ir.ControlDirective)]
        for it in items:
            if isinstance(it, (ir.Label, ir.ScopeOpen, ir.ScopeClose)):
                raise AsmError("a '.schedule' region must be straight-line code: no labels or { } scopes inside",
                               it.span or s.span)
        out.append(ir.ScheduleRegion(items, s.span, controls=controls))

    def _s_Control(self, s: ast.Control, scope, out, toplevel):
        # It applies to the whole region it is in, wherever in the region it stands, so
        # _s_Schedule takes it out of the instructions into the region's `controls`.
        if self.fn is None or not self.fn.in_schedule:
            raise AsmError("'.control' belongs inside a '.schedule' region: it sets the control fields of "
                           "the SASS instructions made from that region", s.span)
        self._count(1, s.span)
        fields = dict(s.fields)
        for raw, expr in s.exprs.items():
            key = next(k for k, r in RAW_FIELD.items() if r == raw)
            fields[raw] = field_value(key, self._interpolate(expr, scope), expr.span)
        out.append(ir.ControlDirective(s.pattern, s.written, fields, s.span, s.pattern_span))

    def _s_Function(self, s: ast.Function, scope: Scope, out, toplevel):
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
            self.fn = FunctionContext()
            body = []
            try:
                self._stmts(s.body, Scope(scope), body, toplevel=False)
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
        self._stmts(s.body, Scope(scope), out, toplevel)
        out.append(ir.ScopeClose(s.span))

    def _s_Instr(self, s: ast.Instr, scope, out, toplevel):
        if self.fn is None:
            raise AsmError("an instruction belongs inside a function body", s.span)
        if s.pinned and not self.fn.in_schedule:
            raise AsmError("'.pin' outside a '.schedule' region: only the scheduler moves instructions, "
                           "so there is nothing to pin here", s.span,
                           hint="put it inside '.schedule' ... '.endschedule', or drop the '.pin'")
        parts = s.opcode.parts
        opcode = parts[0] if len(parts) == 1 and type(parts[0]) is str else self._name_text(s.opcode, scope)
        guard = self._instruction_guard(s, scope) if s.guard is not None else None
        ops = self._instruction_operands(s, scope)
        self._count(1, s.span)
        out.append(ir.Instruction(opcode, ops, guard, s.span, s.pinned))


def expand(module: ast.Module, defines: dict[str, str] | None = None,
           include_dirs: list[str] | None = None) -> ExpandResult:
    return Expander(defines, include_dirs).expand(module)
