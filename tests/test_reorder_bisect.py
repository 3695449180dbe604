"""tools/reorder_bisect.py's CPU parts (issue 35): the bisect search over a fake is_bad, the
partners of a guilty move, and the comparison that tells whether a probe got the asked order. The
GPU run itself needs CuPy and an H100; the pass's partial application it drives (ReorderLimit) is
tested on ptxas's code in tests/test_sass_reorder_pass.py."""
from __future__ import annotations

import pytest

from asmgemm.isa import control_bits as cb
from conftest import load_tool


@pytest.fixture(scope="module")
def tool():
    return load_tool("reorder_bisect")


def _counting(predicate):
    seen = []

    def is_bad(n):
        seen.append(n)
        return predicate(n)
    return is_bad, seen


@pytest.mark.parametrize("first_bad", [1, 2, 7, 37, 63, 64])
def test_bisect_finds_the_smallest_bad_n_of_a_monotone_predicate(tool, first_bad):
    is_bad, seen = _counting(lambda n: n >= first_bad)
    out = tool.bisect_boundary(0, 64, is_bad)
    assert out.finished and out.bad == first_bad and out.good == first_bad - 1
    assert 0 not in seen and 64 not in seen          # the ends are known, never probed again
    assert len(seen) <= 6                            # log2(64)
    assert out.probes == [(n, n >= first_bad) for n in seen]


def test_bisect_of_a_non_monotone_predicate_ends_on_an_observed_boundary(tool):
    bad_set = {3, 4, 9, 10, 11, 12, 13, 14, 15, 16}
    is_bad, _seen = _counting(lambda n: n in bad_set or n == 16)
    out = tool.bisect_boundary(0, 16, is_bad)
    assert out.finished and out.bad - out.good == 1
    observed = dict(out.probes) | {0: False, 16: True}
    assert observed[out.good] is False and observed[out.bad] is True


def test_bisect_stops_cleanly_when_the_budget_runs_out(tool):
    calls = []

    def is_bad(n):
        if len(calls) == 2:
            raise tool.OutOfBudget("out of time")
        calls.append(n)
        return n >= 40
    out = tool.bisect_boundary(0, 100, is_bad)
    assert not out.finished and out.stopped == "out of time"
    assert out.good < 40 <= out.bad and len(out.probes) == 2


def test_bisect_refuses_an_empty_interval(tool):
    with pytest.raises(ValueError, match="must be below"):
        tool.bisect_boundary(5, 5, lambda n: True)


def test_jumped_over_names_the_ptxas_instructions_a_move_now_precedes(tool):
    # block 10..16; the new order hoists 14 to the front, then 11; 2 positions kept
    order = [14, 11, 10, 12, 13, 15]
    assert tool.jumped_over(10, 16, order, 1) == [10, 11, 12, 13]
    assert tool.jumped_over(10, 16, order, 2) == [10]     # 14 is already ahead of 11
    assert tool.jumped_over(10, 16, [10, 11, 12, 13, 14, 15], 3) == []


def test_order_applied_ignores_control_fields_but_not_instructions(tool):
    words = [0x1111 + i * 0x10000 for i in range(6)]
    with_codes = [cb.STALL.insert(cb.REUSE.insert(w, 1), 5) for w in words]
    assert tool.instruction_bits(with_codes[2]) == words[2]
    moved = [with_codes[k] for k in (0, 2, 1, 3, 4, 5)]
    assert tool.order_applied(words, moved, 0, 6, [0, 2, 1, 3, 4, 5])
    assert not tool.order_applied(words, moved, 0, 6, [0, 1, 2, 3, 4, 5])      # the check put it back


def test_the_tool_parses_its_arguments_without_a_gpu(tool, capsys):
    with pytest.raises(SystemExit) as exc:
        tool.main(["sgemm", "--shape", "not-a-shape"])
    assert exc.value.code == 2
    assert "not a shape" in capsys.readouterr().err
