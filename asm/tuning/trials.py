"""The GPU half of `asmgemm tune`: check each surviving candidate's result, time all of them (and the
kernel's defaults) interleaved, and pick the fastest."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..bench.problem import GemmProblem
from ..bench.runner import make_runner
from ..bench.shapes import Shape
from ..bench.timing import TimingStats, tflops, time_interleaved
from ..errors import AsmError
from ..kernel_spec import KernelSpec
from ..runtime.tune_cache import lookups_off
from .space import Candidate

DEFAULT_LABEL = "default"


@dataclass
class Trial:
    name: str                      # '#<index>' or 'default'
    params: dict | None            # None: gemm()'s own untuned choice
    rel_err: float | None = None
    stats: TimingStats | None = None
    error: str | None = None
    is_default: bool = False

    def tflops(self, shape: Shape) -> float | None:
        return tflops(shape.flops, self.stats.median_ms) if self.stats else None

    def to_json(self, shape: Shape) -> dict:
        t = self.tflops(shape)
        return {"name": self.name, "params": self.params, "default": self.is_default, "rel_err": self.rel_err,
                "error": self.error, "tflops": round(t, 3) if t else None,
                "timing_ms": self.stats.to_json() if self.stats else None}


@dataclass
class TuneOutcome:
    trials: list[Trial] = field(default_factory=list)
    best: Trial | None = None
    default: Trial | None = None

    def gain(self) -> float | None:
        """How much faster the best is than untuned gemm() (0.10 = 10 % more throughput; slightly
        negative when the untuned choice is the best candidate and noise favoured it)."""
        if self.best and self.default and self.best.stats and self.default.stats:
            return self.default.stats.median_ms / self.best.stats.median_ms - 1.0
        return None


def trials_for(survivors: list[Candidate]) -> list[Trial]:
    """One trial per survivor, plus the reference: gemm() untuned (params=None with the tuning cache
    off: the kernel's defaults and the runtime's size rule), i.e. what users get without tuning. It
    is timed like the others, so the gain is measured, never assumed; when it runs the same variant
    as a candidate, the two timings also show the noise of the measurement."""
    trials = [Trial(f"#{c.index}", dict(c.params)) for c in survivors]
    trials.append(Trial(DEFAULT_LABEL, None, is_default=True))
    return trials


def pick_best(trials: list[Trial]) -> Trial | None:
    """The fastest correct candidate (the untuned reference is not a candidate: it has no params)."""
    timed = [t for t in trials if t.stats is not None and t.error is None and t.params is not None]
    return min(timed, key=lambda t: t.stats.median_ms) if timed else None


def tune_on_gpu(cp, kernel: KernelSpec, shape: Shape, layout: str, trials: list[Trial], *, reps: int,
                warmup: int, flush, on_step: Callable[[str], None] | None = None, seed: int = 0,
                timer=None, pre_roll=None) -> TuneOutcome:
    with lookups_off():   # the 'default' trial (params=None) must be gemm()'s untuned choice
        return _tune_on_gpu(cp, kernel, shape, layout, trials, reps=reps, warmup=warmup, flush=flush,
                            on_step=on_step, seed=seed, timer=timer, pre_roll=pre_roll)


def _tune_on_gpu(cp, kernel, shape, layout, trials, *, reps, warmup, flush, on_step, seed, timer,
                 pre_roll) -> TuneOutcome:
    prob = GemmProblem(cp, shape, layout, kernel.dtypes.a, seed=seed, c_dtype=kernel.dtypes.c)
    run = make_runner(kernel)
    limit = kernel.rel_err_limit
    outs = {}
    for t in trials:
        out = prob.output()
        prob.poison(out)
        try:
            run(prob.a, prob.b, out, prob.trans_a, prob.trans_b, t.params)   # builds + loads the variant
            cp.cuda.Device().synchronize()
        except AsmError as exc:
            t.error = exc.message.splitlines()[0]
        except Exception as exc:  # a launch failure (too many resources, illegal address) rules it out
            t.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        else:
            t.rel_err = prob.rel_error(out)
            if not t.rel_err <= limit:
                t.error = f"wrong result: relative error {t.rel_err:.2e} > {limit:.0e}"
            else:
                outs[t.name] = out
        if on_step:
            on_step(t.name)
    prob.release_reference()
    fns = {t.name: (lambda t=t: run(prob.a, prob.b, outs[t.name], prob.trans_a, prob.trans_b, t.params))
           for t in trials if t.error is None}
    if fns:
        stats = time_interleaved(fns, reps=reps, warmup=warmup, flush=flush, timer=timer, pre_roll=pre_roll,
                                 on_rep=(lambda r: on_step("timing")) if on_step else None)
        for t in trials:
            t.stats = stats.get(t.name)
    return TuneOutcome(trials, pick_best(trials), next((t for t in trials if t.is_default), None))
