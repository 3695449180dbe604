"""`asmgemm bench`: correctness, then TFLOP/s against cuBLAS (and torch), per kernel/layout/shape,
timed three ways (call, gpu, loop: asm/bench/timing.py)."""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..bench import baseline as bl, batched
from ..bench.host_overhead import measure_host_overhead
from ..bench.plot import load_report, peak_tflops, plot_format, render, require_matplotlib
from ..bench.runner import BenchRow, bench_one, resolve_params, summarize, torch_module
from ..bench.shapes import LAYOUTS, parse_layouts, parse_shapes
from ..bench.timing import MODES, L2Flusher, make_pre_roll, tflops
from ..bench.triton_ref import TRITON_MMA, triton_available
from ..errors import AsmError
from ..files import check_outputs, write_files
from ..kernel_spec import get_spec, load_spec_file, shipped_spec_file
from ..runtime.gpu import device_facts, gpu_name, require_gpu
from ..runtime.tune_cache import lookups_off
from ..version import __version__
from .common import emit_json, make_console, parse_defines

EXIT_WRONG = 2
EXIT_REGRESSED = 3


@click.command("bench")
@click.argument("kernels", nargs=-1, metavar="[KERNEL]...")
@click.option("--shapes", "shapes_spec", default=None, metavar="PRESET|SHAPES|FILE",
              help="Presets (square, odd, transformer, linear, small), random:SEED:COUNT[:ALIGN] (COUNT random "
                   "shapes, M, N, K log-uniform in 1..16384 rounded up to multiples of ALIGN, 2^18 <= M·N·K <= 2^36, "
                   "each with a random layout; the same for the same SEED), MxNxK shapes, comma-separated "
                   "('square,3000x5000x700'); or a file with one 'M N K [label]' per line or a JSON list. "
                   "Shapes of 'linear' (nt) and 'random' carry their own layout: --layouts does not apply to them. "
                   "'attention' and 'moe' are issue 33's batched and grouped sets (asm/bench/batched.py: "
                   "attention's Q.K^T and P.V against torch.matmul, a mixture of experts' grouped GEMM against "
                   "torch._grouped_mm or a loop of torch.matmul), each alone. "
                   "Default: square (with --host-overhead: 128x128x128).")
@click.option("--layouts", "layouts_spec", default="nn", show_default=True, metavar="nn,nt,tn,tt|all",
              help="Storage of A and B: first letter A, second B; n = as is, t = stored transposed.")
@click.option("--reps", type=click.IntRange(1, 10000), default=20, show_default=True,
              help="Timed repetitions per implementation; the table shows their median, min and max.")
@click.option("--warmup", type=click.IntRange(0, 1000), default=3, show_default=True,
              help="Untimed calls per implementation before timing (module load, handle creation).")
@click.option("--no-flush", is_flag=True,
              help="Do not flush L2 between repetitions (then small shapes are timed from cache).")
@click.option("--no-pre-roll", is_flag=True,
              help="gpu column: do not keep the GPU busy before each start event (then the host time of each "
                   "call, Python and launch, counts in small shapes' gpu timings too). The call column never has "
                   "a pre-roll, the loop column needs none.")
@click.option("--loop-calls", type=click.IntRange(0, 100000), default=200, show_default=True,
              help="Back-to-back calls between the two events of one loop measurement (0: no loop column).")
@click.option("--no-torch", is_flag=True, help="Leave torch.matmul (and Triton) out even when importable.")
@click.option("--no-triton", is_flag=True,
              help="Leave out the Triton reference (a plain IEEE-fp32 Triton matmul, one fixed config, "
                   "run when Triton and torch are installed).")
@click.option("--triton-mma", is_flag=True,
              help="Add a column for Triton's own mma.sync path (16-bit operands): the Triton reference's "
                   "kernel compiled with DISABLE_MMA_V3=1 (its PTX checked: mma.sync, no wgmma), autotuned over "
                   "10 configurations per shape and layout before timing (seconds each), and asm/triton-mma, "
                   "asmgemm's ratio to it (issue 31's anchor for hgemm_mma). Needs Triton and torch; left out "
                   "with a warning where they are not installed.")
