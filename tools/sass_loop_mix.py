#!/usr/bin/env python3
"""One line per kernel variant: the hottest loop (the loop with the most instructions) of its
SASS, with its instruction count, FFMA share, summed stall counts, issue-cycle estimate and
instruction mix. For comparing -D variants, or the scheduled and source-order builds
(--no-schedule), at a glance; `asmgemm sass FILE --loop` shows the same loop instruction by
instruction.

A .sasm/.ptx (or a shipped kernel's name) is built and assembled as `asmgemm sass` does
(asmgemm.pipeline.assemble_traced, read by asmgemm.sass.inspect.inspect_build); a .cubin is
decoded as it is. Needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]'), no GPU.

Usage:
    python3 tools/sass_loop_mix.py sgemm
    python3 tools/sass_loop_mix.py sgemm -D RQ=4 -D LOAD_AHEAD=1 -D LDG_NC=0 -D BK=16 --no-schedule
    python3 tools/sass_loop_mix.py X.cubin --json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, assemble_traced, build_file
from asmgemm.sass.inspect import inspect_build, inspect_cubin


def hottest_loops(report, kernel: str | None = None) -> list[dict]:
    """Per kernel of the report (or just `kernel`): its largest loop's summary, as a dict."""
    out = []
    for name, k in report.kernels.items():
        if kernel is not None and name != kernel:
            continue
        i = k.main_loop()
        if i is None:
            out.append({"kernel": name, "loop": None})
            continue
        s = k.loop_summaries[i]
        out.append({"kernel": name, "loop": k.loops[i].index, "instructions": s.instructions,
                    "ffma": s.mix.get("FFMA", 0), "stall_cycles": s.stall_cycles,
                    "issue_cycles": s.issue_cycles, "mix": dict(s.mix)})
    return out


def _line(row: dict) -> str:
    if row["loop"] is None:
        return f"{row['kernel']}: no loop"
    total = row["instructions"]
    return (f"{row['kernel']}: loop {row['loop']}: {total} instructions, FFMA {row['ffma']} "
            f"({100 * row['ffma'] / max(total, 1):.1f}%), stall cycles {row['stall_cycles']}, "
            f"issue cycles {row['issue_cycles']}: " + ", ".join(f"{k} {v}" for k, v in row["mix"].items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("file", help=".sasm, .ptx, a shipped kernel's name (sgemm), or a sm_90 .cubin")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                    help="parameter override for the build (repeatable)")
    ap.add_argument("--target", default=None, help="GPU target of the build (default: as `asmgemm build`)")
    ap.add_argument("--no-schedule", action="store_true", help="build with the .schedule regions in source order")
    ap.add_argument("--kernel", help="only this kernel (entry name)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args(argv)
    bad = [d for d in args.defines if "=" not in d]
    if bad:
        ap.error(f"-D {bad[0]}: expected NAME=VALUE")
    try:
        if args.file.endswith(".cubin"):
            if args.defines or args.no_schedule:
                ap.error("-D and --no-schedule apply to builds, not to a .cubin")
            report = inspect_cubin(Path(args.file).read_bytes(), args.target, source=args.file)
        else:
            defines = dict(d.split("=", 1) for d in args.defines)
            result = build_file(args.file, BuildOptions(defines=defines, target=args.target,
                                                        schedule=not args.no_schedule))
            report = inspect_build(assemble_traced(result))
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"sass_loop_mix: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    rows = hottest_loops(report, args.kernel)
    if not rows:
        print(f"sass_loop_mix: no kernel {args.kernel!r} in {args.file}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print("\n".join(_line(r) for r in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
