"""`asmgemm run`: run a spec'd GEMM kernel once on the GPU, check it, time it against cuBLAS
(the work is asmgemm.bench.run_check.run_gemm; this module parses options and renders)."""
from __future__ import annotations

import click
from rich.table import Table

from ..bench.run_check import RunConfig, run_gemm
from ..bench.shapes import MAX_DIM, make_shape
from .common import LAYOUT, emit_json, make_console, parse_defines

# The one bound on M, N and K (bench.shapes.MAX_DIM, also what bench --shapes and tune --shape accept),
# checked while the options are parsed: a typo never reaches the GPU.
_DIM = click.IntRange(1, MAX_DIM)


@click.command("run")
@click.argument("kernel")
@click.option("--m", "m", type=_DIM, required=True, help="Rows of C.")
@click.option("--n", "n", type=_DIM, required=True, help="Columns of C.")
@click.option("--k", "k", type=_DIM, required=True, help="Inner dimension.")
@click.option("--layout", type=LAYOUT, default="nn", show_default=True,
              help="op(A), op(B): n = as stored (row-major), t = transposed.")
@click.option("--alpha", type=float, default=1.0, show_default=True)
@click.option("--beta", type=float, default=0.0, show_default=True)
@click.option("-D", "defines", multiple=True, metavar="NAME=VALUE",
              help="Kernel parameter override (bypasses the tuning cache), e.g. -D BK=16. Repeatable.")
@click.option("--reps", type=click.IntRange(min=1), default=30, show_default=True, help="Timed repetitions (median).")
@click.option("--warmup", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--no-flush", is_flag=True, help="Do not flush L2 between repetitions.")
@click.option("--no-pre-roll", is_flag=True, help="Do not keep the GPU busy before each start event (see bench --help).")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def command(kernel, m, n, k, layout, alpha, beta, defines, reps, warmup, no_flush, no_pre_roll, as_json):
    """Run KERNEL (a kernel spec's name: `asmgemm kernels`) on random M x N x K inputs on the GPU:
    its error against cuBLAS (cupy.matmul in the kernel's dtype) and against a float64
    reference, and its speed against cuBLAS measured in the same run with the benchmark's timer
    (CUDA events around one call each, warm-up, a GPU pre-roll that hides host time, L2 flushed,
    median of --reps, the two interleaved). The correctness run uses --alpha/--beta, the timed
    runs alpha=1, beta=0.

    Exits non-zero when the result is not finite or its relative error against float64 reaches
    the kernel spec's rel_err_limit (sgemm: 1e-4; float32 arithmetic lands far below, TF32 would not).

    \b
    Example:
      asmgemm run sgemm --m 4096 --n 4096 --k 4096
      asmgemm run sgemm --m 3000 --n 5000 --k 700 --layout tn --alpha 0.5 --beta 2 --json
    """
    make_shape(m, n, k, where="--m/--n/--k: ")      # the per-matrix element bound, before the GPU
    params = {k_: int(v) if v.lstrip("-").isdigit() else v for k_, v in parse_defines(defines).items()}
    res = run_gemm(RunConfig(kernel, m, n, k, layout, alpha, beta, tuple(params.items()) if params else None,
                             reps, warmup, not no_flush, not no_pre_roll))
    if as_json:
        emit_json(res)
    else:
        e, t = res["errors"], res["timing"]
        table = Table(title=f"{res['kernel']} ({res['dtype']}) {m}x{n}x{k} {layout} alpha={alpha} beta={beta} "
                            f"on {res['gpu']}")
        for col in ("", "median ms", "TFLOP/s", "max rel err vs cuBLAS", "rel err vs fp64"):
            table.add_column(col, justify="right")
        table.add_row("asmgemm", f"{t['asmgemm']['median_ms']:.4f}", f"{t['asmgemm']['tflops']:.2f}",
                      f"{e['max_rel_err_vs_cublas']:.2e}", f"{e['rel_norm_err_vs_fp64']:.2e}")
        table.add_row("cuBLAS", f"{t['cublas']['median_ms']:.4f}", f"{t['cublas']['tflops']:.2f}", "-",
                      f"{e['cublas_rel_norm_err_vs_fp64']:.2e}")
        make_console().print(table)
        click.echo(f"ratio to cuBLAS: {res['ratio_to_cublas']:.3f}x   {'OK' if res['ok'] else 'WRONG RESULT'}")
    if not res["ok"]:
        raise click.exceptions.Exit(1)
