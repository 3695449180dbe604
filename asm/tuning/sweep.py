"""`asmgemm tune FAMILY --sweep SHAPES`: time a kernel family's catalog over a shape distribution,
the data the cost model is fitted on (fit.py).

For each shape (and its layout) the sweep times, on fresh operands with GPU-only timing (L2
flushed, host work hidden behind a pre-roll, median of the repetitions): every catalog entry
unsplit, and for each entry its best few split candidates by the current model (the reduce kernel
and clusters), each checked against a float64 reference first. Every build is made up front, in
parallel on the CPU (ptxas), so the GPU phase only loads. Each sample records what the model
needs: the call, the candidate, its GPU time, the host time of one call, and the driver's
occupancy of the build (blocks per SM; clusters at once)."""
from __future__ import annotations

import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Callable

from ..bench.problem import GemmProblem
from ..bench.shapes import Shape
from ..bench.timing import L2Flusher, make_pre_roll, time_interleaved
from ..errors import AsmError
from ..kernel_spec import DTYPE_ITEMSIZE, KernelSpec, all_specs, get_spec
from ..runtime import dispatch, split_k
from ..runtime import gemm as runtime_gemm   # the module: gemm is looked up when called
from ..runtime.build_cache import build_kernel
from ..runtime.catalog import Candidate, candidates
from ..runtime.cost_model import variant_of
from ..runtime.dispatch_db import exact_key
from ..runtime.gpu import device_facts, require_gpu
from ..runtime.plan import fresh_plan
from .space import _ignore_sigint, _pool_context, default_jobs

SPLITS_PER_ENTRY = 2        # split candidates of each entry timed per shape (the model's best), and its best cluster


@dataclass(frozen=True)
class SweepCall:
    shape: Shape
    layout: str
    plan: object                 # runtime.plan.LaunchPlan on fresh operands (kernel-level M, N, K)
    timed: tuple[Candidate, ...]
    plan_ct: object = None       # the C^T launch's plan, for the catalog's swap entries (None: none)

    def plan_of(self, cand: Candidate):
        return self.plan_ct if cand.swap else self.plan


def plan_calls(family: KernelSpec, shapes: list[tuple[Shape, str]], facts, exhaustive: bool = False) -> list[SweepCall]:
    """The candidates to time per call: every entry unsplit plus each entry's SPLITS_PER_ENTRY best
    reduce-kernel splits and best cluster split by the current model (so the fit sees splits where
    they might win, and every configuration everywhere); exhaustive: every candidate."""
    a_size = DTYPE_ITEMSIZE[family.dtypes.a]
    c_size = DTYPE_ITEMSIZE[family.dtypes.c]
    out = []
    for shape, layout in shapes:
        plan = fresh_plan(shape.m, shape.n, shape.k, layout, a_size, c_size)
        plan_ct = (fresh_plan(shape.m, shape.n, shape.k, layout, a_size, c_size, c_trans=True)
                   if any(e.swap for e in family.configs) else None)
        choice = dispatch.choose(family, plan.layout, plan.m, plan.n, plan.k, call_values=plan.call_values,
                                 gpu=facts.name, target=facts.target, sms=facts.sm_count, plain=True,
                                 clock_hz=facts.clock_hz, dram_bytes_per_s=facts.dram_bytes_per_s, exact=False,
                                 swapped=(plan_ct.layout, plan_ct.call_values) if plan_ct is not None else None)
        timed: list[Candidate] = []
        per_entry: dict[tuple[str, str | None], int] = {}
        for est in choice.ranked:            # fastest first
            c = est.candidate
            if c.splits == 1 or exhaustive:
                timed.append(c)
                continue
            # (a split summed in the kernel is a workspace split too: as many counts as the reduce's)
            room = SPLITS_PER_ENTRY if c.reduce in ("kernel", "in_kernel") else 1
            if per_entry.get((c.config, c.reduce), 0) < room:
                per_entry[(c.config, c.reduce)] = per_entry.get((c.config, c.reduce), 0) + 1
                timed.append(c)
        out.append(SweepCall(shape, layout, plan, tuple(timed), plan_ct))
    return out


