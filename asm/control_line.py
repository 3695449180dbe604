"""The rest of a `.control` line (grammar/sasm.lark `control_dir`), read into an ast.Control.

    .control FFMA stall=6 yield=off          // an opcode as nvdisasm prints it, matched exactly
    .control "LDS\\..*" wait=[0] reuse=[]    // a regular expression in a string, matched in full
    .control IMAD.WIDE.U32 write_barrier=none read_barrier=2

Fields and values are those of the rules file of `asmgemm patch` (sass/patch_rules.py), written
the .sasm way: stall=0-15, yield=on|off, write_barrier=0-5|none, read_barrier=0-5|none,
wait=[scoreboards], reuse=[slots A-D]. The line is read here rather than by the grammar because a
pattern in a string may hold '//', '/*' or ';', which the grammar's lexer would take for a comment
or the end of the statement. Every error points at the word it is about. A literal value is
checked here against the field layout of isa/control_bits.py; a one-word field may instead be
`{expr}` (stall={S}), which the parser parses and the expander evaluates with asmgemm's own
evaluator and checks with `field_value`, at the expression.
"""
from __future__ import annotations

import re

from . import ast
from .errors import AsmError
from .isa import control_bits as cb
from .source import Span

FIELDS = ("stall", "yield", "write_barrier", "read_barrier", "wait", "reuse")
# The raw-field name each key sets (patch_rules.Rule.fields, elf.ElfCubin.set_control).
SCALAR_FIELDS = ("stall", "yield", "write_barrier", "read_barrier")     # one word each: `{expr}` allowed
RAW_FIELD = {"stall": "stall", "yield": "yield", "write_barrier": "write_barrier",
             "read_barrier": "read_barrier", "wait": "wait_mask", "reuse": "reuse"}

_BLANK = re.compile(r"[ \t]*")
_STRING = re.compile(r'"(?:\\.|[^"\\\n])*"')
# An opcode with its modifiers as nvdisasm prints them: FFMA, LDS.U.128, IMAD.WIDE.U32, HMMA.16816.F32
_OPCODE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*")
_KEY = re.compile(r"([A-Za-z_][\w]*)[ \t]*(=)?[ \t]*")
_WORD = re.compile(r"[A-Za-z0-9_]+")
_LIST = re.compile(r"\[([^\]\n]*)\]")
_BRACE = re.compile(r"\{((?:[^{}\n]|\{[^{}\n]*\})*)\}")     # {expr}, one level of { } inside (as BRACE_RAW)
_END = re.compile(r"[ \t]*(?:;[ \t]*)?(?://[^\n]*)?$")


