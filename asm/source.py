"""Source files and positions: the one place that turns offsets into `file:line:col`.

Every later stage carries a `Span` so that an error anywhere in the pipeline (an undefined name in
a macro body, a bank constraint that cannot be met, ptxas rejecting the emitted PTX) can point at
the .sasm text the user wrote.
"""
from __future__ import annotations

import bisect
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


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
    dictionary and frozen __init__ made them a third of a large build's memory and time."""

    __slots__ = ("source", "start", "end")

    def __init__(self, source: SourceFile, start: int, end: int):
        self.source = source
        self.start = start
        self.end = end

    def __eq__(self, other) -> bool:
        if type(other) is not Span:
            return NotImplemented
        return self.start == other.start and self.end == other.end and self.source == other.source

    def __hash__(self) -> int:
        return hash((self.source, self.start, self.end))

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
        return self.source.text[self.start:self.end]

    def location(self) -> str:
        return f"{self.path}:{self.line}:{self.col}"

    def __repr__(self) -> str:  # keep AST dumps readable
        return f"<{self.location()}>"


def read_source(path: str | Path, *, shown_as: str | None = None) -> SourceFile:
    """Read a .sasm/.ptx file as UTF-8; undecodable bytes are a user error with a position."""
    from .errors import AsmError

    p = Path(path)
    name = shown_as or str(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise AsmError(f"no such file: {name}") from None
    except IsADirectoryError:
        raise AsmError(f"{name} is a directory, not a source file") from None
    except OSError as exc:
        raise AsmError(f"cannot read {name}: {exc.strerror}") from None
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        src = SourceFile.from_text(name, "\ufffd")
        raise AsmError("this file is UTF-16 (it starts with a UTF-16 byte-order mark); "
                       "source files must be UTF-8: save it as UTF-8", Span(src, 0, 1))
    if data.startswith(b"\xef\xbb\xbf"):   # a UTF-8 byte-order mark: not part of the text
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # Report the position of the bad byte in terms the editor shows: line and column.
        # The rest of the file is shown decoded with U+FFFD for bad bytes; the offset is taken
        # after line endings are normalised, as for any other error.
        at = len(normalise_text(data[: exc.start].decode("utf-8", errors="replace")))
        src = SourceFile.from_text(name, data.decode("utf-8", errors="replace"))
        raise AsmError(
            f"invalid UTF-8 byte 0x{data[exc.start]:02x} (source files must be UTF-8 text)",
            Span(src, at, at + 1),
        ) from None
    if "\x00" in text:
        src = SourceFile.from_text(name, text)
        i = src.text.index("\x00")
        raise AsmError("NUL byte in source: this looks like a binary file, not .sasm/.ptx text",
                       Span(src, i, i + 1))
    return SourceFile.from_text(name, text)
