"""A kernel's tuning space: enumerate the `.tune` choices, build every candidate with ptxas in
parallel on the CPU, and prune those that cannot win or cannot run.

A candidate is pruned, with the reason kept for the report, when
  error         the build stopped: the kernel's own `.error` for an invalid combination, or ptxas
                rejected it (e.g. more than 48 KB of static shared memory);
  spills        ptxas spilled registers (spill stores or loads);
  local memory  a stack frame or local memory without spills (an array indexed at run time);
  threads       more threads per block than the target allows;
  registers     registers x threads per block exceed the SM's register file: it cannot launch;
  shared memory more shared memory per block than the opt-in maximum;
  duplicate     ptxas got the same PTX as an earlier candidate (the parameter changed nothing).

Everything here runs without a GPU; `asmgemm tune --dry-run` is this module plus a table.
"""
from __future__ import annotations

import hashlib
import itertools
import multiprocessing
import os
import re
import signal
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable

from ..errors import AsmError
from ..isa.arch import arch_for, blocks_per_sm
from ..pipeline import BuildOptions, assemble, build_file

MAX_CANDIDATES = 4096

PRUNE_REASONS = ("error", "spills", "local memory", "threads", "registers", "shared memory", "duplicate")


def format_value(v) -> str:
    """A tunable value as -D text."""
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def enumerate_space(tunables: dict[str, list], fixed: dict[str, str] | None = None,
                    limit: int = MAX_CANDIDATES) -> list[dict[str, object]]:
    """The cartesian product of the declared choices, in declaration order (the last parameter varies
    fastest). Parameters given in `fixed` (the user's -D) are not varied."""
    fixed = fixed or {}
    names = [n for n in tunables if n not in fixed]
    count = 1
    for n in names:
        count *= len(tunables[n])
    if count > limit:
        sizes = " x ".join(f"{n}:{len(tunables[n])}" for n in names)
        raise AsmError(f"the tuning space has {count} candidates ({sizes}), more than the limit of {limit}",
                       hint="fix some parameters with -D NAME=VALUE, or raise --max-candidates")
    return [dict(zip(names, combo)) for combo in itertools.product(*(tunables[n] for n in names))]


@dataclass
class Candidate:
    index: int
    params: dict[str, object]
    status: str = "pending"             # ok | pruned
    reason: str | None = None           # one of PRUNE_REASONS when pruned
    detail: str = ""
    kernels: list[dict] = field(default_factory=list)   # ptxas -v figures per entry + threads/occupancy
    ptx_hash: str = ""
    build_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def label(self) -> str:
        return " ".join(f"{k}={format_value(v)}" for k, v in self.params.items()) or "(defaults)"

    def figure(self, key: str) -> int | None:
        """The worst (largest) value of a ptxas figure over the candidate's entries."""
        vals = [k[key] for k in self.kernels if key in k and k[key] is not None]
        return max(vals) if vals else None

    def to_json(self) -> dict:
        return {"index": self.index, "params": self.params, "status": self.status, "reason": self.reason,
                "detail": self.detail, "kernels": self.kernels, "build_s": round(self.build_s, 3)}


_ENTRY_RE = re.compile(r"\.entry\s+([A-Za-z_$%][\w$%]*)\s*\(")
_NTID_RE = re.compile(r"\.(maxntid|reqntid)\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?")


def threads_per_entry(ptx: str) -> dict[str, int | None]:
    """Threads per block each entry declares (.reqntid or .maxntid, product of the dimensions), or
    None when it declares neither (then the launch decides, and we cannot check it here)."""
    out: dict[str, int | None] = {}
    matches = list(_ENTRY_RE.finditer(ptx))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(ptx)
        body_start = ptx.find("{", m.end(), end)
        head = ptx[m.end(): body_start if body_start >= 0 else end]
        # the parameter list ends at the first ')' followed by performance directives or '{'
        close = head.find(")")
        directives = head[close + 1:] if close >= 0 else ""
        nt = _NTID_RE.search(directives)
        if nt:
            dims = [int(g) for g in nt.groups()[1:] if g is not None]
            total = 1
            for d in dims:
                total *= d
            out[m.group(1)] = total
        else:
            out[m.group(1)] = None
    return out


# Dynamic shared memory is sized at launch, so ptxas cannot report it: the build's constant that
# holds it (a kernel spec's launch.smem_bytes; SMEM_BYTES for a .sasm without a spec) is added to
# ptxas's static figure for every entry.
DEFAULT_SMEM_CONSTANT = "SMEM_BYTES"


