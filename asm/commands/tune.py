"""`asmgemm tune`: search a kernel's declared parameter space for one problem shape."""
from __future__ import annotations

import sys

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..bench.shapes import parse_shape
from ..bench.timing import tflops
from ..runtime.tune_cache import shape_bucket
from ..tuning.workflow import Progress as Callbacks, TuneConfig, tune
from .bench import _num
from .common import LAYOUT, emit_json, make_console, parse_defines, source_options
from .tune_sweep import run_sweep_or_fit


@click.command("tune")
@click.argument("kernel")
@click.option("--shape", "shape_text", default=None, metavar="M,N,K",
              help="The problem to tune for (e.g. 4096,4096,4096). Not with --sweep/--fit.")
@click.option("--layout", default="nn", show_default=True, type=LAYOUT,
              help="Storage of A and B: first letter A, second B; n = as is, t = stored transposed.")
@click.option("--dry-run", is_flag=True,
              help="Build every candidate and list it with its ptxas figures and verdict; no GPU needed, nothing saved.")
@click.option("--jobs", "-j", type=click.IntRange(0, 256), default=0, show_default="one per CPU",
              help="Candidates built in parallel (ptxas runs on the CPU).")
@click.option("--reps", type=click.IntRange(1, 10000), default=20, show_default=True,
              help="Timed repetitions per candidate (interleaved; the median decides).")
@click.option("--warmup", type=click.IntRange(0, 1000), default=3, show_default=True, help="Untimed calls per candidate first.")
@click.option("--no-flush", is_flag=True, help="Do not flush L2 between repetitions.")
@click.option("--no-pre-roll", is_flag=True, help="Do not keep the GPU busy before each start event (see bench --help).")
@click.option("--max-candidates", type=click.IntRange(1, 1 << 20), default=4096, show_default=True,
              help="Refuse spaces larger than this (fix parameters with -D to shrink one).")
@click.option("--no-save", is_flag=True, help="Time and report, but leave the tuning cache alone.")
@click.option("--top", type=click.IntRange(1, 10000), default=10, show_default=True, help="Rows in the timing table.")
@click.option("--json", "as_json", is_flag=True, help="Print every candidate, verdict and timing as JSON.")
@click.option("--sweep", "sweep_shapes", default=None, metavar="SHAPES",
              help="Instead of one shape: time KERNEL's whole catalog (a family with [[KERNEL.config]] tables, "
                   "e.g. sgemm) over SHAPES (as bench --shapes: presets, random:SEED:COUNT[:ALIGN], MxNxK, a file; "
                   "each shape in --layout unless it carries its own), fit the cost model to the timings and "
                   "write this GPU's dispatch database (--out). Needs a GPU.")
@click.option("--fit", "fit_files", multiple=True, type=click.Path(dir_okay=False), metavar="SAMPLES.json",
              help="Fit the cost model to saved sweep samples (repeatable; `--sweep --samples` writes them) and "
                   "write the dispatch database (--out); no GPU needed.")
@click.option("--exhaustive", is_flag=True,
              help="With --sweep: time every candidate of every shape, not only each configuration unsplit and "
                   "its best splits by the current model (for the shapes whose exact hits matter, e.g. presets).")
@click.option("--samples", "samples_out", default=None, type=click.Path(dir_okay=False),
              help="With --sweep: also keep the raw timings here (fit them again later with --fit).")
@click.option("--out", "db_out", default=None, type=click.Path(dir_okay=False),
              help="Where --sweep/--fit write the database. Default: <slug>.json in $ASMGEMM_DISPATCH_DIR "
                   "(~/.cache/asmgemm/dispatch), where asmgemm.gemm looks first.")
