#!/usr/bin/env python3
"""Why a grouped (MoE) call is slower than torch._grouped_mm: GPU time of asmgemm.grouped_gemm
(default build and -D variants), torch._grouped_mm, and the same tile work as one 2-D GEMM of
all tokens (asmgemm's default, which may use clusters, and the grouped build's parameters
without GROUPED), per case of the moe preset. Needs a GPU and torch.

    python3 tools/moe_diag.py --case 8:14336:4096:32768 --variant BN=128 --variant BN=256
"""
from __future__ import annotations

import argparse
import json

from asmgemm.bench.batched import MoeCase
from asmgemm.runtime.gemm import gemm, last_launch
from asmgemm.runtime.grouped import grouped_gemm
from gpu_events import gpu_ms, require_torch, torch, variant_params      # tools/gpu_events.py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", required=True, help="E:K:N:TOKENS")
    ap.add_argument("--variant", action="append", default=[], help="NAME=V[,NAME=V]: -D overrides on the default build")
    ap.add_argument("--json")
    args = ap.parse_args()
    require_torch("tools/moe_diag.py")
    out = []
    for spec in args.case:
        e, k, n, t = map(int, spec.split(":"))
        case = MoeCase(e, k, n, t)
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(t, k, device="cuda", generator=g).to(torch.bfloat16)
        w = (torch.randn(e, n, k, device="cuda", generator=g) * k ** -0.5).to(torch.bfloat16)
        b = w.transpose(1, 2)
        offs = torch.tensor(case.tokens, device="cuda").cumsum(0).to(torch.int32)
        tf = lambda ms: round(case.flops / ms / 1e9, 1)  # noqa: E731
        row = {"case": case.label, "tokens": case.tokens}
        ms = gpu_ms(lambda: grouped_gemm(a, b, offs))
        ran = last_launch()
        base = dict(ran.get("params") or {})
        # the grouped build as a 2-D call's params= (rerun_params name a split by its count)
        as_2d = {kk: vv for kk, vv in (ran.get("rerun_params") or {}).items() if kk != "GROUPED"}
        row["grouped"] = {"ms": ms, "tflops": tf(ms), "params": base, "grid": ran["grid"]}
        ref = grouped_gemm(a, b, offs).float()
        for v in args.variant:
            p = variant_params(base, v)
            try:
                got = grouped_gemm(a, b, offs, params=p).float()
                err = float((got - ref).norm() / ref.norm())
                ms = gpu_ms(lambda: grouped_gemm(a, b, offs, params=p))
                row[f"grouped {v}"] = {"ms": ms, "tflops": tf(ms), "rel_to_default": err}
            except Exception as exc:  # a variant the guards refuse
                row[f"grouped {v}"] = {"error": str(exc)[:300]}
        if hasattr(torch, "_grouped_mm"):
            ms = gpu_ms(lambda: torch._grouped_mm(a, b, offs=offs))
            row["torch._grouped_mm"] = {"ms": ms, "tflops": tf(ms)}
        b0 = b[0]
        ms = gpu_ms(lambda: gemm(a, b0))
        ran = last_launch()
        row["2-D all tokens, default"] = {"ms": ms, "tflops": tf(ms), "params": ran.get("params"), "config": ran.get("config")}
        try:
            ms = gpu_ms(lambda: gemm(a, b0, params=as_2d))
            row["2-D all tokens, grouped's params"] = {"ms": ms, "tflops": tf(ms)}
        except Exception as exc:
            row["2-D all tokens, grouped's params"] = {"error": str(exc)[:300]}
        ms = gpu_ms(lambda: torch.matmul(a, b0))
        row["torch 2-D all tokens"] = {"ms": ms, "tflops": tf(ms)}
        print(json.dumps(row), flush=True)
        out.append(row)
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


if __name__ == "__main__":
    main()
