#!/usr/bin/env python3
"""Rewrite a dispatch database's neighbours (model.residuals) from the sweeps it was fitted on, at
its own coefficients: none is refitted, no exact hit changes. For a database whose residuals are of
an earlier form (ratios of call times, "res", until 2026-11-30: the cost model now scales the term
each ratio was measured against, cost_model.residual_entry), or whose coefficients were kept while
the fit's code moved on (the shipped H100 file: docs/log/dispatch.md).

The sweeps must be the ones the database was fitted on: every stored call must be in them, and
where the stored residuals are of the earlier form each must come out as stored (else it stops,
writing nothing).

    python3 tools/rebuild_residuals.py kernels_ptx/dispatch/nvidia_h100_80gb_hbm3.json \\
        tools/data/dispatch/*/*.json.gz
    python3 tools/rebuild_residuals.py DB.json SWEEP.json... --out NEW.json --json report.json

The shipped H200 file's sweeps are in git's history (docs/log/dispatch.md names the commits)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asmgemm.errors import AsmError
from asmgemm.files import read_json
from asmgemm.runtime.dispatch_db import write
from asmgemm.tuning.fit import rebuild_residuals


def _read(path: str) -> dict:
    try:
        return read_json(path)
    except AsmError as exc:
        sys.exit(str(exc))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("db", help="the dispatch database (a <slug>.json)")
    ap.add_argument("sweeps", nargs="+", help="the sweep samples it was fitted on (asmgemm tune --sweep --samples)")
    ap.add_argument("--out", help="where to write it (default: over DB, whole or not at all)")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args()
    db = _read(args.db)
    try:
        new, report = rebuild_residuals(db, [_read(p) for p in args.sweeps])
    except AsmError as exc:
        sys.exit(str(exc))
    write(Path(args.out or args.db), new)
    print(f"{args.out or args.db}: {report['calls']} calls' neighbours rewritten ({report['residuals_checked']} "
          f"earlier residuals reproduced, within {report['worst_log_difference']} in log)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