@source_options
def command(kernel, shape_text, layout, dry_run, jobs, reps, warmup, no_flush, no_pre_roll, max_candidates, no_save,
            top, as_json, sweep_shapes, fit_files, exhaustive, samples_out, db_out, defines, target, include_dirs):
    """Tune KERNEL (a shipped kernel name or a .sasm file) for one shape.

    \b
    1. enumerate the space the source declares with `.tune NAME in choices(...)` lines
       (-D NAME=VALUE fixes a parameter instead);
    2. build every candidate in parallel on the CPU with ptxas, and drop those that stop at an
       `.error`, spill, use local memory, or exceed the SM's threads/registers/shared memory
       (the reason is shown for each);
    3. check each survivor's result on the GPU against a float64 reference, then time the
       survivors and untuned asmgemm.gemm (the catalog's pick, or the defaults and size rule: the
       'default' row)
       interleaved (CUDA events, L2 flushed, median);
    4. store the fastest in the tuning cache under (GPU, dtype, layout, shape bucket: each
       dimension rounded up to a power of two), where asmgemm.gemm finds it; never a choice
       slower than untuned gemm() (then the cache is left as it was).

    The cache is written once, atomically, at the end: Ctrl-C at any point leaves it as it was.
    The cache file is $ASMGEMM_TUNE_CACHE, or tune.json in $ASMGEMM_CACHE_DIR or ~/.cache/asmgemm.

    \b
    Examples:
      asmgemm tune sgemm --shape 4096,4096,4096 --dry-run
      asmgemm tune sgemm --shape 3000,5000,700 --layout nt -j 16
      asmgemm tune my.sasm --shape 1024,1024,1024 --dry-run -D BK=16
      asmgemm tune sgemm --sweep random:1:60 --samples sweep.json     # this GPU's dispatch database
      asmgemm tune sgemm --fit sweep.json --fit more.json --out h100.json
    """
    if sweep_shapes is not None or fit_files:
        if shape_text is not None or dry_run:
            raise click.UsageError("--sweep/--fit take no --shape or --dry-run")
        run_sweep_or_fit(kernel, sweep_shapes, fit_files, layout, jobs, reps, warmup, samples_out, db_out, as_json,
                         exhaustive)
        return
    if shape_text is None:
        raise click.UsageError("give --shape M,N,K (or --sweep SHAPES to sweep a family's catalog)")

    config = TuneConfig(kernel, parse_shape(shape_text, "--shape: "), layout, dry_run, jobs, reps, warmup,
                        not no_flush, not no_pre_roll, max_candidates, not no_save,
                        tuple(parse_defines(defines).items()), target, tuple(include_dirs))
    try:
        result = _run_with_progress(tune, config)
    except KeyboardInterrupt:
        click.echo("interrupted: the tuning cache was not changed", err=True)
        sys.exit(130)
    if result.moved_corrupt_cache:
        click.echo(f"asmgemm: warning: the old tuning cache was not readable; moved it to "
                   f"{result.moved_corrupt_cache}", err=True)
    if as_json:
        emit_json(result.report)
    elif dry_run:
        _print_candidates(result.candidates, result.target)
        _print_prune_summary(result.candidates, result.report["pruned"])
    else:
        _print_candidates(result.candidates, result.target, only_pruned=True)
        _print_trials(result.outcome, config.shape, top, result.report["gpu"])
        _print_prune_summary(result.candidates, result.report["pruned"])
        _print_outcome(result.outcome, config.shape, result.report)


def _reasons(pruned: dict) -> str:
    return ", ".join(f"{n} {r}" for r, n in pruned.items()) or "none"


def _run_with_progress(tune, config):
    """tune(config) with one progress bar for the builds, then one for the GPU checks and timing."""

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=make_console(stderr=True), transient=True) as bars:
        tasks = {}

        def stage(what, total):
            text = "building candidates" if what == "build" else "checking candidates on the GPU"
            tasks[what] = bars.add_task(text, total=total)

        def gpu_step(what):
            if what == "timing":
                bars.update(tasks["gpu"], description="timing candidates interleaved")
            bars.advance(tasks["gpu"])

        return tune(config, Callbacks(stage, lambda cand: bars.advance(tasks["build"]), gpu_step))


