"""Large sources (issue 36): a 2 MB `.sasm` or plain-PTX kernel with a syntax error on its last line
is reported at that line and column, found by the fast path from the skeleton alone (the grammar
path, a Lark parse of the whole text, is never run); the operands the fast path leaves unbuilt
compare and build as the grammar's; the grammars' tables kept between processes rebuild when
damaged. Speed and memory are tools/big_source_bench.py's, not a test's."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import asmgemm.parse_tree as parse_tree
import asmgemm.parse_fast as parse_fast
from asmgemm.errors import AsmError
from asmgemm.parse import parse_source
from asmgemm.source import SourceFile

sys.path.insert(0, str(Path(__file__).parent.parent / "tools"))
try:
    import big_source_bench as bench
finally:
    sys.path.pop(0)


@pytest.fixture
def no_whole_text_parse(monkeypatch):
    """The statement grammar's whole-text parse (the grammar path) fails the test if it runs."""
    parser = parse_tree.statement_parser()

    def whole(text, *args, **kwargs):
        raise AssertionError(f"the grammar path parsed the whole text ({len(text):,} characters)")
    monkeypatch.setattr(parser, "parse", whole)


@pytest.mark.parametrize("kind", ["sasm", "ptx"])
def test_an_error_on_the_last_line_of_2_mb_is_located_there(kind, no_whole_text_parse):
    text = bench.generate(2_000_000, kind == "sasm", error=True)
    src = SourceFile.from_text(f"big.{kind}", text)
    with pytest.raises(AsmError) as exc:
        parse_source(src)
    err = exc.value
    last = text.count("\n") - 2                        # the error line, then `ret;` and `}`
    assert (err.span.line, err.span.col) == (last, bench.ERROR_COL), err.format()
    assert err.message.startswith("unexpected 'r'; expected one of"), err.message
    assert src.line_text(last) == bench.ERROR_LINE.rstrip("\n")


def test_the_error_is_the_grammar_paths_own():
    """The same tail, small enough for the grammar path: the same message at the same place."""
    text = bench.generate(20_000, True, error=True)
    src = SourceFile.from_text("small.sasm", text)
    with pytest.raises(AsmError) as fast:
        parse_source(src)
    saved = parse_fast.parse
    parse_fast.parse = lambda s: None
    try:
        with pytest.raises(AsmError) as slow:
            parse_source(src)
    finally:
        parse_fast.parse = saved
    assert fast.value.format() == slow.value.format()


def test_a_clean_2_mb_sasm_is_built_without_the_whole_text_grammar(no_whole_text_parse):
    from asmgemm.pipeline import build

    text = bench.generate(2_000_000, True)
    result = build(SourceFile.from_text("big.sasm", text))
    assert result.kernel_names == ["big"]
    assert result.ptx.count("fma.rn.f32") == text.count("fma.rn.f32")


def test_unbuilt_operands_build_and_compare_as_the_grammars():
    text = ".visible .entry k()\n{\n    .regs .f32 a, b\n    add.f32 a, a, b;\n    ld.global.f32 a, [b+4];\n    ret;\n}\n"
    src = SourceFile.from_text("k.sasm", text)
    module = parse_fast.parse(src)
    fn = module.body[0]
    add, ld = fn.body[1], fn.body[2]
    assert type(add.operands) is parse_fast.LazyOperands and not add.operands.built
    saved = parse_fast.parse
    parse_fast.parse = lambda s: None
    try:
        slow = parse_source(src)
    finally:
        parse_fast.parse = saved
    assert add.operands == slow.body[0].body[1].operands and add.operands.built
    assert [o.span.text() for o in ld.operands] == ["a", "[b+4]"] and len(ld.operands) == 2
    add.operands.forget()
    assert not add.operands.built and add == slow.body[0].body[1]


def test_damaged_parser_tables_are_rebuilt(tmp_path, monkeypatch):
    from asmgemm import parser_cache

    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path))
    options = dict(parser="lalr", lexer="contextual", propagate_positions=True, maybe_placeholders=True)
    grammar = parse_tree._grammar_text("sasm.lark")
    first = parser_cache.cached_lark("sasm.lark", grammar, **options)
    (kept,) = (tmp_path / parser_cache.FOLDER).glob("sasm-*.json")
    sample = ".visible .entry k()\n{\n    .regs .f32 a\n    mov.f32 a, 1.0;\n    ret;\n}\n"
    again = parser_cache.cached_lark("sasm.lark", grammar, **options)      # read back
    assert again.parse(sample) == first.parse(sample)
    kept.write_text(kept.read_text()[:1000])                                 # damaged
    rebuilt = parser_cache.cached_lark("sasm.lark", grammar, **options)
    assert rebuilt.parse(sample) == first.parse(sample)
    assert len(kept.read_text()) > 1000                                      # and written again