@click.option("-D", "defines", multiple=True, metavar="NAME=VALUE",
              help="Run the kernel with this parameter override (repeatable), instead of its defaults/tuned values.")
@click.option("--defaults", "use_defaults", is_flag=True,
              help="Ignore the tuning cache: run what asmgemm.gemm runs untuned (the catalog's pick by the "
                   "cost model, or a kernel's defaults and size rule).")
@click.option("--json", "json_out", is_flag=False, flag_value="-", default=None, metavar="[OUT]",
              help="Write every number as JSON to OUT, or to standard output (instead of the table) "
                   "when OUT is left out.")
@click.option("--save-baseline", is_flag=True,
              help="Store the ratios to cuBLAS as this GPU model's baseline (merged into the existing "
                   "file). Implies --defaults, so a baseline does not depend on a local tuning cache.")
@click.option("--check-baseline", is_flag=True,
              help="Compare the ratios with this GPU's baseline (implies --defaults); exit 3 when one dropped "
                   "more than the tolerance.")
@click.option("--baseline-dir", type=click.Path(file_okay=False), default=None,
              help="Folder of baseline files. Default: $ASMGEMM_BASELINE_DIR, else tests/perf/baselines of the checkout.")
@click.option("--tolerance", type=click.FloatRange(0, 1, max_open=True), default=None,
              help="Allowed relative drop of the ratio for --check-baseline (default: the baseline file's, 0.05).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random operands.")
@click.option("--plot", "plot_out", default=None, metavar="FILE.png|svg|pdf",
              help="Also draw the run into FILE, two panels over the problem's FLOPs: asmgemm's call-time ratio "
                   "to the faster cuBLAS path per shape (the 5 slowest labelled), and TFLOP/s with the GPU's peak "
                   "per dtype. Needs matplotlib: pip install 'asmgemm[plot]'.")
@click.option("--from", "from_json", default=None, type=click.Path(dir_okay=False), metavar="RESULT.json",
              help="With --plot: draw a stored result (written by --json OUT) instead of running; no GPU needed.")
@click.option("--host-overhead", is_flag=True,
              help="Measure the host time of one call instead: --calls repeated calls of asmgemm.gemm and of "
                   "cupy.matmul (and torch) on the first shape (default 128x128x128), in us/call.")
@click.option("--calls", type=click.IntRange(1, 10_000_000), default=10000, show_default=True,
              help="Calls per implementation for --host-overhead.")