def _print_candidates(cands, target, only_pruned=False):
    rows = [c for c in cands if not (only_pruned and c.ok)]
    if not rows:
        return
    t = Table(title=f"{'pruned ' if only_pruned else ''}candidates ({target}; ptxas -v figures, worst entry)",
              title_justify="left")
    for col in ("#", "parameters", "verdict", "regs", "spill st/ld", "stack", "smem", "threads", "blocks/SM", "build s"):
        t.add_column(col, justify="left" if col in ("parameters", "verdict") else "right",
                     overflow="fold" if col == "parameters" else "ellipsis", no_wrap=col != "parameters")
    for c in rows:
        verdict = "[green]ok[/]" if c.ok else f"[red]{c.reason}[/]"
        occ = [k["occupancy"]["resident"] for k in c.kernels if k.get("occupancy")]
        t.add_row(str(c.index), c.label(), verdict, _fig(c, "registers"),
                  f"{_fig(c, 'spill_stores')}/{_fig(c, 'spill_loads')}", _fig(c, "stack_frame"),
                  _fig(c, "total_shared_bytes"), _fig(c, "threads"), str(min(occ)) if occ else "-", f"{c.build_s:.2f}")
    con = make_console()
    con.print(t)
    for c in rows:
        if not c.ok:
            con.print(f"  #{c.index} [red]{c.reason}[/]: {c.detail}", highlight=False)


def _fig(c, key):
    v = c.figure(key)
    return "-" if v is None else str(v)


def _print_prune_summary(cands, pruned):
    ok = sum(c.ok for c in cands)
    make_console().print(f"candidates: {len(cands)}, survivors: {ok}, pruned: {len(cands) - ok}"
                    + (f" ({_reasons(pruned)})" if pruned else ""))


def _print_trials(outcome, shape, top, gpu):
    timed = sorted([t for t in outcome.trials if t.stats], key=lambda t: t.stats.median_ms)
    failed = [t for t in outcome.trials if t.error]
    t = Table(title=f"timed on {gpu}: {shape.key}, TFLOP/s median (min–max)", title_justify="left")
    for col in ("rank", "candidate", "parameters", "TFLOP/s", "ms", "speed vs default", "rel err"):
        t.add_column(col, justify="left" if col in ("candidate", "parameters") else "right")
    base = outcome.default.stats.median_ms if outcome.default and outcome.default.stats else None
    for rank, tr in enumerate(timed[:top], 1):
        s = tr.stats
        vs = f"{base / s.median_ms:.3f}×" if base else "-"
        t.add_row(str(rank), tr.name, _params_text(tr.params),
                  f"{_num(tflops(shape.flops, s.median_ms))} [dim]({_num(tflops(shape.flops, s.max_ms))}–"
                  f"{_num(tflops(shape.flops, s.min_ms))})[/]",
                  f"{s.median_ms:.4f}", vs, f"{tr.rel_err:.1e}" if tr.rel_err is not None else "-")
    con = make_console()
    con.print(t)
    for tr in failed:
        con.print(f"[red]{tr.name}[/] ({_params_text(tr.params)}): {tr.error}")


def shape_bucket_text(shape):
    return f"the shape bucket {shape_bucket(shape.m, shape.n, shape.k)}"


def _params_text(params):
    if params is None:
        return "(gemm's untuned choice)"
    return " ".join(f"{k}={v}" for k, v in params.items())


def _print_outcome(outcome, shape, report):
    con = make_console()
    best, default = outcome.best, outcome.default
    con.print(f"best: {best.name} {_params_text(best.params)}: {best.tflops(shape):.3g} TFLOP/s")
    if default and default.stats:
        gain = outcome.gain()
        con.print(f"default (gemm untuned): {default.tflops(shape):.3g} TFLOP/s; "
                  f"gain of the best over it: {gain:+.1%}")
    elif default:
        con.print(f"default: did not run ({default.error})")
    if report["stored"]:
        con.print(f"saved to the tuning cache {report['cache']} under {shape_bucket_text(shape)}")
    else:
        con.print(f"tuning cache not changed: {report['not_stored_because']}")
