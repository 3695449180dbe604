"""The fast path of stage 1: most lines of a source, plain PTX from nvcc or Triton and `.sasm`
kernels alike, are one simple instruction, label, declaration or `.loc`, and building those with
Lark (a token object per token, a tree node per rule, positions propagated through every node) was
most of a build's time: minutes for a 20 MB file.

`parse` recognises such lines, and function headers, with regular expressions and builds their AST
nodes itself: exactly the nodes the grammar path builds (tests/test_parse_fast.py compares the two
over the corpus, the shipped kernels and mutants of both). Everything else stays with the grammar:
the recognised text is blanked out (replaced by spaces, so every position stays where it was) and
the rest, the "skeleton" (directives, the macro layer, braces, initialisers, calls, whatever the
fast path does not fully recognise), is parsed by grammar/sasm.lark as usual. The grammar also
decides whether each recognised line really was a statement of its own: the token before it, as
the grammar's own lexer saw the skeleton, must end a statement or a block's header (`;`, `{`, `}`,
a label, a `.loc` line, a directive's expression, `.endm`, `.else`, a macro call's `)`...) and it
must not lie in a block comment. A function header is blanked up to its body's `{`, so that the
grammar parses the body as a `{ }` scope, which then becomes the function's body. Recognised nodes
are put into the skeleton's parse tree by position, in whichever block holds them (a function, a
macro, a `.for`, an `.if` branch), and the tree is built into the AST as usual; a function's body
keeps its recognised lines by position and builds each one's node when the body is read
(`Statements`), so that a large source's AST is never whole.

Recognised lines the grammar refuses are put back and the skeleton parsed again. A syntax error in
the skeleton is reported from the skeleton, with no parse of the whole text: once every recognised
line before the error is confirmed as a statement and those from the error on are put back, the
grammar's parser is where it would be on the whole text (only statements were left out before
the error, and from the error on the text is the original), so the error is the grammar path's own,
found at the cost of parsing the skeleton; a source under WHOLE_TEXT_ERRORS with an error goes to
the grammar path whole instead (a blanked statement can still change how what follows is read). Only when the rounds of putting lines back do not settle
(`_ROUNDS`) does the whole text go through the grammar path. Conservative by design: a line with
`{expr}` interpolation, a component of a name without '%' (`q.x`), `!`, parentheses, a string, an
initialiser, an address other than `[base]`, `[base+n]`, `[base-n]` is not recognised.
"""
from __future__ import annotations

import bisect
import re
import sys
from array import array

from lark import Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from . import ast
from .list_view import ListView
from .parse_tree import MAX_NESTING, AstBuilder, statement_parser, syntax_error
from .source import SourceFile, Span

# The terminals of grammar/sasm.lark that recognised lines are made of, restricted: no {expr}
# interpolation, no vector component after a register, guards only on %-registers.
_NUMBER = (r"0[fF][0-9A-Fa-f]{8}(?![\w$])|0[dD][0-9A-Fa-f]{16}(?![\w$])|0[xX][0-9A-Fa-f]+U?|0[bB][01]+U?"
           r"|\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+U?")
_REG = r"%[A-Za-z_$][\w$]*"
_NAME = r"[A-Za-z_$][\w$]*"
# A register in a { } vector: grammar/expr.lark reads it, where if, else, or, and, not are keywords.
_VEC_NAME = r"%?(?!(?:if|else|or|and|not)(?![\w$]))" + _NAME

# Declaration qualifiers the fast path takes: state spaces, linkage, alignment, vector widths and
# register types. Never one of the grammar's keywords (.const, .loc, .entry ...), which lex apart.
_QUAL = (r"\.(?:reg|shared|local|global|param|extern|visible|weak|common|align|v2|v4|v8|pred|f16x2|bf16x2|bf16"
         r"|[bsuf](?:8|16|32|64))(?![\w$:])(?:[ \t]+(?:[1-9]\d{0,5}))?")
_DECLARATOR = r"%?" + _NAME + r"(?:[ \t]*<[ \t]*(?:0|[1-9]\d{0,8})[ \t]*>)?(?:[ \t]*\[[ \t]*(?:[1-9]\d{0,9})?[ \t]*\])*"

_LINE = re.compile(
    r"^(?P<ind>[ \t]*)(?:"
    # an instruction: [@guard] opcode [operands] ; [// comment]. The operands are one run of
    # characters (no two quantifiers may compete for the same blanks: hostile lines of 64K
    # spaces must stay linear); _instruction trims it.
    r"(?:(?P<guard>@!?" + _REG + r")[ \t]+)?(?P<op>[A-Za-z_]\w*(?:\.[\w:]+)*)(?P<args>(?:[ \t][^;\n]*)?)(?P<semi>;)"
    # a label
    r"|(?P<label>" + _NAME + r"):(?!:)"
    # a declaration without initialiser: .reg .b32 %r<4>;  .shared .align 16 .b8 buf[4096];
    r"|(?P<quals>" + _QUAL + r"(?:[ \t]+" + _QUAL + r")*)[ \t]+(?P<decls>" + _DECLARATOR + r"(?:[ \t]*,[ \t]*"
    + _DECLARATOR + r")*)[ \t]*(?P<dsemi>;)"
    r")[ \t]*(?://[^\n]*)?$"
    # a .loc line (the grammar keeps its whole rest, comment included)
    r"|^(?P<lind>[ \t]*)\.loc(?P<loc>(?![\w$])[^\n]+)$",
    re.M)

