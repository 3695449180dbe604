"""The one GPU timer of asmgemm (`bench`, `run`, `tune`): device events, warm-up first, the median
of many repetitions with min/max kept, several implementations interleaved in one process (so that
clock and temperature drift hit all of them alike), L2 flushed between repetitions.

Three measurements (`time_modes`; `bench` takes all three, `run` and `tune` the second):
  call  what a caller waits for: events around ONE call started on an idle GPU (synchronized, L2
        flushed and synchronized again before the start event), so the host time of the call
        (Python, argument checks, the launch) that the GPU waits for counts, as it does for a
        torch user calling one GEMM.
  gpu   the device time: a GPU pre-roll (a spin kernel lasting twice the call's host time) runs
        before each start event, so the host work is spent while the GPU is still busy and the
        events bracket the kernel(s) alone.
  loop  throughput: LOOP_CALLS back-to-back calls between one pair of events (no flush inside),
        divided by their number: the host and the GPU overlap as in a model's forward pass, and
        whichever is slower sets the rate.

The statistics and the interleaving order are plain Python (tested on the CPU with a fake
timer); only `CudaEventTimer`, `GpuPreRoll` and `L2Flusher` touch CuPy, and they import it when built.
"""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Protocol


@dataclass
class TimingStats:
    median_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    reps: int
    samples_ms: list[float] = field(default_factory=list, repr=False)
    host_us: float | None = None      # host time of one call (Python + launch), hidden by the pre-roll

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the repetitions were."""
        return (self.max_ms - self.min_ms) / self.median_ms if self.median_ms > 0 else float("inf")

    def to_json(self, with_samples: bool = False) -> dict:
        d = asdict(self)
        if not with_samples:
            d.pop("samples_ms")
        return d


def summarize(samples_ms: list[float]) -> TimingStats:
    if not samples_ms:
        raise ValueError("no timing samples")
    bad = [s for s in samples_ms if not s > 0]
    if bad:
        # A zero or negative event interval means the events did not bracket the work.
        raise ValueError(f"non-positive timing sample(s): {bad[:3]}")
    return TimingStats(statistics.median(samples_ms), min(samples_ms), max(samples_ms),
                       statistics.fmean(samples_ms), len(samples_ms), list(samples_ms))


def tflops(flops: float, ms: float) -> float:
    """Throughput in TFLOP/s for `flops` floating-point operations done in `ms` milliseconds."""
    if not ms > 0:
        raise ValueError(f"time must be positive, got {ms}")
    return flops / (ms * 1e-3) / 1e12


class Timer(Protocol):
    def mark(self) -> object: ...
    def elapsed_ms(self, start: object, end: object) -> float: ...
    def synchronize(self) -> None: ...


class CudaEventTimer:
    """Events recorded on CuPy's current stream. torch work launched from the same thread goes to
    the same legacy default stream unless the caller changed torch's stream, so events bracket it too."""

    def __init__(self):
        import cupy
        self._cp = cupy

    def mark(self):
        ev = self._cp.cuda.Event()
        ev.record()
        return ev

    def elapsed_ms(self, start, end) -> float:
        return float(self._cp.cuda.get_elapsed_time(start, end))

    def synchronize(self) -> None:
        self._cp.cuda.get_current_stream().synchronize()
        self._cp.cuda.Device().synchronize()


class GpuPreRoll:
    """Keeps the GPU busy for a given time before each start event, so that the host-side cost of
    the call being timed (Python, argument checks, the launch itself) is spent while the GPU still
    works, and the events measure the device time of the work alone. The device-side equivalent of
    nvbench's "blocking kernel". A one-thread kernel that spins on %globaltimer (nanoseconds)."""

    SOURCE = r"""
extern "C" __global__ void asmgemm_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""

    def __init__(self):
        import cupy
        self._cp = cupy
        self._kernel = cupy.RawKernel(self.SOURCE, "asmgemm_spin")
        self(1.0)                       # compile (NVRTC) and launch once, so failures show here
        cupy.cuda.Device().synchronize()

    def __call__(self, us: float) -> None:
        self._kernel((1,), (1,), (self._cp.uint64(int(us * 1000)),))


def make_pre_roll(enabled: bool = True):
    """A GpuPreRoll, or None (with a warning on stderr) when disabled or it cannot be built."""
    if not enabled:
        return None
    try:
        return GpuPreRoll()
    except Exception as exc:
        print(f"asmgemm: warning: no GPU pre-roll ({type(exc).__name__}: {exc}); host time of each call "
              "may show up in small shapes' timings", file=sys.stderr)
        return None


def pre_roll_us(host_us: list[float], floor_us: float = 20.0, cap_us: float = 5000.0) -> float:
    """How long to keep the GPU busy: twice the slowest call's host time, within [floor, cap]."""
    return min(max(2.0 * max(host_us, default=0.0), floor_us), cap_us)


