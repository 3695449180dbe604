"""`asmgemm run` as one library call: run a spec'd kernel once on random inputs, check it against
cuBLAS and a float64 reference, then time it against cuBLAS with the benchmark's timer
(bench/timing.py: interleaved, warm-up, pre-roll, L2 flushed, median)."""
from __future__ import annotations

from dataclasses import dataclass

from ..kernel_spec import get_spec
from ..runtime import gemm as runtime_gemm   # the module: gemm is looked up when called
from ..runtime.gpu import gpu_name, require_gpu
from .timing import L2Flusher, make_pre_roll, tflops, time_interleaved


@dataclass(frozen=True)
class RunConfig:
    kernel: str                    # a kernel spec's name
    m: int
    n: int
    k: int
    layout: str = "nn"
    alpha: float = 1.0
    beta: float = 0.0
    params: tuple[tuple[str, object], ...] | None = None    # -D overrides; None: gemm()'s own choice
    reps: int = 30
    warmup: int = 5
    flush_l2: bool = True
    pre_roll: bool = True
    seed: int = 0


def run_gemm(config: RunConfig) -> dict:
    """The check and the timing, as a JSON-able dict (what `asmgemm run --json` prints); "ok" is
    False when the result is not finite or its error against float64 reaches the spec's limit."""

    spec = get_spec(config.kernel)
    cupy = require_gpu("asmgemm run")
    m, n, k, alpha, beta = config.m, config.n, config.k, config.alpha, config.beta
    params = dict(config.params) if config.params is not None else None
    dtype = cupy.dtype(spec.dtypes.a)
    trans_a, trans_b = config.layout[0] == "t", config.layout[1] == "t"
    rng = cupy.random.default_rng(config.seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k), dtype=cupy.float32).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n), dtype=cupy.float32).astype(dtype)
    c0 = rng.standard_normal((m, n), dtype=cupy.float32).astype(dtype)
    op_a, op_b = (a.T if trans_a else a), (b.T if trans_b else b)

    c = c0.copy()
    runtime_gemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, params=params,
                      kernel=spec.name)
    f64 = cupy.float64
    ref_cublas = (alpha * cupy.matmul(op_a, op_b) + beta * c0).astype(f64)
    ref64 = alpha * cupy.matmul(op_a.astype(f64), op_b.astype(f64)) + beta * c0.astype(f64)
    c64 = c.astype(f64)

    def rel(x, ref):
        return float(cupy.linalg.norm(x - ref)) / (float(cupy.linalg.norm(ref)) or 1.0)

    def max_rel(x, ref):
        return float(cupy.abs(x - ref).max()) / (float(cupy.abs(ref).max()) or 1.0)

    finite = bool(cupy.isfinite(c).all())
    errors = {
        "max_rel_err_vs_cublas": max_rel(c64, ref_cublas),
        "rel_norm_err_vs_cublas": rel(c64, ref_cublas),
        "max_rel_err_vs_fp64": max_rel(c64, ref64),
        "rel_norm_err_vs_fp64": rel(c64, ref64),
        "cublas_rel_norm_err_vs_fp64": rel(ref_cublas, ref64),
        "all_finite": finite,
        "limit": spec.rel_err_limit,
    }
    del ref64, c64, ref_cublas

    out = cupy.empty((m, n), dtype=dtype)
    out_ref = cupy.empty((m, n), dtype=dtype)
    fns = {
        "asmgemm": lambda: runtime_gemm.gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, params=params,
                                             kernel=spec.name),
        "cublas": lambda: cupy.matmul(op_a, op_b, out=out_ref),
    }
    stats = time_interleaved(fns, reps=config.reps, warmup=config.warmup,
                             flush=L2Flusher() if config.flush_l2 else None, pre_roll=make_pre_roll(config.pre_roll))
    flops = 2.0 * m * n * k
    timing = {name: {**s.to_json(), "tflops": tflops(flops, s.median_ms)} for name, s in stats.items()}
    return {"kernel": spec.name, "dtype": spec.dtypes.a, "m": m, "n": n, "k": k, "layout": config.layout,
            "alpha": alpha, "beta": beta, "params": params, "gpu": gpu_name(), "errors": errors,
            "timing": timing, "l2_flush": config.flush_l2,
            "ratio_to_cublas": stats["cublas"].median_ms / stats["asmgemm"].median_ms,
            "ok": finite and errors["rel_norm_err_vs_fp64"] < spec.rel_err_limit}