# One operand of a recognised instruction (the outer group names its kind), then the separator
# that follows it: a comma with another operand after it, or the end of the list.
_OPERAND = re.compile(
    r"(?:(?P<reg>" + _REG + r"(?:\.[xyzwrgba](?![\w$]))?)"     # %tid.x: one REG token to the grammar
    r"|(?P<num>" + _NUMBER + r")"
    r"|(?P<neg>-(?:" + _NUMBER + r"))"
    r"|(?P<name>" + _NAME + r")"
    r"|(?P<mem>\[[ \t]*(?P<base>%?" + _NAME + r")(?:[ \t]*(?P<sign>[-+])[ \t]*(?P<minus>-[ \t]*)?(?P<off>"
    + _NUMBER + r"))?[ \t]*\])"
    # a vector of registers, '%' or not; never a keyword of the expression grammar, which reads { }
    r"|(?P<vec>\{[ \t]*" + _VEC_NAME + r"(?:[ \t]*,[ \t]*" + _VEC_NAME + r")*[ \t]*\})"
    # the two destinations of setp/shfl: %r1|%p1, _|p
    r"|(?P<pair>(?P<p1>%?" + _NAME + r")[ \t]*\|[ \t]*(?P<p2>%?" + _NAME + r"))"
    r")(?=[ \t]*(?:,|$))(?:[ \t]*(?:,[ \t]*(?=[^ \t])|$))")
# The operands _operands tells apart by their text: as _OPERAND's first four kinds, the whole text.
_SIMPLE = re.compile(r"(?P<reg>" + _REG + r"(?:\.[xyzwrgba](?![\w$]))?)|(?P<num>" + _NUMBER + r")"
                     r"|(?P<neg>-(?:" + _NUMBER + r"))|(?P<name>" + _NAME + r")")
_QUAL_AT = re.compile(r"(\.[A-Za-z_][\w$]*)(?:[ \t]+(\d+))?")
_DECLARATOR_AT = re.compile(r"(%?" + _NAME + r")(?:[ \t]*<[ \t]*(\d+)[ \t]*>)?")
_DIM_AT = re.compile(r"[ \t]*\[[ \t]*(\d+)?[ \t]*\]")
_COMMA_AT = re.compile(r"[ \t]*,[ \t]*")
_VEC_ITEM = re.compile(_VEC_NAME)

# A function header, up to the `{` of its body or the `;` of a prototype; comments inside it
# leave it to the grammar. The keyword patterns are the grammar's own (FUNC_KIND, PERF_KW,
# PERF_FLAG_KW; tests/test_parse_fast.py checks they still are).
_FUNC_KIND = r"\.(entry|func)(?![\w$])"
_PERF_KW = r"\.(maxntid|reqntid|minnctapersm|maxnctapersm|maxnreg|reqnctapercluster|maxclusterrank)(?![\w$])"
_PERF_FLAG_KW = r"\.(noreturn|explicitcluster|blocksareclusters)(?![\w$])"
# Every \s* is followed by something that is not a blank (never two quantifiers over the same
# blanks), so that a header followed by a hostile run of blanks costs linear time.
_HEAD = re.compile(
    r"^[ \t]*(?P<quals>(?:\.(?:visible|extern|weak)[ \t]+)*)(?P<kind>" + _FUNC_KIND.replace("(", "(?:", 1) + r")"
    r"\s*(?:\((?P<ret>[^()/]*)\)\s*)?(?P<name>" + _NAME + r")\s*(?:\((?P<params>[^()/]*)\)\s*)?"
    r"(?P<perf>(?:(?:" + _PERF_KW.replace("(", "(?:", 1) + r"[ \t]+\d+(?:[ \t]*,[ \t]*\d+)*|"
    + _PERF_FLAG_KW.replace("(", "(?:", 1) + r")\s*)*)(?P<open>[{;])", re.M)
_PARAM = re.compile(
    r"\s*(?P<quals>(?:\.(?:param|reg|ptr|global|shared|const|local|align[ \t]+[1-9]\d{0,5}|v2|v4|v8|pred|f16x2"
    r"|bf16x2|bf16|[bsuf](?:8|16|32|64))(?![\w$:])\s+)+)(?P<name>" + _NAME + r")"
    r"(?P<dims>(?:[ \t]*\[[ \t]*(?:[1-9]\d{0,9})?[ \t]*\])*)\s*")
_PERF_AT = re.compile(r"(\.[A-Za-z_]\w*)((?:[ \t]+\d+(?:[ \t]*,[ \t]*\d+)*)?)")
_WORD_AT = re.compile(r"\.[A-Za-z_]\w*")
_INT_AT = re.compile(r"\d+")


class _Head:
    """A function header the fast path built: the grammar parses its body as a `{ }` scope,
    which the merge turns into the function's body."""
    __slots__ = ("fn", "brace")

    def __init__(self, fn: ast.Function, brace: int):
        self.fn = fn
        self.brace = brace


# What plain PTX is made of (pipeline.plain_ptx_layout asks the same of a whole AST).
PLAIN_PTX_NODES = (ast.Version, ast.Target, ast.AddressSize, ast.RawDirective, ast.Decl, ast.Function, ast.Label,
                   ast.Instr, ast.Scope)


