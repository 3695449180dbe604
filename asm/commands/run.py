"""`asmgemm run`: run a shipped GEMM once on the GPU, check it, time it against cuBLAS."""
from __future__ import annotations

import click

from .common import emit_json, parse_defines

RUNNABLE = {"sgemm": "float32"}


def _median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def time_pair(cupy, fns: dict, reps: int, warmup: int, min_batch_ms: float = 2.0, *, pre_roll: bool = False,
              max_batch: int = 100) -> dict:
    """Median milliseconds per call, from CUDA events around a batch of back-to-back calls (so the
    host's launch overhead overlaps the device's work, as it does in an application), the
    functions interleaved per repetition so that clock and thermal drift hit both alike. The batch
    size makes one batch last about min_batch_ms (at most max_batch calls). pre_roll queues one
    untimed call before each start event, so the GPU is busy while the host records the event and
    launches the batch: the events then measure device time even for one-call batches."""
    for _ in range(max(1, warmup)):
        for fn in fns.values():
            fn()
    cupy.cuda.Device().synchronize()

    def sample(fn, calls: int) -> float:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        if pre_roll:
            fn()
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / calls

    batch = {name: max(1, min(max_batch, int(min_batch_ms / max(sample(fn, 1), 1e-3) + 0.999)))
             for name, fn in fns.items()}
    samples = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            samples[name].append(sample(fn, batch[name]))
    return {name: {"median_ms": _median(s), "min_ms": min(s), "max_ms": max(s), "reps": len(s),
                   "calls_per_sample": batch[name]}
            for name, s in samples.items()}


def run_case(m: int, n: int, k: int, layout: str, alpha: float, beta: float, params: dict | None,
             reps: int, warmup: int, seed: int = 0) -> dict:
    from ..runtime.gemm import _cupy, gemm
    cupy = _cupy()
    trans_a, trans_b = layout[0] == "t", layout[1] == "t"
    rng = cupy.random.default_rng(seed)
    a = rng.standard_normal((k, m) if trans_a else (m, k), dtype=cupy.float32)
    b = rng.standard_normal((n, k) if trans_b else (k, n), dtype=cupy.float32)
    c0 = rng.standard_normal((m, n), dtype=cupy.float32)
    op_a = a.T if trans_a else a
    op_b = b.T if trans_b else b

    c = c0.copy()
    gemm(a, b, c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, params=params)
    ref32 = alpha * cupy.matmul(op_a, op_b) + beta * c0
    ref64 = alpha * cupy.matmul(op_a.astype(cupy.float64), op_b.astype(cupy.float64)) + beta * c0.astype(cupy.float64)
    c64 = c.astype(cupy.float64)

    def rel(x, ref):
        denom = float(cupy.linalg.norm(ref)) or 1.0
        return float(cupy.linalg.norm(x - ref)) / denom

    def max_rel(x, ref):
        denom = float(cupy.abs(ref).max()) or 1.0
        return float(cupy.abs(x - ref).max()) / denom

    finite = bool(cupy.isfinite(c).all())
    errors = {
        "max_rel_err_vs_cublas": max_rel(c64, ref32.astype(cupy.float64)),
        "rel_norm_err_vs_cublas": rel(c64, ref32.astype(cupy.float64)),
        "max_rel_err_vs_fp64": max_rel(c64, ref64),
        "rel_norm_err_vs_fp64": rel(c64, ref64),
        "cublas_rel_norm_err_vs_fp64": rel(ref32.astype(cupy.float64), ref64),
        "all_finite": finite,
    }
    del ref64, c64

    out = cupy.empty((m, n), dtype=cupy.float32)
    out_ref = cupy.empty((m, n), dtype=cupy.float32)
    fns = {
        "asmgemm": lambda: gemm(a, b, out, trans_a=trans_a, trans_b=trans_b, params=params),
        "cublas": lambda: cupy.matmul(op_a, op_b, out=out_ref),
    }
    times = time_pair(cupy, fns, reps, warmup)
    flops = 2.0 * m * n * k
    for t in times.values():
        t["tflops"] = flops / (t["median_ms"] * 1e-3) / 1e12
    ratio = times["cublas"]["median_ms"] / times["asmgemm"]["median_ms"]
    from ..runtime.gemm import _gpu_name
    return {"m": m, "n": n, "k": k, "layout": layout, "alpha": alpha, "beta": beta,
            "params": params, "gpu": _gpu_name(cupy), "errors": errors, "timing": times,
            "ratio_to_cublas": ratio, "ok": finite and errors["rel_norm_err_vs_fp64"] < 1e-4}


