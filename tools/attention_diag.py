#!/usr/bin/env python3
"""Where attention's batched GEMMs lose to torch: GPU time of asmgemm.gemm's default build and of
-D variants laid over it (params=), beside torch.matmul, per case (CUDA events, median of 7 after
2 warm-up calls; no L2 flush: these outputs are 10-17 GB). Each variant's output is compared with
the default's on the leading batches. Needs a GPU and torch.

    python3 tools/attention_diag.py --case qk:512:4096:64:float16 --variant C_BOXES_ASKED=1 --variant BN=128

--nvtx: no timing; each case once (after two warm-up calls) inside an NVTX range named after it
(':' as '_'), asmgemm's default build or each variant, then torch's: what tools/attention_l2.sh
runs under ncu.
"""
from __future__ import annotations

import argparse
import json

from asmgemm.runtime.gemm import gemm, last_launch
from gpu_events import gpu_ms, require_torch, torch, variant_params      # tools/gpu_events.py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", required=True, help="qk|pv:BH:S:D:DTYPE")
    ap.add_argument("--variant", action="append", default=[], help="NAME=V[,NAME=V]: -D overrides on the default build")
    ap.add_argument("--json")
    ap.add_argument("--nvtx", action="store_true", help="each case once in an NVTX range, untimed (for ncu)")
    args = ap.parse_args()
    require_torch("tools/attention_diag.py")
    if args.nvtx:
        return nvtx_once(args.case, args.variant)
    out = []
    for spec in args.case:
        ours, theirs, flops = case_calls(spec)
        tf = lambda ms: round(flops / ms / 1e9, 1)                               # noqa: E731
        row = {"case": spec}
        ms = gpu_ms(ours)
        ran = last_launch()
        base = dict(ran.get("rerun_params") or {})
        row["default"] = {"ms": ms, "tflops": tf(ms), "params": base, "grid": ran["grid"], "kernel": ran["kernel"]}
        ref = ours()[:4].float()
        for v in args.variant:
            p = variant_params(base, v)
            try:
                got = ours(p)[:4].float()
                err = float((got - ref).norm() / ref.norm())
                del got
                ms = gpu_ms(lambda: ours(p))
                row[v] = {"ms": ms, "tflops": tf(ms), "rel_to_default": err}
            except Exception as exc:  # a variant the guards refuse
                row[v] = {"error": str(exc)[:300]}
            torch.cuda.empty_cache()
        del ref
        torch.cuda.empty_cache()
        ms = gpu_ms(theirs)
        row["torch"] = {"ms": ms, "tflops": tf(ms)}
        torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        out.append(row)
        ours = theirs = None      # (and with them the case's operands)
        torch.cuda.empty_cache()
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)


def case_calls(spec: str):
    """(ours(params=None), theirs(), flops) of a case 'qk|pv:BH:S:D:DTYPE': attention's Q.K^T on
    (bh, s, d) Q and K, or P.V on (bh, s, s) scores and (bh, s, d) V, seeded."""
    which, bh, s, d, dtype = spec.split(":")
    bh, s, d = int(bh), int(s), int(d)
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    if which == "qk":
        x = torch.randn(bh, s, d, device="cuda", generator=g).to(dt)
        y = torch.randn(bh, s, d, device="cuda", generator=g).to(dt)
        ours = lambda p=None: gemm(x, y, trans_b=True, params=p)           # noqa: E731
        theirs = lambda: torch.matmul(x, y.transpose(1, 2))               # noqa: E731
    else:
        x = torch.rand(bh, s, s, device="cuda", generator=g, dtype=dt).div_(s)
        y = torch.randn(bh, s, d, device="cuda", generator=g).to(dt)
        ours = lambda p=None: gemm(x, y, params=p)                          # noqa: E731
        theirs = lambda: torch.matmul(x, y)                                 # noqa: E731
    return ours, theirs, 2 * bh * s * s * d


def nvtx_once(cases: list[str], variants: list[str]) -> None:
    """Each case once inside an NVTX range named after it: asmgemm's default build (or each variant,
    laid over the default's rerun_params as the timed mode does), then torch's."""
    for spec in cases:
        ours, theirs, _ = case_calls(spec)
        ours()
        base = dict(last_launch().get("rerun_params") or {})
        runs = [variant_params(base, v) for v in variants] or [None]
        for _ in range(2):
            for p in runs:
                ours(p)
            theirs()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(spec.replace(":", "_"))     # (ncu's CSV separates an NVTX name's fields by ':')
        for p in runs:
            ours(p)
        theirs()
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        ours = theirs = None
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