_intern = sys.intern


class _Unrecognised(Exception):
    """A line the fast path leaves to the grammar."""


def parse(source: SourceFile) -> ast.Module | None:
    """The AST of a source, the recognised lines built here and the rest by the grammar; an
    AsmError for a syntax error, located as the grammar path locates it; None when the whole
    source should go through the grammar path instead."""
    text = source.text
    # `.section` bodies (debug information) are raw text to the grammar: labels in them are not
    # statements. Skipping them here only saves a second round below.
    sections = _sections(text) if ".section" in text else []
    heads = []
    for m in _HEAD.finditer(text):
        if sections and _inside(sections, m.start()):
            continue
        try:
            head = _function_head(m, source)
        except _Unrecognised:
            continue
        # a body's `{` stays for the grammar, which parses the body as a scope
        heads.append((m.start(), m.start("open") if m.group("open") == "{" else m.end(), head))
    head_spans = [(a, b) for a, b, _ in heads]
    # The recognised text, in order: its nodes and where each blank starts and ends (arrays of
    # machine integers: a 20 MB source has 600k of them, which as tuples of ints were 70 MB).
    fast: list = []
    bstart, bend = array("q"), array("q")
    h = 0
    hs, n_heads = 0, len(head_spans)      # the first header that ends after the line (lines come in order)
    for m in _LINE.finditer(text):
        a = m.start()
        while hs < n_heads and head_spans[hs][1] <= a:
            hs += 1
        if hs < n_heads and head_spans[hs][0] <= a or sections and _inside(sections, a):
            continue
        if not _recognised(m):    # (its node is built where it is read: Statements)
            continue
        while h < len(heads) and heads[h][0] < a:
            bstart.append(heads[h][0])
            bend.append(heads[h][1])
            fast.append(heads[h][2])
            h += 1
        bstart.append(a)
        bend.append(m.end())
        fast.append(None)          # a recognised line: its node is built from the text at bstart
    for a, b, head in heads[h:]:
        bstart.append(a)
        bend.append(b)
        fast.append(head)
    del heads, head_spans
    for _ in range(_ROUNDS):
        if not fast:
            return None
        result = _skeleton_module(source, _blank(text, bstart, bend), bstart, fast)
        if result is None or isinstance(result, ast.Module):
            return result
        # put the lines in `result` back and ask again
        keep = [i for i in range(len(fast)) if i not in result]
        fast = [fast[i] for i in keep]
        bstart = array("q", (bstart[i] for i in keep))
        bend = array("q", (bend[i] for i in keep))
    return None


# Rounds of putting recognised lines back before the whole text goes to the grammar: a clean source
# takes one, a syntax error two (the lines after it put back), odd mixtures of statements and
# lines that only look like statements a few more.
_ROUNDS = 6

_SECTION = re.compile(r"\.section(?![\w$])[^{}\n]{0,200}(?:\n[^{}\n]{0,200})?\{")


def _sections(text: str) -> list[tuple[int, int]]:
    """Where `.section NAME { ... }` bodies lie (the grammar's SECTION_BODY: to the first `}`),
    found in one pass over the text."""
    out = []
    pos = 0
    while True:
        m = _SECTION.search(text, pos)
        if m is None:
            return out
        close = text.find("}", m.end())
        if close < 0:                      # never closed: everything after is its body
            out.append((m.start(), len(text)))
            return out
        out.append((m.start(), close + 1))
        pos = close + 1


def _inside(spans: list[tuple[int, int]], pos: int) -> bool:
    k = bisect.bisect_right(spans, (pos, 1 << 62)) - 1
    return k >= 0 and spans[k][0] <= pos < spans[k][1]


def _blank(text: str, bstart, bend) -> str:
    """`text` with the recognised lines replaced by spaces: every other position unchanged. Joined
    a few thousand lines at a time, so that the pieces in hand stay few."""
    chunks = []
    at = 0
    n = len(bstart)
    spaces = _SPACES
    for lo in range(0, n, 4096):
        pieces = []
        for k in range(lo, min(n, lo + 4096)):
            a, b = bstart[k], bend[k]
            pieces.append(text[at:a])
            pieces.append(spaces[b - a] if b - a < 256 else " " * (b - a))
            at = b
        chunks.append("".join(pieces))
    chunks.append(text[at:])
    return "".join(chunks)


_SPACES = [" " * n for n in range(256)]


# A source up to this size with a syntax error is parsed whole by the grammar path to report it
# (milliseconds to a second); a larger one reports the error from its skeleton, without the
# minutes a whole parse of many megabytes takes.
WHOLE_TEXT_ERRORS = 1 << 20


