"""`asmgemm tune` as one library call: `tune(TuneConfig(...))` enumerates the kernel's `.tune` space,
builds every candidate on the CPU (pruning those that cannot run or cannot win), and, unless
dry_run, checks and times the survivors on the GPU against untuned gemm() and stores the winner in
the tuning cache. The command line only parses options, shows progress and renders the result."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..bench.shapes import Shape
from ..bench.timing import L2Flusher, make_pre_roll
from ..errors import AsmError
from ..kernel_spec import DTYPE_ITEMSIZE, KernelSpec, all_specs
from ..pipeline import BuildOptions, build_file, resolve_input
from ..runtime import gemm as runtime_gemm
from ..runtime.gpu import device_facts, gpu_name, require_gpu
from ..runtime.launch import call_defines
from ..runtime.plan import call_values_for
from ..runtime.split_k import requested_splits
from .space import MAX_CANDIDATES, BuildJob, Candidate, build_candidates, enumerate_space, summarize_pruning
from .store import make_entry, store_tuned
from .trials import TuneOutcome, trials_for, tune_on_gpu


@dataclass(frozen=True)
class TuneConfig:
    kernel: str                                 # a kernel spec's name, or a .sasm path (dry runs: any)
    shape: Shape
    layout: str = "nn"
    dry_run: bool = False
    jobs: int = 0                               # parallel builds; 0: one per CPU
    reps: int = 20
    warmup: int = 3
    flush_l2: bool = True
    pre_roll: bool = True
    max_candidates: int = MAX_CANDIDATES
    save: bool = True
    defines: tuple[tuple[str, str], ...] = ()   # the user's -D: fixed, not varied
    target: str | None = None
    include_dirs: tuple[str, ...] = ()


@dataclass
class TuneResult:
    report: dict                                # everything, JSON-able (what --json prints)
    candidates: list[Candidate]
    target: str
    outcome: TuneOutcome | None = None          # None for a dry run
    moved_corrupt_cache: str | None = None


@dataclass
class Progress:
    """Callbacks for a front end: a stage starts ('build' or 'gpu', with its number of steps), a
    candidate was built, a GPU step ended (a candidate checked; 'timing' once per timed repetition)."""

    stage: Callable[[str, int], None] = field(default=lambda what, total: None)
    built: Callable[[Candidate], None] = field(default=lambda c: None)
    gpu_step: Callable[[str], None] = field(default=lambda what: None)


def resolve_kernel(kernel: str) -> tuple[Path, KernelSpec | None]:
    """(source file, its spec or None): a spec's name, or a path whose file some spec builds."""
    specs = all_specs()
    name = kernel[:-5] if kernel.endswith(".sasm") else kernel
    if name in specs and not Path(kernel).is_file():
        return specs[name].source, specs[name]
    source = resolve_input(kernel)
    for spec in specs.values():
        if spec.source.resolve() == source.resolve():
            return source, spec
    return source, None


