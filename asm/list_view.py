"""A read-only sequence whose items are made when read (never all kept at once), and which compares
and prints as the list of them: what a large source's statements (parse_fast.Statements) and a
large kernel's bank conflicts (regalloc.BankConflicts) are, so that code and tests written for
lists keep working on them. Imports nothing of the project (a leaf of every stage)."""
from __future__ import annotations

from collections.abc import Sequence


class ListView(Sequence):
    """Subclasses give __len__ and __getitem__ (and __iter__ where it is cheaper than indexing)."""

    __slots__ = ()

    def __eq__(self, other):
        if isinstance(other, (list, ListView)):
            return list(self) == list(other)
        return NotImplemented

    def __ne__(self, other):
        same = self.__eq__(other)
        return same if same is NotImplemented else not same

    __hash__ = None

    def __repr__(self) -> str:
        return repr(list(self))