def _skeleton_module(source: SourceFile, skeleton: str, blanks, fast: list):
    """The module: the skeleton's parse tree with the recognised nodes put in, built; or the set
    of indices of blanked lines to put back; or None when the grammar path should take the whole
    source. A syntax error is raised as the grammar path raises it."""
    starts: list[int] = []
    ends: list[int] = []
    types: list[str] = []
    ip = statement_parser().parse_interactive(skeleton)
    try:
        last = None
        for tok in ip.iter_parse():
            starts.append(tok.start_pos)
            ends.append(tok.end_pos)
            types.append(tok.type)
            last = tok
        tree = ip.feed_eof(last)
    except UnexpectedInput as exc:
        if getattr(exc, "interactive_parser", None) is None:
            # as Lark's parse() does: UnexpectedToken.accepts (what the message lists) asks it
            exc.interactive_parser = ip
        if isinstance(exc, UnexpectedToken) and exc.token.type != "$END":
            stop = exc.token.start_pos
        elif isinstance(exc, UnexpectedCharacters):
            stop = exc.pos_in_stream
        else:
            stop = len(skeleton)
        k = bisect.bisect_left(starts, stop)
        del starts[k:], ends[k:], types[k:]
        before = bisect.bisect_left(blanks, stop)
        refused = _refused(skeleton, blanks[:before], starts, ends, types, stop)
        if refused:
            return refused
        if len(source.text) <= WHOLE_TEXT_ERRORS:
            # a source this small is cheap to parse whole, and there the error is the grammar
            # path's by construction: blanked statements before the error can still change how the
            # grammar reads what follows (a `.for` whose one statement is blanked, then a stray
            # `.else`, is reported a line later in the skeleton: tests/test_parse_fast.py mutants)
            return None
        if before < len(blanks):
            # the text from the error on as written: the grammar sees what the whole text holds there
            return set(range(before, len(blanks)))
        raise syntax_error(exc, source, 0, source.text) from None
    refused = _refused(skeleton, blanks, starts, ends, types, len(skeleton))
    if refused:
        return refused
    del starts, ends, types
    orphans = _put_in(tree, fast, blanks, source)
    if orphans:
        return orphans
    builder = _FastBuilder(source, blanks)
    try:
        return ast.Module(builder.stmts(tree.children), source)
    except RecursionError:
        raise builder.too_deep() from None


# Tokens after which the grammar is at the start of a statement (of a body, a block or the file).
_BOUNDARY = frozenset({"SEMICOLON", "LBRACE", "RBRACE", "LABEL_DEF", "LINE_RAW", "LINE_EXPR", "ENDM_KW",
                       "ENDFOR_KW", "ENDIF_KW", "ELSE_KW", "SCHEDULE_KW", "ENDSCHEDULE_KW"})
_IGNORED = re.compile(r"[ \t\f\r\n]+|//[^\n]*|/\*(?:.|\n)*?\*/")


def _refused(skeleton: str, blanks, starts, ends, types, stop: int) -> set[int]:
    """The blanked lines that do not sit where the grammar expects a statement: after a token
    that ends one (or at the top), outside block comments. `stop`: where the tokens end."""
    out = set()
    checked_gap = -2
    comments: list[tuple[int, int]] = []
    for i, a in enumerate(blanks):
        k = bisect.bisect_right(starts, a) - 1
        if k >= 0 and (ends[k] > a or types[k] not in _BOUNDARY and not _header_end(types, k)):
            out.add(i)
            continue
        if k != checked_gap:               # the ignorable text between token k and token k+1
            checked_gap = k
            lo = ends[k] if k >= 0 else 0
            hi = starts[k + 1] if k + 1 < len(starts) else stop
            comments = _block_comments(skeleton, lo, hi) if skeleton.find("/*", lo, hi) >= 0 else []
        if any(s <= a < e for s, e in comments):
            out.add(i)
    return out


def _header_end(types: list[str], k: int) -> bool:
    """Token k ends a `.version N`, `.address_size N`, `.target a, b`, `.include "f"`, `.error "m"`
    statement, or a macro call or `.macro` head (their `)`): statements without a ';' of their own."""
    t = types[k]
    if t == "NUMBER":
        return k > 0 and types[k - 1] in ("VERSION_KW", "ADDRSIZE_KW")
    if t == "STRING":
        return k > 0 and types[k - 1] in ("INCLUDE_KW", "ERROR_KW")
    if t == "RPAR":
        depth = 0
        for j in range(k, -1, -1):         # the '(' this one closes
            if types[j] == "RPAR":
                depth += 1
            elif types[j] in ("LPAR", "MACRO_CALL"):
                depth -= 1
                if depth == 0:
                    return types[j] == "MACRO_CALL" or j > 1 and types[j - 1] == "NAME" and types[j - 2] == "MACRO_KW"
        return False
    if t != "NAME":
        return False
    while k > 1 and types[k - 1] == "COMMA" and types[k - 2] == "NAME":
        k -= 2
    return k > 0 and types[k - 1] == "TARGET_KW"


def _block_comments(text: str, lo: int, hi: int) -> list[tuple[int, int]]:
    out = []
    pos = lo
    while pos < hi:
        m = _IGNORED.match(text, pos)
        if m is None:                      # not ignorable after all: refuse every blank here
            return [(lo, hi)]
        if text.startswith("/*", pos):
            out.append((m.start(), m.end()))
        pos = m.end()
    return out


def _prebuilt(kind: str, children: list, start: int, end: int):
    t = _Pre(children)
    if kind != "prebuilt":
        t.data = kind
    t.start_pos, t.end_pos = start, end
    return t


class _Pre(Tree):
    """A node the fast path built, among the skeleton tree's children: a Tree to the grammar
    path's builder (which keeps only Trees of a block's children), positioned as one,
    and cheap (there is one per recognised line)."""
    __slots__ = ("items", "start_pos", "end_pos")
    data = "prebuilt"
    empty = False

    def __init__(self, items):
        self.items = items

    @property
    def children(self):
        return self.items

    @property
    def meta(self):
        return self


