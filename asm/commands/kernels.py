"""`asmgemm kernels`: the .sasm kernels that ship with asmgemm, and the GEMM kernels gemm/run/bench/tune
can launch (their kernel specs)."""
from __future__ import annotations

import click
from rich.table import Table

from .. import ast
from ..files import read_source
from ..kernel_spec import all_specs
from ..parse import parse_source
from ..pipeline import shipped_kernels
from .common import emit_json, make_console


def _parameters(path) -> dict[str, str]:
    return {s.name: s.value.span.text() for s in parse_source(read_source(path)).body
            if isinstance(s, ast.ConstDef) and s.overridable}


def _first_comment(path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        s = line.strip()
        if s.startswith("//"):
            return s.lstrip("/ ").strip()
        if s:
            break
    return ""


@click.command("kernels")
@click.option("--json", "as_json", is_flag=True, help="Print name, path, parameters and spec as JSON.")
def command(as_json):
    """List the shipped kernels (each can be passed by name wherever a FILE is expected) and the
    GEMM kernels with a spec (kernels_ptx/kernels.toml, files in $ASMGEMM_KERNEL_SPECS), which
    asmgemm.gemm, `run`, `bench` and `tune` launch by name."""
    specs = all_specs()
    by_source: dict = {}            # one source may be several kernels (hgemm.sasm: hgemm, bgemm)
    for spec in specs.values():
        by_source.setdefault(spec.source.resolve(), []).append(spec)
    rows = []

    def spec_row(spec):
        params = _parameters(spec.source)
        params.update({k: str(v) for k, v in spec.defines})
        return {"name": spec.name, "path": str(spec.source), "summary": spec.summary or _first_comment(spec.source),
                "parameters": params, "spec": spec.to_json()}
    for name, path in shipped_kernels().items():
        found = by_source.pop(path.resolve(), None)
        if found:
            rows.extend(spec_row(spec) for spec in found)
        else:
            rows.append({"name": name, "path": str(path), "summary": _first_comment(path),
                         "parameters": _parameters(path), "spec": None})
    for found in by_source.values():      # spec'd kernels from elsewhere (not shipped)
        rows.extend(spec_row(spec) for spec in found)
    if as_json:
        emit_json(rows)
        return
    t = Table("kernel", "GEMM (A/B → C, targets)", "parameters (-D NAME=VALUE)", "summary")
    for r in rows:
        s = r["spec"]
        gemm = (f"{s['dtypes']['a']} → {s['dtypes']['c']}, {s['targets'][0]}…{s['targets'][-1]}" if s
                else "[dim]build only[/]")
        t.add_row(r["name"], gemm, " ".join(f"{k}={v}" for k, v in r["parameters"].items()), r["summary"])
    make_console().print(t)
