"""The fast path of stage 1 for plain PTX: most lines of nvcc's or Triton's PTX are one simple
instruction, label, declaration or `.loc`, and building those with Lark (a token object per token,
a tree node per rule, positions propagated through every node) was most of a plain-PTX build's time.

`parse_plain` recognises such lines, and function headers, with regular expressions and builds
their AST nodes itself: exactly the nodes the grammar path builds (tests/test_parse_fast.py
compares the two over the whole corpus and over mutants of it). Everything else stays with the
grammar: the recognised text is blanked out (replaced by spaces, so every position stays where it
was) and the rest, the "skeleton" (braces, initialisers, calls, whatever the fast path does not
fully recognise), is parsed by grammar/sasm.lark as usual. The grammar also decides whether each
recognised line really was a statement of its own: the token before it, as the grammar's own
lexer saw the skeleton, must end a statement (`;`, `{`, `}`, a label, a `.loc`/`.file` line, a
`.version`/`.target`/`.address_size` line) and it must not lie in a block comment. A function
header is blanked up to its body's `{`, so that the grammar parses the body as a `{ }` scope, which
then becomes the function's body. Recognised nodes are merged into the skeleton by position.

Whenever anything is not so (a macro-layer statement anywhere, a skeleton that does not parse, a
header whose `{` the grammar does not see as one), `parse_plain` returns None and the whole file
goes through the grammar path, so errors are reported exactly as before; recognised lines the
grammar refuses are put back and the skeleton parsed again. Conservative by design: a line with
`{expr}` interpolation, a component of a name without '%' (`q.x`), `!`, parentheses, a string,
an initialiser, an address other than `[base]`, `[base+n]`, `[base-n]` is not recognised.
"""
from __future__ import annotations

import bisect
import re
import sys

from . import ast
from .source import SourceFile, Span

# Macro-layer keywords: a source with any of them (even in a comment) is left to the grammar
# whole; the skeleton check below is the exact test, this only saves the work.
_MACRO_HINT = re.compile(r"\.(?:macro|endm|for|endfor|if|elif|else|endif|include|schedule|endschedule|regs|temp|pin"
                         r"|tune|error)(?![\w$])|\.const[ \t]+[A-Za-z_$]")

# The terminals of grammar/sasm.lark that recognised lines are made of, restricted: no {expr}
# interpolation, no vector component after a register, guards only on %-registers.
_NUMBER = (r"0[fF][0-9A-Fa-f]{8}(?![\w$])|0[dD][0-9A-Fa-f]{16}(?![\w$])|0[xX][0-9A-Fa-f]+U?|0[bB][01]+U?"
           r"|\d+\.\d*(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+|\d+U?")
_REG = r"%[A-Za-z_$][\w$]*"
_NAME = r"[A-Za-z_$][\w$]*"

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
    r"|(?P<vec>\{[ \t]*" + _REG + r"(?:[ \t]*,[ \t]*" + _REG + r")*[ \t]*\})"
    # the two destinations of setp/shfl: %r1|%p1, _|p
    r"|(?P<pair>(?P<p1>%?" + _NAME + r")[ \t]*\|[ \t]*(?P<p2>%?" + _NAME + r"))"
    r")(?=[ \t]*(?:,|$))(?:[ \t]*(?:,[ \t]*(?=[^ \t])|$))")
_QUAL_AT = re.compile(r"(\.[A-Za-z_][\w$]*)(?:[ \t]+(\d+))?")
_DECLARATOR_AT = re.compile(r"(%?" + _NAME + r")(?:[ \t]*<[ \t]*(\d+)[ \t]*>)?")
_DIM_AT = re.compile(r"[ \t]*\[[ \t]*(\d+)?[ \t]*\]")
_COMMA_AT = re.compile(r"[ \t]*,[ \t]*")
_VEC_ITEM = re.compile(_REG)

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


# Tokens after which the grammar is at the start of a statement (of a body, scope or the file).
_BOUNDARY = frozenset({"SEMICOLON", "LBRACE", "RBRACE", "LABEL_DEF", "LINE_RAW"})
_IGNORED = re.compile(r"[ \t\f\r\n]+|//[^\n]*|/\*(?:.|\n)*?\*/")

