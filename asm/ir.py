"""The flat instruction list: what macro/loop expansion (expand/) produces and every later stage
(register allocation, scheduling, PTX emission) consumes and returns.

Plain dataclasses. After expansion there are no macros, loops, conditionals or interpolations
left: operands are concrete, and registers the user named with `.regs`/`.temp` are `Reg` with
`named=True` until register allocation replaces them with the PTX registers of the plan.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterator, Union

from .source import Span


# ---- operands ------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Reg:
    name: str                  # '%r1', '%tid.x', 'q', or a named register 'acc3' (named=True)
    named: bool = False
    negated: bool = False      # !%p1 as a source predicate
    # One component of a vector register (`.reg .v4 .b32 q;` ... q.x): 'x', 'y', 'z', 'w' (or
    # 'r', 'g', 'b', 'a', as written). `name` stays the vector's, so that everything keyed by
    # register name (the scheduler's dependencies, liveness) sees q.x and q as one register: a
    # write of q.y orders against a read of q.x, which is conservative and never wrong. Special
    # registers (%tid.x) are distinct read-only registers and keep the component in `name`.
    component: str = ""

    def render(self) -> str:
        return ("!" if self.negated else "") + self.name + ("." + self.component if self.component else "")


@dataclass(frozen=True, slots=True)
class Imm:
    text: str                  # exactly what PTX will see: '-1', '0f3F800000', '16'
    value: int | float | None = None

    def render(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Sym:
    """A label, function, parameter or variable name (not a register), with an optional offset."""
    name: str
    offset: int = 0

    def render(self) -> str:
        # A negative offset is written `arr+-4`, never `arr-4`: ptxas 13.0 takes `arr+-4` (and
        # `arr+(-4)`) both as an operand and in an address, and stops at `arr-4` with "Parsing error
        # near '-'" (tests/test_ir_render.py assembles both). Mem renders `[%rd4+-4]` the same way.
        if not self.offset:
            return self.name
        return f"{self.name}+{self.offset}"


@dataclass(frozen=True, slots=True)
class Str:
    text: str                  # with quotes

    def render(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class Vector:
    elems: tuple["Operand", ...]

    def render(self) -> str:
        return "{" + ", ".join(e.render() for e in self.elems) + "}"


@dataclass(frozen=True, slots=True)
class Pair:
    first: "Operand"
    second: "Operand"

    def render(self) -> str:
        return f"{self.first.render()}|{self.second.render()}"


@dataclass(frozen=True, slots=True)
class Paren:
    items: tuple["Operand", ...]

    def render(self) -> str:
        return "(" + ", ".join(i.render() for i in self.items) + ")"


@dataclass(frozen=True, slots=True)
class Mem:
    """[base], [base+offset], or [tensor_map, {coords}] (extra items after the address)."""
    base: "Operand | None"
    offset: int = 0
    extra: tuple["Operand", ...] = ()
    # `[x+0]` as written: ptxas in debug mode (-G PTX) compiles it differently from `[x]`.
    explicit_offset: bool = False

    def render(self) -> str:
        if self.base is None:
            addr = str(self.offset)
        elif self.offset or self.explicit_offset:
            addr = f"{self.base.render()}+{self.offset}"
        else:
            addr = self.base.render()
        parts = [addr] + [e.render() for e in self.extra]
        return "[" + ", ".join(parts) + "]"


Operand = Union[Reg, Imm, Sym, Str, Vector, Pair, Paren, Mem]


def operand_regs(op: Operand) -> Iterator[Reg]:
    """Every register an operand mentions (vector elements, pair halves, address bases)."""
    if isinstance(op, Reg):
        yield op
    elif isinstance(op, Vector):
        for e in op.elems:
            yield from operand_regs(e)
    elif isinstance(op, Pair):
        yield from operand_regs(op.first)
        yield from operand_regs(op.second)
    elif isinstance(op, Paren):
        for e in op.items:
            yield from operand_regs(e)
    elif isinstance(op, Mem):
        if op.base is not None:
            yield from operand_regs(op.base)
        for e in op.extra:
            yield from operand_regs(e)


def map_regs(op: Operand, fn) -> Operand:
    """A copy of `op` with every Reg replaced by fn(Reg)."""
    if isinstance(op, Reg):
        return fn(op)
    if isinstance(op, Vector):
        return Vector(tuple(map_regs(e, fn) for e in op.elems))
    if isinstance(op, Pair):
        return Pair(map_regs(op.first, fn), map_regs(op.second, fn))
    if isinstance(op, Paren):
        return Paren(tuple(map_regs(e, fn) for e in op.items))
    if isinstance(op, Mem):
        return replace(op, base=map_regs(op.base, fn) if op.base is not None else None,
                       extra=tuple(map_regs(e, fn) for e in op.extra))
    return op


# ---- body items ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Guard:
    reg: Reg
    negated: bool = False

    def render(self) -> str:
        return f"@{'!' if self.negated else ''}{self.reg.name}"


@dataclass(slots=True)
class Instruction:
    opcode: str                          # 'fma.rn.f32', 'ld.shared.v4.f32'
    operands: list[Operand]
    guard: Guard | None = None
    span: Span | None = None             # the .sasm line it came from
    pinned: bool = False                 # the scheduler never moves it (.pin)
    expanded_from: tuple[Span, ...] = () # macro call sites, outermost first
    note: str = ""                       # emitted as a trailing `// note` (scheduler annotations)

    @property
    def base(self) -> str:
        return self.opcode.split(".", 1)[0]

    @property
    def modifiers(self) -> list[str]:
        return self.opcode.split(".")[1:]

    def render(self) -> str:
        head = (self.guard.render() + " " if self.guard else "") + self.opcode
        if not self.operands:
            return head + ";"
        return head + " " + ", ".join(o.render() for o in self.operands) + ";"

    def registers(self) -> Iterator[Reg]:
        if self.guard:
            yield self.guard.reg
        for op in self.operands:
            yield from operand_regs(op)


@dataclass(slots=True)
class Label:
    name: str
    span: Span | None = None

    def render(self) -> str:
        return f"{self.name}:"


@dataclass(slots=True)
class Directive:
    """Any declaration or directive inside or outside a function, already rendered as PTX text:
    `.reg .b32 %r<5>;`, `.shared .align 16 .b8 smem[4096];`, `.loc 1 2 3`, `.pragma "nounroll";`."""
    text: str
    span: Span | None = None
    kind: str = "decl"                   # 'decl', 'loc', 'file', 'pragma', 'section', 'reg'

    def render(self) -> str:
        return self.text


@dataclass(slots=True)
class ScopeOpen:
    span: Span | None = None


@dataclass(slots=True)
class ScopeClose:
    span: Span | None = None


@dataclass(slots=True)
class ControlDirective:
    """`.control` in a `.schedule` region: the SASS control fields to write on the region's
    instructions whose opcode matches `pattern` (in full); applied after ptxas, through the line
    table, by sass/control_directive.py."""
    pattern: str                          # a regular expression over nvdisasm's opcode with modifiers
    written: str                          # the pattern as the source wrote it
    fields: dict[str, int]                # raw control-field values (sass/patch_rules.Rule.fields)
    span: Span | None = None
    pattern_span: Span | None = None

    def render(self) -> str:
        """The directive as a PTX comment, so the PTX says what will be done to ptxas's code."""
        if self.span is None:
            return f"// .control {self.written} {self.fields}"
        return f"// {self.span.text().strip()}  ({self.span.location()})"


