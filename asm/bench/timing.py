"""The one GPU timer of asmgemm (`bench`, `run`, `tune`): device events around each repetition,
warm-up first, the median of many with min/max kept, several implementations interleaved in one
process (so that clock and temperature drift hit all of them alike), L2 flushed between
repetitions, and a GPU pre-roll that hides each call's host time.

The statistics and the interleaving order are plain Python (tested on the CPU with a fake
timer); only `CudaEventTimer` and `L2Flusher` touch CuPy, and they import it when built.
"""
from __future__ import annotations

import statistics
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
        import sys
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


def time_interleaved(fns: dict[str, Callable[[], object]], reps: int, warmup: int = 3,
                     flush: Callable[[], None] | None = None, timer: Timer | None = None,
                     on_rep: Callable[[int], None] | None = None,
                     pre_roll: Callable[[float], None] | None = None) -> dict[str, TimingStats]:
    """Time each callable `reps` times, interleaved, with `warmup` untimed calls of each first.

    Each timed region holds exactly one call. Before its start event come the L2 flush (when
    given) and the pre-roll (when given: GPU busy-work lasting twice the slowest call's host
    time), so neither is inside a measurement and the host cost of the call is hidden behind
    them. All events are read after one final synchronize."""
    if reps < 1:
        raise ValueError("reps must be >= 1")
    timer = timer or CudaEventTimer()
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    timer.synchronize()
    host = measure_host_us(fns, timer)
    spin = pre_roll_us(list(host.values())) if pre_roll is not None else 0.0
    marks: dict[str, list[tuple[object, object]]] = {n: [] for n in names}
    for rep in range(reps):
        for name in interleaved_order(names, rep):
            if flush is not None:
                flush()
            if pre_roll is not None:
                pre_roll(spin)
            start = timer.mark()
            fns[name]()
            end = timer.mark()
            marks[name].append((start, end))
        if on_rep is not None:
            on_rep(rep)
    timer.synchronize()
    out = {}
    for n in names:
        stats = summarize([timer.elapsed_ms(a, b) for a, b in marks[n]])
        stats.host_us = host[n]
        out[n] = stats
    return out