def command(kernels, shapes_spec, layouts_spec, reps, warmup, no_flush, no_pre_roll, loop_calls, no_torch, no_triton,
            triton_mma, defines, use_defaults,
            json_out, save_baseline, check_baseline, baseline_dir, tolerance, seed, plot_out, from_json, host_overhead,
            calls):
    """Benchmark KERNELs (kernel spec names, `asmgemm kernels`; default: every kernel that ships in
    kernels_ptx/kernels.toml, runs on this GPU and takes dtypes CuPy has) against cuBLAS on the GPU.

    For each kernel, layout and shape: the result is checked against a float64 reference
    (‖C − ref‖/‖ref‖, NaN-poisoned output first); then asmgemm, cuBLAS (cupy.matmul; for an fp32
    C of 16-bit A and B, cublasGemmEx with those types) and torch.matmul (if installed; TF32 off;
    not for such mixed types) are timed interleaved in this process: CUDA events,
    warm-up, L2 flushed before every repetition, the median of --reps with min and max, three ways:

    \b
      call  the headline: what a caller waits for. Events around ONE call started on an idle GPU
            (synchronized; L2 flushed and synchronized again), so the call's host time (Python,
            argument checks, the launch) counts, as it does for torch.
      gpu   device time: before each start event a one-thread kernel keeps the GPU busy for twice
            the call's host time (the pre-roll; --no-pre-roll turns it off), so the events measure
            the kernel, not Python.
      loop  throughput: --loop-calls back-to-back calls between one pair of events, per call (the
            host and the GPU overlap; the slower one sets the rate); up to 3 loops, no flush inside.

    The table gives TFLOP/s (2·M·N·K / median call time), asm/best: the call-time ratio of asmgemm
    to the faster of cupy.matmul and torch.matmul (both cuBLAS, with different heuristics; without
    torch, to cupy.matmul) and the same ratio for gpu and loop beside it. Last lines sum the run up
    per mode: the geometric mean of that ratio, the shapes under 0.9x and 0.7x, the slowest; per
    operand dtype too when the run has several (the JSON's "summary"). Baselines store the gpu
    ratio to cupy.matmul.

    Exit status: 0 all correct; 1 usage error or no GPU; 2 a kernel gave a wrong result;
    3 --check-baseline found a regression.

    \b
    Examples:
      asmgemm bench                                   # sgemm, square 1024..8192, nn
      asmgemm bench sgemm --shapes odd --layouts all --reps 50
      asmgemm bench --shapes transformer --json out.json
      asmgemm bench sgemm hgemm --shapes random:11:60 --json out.json   # 60 random shapes and layouts
      asmgemm bench hgemm --shapes linear             # Llama nn.Linear layers, X·W^T (nt), T = 1..4096
      asmgemm bench --shapes attention --json att.json   # issue 33: batched Q.K^T, P.V vs torch.matmul
      asmgemm bench --shapes moe                      # issue 33: grouped_gemm vs torch._grouped_mm
      asmgemm bench --shapes square,3000x5000x700 --save-baseline
      asmgemm bench --json out.json --plot out.png    # the table, the JSON and a picture
      asmgemm bench --plot out.svg --from out.json    # redraw a stored result (no GPU)
      asmgemm bench --host-overhead                   # us/call of gemm vs cupy.matmul, 10,000 calls
      asmgemm bench hgemm_mma --triton-mma --no-triton --shapes 4096x4096x4096,8192x8192x8192
    """
    if from_json is not None:
        if plot_out is None:
            raise AsmError("--from RESULT.json redraws a stored result: give --plot FILE.png|svg|pdf")
        _redraw(from_json, plot_out)
        return
    if plot_out is not None:
        if host_overhead:
            raise AsmError("--plot draws the throughput benchmark; --host-overhead has no picture")
        plot_format(plot_out)
        require_matplotlib()            # before the GPU work, not after it
        check_outputs([plot_out])
    if triton_mma and host_overhead:
        raise AsmError("--triton-mma is a column of the throughput benchmark; --host-overhead times no Triton")
    if triton_mma and no_torch:
        raise AsmError("--triton-mma runs Triton on torch tensors: leave out --no-torch")
    if host_overhead:
        _host_overhead(kernels, shapes_spec or "128x128x128", calls, no_torch, json_out, seed)
        return
    shapes_spec = shapes_spec or "square"
    if shapes_spec in batched.SETS:
        _batched_set(shapes_spec, kernels, reps, no_flush, json_out, loop_calls)
        return

    names = list(kernels) or [s.name for s in load_spec_file(shipped_spec_file())]
    bench_kernels = list({s.name: s for s in (get_spec(n) for n in names)}.values())
    default_set = not kernels
    shapes = parse_shapes(shapes_spec)
    layouts = parse_layouts(layouts_spec)
    overrides = parse_defines(defines)
    if (save_baseline or check_baseline) and overrides:
        raise AsmError("baselines hold what asmgemm.gemm runs untuned; leave out -D",
                       hint="a baseline for a variant would be compared against the defaults later")
    if save_baseline or check_baseline:
        use_defaults = True
    if json_out not in (None, "-"):
        check_outputs([json_out])          # a missing folder or a typo fails now, not after the whole run
    with lookups_off() if use_defaults else contextlib.nullcontext():   # untuned: gemm() ignores the cache
        _bench(bench_kernels, shapes, layouts, reps, warmup, no_flush, no_pre_roll, no_torch, no_triton, overrides,
               use_defaults, json_out, save_baseline, check_baseline, baseline_dir, tolerance, seed, default_set,
               plot_out=plot_out, triton_mma=triton_mma, loop_calls=loop_calls)