def _build(job):
    spec_name, defines, target = job
    try:
        build_kernel(get_spec(spec_name), dict(defines), target)
        return None
    except AsmError as exc:
        return exc.message.splitlines()[0] if exc.message else "error"


def prebuild(calls: list[SweepCall], facts, jobs: int = 0, on_done: Callable[[int, int], None] | None = None) -> dict:
    """Build every candidate of every call (and the reduce kernels), `jobs` at a time; returns
    {build key: refusal} for the builds a kernel's guards refused."""
    work: dict[tuple, tuple] = {}
    for call in calls:
        for cand in call.timed:
            cb = dispatch.candidate_build(cand, call.plan_of(cand), facts.sm_count, facts.target, True)
            work[cb.key] = (cb.spec.name, tuple(cb.defines.items()), cb.target)
            if cb.split is not None and not cb.in_cluster and not cb.fixup:
                rspec = split_k.reduce_spec(cb.spec)
                rdef = split_k.reduce_defines(cb.spec, call.plan_of(cand))
                rkey = (rspec.name, cb.target, tuple(sorted((k, str(v)) for k, v in rdef.items())))
                work[rkey] = (rspec, tuple(rdef.items()), cb.target)
    refused = {}
    jobs = jobs or default_jobs()
    items = [(k, v) for k, v in work.items() if isinstance(v[0], str)]
    # reduce kernels are specs made on the fly (not registered): built here, in this process
    for k, (rspec, rdef, target) in ((k, v) for k, v in work.items() if not isinstance(v[0], str)):
        build_kernel(rspec, dict(rdef), target)
    done = 0
    with ProcessPoolExecutor(max_workers=max(1, min(jobs, len(items) or 1)), mp_context=_pool_context(),
                             initializer=_ignore_sigint) as pool:
        pending: dict[Future, tuple] = {pool.submit(_build, job): key for key, job in items}
        while pending:
            finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for fut in finished:
                key = pending.pop(fut)
                why = fut.result()
                if why is not None:
                    refused[key] = why
                    dispatch.refuse(key, why)
                done += 1
                if on_done:
                    on_done(done, len(items))
    return refused


