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


# ---- call / gpu / loop (issue 32) ---------------------------------------------------------------
class SimGpu:
    """A host and a GPU on one virtual clock (ms): a call spends `host` ms on the host, then queues
    `gpu` ms of work; work starts when both the GPU is free and the host has launched it; an event
    completes when the GPU reaches it; synchronize waits for the GPU. `log` records the order."""

    def __init__(self):
        self.host = self.free = 0.0
        self.log = []

    def launch(self, ms, what):
        self.free = max(self.free, self.host) + ms
        self.log.append(what)

    def call(self, name, host_ms, gpu_ms):
        def fn():
            self.host += host_ms
            self.launch(gpu_ms, name)
        return fn

    def mark(self):
        self.free = max(self.free, self.host)
        self.log.append("event")
        return self.free

    def elapsed_ms(self, a, b):
        return b - a

    def synchronize(self):
        self.host = max(self.host, self.free)
        self.log.append("sync")


def test_three_modes_count_what_each_promises():
    """call = host + device time of one call; gpu = device time (the pre-roll, at least 20 us,
    covers the 15 us of host work); loop = the slower of host and GPU per call, in steady state."""
    from asmgemm.bench.timing import time_modes
    sim = SimGpu()
    fns = {"gpu-bound": sim.call("gpu-bound", 0.015, 0.05), "host-bound": sim.call("host-bound", 0.015, 0.005)}
    out = time_modes(fns, reps=4, warmup=1, timer=sim, flush=lambda: sim.launch(1.0, "flush"),
                     pre_roll=lambda us: sim.launch(us / 1000, "spin"), loop_calls=10, loop_reps=2)
    assert set(out) == {"call", "gpu", "loop"}
    call, gpu, loop = (out[m] for m in ("call", "gpu", "loop"))
    assert call["gpu-bound"].median_ms == pytest.approx(0.065) and call["host-bound"].median_ms == pytest.approx(0.02)
    assert gpu["gpu-bound"].median_ms == pytest.approx(0.05) and gpu["host-bound"].median_ms == pytest.approx(0.005)
    assert loop["gpu-bound"].median_ms == pytest.approx((0.015 + 10 * 0.05) / 10)
    assert loop["host-bound"].median_ms == pytest.approx((10 * 0.015 + 0.005) / 10)
    assert (call["gpu-bound"].reps, gpu["gpu-bound"].reps, loop["gpu-bound"].reps) == (4, 4, 2)


def test_call_mode_starts_on_an_idle_gpu_after_the_flush():
    from asmgemm.bench.timing import time_modes
    sim = SimGpu()
    time_modes({"k": sim.call("k", 0.01, 0.05)}, reps=2, warmup=0, timer=sim, modes=("call",),
               flush=lambda: sim.launch(1.0, "flush"), pre_roll=lambda us: sim.launch(us / 1000, "spin"))
    assert sim.log[:8] == ["sync"] + ["sync", "k"] * 3 + ["sync"]     # the host-time probe
    timed = sim.log[8:]
    # no pre-roll; the GPU drained, then the flush finished (synchronize) before the start event
    assert timed == ["sync", "flush", "sync", "event", "k", "event"] * 2 + ["sync"]


def test_gpu_mode_alone_and_loop_off():
    from asmgemm.bench.timing import time_modes
    sim = SimGpu()
    out = time_modes({"k": sim.call("k", 0.01, 0.05)}, reps=2, warmup=0, timer=sim, loop_calls=0)
    assert set(out) == {"call", "gpu"}          # loop_calls = 0: no loop measurement
    # without a pre-roll (--no-pre-roll) a gpu measurement on an idle GPU shows the host time as well
    out = time_modes({"k": sim.call("k", 0.01, 0.05)}, reps=1, warmup=0, timer=sim, modes=("gpu",))
    assert set(out) == {"gpu"} and out["gpu"]["k"].median_ms == pytest.approx(0.06)
    with pytest.raises(ValueError):
        time_modes({"k": sim.call("k", 0.01, 0.05)}, reps=1, timer=sim, modes=("wall",))