def _batched_set(name: str, kernels, reps: int, no_flush: bool, json_out, loop_calls: int) -> None:
    """--shapes attention|moe: issue 33's batched or grouped set against its torch anchor
    (asm/bench/batched.py), a line per case and the summary per timing mode."""
    if kernels:
        raise AsmError(f"--shapes {name} runs what asmgemm.gemm / grouped_gemm pick for each call: name no kernel")
    if json_out not in (None, "-"):
        check_outputs([json_out])
    require_gpu(f"asmgemm bench --shapes {name}")
    if torch_module() is None:
        raise AsmError(f"--shapes {name} times against torch: install torch with CUDA")
    rows = batched.run_set(name, reps, not no_flush, log=lambda line: click.echo(line, err=json_out == "-"),
                           loop_calls=loop_calls)
    report = batched.report(name, rows)
    for line in batched.summary_lines(report):
        click.echo(line, err=json_out == "-")
    if json_out is not None:
        if json_out == "-":
            emit_json(report)
        else:
            write_files([(json_out, json.dumps(report, indent=1) + "\n")])
    if any(r.error for r in rows):
        sys.exit(EXIT_WRONG)


def _redraw(from_json: str, plot_out: str) -> None:
    """--plot OUT --from RESULT.json: the picture of a stored report, without a GPU."""
    fmt = plot_format(plot_out)
    report = load_report(from_json)
    write_files([(plot_out, render(report, fmt))], inputs=[from_json])
    click.echo(f"plot: {len(report['rows'])} rows drawn into {plot_out}", err=True)


def _host_overhead(kernels, shapes_spec, calls, no_torch, json_out, seed) -> None:
    """--host-overhead: us/call of asmgemm.gemm against cupy.matmul on the first shape."""
    if len(kernels) > 1:
        raise AsmError("--host-overhead measures one kernel: name at most one")
    spec = get_spec(kernels[0]) if kernels else None
    shape = parse_shapes(shapes_spec)[0]
    if json_out not in (None, "-"):
        check_outputs([json_out])
    cp = require_gpu("asmgemm bench --host-overhead")
    torch = None if no_torch else torch_module()
    report = measure_host_overhead(cp, shape.m, shape.n, shape.k, kernel=spec, calls=calls, torch=torch, seed=seed)
    if json_out not in (None, "-"):
        write_files([(json_out, json.dumps(report, indent=1) + "\n")])
    if json_out == "-":
        emit_json(report)
        return
    t = Table(title=f"asmgemm bench --host-overhead on {report['gpu']}: host time per call (us), {calls} calls of "
                    f"{shape.key} {report['dtype']} each", title_justify="left")
    for col in ("implementation", "mean", "median", "p90", "min", "mean over cuBLAS"):
        t.add_column(col, justify="left" if col == "implementation" else "right")
    for impl, h in report["host_us"].items():
        over = report["overhead_over_cublas_us"].get(impl)
        t.add_row(impl, f"{h['mean_us']:.2f}", f"{h['median_us']:.2f}", f"{h['p90_us']:.2f}", f"{h['min_us']:.2f}",
                  "-" if over is None else f"{over['mean']:+.2f}")
    con = make_console()
    con.print(t)
    behind = [i for i, h in report["host_us"].items() if h["gpu_bound_blocks"]]
    if behind:
        con.print(f"[yellow]the GPU was slower than the host in some blocks of {', '.join(behind)}: "
                  "take a smaller shape for a host-bound measurement[/]")


def _runnable_here(cp, spec, target: str) -> bool:
    """A kernel the default set benchmarks on this GPU: built for it, with dtypes CuPy arrays have
    (bf16 kernels are left to an explicit name), C in A's type (the cuBLAS reference here is
    cupy.matmul, which has no fp16 -> fp32 form)."""
    if spec.dtypes.c != spec.dtypes.a:
        return False
    try:
        cp.dtype(spec.dtypes.a)
    except TypeError:
        return False
    return spec.build_target(target) is not None


