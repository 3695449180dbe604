"""Few rows of C over a large B: does a second tile row read B from DRAM again, and does running the
call as C^T in one 192-wide tile column (ct_t128x192_st: B^T's rows each read once) avoid it?

For each shape and layout, GPU time (CUDA events, L2 flushed, host hidden by a pre-roll; median of
--reps, implementations interleaved) of the dispatched call, of catalog entries forced by name
through gemm(params=..., kernel="hgemm") (each entry's -D set; "ct_" entries run as C^T, C_T = 1),
and of cupy.matmul (and torch.matmul where it is installed), each result checked against cupy's in
fp32 (exit status 2 where one is over the kernel's rel_err_limit). `--only NAME,...` runs those
implementations twice each and times nothing (for ncu: their DRAM bytes, `--metrics
dram__bytes_read.sum`, the second launch of each). docs/log/dispatch.md, "A few tile rows over a
large B", has what it measured on the H200.

Usage (GPU, from the project root after `source tools/device_setup.sh`):
    python3 tools/probes/few_rows_probe.py --shape 176x15696x16336 --layout nn --layout nt
    ncu --clock-control none --metrics dram__bytes_read.sum -k regex:hgemm \
        python3 tools/probes/few_rows_probe.py --shape 176x15696x16336 --only t128x256,t128x256_cm2
"""
from __future__ import annotations

import argparse
import json
import sys

from asmgemm.bench.shapes import shape_argument

# the catalog's entries (kernels_ptx/kernels.toml [[hgemm.config]]) timed by default
DEFAULT_CONFIGS = ["t128x256", "t128x256_cm2", "t128x192_cm2", "ct_t128x64_st", "ct_t128x192_st"]


def entry_params(name: str) -> dict:
    """The params= that force the TMA kernel's catalog entry `name`, unsplit, as the dispatch passes
    them (Candidate.params: its -D set, C_T = 1 for a C^T entry, the split switches at 1)."""
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.catalog import entry_candidates
    spec = get_spec("hgemm")
    entry = next((e for e in spec.configs if e.name == name), None)
    if entry is None:
        raise SystemExit(f"--config {name}: not in hgemm's catalog ({', '.join(e.name for e in spec.configs)})")
    return entry_candidates(entry, spec.name, 0, plain=False, clusters=False)[0].params()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", type=shape_argument, action="append", required=True, help="MxNxK (repeatable)")
    ap.add_argument("--layout", action="append", choices=["nn", "nt", "tn", "tt"],
                    help="operand layouts (repeatable; default nn)")
    ap.add_argument("--config", action="append", help=f"a catalog entry to force (repeatable; default "
                    f"{', '.join(DEFAULT_CONFIGS)})")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--only", help="NAME[,NAME...]: run these implementations twice each, in this order, "
                    "and time nothing (for ncu: profile the second launch of each)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    import cupy as cp
    import numpy as np

    import asmgemm
    from asmgemm.bench.timing import time_interleaved
    from asmgemm.errors import AsmError
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.gemm import last_launch
    from probe_common import cublas_calls, gpu_timing

    limit = get_spec("hgemm").rel_err_limit
    rows, wrong = [], []
    flush, pre_roll = gpu_timing()
    for layout in args.layout or ["nn"]:
        ta, tb = layout[0] == "t", layout[1] == "t"
        for m, n, k in args.shape:
            rng = cp.random.default_rng(m * 7 + n * 13 + k)
            a = (rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32) * 0.1).astype(cp.float16)
            b = (rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32) * 0.1).astype(cp.float16)
            av, bv = (a.T if ta else a), (b.T if tb else b)
            ref = cp.matmul(av.astype(cp.float32), bv.astype(cp.float32))
            c = cp.empty((m, n), dtype=cp.float16)

            def ours(params=None):
                def fn():
                    if params is None:
                        asmgemm.gemm(a, b, c, trans_a=ta, trans_b=tb)
                    else:
                        asmgemm.gemm(a, b, c, trans_a=ta, trans_b=tb, params=params, kernel="hgemm")
                return fn

            fns = {"default": ours()}
            fns.update({name: ours(entry_params(name)) for name in args.config or DEFAULT_CONFIGS})
            fns.update(cublas_calls(cp, av, bv, c))
            if args.only:
                for name in args.only.split(","):
                    if name not in fns:
                        raise SystemExit(f"--only {name}: not one of {', '.join(fns)}")
                    for _ in range(2):
                        fns[name]()
                    cp.cuda.Device().synchronize()
                continue
            ran, err, launched = {}, {}, {}
            for name, fn in fns.items():
                c.fill(np.nan)
                try:
                    fn()
                except AsmError as exc:
                    print(f"{m}x{n}x{k} {layout} {name}: refused: {exc.message.splitlines()[0]}")
                    continue
                cp.cuda.Device().synchronize()
                err[name] = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
                if not err[name] <= limit:
                    wrong.append(f"{m}x{n}x{k} {layout} {name}: relative error {err[name]:.2e} (limit {limit:.0e})")
                if name not in ("cupy", "torch"):
                    launch = last_launch() or {}
                    launched[name] = f"{launch.get('kernel')} {launch.get('config', '')}".strip()
                ran[name] = fn
            stats = time_interleaved(ran, args.reps, flush=flush, pre_roll=pre_roll)
            us = {name: s.median_ms * 1e3 for name, s in stats.items()}
            best_ref = min(us[name] for name in ("cupy", "torch") if name in us)
            row = {"shape": [m, n, k], "layout": layout, "gpu_us": {k_: round(v, 2) for k_, v in us.items()},
                   "rel_err": {k_: float(f"{v:.3g}") for k_, v in err.items()}, "ran": launched,
                   "cublas_us": round(best_ref, 2)}
            rows.append(row)
            print(f"{m}x{n}x{k} {layout}: cuBLAS {best_ref:.1f} us; default ran {launched.get('default')}")
            for name in ran:
                print(f"   {name:16s} {us[name]:9.1f} us  x{best_ref / us[name]:.2f}  err {err[name]:.1e}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows, "wrong": wrong}, fh, indent=1)
    for line in wrong:
        print(f"WRONG {line}", file=sys.stderr)
    return 2 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