def read_control_line(text: str, start: int, directive: Span) -> ast.Control:
    """`text` is the source's text after `.control` (from offset `start` of directive.source up to
    the line's end); `directive` spans the keyword and the line."""
    source = directive.source

    def span(a: int, b: int) -> Span:
        return Span(source, start + a, start + max(b, a + 1))

    pos = _BLANK.match(text).end()
    if pos >= len(text) or text.startswith("//", pos) or text[pos] == ";":
        raise AsmError("'.control' needs an opcode pattern and at least one field on its line, such as "
                       "'.control FFMA stall=2'", directive)
    if text.startswith("/*", pos):
        raise AsmError("a block comment cannot stand before the opcode pattern of '.control'", span(pos, pos + 2))
    m = _STRING.match(text, pos) if text[pos] == '"' else _OPCODE.match(text, pos)
    if m is None:
        what = "an unterminated string" if text[pos] == '"' else f"'{text[pos]}'"
        raise AsmError(f"expected an opcode (FFMA, LDS.U.128) or a regular expression in quotes after "
                       f"'.control', not {what}", span(pos, pos + 1))
    written = m.group()
    pattern_span = span(m.start(), m.end())
    if written.startswith('"'):
        pattern = written[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        if not pattern:
            raise AsmError("the opcode pattern is empty", pattern_span)
        try:
            re.compile(pattern)
        except re.error as exc:
            raise AsmError(f"the opcode pattern is not a regular expression: {exc}", pattern_span) from None
    else:
        pattern = re.escape(written)       # a bare opcode is matched as written, its dots included
    pos = m.end()
    fields: dict[str, int] = {}
    exprs: dict[str, tuple[str, Span]] = {}
    field_spans: dict[str, Span] = {}
    while True:
        blank = _BLANK.match(text, pos).end()
        end = _END.match(text, blank)
        if end is not None:
            break
        if text[blank] == ";":
            raise AsmError("nothing but a comment may follow the ';' of a '.control' line", span(blank, blank + 1))
        if blank == pos:
            raise AsmError("expected a blank before the next field", span(pos, pos + 1))
        pos = blank
        if text.startswith("/*", pos):
            raise AsmError("block comments are not read on a '.control' line: use '//'", span(pos, pos + 2))
        k = _KEY.match(text, pos)
        if k is None:
            raise AsmError(f"expected a field such as stall=2 (fields: {', '.join(FIELDS)})", span(pos, pos + 1))
        key = k.group(1)
        key_span = span(k.start(1), k.end(1))
        if key not in FIELDS:
            raise AsmError(f"unknown control field '{key}' (fields: {', '.join(FIELDS)})", key_span)
        if RAW_FIELD[key] in fields or RAW_FIELD[key] in exprs:
            raise AsmError(f"'{key}' is given twice on this line", key_span)
        if k.group(2) is None:
            raise AsmError(f"expected '=' and a value after '{key}'", span(k.end(1), k.end(1) + 1))
        pos = k.end()
        brace = _BRACE.match(text, pos)
        if brace is not None and key in SCALAR_FIELDS:
            # evaluated by the expander (.const, .for and macro parameters), checked then by field_value
            exprs[RAW_FIELD[key]] = (brace.group(1), span(brace.start(1), brace.end(1)))
            pos = brace.end()
        else:
            value, pos = _value(key, text, pos, span)
            fields[RAW_FIELD[key]] = value
        field_spans[key] = span(k.start(1), pos)
    if not fields and not exprs:
        raise AsmError(f"'.control' sets no field (fields: {', '.join(FIELDS)})", directive)
    # the directive without its trailing comment: what errors underline and the PTX comment shows
    written_span = Span(source, directive.start, start + pos)
    return ast.Control(pattern, written, fields, pattern_span, field_spans, written_span, exprs)


def field_value(key: str, word: str, where: Span) -> int:
    """The raw value of a one-word field (SCALAR_FIELDS) written, or computed, as `word`."""
    if key == "stall":
        if not (word.isdigit() and int(word) <= cb.STALL.mask):
            raise AsmError(f"stall wants a cycle count 0-{cb.STALL.mask}, not '{word}'", where)
        return int(word)
    if key == "yield":
        if word not in ("on", "off"):
            raise AsmError(f"yield wants on (the hint, `Y`) or off, not '{word}'", where)
        return 0 if word == "on" else 1       # the bit is inverted: 0 = hint on (control_bits.YIELD)
    if word == "none":
        return cb.NO_BARRIER
    if not (word.isdigit() and int(word) < cb.NUM_SCOREBOARDS):
        raise AsmError(f"{key} wants a scoreboard 0-{cb.NUM_SCOREBOARDS - 1} or none, not '{word}'", where)
    return int(word)


def _value(key: str, text: str, pos: int, span) -> tuple[int, int]:
    """The raw value of `key` written at `pos`, and where it ends."""
    if key in ("wait", "reuse"):
        m = _LIST.match(text, pos)
        allowed = (f"scoreboards 0-{cb.NUM_SCOREBOARDS - 1}" if key == "wait"
                   else f"source slots {', '.join(cb.REUSE_SLOTS)}")
        if m is None:
            raise AsmError(f"{key} wants a list in brackets of {allowed}: {key}=[...] ([] for none)",
                           span(pos, pos + 1))
        raw = 0
        at = m.start(1)
        for item in m.group(1).split(","):
            lead = len(item) - len(item.lstrip())
            word = item.strip()
            where = span(at + lead, at + lead + len(word))
            at += len(item) + 1
            if not word:
                if m.group(1).strip():
                    raise AsmError(f"an empty item in the {key} list", where)
                continue
            if key == "wait":
                if not (word.isdigit() and int(word) < cb.NUM_SCOREBOARDS):
                    raise AsmError(f"'{word}' is not a scoreboard: wait lists {allowed}", where)
                bit = 1 << int(word)
            else:
                if word not in cb.REUSE_SLOTS:
                    raise AsmError(f"'{word}' is not a source slot: reuse lists {allowed}", where)
                bit = 1 << cb.REUSE_SLOTS.index(word)
            if raw & bit:
                raise AsmError(f"'{word}' is listed twice", where)
            raw |= bit
        return raw, m.end()
    m = _WORD.match(text, pos)
    if m is None:
        raise AsmError(f"expected a value after '{key}='", span(pos, pos + 1))
    return field_value(key, m.group(), span(m.start(), m.end())), m.end()
