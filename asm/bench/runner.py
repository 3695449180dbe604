"""`asmgemm bench` without the command line: for each kernel, layout and shape, check correctness,
then time asmgemm, cuBLAS (cupy.matmul) and torch.matmul (when importable) interleaved, three ways
(timing.py: `call`, what a caller waits for; `gpu`, device time; `loop`, back-to-back throughput).

A row keeps the three as `call_stats`, `stats` (gpu: the name older code and the baselines read)
and `loop_stats`. Baselines (`--save-baseline`, tests/perf) stay on the gpu ratio: it depends on
the GPU model alone, while the call ratio also depends on the host's CPU."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from ..errors import AsmError
from ..kernel_spec import KernelSpec, get_spec
from ..runtime import gemm as runtime_gemm, tune_cache   # modules: their functions are looked up when called
from ..runtime.gpu import device_facts
from ..runtime.split_k import untuned_split
from . import triton_ref
from .baseline import entry_key
from .problem import GemmProblem
from .shapes import Shape
from .timing import LOOP_CALLS, MODES, TimingStats, tflops, time_modes
from .triton_ref import TRITON_MMA


def make_runner(spec: KernelSpec) -> Callable:
    """run(a, b, c, trans_a, trans_b, params): asmgemm.gemm with this kernel, alpha 1, beta 0."""

    def run(a, b, c, trans_a, trans_b, params):
        return runtime_gemm.gemm(a, b, c, alpha=1.0, beta=0.0, trans_a=trans_a, trans_b=trans_b, params=params,
                                 kernel=spec.name)

    return run


@dataclass
class BenchRow:
    kernel: str
    dtype: str
    layout: str
    shape: Shape
    rel_err_limit: float
    params: dict | None = None
    params_source: str = "defaults"
    rel_err: dict[str, float] = field(default_factory=dict)     # impl -> ‖out − ref‖/‖ref‖
    stats: dict[str, TimingStats] = field(default_factory=dict)  # the gpu measurement (device time)
    error: str | None = None                                    # why the kernel did not run / failed
    notes: list[str] = field(default_factory=list)              # a reference that failed (not the kernel's fault)
    ran: str | None = None          # the kernel a route of `kernel`'s spec sent the call to ([[NAME.route]])
    ref_configs: dict[str, str] = field(default_factory=dict)   # reference -> the configuration it chose (autotuned)
    call_stats: dict[str, TimingStats] = field(default_factory=dict)  # one call from an idle GPU
    loop_stats: dict[str, TimingStats] = field(default_factory=dict)  # per call of back-to-back calls
    a_dtype: str | None = None      # the operands' dtype where it is not C's (hgemm_f32c: float16)

    @property
    def correct(self) -> bool:
        e = self.rel_err.get("asmgemm")
        return self.error is None and e is not None and e <= self.rel_err_limit

    @property
    def operand_dtype(self) -> str:
        """What groups rows in the summary and colours them in the plot: the operands' dtype (it
        sets the GPU's peak: hgemm_f32c runs on the fp16 tensor cores like hgemm)."""
        return self.a_dtype or self.dtype

    def timings(self, mode: str = "gpu") -> dict[str, TimingStats]:
        if mode not in MODES:
            raise ValueError(f"unknown timing mode {mode!r}")
        return {"call": self.call_stats, "gpu": self.stats, "loop": self.loop_stats}[mode]

    def tflops(self, impl: str, mode: str = "gpu") -> float | None:
        s = self.timings(mode).get(impl)
        return tflops(self.shape.flops, s.median_ms) if s else None

    def ratio(self, impl: str = "asmgemm", to: str = "cublas", mode: str = "gpu") -> float | None:
        mine, ref = self.tflops(impl, mode), self.tflops(to, mode)
        return mine / ref if mine and ref else None

    def ratio_to_best(self, impl: str = "asmgemm", mode: str = "gpu") -> float | None:
        """impl's throughput over the faster cuBLAS path timed here: cupy.matmul or torch.matmul
        (both call cuBLAS, with different heuristics; torch's fp16 is up to 15% ahead)."""
        mine = self.tflops(impl, mode)
        refs = [t for t in (self.tflops("cublas", mode), self.tflops("torch", mode)) if t]
        return mine / max(refs) if mine and refs else None

    @property
    def key(self) -> str:
        return entry_key(self.kernel, self.layout, self.shape.m, self.shape.n, self.shape.k)

    def to_json(self) -> dict:
        """The row as JSON. The keys of before the three modes (tflops, ratio_to_cublas,
        ratio_to_best_cublas, ratio_to_triton_mma, timing_ms) keep their meaning: the gpu mode.
        call_ms / gpu_ms / loop_ms: {impl: median ms per call}; *_by_mode: {mode: ...}."""
        def rnd(x, digits=4):
            return round(x, digits) if x is not None else None
        return {
            "kernel": self.kernel, "ran": self.ran or self.kernel, "dtype": self.dtype,
            "a_dtype": self.operand_dtype, "layout": self.layout,
            "m": self.shape.m, "n": self.shape.n, "k": self.shape.k, "label": self.shape.label,
            "params": self.params, "params_source": self.params_source,
            "correct": self.correct, "error": self.error, "notes": self.notes, "rel_err": self.rel_err,
            "tflops": {i: round(self.tflops(i), 3) for i in self.stats},
            "ratio_to_cublas": {i: round(self.ratio(i), 4) for i in self.stats if i != "cublas" and self.ratio(i)},
            "ratio_to_best_cublas": (round(self.ratio_to_best(), 4) if self.ratio_to_best() else None),
            "ratio_to_triton_mma": (round(self.ratio(to=TRITON_MMA), 4) if self.ratio(to=TRITON_MMA) else None),
            "ref_configs": self.ref_configs,
            "timing_ms": {i: s.to_json() for i, s in self.stats.items()},
            **{f"{mode}_ms": {i: round(s.median_ms, 6) for i, s in self.timings(mode).items()} for mode in MODES},
            "tflops_by_mode": {mode: {i: round(self.tflops(i, mode), 3) for i in self.timings(mode)} for mode in MODES},
            "ratio_to_best_cublas_by_mode": {mode: rnd(self.ratio_to_best(mode=mode)) for mode in MODES},
            "ratio_to_cublas_by_mode": {mode: rnd(self.ratio(mode=mode)) for mode in MODES},
            "timing_ms_by_mode": {mode: {i: s.to_json() for i, s in self.timings(mode).items()} for mode in MODES},
        }


