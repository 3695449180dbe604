"""Long parametrised sweeps that keep a sample in the default test run.

`pytest -q` leaves out the tests marked `slow` (pyproject.toml: addopts) and `pytest -q -m slow` runs
only them. A sweep whose cases are each the only check of something goes through `sample_every`:
its first case and every `every`-th after it stay in the default run, the others are marked slow.
The sample is fixed (by position, not drawn at random), and the two runs together run every case
exactly once.
"""
from __future__ import annotations

import pytest

# the type of `pytest.param(...)`: a case that already carries its id and marks
_PARAM = type(pytest.param())


def sample_every(every: int, cases, *, unpack: bool = False) -> list:
    """`cases` as parametrize's argvalues (or a fixture's params), each a pytest.param: cases 0,
    every, 2*every, ... as they are, the rest marked slow. `unpack`: each case is a tuple of the
    test's several arguments (as for `@pytest.mark.parametrize("a, b", ...)`). Ids come from
    parametrize's `ids`, as before; a case given as a pytest.param keeps its own id and marks."""
    if every < 1:
        raise ValueError(f"sample_every: every={every}; 1 keeps the whole sweep in the default run")
    out = []
    for i, case in enumerate(cases):
        marks = () if i % every == 0 else (pytest.mark.slow,)
        if isinstance(case, _PARAM):
            out.append(pytest.param(*case.values, id=case.id, marks=(*case.marks, *marks)))
        else:
            out.append(pytest.param(*case if unpack else (case,), marks=marks))
    return out
