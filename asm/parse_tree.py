"""The shared half of both parsers: the Lark grammars (grammar/sasm.lark, grammar/expr.lark), the
syntax-error messages, the parser's limits, and `AstBuilder`, which turns a Lark parse tree into
ast.* nodes with spans into the original file.

parse.py (the grammar path, and the entry points parse_source and parse_expression) and
parse_fast.py (ordinary lines recognised without Lark, the rest handed to the grammar) both build
on this module, so that neither imports the other's insides.
"""
from __future__ import annotations

import functools
from importlib import resources

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from . import ast
from .control_line import read_control_line
from .errors import AsmError, Note
from .expr import parse_number
from .parser_cache import cached_lark
from .source import SourceFile, Span

# Limits on what one file may ask of the parser, so that hostile or generated input gets an error
# at its position rather than a hang or a crash. Lines and brackets are checked on the raw text
# before Lark runs; expression depth while the AST is built.
MAX_NESTING = 200            # blocks (.for/.if/.macro/{ }) inside one another
MAX_LINE_CHARS = 65_536      # characters in one line (PTX data initialisers `= {...}` excepted)
MAX_BRACKET_DEPTH = 64       # ( and [ open at once on one line
MAX_EXPR_DEPTH = 100         # levels of one expression or operand: operators and parentheses

# What the user sees instead of a terminal's internal name.
_TERMINAL_WORDS = {
    "SEMICOLON": "';'", "COMMA": "','", "LBRACE": "'{'", "RBRACE": "'}'", "LPAR": "'('",
    "RPAR": "')'", "LSQB": "'['", "RSQB": "']'", "MORETHAN": "'>'", "LESSTHAN": "'<'",
    "OPCODE": "an instruction", "NAME": "a name", "VEC_ELEM": "a vector component (q.x)", "REG": "a %register", "NUMBER": "a number",
    "STRING": "a string", "LABEL_DEF": "a label", "DIR_WORD": "a directive", "GUARD": "a guard",
    "BRACE_RAW": "'{...}'", "LINE_EXPR": "an expression", "LINE_RAW": "the rest of the line",
    "FUNC_KIND": "'.entry' or '.func'", "ENDM_KW": "'.endm'", "ENDFOR_KW": "'.endfor'",
    "ENDIF_KW": "'.endif'", "ENDSCHEDULE_KW": "'.endschedule'", "ELSE_KW": "'.else'",
    "ELIF_KW": "'.elif'", "IN_KW": "'in'", "CONST_ASSIGN": "'=' or '?='", "MACRO_CALL": "a macro call",
    "PERF_KW": "a performance directive", "INIT_RAW": "'= initialiser'", "SECTION_BODY": "'{...}'",
    "VBAR": "'|'", "PLUS": "'+'", "MINUS": "'-'", "BANG": "'!'", "COLON": "':'", "NAME_RANGE": "NAME<lo-hi>",
    "TYPE_WORD": "a type such as .f32", "$END": "end of input",
}

_CLOSER_TERMINAL = {"MACRO_KW": "ENDM_KW", "FOR_KW": "ENDFOR_KW", "IF_KW": "ENDIF_KW",
                    "SCHEDULE_KW": "ENDSCHEDULE_KW", "LBRACE": "RBRACE", "LPAR": "RPAR", "LSQB": "RSQB"}

_OPENER_OF = {closer: opener for opener, closer in _CLOSER_TERMINAL.items()}

# Block openers, and the closer each one needs; used to explain an unexpected end of file.
_OPENERS = {"MACRO_KW": ".endm", "FOR_KW": ".endfor", "IF_KW": ".endif", "SCHEDULE_KW": ".endschedule",
            "LBRACE": "}", "LPAR": ")", "LSQB": "]"}


