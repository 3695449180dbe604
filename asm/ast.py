"""The .sasm abstract syntax tree: what the parser (parse.py) hands to the expander (expand/).

Plain dataclasses; every node has a `span` pointing at its source text. Expressions of the macro
layer and the insides of { } groups are already parsed here, so a syntax error in an untaken
`.if` branch is still reported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from .source import Span


# ---- expressions ---------------------------------------------------------------------------
@dataclass(slots=True)
class Num:
    text: str          # as written, so plain PTX re-emits byte for byte (0f3F800000, 0xFFU, 1.5)
    span: Span


@dataclass(slots=True)
class Name:
    """An identifier. `parts` alternates literal text and {expr} interpolations: c{i*8+j}."""
    parts: list["str | Expr"]
    span: Span

    @property
    def plain(self) -> str | None:
        return self.parts[0] if len(self.parts) == 1 and isinstance(self.parts[0], str) else None


@dataclass(slots=True)
class RegRef:
    """A %-register as written: %r12, %tid.x, %r{i}."""
    name: Name
    span: Span


@dataclass(slots=True)
class Str:
    value: str         # with the quotes
    span: Span


@dataclass(slots=True)
class BinOp:
    op: str
    left: "Expr"
    right: "Expr"
    span: Span


@dataclass(slots=True)
class UnOp:
    op: str            # '-', '+', '~', 'not', '!'
    operand: "Expr"
    span: Span


@dataclass(slots=True)
class Compare:
    first: "Expr"
    rest: list[tuple[str, "Expr"]]
    span: Span


@dataclass(slots=True)
class Cond:
    cond: "Expr"
    then: "Expr"
    other: "Expr"
    span: Span


@dataclass(slots=True)
class Call:
    func: str
    args: list["Expr"]
    span: Span


@dataclass(slots=True)
class NameRange:
    """NAME<lo-hi>: the registers NAMElo ... NAMEhi (both ends included)."""
    base: str
    lo: "Expr"
    hi: "Expr"
    span: Span


@dataclass(slots=True)
class Brace:
    """A { } group in an operand: a register vector {a, b}, or one interpolated value {4*k}."""
    items: list["Expr | NameRange"]
    span: Span


@dataclass(slots=True)
class Paren:
    """( ) in an operand: call return/argument lists, or grouping."""
    items: list["Expr"]
    span: Span


@dataclass(slots=True)
class Pair:
    """p|q: the two destinations of setp/shfl."""
    first: "Expr"
    second: "Expr"
    span: Span


@dataclass(slots=True)
class MemRef:
    """[address] or [tensor_map, {coords}]."""
    items: list["Expr"]
    span: Span


Expr = Union[Num, Name, RegRef, Str, BinOp, UnOp, Compare, Cond, Call, Brace, Paren, Pair, MemRef]


# ---- statements ----------------------------------------------------------------------------
@dataclass(slots=True)
class Version:
    text: str
    span: Span


@dataclass(slots=True)
class Target:
    names: list[str]
    span: Span


@dataclass(slots=True)
class AddressSize:
    bits: int
    span: Span


@dataclass(slots=True)
class RawDirective:
    """.file / .loc / .section / .pragma: kept as written."""
    keyword: str
    text: str
    span: Span


@dataclass(slots=True)
class Qualifier:
    word: str                  # .align, .b32, .shared ...
    arg: Expr | None           # the 16 of `.align 16`
    span: Span


@dataclass(slots=True)
class Declarator:
    name: Name | RegRef
    count: int | None          # %r<291>
    dims: list[Expr | None]    # [] or [4096]
    init: str | None           # '= {1, 2}' as written
    span: Span


@dataclass(slots=True)
class Decl:
    qualifiers: list[Qualifier]
    declarators: list[Declarator]
    span: Span


@dataclass(slots=True)
class Param:
    qualifiers: list[Qualifier]
    name: Name
    dims: list[Expr | None]
    span: Span


@dataclass(slots=True)
class PerfDirective:
    word: str
    values: list[Expr]
    span: Span


@dataclass(slots=True)
class Function:
    qualifiers: list[Qualifier]
    kind: str                  # 'entry' or 'func'
    ret_params: list[Param]
    name: Name
    params: list[Param] | None
    perf: list[PerfDirective]
    body: list["Stmt"] | None  # None: a declaration (prototype)
    span: Span


@dataclass(slots=True)
class Label:
    name: Name
    span: Span


@dataclass(slots=True)
class Guard:
    negated: bool
    reg: Name | RegRef
    span: Span


@dataclass(slots=True)
class Instr:
    guard: Guard | None
    opcode: Name
    operands: list[Expr]
    pinned: bool
    span: Span


@dataclass(slots=True)
class Scope:
    body: list["Stmt"]
    span: Span


@dataclass(slots=True)
class ConstDef:
    name: str
    overridable: bool          # `?=`: -D NAME=value may replace it
    value: Expr
    span: Span


@dataclass(slots=True)
class MacroDef:
    name: str
    params: list[str]
    body: list["Stmt"]
    span: Span


@dataclass(slots=True)
class MacroCall:
    name: str
    args: list[Expr]
    span: Span


@dataclass(slots=True)
class For:
    var: str
    args: list[Expr]           # the arguments of range(...)
    body: list["Stmt"]
    span: Span


@dataclass(slots=True)
class If:
    branches: list[tuple[Expr, list["Stmt"]]]
    orelse: list["Stmt"] | None
    span: Span


@dataclass(slots=True)
class Include:
    path: str
    span: Span


@dataclass(slots=True)
class Schedule:
    body: list["Stmt"]
    span: Span


@dataclass(slots=True)
class Control:
    """`.control PATTERN field=value ...` inside a `.schedule` region: the SASS control fields of
    the region's instructions whose opcode matches (asm/sass/control_directive.py applies them)."""
    pattern: str               # a regular expression, matched in full against nvdisasm's opcode
    written: str               # the pattern as written: FFMA, or "LDS\\..*" with its quotes
    fields: dict[str, int]     # control field -> raw value, as patch_rules.Rule.fields holds them
    pattern_span: Span
    field_spans: dict[str, Span]
    span: Span
    exprs: dict[str, "Expr"]   # control field -> `{expr}` value, evaluated when expanded


@dataclass(slots=True)
class RegAttr:
    name: str                  # bank, banks, vec2, vec4, align
    args: list[Expr]
    span: Span


@dataclass(slots=True)
class RegItem:
    base: str
    lo: Expr | None            # None: a single register named `base`
    hi: Expr | None
    span: Span


@dataclass(slots=True)
class RegsDecl:
    kind: str                  # 'regs' (one register each, for the whole function) or 'temp'
    types: list[str]           # ['.f32'] or ['.v4', '.f32']
    items: list[RegItem]
    attrs: list[RegAttr]
    span: Span


@dataclass(slots=True)
class Tune:
    name: str
    choices: Expr              # a call: choices(a, b, ...) or range(...)
    span: Span


@dataclass(slots=True)
class ErrorDirective:
    message: str
    span: Span


@dataclass(slots=True)
class PtxasAlternative:
    options: str               # as written between the quotes: ptxas options, space-separated
    span: Span


Stmt = Union[Tune, ErrorDirective, PtxasAlternative, Version, Target, AddressSize, RawDirective, Decl, Function, Label, Instr, Scope,
             ConstDef, MacroDef, MacroCall, For, If, Include, Schedule, Control, RegsDecl]


@dataclass(slots=True)
class Module:
    body: list[Stmt]
    source: "object"           # SourceFile