def _bench(bench_kernels, shapes, layouts, reps, warmup, no_flush, no_pre_roll, no_torch, no_triton, overrides,
           use_defaults, json_out, save_baseline, check_baseline, baseline_dir, tolerance, seed, default_set=False,
           plot_out=None, triton_mma=False, loop_calls=200):
    cp = require_gpu("asmgemm bench")
    gpu = gpu_name()
    if default_set:
        target = device_facts().target
        bench_kernels = [s for s in bench_kernels if _runnable_here(cp, s, target)]
    folder = Path(baseline_dir) if baseline_dir else bl.default_baseline_dir()
    old_baseline = bl.load_baseline(folder / bl.baseline_file_name(gpu)) if check_baseline else None
    pre_roll = make_pre_roll(not no_pre_roll)
    rows = _run(cp, bench_kernels, shapes, layouts, reps, warmup, no_flush, pre_roll, no_torch, no_triton,
                overrides, use_defaults, seed, triton_mma, loop_calls)

    report = {"gpu": gpu, "reps": reps, "warmup": warmup, "l2_flush": not no_flush, "pre_roll": pre_roll is not None,
              "loop_calls": loop_calls, "modes": list(MODES), "headline": "call",
              "peak_tflops": peak_tflops(gpu), "rows": [r.to_json() for r in rows]}
    report["summary"] = summarize(rows)
    measured = {r.key: r.ratio() for r in rows if r.ratio() is not None}
    comparisons = []
    if old_baseline is not None:
        comparisons = [c for c in bl.compare(old_baseline, measured, tolerance) if c.key in measured]
        report["baseline_check"] = [{**c.__dict__, "change": c.change} for c in comparisons]

    def show():
        if json_out == "-":
            emit_json(report)
        else:
            _print_table(gpu, rows, reps, no_flush, loop_calls)
            _print_summary(report["summary"])
            _print_comparisons(comparisons)

    entries = {}
    try:
        outputs = []          # the baseline and --json OUT: written together at the end, or neither
        if save_baseline:
            entries = {r.key: bl.new_entry(r.kernel, r.layout, r.shape.m, r.shape.n, r.shape.k, r.ratio(),
                                           r.tflops("asmgemm"), r.tflops("cublas"),
                                           spread=round(r.stats["asmgemm"].spread, 4))
                       for r in rows if r.ratio() is not None}
            if entries:
                path, text = bl.baseline_update(folder, gpu, entries, {"asmgemm": __version__, "reps": reps})
                outputs.append((path, text))
                report["baseline_saved"] = str(path)
        if json_out not in (None, "-"):
            outputs.append((json_out, json.dumps(report, indent=1) + "\n"))
        if plot_out is not None and report["rows"]:
            outputs.append((plot_out, render(report, plot_format(plot_out))))
        write_files(outputs)
    except AsmError:
        report.pop("baseline_saved", None)
        show()                 # the measurements are shown even when they could not be saved
        raise
    if report.get("baseline_saved"):
        click.echo(f"baseline: {len(entries)} entries saved to {report['baseline_saved']}", err=True)
    show()
    if any(r.error for r in rows):
        sys.exit(EXIT_WRONG)
    if any(c.status == "regressed" for c in comparisons):
        sys.exit(EXIT_REGRESSED)


def _items(bench_kernels, shapes, layouts):
    """(kernel, layout, shape) to run: per kernel, layout by layout (--layouts first, then the
    layouts only shapes of their own carry), the shapes in their order; a shape with its own layout
    (random, linear presets) under that layout alone."""
    order = list(layouts) + [lay for lay in LAYOUTS if lay not in layouts and any(s.layout == lay for s in shapes)]
    return [(k, lay, s) for k in bench_kernels for lay in order for s in shapes
            if s.layout == lay or (s.layout is None and lay in layouts)]