def _word(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    if name.endswith("_KW"):
        return "'." + {"ADDRSIZE": "address_size"}.get(name[:-3], name[:-3].lower()) + "'"
    return name.lower().replace("_", " ")


def _describe(names) -> str:
    words = sorted({_word(n) for n in names})
    if not words:
        return ""
    if len(words) > 8:
        words = words[:8] + ["..."]
    return "; expected " + (words[0] if len(words) == 1 else "one of " + ", ".join(words))


@functools.lru_cache(maxsize=None)
def _grammar_text(name: str) -> str:
    return resources.files("asmgemm.grammar").joinpath(name).read_text(encoding="utf-8")


@functools.lru_cache(maxsize=None)
def statement_parser() -> Lark:
    # (the tables are kept between processes: analysing the grammar took half a second a start)
    return cached_lark("sasm.lark", _grammar_text("sasm.lark"), parser="lalr", lexer="contextual",
                       propagate_positions=True, maybe_placeholders=True)


@functools.lru_cache(maxsize=None)
def expression_parser() -> Lark:
    return cached_lark("expr.lark", _grammar_text("expr.lark"), parser="lalr", lexer="contextual",
                       start=["expr", "brace_items", "regs_spec"], propagate_positions=True,
                       maybe_placeholders=True)


def parse_expression(text: str, source: SourceFile, offset: int, start: str = "expr"):
    """Parse `text`, found at `offset` in `source`, with the expression grammar."""
    if len(text) > MAX_LINE_CHARS:
        raise AsmError(f"expression is {len(text):,} characters long (limit {MAX_LINE_CHARS:,} characters)",
                       Span(source, offset, offset + 1))
    try:
        tree = expression_parser().parse(text, start=start)
    except UnexpectedInput as exc:
        err = syntax_error(exc, source, offset, text)
        if "//" in text:
            err.hint = ("in directive lines and inside { }, '//' is floor division: end the line with ';' "
                        "before a // comment, or use /* */")
        raise err from None
    builder = AstBuilder(source, offset)
    try:
        return builder.expr(tree)
    except RecursionError:
        raise builder.too_deep(Span(source, offset, offset + len(text))) from None


def syntax_error(exc: UnexpectedInput, source: SourceFile, offset: int, text: str) -> AsmError:
    pos = getattr(exc, "pos_in_stream", None)
    if isinstance(exc, UnexpectedToken) and exc.token.type == "$END" or isinstance(exc, UnexpectedEOF):
        pos = len(text)
        opener = _open_block(exc)
        span = Span(source, offset + max(0, len(text.rstrip()) - 1), offset + max(1, len(text.rstrip())))
        if opener is not None:
            closer = _OPENERS[opener.type]
            what = opener.value.strip() or opener.type
            where = "expression" if text is not source.text else "file"
            return AsmError(f"unexpected end of {where}: '{what}' is never closed (missing '{closer}')",
                            Span(source, offset + opener.start_pos, offset + opener.end_pos),
                            notes=[Note(f"the {where} ends here", span)])
        expected = getattr(exc, "expected", None) or getattr(exc, "accepts", None) or []
        return AsmError("unexpected end of input" + _describe(expected), span)
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        start = offset + (tok.start_pos or 0)
        end = offset + (tok.end_pos or start + 1)
        shown = str(tok.value).splitlines()[0] if str(tok.value) else tok.type
        if tok.type in ("LINE_RAW", "LINE_EXPR", "INIT_RAW"):  # fallback tokens that swallow a whole line
            shown = shown.strip()[:1] or shown
            end = start + 1
        if len(shown) > 40:
            shown = shown[:37] + "..."
        expected = exc.accepts or exc.expected or set()
        opener = _open_block(exc)
        if opener is not None and _CLOSER_TERMINAL.get(opener.type) in expected:
            what = opener.value.strip()
            return AsmError(f"unexpected '{shown}': '{what}' is still open (missing '{_OPENERS[opener.type]}')",
                            Span(source, start, end),
                            notes=[Note(f"'{what}' opened here",
                                        Span(source, offset + opener.start_pos, offset + opener.end_pos))])
        return AsmError(f"unexpected '{shown}'" + _describe(expected), Span(source, start, end))
    if isinstance(exc, UnexpectedCharacters):
        start = offset + (pos or 0)
        ch = text[pos] if pos is not None and pos < len(text) else "?"
        return AsmError(f"unexpected character {ch!r}" + _describe(exc.allowed or []), Span(source, start, start + 1))
    start = offset + (pos or 0)
    return AsmError(f"syntax error: {exc}", Span(source, start, start + 1))


def _open_block(exc) -> Token | None:
    state = getattr(exc, "state", None)
    stack = getattr(state, "value_stack", None) or []
    # A block the parser has not reduced yet may already be closed (`.if X ... .endif` waiting for
    # its lookahead): an opener whose closer lies above it on the stack is not the open one.
    closed: dict[str, int] = {}
    for item in reversed(stack):
        if not isinstance(item, Token):
            continue
        kind = "LPAR" if item.type == "MACRO_CALL" else item.type
        if item.type in _OPENER_OF:
            closed[_OPENER_OF[item.type]] = closed.get(_OPENER_OF[item.type], 0) + 1
        elif kind in _OPENERS:
            if closed.get(kind):
                closed[kind] -= 1
                continue
            if kind != item.type:
                return Token("LPAR", item.value, item.start_pos, end_pos=item.end_pos)
            return item
    return None


class AstBuilder:
    """Turns Lark trees into ast.* nodes. `offset` shifts positions of sub-parsed text."""

    def __init__(self, source: SourceFile, offset: int = 0):
        self.source = source
        self.offset = offset
        self.depth = 0
        self.expr_depth = 0
        self.current = None        # the statement being built: where a RecursionError is reported

    def too_deep(self, fallback: Span | None = None) -> AsmError:
        """The safety net under the limits: Python's recursion limit hit while building."""
        span = self.span(self.current) if self.current is not None else fallback
        return AsmError(f"this is nested too deeply for asmgemm (limits: blocks {MAX_NESTING} deep, "
                        f"expressions {MAX_EXPR_DEPTH} levels, brackets {MAX_BRACKET_DEPTH} deep)", span)

    def _deeper(self, t):
        self.expr_depth += 1
        if self.expr_depth > MAX_EXPR_DEPTH:
            raise AsmError(f"expression nested more than {MAX_EXPR_DEPTH} levels deep: operators and "
                           f"parentheses (limit {MAX_EXPR_DEPTH})", self.span(t))

    # ---- positions ---------------------------------------------------------------------------
    def span(self, node) -> Span:
        if isinstance(node, Token):
            return Span(self.source, self.offset + node.start_pos, self.offset + node.end_pos)
        meta = node.meta
        if getattr(meta, "empty", True):
            return Span(self.source, self.offset, self.offset)
        return Span(self.source, self.offset + meta.start_pos, self.offset + meta.end_pos)

    def small_int(self, tok: Token) -> int:
        """A NUMBER token that must be a plain non-negative integer (.address_size, %r<N>)."""
        v = parse_number(str(tok), self.span(tok))
        if not isinstance(v, int) or v < 0 or v >= 1 << 31:
            raise AsmError(f"expected a non-negative integer below 2**31 here, got {str(tok)}", self.span(tok))
        return v

    def tok_span(self, tok: Token, skip: int = 0, trim: int = 0) -> Span:
        return Span(self.source, self.offset + tok.start_pos + skip, self.offset + tok.end_pos - trim)

    # ---- statements --------------------------------------------------------------------------
    def stmts(self, children) -> list:
        self.depth += 1
        if self.depth > MAX_NESTING:
            first = next((c for c in children if c is not None), None)
            raise AsmError(f"blocks nested more than {MAX_NESTING} deep (limit {MAX_NESTING})",
                           self.span(first) if first is not None else None)
        out = []
        for c in children:          # a plain loop: a comprehension would add a frame per block level
            if c is not None:
                out.append(self.stmt(c))
        self.depth -= 1
        return out

    def stmt(self, t):
        self.current = t
        if isinstance(t, Token):
            raise AsmError(f"unexpected '{t.value}'", self.span(t))
        return getattr(self, "s_" + t.data)(t)

    def s_version(self, t):
        return ast.Version(str(t.children[1]), self.span(t))

    def s_target(self, t):
        return ast.Target([str(c) for c in t.children[1:]], self.span(t))

    def s_address_size(self, t):
        return ast.AddressSize(self.small_int(t.children[1]), self.span(t))

    def s_file_dir(self, t):
        return ast.RawDirective(".file", str(t.children[1]).strip(), self.span(t))

    def s_loc_dir(self, t):
        return ast.RawDirective(".loc", str(t.children[1]).strip(), self.span(t))

    def s_section(self, t):
        return ast.RawDirective(".section", f"{t.children[1]} {t.children[2]}", self.span(t))

    def s_pragma(self, t):
        return ast.RawDirective(".pragma", ", ".join(str(c) for c in t.children[1:]) + ";", self.span(t))

    def s_callprototype(self, t):
        name, _, rest = t.children
        return ast.RawDirective(".callprototype", f"{name} : .callprototype {' '.join(rest.split())};",
                                self.span(t))

    def qualifier(self, t) -> ast.Qualifier:
        word = t.children[0]
        arg = t.children[1] if len(t.children) > 1 else None
        return ast.Qualifier(str(word), self.operand(arg) if arg is not None else None, self.span(t))

    def param(self, t) -> ast.Param:
        quals = [self.qualifier(c) for c in t.children if isinstance(c, Tree) and c.data == "qualifier"]
        name_tok = next(c for c in t.children if isinstance(c, Token))
        dims = [self.dims(c) for c in t.children if isinstance(c, Tree) and c.data == "dims"]
        return ast.Param(quals, self.name(name_tok), dims, self.span(t))

    def dims(self, t):
        return self.operand(t.children[0]) if t.children and t.children[0] is not None else None

    def s_function(self, t):
        quals, ret, params, perf, body = [], [], None, [], None
        kind = name = None
        for c in t.children:
            if c is None:
                continue
            if isinstance(c, Token):
                if c.type == "FUNC_KIND":
                    kind = c.value[1:]
                elif c.type == "NAME":
                    name = self.name(c)
                continue
            if c.data == "qualifier":
                quals.append(self.qualifier(c))
            elif c.data == "ret_params":
                ret = [self.param(p) for p in c.children if p is not None]
            elif c.data == "param_list":
                params = [self.param(p) for p in c.children if p is not None]
            elif c.data in ("perf_dir", "perf_flag"):
                values = [self.operand(v) for v in c.children[1:] if v is not None]
                perf.append(ast.PerfDirective(str(c.children[0]), values, self.span(c)))
            elif c.data == "body":
                body = self.stmts(c.children)
        return ast.Function(quals, kind, ret, name, params, perf, body, self.span(t))

    def s_decl(self, t):
        quals, decls = [], []
        for c in t.children:
            if isinstance(c, Token):  # CONST_KW used as the state space
                quals.append(ast.Qualifier(".const", None, self.span(c)))
            elif c.data == "qualifier":
                quals.append(self.qualifier(c))
            else:
                decls.append(self.declarator(c))
        return ast.Decl(quals, decls, self.span(t))

    def declarator(self, t) -> ast.Declarator:
        name = count = init = None
        dims = []
        for c in t.children:
            if c is None:
                continue
            if isinstance(c, Token):
                if c.type == "REG":
                    name = ast.RegRef(self.name(c), self.span(c))
                elif c.type == "NAME":
                    name = self.name(c)
                elif c.type == "INIT_RAW":
                    init = "= " + c.value[1:].strip()
            elif c.data == "reg_count":
                count = self.small_int(c.children[0])
            elif c.data == "dims":
                dims.append(self.dims(c))
        return ast.Declarator(name, count, dims, init, self.span(t))

    def s_label(self, t):
        tok = t.children[0]
        return ast.Label(self.name(tok, trim=1), self.span(t))

    def s_instruction(self, t, pinned=False):
        guard = None
        kids = list(t.children)
        if isinstance(kids[0], Token) and kids[0].type == "GUARD":
            g = kids.pop(0)
            neg = g.value.startswith("@!")
            skip = 2 if neg else 1
            inner = self.name(g, skip=skip)
            reg = ast.RegRef(inner, self.tok_span(g, skip)) if g.value[skip:].startswith("%") else inner
            guard = ast.Guard(neg, reg, self.span(g))
        elif kids[0] is None:
            kids.pop(0)
        opcode = self.name(kids.pop(0))
        operands = [self.operand(c) for c in kids if c is not None]
        return ast.Instr(guard, opcode, operands, pinned, self.span(t))

    def s_pinned(self, t):
        return self.s_instruction(t.children[1], pinned=True)

    def s_scope(self, t):
        return ast.Scope(self.stmts(t.children), self.span(t))

    def s_const_def(self, t):
        _, name, assign, expr_tok = t.children[:4]
        value = self.line_expr(expr_tok)
        return ast.ConstDef(str(name), assign.value == "?=", value, self.span(t))

    def s_macro_def(self, t):
        head = t.children[1]
        htok = head.children[0]
        name = htok.value.rstrip("(")
        params, body = [], []
        rest = t.children[2:]
        for c in rest:
            if c is None:
                continue
            if isinstance(c, Token):
                if c.type == "NAME":
                    params.append(c.value)
            else:
                body.append(c)
        for dup in {p for p in params if params.count(p) > 1}:
            raise AsmError(f"macro '{name}' has two parameters named '{dup}'", self.span(head))
        return ast.MacroDef(name, params, self.stmts(body), self.span(t))

    def s_macro_call(self, t):
        tok = t.children[0]
        args = [self.operand(c) for c in t.children[1:] if c is not None]
        return ast.MacroCall(tok.value[:-1], args, self.span(t))

    def s_for_block(self, t):
        var = str(t.children[1])
        rng_tok = t.children[3]
        rng = self.line_expr(rng_tok)
        if not (isinstance(rng, ast.Call) and rng.func == "range"):
            raise AsmError("'.for' wants 'NAME in range(start, stop[, step])'", rng.span)
        body = [c for c in t.children[4:] if isinstance(c, Tree)]
        return ast.For(var, rng.args, self.stmts(body), self.span(t))

    def s_if_block(self, t):
        kids = [c for c in t.children if c is not None]
        cond = self.line_expr(kids[1])
        body, branches, orelse = [], [], None
        for c in kids[2:]:
            if isinstance(c, Token):
                continue
            if c.data == "elif_clause":
                continue
            if c.data == "else_clause":
                continue
            body.append(c)
        branches.append((cond, self.stmts(body)))
        for c in kids[2:]:
            if isinstance(c, Tree) and c.data == "elif_clause":
                ck = [x for x in c.children if x is not None]
                branches.append((self.line_expr(ck[1]), self.stmts([x for x in ck[2:] if isinstance(x, Tree)])))
            elif isinstance(c, Tree) and c.data == "else_clause":
                orelse = self.stmts([x for x in c.children if isinstance(x, Tree)])
        return ast.If(branches, orelse, self.span(t))

    def s_include(self, t):
        tok = t.children[1]
        return ast.Include(_unquote(tok.value), self.span(t))

    def s_schedule_block(self, t):
        body = [c for c in t.children if isinstance(c, Tree)]
        return ast.Schedule(self.stmts(body), self.span(t))

    def s_control_dir(self, t):
        kw, rest = t.children[0], t.children[1]
        line = self.span(kw).line
        if self.span(rest).line != line:       # LINE_RAW skipped the blanks to the next line
            raise AsmError("'.control' needs an opcode pattern and at least one field on its line, such as "
                           "'.control FFMA stall=2'", self.span(kw))
        control = read_control_line(rest.value, self.offset + rest.start_pos, self.span(t))
        control.exprs = {key: parse_expression(text, self.source, where.start)
                         for key, (text, where) in control.exprs.items()}
        return control

    def s_regs_decl(self, t):
        kw, raw = t.children[0], t.children[1]
        spec = self.sub_parse(raw, "regs_spec")
        return ast.RegsDecl(kw.value[1:], spec["types"], spec["items"], spec["attrs"], self.span(t))

    def s_tune_decl(self, t):
        name, expr_tok = t.children[1], t.children[3]
        choices = self.line_expr(expr_tok)
        if not (isinstance(choices, ast.Call) and choices.func in ("choices", "range")):
            raise AsmError("'.tune' wants 'NAME in choices(a, b, ...)' or 'NAME in range(...)'", choices.span)
        return ast.Tune(str(name), choices, self.span(t))

    def s_error_dir(self, t):
        return ast.ErrorDirective(_unquote(t.children[1].value), self.span(t))

    def s_ptxas_alternative(self, t):
        return ast.PtxasAlternative(_unquote(t.children[1].value), self.span(t))

    # ---- sub-parses ----------------------------------------------------------------------------
    def line_expr(self, tok: Token):
        return self.sub_parse(tok, "expr")

    def sub_parse(self, tok: Token, start: str):
        text = tok.value
        lead = len(text) - len(text.lstrip())
        body = text.strip()
        if not body:
            raise AsmError("expected an expression here", self.tok_span(tok))
        base = self.offset + tok.start_pos + lead
        try:
            tree = expression_parser().parse(body, start=start)
        except UnexpectedInput as exc:
            err = syntax_error(exc, self.source, base, body)
            if "//" in body:
                err.hint = ("in directive lines and inside { }, '//' is floor division: end the line with ';' "
                            "before a // comment, or use /* */")
            raise err from None
        sub = AstBuilder(self.source, base)
        if start == "regs_spec":
            return sub.regs_spec(tree)
        if start == "brace_items":
            return [sub.expr(c) for c in tree.children]
        return sub.expr(tree)

    def regs_spec(self, t):
        types, items, attrs = [], [], []
        for c in t.children:
            if isinstance(c, Token):
                types.append(c.value)
            elif c.data == "reg_item":
                items.append(self.reg_item(c.children[0]))
            elif c.data == "reg_attr":
                name = str(c.children[0])
                args = [self.expr(a) for a in c.children[1:] if a is not None]
                attrs.append(ast.RegAttr(name, args, self.span(c)))
        return {"types": types, "items": items, "attrs": attrs}

    def reg_item(self, tok: Token) -> ast.RegItem:
        if tok.type == "NAME_RANGE":
            r = self.name_range(tok)
            return ast.RegItem(r.base, r.lo, r.hi, r.span)
        return ast.RegItem(tok.value, None, None, self.span(tok))

    def name_range(self, tok: Token) -> ast.NameRange:
        text = tok.value
        lt = text.index("<")
        inner = text[lt + 1:-1]
        dash = _top_level_dash(inner)
        lo_txt, hi_txt = inner[:dash], inner[dash + 1:]
        base = self.offset + tok.start_pos
        lo = self._bound(lo_txt, base + lt + 1)
        hi = self._bound(hi_txt, base + lt + 2 + dash)
        return ast.NameRange(text[:lt], lo, hi, self.span(tok))

    def _bound(self, txt: str, pos: int):
        if txt.startswith("{"):
            return parse_expression(txt[1:-1], self.source, pos + 1)
        return ast.Num(txt, Span(self.source, pos, pos + len(txt)))

    # ---- expressions -------------------------------------------------------------------------
    def name(self, tok: Token, skip: int = 0, trim: int = 0) -> ast.Name:
        """An identifier token, split into literal text and {expr} interpolations."""
        text = tok.value[skip:len(tok.value) - trim]
        base = self.offset + tok.start_pos + skip
        parts: list = []
        i = 0
        while i < len(text):
            j = text.find("{", i)
            if j < 0:
                parts.append(text[i:])
                break
            if j > i:
                parts.append(text[i:j])
            k = text.index("}", j)
            parts.append(parse_expression(text[j + 1:k], self.source, base + j + 1))
            i = k + 1
        if not parts:
            parts = [""]
        return ast.Name(parts, Span(self.source, base, base + len(text)))

    def operand(self, t):
        """Operand trees of sasm.lark (a subset of the expression language)."""
        # Depth is counted here, in the recursive function itself (no wrapper frame), so that the
        # limit fires well before Python's recursion limit.
        self._deeper(t)
        try:
            if isinstance(t, Token):
                if t.type == "NUMBER":
                    return ast.Num(t.value, self.span(t))
                if t.type in ("NAME", "VEC_ELEM"):
                    return self.name(t)
                if t.type == "REG":
                    return ast.RegRef(self.name(t), self.span(t))
                if t.type == "BRACE_RAW":
                    return self.brace(t)
                if t.type == "STRING":
                    return ast.Str(t.value, self.span(t))
                raise AsmError(f"unexpected '{t.value}'", self.span(t))
            d = t.data
            sp = self.span(t)
            if d == "reg":
                return ast.RegRef(self.name(t.children[0]), sp)
            if d == "name":
                return self.name(t.children[0])
            if d == "number":
                return ast.Num(t.children[0].value, sp)
            if d == "brace":
                return self.brace(t.children[0])
            if d == "string":
                return ast.Str(t.children[0].value, sp)
            if d == "paren":
                return ast.Paren([self.operand(c) for c in t.children if c is not None], sp)
            if d == "pair":
                return ast.Pair(self.operand(t.children[0]), self.operand(t.children[1]), sp)
            if d in ("add", "sub", "mul"):
                op = {"add": "+", "sub": "-", "mul": "*"}[d]
                return ast.BinOp(op, self.operand(t.children[0]), self.operand(t.children[1]), sp)
            if d == "neg":
                return ast.UnOp("-", self.operand(t.children[0]), sp)
            if d == "lnot":
                return ast.UnOp("!", self.operand(t.children[0]), sp)
            if d == "memref":
                return ast.MemRef([self.operand(c) for c in t.children], sp)
            raise AsmError(f"unsupported operand form '{d}'", sp)
        finally:
            self.expr_depth -= 1

    def brace(self, tok: Token) -> ast.Brace:
        inner = tok.value[1:-1]
        if not inner.strip():
            return ast.Brace([], self.span(tok))
        lead = len(inner) - len(inner.lstrip())
        base = self.offset + tok.start_pos + 1 + lead
        try:
            tree = expression_parser().parse(inner.strip(), start="brace_items")
        except UnexpectedInput as exc:
            err = syntax_error(exc, self.source, base, inner.strip())
            if "//" in inner:
                err.hint = "inside { }, '//' is floor division"
            raise err from None
        sub = AstBuilder(self.source, base)
        return ast.Brace([sub.expr(c) for c in tree.children], self.span(tok))

    def expr(self, t):
        """Trees of expr.lark."""
        # Depth is counted here, in the recursive function itself (no wrapper frame), so that the
        # limit fires well before Python's recursion limit.
        self._deeper(t)
        try:
            if isinstance(t, Token):
                if t.type == "NAME_RANGE":
                    return self.name_range(t)
                return self.operand(t)
            d = t.data
            sp = self.span(t)
            c = t.children
            if d == "number":
                return ast.Num(c[0].value, sp)
            if d == "name":
                return ast.Name([c[0].value], sp)
            if d == "reg":
                return ast.RegRef(ast.Name([c[0].value], sp), sp)
            if d == "string":
                return ast.Str(c[0].value, sp)
            if d == "group":
                return self.expr(c[0])
            if d == "item":
                return self.expr(c[0])
            if d == "call":
                return ast.Call(c[0].value, [self.expr(a) for a in c[1:] if a is not None], sp)
            if d == "binop":
                return ast.BinOp(c[1].value, self.expr(c[0]), self.expr(c[2]), sp)
            if d == "pow":
                return ast.BinOp("**", self.expr(c[0]), self.expr(c[2]), sp)
            if d in ("bitor", "bitxor", "bitand", "or_", "and_"):
                op = {"bitor": "|", "bitxor": "^", "bitand": "&", "or_": "or", "and_": "and"}[d]
                return ast.BinOp(op, self.expr(c[0]), self.expr(c[1]), sp)
            if d == "unary":
                return ast.UnOp(c[0].value, self.expr(c[1]), sp)
            if d == "not_":
                return ast.UnOp("not", self.expr(c[0]), sp)
            if d == "lnot":
                return ast.UnOp("!", self.expr(c[0]), sp)
            if d == "compare":
                first = self.expr(c[0])
                rest = [(c[i].value, self.expr(c[i + 1])) for i in range(1, len(c), 2)]
                return ast.Compare(first, rest, sp)
            if d == "cond":
                return ast.Cond(self.expr(c[1]), self.expr(c[0]), self.expr(c[2]), sp)
            raise AsmError(f"unsupported expression form '{d}'", sp)
        finally:
            self.expr_depth -= 1


def _top_level_dash(inner: str) -> int:
    depth = 0
    for i, ch in enumerate(inner):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "-" and depth == 0 and i > 0:
            return i
    raise ValueError(inner)


def _unquote(s: str) -> str:
    return s[1:-1].replace('\\"', '"').replace("\\\\", "\\")