@dataclass(slots=True)
class ScheduleRegion:
    """Instructions of one `.schedule ... .endschedule` block; the scheduler may reorder them."""
    items: list["BodyItem"]
    span: Span | None = None
    index: int = 0                        # 0, 1, ... within its function
    controls: list[ControlDirective] = field(default_factory=list)   # applied to the SASS it becomes


BodyItem = Union[Instruction, Label, Directive, ScopeOpen, ScopeClose, ScheduleRegion]


@dataclass(slots=True)
class NamedReg:
    """One register declared with `.regs` or `.temp`."""
    name: str                 # acc12
    ptx_type: str             # '.f32', '.b64', '.pred', '.f16x2'
    temp: bool                # .temp: may share a physical register with other temps
    bank: int | None = None   # the bank constraint, if any
    group: tuple[str, ...] = ()   # the aligned vector group it belongs to (vec2/vec4), if any
    align: int = 1            # required alignment of its planned index (2 for 64-bit, 4 for vec4 base)
    span: Span | None = None


@dataclass(frozen=True, slots=True)
class ParamInfo:
    """One kernel/function parameter: what the runtime packs for it."""

    name: str
    type: str                       # '.u64', '.f32', '.b8' ...
    count: int | None = None        # elements of an array parameter; None for a scalar


@dataclass(slots=True)
class Function:
    kind: str                       # 'entry' or 'func'
    name: str
    header: str                     # rendered PTX: '.visible .entry k(\n\t.param .u64 k_p0\n)'
    perf: list[str]                 # rendered: ['.maxntid 256, 1, 1']
    body: list[BodyItem] | None     # None: a prototype
    named_regs: list[NamedReg] = field(default_factory=list)
    span: Span | None = None
    params: tuple[ParamInfo, ...] = ()

    def instructions(self) -> Iterator[Instruction]:
        for item in iter_body(self.body or []):
            if isinstance(item, Instruction):
                yield item


def iter_body(items) -> Iterator[BodyItem]:
    """Items in program order, looking inside schedule regions."""
    for item in items:
        if isinstance(item, ScheduleRegion):
            yield from item.items
        else:
            yield item


@dataclass(slots=True)
class Module:
    version: str | None             # as the source said, or None
    target: list[str]               # ['sm_90'] or ['sm_90a', 'debug'] as the source said, or []
    address_size: int | None
    items: list[Union[Directive, Function]]
    path: str = ""

    def functions(self) -> Iterator[Function]:
        for it in self.items:
            if isinstance(it, Function):
                yield it

    def copy_with(self, **kw) -> "Module":
        return replace(self, **kw)
