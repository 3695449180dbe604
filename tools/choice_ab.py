#!/usr/bin/env python3
"""Does a change to kernel selection (the cost model, its database, the path model, the rules) make
the calls it moves faster? Two steps:

  record  (CPU, no GPU needed) what launch_config.configure chooses for each call of some shapes
          and dtypes on a GPU's facts: the kernel, the catalog label and the params= that run it,
          or the TMA kernel's own rules (label null). Run it in each tree: the older one (e.g.
          `git stash` of the change, this untracked file staying in place) and the changed one.
  time    (GPU) each call the two records choose differently, both choices in one process,
          interleaved (tools/call_gap_diag.py's measure: call, gpu and the rest, medians of REPS),
          then the geomean of new / old by GPU and by call time, the calls over 5% slower or
          faster, and the worst.

Only the moved calls are timed, in one process, so the comparison does not ride on the drift of
call times between processes (0.8-1.2x on the H200's host).

    python3 tools/choice_ab.py record --gpu "NVIDIA H200" --shapes random:164:60 --dtypes float32 --json new.json
    git stash && python3 tools/choice_ab.py record ... --json old.json && git stash pop
    python3 tools/choice_ab.py time old.json new.json --reps 5 --json ab.json      # on the device

--shapes takes what `asmgemm bench --shapes` takes (presets by name, random:SEED:COUNT[:ALIGN],
MxNxK); a shape without a layout of its own runs --layouts (default: all four).
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from asmgemm.errors import AsmError

# the GPUs whose facts a record may configure calls with (sm_90; DRAM: 2 x memory clock x bus width)
GPUS = {
    "NVIDIA H100 80GB HBM3": (132, 1.98e9, 3.35e12, 50 * 1024 * 1024),
    "NVIDIA H200": (132, 1.98e9, 4.8e12, 60 * 1024 * 1024),
}


def facts_of(gpu: str):
    """The DeviceFacts (device 0, sm_90) of a GPU of GPUS, to configure calls with on the CPU."""
    from asmgemm.runtime.gpu import DeviceFacts
    sms, clock, dram, l2 = GPUS[gpu]
    return DeviceFacts(0, gpu, "sm_90", sms, clock, dram, l2)

SLOWER = 1.05            # new / old over this: the move made the call slower


def record(args) -> int:
    from asmgemm.bench.shapes import parse_shapes
    from asmgemm.runtime import launch_config
    facts = facts_of(args.gpu)
    out = []
    for spec in args.shapes:
        for shape in parse_shapes(spec):
            for dtype in args.dtypes:
                for layout in ([shape.layout] if shape.layout else args.layouts):
                    row = {"shapes": spec, "m": shape.m, "n": shape.n, "k": shape.k, "layout": layout, "dtype": dtype}
                    try:
                        # (params: the catalog's pick, or a kernel's own rules' unsplit build, as
                        # params= run it: a change to either is a move that `time` runs both ways)
                        cfg, params = launch_config.untuned_params(launch_config.pick_spec(None, dtype, None, facts),
                                                                   shape.m, shape.n, shape.k, layout, facts)
                    except AsmError as exc:
                        out.append({**row, "error": str(exc)})
                        continue
                    out.append({**row, "kernel": cfg.spec.name, "label": cfg.config, "params": params,
                                "chosen_by": cfg.chosen_by})
    with open(args.json, "w") as f:
        json.dump({"gpu": args.gpu, "calls": out}, f, indent=1)
    print(f"choice_ab record: {len(out)} calls on {args.gpu}'s facts -> {args.json}")
    return 0


def _key(row: dict) -> tuple:
    return row["m"], row["n"], row["k"], row["layout"], row["dtype"]


def _choice(row: dict) -> tuple:
    """What ran: the kernel, the catalog label and the params= less those at 0 (a switch a newer
    tree adds at its off value, such as a fixup switch of 0, is no move)."""
    params = {k: v for k, v in (row.get("params") or {}).items() if v != 0}
    return row.get("kernel"), row.get("label"), json.dumps(params, sort_keys=True)


def moved(old: dict, new: dict) -> list[tuple[dict, dict]]:
    """The calls both records hold whose choices differ (an error in either: left out)."""
    before = {_key(r): r for r in old["calls"] if "error" not in r}
    return [(before[_key(r)], r) for r in new["calls"]
            if "error" not in r and _key(r) in before and _choice(before[_key(r)]) != _choice(r)]


def time_moves(args) -> int:
    from gpu_events import require_torch
    torch = require_torch("tools/choice_ab.py time")
    from asmgemm.runtime import path_model
    from asmgemm.runtime.gemm import gemm
    from call_gap_diag import measure           # tools/call_gap_diag.py
    with open(args.old) as f:
        old = json.load(f)
    with open(args.new) as f:
        new = json.load(f)
    pairs = moved(old, new)
    print(f"choice_ab time: {len(pairs)} calls moved", flush=True)
    rows = []
    for i, (o, n) in enumerate(pairs, 1):
        m, nn, k, layout, dtype = _key(n)
        g = torch.Generator(device="cuda").manual_seed(0)
        ta, tb = layout[0] == "t", layout[1] == "t"
        a = torch.randn(*((k, m) if ta else (m, k)), device="cuda", generator=g).to(getattr(torch, dtype))
        b = torch.randn(*((nn, k) if tb else (k, nn)), device="cuda", generator=g).to(getattr(torch, dtype))

        def run(choice: dict):
            if choice["label"] is None:         # the kernel's own rules, the TMA kernel not sent in place
                def fn():
                    with path_model.in_place_off():
                        return gemm(a, b, trans_a=ta, trans_b=tb, kernel=choice["kernel"], params=choice.get("params"))
                return fn
            return lambda: gemm(a, b, trans_a=ta, trans_b=tb, params=choice["params"], kernel=choice["kernel"])
        got = measure({"old": run(o), "new": run(n)}, args.reps)
        row = {"call": f"{m}x{nn}x{k} {layout} {dtype}", "old_choice": f"{o['kernel']}/{o['label']}",
               "new_choice": f"{n['kernel']}/{n['label']}",
               **{w: {col: got[w][col] * 1e3 for col in ("gpu", "call")} for w in ("old", "new")}}
        rows.append(row)
        if args.json:           # after every call: a run its time limit cuts short keeps what it timed
            with open(args.json, "w") as f:
                json.dump({"summary": summarize(rows), "rows": rows}, f, indent=1)
        old_t, new_t = row["old"], row["new"]
        print(f"[{i}/{len(pairs)}] {row['call']}: {row['old_choice']} -> {row['new_choice']}: gpu "
              f"{old_t['gpu']:.1f} -> {new_t['gpu']:.1f} us, call {old_t['call']:.1f} -> {new_t['call']:.1f} us",
              flush=True)
    print(json.dumps(summarize(rows), indent=1))
    return 0


def summarize(rows: list[dict]) -> dict:
    """new / old per column: geomean, how many over SLOWER or under 1 / SLOWER, the worst."""
    out = {"moved": len(rows)}
    for col in ("gpu", "call"):
        r = [(x["new"][col] / x["old"][col], x["call"]) for x in rows if x["old"][col] > 0 and x["new"][col] > 0]
        if not r:
            continue
        out[col] = {"new_over_old": round(math.exp(sum(math.log(v) for v, _ in r) / len(r)), 4),
                    "slower": sum(v > SLOWER for v, _ in r), "faster": sum(v < 1 / SLOWER for v, _ in r),
                    "worst": [{"call": c, "new_over_old": round(v, 3)} for v, c in sorted(r, reverse=True)[:5]]}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record", help="what configure chooses, on the CPU")
    rec.add_argument("--gpu", default="NVIDIA H200", choices=sorted(GPUS),
                     help="whose facts configure the calls (GPUS above)")
    rec.add_argument("--shapes", action="append", required=True, help="as `asmgemm bench --shapes` (repeatable)")
    rec.add_argument("--dtypes", nargs="+", default=["float32", "float16", "bfloat16"])
    rec.add_argument("--layouts", nargs="+", default=["nn", "nt", "tn", "tt"])
    rec.add_argument("--json", required=True)
    tim = sub.add_parser("time", help="time the moved calls both ways, on the GPU")
    tim.add_argument("old")
    tim.add_argument("new")
    tim.add_argument("--reps", type=int, default=5)
    tim.add_argument("--json")
    args = ap.parse_args(argv)
    try:
        return record(args) if args.what == "record" else time_moves(args)
    except AsmError as exc:
        print(f"choice_ab: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