def torch_module():
    """torch with true-fp32 matmuls (TF32 off), or None when it is not importable."""
    try:
        import torch
    except Exception:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    return torch


def bench_one(cp, kernel: KernelSpec, shape: Shape, layout: str, *, reps: int, warmup: int,
              params: dict | None, params_source: str, flush, torch=None, seed: int = 0,
              shown_params: dict | None = None, on_rep: Callable[[int], None] | None = None,
              timer=None, pre_roll=None, triton: bool = False, triton_mma: bool = False,
              loop_calls: int = LOOP_CALLS) -> BenchRow:
    """One row: correctness, then the three timings (timing.time_modes; the gpu one with
    `pre_roll` when given, the loop one skipped with loop_calls=0)."""
    row = BenchRow(kernel.name, kernel.dtypes.c, layout, shape, kernel.rel_err_limit,
                   shown_params if shown_params is not None else params, params_source,
                   a_dtype=kernel.dtypes.a if kernel.dtypes.a != kernel.dtypes.c else None)
    prob = GemmProblem(cp, shape, layout, kernel.dtypes.a, seed=seed, c_dtype=kernel.dtypes.c)
    run = make_runner(kernel)
    outs = {"asmgemm": prob.output(), "cublas": prob.output()}
    fns = {
        "asmgemm": lambda: run(prob.a, prob.b, outs["asmgemm"], prob.trans_a, prob.trans_b, params),
        "cublas": lambda: prob.cublas(outs["cublas"]),
    }
    torch_for_refs = torch       # Triton's mma.sync path takes a C of another dtype; torch.matmul does not
    if torch is not None and prob.c_dtype != prob.dtype:
        # torch.matmul gives C in A's dtype only; cuBLAS's own mixed call (GemmProblem.cublas) is the reference
        row.notes.append(f"cuBLAS timed as cublasGemmEx ({prob.dtype.name} A and B, {prob.c_dtype.name} C); torch not "
                         f"run (its matmul returns {prob.dtype.name})")
        torch = None
    if torch is not None:
        ta, tb = torch.from_dlpack(prob.a), torch.from_dlpack(prob.b)
        top_a = ta.t() if prob.trans_a else ta
        top_b = tb.t() if prob.trans_b else tb
        outs["torch"] = prob.output()
        tc = torch.from_dlpack(outs["torch"])
        fns["torch"] = lambda: torch.matmul(top_a, top_b, out=tc)
        if triton:
            try:
                outs["triton"] = prob.output()
                fns["triton"] = triton_ref.make_triton_matmul(top_a, top_b, torch.from_dlpack(outs["triton"]))
            except Exception as exc:
                row.notes.append(f"triton not run: {type(exc).__name__}: {exc}")
    if triton_mma and torch_for_refs is not None:
        _add_triton_mma(row, prob, fns, outs, torch_for_refs)
    # correctness, each implementation on a poisoned output, before any timing
    limit = kernel.rel_err_limit
    for impl, fn in list(fns.items()):
        prob.poison(outs[impl])
        runtime_gemm.clear_last_launch()    # what asmgemm's call launches, not an earlier call's
        try:
            fn()
            cp.cuda.Device().synchronize()
            if impl == "asmgemm":
                _note_route(row, kernel)
        except Exception as exc:  # AsmError from the runtime, or a CUDA launch error
            text = exc.message.splitlines()[0] if isinstance(exc, AsmError) else \
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            fns.pop(impl)
            if impl == "asmgemm":
                row.error = text
            else:
                row.notes.append(f"{impl} did not run: {text}")
            continue
        row.rel_err[impl] = prob.rel_error(outs[impl])
        if impl != "asmgemm" and not row.rel_err[impl] <= limit:
            row.notes.append(f"{impl} relative error {row.rel_err[impl]:.2e} > {limit:.0e} (TF32 on?)")
    prob.release_reference()
    if "asmgemm" in fns and not row.correct:
        row.error = f"wrong result: relative error {row.rel_err['asmgemm']:.2e} > {limit:.0e}"
        fns.pop("asmgemm")
    if fns:
        timed = time_modes(fns, reps=reps, warmup=warmup, flush=flush, on_rep=on_rep, timer=timer,
                           pre_roll=pre_roll, loop_calls=loop_calls)
        row.call_stats, row.stats, row.loop_stats = timed["call"], timed["gpu"], timed.get("loop", {})
    return row


