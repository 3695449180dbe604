"""`time_pair` (asmgemm run's timer, also used by tools/sgemm_bench.py) against a fake CUDA clock:
batch sizing, interleaving, and the pre-roll call that keeps the GPU busy before each start event."""
import types

import pytest

from asmgemm.commands.run import time_pair


class FakeClock:
    """Each call of a timed function costs `ms` of device time; events read the clock."""

    def __init__(self):
        self.now = 0.0
        self.calls: list[str] = []

    def cupy(self):
        clock = self

        class Event:
            def record(self):
                self.t = clock.now

            def synchronize(self):
                pass

        cuda = types.SimpleNamespace(
            Event=Event, get_elapsed_time=lambda a, b: b.t - a.t,
            Device=lambda: types.SimpleNamespace(synchronize=lambda: None))
        return types.SimpleNamespace(cuda=cuda)

    def fn(self, name, ms):
        def call():
            self.calls.append(name)
            self.now += ms
        return call


@pytest.mark.parametrize("pre_roll", [False, True])
def test_batches_interleave_and_time_only_the_batch(pre_roll):
    clock = FakeClock()
    fns = {"a": clock.fn("a", 0.5), "b": clock.fn("b", 2.0)}
    res = time_pair(clock.cupy(), fns, reps=4, warmup=2, min_batch_ms=4.0, pre_roll=pre_roll)
    assert res["a"]["median_ms"] == pytest.approx(0.5) and res["b"]["median_ms"] == pytest.approx(2.0)
    assert res["a"]["calls_per_sample"] == 8 and res["b"]["calls_per_sample"] == 2
    assert res["a"]["reps"] == res["b"]["reps"] == 4
    extra = 1 if pre_roll else 0
    # warm-up (interleaved), one sizing sample each, then 4 interleaved repetitions
    expected = ["a", "b"] * 2 + ["a"] * (1 + extra) + ["b"] * (1 + extra) + \
        (["a"] * (8 + extra) + ["b"] * (2 + extra)) * 4
    assert clock.calls == expected


def test_batch_is_capped():
    clock = FakeClock()
    res = time_pair(clock.cupy(), {"tiny": clock.fn("tiny", 0.001)}, reps=2, warmup=1, min_batch_ms=20.0,
                    max_batch=200)
    assert res["tiny"]["calls_per_sample"] == 200