def _put_in(tree, fast: list, blanks: list, source: SourceFile) -> set[int]:
    """Put the recognised nodes into the skeleton's parse tree, each among the children of the
    innermost rule whose text holds it (a body, scope, macro, `.for`, `.if` branch or the file),
    as `prebuilt` trees; a function header and the scope at its `{` become one `fast_function`.
    Returns the indices of headers without such a scope (the grammar saw something else there)."""
    orphans: set[int] = set()
    # (a blank starts where its node does, but for blanks before it: the same place among tokens)
    _put_children(tree, blanks, 0, fast, orphans, source, 1 << 62)    # the file: what follows its last token too
    return orphans


# Rules whose text ends with their last statement, not a closer of their own: a statement after
# what the skeleton still holds of them (all the rest blanked) is theirs up to the next sibling.
_OPEN_ENDED = frozenset({"elif_clause", "else_clause"})


def _next_start(children: list, j: int, end: int) -> int:
    for c in children[j:]:
        if c is None:
            continue
        if type(c) is Token:
            return c.start_pos
        if not c.meta.empty:
            return c.meta.start_pos
    return end


def _put_children(tree, blanks: list, i: int, fast: list, orphans: set, source: SourceFile,
                  end: int | None = None) -> int:
    out = []
    n = len(blanks)
    if end is None:
        end = tree.meta.end_pos if not tree.meta.empty else 1 << 62
    # The builder takes a plain statement list's entries as they are (_FastBuilder.stmts): a
    # recognised line goes in as its index, and its node is built when the list is built (or,
    # in a function's body, each time the body is read: Statements). The other blocks' rules
    # keep only Trees of their children, so there a node goes in built and wrapped.
    if tree.data in _STATEMENT_LISTS:
        def wrap(k):
            f = fast[k]
            return k if f is None else _wrap_head(f)
    else:
        def wrap(k):
            f = fast[k]
            return _wrap(_line_node(source, blanks[k]) if f is None else f)
    children = tree.children
    for j, c in enumerate(children):
        if c is not None:
            if type(c) is Token:
                start, stop = c.start_pos, c.end_pos
            else:
                meta = c.meta
                if meta.empty:
                    out.append(c)
                    continue
                start, stop = meta.start_pos, meta.end_pos
                if c.data in _OPEN_ENDED:
                    stop = _next_start(children, j + 1, end)
            while i < n and blanks[i] < start:
                out.append(wrap(i))
                i += 1
            if type(c) is Tree and i < n and blanks[i] < stop:
                i = _put_children(c, blanks, i, fast, orphans, source, stop)
        out.append(c)
    while i < n and blanks[i] < end:
        out.append(wrap(i))
        i += 1
    if any(type(c) is _Pre and type(c.children[0]) is _Head for c in out):
        out = _join_heads(out, fast, orphans)
    tree.children = out
    return i


_STATEMENT_LISTS = frozenset({"start", "body", "scope"})


def _wrap_head(f):
    return _wrap(f) if type(f) is _Head else f


def _wrap(f):
    if type(f) is _Head:
        if f.brace < 0:                    # a prototype: complete as it is
            return _prebuilt("prebuilt", (f.fn,), f.fn.span.start, f.fn.span.end)
        return _prebuilt("prebuilt", (f,), f.fn.span.start, f.brace)
    return _prebuilt("prebuilt", (f,), f.span.start, f.span.end)


def _join_heads(out: list, fast: list, orphans: set) -> list:
    joined = []
    k = 0
    while k < len(out):
        c = out[k]
        if type(c) is _Pre and type(c.children[0]) is _Head:
            head = c.children[0]
            nxt = out[k + 1] if k + 1 < len(out) else None
            if type(nxt) is Tree and nxt.data == "scope" and not nxt.meta.empty and nxt.meta.start_pos == head.brace:
                joined.append(_prebuilt("fast_function", (head, nxt), head.fn.span.start, nxt.meta.end_pos))
                k += 2
                continue
            orphans.add(next(i for i, f in enumerate(fast) if f is head))
        joined.append(c)
        k += 1
    return joined


class _FastBuilder(AstBuilder):
    """The grammar path's builder, taking the fast path's nodes as they are, and its recognised
    lines (their indices among `blanks`, where each starts) built from the text."""

    def __init__(self, source: SourceFile, blanks):
        super().__init__(source)
        self.blanks = blanks

    def s_prebuilt(self, t):
        return t.children[0]

    def stmts(self, children) -> list:
        # as the grammar path's, with the fast path's nodes taken as they are, bare or wrapped
        if self.depth + 1 > MAX_NESTING:
            return super().stmts([c if c is None or isinstance(c, (Tree, Token)) else _wrap(self._built(c))
                                  for c in children])
        self.depth += 1
        out = []
        pre = _Pre
        for c in children:
            if c is None:
                continue
            t = type(c)
            if t is int:
                out.append(_line_node(self.source, self.blanks[c]))
            elif t is pre:
                out.append(c.children[0] if c.data == "prebuilt" else self.stmt(c))
            elif t is Tree or t is Token:
                out.append(self.stmt(c))
            else:
                out.append(c)
        self.depth -= 1
        return out

    def _built(self, c):
        return _line_node(self.source, self.blanks[c]) if type(c) is int else c

    def body(self, children) -> "Statements | list":
        """A function's body: its recognised lines by position only (Statements), the rest built."""
        if self.depth + 1 > MAX_NESTING:
            return self.stmts(children)
        self.depth += 1
        nodes: list = []
        order = array("q")
        pre = _Pre
        blanks = self.blanks
        for c in children:
            if c is None:
                continue
            t = type(c)
            if t is int:
                order.append(blanks[c])
                continue
            if t is pre:
                node = c.children[0] if c.data == "prebuilt" else self.stmt(c)
            elif t is Tree or t is Token:
                node = self.stmt(c)
            else:
                node = c
            order.append(-1 - len(nodes))
            nodes.append(node)
        self.depth -= 1
        return Statements(self.source, nodes, order)

    def s_fast_function(self, t):
        head, scope = t.children
        fn = head.fn
        fn.body = self.body(scope.children)
        fn.span = Span(fn.span.source, fn.span.start, scope.meta.end_pos)
        return fn


