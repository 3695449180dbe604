"""Device benchmark for the SGEMM kernel: asmgemm vs cuBLAS (cupy.matmul) on the issue's shapes,
for several kernel variants, with errors against float64. Writes JSON to $OUT (or .) and prints a
table last. Usage: python3 tools/sgemm_bench.py [--quick] [--variants default,bk16,t64]"""
from __future__ import annotations

import argparse
import json
import os
import sys

from asmgemm.commands.run import run_case

SHAPES = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (3000, 5000, 700)]
VARIANTS = {
    "default": None,
    "default-again": None,          # the same configuration timed twice: the run's noise
    "async": {"THREADS": 256, "RQ": 2, "BK": 8, "ASYNC": 1},
    "rq4pf": {"THREADS": 256, "RQ": 4, "BK": 8, "PREFETCH": 1},
    "rq2bk8": {"THREADS": 256, "RQ": 2, "BK": 8},
    "bk16": {"THREADS": 256, "RQ": 2, "BK": 16},
    "t64": {"THREADS": 64, "RQ": 2, "BK": 8},
    "rq4": {"THREADS": 256, "RQ": 4, "BK": 8},
    "rq4bk16": {"THREADS": 256, "RQ": 4, "BK": 16},
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="default,bk16")
    ap.add_argument("--layouts", default="nn")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--shapes", default="")
    args = ap.parse_args()
    shapes = SHAPES
    if args.shapes:
        shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for (m, n, k) in shapes:
        for layout in args.layouts.split(","):
            for vname in args.variants.split(","):
                res = run_case(m, n, k, layout, 1.0, 0.0, VARIANTS[vname], args.reps, 5)
                res["variant"] = vname
                rows.append(res)
                t = res["timing"]
                print(f"{m}x{n}x{k} {layout} {vname}: asm {t['asmgemm']['median_ms']:.3f} ms "
                      f"{t['asmgemm']['tflops']:.2f} TF  cublas {t['cublas']['median_ms']:.3f} ms "
                      f"{t['cublas']['tflops']:.2f} TF  ratio {res['ratio_to_cublas']:.3f} "
                      f"err64 {res['errors']['rel_norm_err_vs_fp64']:.2e} ok={res['ok']}", flush=True)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "sgemm_bench.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    print("\n| shape | layout | variant | asmgemm ms | asmgemm TFLOP/s | cuBLAS ms | cuBLAS TFLOP/s | ratio | rel err fp64 | spread asm (min-max ms) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        t = r["timing"]
        print(f"| {r['m']}x{r['n']}x{r['k']} | {r['layout']} | {r['variant']} | {t['asmgemm']['median_ms']:.3f} | "
              f"{t['asmgemm']['tflops']:.2f} | {t['cublas']['median_ms']:.3f} | {t['cublas']['tflops']:.2f} | "
              f"{r['ratio_to_cublas']:.3f} | {r['errors']['rel_norm_err_vs_fp64']:.1e} | "
              f"{t['asmgemm']['min_ms']:.3f}-{t['asmgemm']['max_ms']:.3f} |")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
