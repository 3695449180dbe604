"""`asmgemm kernels`: the .sasm kernels that ship with asmgemm."""
from __future__ import annotations

import click

from .common import make_console, emit_json


@click.command("kernels")
@click.option("--json", "as_json", is_flag=True, help="Print name, path and parameters as JSON.")
def command(as_json):
    """List the shipped kernels; each can be passed by name wherever a FILE is expected."""
    from ..parse import parse_source
    from ..pipeline import shipped_kernels
    from ..source import read_source
    from .. import ast

    rows = []
    for name, path in shipped_kernels().items():
        params = {}
        first_comment = ""
        text = path.read_text(encoding="utf-8")
        for line in text.splitlines():
            s = line.strip()
            if s.startswith("//"):
                first_comment = first_comment or s.lstrip("/ ").strip()
            elif s:
                break
        for stmt in parse_source(read_source(path)).body:
            if isinstance(stmt, ast.ConstDef) and stmt.overridable:
                params[stmt.name] = stmt.value.span.text()
        rows.append({"name": name, "path": str(path), "summary": first_comment, "parameters": params})
    if as_json:
        emit_json(rows)
        return
    from rich.table import Table
    t = Table("kernel", "parameters (-D NAME=VALUE)", "summary")
    for r in rows:
        t.add_row(r["name"], " ".join(f"{k}={v}" for k, v in r["parameters"].items()), r["summary"])
    make_console().print(t)