class Statements(ListView):
    """A function's body as the fast path leaves it: the statements the grammar built, and the
    recognised lines (instructions, labels, declarations, `.loc`) by where they start, each built
    into its node whenever the body is read and never kept. A large source is almost all such
    lines, and their nodes (an Instr, its spans, its opcode's Name, its operands) were 13x the
    source's size, all alive at once; read once by expansion, they now live one at a time. Reads
    as the list of nodes the grammar path builds: iteration, len, indexing, comparison."""

    __slots__ = ("source", "grammar_nodes", "order")

    def __init__(self, source: SourceFile, grammar_nodes: list, order: array):
        self.source = source
        # every statement not from a recognised line, in order; each of those lines is plain PTX
        # (PLAIN_PTX_NODES, never `.pin`ned), which pipeline.plain_ptx_layout relies on
        self.grammar_nodes = grammar_nodes
        self.order = order              # >= 0: a recognised line's start; < 0: -1 - index in grammar_nodes

    def _at(self, k: int):
        return self.grammar_nodes[-1 - k] if k < 0 else _line_node(self.source, k)

    def __iter__(self):
        nodes, source = self.grammar_nodes, self.source
        match, text = _LINE.match, source.text
        for k in self.order:
            yield nodes[-1 - k] if k < 0 else _node(match(text, k), source, True)

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._at(k) for k in self.order[i]]
        return self._at(self.order[i])


def _line_node(source: SourceFile, start: int):
    """The node of the recognised line that starts at `start`: _LINE matches there as it did
    when the line was recognised."""
    return _node(_LINE.match(source.text, start), source, True)


# ---- building nodes --------------------------------------------------------------------------
def _node(m: re.Match, src: SourceFile, checked: bool = False):
    """The node of a line _LINE matched; _Unrecognised where the fast path leaves it to the
    grammar (`checked`: known to be recognised, by _recognised, when the source was parsed)."""
    if m.group("op") is not None:
        return _instruction(m, src, checked)
    if m.group("quals") is not None:
        return _declaration(m, src)
    if m.group("label") is not None:
        a, b = m.span("label")
        return ast.Label(ast.Name([m.group("label")], Span(src, a, b)), Span(src, a, b + 1))
    a = m.end("lind")
    return ast.RawDirective(".loc", m.group("loc").strip(), Span(src, a, m.end("loc")))


def _instruction(m: re.Match, src: SourceFile, checked: bool = False) -> ast.Instr:
    guard = None
    g = m.group("guard")
    if g is not None:
        ga, gb = m.span("guard")
        skip = 2 if g[1] == "!" else 1
        inner = Span(src, ga + skip, gb)
        guard = ast.Guard(skip == 2, ast.RegRef(ast.Name([g[skip:]], inner), inner), Span(src, ga, gb))
    oa, ob = m.span("op")
    if g is None:
        first = oa
    else:
        first = ga
    end = m.end("semi")
    operands = []
    args = m.group("args")
    if args and not args.isspace():
        if not checked and not _args_recognised(args, ob, m.string):
            raise _Unrecognised
        # recognised now, built when first used (expansion mostly never needs them built)
        # (the positions are the int objects the match made: a 20 MB source has millions)
        operands = LazyOperands(src, ob, end)
    op = m.group("op")
    parts = _OPCODE_PARTS.get(op)
    if parts is None:
        # one parts list per opcode, shared by its instructions (nothing writes a Name's parts)
        parts = [_intern(op)]
        if len(_OPCODE_PARTS) < _KINDS_KEPT:
            _OPCODE_PARTS[op] = parts
    return ast.Instr(guard, ast.Name(parts, Span(src, oa, ob)), operands, False, Span(src, first, end))


_OPCODE_PARTS: dict[str, list] = {}


def _recognised(m: re.Match) -> bool:
    """Whether _node(m) builds a node (it raises _Unrecognised exactly where this is False),
    found without building it: only an instruction's operands can fail."""
    if m.group("op") is None:
        return True
    args = m.group("args")
    return not args or args.isspace() or _args_recognised(args, m.end("op"), m.string)


def _args_recognised(args: str, at: int, text: str) -> bool:
    """Whether an instruction's operands (`args`, found at `at` in `text`, blanks around them
    allowed) are all of the kinds the fast path builds."""
    if "[" in args or "{" in args or "|" in args:
        a, b = at, at + len(args)
        while a < b and text[a] in " \t":
            a += 1
        while b > a and text[b - 1] in " \t":
            b -= 1
        try:
            _operands_matched(text, a, b, None, build=False)
        except _Unrecognised:
            return False
        return True
    kinds = _KINDS
    for raw in args.split(","):
        if not (kinds.get(raw) or _known(raw))[0]:
            return False
    return True


