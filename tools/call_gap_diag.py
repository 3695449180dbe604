#!/usr/bin/env python3
"""Where a call's time beyond its GPU time goes (the `bench` call mode against its gpu mode), for the
moe and attention presets' cases: asmgemm against its torch anchor, each timed five ways.

  host      perf_counter around the call on an idle GPU (Python, checks, the launch): the host work
  call      bench's call mode: synchronize, L2 flush, synchronize, event, call, event
  call_warm the same, with 200 us of GPU spin queued before the start event: the host work hidden,
            but the kernel starts right after the spin (clocks and the launch path warm), L2 cold
  gpu       bench's gpu mode: flush, a spin of twice the host time, event, call, event
  gpu_late  event, call, event with the spin before it but no flush: L2 warm
Medians of REPS, implementations interleaved. A call - gpu gap the host column does not explain is
the kernel's own start from an idle GPU (launch of a persistent cluster grid, clocks).

--paths judges the path model (path_model.decide, `asmgemm explain`'s "path" line) on --gemm
cases of a kernel with an in-place twin: beside the call as dispatched it times "tma" (the TMA
kernel with the model's in-place choice turned off: padded copies where TMA cannot read an operand,
its own store of a narrow C) and "in_place" (kernel= the in-place kernel, its own dispatch).

    python3 tools/call_gap_diag.py --moe 64:14336:4096:32768 --attention qk:512:4096:64:float16
    python3 tools/call_gap_diag.py --paths --gemm 4417:2901:16:nt:float16
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time

from asmgemm.bench import batched
from asmgemm.bench.timing import CudaEventTimer, GpuPreRoll, L2Flusher
from asmgemm.runtime import gemm as gemm_module, path_model
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.gemm import gemm, last_launch
from gpu_events import require_torch, torch, variant_params      # tools/gpu_events.py


def measure(fns: dict, reps: int) -> dict:
    timer, flush, spin = CudaEventTimer(), L2Flusher(), GpuPreRoll()
    for fn in fns.values():
        fn(), fn()
    timer.synchronize()
    got = {name: {k: [] for k in ("host", "call", "call_warm", "gpu", "gpu_late")} for name in fns}
    for rep in range(reps):
        order = list(fns)[rep % len(fns):] + list(fns)[:rep % len(fns)]
        for name in order:
            fn, row = fns[name], got[name]
            timer.synchronize()
            t0 = time.perf_counter()
            fn()
            row["host"].append((time.perf_counter() - t0) * 1e3)
            timer.synchronize()
            flush()
            timer.synchronize()
            s = timer.mark()
            fn()
            row["call"].append((s, timer.mark()))
            timer.synchronize()
            flush()
            timer.synchronize()
            spin(200.0)
            s = timer.mark()
            fn()
            row["call_warm"].append((s, timer.mark()))
            flush()
            spin(max(40.0, 2 * row["host"][-1] * 1e3))
            s = timer.mark()
            fn()
            row["gpu"].append((s, timer.mark()))
            spin(40.0)
            s = timer.mark()
            fn()
            row["gpu_late"].append((s, timer.mark()))
    timer.synchronize()
    out = {}
    for name, row in got.items():
        out[name] = {k: round(statistics.median(v if k == "host" else [timer.elapsed_ms(a, b) for a, b in v]), 4)
                     for k, v in row.items()}
    return out


def profile(fn, calls: int, label: str) -> None:
    """cProfile of `calls` calls of fn, each on an idle GPU (synchronized before it)."""
    if calls <= 0:
        return
    prof = cProfile.Profile()
    for _ in range(calls):
        torch.cuda.synchronize()
        prof.enable()
        fn()
        prof.disable()
    torch.cuda.synchronize()
    print(f"== profile: {label}, {calls} calls")
    pstats.Stats(prof).sort_stats("tottime").print_stats(20)


def tma_path_launch(call) -> dict:
    """last_launch() of `call` with the path model's in-place choice turned off (path_model.in_place_off,
    as the GPU tests' hgemm_own_path fixture): the TMA kernel, with padded copies where it cannot read
    an operand."""
    try:
        with path_model.in_place_off():
            gemm_module.clear_plan_cache()
            call()
            return last_launch()
    finally:
        gemm_module.clear_plan_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--moe", action="append", default=[], help="E:K:N:TOKENS")
    ap.add_argument("--attention", action="append", default=[], help="qk|pv:BH:S:D:DTYPE")
    ap.add_argument("--gemm", action="append", default=[], help="M:N:K:LAYOUT:DTYPE (2-D, fresh operands)")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=V[,NAME=V]: --gemm cases also run these -D overrides of the default launch")
    ap.add_argument("--paths", action="store_true",
                    help="--gemm cases also run the TMA kernel with padded copies ('tma') and the in-place "
                         "kernel ('in_place'), to judge the path model's choice between them")
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--profile", type=int, default=0,
                    help="cProfile asmgemm's call of each case this many times, the GPU idle before each "
                         "(synchronized, as in the call mode), and list the top 20 functions by own time")
    ap.add_argument("--json")
    args = ap.parse_args()
    require_torch("tools/call_gap_diag.py")
    anchor = "torch._grouped_mm" if batched.grouped_mm_runs(torch) else "torch.matmul loop"
    rows = []
    for spec in args.moe:
        e, k, n, t = map(int, spec.split(":"))
        case = batched.MoeCase(e, k, n, t)
        fns, _ = batched.moe_calls(torch, case, anchor)
        rows.append({"case": "moe " + case.label, **measure(fns, args.reps), "ran": batched.ran_kernel()})
        profile(fns["asmgemm"], args.profile, case.label)
    for spec in args.attention:
        form, bh, s, d, dtype = spec.split(":")
        case = batched.AttentionCase(int(bh), int(s), int(d), form, dtype)
        fns, _ = batched.attention_calls(torch, case)
        rows.append({"case": "attention " + case.label, **measure(fns, args.reps), "ran": batched.ran_kernel(),
                     "params": last_launch().get("params")})
        profile(fns["asmgemm"], args.profile, case.label)
    for spec in args.gemm:
        m, n, k, layout, dtype = spec.split(":")
        m, n, k = int(m), int(n), int(k)
        g = torch.Generator(device="cuda").manual_seed(0)
        dt = getattr(torch, dtype)
        ta, tb = layout[0] == "t", layout[1] == "t"
        a = torch.randn(*((k, m) if ta else (m, k)), device="cuda", generator=g).to(dt)
        b = torch.randn(*((n, k) if tb else (k, n)), device="cuda", generator=g).to(dt)
        opa, opb = (a.t() if ta else a), (b.t() if tb else b)
        gemm(a, b, trans_a=ta, trans_b=tb)
        ran = last_launch()
        fns = {"asmgemm": lambda: gemm(a, b, trans_a=ta, trans_b=tb), "torch": lambda: torch.matmul(opa, opb)}
        for v in args.variant:
            params = variant_params(ran["rerun_params"], v)
            fns[v] = lambda params=params: gemm(a, b, trans_a=ta, trans_b=tb, params=params, kernel=ran["kernel"])
        if args.paths:
            tma = tma_path_launch(lambda: gemm(a, b, trans_a=ta, trans_b=tb))
            fns["tma"] = lambda tma=tma: gemm(a, b, trans_a=ta, trans_b=tb, params=tma["rerun_params"],
                                              kernel=tma["kernel"])
            in_place = get_spec(tma["kernel"]).in_place
            if in_place:
                fns["in_place"] = lambda name=in_place: gemm(a, b, trans_a=ta, trans_b=tb, kernel=name)
        rows.append({"case": f"gemm {m}x{n}x{k} {layout} {dtype}", **measure(fns, args.reps),
                     "ran": f"{ran['kernel']} {ran.get('config')} splits={ran.get('splits')}"})
        profile(fns["asmgemm"], args.profile, f"gemm {m}x{n}x{k} {layout} {dtype}")
    for r in rows:
        print(r["case"], r.get("ran"))
        for name, v in r.items():
            if isinstance(v, dict) and "host" in v:
                print(f"   {name:18s} " + " ".join(f"{k} {x * 1e3:9.1f}us" for k, x in v.items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
