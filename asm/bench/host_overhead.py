"""Host overhead of one call: `asmgemm.gemm` against `cupy.matmul` (cuBLAS) on the same small
problem, repeated many times, timed on the host (`asmgemm bench --host-overhead`).

What a repeated call costs the calling thread (Python, argument checks, the launch plan, the
launch itself) is what limits small GEMMs in a loop. Each call is timed alone with
time.perf_counter_ns; the calls run in blocks of BLOCK per implementation, the implementations
alternating block by block (drift hits all alike), with the GPU drained before each block, so the
launch queue (about a thousand launches deep) never fills and blocks the host: the numbers are the
host's, not the GPU's. The report counts the blocks after which the GPU still had more than a
tenth of the block's time to work off (gpu_bound_blocks): there the GPU, not the host, was the
slower side, and a longer block would have started to measure it.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from ..runtime import gemm as runtime_gemm   # the module: gemm is looked up when called
from ..runtime.gpu import gpu_name
from .problem import GemmProblem
from .shapes import Shape

BLOCK = 500


@dataclass
class HostTiming:
    """Host time per call, microseconds."""

    mean_us: float
    median_us: float
    p90_us: float
    min_us: float
    calls: int
    gpu_bound_blocks: int = 0       # blocks the GPU finished well after the host: see the module docstring
    samples_ns: list[int] = field(default_factory=list, repr=False)

    def to_json(self) -> dict:
        return {"mean_us": round(self.mean_us, 3), "median_us": round(self.median_us, 3),
                "p90_us": round(self.p90_us, 3), "min_us": round(self.min_us, 3), "calls": self.calls,
                "gpu_bound_blocks": self.gpu_bound_blocks}


def summarize_ns(samples_ns: list[int], gpu_bound_blocks: int = 0) -> HostTiming:
    if not samples_ns:
        raise ValueError("no host timing samples")
    us = sorted(s / 1000.0 for s in samples_ns)
    return HostTiming(statistics.fmean(us), statistics.median(us), us[min(len(us) - 1, int(0.9 * len(us)))], us[0],
                      len(us), gpu_bound_blocks, list(samples_ns))


def time_host(fns: dict[str, Callable[[], object]], calls: int, synchronize: Callable[[], None],
              warmup: int = 50, block: int = BLOCK, clock: Callable[[], int] = time.perf_counter_ns
              ) -> dict[str, HostTiming]:
    """Host time of each call of each callable, `calls` calls each (see the module docstring)."""
    if calls < 1:
        raise ValueError("calls must be >= 1")
    names = list(fns)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    synchronize()
    samples: dict[str, list[int]] = {n: [] for n in names}
    gpu_bound = dict.fromkeys(names, 0)
    done, turn = 0, 0
    while done < calls:
        size = min(block, calls - done)
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            fn, out = fns[name], samples[name]
            synchronize()
            start = clock()
            for _ in range(size):
                t0 = clock()
                fn()
                out.append(clock() - t0)
            t1 = clock()
            synchronize()
            if clock() - t1 > (t1 - start) / 10:
                gpu_bound[name] += 1
        done += size
        turn += 1
    return {n: summarize_ns(samples[n], gpu_bound[n]) for n in names}


def measure_host_overhead(cp, m: int, n: int, k: int, *, kernel=None, calls: int = 10000, torch=None,
                          warmup: int = 50, seed: int = 0) -> dict:
    """asmgemm.gemm(a, b, c) and cupy.matmul(a, b, out=c) (and with torch: gemm on torch tensors and
    torch.matmul) on one M x N x K problem of the kernel's dtype, `calls` calls each, as a JSON-able
    report with the overhead of asmgemm over cuBLAS."""

    name = kernel.name if kernel is not None else None
    dtype = kernel.dtypes.a if kernel is not None else "float32"
    prob = GemmProblem(cp, Shape(m, n, k), "nn", dtype, seed=seed, c_dtype=kernel.dtypes.c if kernel else None)
    a, b = prob.a, prob.b
    c_asm, c_ref = prob.output(), prob.output()
    fns = {"asmgemm": lambda: runtime_gemm.gemm(a, b, c_asm, kernel=name),
           "cublas": lambda: prob.cublas(c_ref)}       # cupy.matmul (cublasGemmEx for an fp32 C of 16-bit A, B)
    if torch is not None and prob.c_dtype == prob.dtype:
        ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
        tc_asm, tc_ref = torch.from_dlpack(prob.output()), torch.from_dlpack(prob.output())
        fns["asmgemm (torch)"] = lambda: runtime_gemm.gemm(ta, tb, tc_asm, kernel=name)
        fns["torch"] = lambda: torch.matmul(ta, tb, out=tc_ref)

    def synchronize():
        cp.cuda.Device().synchronize()
    timings = time_host(fns, calls, synchronize, warmup=warmup)
    ref = timings["cublas"]
    report = {"gpu": gpu_name(), "kernel": name or "(by dtype)", "dtype": dtype, "m": m, "n": n, "k": k,
              "calls": calls, "host_us": {i: t.to_json() for i, t in timings.items()},
              "overhead_over_cublas_us": {i: {"mean": round(t.mean_us - ref.mean_us, 3),
                                              "median": round(t.median_us - ref.median_us, 3)}
                                          for i, t in timings.items() if i != "cublas"}}
    if "torch" in timings:
        report["overhead_over_torch_us"] = {
            "asmgemm (torch)": round(timings["asmgemm (torch)"].mean_us - timings["torch"].mean_us, 3)}
    return report