# What plain PTX is made of (pipeline.plain_ptx_layout asks the same of a whole AST).
PLAIN_PTX_NODES = (ast.Version, ast.Target, ast.AddressSize, ast.RawDirective, ast.Decl, ast.Function, ast.Label,
                   ast.Instr, ast.Scope)


_intern = sys.intern


class _Unrecognised(Exception):
    """A line the fast path leaves to the grammar."""


def parse_plain(source: SourceFile) -> ast.Module | None:
    """The AST of a plain-PTX source, the recognised lines built here and the rest by the
    grammar; None when the whole source should go through the grammar path instead."""
    text = source.text
    if _MACRO_HINT.search(text):
        return None
    # `.section` bodies (debug information) are raw text to the grammar: labels in them are not
    # statements. Skipping them here only saves a second round below.
    sections = _sections(text) if ".section" in text else []
    found: list[tuple[int, int, object]] = []      # (start, end, node) of recognised text
    for m in _HEAD.finditer(text):
        if sections and _inside(sections, m.start()):
            continue
        try:
            head = _function_head(m, source)
        except _Unrecognised:
            continue
        # a body's `{` stays for the grammar, which parses the body as a scope
        found.append((m.start(), m.start("open") if m.group("open") == "{" else m.end(), head))
    heads = [(a, b) for a, b, _ in found]
    for m in _LINE.finditer(text):
        if sections and _inside(sections, m.start()) or heads and _inside(heads, m.start()):
            continue
        try:
            node = _node(m, source)
        except _Unrecognised:
            continue
        found.append((m.start(), m.end(), node))
    found.sort(key=lambda f: f[0])
    fast = [f[2] for f in found]
    blanks = [(a, b) for a, b, _ in found]
    del found, heads
    # The grammar refuses a recognised line that is not a statement of its own (in a multi-line
    # initialiser, a block comment, after `.pin`...): put those lines back and ask again.
    for _ in range(3):
        if not fast:
            return None
        result = _skeleton_module(source, _blank(text, blanks), blanks)
        if result is None:
            return None
        if isinstance(result, ast.Module):
            if any(type(f) is _Head for f in fast):
                fast = _attach_bodies(result.body, fast)
                if fast is None:
                    return None
            _merge(result.body, fast, 0, len(text))
            return result
        keep = [i for i in range(len(blanks)) if i not in result]
        fast = [fast[i] for i in keep]
        blanks = [blanks[i] for i in keep]
    return None


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


def _blank(text: str, blanks: list[tuple[int, int]]) -> str:
    """`text` with the recognised lines replaced by spaces: every other position unchanged."""
    pieces = []
    at = 0
    for a, b in blanks:
        pieces.append(text[at:a])
        pieces.append(" " * (b - a))
        at = b
    pieces.append(text[at:])
    return "".join(pieces)


def _skeleton_module(source: SourceFile, skeleton: str, blanks: list[tuple[int, int]]):
    """The skeleton's AST; or the set of indices of blanked lines the grammar refuses as
    statements; or None when the grammar path should take the whole source."""
    from lark.exceptions import LarkError

    from .errors import AsmError
    from .parse import _AstBuilder, statement_parser

    starts: list[int] = []
    ends: list[int] = []
    types: list[str] = []
    try:
        ip = statement_parser().parse_interactive(skeleton)
        last = None
        for tok in ip.iter_parse():
            starts.append(tok.start_pos)
            ends.append(tok.end_pos)
            types.append(tok.type)
            last = tok
        tree = ip.feed_eof(last)
    except LarkError:
        return None
    refused = _refused(skeleton, blanks, starts, ends, types)
    if refused:
        return refused
    del starts, ends, types
    builder = _AstBuilder(source)
    try:
        body = builder.stmts(tree.children)
    except (AsmError, RecursionError):
        return None
    if not _plain(body):
        return None
    return ast.Module(body, source)


def _refused(skeleton: str, blanks, starts, ends, types) -> set[int]:
    """The blanked lines that do not sit where the grammar expects a statement: after a token
    that ends one (or at the top), outside block comments."""
    out = set()
    checked_gap = -2
    comments: list[tuple[int, int]] = []
    for i, (a, _) in enumerate(blanks):
        k = bisect.bisect_right(starts, a) - 1
        if k >= 0 and (ends[k] > a or types[k] not in _BOUNDARY and not _header_end(types, k)):
            out.add(i)
            continue
        if k != checked_gap:               # the ignorable text between token k and token k+1
            checked_gap = k
            lo = ends[k] if k >= 0 else 0
            hi = starts[k + 1] if k + 1 < len(starts) else len(skeleton)
            comments = _block_comments(skeleton, lo, hi) if skeleton.find("/*", lo, hi) >= 0 else []
        if any(s <= a < e for s, e in comments):
            out.add(i)
    return out


