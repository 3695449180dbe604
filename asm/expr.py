"""The macro layer's expression evaluator: integers and floats, Python-like operators, and a few
named functions. It walks the AST; source text is never handed to Python's eval/exec.

Limits keep hostile input from hanging the assembler: results are capped at MAX_BITS bits, and
shifts and powers that would exceed that are errors.
"""
from __future__ import annotations

import math
import operator
import struct
from typing import Callable

from . import ast
from .errors import AsmError, shorten_number

MAX_BITS = 4096

Value = int | float | str


class NotANumber(Exception):
    """Raised by a lookup for a name bound to something that is not a number (a register)."""

    def __init__(self, what: str):
        self.what = what


def _check_size(v, span):
    if isinstance(v, int) and v.bit_length() > MAX_BITS:
        raise AsmError(f"integer result exceeds {MAX_BITS} bits", span)
    if isinstance(v, float) and math.isinf(v):
        raise AsmError("floating-point overflow", span)
    return v


# The most digits a literal may have in each base before it is converted: a literal over MAX_BITS
# bits is an error decided on its length (int() of a huge string is slow, and Python refuses
# decimal strings over sys.get_int_max_str_digits() digits). Leading zeros do not count.
_MAX_DIGITS = {16: MAX_BITS // 4, 2: MAX_BITS, 8: -(-MAX_BITS // 3), 10: int(MAX_BITS * math.log10(2)) + 1}
MAX_FLOAT_LITERAL_CHARS = 1000


def _too_big(text: str, span):
    return AsmError(f"integer literal {shorten_number(text)} is larger than the limit of {MAX_BITS} bits", span)


def parse_number(text: str, span=None) -> int | float:
    """A PTX/.sasm numeric literal: 12, 0x1F, 0b101, 017 (octal), 12U, 1.5, 1e-3, 0f3F800000, 0d3FF0..."""
    t = text
    if len(t) > 2 and t[0] == "0" and t[1] in "fF" and len(t) == 10:
        return struct.unpack(">f", bytes.fromhex(t[2:]))[0]
    if len(t) > 2 and t[0] == "0" and t[1] in "dD" and len(t) == 18:
        return struct.unpack(">d", bytes.fromhex(t[2:]))[0]
    if t.endswith("U"):
        t = t[:-1]
    try:
        if t[:2] in ("0x", "0X"):
            base, digits = 16, t[2:]
        elif t[:2] in ("0b", "0B"):
            base, digits = 2, t[2:]
        elif any(c in t for c in ".eE"):
            if len(t) > MAX_FLOAT_LITERAL_CHARS:
                raise AsmError(f"floating-point literal {_short(text)} is longer than the limit of "
                               f"{MAX_FLOAT_LITERAL_CHARS} characters", span)
            v = float(t)
            if math.isinf(v):
                raise AsmError(f"floating-point literal {_short(text)} is out of range (larger than 1.8e308)", span)
            return v
        elif len(t) > 1 and t[0] == "0":
            base, digits = 8, t[1:]  # PTX follows C: a leading 0 means octal
        else:
            base, digits = 10, t
        if len(digits) > _MAX_DIGITS[base] and len(digits.lstrip("0")) > _MAX_DIGITS[base]:
            raise _too_big(text, span)
        v = int(digits, base)
    except ValueError:
        raise AsmError(f"malformed number '{_short(text)}'", span) from None
    if v.bit_length() > MAX_BITS:
        raise _too_big(text, span)
    return v


def _short(text: str) -> str:
    return text if len(text) <= 60 else f"{text[:20]}…{text[-5:]} ({len(text)} characters)"


def format_number(v: int | float | bool) -> str:
    """How a computed value is written into PTX. Floats use the exact 0d (double) form, which PTX
    converts to the instruction's type (PTX ISA 4.5.1 'Floating-Point Constants')."""
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    return "0d" + struct.pack(">d", v).hex().upper()


def _truthy(v) -> bool:
    return bool(v)


def _log2(args, span):
    (x,) = args
    if isinstance(x, int) and x > 0 and x & (x - 1) == 0:
        return x.bit_length() - 1
    if x <= 0:
        raise AsmError("log2 of a non-positive number", span)
    return math.log2(x)


def _ceil_div(args, span):
    a, b = args
    if not isinstance(a, int) or not isinstance(b, int):
        raise AsmError("ceil_div wants integers", span)
    if b == 0:
        raise AsmError("division by zero in ceil_div", span)
    return -(-a // b)


def _is_pow2(args, span):
    (x,) = args
    return int(isinstance(x, int) and x > 0 and x & (x - 1) == 0)


FUNCTIONS: dict[str, tuple[int | tuple[int, int], Callable]] = {
    # name: (arity or (min, max), implementation(args, span))
    "min": ((1, 64), lambda a, s: min(a)),
    "max": ((1, 64), lambda a, s: max(a)),
    "abs": (1, lambda a, s: abs(a[0])),
    "log2": (1, _log2),
    "ceil_div": (2, _ceil_div),
    "is_pow2": (1, _is_pow2),
    "int": (1, lambda a, s: int(a[0])),
    "float": (1, lambda a, s: float(a[0])),
}


def evaluate(node, lookup: Callable[[str, object], Value]) -> Value:
    """Evaluate an expression AST. `lookup(name, span)` returns a bound value or raises AsmError."""
    if isinstance(node, ast.Num):
        return parse_number(node.text, node.span)
    if isinstance(node, ast.Name):
        name = node.plain
        if name is None:
            raise AsmError("an interpolated name is not a number here", node.span)
        try:
            v = lookup(name, node.span)
        except NotANumber as nan:
            raise AsmError(f"'{name}' is {nan.what}, not a number", node.span) from None
        return v
    if isinstance(node, ast.Str):
        return node.value[1:-1]
    if isinstance(node, ast.Brace) and len(node.items) == 1:
        return evaluate(node.items[0], lookup)
    if isinstance(node, ast.UnOp):
        v = evaluate(node.operand, lookup)
        if node.op == "-":
            return -_num(v, node)
        if node.op == "+":
            return _num(v, node)
        if node.op == "~":
            return ~_int(v, node)
        if node.op in ("not", "!"):
            return int(not _truthy(v))
    if isinstance(node, ast.BinOp):
        op = node.op
        if op == "and":
            left = evaluate(node.left, lookup)
            return evaluate(node.right, lookup) if _truthy(left) else left
        if op == "or":
            left = evaluate(node.left, lookup)
            return left if _truthy(left) else evaluate(node.right, lookup)
        a = evaluate(node.left, lookup)
        b = evaluate(node.right, lookup)
        return _check_size(_binop(op, a, b, node), node.span)
    if isinstance(node, ast.Compare):
        left = evaluate(node.first, lookup)
        for op, rhs_node in node.rest:
            right = evaluate(rhs_node, lookup)
            if not _compare(op, left, right, node):
                return 0
            left = right
        return 1
    if isinstance(node, ast.Cond):
        return evaluate(node.then, lookup) if _truthy(evaluate(node.cond, lookup)) else evaluate(node.other, lookup)
    if isinstance(node, ast.Call):
        fn = _function_of(node)
        args = [_num(evaluate(a, lookup), a) for a in node.args]
        try:
            return _check_size(fn(args, node.span), node.span)
        except (ValueError, OverflowError, TypeError) as exc:
            raise AsmError(f"{node.func}(): {exc}", node.span) from None
    if isinstance(node, ast.RegRef):
        raise AsmError("a register is not a number", node.span)
    raise AsmError("this is not a constant expression", getattr(node, "span", None))


def _function_of(node):
    """The implementation a call node names (FUNCTIONS), its argument count checked."""
    if node.func == "range":
        raise AsmError("range() is only valid in '.for NAME in range(...)'", node.span)
    spec = FUNCTIONS.get(node.func)
    if spec is None:
        known = ", ".join(sorted(FUNCTIONS))
        raise AsmError(f"unknown function '{node.func}' (known: {known})", node.span)
    arity, fn = spec
    lo, hi = (arity, arity) if isinstance(arity, int) else arity
    if not lo <= len(node.args) <= hi:
        want = str(lo) if lo == hi else f"{lo} to {hi}"
        raise AsmError(f"{node.func}() takes {want} argument(s), got {len(node.args)}", node.span)
    return fn


def _num(v, node):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, (int, float)):
        return v
    raise AsmError(f"expected a number, got {v!r}", node.span)


def _int(v, node):
    v = _num(v, node)
    if not isinstance(v, int):
        raise AsmError("bitwise operators need integers", node.span)
    return v


def _binop(op, a, b, node):
    span = node.span
    if op in ("+", "-", "*", "/", "//", "%", "**"):
        a, b = _num(a, node.left), _num(b, node.right)
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        if isinstance(a, int) and isinstance(b, int) and a.bit_length() + b.bit_length() > MAX_BITS + 1:
            raise AsmError(f"integer result exceeds {MAX_BITS} bits", span)
        return a * b
    if op in ("/", "//", "%"):
        if b == 0:
            raise AsmError("division by zero", span)
        if op == "/":
            return a / b
        return a // b if op == "//" else a % b
    if op == "**":
        if isinstance(b, int) and b < 0 and isinstance(a, int):
            if a == 0:
                raise AsmError("division by zero (0 to a negative power)", span)
            return float(a) ** b
        if isinstance(a, int) and isinstance(b, int) and abs(a) > 1 and b * max(1, abs(a).bit_length()) > MAX_BITS:
            raise AsmError(f"integer result exceeds {MAX_BITS} bits", span)
        try:
            result = a ** b
        except (OverflowError, ZeroDivisionError) as exc:
            raise AsmError(f"'**': {exc}", span) from None
        if isinstance(result, complex):
            raise AsmError(f"'**': {a} ** {b} is not a real number", span)
        return result
    if op in ("<<", ">>", "&", "|", "^"):
        a, b = _int(a, node.left), _int(b, node.right)
        if op in ("<<", ">>") and b < 0:
            raise AsmError("negative shift count", span)
        if op == "<<":
            if a and a.bit_length() + b > MAX_BITS:
                raise AsmError(f"integer result exceeds {MAX_BITS} bits", span)
            return a << b
        if op == ">>":
            return a >> min(b, MAX_BITS + 1)
        return a & b if op == "&" else (a | b if op == "|" else a ^ b)
    raise AsmError(f"unknown operator '{op}'", span)


_COMPARISONS = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le,
                ">": operator.gt, ">=": operator.ge}


