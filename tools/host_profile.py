#!/usr/bin/env python3
"""Where a repeated `asmgemm.gemm` call spends its host time: cProfile over many calls of one
shape (CuPy or torch operands), beside the per-call wall time of asmgemm and of cupy.matmul /
torch.matmul on the same operands. The kept launch plan is made before profiling, so what is
profiled is the steady state a loop of calls sees. Needs a GPU.

Usage (GPU):
    python3 tools/host_profile.py 16 314 1725 --dtype float16            # a split-K call
    python3 tools/host_profile.py 652 415 148 --dtype float16 --torch --top 30
    python3 tools/host_profile.py 128 128 128 --torch --hold -1   # every call's C at a new address
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import sys
import time

from asmgemm.errors import AsmError
from asmgemm.runtime.gemm import gemm, last_launch
from asmgemm.runtime.gpu import require_gpu


def per_call_us(fn, calls: int, sync) -> float:
    """Wall time per call of `calls` back-to-back calls, the GPU drained before and after."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("m", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("--dtype", default="float16", choices=("float32", "float16", "bfloat16"))
    ap.add_argument("--layout", default="nn", choices=("nn", "nt", "tn", "tt"))
    ap.add_argument("--torch", action="store_true", help="torch tensors (default: CuPy arrays)")
    ap.add_argument("--calls", type=int, default=2000, help="calls profiled (default 2000)")
    ap.add_argument("--top", type=int, default=25, help="functions listed, by own time (default 25)")
    ap.add_argument("--hold", type=int, default=0,
                    help="keep the last HOLD results alive (default 0: each is dropped, so the allocator hands "
                         "the next call the same C; -1: keep all, every call a new C pointer)")
    args = ap.parse_args(argv)
    try:
        cp = require_gpu("host_profile.py")
        ta, tb = args.layout[0] == "t", args.layout[1] == "t"
        rng = cp.random.default_rng(0)
        dt = cp.float32 if args.dtype == "float32" else cp.float16
        a = rng.standard_normal((args.k, args.m) if ta else (args.m, args.k), dtype=cp.float32).astype(dt)
        b = rng.standard_normal((args.n, args.k) if tb else (args.k, args.n), dtype=cp.float32).astype(dt)
        sync = cp.cuda.Device().synchronize
        if args.torch or args.dtype == "bfloat16":
            import torch
            tdt = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[args.dtype]
            a, b = torch.from_dlpack(a).to(tdt), torch.from_dlpack(b).to(tdt)
            sync = torch.cuda.synchronize
            opa, opb = (a.t() if ta else a), (b.t() if tb else b)
            ref_name, ref = "torch.matmul", (lambda: hold(torch.matmul(opa, opb)))
        else:
            opa, opb = (a.T if ta else a), (b.T if tb else b)
            ref_name, ref = "cupy.matmul", (lambda: hold(cp.matmul(opa, opb)))

        held = collections.deque(maxlen=None if args.hold < 0 else max(args.hold, 1))
        hold = held.append if args.hold else (lambda x: None)

        def call():
            hold(gemm(a, b, trans_a=ta, trans_b=tb))
        call()
        ran = last_launch()
        for fn in (call, ref):          # warm both (plans, handles, allocator pools)
            per_call_us(fn, 50, sync)
        mine, theirs = per_call_us(call, args.calls, sync), per_call_us(ref, args.calls, sync)
        print(f"{args.m}x{args.n}x{args.k} {args.dtype} {args.layout} ({'torch' if args.torch else 'CuPy'} operands): "
              f"{ran['kernel']} {ran['config']} splits={ran['splits']} copies={ran['copies']}")
        print(f"per call in a loop of {args.calls}"
              f"{'' if not args.hold else ', results kept: all' if args.hold < 0 else f', last {args.hold} results kept'}: "
              f"asmgemm {mine:.1f} us, {ref_name} {theirs:.1f} us")
        held.clear()
        prof = cProfile.Profile()
        sync()
        prof.enable()
        for _ in range(args.calls):
            call()
        prof.disable()
        sync()
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