def time_calls(cp, family: KernelSpec, calls: list[SweepCall], facts, *, reps: int, warmup: int,
               on_call: Callable[[int, int], None] | None = None,
               checkpoint: Callable[[list[dict], int], None] | None = None) -> list[dict]:
    """GPU-only time of every candidate of every call (module docstring); one sample per candidate
    that ran correctly, and one with "error" for one that did not. checkpoint(samples, calls done)
    after each call: what a sweep stopped later keeps."""

    flush = L2Flusher()
    pre_roll = make_pre_roll(True)
    samples = []
    for i, call in enumerate(calls):
        prob = GemmProblem(cp, call.shape, call.layout, family.dtypes.a, seed=i, c_dtype=family.dtypes.c)
        fns, outs, meta = {}, {}, {}
        for cand in call.timed:
            out = prob.output()
            prob.poison(out)
            params = cand.params()
            # the sizes and loads of the launch this candidate makes (a swap candidate's are the C^T
            # launch's); "call" keys the call itself, whichever way it ran
            p = call.plan_of(cand)
            base = {"family": family.name, "layout": p.layout, "m": p.m, "n": p.n, "k": p.k,
                    "user_layout": call.layout, "kernel": cand.kernel, "config": cand.config,
                    "label": cand.label, "splits": cand.splits, "reduce": cand.reduce, "swap": cand.swap,
                    "variant": variant_of(p.layout, p.call_values),
                    "call": exact_key(family.name, call.plan.layout, call.plan.m, call.plan.n, call.plan.k, True),
                    "call_variant": variant_of(call.plan.layout, call.plan.call_values)}
            try:
                runtime_gemm.clear_last_launch()
                runtime_gemm.gemm(prob.a, prob.b, out, trans_a=prob.trans_a, trans_b=prob.trans_b, params=params,
                     kernel=cand.kernel)
                cp.cuda.Device().synchronize()
                ran = runtime_gemm.last_launch() or {}
            except Exception as exc:  # an AsmError, or a launch failure: the candidate cannot run this call
                text = exc.message if isinstance(exc, AsmError) else f"{type(exc).__name__}: {exc}"
                samples.append({**base, "error": str(text).splitlines()[0] if text else "error"})
                continue
            err = prob.rel_error(out)
            if not err <= family.rel_err_limit:
                samples.append({**base, "error": f"wrong result: relative error {err:.2e}"})
                continue
            outs[cand.label] = out
            meta[cand.label] = {**base, "rel_err": err, "blocks_per_sm": ran.get("blocks_per_sm"),
                                "clusters_at_once": ran.get("clusters_at_once"), "grid": list(ran.get("grid", ()))}
            fns[cand.label] = (lambda cand=cand, out=out, params=params:
                               runtime_gemm.gemm(prob.a, prob.b, out, trans_a=prob.trans_a, trans_b=prob.trans_b,
                                    params=params, kernel=cand.kernel))
        prob.release_reference()
        if fns:
            stats = time_interleaved(fns, reps=reps, warmup=warmup, flush=flush, pre_roll=pre_roll)
            for label, st in stats.items():
                samples.append({**meta[label], "gpu_ms": st.median_ms, "min_ms": st.min_ms,
                                "host_us": st.host_us})
        del prob, outs, fns
        if checkpoint:
            checkpoint(samples, i + 1)
        if on_call:
            on_call(i + 1, len(calls))
    return samples


def sweep(family_name: str, shapes: list[tuple[Shape, str]], *, reps: int = 5, warmup: int = 1, jobs: int = 0,
          exhaustive: bool = False, progress: Callable[[str, int, int], None] | None = None,
          checkpoint: Callable[[dict], None] | None = None) -> dict:
    """The whole sweep on the current GPU: plan, prebuild, time. Returns the samples document
    (fit.py's input): the GPU's facts and one record per timed candidate. checkpoint(document)
    after each timed call, with the calls timed so far ("calls_timed" below "calls"): a sweep run
    under a time limit (`timeout` on the GPU machine) keeps what it measured before the limit."""
    cp = require_gpu("asmgemm tune --sweep")
    facts = device_facts()
    family = get_spec(family_name)
    if not family.configs:
        raise AsmError(f"kernel '{family_name}' has no catalog ([[{family_name}.config]] in {family.spec_file}); "
                       "families with one: " + ", ".join(sorted(n for n, s in _all_specs().items() if s.configs)))
    started = time.time()
    calls = plan_calls(family, shapes, facts, exhaustive)
    refused = prebuild(calls, facts, jobs, (lambda d, t: progress("build", d, t)) if progress else None)

    def document(samples: list[dict], timed: int) -> dict:
        return {"format": 1, "gpu": facts.name, "target": facts.target, "sms": facts.sm_count,
                "clock_hz": facts.clock_hz, "dram_bytes_per_s": facts.dram_bytes_per_s, "family": family_name,
                "calls": len(calls), "calls_timed": timed, "builds_refused": len(refused),
                "seconds": round(time.time() - started, 1), "samples": samples}
    samples = time_calls(cp, family, calls, facts, reps=reps, warmup=warmup,
                         on_call=(lambda d, t: progress("time", d, t)) if progress else None,
                         checkpoint=(lambda done, timed: checkpoint(document(done, timed))) if checkpoint else None)
    return document(samples, len(calls))


def _all_specs():
    return all_specs()