def dynamic_shared_bytes(constants: dict, smem_constant: str = DEFAULT_SMEM_CONSTANT) -> int:
    value = constants.get(smem_constant, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


@dataclass(frozen=True)
class BuildJob:
    index: int
    source: str
    params: dict
    base_defines: dict
    target: str | None
    include_dirs: tuple = ()
    smem_constant: str = DEFAULT_SMEM_CONSTANT


def build_one(job: BuildJob) -> Candidate:
    """Build and ptxas one candidate; never raises for a user error (the error becomes the verdict).
    A top-level function so that worker processes can receive it."""
    cand = Candidate(job.index, dict(job.params))
    t0 = time.perf_counter()
    defines = dict(job.base_defines)
    defines.update({k: format_value(v) for k, v in job.params.items()})
    try:
        result = build_file(job.source, BuildOptions(defines=defines, target=job.target,
                                                     include_dirs=list(job.include_dirs)))
        cand.ptx_hash = hashlib.sha256(result.ptx.encode()).hexdigest()[:16]
        asm = assemble(result)
        threads = threads_per_entry(result.ptx)
        dynamic = dynamic_shared_bytes(result.constants, job.smem_constant)
        limits = arch_for(result.target).limits
        for k in asm.kernels:
            d = k.to_json()
            d["threads"] = threads.get(k.name)
            d["dynamic_shared_bytes"] = dynamic
            d["total_shared_bytes"] = k.shared_bytes + d["dynamic_shared_bytes"]
            if d["threads"]:
                d["occupancy"] = blocks_per_sm(limits, d["threads"], k.registers, d["total_shared_bytes"])
            cand.kernels.append(d)
        cand.reason, cand.detail = prune_verdict(cand.kernels, limits)
    except AsmError as exc:
        cand.reason = "error"
        cand.detail = _one_line(exc)
    except Exception as exc:  # a bug in a stage; report it per candidate instead of killing the tune
        cand.reason = "error"
        cand.detail = f"internal error: {type(exc).__name__}: {exc}"
    cand.status = "pruned" if cand.reason else "ok"
    cand.build_s = time.perf_counter() - t0
    return cand


def _one_line(exc: AsmError) -> str:
    where = ""
    if exc.span is not None:
        where = f"{os.path.basename(exc.span.path)}:{exc.span.line}: "
    return where + exc.message.splitlines()[0]


def prune_verdict(kernels: list[dict], limits) -> tuple[str | None, str]:
    """(reason, detail) for the first limit a candidate's entries break, or (None, '')."""
    for k in kernels:
        name = k["name"]
        if k.get("spill_stores", 0) or k.get("spill_loads", 0):
            return "spills", f"{name}: {k['spill_stores']} bytes spill stores, {k['spill_loads']} bytes spill loads"
        if k.get("stack_frame", 0) or k.get("local_bytes", 0):
            return "local memory", f"{name}: {k.get('stack_frame', 0)} bytes stack frame, {k.get('local_bytes', 0)} bytes local"
        threads = k.get("threads")
        if threads and threads > limits.max_threads_per_block:
            return "threads", f"{name}: {threads} threads per block > {limits.max_threads_per_block}"
        shared = k.get("total_shared_bytes", k.get("shared_bytes", 0))
        if shared > limits.shared_per_block_optin:
            return "shared memory", f"{name}: {shared} bytes > {limits.shared_per_block_optin} per block"
        occ = k.get("occupancy")
        if occ is not None and occ["registers"] == 0:
            return "registers", (f"{name}: {k['registers']} registers x {threads} threads exceed the "
                                 f"{limits.registers_per_sm}-register file")
    return None, ""


def mark_duplicates(cands: list[Candidate]) -> None:
    """Candidates whose PTX equals an earlier surviving one's cannot time differently: prune them."""
    first: dict[str, Candidate] = {}
    for c in sorted(cands, key=lambda c: c.index):
        if not c.ok or not c.ptx_hash:
            continue
        if c.ptx_hash in first:
            c.status, c.reason = "pruned", "duplicate"
            c.detail = f"same PTX as #{first[c.ptx_hash].index} ({first[c.ptx_hash].label()})"
        else:
            first[c.ptx_hash] = c


def default_jobs() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return max(1, os.cpu_count() or 1)


def _pool_context():
    # fork starts workers in milliseconds; the workers only run Python and ptxas, never CUDA, so
    # forking a parent that holds a CUDA context is safe. Elsewhere, the platform default.
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return None


def _ignore_sigint():
    # Ctrl-C is the parent's to handle (it cancels the pool); workers finish their build quietly
    # instead of each printing a KeyboardInterrupt traceback.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def build_candidates(jobs_list: list[BuildJob], jobs: int = 0,
                     on_done: Callable[[Candidate], None] | None = None) -> list[Candidate]:
    """Build all candidates, `jobs` at a time (0: one per CPU). On KeyboardInterrupt, pending builds
    are cancelled and running ones abandoned before the interrupt propagates."""
    jobs = jobs or default_jobs()
    results: list[Candidate] = []
    if jobs == 1 or len(jobs_list) <= 1:
        for job in jobs_list:
            c = build_one(job)
            results.append(c)
            if on_done:
                on_done(c)
    else:
        pool = ProcessPoolExecutor(max_workers=min(jobs, len(jobs_list)), mp_context=_pool_context(),
                                   initializer=_ignore_sigint)
        try:
            pending: set[Future] = {pool.submit(build_one, job) for job in jobs_list}
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    c = fut.result()
                    results.append(c)
                    if on_done:
                        on_done(c)
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown(wait=True)
    results.sort(key=lambda c: c.index)
    mark_duplicates(results)
    return results


def summarize_pruning(cands: list[Candidate]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for c in cands:
        if not c.ok:
            counts[c.reason or "error"] = counts.get(c.reason or "error", 0) + 1
    return counts