def _run(cp, bench_kernels, shapes, layouts, reps, warmup, no_flush, pre_roll, no_torch, no_triton, overrides,
         use_defaults, seed, triton_mma=False, loop_calls=200):

    gpu = gpu_name()
    torch = None if no_torch else torch_module()
    use_triton = torch is not None and not no_triton and triton_available()
    use_triton_mma = triton_mma and _triton_mma_available(torch)
    flush = None if no_flush else L2Flusher()
    items = _items(bench_kernels, shapes, layouts)
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=make_console(stderr=True), transient=True) as progress:
        task = progress.add_task("bench", total=len(items) * reps)
        for i, (kernel, layout, shape) in enumerate(items):
            progress.update(task, description=f"{kernel.name} {layout} {shape.key}", completed=i * reps)
            params, source, shown = resolve_params(kernel, gpu, layout, shape, overrides, use_defaults)
            try:
                row = bench_one(cp, kernel, shape, layout, reps=reps, warmup=warmup, params=params,
                                params_source=source, shown_params=shown, flush=flush, torch=torch, seed=seed + i,
                                on_rep=lambda r: progress.advance(task), pre_roll=pre_roll, triton=use_triton,
                                triton_mma=use_triton_mma, loop_calls=loop_calls)
            except cp.cuda.memory.OutOfMemoryError as exc:
                row = BenchRow(kernel.name, kernel.dtypes.c, layout, shape, kernel.rel_err_limit, shown, source,
                               error=f"out of memory: {exc}",
                               a_dtype=kernel.dtypes.a if kernel.dtypes.a != kernel.dtypes.c else None)
            rows.append(row)
    return rows


def _triton_mma_available(torch) -> bool:
    """Whether the triton-mma column can run here; a warning on stderr (the run goes on without it) when not."""
    if torch is not None and triton_available():
        return True
    why = "torch has no CUDA device" if triton_available() else "it needs Triton and torch, which do not import here"
    click.echo(f"asmgemm: warning: --triton-mma: column left out: {why}", err=True)
    return False


def _fmt_tflops(row, impl, mode="call"):
    s = row.timings(mode).get(impl)
    if s is None:
        return "-"
    f = row.shape.flops
    # min–max on a line of its own: the table has up to five such columns beside the ratios
    return f"{_num(tflops(f, s.median_ms))}\n[dim]({_num(tflops(f, s.max_ms))}–{_num(tflops(f, s.min_ms))})[/]"


def _num(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}" if x >= 1 else f"{x:.3f}"


def _fmt_ratio(r):
    if r is None:
        return "-"
    color = "green" if r >= 1.0 else "yellow" if r >= 0.9 else "red"
    return f"[{color}]{r:.2f}×[/]"


