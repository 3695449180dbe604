"""The bindings expansion evaluates names in: module constants, then macro parameters and `.for`
variables, each block one link further in."""
from __future__ import annotations

from ..source import Span


class Scope:
    """A chain of bindings: module constants <- macro parameters / loop variables <- ..."""

    def __init__(self, parent: "Scope | None" = None):
        self.parent = parent
        self.values: dict[str, object] = {}
        self.spans: dict[str, Span] = {}

    def find(self, name: str):
        s = self
        while s is not None:
            if name in s.values:
                return s.values[name]
            s = s.parent
        raise KeyError(name)

    def has(self, name: str) -> bool:
        try:
            self.find(name)
            return True
        except KeyError:
            return False
