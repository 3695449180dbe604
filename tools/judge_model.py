#!/usr/bin/env python3
"""Judge a dispatch database's cost model on kept sweeps it was not fitted on: per measured call,
the measured time of the model's pick among the call's timed candidates against the best one
(what `asmgemm tune --fit` reports as its held-out check, here on any sweep, of any GPU).

The model is the one dispatch would use on the sweep's GPU: that GPU's own database, else one of
the same target rescaled to its clock (the model alone, dispatch_db.device_model); --db lays a
database file over the shipped one for the run (e.g. a refit to compare against HEAD's).
Candidates are priced as the sweep's family prices them (fit.evaluate), host time the model's.

    python3 tools/judge_model.py tools/data/judge_h200.json.gz
    python3 tools/judge_model.py tools/data/judge_h200.json.gz --db /tmp/refit.json --worst 5
    python3 tools/judge_model.py $OUT/sweep_*.json --json out.json

tools/data/judge_h200.json.gz is docs/log/dispatch.md's "A variant's factor leans on its
layout's" (2026-11-29): 52 calls timed exhaustively on an H200, never fitted on, kept compact
(a document with "compact" set: each sample only what judging needs, the rest filled in here)."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from asmgemm.errors import AsmError
from asmgemm.files import read_json


def _read(path: str) -> dict:
    try:
        return read_json(path)
    except AsmError as exc:
        sys.exit(str(exc))


def expand(doc: dict) -> dict:
    """A compact sweep document's samples filled in: family (the document's), kernel (the catalog
    entry's), call (the sample's own exact key), call_variant (its variant), swap (false). A full
    sweep document is returned as it is."""
    if not doc.get("compact"):
        return doc
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.dispatch_db import exact_key
    entries = {e.name: e for e in get_spec(doc["family"]).configs}
    samples = []
    for s in doc["samples"]:
        if s["config"] not in entries:
            sys.exit(f"judge_model: a sample names configuration '{s['config']}', which {doc['family']}'s "
                     "catalog no longer has")
        samples.append({"family": doc["family"], "kernel": entries[s["config"]].kernel, "swap": False,
                        "call": exact_key(doc["family"], s["layout"], s["m"], s["n"], s["k"], True),
                        "call_variant": s.get("variant"), **s})
    return dict(doc, samples=samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sweeps", nargs="+", help="sweep samples (asmgemm tune --sweep --samples), .json or .json.gz")
    ap.add_argument("--db", help="a dispatch database file to judge instead of the shipped one for its target")
    ap.add_argument("--worst", type=int, default=10, help="calls listed whose pick is more than 5%% slower")
    ap.add_argument("--json", help="write the report here")
    args = ap.parse_args()
    docs = [expand(_read(p)) for p in args.sweeps]
    gpus = {d.get("gpu") for d in docs}
    if len(gpus) != 1:
        sys.exit(f"judge_model: the sweeps are of {len(gpus)} GPUs ({', '.join(sorted(map(str, gpus)))}): one at a time")
    tmp = None
    if args.db:
        data = _read(args.db)
        from asmgemm.runtime.dispatch_db import DIR_ENV, slug
        tmp = tempfile.mkdtemp(prefix="judge_model_")
        shutil.copy(args.db, Path(tmp) / f"{slug(data['gpu'])}.json")
        os.environ[DIR_ENV] = tmp
    try:
        from asmgemm.runtime.dispatch_db import device_model
        from asmgemm.tuning.fit import _family_sizes, evaluate
        d0 = docs[0]
        report = {"gpu": d0["gpu"], "model": None, "families": {}}
        samples = [s for d in docs for s in d["samples"]]
        for fam in sorted({s["family"] for s in samples}):
            # (each family is priced by the database that swept it: dispatch_db.device_model)
            dm, _ = device_model(d0["gpu"], d0["target"], int(d0["sms"]), float(d0["clock_hz"]),
                                 float(d0["dram_bytes_per_s"]), fam)
            r = evaluate(dm, [s for s in samples if s["family"] == fam], *_family_sizes(fam))
            r["worst"] = r["worst"][:args.worst]
            r["model"] = dm.source
            report["families"][fam] = r
            report["model"] = report["model"] or dm.source
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{report['gpu']}: {report['model']}")
    for fam, r in report["families"].items():
        print(f"  {fam}: pick within 5% of the best on {r['within_5pct']} of {r['calls']} calls, "
              f"pick / best {r['geomean_pick_over_best']} (geomean)")
        for w in r["worst"]:
            print(f"    {w['call']}: {w['pick']} {w['slower']:+.1%} against {w['best']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
