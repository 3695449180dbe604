"""Options and helpers shared by the subcommands."""
from __future__ import annotations

import json
import sys

import click
from rich.console import Console

from ..bench.shapes import LAYOUTS
from ..errors import AsmError
from ..isa.arch import DEFAULT_TARGET
from ..pipeline import BuildOptions
from ..targets import SUPPORTED_TARGETS

# --layout of run, tune and explain: nn, nt, tn or tt in either case (`--layout NT` as the issues and
# BLAS write it), handed on in lower case
LAYOUT = click.Choice(LAYOUTS, case_sensitive=False)


def parse_defines(values) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        if "=" not in v:
            raise AsmError(f"-D {v}: expected NAME=VALUE")
        name, value = v.split("=", 1)
        name = name.strip()
        if not name.isidentifier():
            raise AsmError(f"-D {v}: '{name}' is not a valid name")
        if name in out:
            raise AsmError(f"-D {name} given twice")
        out[name] = value.strip()
    return out


def integer_defines(values) -> dict[str, int]:
    """parse_defines of NAME=INTEGER items (empty ones skipped: 'A=1,,B=2'.split(',')), the values
    as ints (0x.. too): the scripts' -D overrides passed to asmgemm.gemm(params=...)."""
    out = {}
    for name, value in parse_defines(v for v in values if v).items():
        try:
            out[name] = int(value, 0)
        except ValueError:
            raise AsmError(f"-D {name}={value}: the value is not an integer") from None
    return out


def source_options(f):
    """-D, --target and -I, for every command that builds a source."""
    f = click.option("-I", "--include-dir", "include_dirs", multiple=True, type=click.Path(file_okay=False),
                     help="Extra folder to search for .include files (after the including file's folder).")(f)
    f = click.option("--target", type=click.Choice(SUPPORTED_TARGETS), default=None,
                     help=f"GPU target. Default: the source's .target, else {DEFAULT_TARGET} (sm_90a when the source "
                          "uses wgmma/setmaxnreg).")(f)
    f = click.option("-D", "defines", multiple=True, metavar="NAME=VALUE",
                     help="Override a parameter declared with `.const NAME ?= default`. Repeatable.")(f)
    return f


def build_options(defines, target, include_dirs, **kw):
    return BuildOptions(defines=parse_defines(defines), target=target, include_dirs=list(include_dirs), **kw)


def emit_json(obj) -> None:
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def make_console(stderr: bool = False, piped_width: int = 160):
    """A rich Console for reports. Piped output (a file, `less`, `grep`) gets a wide fixed width
    instead of rich's 80 columns, so tables keep one row per line and whole register names."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(file=stream, width=None if stream.isatty() else piped_width)