def tune(config: TuneConfig, progress: Progress | None = None) -> TuneResult:
    progress = progress or Progress()
    shape, user_defines = config.shape, dict(config.defines)
    source, spec = resolve_kernel(config.kernel)
    kernel_name = spec.name if spec else source.stem
    target, cp = config.target, None
    if not config.dry_run:
        if spec is None:
            raise AsmError(f"{source} has no kernel spec, so gemm() cannot run it on the GPU",
                           hint="add a spec entry (docs/adding-a-kernel.md), or use --dry-run to build the space")
        cp = require_gpu("asmgemm tune")
        target = target or spec.build_target(device_facts().target)
        if target is None:
            raise AsmError(f"kernel '{spec.name}' is not built for this GPU ({device_facts().target})")

    # -D SPLIT_K=S (a kernel with split-K): S splits for the timed runs (gemm's params), while the
    # candidates are built with the kernel's 0/1 switch (runtime/split_k.py)
    build_user_defines = _split_k_build_defines(spec, user_defines)
    # One build with the defaults: the declared space and the parameter names.
    probe = build_file(str(source), BuildOptions(defines=dict(build_user_defines), target=target,
                                                 include_dirs=list(config.include_dirs)))
    if not probe.tunables:
        raise AsmError(f"{source} declares no tunable parameters",
                       hint="declare the search space with `.tune NAME in choices(a, b, ...)` after `.const NAME ?= default`")
    # the call-derived parameters (transposes, vector loads) exactly as the runtime will set them
    base_defines: dict[str, str] = {}
    if spec is not None:
        values = call_values_for(shape.m, shape.n, shape.k, config.layout, DTYPE_ITEMSIZE[spec.dtypes.a])
        base_defines = {k: str(v) for k, v in call_defines(spec, values).items() if k in probe.parameters}
    base_defines.update(build_user_defines)
    space = enumerate_space(probe.tunables, fixed=build_user_defines, limit=config.max_candidates)
    smem = spec.launch.smem_bytes if spec else "SMEM_BYTES"
    jobs_list = [BuildJob(i, str(source), p, base_defines, target, tuple(config.include_dirs), smem)
                 for i, p in enumerate(space)]
    progress.stage("build", len(jobs_list))
    cands = build_candidates(jobs_list, config.jobs, on_done=progress.built)
    pruned = summarize_pruning(cands)
    survivors = [c for c in cands if c.ok]
    report = {"kernel": kernel_name, "source": str(source), "shape": [shape.m, shape.n, shape.k],
              "layout": config.layout, "target": probe.target, "build_defines": base_defines,
              "space": dict(probe.tunables), "fixed": user_defines, "candidates": len(cands),
              "survivors": len(survivors), "pruned": pruned, "builds": [c.to_json() for c in cands]}
    result = TuneResult(report, cands, probe.target)
    if config.dry_run:
        return result
    if not survivors:
        reasons = ", ".join(f"{n} {r}" for r, n in pruned.items()) or "none"
        raise AsmError(f"all {len(cands)} candidates were pruned ({reasons}); nothing to time")
    _time_and_store(config, spec, cp, probe, survivors, user_defines, result, progress)
    return result


def _split_k_build_defines(spec, user_defines: dict) -> dict:
    """The -D values the candidates are built with: a split count S given as -D SPLIT_K=S becomes
    the kernel's switch (1 for S > 1, else 0); everything else as given."""
    if spec is None or spec.split_k is None or spec.split_k.switch not in user_defines:
        return user_defines
    switch = spec.split_k.switch
    return {**user_defines, switch: "1" if requested_splits(user_defines[switch], switch, "-D") > 1 else "0"}


def _time_and_store(config, spec, cp, probe, survivors, user_defines, result: TuneResult, progress: Progress):
    shape, report = config.shape, result.report
    split_switch = spec.split_k.switch if spec.split_k is not None else None
    for c in survivors:  # the runtime needs the user's fixed values too (and the split count S)
        c.params = {**{k: v for k, v in user_defines.items() if k in probe.tunables or k == split_switch},
                    **c.params}
    trials = trials_for(survivors)
    flush = L2Flusher() if config.flush_l2 else None
    progress.stage("gpu", len(trials) + config.reps)
    outcome = tune_on_gpu(cp, spec, shape, config.layout, trials, reps=config.reps, warmup=config.warmup,
                          flush=flush, on_step=progress.gpu_step, pre_roll=make_pre_roll(config.pre_roll))
    result.outcome = outcome
    gpu = gpu_name()
    report["gpu"] = gpu
    report["trials"] = [t.to_json(shape) for t in outcome.trials]
    best, default = outcome.best, outcome.default
    if best is None:
        raise AsmError("no candidate ran correctly on the GPU: " +
                       "; ".join(f"{t.name}: {t.error}" for t in outcome.trials[:5]))
    report["best"] = best.to_json(shape)
    report["default"] = default.to_json(shape) if default else None
    report["gain_over_default"] = gain = outcome.gain()
    # Never store a choice slower than what gemm() already does untuned (e.g. when its choice lies
    # outside the declared space, or noise put the same variant first): the cache could only hurt.
    report["stored"] = False
    if not config.save:
        report["not_stored_because"] = "--no-save"
    elif gain is not None and gain < 0:
        report["not_stored_because"] = f"untuned gemm() was faster than every candidate ({gain:+.1%})"
    else:
        entry = make_entry(spec.name, spec.dtypes.a, str(spec.source.resolve()), best.params,
                           (shape.m, shape.n, shape.k), tflops=best.tflops(shape),
                           default_tflops=default.tflops(shape) if default and default.stats else None,
                           layout=config.layout, target=probe.target, reps=config.reps)
        path, moved = store_tuned(gpu, config.layout, (shape.m, shape.n, shape.k), entry)
        runtime_gemm.forget_tuned_choices()
        report["cache"] = str(path)
        report["stored"] = True
        result.moved_corrupt_cache = moved
