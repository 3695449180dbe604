"""The macro layer's own expression evaluator (never Python's eval)."""
import math

import pytest
from hypothesis import given, settings, strategies as st

from asmgemm.errors import AsmError
from asmgemm.expr import compile_expression, evaluate, format_number, parse_number
from asmgemm.parse_tree import parse_expression
from asmgemm.source import SourceFile


def ev(text, **names):
    """The expression's value by evaluate(), after checking that its compiled form
    (compile_expression) gives the same value, or raises the same error at the same place."""
    tree = parse_expression(text, SourceFile.from_text("e", text), 0)

    def lookup(name, span):
        if name in names:
            return names[name]
        raise AsmError(f"undefined name '{name}'", span)
    try:
        want = evaluate(tree, lookup)
    except AsmError as exc:
        with pytest.raises(AsmError) as ei:
            compile_expression(tree)(names)
        assert (ei.value.message.split(" (known")[0], ei.value.span) == (exc.message.split(" (known")[0], exc.span)
        raise
    got = compile_expression(tree)(names)
    assert got == want and type(got) is type(want)
    return want


@pytest.mark.parametrize("text, value", [
    ("1 + 2 * 3", 7), ("(1 + 2) * 3", 9), ("7 // 2", 3), ("-7 // 2", -4), ("7 % 3", 1), ("-7 % 3", 2),
    ("7 / 2", 3.5), ("2 ** 10", 1024), ("2 ** 3 ** 2", 512), ("-2 ** 2", -4), ("1 << 5", 32), ("256 >> 4", 16),
    ("0xF0 & 0x3C", 0x30), ("0xF0 | 0x0F", 0xFF), ("0xFF ^ 0x0F", 0xF0), ("~0", -1),
    ("1 < 2 < 3", 1), ("1 < 3 < 2", 0), ("2 == 2", 1), ("2 != 2", 0),
    ("1 and 0", 0), ("0 or 5", 5), ("not 0", 1), ("3 if 1 > 2 else 4", 4),
    ("min(3, 1, 2)", 1), ("max(3, 9)", 9), ("abs(-4)", 4), ("log2(64)", 6), ("ceil_div(10, 4)", 3),
    ("is_pow2(48)", 0), ("is_pow2(64)", 1), ("int(7 / 2)", 3),
    ("0x10", 16), ("0b101", 5), ("017", 15), ("12U", 12), ("1.5e1", 15.0),
])
def test_values(text, value):
    assert ev(text) == value


def test_names_and_hex_floats():
    assert ev("N * 4 + K", N=8, K=1) == 33
    assert ev("0f3F800000") == 1.0
    assert ev("0d4000000000000000") == 2.0


@pytest.mark.parametrize("text, message", [
    ("1 / 0", "division by zero"), ("1 // 0", "division by zero"), ("1 % 0", "division by zero"),
    ("ceil_div(1, 0)", "division by zero"), ("undefined_thing", "undefined name"),
    ("nosuchfn(1)", "unknown function"), ("min()", "takes"), ("2 ** 100000", "exceeds"),
    ("1 << 100000", "exceeds"), ("1 << -1", "negative shift"), ("log2(0)", "non-positive"),
    ("range(3)", "only valid in"), ("1.5 & 1", "integers"),
])
def test_errors_are_asm_errors_with_spans(text, message):
    with pytest.raises(AsmError) as ei:
        ev(text)
    assert message in ei.value.message
    assert ei.value.span is not None


def test_error_span_points_at_the_operator_expression():
    with pytest.raises(AsmError) as ei:
        ev("1 + 8 // (2 - 2)")
    assert ei.value.span.col == 5  # the `8 // (2 - 2)` sub-expression


@given(st.integers(-2**40, 2**40), st.integers(-2**40, 2**40))
@settings(max_examples=200, deadline=None)
def test_arithmetic_matches_python_semantics(a, b):
    assert ev(f"({a}) + ({b}) * 3 - ({a})") == a + b * 3 - a
    if b != 0:
        assert ev(f"({a}) // ({b})") == a // b
        assert ev(f"({a}) % ({b})") == a % b


def test_format_number_is_exact():
    assert format_number(12) == "12"
    assert format_number(-3) == "-3"
    assert format_number(True) == "1"
    assert format_number(1.0) == "0d3FF0000000000000"
    assert parse_number(format_number(math.pi)) == math.pi


def test_compiled_rules_agree_with_the_tree_walk_on_every_shipped_rule():
    """compile_expression (the dispatch walk's rule evaluation, tests/hgemm_dispatch_configs.py)
    against evaluate() on every size, swap, route and split rule and term of kernels.toml."""
    import itertools
    from asmgemm.kernel_spec import all_specs
    sizes = (1, 65, 1000, 14336)
    checked = 0
    for spec in all_specs().values():
        trees = [t.tree for t in spec.terms] + [r.tree for r in spec.size_rules] + [r.tree for r in spec.swap_rules]
        trees += [r.tree for r in spec.routes]
        trees += [t for r in (spec.split_k.rules if spec.split_k else ()) for t in (r.when_tree, r.splits_tree)
                  if r.cost is None]
        compiled = [compile_expression(t) for t in trees]
        params = dict.fromkeys((p for p, _ in spec.call_params), 1)
        for m, n, k in itertools.product(sizes, repeat=3):
            names = {"M": m, "N": n, "K": k, "SMS": 132, "C_BYTES": 2, "PITCH_A": 2 * k, "PITCH_B": 2 * n,
                     "DRAM_PER_SM_CYCLE": 12 if k < 1000 else 18, **params}
            for term in spec.terms:
                names[term.name] = evaluate(term.tree, lambda name, span: names[name])
            for tree, fn in zip(trees, compiled):
                assert fn(names) == evaluate(tree, lambda name, span: names[name])
                checked += 1
    assert checked > 500          # (the rules of sgemm_skinny, hgemm_skinny and their like-tables)
