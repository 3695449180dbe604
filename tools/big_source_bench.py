#!/usr/bin/env python3
"""How fast `asmgemm build` takes one big kernel, as plain PTX and as `.sasm`, and how much memory
it needs (issue 36's benchmark; the goal: >= 1 MB/s end to end without ptxas, an error on the last
line reported as fast and at its line and column, peak memory <= 10x the source size).

The input is one `.entry` of ordinary instructions (loads, eight FMAs per load, a pointer step:
about 33 bytes an instruction), its registers declared once per type: `.regs` in the `.sasm`
file, `.reg` in its plain-PTX twin, which is otherwise the same text. The `error` variant adds a
syntax error on the last instruction line (`add.u32 r1, r2 r3;`, a missing comma).

Every measurement runs the real command line in a fresh subprocess (`python3 -m asmgemm.cli build
IN -o OUT`: import, read, parse, expand, allocate, schedule, emit, write; no ptxas), timed by the
wall clock and the CPU time the kernel charged it, its peak memory read from the kernel (os.wait4's
ru_maxrss of that child alone). `MB/s` divides the input size by the wall time, start-up included;
`x source` is the peak memory over the start-up's (a 1-line kernel), divided by the source size.
An error run must exit 1 and name the error's line and column.

The children keep compiled bytecode, as an installed package has it (pip compiles it at install):
a PYTHONDONTWRITEBYTECODE=1 in the environment (the CPU machine sets it) is dropped for them and
their bytecode goes to a folder of the run's own (PYTHONPYCACHEPREFIX), filled by the first,
warming-up run. Without it every start compiled asmgemm's modules again: 0.2 s of a 0.6 s start.

Usage:
    python3 tools/big_source_bench.py                         # 2 and 20 MB, both kinds, both variants
    python3 tools/big_source_bench.py --sizes 2 --kinds sasm
    python3 tools/big_source_bench.py --notes docs/design/parser.md   # also write the table there
    python3 tools/big_source_bench.py --write 20 sasm big.sasm        # only write a generated file
"""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptx_throughput import _measure as ptx_throughput_measure  # noqa: E402  (tools/ is a folder of scripts)

ERROR_LINE = "    add.u32 r1, r2 r3;\n"          # the error: r3 where a ',' belongs
ERROR_COL = ERROR_LINE.index("r3") + 1


def generate(size_bytes: int, sasm: bool, error: bool = False) -> str:
    """One kernel of at least `size_bytes` characters; with `error`, a syntax error on its last
    instruction line."""
    head = ".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry big(.param .u64 p)\n{\n"
    if sasm:
        head += "    .regs .b32 r<0-63>, a<0-7>, b<0-7>\n    .regs .u64 ptr\n"
    else:
        head += "    .reg .b32 r<64>;\n    .reg .b32 a<8>;\n    .reg .b32 b<8>;\n    .reg .u64 ptr;\n"
    head += "    ld.param.u64 ptr, [p];\n"
    parts = [head]
    total = len(head)
    i = 0
    while total < size_bytes:
        k = i % 8
        lines = [f"    ld.global.v4.b32 {{a{k % 2 * 4}, a{k % 2 * 4 + 1}, a{k % 2 * 4 + 2}, a{k % 2 * 4 + 3}}}, "
                 f"[ptr+{16 * k}];\n", f"    ld.global.b32 b{k}, [ptr+{16 * k + 4}];\n"]
        lines += [f"    fma.rn.f32 r{(8 * k + j) % 64}, a{j}, b{k}, r{(8 * k + j) % 64};\n" for j in range(8)]
        lines.append("    add.u64 ptr, ptr, 128;\n")
        chunk = "".join(lines)
        parts.append(chunk)
        total += len(chunk)
        i += 1
    parts.append("    st.global.b32 [ptr], r0;\n" + (ERROR_LINE if error else "") + "    ret;\n}\n")
    return "".join(parts)


