"""Timing statistics and interleaving, with a fake timer (no GPU)."""
import time

import pytest

from asmgemm.bench.timing import interleaved_order, pre_roll_us, summarize, tflops, time_interleaved


def test_summarize_median_min_max():
    s = summarize([3.0, 1.0, 2.0, 10.0, 2.5])
    assert (s.median_ms, s.min_ms, s.max_ms, s.reps) == (2.5, 1.0, 10.0, 5)
    assert s.spread == pytest.approx((10 - 1) / 2.5)


def test_summarize_rejects_empty_and_nonpositive():
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, 0.0])


def test_tflops():
    # 2*4096^3 flops in 2.75 ms = 49.98 TFLOP/s
    assert tflops(2 * 4096 ** 3, 2.75) == pytest.approx(49.98, rel=1e-3)
    with pytest.raises(ValueError):
        tflops(1, 0)


def test_interleaved_order_rotates():
    names = ["a", "b", "c"]
    firsts = [interleaved_order(names, r)[0] for r in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    for r in range(3):
        assert sorted(interleaved_order(names, r)) == names


class FakeTimer:
    """A clock that advances by the cost of whatever ran since the last mark."""

    def __init__(self):
        self.now = 0.0
        self.syncs = 0

    def mark(self):
        return self.now

    def elapsed_ms(self, a, b):
        return b - a

    def synchronize(self):
        self.syncs += 1


def test_time_interleaved_measures_each_call_and_excludes_flush():
    timer = FakeTimer()
    log = []

    def work(name, cost):
        def fn():
            log.append(name)
            timer.now += cost
        return fn

    def flush():
        log.append("flush")
        timer.now += 100.0   # must not show up in any measurement

    stats = time_interleaved({"fast": work("fast", 1.0), "slow": work("slow", 3.0)}, reps=4, warmup=2,
                             flush=flush, timer=timer)
    assert stats["fast"].median_ms == 1.0 and stats["slow"].median_ms == 3.0
    assert stats["fast"].reps == 4
    assert log[:4] == ["fast", "slow", "fast", "slow"]           # warm-up, no flush
    assert log[4:10] == ["fast"] * 3 + ["slow"] * 3              # host-time probe, no flush
    timed = log[10:]
    assert timed.count("flush") == 8                             # one before every timed call
    assert [x for x in timed if x != "flush"][:4] == ["fast", "slow", "slow", "fast"]   # rotation
    assert stats["fast"].host_us is not None


def test_time_interleaved_rejects_zero_reps():
    with pytest.raises(ValueError):
        time_interleaved({"a": lambda: None}, reps=0, timer=FakeTimer())


def test_pre_roll_runs_before_each_start_and_scales_with_host_time():
    timer = FakeTimer()
    log = []

    def slow_host():
        time.sleep(0.002)        # 2 ms of host work per call
        log.append("call")
        timer.now += 1.0

    stats = time_interleaved({"k": slow_host}, reps=3, warmup=0, timer=timer,
                             pre_roll=lambda us: log.append(("spin", us)))
    timed = log[3:]              # after the host-time probe
    assert [x if x == "call" else x[0] for x in timed] == ["spin", "call"] * 3
    spin_us = timed[0][1]
    assert stats["k"].host_us >= 2000 and spin_us >= 2 * 2000 * 0.99
    assert stats["k"].median_ms == 1.0


def test_pre_roll_length_is_bounded():
    assert pre_roll_us([]) == 20.0
    assert pre_roll_us([5.0, 30.0]) == 60.0
    assert pre_roll_us([1e6]) == 5000.0
