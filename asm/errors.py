"""User-facing errors. Every problem the user can fix is an `AsmError`; the CLI prints it as

    FILE:LINE:COL: error: message
        the source line
        ^~~~

and exits non-zero. Anything else reaching the CLI is a bug in asmgemm, reported as such.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from .source import Span

# A message never echoes a huge literal whole: a number longer than this is shown as its first
# 20 and last 5 digits and its length. A source line longer than SHOWN_LINE_CHARS is shown as a
# window around the caret.
LONG_LITERAL_DIGITS = 40
SHOWN_LINE_CHARS = 160
_LONG_NUMBER = re.compile(r"(?<![\w$])(?:(0[xX])([0-9A-Fa-f]{%(n)d,})|(0[bB])([01]{%(n)d,})|()(\d{%(n)d,}))"
                          % {"n": LONG_LITERAL_DIGITS + 1})


def shorten_number(text: str) -> str:
    """'12345678901234567890…12345 (5000 digits)' for a literal too long to print whole."""
    m = _LONG_NUMBER.fullmatch(text.rstrip("U"))
    if m is None:
        return text
    prefix, digits = next((m.group(i), m.group(i + 1)) for i in (1, 3, 5) if m.group(i + 1) is not None)
    return f"{prefix}{digits[:20]}…{digits[-5:]} ({len(digits)} digits)"


def shorten_literals(message: str) -> str:
    if len(message) <= LONG_LITERAL_DIGITS:
        return message
    return _LONG_NUMBER.sub(lambda m: shorten_number(m.group(0)), message)


@dataclass
class Note:
    message: str
    span: Span | None = None


class AsmError(Exception):
    """An error in the user's input (source, command line, or what ptxas said about it)."""

    def __init__(self, message: str, span: Span | None = None, notes: list[Note] | None = None,
                 hint: str | None = None):
        message = shorten_literals(message)
        super().__init__(message)
        self.message = message
        self.span = span
        self.notes = list(notes or [])
        self.hint = hint

    def format(self) -> str:
        out = [_format_one("error", self.message, self.span)]
        for note in self.notes:
            out.append(_format_one("note", shorten_literals(note.message), note.span))
        if self.hint:
            out.append(f"hint: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.format()


class ToolchainError(AsmError):
    """ptxas/nvdisasm missing or failing in a way that is not the user's source."""


def format_note(message: str, span: Span | None) -> str:
    """A note as the CLI prints one: `FILE:LINE:COL: note: message`, the source line, a caret."""
    return _format_one("note", shorten_literals(message), span)


def _format_one(kind: str, message: str, span: Span | None) -> str:
    if span is None:
        return f"asmgemm: {kind}: {message}"
    line, col = span.line, span.col
    src_line = span.source.line_text(line).rstrip("\r")
    end_line, end_col = span.source.line_col(max(span.start, span.end - 1))
    width = (end_col - col + 1) if end_line == line and span.end > span.start else 1
    width = max(1, min(width, max(1, len(src_line) - col + 1)))
    # Tabs keep their width under the caret so the caret lines up in any terminal.
    pad = "".join("\t" if c == "\t" else " " for c in src_line[: col - 1])
    caret = pad + "^" + "~" * (width - 1)
    if len(src_line) > SHOWN_LINE_CHARS:
        src_line, caret = _window(src_line, caret, col)
    return f"{span.path}:{line}:{col}: {kind}: {message}\n    {src_line}\n    {caret}"


def _window(src_line: str, caret: str, col: int) -> tuple[str, str]:
    """A long line cut to SHOWN_LINE_CHARS characters around the caret, '…' where it was cut."""
    start = max(0, min(col - 1 - SHOWN_LINE_CHARS // 4, len(src_line) - SHOWN_LINE_CHARS))
    end = start + SHOWN_LINE_CHARS
    shown = ("…" if start else "") + src_line[start:end] + ("…" if end < len(src_line) else "")
    mark = (" " if start else "") + caret[start:end]
    return shown, mark.rstrip() or mark
