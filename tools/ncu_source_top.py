#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction: the top instructions of an Nsight Compute
source page by sampled stalls.

Input: the CSV that `ncu --import REPORT.ncu-rep --page source --print-source sass --csv` prints
for one profiled kernel (the report made with `--section SourceCounters`, which samples warp
states). Each row is one SASS instruction with its "Warp Stall Sampling (All Samples)" count; this
prints the share of all samples per instruction, the top N, each with its address and text, and
the share per opcode. Reads a file; needs no GPU.

Usage:
    ncu --import $OUT/hgemm.ncu-rep --page source --print-source sass --csv > $OUT/source.csv
    python3 tools/ncu_source_top.py $OUT/source.csv --top 25
"""
from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter


def _number(text: str) -> float:
    try:
        return float(text.replace(",", "")) if text.strip() else 0.0
    except ValueError:
        return 0.0


def top_rows(rows: list[dict], top: int) -> tuple[list[str], str | None]:
    """Lines of the report; the second value names what was missing, if anything."""
    if not rows:
        return [], "the CSV has no rows"
    columns = list(rows[0])
    sample = next((c for c in columns if c.startswith("Warp Stall Sampling (All")), None)
    source = next((c for c in columns if c.strip() in ("Source", "# Source")), None)
    address = next((c for c in columns if c.strip() == "Address"), None)
    if sample is None or source is None:
        return [], f"no 'Warp Stall Sampling (All Samples)' or 'Source' column (columns: {', '.join(columns)})"
    total = sum(_number(r[sample]) for r in rows) or 1.0
    out = [f"{int(total)} samples over {len(rows)} instructions"]
    ranked = sorted(rows, key=lambda r: -_number(r[sample]))[:top]
    for r in ranked:
        where = r[address] if address else ""
        out.append(f"{100 * _number(r[sample]) / total:6.2f}%  {where:>8}  {r[source].strip()}")
    per_op: Counter = Counter()
    for r in rows:
        text = r[source].strip().split()
        if text:
            op = text[1] if text[0].startswith("@") and len(text) > 1 else text[0]
            per_op[op.split(".")[0]] += _number(r[sample])
    out.append("by opcode: " + ", ".join(f"{op} {100 * v / total:.1f}%" for op, v in per_op.most_common(12)))
    return out, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    ap.add_argument("--top", type=int, default=25, help="instructions to list (default 25)")
    args = ap.parse_args(argv)
    try:
        with open(args.csv, newline="", encoding="utf-8", errors="replace") as f:
            lines = [ln for ln in f if ln.startswith('"')]      # ncu prefixes the CSV with ==PROF== lines
    except OSError as exc:
        print(f"ncu_source_top.py: cannot read {args.csv}: {exc.strerror}", file=sys.stderr)
        return 1
    # ... and a "Kernel Name" line: the table starts at its header row
    header = next((i for i, ln in enumerate(lines) if ln.startswith('"Address"')), None)
    if header is None:
        print(f"ncu_source_top.py: {args.csv}: no header row starting with \"Address\"", file=sys.stderr)
        return 1
    lines = lines[header:]
    out, missing = top_rows(list(csv.DictReader(lines)), args.top)
    if missing:
        print(f"ncu_source_top.py: {args.csv}: {missing}", file=sys.stderr)
        return 1
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