@click.command("run")
@click.argument("kernel", type=click.Choice(sorted(RUNNABLE)))
@click.option("--m", "m", type=click.IntRange(min=1), required=True, help="Rows of C.")
@click.option("--n", "n", type=click.IntRange(min=1), required=True, help="Columns of C.")
@click.option("--k", "k", type=click.IntRange(min=1), required=True, help="Inner dimension.")
@click.option("--layout", type=click.Choice(["nn", "nt", "tn", "tt"]), default="nn", show_default=True,
              help="op(A), op(B): n = as stored (row-major), t = transposed.")
@click.option("--alpha", type=float, default=1.0, show_default=True)
@click.option("--beta", type=float, default=0.0, show_default=True)
@click.option("-D", "defines", multiple=True, metavar="NAME=VALUE",
              help="Kernel parameter override (bypasses the tuning cache), e.g. -D BK=16. Repeatable.")
@click.option("--reps", type=click.IntRange(min=1), default=30, show_default=True, help="Timed repetitions (median).")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def command(kernel, m, n, k, layout, alpha, beta, defines, reps, warmup, as_json):
    """Run KERNEL on random M x N x K inputs on the GPU: its error against cuBLAS (cupy.matmul, fp32)
    and against a float64 reference, and its speed against cuBLAS measured in the same run
    (CUDA events around batches of back-to-back calls, warm-up, median of --reps, the two
    interleaved). The correctness run uses --alpha/--beta, the timed runs alpha=1, beta=0.

    Exits non-zero when the result is not finite or its relative error against float64 is 1e-4
    or more (float32 arithmetic lands far below; TF32 would not).

    \b
    Example:
      asmgemm run sgemm --m 4096 --n 4096 --k 4096
      asmgemm run sgemm --m 3000 --n 5000 --k 700 --layout tn --alpha 0.5 --beta 2 --json
    """
    params = {k_: int(v) if v.lstrip("-").isdigit() else v for k_, v in parse_defines(defines).items()} or None
    res = run_case(m, n, k, layout, alpha, beta, params, reps, warmup)
    if as_json:
        emit_json(res)
    else:
        from rich.console import Console
        from rich.table import Table
        e, t = res["errors"], res["timing"]
        table = Table(title=f"{kernel} {m}x{n}x{k} {layout} alpha={alpha} beta={beta} on {res['gpu']}")
        for col in ("", "median ms", "TFLOP/s", "max rel err vs cuBLAS", "rel err vs fp64"):
            table.add_column(col, justify="right")
        table.add_row("asmgemm", f"{t['asmgemm']['median_ms']:.4f}", f"{t['asmgemm']['tflops']:.2f}",
                      f"{e['max_rel_err_vs_cublas']:.2e}", f"{e['rel_norm_err_vs_fp64']:.2e}")
        table.add_row("cuBLAS", f"{t['cublas']['median_ms']:.4f}", f"{t['cublas']['tflops']:.2f}", "-",
                      f"{e['cublas_rel_norm_err_vs_fp64']:.2e}")
        Console().print(table)
        click.echo(f"ratio to cuBLAS: {res['ratio_to_cublas']:.3f}x   {'OK' if res['ok'] else 'WRONG RESULT'}")
    if not res["ok"]:
        raise click.exceptions.Exit(1)