class LazyOperands(list):
    """The operands of a recognised instruction, as the AST nodes they are, built on first use
    (iteration, indexing, comparison) from the text they were recognised in. The nodes of a large
    source's operands were most of its AST's memory, and expansion reads an operand by its text
    (Expander._operands) when it has seen that text before, so most are never built; `forget`
    drops the built nodes again."""

    __slots__ = ("source", "start", "end", "built")

    def __init__(self, source: SourceFile, start: int, end: int):
        # start: where the opcode ends; end: where the instruction's ';' ends
        self.source, self.start, self.end, self.built = source, start, end, False

    def text(self) -> str:
        """The operands' text (between the opcode and the ';')."""
        return self.source.text[self.start:self.end - 1]

    def fill(self) -> "LazyOperands":
        if not self.built:
            self.built = True
            text = self.source.text
            a, b = self.start, self.end - 1
            while a < b and text[a] in " \t":
                a += 1
            while b > a and text[b - 1] in " \t":
                b -= 1
            list.extend(self, _operands(text, a, b, self.source))
        return self

    def forget(self) -> None:
        if self.built:
            list.clear(self)
            self.built = False

    def __iter__(self):
        return list.__iter__(self.fill())

    def __len__(self) -> int:
        return list.__len__(self.fill())

    def __getitem__(self, i):
        return list.__getitem__(self.fill(), i)

    def __contains__(self, x) -> bool:
        return list.__contains__(self.fill(), x)

    def __reversed__(self):
        return list.__reversed__(self.fill())

    def __eq__(self, other):
        if type(other) is LazyOperands:
            other.fill()
        return list.__eq__(self.fill(), other)

    def __ne__(self, other):
        same = self.__eq__(other)
        return same if same is NotImplemented else not same

    __hash__ = None

    def __repr__(self) -> str:
        return list.__repr__(self.fill())

    def copy(self) -> list:
        return list(self)


def _operands(text: str, pos: int, end: int, src: SourceFile) -> list:
    """The operands between pos and end. Most lists are registers, names and numbers between
    commas: those are told apart by the operand's text alone, once per distinct text."""
    if text.find("[", pos, end) >= 0 or text.find("{", pos, end) >= 0 or text.find("|", pos, end) >= 0:
        return _operands_matched(text, pos, end, src)
    out = []
    kinds = _KINDS
    at = pos
    for raw in text[pos:end].split(","):
        kind, piece, lead = kinds.get(raw) or _known(raw)
        a = at + lead
        b = a + len(piece)
        at += len(raw) + 1
        sp = Span(src, a, b)
        if kind == "reg":
            out.append(ast.RegRef(ast.Name([piece], sp), sp))
        elif kind == "name":
            out.append(ast.Name([piece], sp))
        elif kind == "num":
            out.append(ast.Num(piece, sp))
        elif kind == "neg":
            out.append(ast.UnOp("-", ast.Num(piece[1:], Span(src, a + 1, b)), sp))
        else:
            raise _Unrecognised
    return out


def _known(raw: str) -> tuple[str, str, int]:
    piece = raw.strip(" \t")
    m = _SIMPLE.fullmatch(piece)
    # one string object per distinct name, not per use: a tenth of the memory
    known = (m.lastgroup if m is not None else "", _intern(piece), len(raw) - len(raw.lstrip(" \t")))
    if len(_KINDS) < _KINDS_KEPT:
        _KINDS[raw] = known
    return known


# What _operands knows of an operand's text between commas: ('reg' | 'num' | 'neg' | 'name' | '' (none),
# the text without blanks, interned; how many blanks lead).
_KINDS: dict[str, tuple[str, str]] = {}
_KINDS_KEPT = 50_000


def _operands_matched(text: str, pos: int, end: int, src: SourceFile, build: bool = True) -> list:
    out = []
    match = _OPERAND.match
    while pos < end:
        m = match(text, pos, end)
        if m is None:
            raise _Unrecognised
        if not build:
            pos = m.end()
            continue
        kind = m.lastgroup
        a, b = m.span(kind)
        if kind == "reg":
            sp = Span(src, a, b)
            # one string object per distinct register name, not per use: a tenth of the memory
            out.append(ast.RegRef(ast.Name([_intern(text[a:b])], sp), sp))
        elif kind == "num":
            out.append(ast.Num(text[a:b], Span(src, a, b)))
        elif kind == "name":
            out.append(ast.Name([_intern(text[a:b])], Span(src, a, b)))
        elif kind == "neg":
            out.append(ast.UnOp("-", ast.Num(text[a + 1:b], Span(src, a + 1, b)), Span(src, a, b)))
        elif kind == "mem":
            out.append(_memref(m, src))
        elif kind == "pair":
            out.append(ast.Pair(_name_node(m.group("p1"), *m.span("p1"), src),
                                _name_node(m.group("p2"), *m.span("p2"), src), Span(src, a, b)))
        else:                              # vec
            items = []
            for v in _VEC_ITEM.finditer(text, a + 1, b - 1):
                sp = Span(src, v.start(), v.end())
                item = ast.Name([_intern(v.group())], sp)
                items.append(ast.RegRef(item, sp) if text[v.start()] == "%" else item)
            out.append(ast.Brace(items, Span(src, a, b)))
        pos = m.end()
    return out


