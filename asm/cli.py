"""The `asmgemm` command line. Each subcommand lives in asmgemm/commands/<name>.py and is imported
only when used, so `asmgemm build` never pays for CuPy or the SASS decoder."""
from __future__ import annotations

import importlib
import os
import sys
import traceback

import click

from .errors import AsmError
from .files import cache_warnings_as_lines
from .version import __version__

# name -> (module, one-line help shown by `asmgemm --help`)
COMMANDS = {
    "build": ("build", "Assemble a .sasm (or .ptx) file into PTX, and optionally a cubin."),
    "regs": ("regs", "Show the register plan: named registers, banks, live ranges, bank conflicts."),
    "check": ("check", "Run ptxas -v on the output: registers, spills, stack, shared memory."),
    "kernels": ("kernels", "List the kernels shipped with asmgemm (buildable by name)."),
    "sass": ("sass", "Disassemble what ptxas produced: control codes, banks, reuse, loops."),
    "patch": ("patch", "Set control codes in a cubin from a rules file, refused unless proven safe."),
    "sched": ("sched", "Show how .schedule regions are reordered, with estimated cycles."),
    "run": ("run", "Run a GEMM kernel on the GPU: error vs cuBLAS, TFLOP/s, ratio."),
    "bench": ("bench", "Benchmark kernels against cuBLAS on the GPU."),
    "tune": ("tune", "Search a kernel's parameter space; keep the fastest per shape; sweep a catalog."),
    "explain": ("explain", "Show which configuration a GEMM call runs: candidates, modelled times, why."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"asmgemm.commands.{COMMANDS[name][0]}")
        return module.command

    def format_commands(self, ctx, formatter):
        rows = [(n, COMMANDS[n][1]) for n in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="asmgemm")
def cli():
    """asmgemm — a GPU assembler toolkit for hand-written GEMM kernels.

    Kernels are written in .sasm: PTX plus constants, macros, loops, conditionals, named
    registers with bank constraints and schedulable regions. The toolkit expands them, plans
    registers with the register-file banks in mind, emits PTX, runs ptxas, and shows the SASS
    the GPU really runs.

    FILE arguments take a path or the name of a shipped kernel (see `asmgemm kernels`).
    """


def main(argv=None):
    try:
        with cache_warnings_as_lines():     # every command shows a cache warning as one line
            cli.main(args=argv, prog_name="asmgemm", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except AsmError as exc:
        click.echo(exc.format(), err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # a bug in asmgemm, not in the user's input
        if "ASMGEMM_DEBUG" in os.environ:
            traceback.print_exc()
        click.echo(f"asmgemm: internal error: {type(exc).__name__}: {exc}\n"
                   "this is a bug in asmgemm; set ASMGEMM_DEBUG=1 for the traceback", err=True)
        sys.exit(70)


if __name__ == "__main__":
    main()
