"""tests/sweeps.py: a sweep's default-run sample and its slow rest partition the cases."""
import pytest

from sweeps import sample_every


def test_every_nth_case_stays_in_the_default_run_and_the_rest_are_slow():
    params = sample_every(3, ["a", "b", "c", "d", "e"])
    assert [p.values for p in params] == [("a",), ("b",), ("c",), ("d",), ("e",)]
    assert [[m.name for m in p.marks] for p in params] == [[], ["slow"], ["slow"], [], ["slow"]]


def test_cases_of_several_arguments_are_unpacked_only_when_asked():
    assert [p.values for p in sample_every(2, [(1, 2), (3, 4)], unpack=True)] == [(1, 2), (3, 4)]
    assert [p.values for p in sample_every(2, [(1, 2), (3, 4)])] == [((1, 2),), ((3, 4),)]


def test_a_step_below_one_is_refused():
    with pytest.raises(ValueError, match="every=0"):
        sample_every(0, [1, 2])