def _function_head(m: re.Match, src: SourceFile) -> "_Head":
    text = m.string
    quals = [ast.Qualifier(q.group(), None, Span(src, q.start(), q.end()))
             for q in _WORD_AT.finditer(text, m.start("quals"), m.end("quals"))]
    first = quals[0].span.start if quals else m.start("kind")
    ret = _params(text, m.start("ret"), m.end("ret"), src, empty_ok=False) if m.group("ret") is not None else []
    na, nb = m.span("name")
    name = ast.Name([m.group("name")], Span(src, na, nb))
    params = _params(text, m.start("params"), m.end("params"), src) if m.group("params") is not None else None
    perf = []
    pos, end = m.start("perf"), m.end("perf")
    while True:
        w = _PERF_AT.search(text, pos, end)
        if w is None:
            break
        values = [ast.Num(v.group(), Span(src, v.start(), v.end()))
                  for v in _INT_AT.finditer(text, w.start(2), w.end(2))]
        stop = w.end(2) if values else w.end(1)
        perf.append(ast.PerfDirective(w.group(1), values, Span(src, w.start(), stop)))
        pos = w.end()
    if m.group("open") == "{":
        fn = ast.Function(quals, m.group("kind")[1:], ret, name, params, perf, None, Span(src, first, first))
        return _Head(fn, m.start("open"))
    fn = ast.Function(quals, m.group("kind")[1:], ret, name, params, perf, None, Span(src, first, m.end()))
    return _Head(fn, -1)


def _params(text: str, a: int, b: int, src: SourceFile, empty_ok: bool = True) -> list:
    """`.param .u64 p, .param .align 8 .b8 q[16]` between a and b, as the grammar's Params."""
    if not text[a:b].strip():
        if empty_ok:
            return []
        raise _Unrecognised
    out = []
    pos = a
    while True:
        comma = text.find(",", pos, b)
        stop = b if comma < 0 else comma
        m = _PARAM.fullmatch(text, pos, stop)
        if m is None:
            raise _Unrecognised
        quals = []
        for q in _QUAL_AT.finditer(text, m.start("quals"), m.end("quals")):
            arg = ast.Num(q.group(2), Span(src, q.start(2), q.end(2))) if q.group(2) is not None else None
            quals.append(ast.Qualifier(q.group(1), arg, Span(src, q.start(), q.end())))
        na, nb = m.span("name")
        dims = []
        last = nb
        for dm in _DIM_AT.finditer(text, m.start("dims"), m.end("dims")):
            dims.append(ast.Num(dm.group(1), Span(src, dm.start(1), dm.end(1))) if dm.group(1) else None)
            last = dm.end()
        out.append(ast.Param(quals, ast.Name([m.group("name")], Span(src, na, nb)), dims,
                             Span(src, quals[0].span.start, last)))
        if comma < 0:
            return out
        pos = comma + 1


def _name_node(text: str, a: int, b: int, src: SourceFile):
    sp = Span(src, a, b)
    return ast.RegRef(ast.Name([text], sp), sp) if text[0] == "%" else ast.Name([text], sp)


def _declaration(m: re.Match, src: SourceFile) -> ast.Decl:
    text = m.string
    quals = []
    for q in _QUAL_AT.finditer(text, m.start("quals"), m.end("quals")):
        arg = None
        if q.group(2) is not None:
            arg = ast.Num(q.group(2), Span(src, q.start(2), q.end(2)))
        quals.append(ast.Qualifier(q.group(1), arg, Span(src, q.start(), q.end())))
    decls = []
    pos, end = m.start("decls"), m.end("decls")
    while True:
        d = _DECLARATOR_AT.match(text, pos, end)
        name = _name_node(d.group(1), d.start(1), d.end(1), src)
        count = int(d.group(2)) if d.group(2) is not None else None
        dims = []
        last = d.end()
        while True:
            dm = _DIM_AT.match(text, last, end)
            if dm is None:
                break
            dims.append(ast.Num(dm.group(1), Span(src, dm.start(1), dm.end(1))) if dm.group(1) else None)
            last = dm.end()
        decls.append(ast.Declarator(name, count, dims, None, Span(src, d.start(), last)))
        c = _COMMA_AT.match(text, last, end)
        if c is None:
            break
        pos = c.end()
    return ast.Decl(quals, decls, Span(src, m.start("quals"), m.end("dsemi")))


def _memref(m: re.Match, src: SourceFile) -> ast.MemRef:
    ba, bb = m.span("base")
    base_text = m.group("base")
    bsp = Span(src, ba, bb)
    base = ast.RegRef(ast.Name([base_text], bsp), bsp) if base_text[0] == "%" else ast.Name([base_text], bsp)
    addr = base
    if m.group("off") is not None:
        oa, ob = m.span("off")
        off = ast.Num(m.group("off"), Span(src, oa, ob))
        if m.group("minus") is not None:
            off = ast.UnOp("-", off, Span(src, m.start("minus"), ob))
        addr = ast.BinOp("+" if m.group("sign") == "+" else "-", base, off, Span(src, ba, ob))
    a, b = m.span("mem")
    return ast.MemRef([addr], Span(src, a, b))