def _add_triton_mma(row: BenchRow, prob, fns: dict, outs: dict, torch) -> None:
    """The triton-mma column: Triton's mma.sync path, autotuned here (seconds, before any timing);
    16-bit operands, C in their dtype or fp32. A reference that cannot run is a note, not the
    kernel's error."""
    if prob.dtype.itemsize != 2:
        row.notes.append(f"{TRITON_MMA} not run: Triton's mma.sync path is timed for 16-bit operands only "
                         f"(not {prob.dtype.name})")
        return
    out = prob.output()
    try:
        ta, tb = torch.from_dlpack(prob.a), torch.from_dlpack(prob.b)
        fn, config = triton_ref.make_triton_mma_matmul(ta.t() if prob.trans_a else ta,
                                                       tb.t() if prob.trans_b else tb, torch.from_dlpack(out))
    except Exception as exc:
        text = str(exc).splitlines()[0] if str(exc) else ""
        row.notes.append(f"{TRITON_MMA} not run: {type(exc).__name__}: {text}")
        return
    outs[TRITON_MMA], fns[TRITON_MMA] = out, fn
    row.ref_configs[TRITON_MMA] = config


def _note_route(row: BenchRow, kernel: KernelSpec) -> None:
    """Where the spec's routes sent the call to another kernel (sgemm -> sgemm_skinny), name it in
    the row and show that launch's split instead of the spec's own untuned choice."""
    ran = runtime_gemm.last_launch()
    if ran is None or ran["kernel"] == kernel.name:
        return
    row.ran = ran["kernel"]
    if row.params_source != "-D":
        # (a launch split S > 1 ways has a kernel with a split-K switch)
        row.params = {get_spec(row.ran).split_k.switch: ran["splits"]} if ran["splits"] > 1 else None