def _print_table(gpu, rows, reps, no_flush, loop_calls=200):
    refs = [i for i in ("torch", "triton", TRITON_MMA) if any(i in r.stats for r in rows)]
    best = "asm/best" if "torch" in refs else "asm/cuBLAS"     # the faster cuBLAS path: cupy.matmul or torch.matmul
    loop = any(r.loop_stats for r in rows)
    t = Table(title=f"asmgemm bench on {gpu}: TFLOP/s of one call from an idle GPU (host time counts), median of "
                    f"{reps} (min–max); L2 {'not ' if no_flush else ''}flushed between repetitions. {best}: call-time "
                    f"ratio; gpu: device time (pre-roll hides the host){'; loop: ' + str(loop_calls) + ' back-to-back calls' if loop else ''}",
              title_justify="left")
    # (the references' own ratios to cuBLAS are in the JSON, ratio_to_cublas: the table keeps to asmgemm's)
    cols = ["kernel", "layout", "M×N×K", "params", "rel err", "asmgemm", "cuBLAS", *refs,
            *(["asm/cuBLAS"] if best == "asm/best" else []),
            best, "gpu", *(["loop"] if loop else []), *([f"asm/{TRITON_MMA}"] if TRITON_MMA in refs else [])]
    for col in cols:
        # a header squeezed by a narrow terminal folds onto a second line instead of losing its end
        t.add_column(col, justify="left" if col in ("kernel", "layout", "M×N×K", "params") else "right",
                     overflow="fold")
    for r in rows:
        err = r.rel_err.get("asmgemm")
        shown = r.params_source + (": " + " ".join(f"{k}={v}" for k, v in r.params.items()) if r.params else "")
        cells = [r.kernel + (f" → {r.ran}" if r.ran else ""), r.layout, r.shape.key, shown, f"{err:.1e}" if err is not None else "-",
                 _fmt_tflops(r, "asmgemm"), _fmt_tflops(r, "cublas")]
        cells += [_fmt_tflops(r, i) for i in refs]
        if best == "asm/best":
            cells.append(_fmt_ratio(r.ratio(mode="call")))
        cells += [_fmt_ratio(r.ratio_to_best(mode=m)) for m in ("call", "gpu", *(["loop"] if loop else []))]
        if TRITON_MMA in refs:
            cells.append(_fmt_ratio(r.ratio(to=TRITON_MMA, mode="call")))
        t.add_row(*cells)
    con = make_console()
    con.print(t)
    chosen = [f"{r.layout} {r.shape.key}: {r.ref_configs[TRITON_MMA]}" for r in rows if TRITON_MMA in r.ref_configs]
    if chosen:
        con.print(f"[dim]{TRITON_MMA} (Triton, DISABLE_MMA_V3=1) autotuned to: " + "; ".join(chosen) + "[/]")
    shared = {}                 # a note several rows carry (the reference a kernel's dtypes need) is printed once
    for r in rows:
        for note in r.notes:
            shared.setdefault((r.kernel, note), []).append(r)
    for r in rows:
        if r.error:
            con.print(f"[red]{r.kernel} {r.layout} {r.shape.key}:[/] {r.error}")
        for note in r.notes:
            carriers = shared[(r.kernel, note)]
            if len(carriers) == 1:
                con.print(f"[yellow]{r.kernel} {r.layout} {r.shape.key}:[/] {note}")
            elif carriers[0] is r:
                con.print(f"[yellow]{r.kernel} ({len(carriers)} rows):[/] {note}")


def _mode_line(name: str, s: dict | None) -> str:
    if s is None:
        return f"  {name:<14} -"
    slow = s["slowest"]
    under = ", ".join(f"{n} under {limit}x" for limit, n in s["under"].items())
    return (f"  {name:<14} geomean {s['geomean_to_best_cublas']:.3f}x over {s['shapes']} shapes, {under}; slowest "
            f"{slow['kernel']} {slow['layout']} {slow['shape']} at {slow['ratio_to_best_cublas']:.2f}x")


def _print_summary(summary):
    if not summary or summary["shapes"] < 2:
        return
    lines = [f"{summary['shapes']} shapes: asmgemm over the faster of cupy.matmul (cublasGemmEx for an fp32 C of "
             f"16-bit A and B) and torch.matmul, per timing (call: one call from an idle GPU, the headline; gpu: "
             f"device time; loop: back-to-back calls):"]
    lines += [_mode_line(mode, s) for mode, s in summary["modes"].items()]
    for dtype, modes in summary.get("by_dtype", {}).items():
        lines += [_mode_line(f"{dtype} {mode}", s) for mode, s in modes.items()]
    lines.append(f"  (gpu, to cupy.matmul alone: geomean {summary['geomean_to_cublas']:.3f}x)")
    make_console().print("\n".join(lines), highlight=False)


def _print_comparisons(comparisons):
    if not comparisons:
        return
    con = make_console()
    for c in comparisons:
        if c.status == "regressed":
            con.print(f"[red]regressed:[/] {c.message()}")
        elif c.status == "improved":
            con.print(f"[green]improved:[/] {c.message()}")
        elif c.status == "new":
            con.print(f"[dim]not in the baseline:[/] {c.key} ratio {c.new_ratio:.3f}")
    n_bad = sum(c.status == "regressed" for c in comparisons)
    con.print(f"baseline check: {len(comparisons)} compared, {n_bad} regressed")
