"""`asmgemm tune --sweep / --fit`: time a family's catalog over many shapes, fit the cost model,
write the GPU's dispatch database (asm/tuning/sweep.py, asm/tuning/fit.py)."""
from __future__ import annotations

import time
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..bench.shapes import parse_shapes
from ..errors import AsmError
from ..files import read_json
from ..runtime import dispatch, dispatch_db
from ..tuning.fit import make_database
from ..tuning.sweep import sweep
from .common import emit_json, make_console


def _read_samples(path: str) -> dict:
    doc = read_json(path, "sweep samples")
    if not isinstance(doc, dict) or doc.get("format") != 1 or not isinstance(doc.get("samples"), list):
        raise AsmError(f"{path}: not sweep samples (write them with `asmgemm tune FAMILY --sweep SHAPES --samples FILE`)")
    timed, calls = doc.get("calls_timed"), doc.get("calls")
    if isinstance(timed, int) and isinstance(calls, int) and timed < calls:
        click.echo(f"asmgemm: note: {path}: a sweep stopped after {timed} of its {calls} calls; "
                   "fitting the samples of those", err=True)
    return doc


# seconds between two checkpoints of the samples file (each rewrites it whole, atomically): a sweep
# stopped by a time limit loses at most this much of its timing
CHECKPOINT_S = 5.0


def _checkpoints(path: str):
    """A sweep's checkpoint: the samples so far written to `path` (dispatch_db.write: whole or not
    at all), at most every CHECKPOINT_S seconds; the finished sweep writes it once more."""
    last = [time.monotonic()]

    def write(doc: dict) -> None:
        if time.monotonic() - last[0] >= CHECKPOINT_S:
            dispatch_db.write(Path(path), doc)
            last[0] = time.monotonic()
    return write


def run_sweep_or_fit(family, sweep_shapes, fit_files, layout, jobs, reps, warmup, samples_out, db_out, as_json,
                     exhaustive=False):
    docs = [_read_samples(p) for p in fit_files]
    if sweep_shapes is not None:
        shapes = [(s, getattr(s, "layout", None) or layout) for s in parse_shapes(sweep_shapes)]
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=make_console(stderr=True), transient=True) as bars:
            tasks = {}

            def progress(stage, done, total):
                if stage not in tasks:
                    text = "building the catalog's variants" if stage == "build" else "timing the candidates"
                    tasks[stage] = bars.add_task(text, total=total)
                bars.update(tasks[stage], completed=done)
            doc = sweep(family, shapes, reps=reps, warmup=warmup, jobs=jobs, exhaustive=exhaustive, progress=progress,
                        checkpoint=_checkpoints(samples_out) if samples_out else None)
        if samples_out:
            dispatch_db.write(Path(samples_out), doc)
        docs.append(doc)
    db, report = make_database(docs)
    out = Path(db_out) if db_out else dispatch_db.user_dir() / f"{dispatch_db.slug(db['gpu'])}.json"
    if out.is_file():
        # (another family's fit of this GPU already there stays: dispatch_db.merge_fit; a file that
        # cannot be read is replaced)
        try:
            db = dispatch_db.merge_fit(dispatch_db.read(out), db)
        except AsmError as exc:
            click.echo(f"asmgemm: warning: {exc.message.splitlines()[0]}: replaced by this fit", err=True)
    dispatch_db.write(out, db)
    dispatch.forget()
    report["database"] = str(out)
    if as_json:
        emit_json(report)
        return
    click.echo(f"{report['samples']} samples ({report['errors']} could not run) of {', '.join(report['families'])} "
               f"on {report['gpu']}; database written to {out}")
    for fam, ev in report["held_out"].items():
        if ev["calls"]:
            click.echo(f"  {fam}: held-out calls {ev['calls']}: the model's pick within 5% of the best measured on "
                       f"{ev['within_5pct']} ({ev['share_within_5pct']:.0%}); pick/best geomean "
                       f"{ev['geomean_pick_over_best']}")
            for miss in ev["worst"][:5]:
                click.echo(f"    {miss['call']}: picked {miss['pick']}, best {miss['best']} "
                           f"({miss['slower']:+.1%})")
