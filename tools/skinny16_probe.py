#!/usr/bin/env python3
"""Would the 16-bit skinny kernel (gemm_skinny.sasm, hgemm_skinny / bgemm_skinny) serve the random
shapes' skinny deep-K calls with odd leading dimensions, which hgemm_mma's tiles run at 0.35-0.65x
cuBLAS? Per case: asmgemm's default dispatch, the skinny kernel named with kernel= (untuned: its size
and split rules), and torch.matmul, timed by asmgemm's benchmark timer (call and gpu modes,
interleaved, L2 flushed). A case with N <= 16 < M runs the skinny kernel on C^T = op(B)^T op(A)^T
(the same operands' storage with the transposes flipped; C^T comes out row-major, the same work).
Results are checked against torch in float64. Needs a GPU and torch.

    python3 tools/skinny16_probe.py --case 8:735:8112:tn:float16 --case 56:5:12421:tn:float16
"""
from __future__ import annotations

import argparse
import json

from asmgemm.bench.timing import L2Flusher, make_pre_roll, time_modes
from asmgemm.runtime.gemm import gemm, last_launch
from gpu_events import require_torch, torch      # tools/gpu_events.py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", required=True, help="M:N:K:LAYOUT:DTYPE")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--json")
    args = ap.parse_args()
    require_torch("tools/skinny16_probe.py")
    rows = []
    for spec in args.case:
        m, n, k, layout, dtype = spec.split(":")
        m, n, k = int(m), int(n), int(k)
        dt = getattr(torch, dtype)
        ta, tb = layout[0] == "t", layout[1] == "t"
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(*((k, m) if ta else (m, k)), device="cuda", generator=g).to(dt)
        b = torch.randn(*((n, k) if tb else (k, n)), device="cuda", generator=g).to(dt)
        opa, opb = (a.t() if ta else a), (b.t() if tb else b)
        skinny = "hgemm_skinny" if dtype == "float16" else "bgemm_skinny"
        want = opa.double() @ opb.double()
        fns = {"default": lambda: gemm(a, b, trans_a=ta, trans_b=tb), "torch": lambda: torch.matmul(opa, opb)}
        fns["default"]()
        ran = f"{last_launch()['kernel']} {last_launch().get('config')}"
        if m <= 16:
            fns["skinny"] = lambda: gemm(a, b, trans_a=ta, trans_b=tb, kernel=skinny)
            got = fns["skinny"]().double()
        else:
            fns["skinny"] = lambda: gemm(b, a, trans_a=not tb, trans_b=not ta, kernel=skinny)
            got = fns["skinny"]().double().t()
        skinny_ran = f"{last_launch()['kernel']} splits={last_launch().get('splits')} params={last_launch().get('params')}"
        err = float((got - want).abs().max() / want.abs().max())
        t = time_modes(fns, args.reps, flush=L2Flusher(), pre_roll=make_pre_roll(), modes=("call", "gpu"))
        row = {"case": spec, "default_ran": ran, "skinny_ran": skinny_ran, "skinny_rel_err": err,
               **{mode: {name: round(s.median_ms * 1e3, 2) for name, s in t[mode].items()} for mode in t}}
        rows.append(row)
        print(f"{spec}: us call/gpu  default {row['call']['default']}/{row['gpu']['default']} ({ran})  "
              f"skinny {row['call']['skinny']}/{row['gpu']['skinny']}  torch {row['call']['torch']}/{row['gpu']['torch']}"
              f"  err {err:.1e}  [{skinny_ran}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
