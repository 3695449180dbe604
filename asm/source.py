"""Source files and positions: the one place that turns offsets into `file:line:col`.

Every later stage carries a `Span` so that an error anywhere in the pipeline (an undefined name in
a macro body, a bank constraint that cannot be met, ptxas rejecting the emitted PTX) can point at
the .sasm text the user wrote. Reading a file from disk is files.py's `read_source`.
"""
from __future__ import annotations

import bisect
import operator
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SourceFile:
    path: str
    text: str
    _line_starts: Sequence[int] = field(default=(), compare=False, repr=False)

    @staticmethod
    def from_text(path: str, text: str) -> "SourceFile":
        """A source from its text. Line endings are normalised first (CRLF and a lone CR become
        LF, a leading byte-order mark is dropped), so every offset, line and column refers to the
        text as an editor shows it."""
        text = normalise_text(text)
        # machine integers: a tuple of int objects was as large as a 20 MB source itself
        starts = array("q", [0])
        i = text.find("\n")
        while i >= 0:
            starts.append(i + 1)
            i = text.find("\n", i + 1)
        return SourceFile(path, text, starts)

    def line_col(self, offset: int) -> tuple[int, int]:
        """1-based line and column of a character offset."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self._line_starts, offset) - 1
        return line + 1, offset - self._line_starts[line] + 1

    def line_of(self, offset: int) -> int:
        """1-based line of a character offset: line_col's line, for a caller that asks it of
        every item of a large source."""
        return bisect.bisect_right(self._line_starts, max(0, min(offset, len(self.text))))

    def longest_line(self) -> int:
        """The length of its longest line, newline excluded (from the line starts, no scan)."""
        starts = self._line_starts
        last = len(self.text) - starts[-1] if starts else len(self.text)
        if len(starts) < 2:
            return last
        return max(max(map(operator.sub, starts[1:], starts)) - 1, last)

    def line_text(self, line: int) -> str:
        if line < 1 or line > len(self._line_starts):
            return ""
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start:] if end < 0 else self.text[start:end]


def normalise_text(text: str) -> str:
    """Drop a leading UTF-8 byte-order mark (U+FEFF) and turn CRLF and CR-only line endings into
    LF. A file saved with CR-only endings (classic Mac) would otherwise be one long line, and a
    `//` comment on its first line would swallow the whole file."""
    if text.startswith("\ufeff"):
        text = text[1:]
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


class Span:
    """A half-open character range [start, end) in one source file.

    A plain class with slots, compared and hashed by value as a frozen dataclass would be: every
    AST node and instruction carries one, and a 20 MB source makes millions; a dataclass's
    dictionary and frozen __init__ made them a third of a large build's memory and time. It keeps
    its length rather than its end: a length is almost always a small int, one object CPython
    shares, where an end is an int object of its own (a large build's instructions keep their
    spans to the end: 32 bytes each)."""

    __slots__ = ("source", "start", "length")

    def __init__(self, source: SourceFile, start: int, end: int):
        self.source = source
        self.start = start
        self.length = end - start

    @property
    def end(self) -> int:
        return self.start + self.length

    def __eq__(self, other) -> bool:
        if type(other) is not Span:
            return NotImplemented
        return self.start == other.start and self.length == other.length and self.source == other.source

    def __hash__(self) -> int:
        return hash((self.source, self.start, self.start + self.length))

    @property
    def line(self) -> int:
        return self.source.line_col(self.start)[0]

    @property
    def col(self) -> int:
        return self.source.line_col(self.start)[1]

    @property
    def path(self) -> str:
        return self.source.path

    def text(self) -> str:
        return self.source.text[self.start:self.start + self.length]

    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"

    def __repr__(self) -> str:  # keep AST dumps readable
        return f"<{self.location()}>"