def _measure(cmd: list[str]) -> tuple[float, float, int, int, str]:
    """(wall seconds, CPU seconds, peak RSS in KiB, exit status, stderr tail) of one child process:
    tools/ptx_throughput.py's measurement, in this script's order."""
    wall, rss, code, err, cpu = ptx_throughput_measure(cmd)
    return wall, cpu, rss, code, err


def _build(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "asmgemm.cli", "build", str(src), "-o", str(out)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="2,20", help="input sizes in MB (10**6 characters), comma-separated")
    ap.add_argument("--kinds", default="ptx,sasm", help="ptx, sasm or both")
    ap.add_argument("--variants", default="clean,error", help="clean, error or both")
    ap.add_argument("--notes", metavar="FILE", help="write the table into FILE, between the BENCH markers")
    ap.add_argument("--write", nargs=3, metavar=("MB", "KIND", "FILE"), help="only write a generated file")
    args = ap.parse_args(argv)
    if args.write:
        Path(args.write[2]).write_text(generate(int(float(args.write[0]) * 1e6), args.write[1] == "sasm"))
        return 0
    rows = []
    with tempfile.TemporaryDirectory(prefix="big_source_") as tmp:
        tmp = Path(tmp)
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)      # (the children inherit this environment)
        os.environ["PYTHONPYCACHEPREFIX"] = str(tmp / "bytecode")
        small = tmp / "startup.ptx"
        small.write_text(".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n\tret;\n}\n")
        _measure(_build(small, tmp / "warm.ptx"))       # the parser tables' cache, as after any first run
        wall, cpu, base_rss, code, err = _measure(_build(small, tmp / "startup.out.ptx"))
        if code != 0:
            print(f"asmgemm build failed on the start-up kernel:\n{err}", file=sys.stderr)
            return 1
        print(f"start-up: {wall:.2f} s, {base_rss / 1024:.0f} MiB", flush=True)
        header = ("| input | size | wall s | CPU s | MB/s | peak MiB | x source | result |\n"
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        print(header, flush=True)
        for mb in [float(s) for s in args.sizes.split(",") if s.strip()]:
            for kind in [k.strip() for k in args.kinds.split(",") if k.strip()]:
                for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
                    text = generate(int(mb * 1e6), kind == "sasm", variant == "error")
                    src = tmp / f"big_{mb:g}MB.{kind}"
                    src.write_text(text)
                    nbytes = len(text.encode())
                    lines = text.count("\n")
                    wall, cpu, rss, code, err = _measure(_build(src, tmp / "out.ptx"))
                    if variant == "error":
                        want = f"{src}:{lines - 2}:{ERROR_COL}: error:"
                        ok = code == 1 and err.startswith(want) and "Traceback" not in err
                        result = f"error at {lines - 2}:{ERROR_COL}" if ok else "WRONG: " + err.strip()[:200]
                    else:
                        ok = code == 0
                        result = "built" if ok else "FAILED: " + err.strip()[-200:]
                    per_mb = (rss - base_rss) / 1024 / (nbytes / 1e6)
                    row = (f"| {kind} {variant} | {nbytes / 1e6:.1f} MB | {wall:.2f} | {cpu:.2f} | "
                           f"{nbytes / 1e6 / wall:.2f} | {rss / 1024:.0f} | {per_mb / 1.048576:.1f} | {result} |")
                    print(row, flush=True)
                    rows.append(row)
                    if not ok:
                        print(err, file=sys.stderr)
    if args.notes:
        _write_notes(Path(args.notes), header + "\n" + "\n".join(rows))
    return 0


_MARKERS = ("<!-- BENCH big_source_bench.py -->", "<!-- /BENCH -->")


def _write_notes(path: Path, table: str) -> None:
    """The table between the markers of `path` (appended with them when the file has none)."""
    stamp = f"Measured {time.strftime('%Y-%m-%d')} by `python3 tools/big_source_bench.py`, Python {sys.version.split()[0]}."
    block = f"{_MARKERS[0]}\n{stamp}\n\n{table}\n{_MARKERS[1]}"
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(re.escape(_MARKERS[0]) + r".*?" + re.escape(_MARKERS[1]), re.S)
    text = pattern.sub(lambda m: block, text) if pattern.search(text) else text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