def _compare(op, a, b, node):
    try:
        return _COMPARISONS[op](a, b)
    except TypeError:
        raise AsmError(f"cannot compare {a!r} and {b!r}", node.span) from None


def compile_expression(node) -> Callable[[dict], Value]:
    """The expression as a Python function of a dict of bound names, with evaluate()'s semantics
    (its checks and errors; an unbound name raises AsmError): nested closures built from the AST,
    no text handed to Python's compile/eval. For hot loops over one expression (a walk of many
    calls over a spec's rules), where evaluate()'s per-node type dispatch would dominate."""
    if isinstance(node, ast.Num):
        value = parse_number(node.text, node.span)
        return lambda values: value
    if isinstance(node, ast.Name):
        name, span = node.plain, node.span
        if name is None:
            raise AsmError("an interpolated name is not a number here", node.span)

        def name_value(values):
            try:
                return values[name]
            except KeyError:
                raise AsmError(f"undefined name '{name}' (known: {', '.join(values)})", span) from None
        return name_value
    if isinstance(node, ast.Str):
        text = node.value[1:-1]
        return lambda values: text
    if isinstance(node, ast.Brace) and len(node.items) == 1:
        return compile_expression(node.items[0])
    if isinstance(node, ast.UnOp):
        operand, op = compile_expression(node.operand), node.op
        if op == "-":
            return lambda values: -_num(operand(values), node)
        if op == "+":
            return lambda values: _num(operand(values), node)
        if op == "~":
            return lambda values: ~_int(operand(values), node)
        if op in ("not", "!"):
            return lambda values: int(not _truthy(operand(values)))
    if isinstance(node, ast.BinOp):
        left, right, op = compile_expression(node.left), compile_expression(node.right), node.op
        if op == "and":
            def both(values):
                a = left(values)
                return right(values) if _truthy(a) else a
            return both
        if op == "or":
            def either(values):
                a = left(values)
                return a if _truthy(a) else right(values)
            return either
        return lambda values: _check_size(_binop(op, left(values), right(values), node), node.span)
    if isinstance(node, ast.Compare):
        first = compile_expression(node.first)
        rest = [(op, compile_expression(r)) for op, r in node.rest]

        def compare(values):
            a = first(values)
            for op, rhs in rest:
                b = rhs(values)
                if not _compare(op, a, b, node):
                    return 0
                a = b
            return 1
        return compare
    if isinstance(node, ast.Cond):
        cond, then, other = compile_expression(node.cond), compile_expression(node.then), compile_expression(node.other)
        return lambda values: then(values) if _truthy(cond(values)) else other(values)
    if isinstance(node, ast.Call):
        fn = _function_of(node)
        args = [(compile_expression(a), a) for a in node.args]

        def call(values):
            got = [_num(arg(values), a) for arg, a in args]
            try:
                return _check_size(fn(got, node.span), node.span)
            except (ValueError, OverflowError, TypeError) as exc:
                raise AsmError(f"{node.func}(): {exc}", node.span) from None
        return call
    if isinstance(node, ast.RegRef):
        raise AsmError("a register is not a number", node.span)
    raise AsmError("this is not a constant expression", getattr(node, "span", None))