class L2Flusher:
    """Evicts the inputs from L2 between repetitions by writing a buffer twice the L2 size (a fill
    kernel: writes, so dirty lines of the previous repetition are flushed as well). Without it, a
    shape whose operands fit in L2 (50 MB on the H100) would be timed from cache."""

    def __init__(self, l2_bytes: int | None = None):
        import cupy
        if l2_bytes is None:
            l2_bytes = int(cupy.cuda.Device().attributes.get("L2CacheSize", 0)) or 64 << 20
        self.nbytes = 2 * l2_bytes
        self._buf = cupy.empty(self.nbytes // 4, dtype=cupy.int32)
        self._n = 0

    def __call__(self) -> None:
        self._n += 1
        self._buf.fill(self._n)


def interleaved_order(names: list[str], rep: int) -> list[str]:
    """Rotate the order each repetition, so that no implementation always runs first (right after
    the flush, or right after a long kernel that heated the chip)."""
    if not names:
        return []
    r = rep % len(names)
    return names[r:] + names[:r]


def measure_host_us(fns: dict[str, Callable[[], object]], timer: Timer, tries: int = 3) -> dict[str, float]:
    """Host time of one call of each callable (launches are asynchronous, so this is the Python and
    launch cost, not the GPU's), the best of `tries`, with the GPU drained before each."""
    out = {}
    for name, fn in fns.items():
        best = float("inf")
        for _ in range(tries):
            timer.synchronize()
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        out[name] = best * 1e6
    timer.synchronize()
    return out


MODES = ("call", "gpu", "loop")
LOOP_CALLS = 200        # calls between the events of one `loop` measurement
LOOP_REPS = 3           # `loop` measurements per implementation (each is LOOP_CALLS calls: a few suffice)


def time_interleaved(fns: dict[str, Callable[[], object]], reps: int, warmup: int = 3,
                     flush: Callable[[], None] | None = None, timer: Timer | None = None,
                     on_rep: Callable[[int], None] | None = None,
                     pre_roll: Callable[[float], None] | None = None) -> dict[str, TimingStats]:
    """The `gpu` measurement alone (see `time_modes`): {name: stats}."""
    return time_modes(fns, reps, warmup, flush, timer, on_rep, pre_roll, modes=("gpu",))["gpu"]


def time_modes(fns: dict[str, Callable[[], object]], reps: int, warmup: int = 3,
               flush: Callable[[], None] | None = None, timer: Timer | None = None,
               on_rep: Callable[[int], None] | None = None,
               pre_roll: Callable[[float], None] | None = None, *, modes: tuple[str, ...] = MODES,
               loop_calls: int = LOOP_CALLS, loop_reps: int = LOOP_REPS) -> dict[str, dict[str, TimingStats]]:
    """{mode: {name: stats}} for the measurements `modes` (module docstring), `warmup` untimed calls
    of each callable first. Each repetition takes, in this order, every implementation's `call`,
    then `gpu` measurement (then, in the first `loop_reps` repetitions, `loop`), the order of the
    implementations rotated each repetition, so that drift hits every implementation and mode alike.

    call: synchronize; flush (when given) and synchronize again; start event; one call; end event.
    gpu:  flush (when given); pre-roll (when given: GPU busy-work lasting twice the slowest call's
          host time); start event; one call; end event. Neither the flush nor the pre-roll is
          inside a measurement, and the host cost of the call is hidden behind them.
    loop: synchronize; start event; `loop_calls` calls; end event; the time over loop_calls
          (no loop with loop_calls = 0: the mode is then left out of the result).
    All events are read after one final synchronize. Stats' host_us is the call's host time."""
    if reps < 1:
        raise ValueError("reps must be >= 1")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown timing mode(s) {unknown}: choose from {MODES}")
    if loop_calls < 0 or loop_reps < 1:
        raise ValueError("loop_calls must be >= 0 and loop_reps >= 1")
    modes = tuple(m for m in MODES if m in modes and not (m == "loop" and loop_calls == 0))
    timer = timer or CudaEventTimer()
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    timer.synchronize()
    host = measure_host_us(fns, timer)
    spin = pre_roll_us(list(host.values())) if pre_roll is not None else 0.0
    marks: dict[str, dict[str, list[tuple[object, object]]]] = {m: {n: [] for n in names} for m in modes}
    for rep in range(reps):
        order = interleaved_order(names, rep)
        if "call" in modes:
            for name in order:
                timer.synchronize()             # the GPU idle: nothing hides the call's host time
                if flush is not None:
                    flush()
                    timer.synchronize()         # the flush done before the start event, not inside
                start = timer.mark()
                fns[name]()
                marks["call"][name].append((start, timer.mark()))
        if "gpu" in modes:
            for name in order:
                if flush is not None:
                    flush()
                if pre_roll is not None:
                    pre_roll(spin)
                start = timer.mark()
                fns[name]()
                marks["gpu"][name].append((start, timer.mark()))
        if "loop" in modes and rep < loop_reps:
            for name in order:
                fn = fns[name]
                timer.synchronize()
                start = timer.mark()
                for _ in range(loop_calls):
                    fn()
                marks["loop"][name].append((start, timer.mark()))
        if on_rep is not None:
            on_rep(rep)
    timer.synchronize()
    out: dict[str, dict[str, TimingStats]] = {}
    for mode in modes:
        per_call = loop_calls if mode == "loop" else 1
        out[mode] = {}
        for n in names:
            stats = summarize([timer.elapsed_ms(a, b) / per_call for a, b in marks[mode][n]])
            stats.host_us = host[n]
            out[mode][n] = stats
    return out
