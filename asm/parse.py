"""Stage 1: source text -> AST (ast.py). `parse_source` takes the fast path (parse_fast.py: ordinary
lines without Lark) and falls back to the grammar (grammar/sasm.lark, Lark LALR); both build the AST
with parse_tree.py's AstBuilder (where `parse_expression`, for directive-line expressions and { }
groups, lives too), so every AST node carries a span into the original file.
"""
from __future__ import annotations

import re
import threading
from collections import OrderedDict

from lark.exceptions import UnexpectedInput

from . import ast, parse_fast
from .errors import AsmError
from .parse_tree import MAX_BRACKET_DEPTH, MAX_LINE_CHARS, AstBuilder, statement_parser, syntax_error
from .source import SourceFile, Span


# The ASTs of the last few sources parsed, by (path, text). A process builds one kernel under
# many configurations (dispatch tries candidates, a sweep builds variants), and every build
# parsed its source and each of its includes again: the default test run parsed 4,495 times for
# 1,235 builds, about a quarter of its profiled CPU. Expansion only reads an AST (pipeline's
# _top_level copies), except that the fast path's LazyOperands are filled and emptied again as
# expansion passes them, so an AST is shared only within one thread (the key holds the thread).
# The key holds the fast path as well: a caller that switches it off (parse_fast.parse = lambda
# s: None, as the tests comparing the two paths do) gets the grammar's own parse. A source that
# fails to parse is not kept, nor one longer than _MEMO_MAX_CHARS (a large file's AST is many
# times its text).
_MEMO: OrderedDict[tuple, ast.Module] = OrderedDict()
_MEMO_ENTRIES = 32
_MEMO_MAX_CHARS = 1 << 20
_MEMO_LOCK = threading.Lock()


def parse_source(source: SourceFile) -> ast.Module:
    if len(source.text) > _MEMO_MAX_CHARS:
        return _parse_source(source)
    key = (source.path, source.text, parse_fast.parse, threading.get_ident())
    with _MEMO_LOCK:
        module = _MEMO.get(key)
        if module is not None:
            _MEMO.move_to_end(key)
            return module
    module = _parse_source(source)
    with _MEMO_LOCK:
        _MEMO[key] = module
        while len(_MEMO) > _MEMO_ENTRIES:
            _MEMO.popitem(last=False)
    return module


def _parse_source(source: SourceFile) -> ast.Module:
    check_text_limits(source)
    fast = parse_fast.parse(source)    # ordinary lines without Lark; None: use the grammar
    if fast is not None:
        return fast
    try:
        tree = statement_parser().parse(source.text)
    except UnexpectedInput as exc:
        raise syntax_error(exc, source, 0, source.text) from None
    builder = AstBuilder(source)
    try:
        return ast.Module(builder.stmts(tree.children), source)
    except RecursionError:
        raise builder.too_deep() from None


# Comments, strings, brackets and line ends: all the raw-text check needs to see.
_RAW_SCAN = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|[(\[\])\n]', re.S)
# A PTX data initialiser (`.global .align 4 .b8 tbl[65536] = {0, 1, ...};`): nvcc writes it on
# one line however long; it is one token to the grammar, so it is exempt from MAX_LINE_CHARS.
_DATA_INIT = re.compile(r"[ \t]*(?:\.(?:visible|extern|weak|common)[ \t]+)*\.(?:global|const)[ \t]+\.[^=\n]*=[ \t]*\{")


# The start of a line longer than MAX_LINE_CHARS: found by the regex engine (a loop over a 20 MB
# file's line starts in Python took a second).
_LONG_LINE = re.compile(r"^[^\n]{%d}" % (MAX_LINE_CHARS + 1), re.M)
_OPENER = re.compile(r"[(\[]")


def _opener_run(text: str) -> bool:
    """Whether some line holds more than MAX_BRACKET_DEPTH opening brackets (comments and strings
    included): only then can a line nest them deeper than that, when no block comment (which may
    join lines) is anywhere. Bracket by bracket, the whole check took a second at 20 MB, most of it
    for lines with one or two brackets."""
    at = [m.start() for m in _OPENER.finditer(text)]
    find = text.find
    return any(find("\n", a, b) < 0 for a, b in zip(at, at[MAX_BRACKET_DEPTH:]))


def check_text_limits(source: SourceFile) -> None:
    """MAX_LINE_CHARS and MAX_BRACKET_DEPTH, checked on the raw text before parsing, cheaply: a
    file shorter than the line limit has no long line, and brackets are counted only when there
    are more of them than the depth limit."""
    text = source.text
    if len(text) > MAX_LINE_CHARS and source.longest_line() > MAX_LINE_CHARS:
        for long in _LONG_LINE.finditer(text):
            start = long.start()
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
            at = start + MAX_LINE_CHARS
            m = _DATA_INIT.match(text, start, end)
            if m is not None:
                semi = text.find(";", m.end(), end)
                if semi >= 0 and end - semi <= MAX_LINE_CHARS:
                    continue
                at = semi + MAX_LINE_CHARS if semi >= 0 else end - 1
            raise AsmError(f"this line is {end - start:,} characters long (limit {MAX_LINE_CHARS:,} "
                           "characters per line)", Span(source, at, at + 1))
    if text.count("(") + text.count("[") <= MAX_BRACKET_DEPTH:
        return
    if "/*" not in text and not _opener_run(text):
        return
    depth = 0
    for m in _RAW_SCAN.finditer(text):
        ch = text[m.start()]
        if ch == "(" or ch == "[":
            depth += 1
            if depth > MAX_BRACKET_DEPTH:
                raise AsmError(f"brackets nested more than {MAX_BRACKET_DEPTH} deep on one line "
                               f"(limit {MAX_BRACKET_DEPTH})", Span(source, m.start(), m.start() + 1))
        elif ch == ")" or ch == "]":
            if depth:
                depth -= 1
        elif ch == "\n":
            depth = 0
