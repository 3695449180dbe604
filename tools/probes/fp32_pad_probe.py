"""fp32 operands whose rows are not 16-byte aligned (a row length in K or N not a multiple of 4
floats): what would a padded copy and the 128-bit loads it allows buy sgemm?

For each shape of --shapes (as `asmgemm bench --shapes`, e.g. random:224:60; shapes with a layout of
their own run it, the rest --layout) where an operand's rows are not 16-byte aligned, GPU time
(CUDA events, L2 flushed, host hidden by a pre-roll; median of --reps, interleaved) of:

  in_place   asmgemm.gemm on the operands as they are (the dispatched configuration);
  padded     asmgemm.gemm on views of padded copies (rows rounded up to 4 floats: 128-bit loads),
             the copies made beforehand, not timed;
  copies     the copies themselves (cupy's elementwise copy into the padded storage), timed alone;
  cublas     the faster of cupy.matmul and torch.matmul (where torch is installed).

Each result is checked against cupy's (exit status 2 where one is over sgemm's rel_err_limit). A
summary gives the geomean of in_place / (padded + copies) and of each against cuBLAS.

Usage (GPU, from the project root after `source tools/device_setup.sh`):
    python3 tools/probes/fp32_pad_probe.py --shapes random:224:60 --reps 5 --json out.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys


def padded_like(cp, x):
    """A view of x's values in fresh storage whose rows are rounded up to 4 floats (16 bytes)."""
    rows, cols = x.shape
    store = cp.zeros((rows, -(-cols // 4) * 4), dtype=x.dtype)
    store[:, :cols] = x
    return store, store[:, :cols]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", required=True, help="as asmgemm bench --shapes")
    ap.add_argument("--layout", default="nn", choices=["nn", "nt", "tn", "tt"],
                    help="for shapes without a layout of their own (default nn)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="write the rows and the summary here")
    args = ap.parse_args()
    import cupy as cp

    import asmgemm
    from asmgemm.bench.shapes import parse_shapes
    from asmgemm.bench.timing import time_interleaved
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.gemm import last_launch
    from probe_common import cublas_calls, gpu_timing

    limit = get_spec("sgemm").rel_err_limit
    flush, pre_roll = gpu_timing()
    rows, wrong = [], []
    for shape in parse_shapes(args.shapes):
        m, n, k = shape.m, shape.n, shape.k
        layout = shape.layout or args.layout
        ta, tb = layout[0] == "t", layout[1] == "t"
        a_rows = (k, m) if ta else (m, k)
        b_rows = (n, k) if tb else (k, n)
        if a_rows[1] % 4 == 0 and b_rows[1] % 4 == 0:
            continue                        # both operands' rows 16-byte aligned already
        rng = cp.random.default_rng(m * 7 + n * 13 + k)
        a = rng.standard_normal(a_rows, dtype=cp.float32)
        b = rng.standard_normal(b_rows, dtype=cp.float32)
        a_store, a_pad = padded_like(cp, a)
        b_store, b_pad = padded_like(cp, b)
        av, bv = (a.T if ta else a), (b.T if tb else b)
        ref = cp.matmul(av, bv)
        c = cp.empty((m, n), dtype=cp.float32)

        def copies():
            a_pad[...] = a
            b_pad[...] = b

        fns = {"in_place": lambda: asmgemm.gemm(a, b, c, trans_a=ta, trans_b=tb),
               "padded": lambda: asmgemm.gemm(a_pad, b_pad, c, trans_a=ta, trans_b=tb),
               "copies": copies, **cublas_calls(cp, av, bv, c)}
        ran = {}
        for name in ("in_place", "padded"):
            c.fill(float("nan"))
            fns[name]()
            cp.cuda.Device().synchronize()
            err = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
            launch = last_launch() or {}
            ran[name] = {"config": launch.get("config"), "kernel": launch.get("kernel"), "rel_err": float(f"{err:.3g}")}
            if not err <= limit:
                wrong.append(f"{m}x{n}x{k} {layout} {name}: relative error {err:.2e}")
        stats = time_interleaved(fns, args.reps, flush=flush, pre_roll=pre_roll)
        us = {name: s.median_ms * 1e3 for name, s in stats.items()}
        cublas = min(us[x] for x in ("cupy", "torch") if x in us)
        row = {"m": m, "n": n, "k": k, "layout": layout, "us": {x: round(v, 2) for x, v in us.items()},
               "cublas_us": round(cublas, 2), "ran": ran}
        rows.append(row)
        print(f"{m}x{n}x{k} {layout}: in place {us['in_place']:.1f} ({ran['in_place']['config']}), padded "
              f"{us['padded']:.1f} ({ran['padded']['config']}) + copies {us['copies']:.1f}, cuBLAS {cublas:.1f} us")
    summary = {}
    if rows:
        def geo(vals):
            return round(math.exp(sum(math.log(v) for v in vals) / len(vals)), 4)
        summary = {"shapes": len(rows),
                   "in_place_over_padded_plus_copies": geo([r["us"]["in_place"] / (r["us"]["padded"] + r["us"]["copies"])
                                                            for r in rows]),
                   "in_place_over_padded": geo([r["us"]["in_place"] / r["us"]["padded"] for r in rows]),
                   "cublas_over_in_place": geo([r["cublas_us"] / r["us"]["in_place"] for r in rows]),
                   "cublas_over_best_path": geo([r["cublas_us"] / min(r["us"]["in_place"], r["us"]["padded"] + r["us"]["copies"])
                                                 for r in rows])}
        print("summary:", json.dumps(summary))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "summary": summary, "wrong": wrong}, fh, indent=1)
    for line in wrong:
        print(f"WRONG {line}", file=sys.stderr)
    return 2 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