def _header_end(types: list[str], k: int) -> bool:
    """Token k ends a `.version N`, `.address_size N` or `.target a, b` statement (which have no ';')."""
    if types[k] == "NUMBER":
        return k > 0 and types[k - 1] in ("VERSION_KW", "ADDRSIZE_KW")
    if types[k] != "NAME":
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


def _plain(body) -> bool:
    todo = [body]
    while todo:
        for s in todo.pop():
            t = type(s)
            if t not in PLAIN_PTX_NODES or t is ast.Instr and s.pinned:
                return False
            if t is ast.Function:
                if s.body is not None:
                    todo.append(s.body)
            elif t is ast.Scope:
                todo.append(s.body)
    return True


def _attach_bodies(top: list, fast: list) -> list | None:
    """Each recognised function header takes the scope the grammar found at its `{` as its body
    (in `top`, the skeleton's top-level statements); returns the other recognised statements, or
    None when a header has no such scope (the grammar saw something else there)."""
    heads = {f.brace: f for f in fast if type(f) is _Head and f.brace >= 0}
    for k, s in enumerate(top):
        if type(s) is ast.Scope and s.span.start in heads:
            fn = heads.pop(s.span.start).fn
            fn.body = s.body
            fn.span = Span(fn.span.source, fn.span.start, s.span.end)
            top[k] = fn
    if heads:
        return None
    return [f.fn if type(f) is _Head else f for f in fast if type(f) is not _Head or f.brace < 0]


def _merge(stmts: list, fast: list, i: int, end: int) -> int:
    """Insert fast[i:] (sorted by position) into `stmts` and the bodies inside it, up to offset
    `end`; returns the index of the first fast statement past `end`."""
    out = []
    n = len(fast)
    for s in stmts:
        start = s.span.start
        while i < n and fast[i].span.start < start:
            out.append(fast[i])
            i += 1
        body = s.body if type(s) in (ast.Function, ast.Scope) else None
        if body is not None:
            i = _merge(body, fast, i, s.span.end)
        out.append(s)
    while i < n and fast[i].span.start < end:
        out.append(fast[i])
        i += 1
    stmts[:] = out
    return i


# ---- building nodes --------------------------------------------------------------------------
def _node(m: re.Match, src: SourceFile):
    if m.group("op") is not None:
        return _instruction(m, src)
    if m.group("quals") is not None:
        return _declaration(m, src)
    if m.group("label") is not None:
        a, b = m.span("label")
        return ast.Label(ast.Name([m.group("label")], Span(src, a, b)), Span(src, a, b + 1))
    a = m.end("lind")
    return ast.RawDirective(".loc", m.group("loc").strip(), Span(src, a, m.end("loc")))


def _instruction(m: re.Match, src: SourceFile) -> ast.Instr:
    guard = None
    g = m.group("guard")
    if g is not None:
        ga, gb = m.span("guard")
        skip = 2 if g[1] == "!" else 1
        inner = Span(src, ga + skip, gb)
        guard = ast.Guard(skip == 2, ast.RegRef(ast.Name([g[skip:]], inner), inner), Span(src, ga, gb))
        first = ga
    else:
        first = m.start("op")
    oa, ob = m.span("op")
    operands = []
    text = m.string
    a, b = m.span("args")
    if a < b:
        while a < b and text[a] in " \t":
            a += 1
        while b > a and text[b - 1] in " \t":
            b -= 1
        if a < b:
            operands = _operands(text, a, b, src)
    return ast.Instr(guard, ast.Name([_intern(m.group("op"))], Span(src, oa, ob)), operands, False,
                     Span(src, first, m.end("semi")))


def _operands(text: str, pos: int, end: int, src: SourceFile) -> list:
    out = []
    match = _OPERAND.match
    while pos < end:
        m = match(text, pos, end)
        if m is None:
            raise _Unrecognised
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
                items.append(ast.RegRef(ast.Name([_intern(v.group())], sp), sp))
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