def resolve_params(kernel: KernelSpec, gpu: str, layout: str, shape: Shape, defines: dict[str, str],
                   use_defaults: bool) -> tuple[dict | None, str, dict | None]:
    """(what bench passes as params=, where it came from, the params to show).

    -D overrides are passed as given. Otherwise params=None, so the kernel runs exactly as
    gemm() runs it for users: with the tuning cache ('tuned' when it has an entry for this problem),
    or, with --defaults (tuning-cache lookups off), with the runtime's untuned choice."""
    if defines:
        return dict(defines), "-D", dict(defines)
    if use_defaults:
        return None, "defaults", _untuned_split_shown(kernel, shape, layout)
    tuned = tune_cache.lookup_tuned(gpu, kernel.name, layout, shape.m, shape.n, shape.k)
    if tuned:
        # a tuned entry of tile parameters keeps the rule's split (runtime/split_k.py): show it too
        keeps_rule = kernel.split_k is not None and kernel.split_k.switch not in tuned
        return None, "tuned", {**tuned, **((keeps_rule and _untuned_split_shown(kernel, shape, layout)) or {})}
    return None, "defaults", _untuned_split_shown(kernel, shape, layout)


def _untuned_split_shown(kernel: KernelSpec, shape: Shape, layout: str) -> dict | None:
    """{'SPLIT_K': S} where the untuned choice splits K (shown as 'defaults: SPLIT_K=S'), else None.
    The split depends on M, N, K, and on the layout where the spec's swap rule (a swapped call
    never splits) reads it."""
    if kernel.split_k is None:
        return None
    split = untuned_split(kernel, shape.m, shape.n, shape.k, device_facts().sm_count, layout)
    return {kernel.split_k.switch: split.splits} if split is not None else None


SLOW_LIMITS = (0.9, 0.7)   # issue 12's goal: no shape under 0.9x the faster cuBLAS path; 0.7: far off


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def summarize_mode(rows: list[BenchRow], mode: str) -> dict | None:
    """asmgemm's ratio to the faster cuBLAS path in one timing mode, over the correct rows that
    have it: {shapes, geomean_to_best_cublas, under: {"0.9": count, "0.7": count}, slowest:
    {kernel, layout, shape, ratio_to_best_cublas}}; None without such rows."""
    kept = [(r, r.ratio_to_best(mode=mode)) for r in rows if r.correct]
    kept = [(r, x) for r, x in kept if x]
    if not kept:
        return None
    slowest, low = min(kept, key=lambda rx: rx[1])
    ratios = [x for _, x in kept]
    return {"shapes": len(kept), "geomean_to_best_cublas": round(_geomean(ratios), 4),
            "under": {str(limit): sum(x < limit for x in ratios) for limit in SLOW_LIMITS},
            "slowest": {"kernel": slowest.kernel, "layout": slowest.layout, "shape": slowest.shape.key,
                        "ratio_to_best_cublas": round(low, 4)}}


def summarize(rows: list[BenchRow], slow: float = 0.9) -> dict | None:
    """Over the rows that ran correctly: how many, the geometric means of asmgemm's ratio to
    cupy.matmul and to the faster cuBLAS path, the shapes under `slow` of the faster one (issue
    12's goal: none under 0.9, geomean >= 1.0) and the slowest -- these keys in the gpu mode, as
    before the three modes; "modes": the same for each of call, gpu and loop (`summarize_mode`;
    None for a mode not measured); "by_dtype": {operand dtype: {mode: ...}} when the rows have
    several (sgemm's fp32 and hgemm's fp16 are not one population). None without such rows."""
    kept = [r for r in rows if r.correct and r.ratio() and r.ratio_to_best()]
    if not kept:
        return None
    slowest = min(kept, key=lambda r: r.ratio_to_best())
    out = {"shapes": len(kept), "geomean_to_cublas": round(_geomean([r.ratio() for r in kept]), 4),
           "geomean_to_best_cublas": round(_geomean([r.ratio_to_best() for r in kept]), 4),
           "under": slow, "shapes_under": sum(r.ratio_to_best() < slow for r in kept),
           "slowest": {"kernel": slowest.kernel, "layout": slowest.layout, "shape": slowest.shape.key,
                       "ratio_to_best_cublas": round(slowest.ratio_to_best(), 4)},
           "modes": {mode: summarize_mode(rows, mode) for mode in MODES}}
    dtypes = list(dict.fromkeys(r.operand_dtype for r in rows if r.correct))
    if len(dtypes) > 1:
        out["by_dtype"] = {d: {mode: summarize_mode([r for r in rows if r.operand_dtype == d], mode)
                               for mode in MODES} for d in dtypes}
    return out
