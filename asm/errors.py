"""User-facing errors. Every problem the user can fix is an `AsmError`; the CLI prints it as

    FILE:LINE:COL: error: message
        the source line
        ^~~~

and exits non-zero. Anything else reaching the CLI is a bug in asmgemm, reported as such.
"""
from __future__ import annotations

from dataclasses import dataclass

from .source import Span


@dataclass
class Note:
    message: str
    span: Span | None = None


class AsmError(Exception):
    """An error in the user's input (source, command line, or what ptxas said about it)."""

    def __init__(self, message: str, span: Span | None = None, notes: list[Note] | None = None,
                 hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.span = span
        self.notes = list(notes or [])
        self.hint = hint

    def format(self) -> str:
        out = [_format_one("error", self.message, self.span)]
        for note in self.notes:
            out.append(_format_one("note", note.message, note.span))
        if self.hint:
            out.append(f"hint: {self.hint}")
        return "\n".join(out)

    def __str__(self) -> str:
        return self.format()


class ToolchainError(AsmError):
    """ptxas/nvdisasm missing or failing in a way that is not the user's source."""


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
    return f"{span.path}:{line}:{col}: {kind}: {message}\n    {src_line}\n    {caret}"
