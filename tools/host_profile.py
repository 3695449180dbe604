#!/usr/bin/env python3
"""Where a repeated `asmgemm.gemm` call spends its host time: cProfile over many calls of one
shape (CuPy or torch operands), beside the per-call wall time of asmgemm and of cupy.matmul /
torch.matmul on the same operands. The kept launch plan is made before profiling, so what is
profiled is the steady state a loop of calls sees. Needs a GPU.

--pieces times each step of that repeated call (runtime/gemm.py _repeat_call) alone instead (a
loop of perf_counter, no profiler, whose own cost per call is many times what it measures for calls
this short): its checks, the operands' keys, the kept plan's lookup, C's allocation, the stream,
the argument block and the driver's launch, and "rest" = the whole call less their sum (the glue
between them: Python calls and branches). What a cut would save, before the cut is made.

Usage (GPU):
    python3 tools/host_profile.py 16 314 1725 --dtype float16            # a split-K call
    python3 tools/host_profile.py 652 415 148 --dtype float16 --torch --top 30
    python3 tools/host_profile.py 128 128 128 --torch --hold -1   # every call's C at a new address
    python3 tools/host_profile.py 652 415 148 --dtype float16 --torch --pieces
"""
from __future__ import annotations

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time

from asmgemm.errors import AsmError
from asmgemm import kernel_spec
from asmgemm.runtime import gemm as gemm_module
from asmgemm.runtime.gemm import gemm, last_launch
from asmgemm.runtime.gpu import require_gpu
from asmgemm.runtime.kept_launch import _last_launch


def per_call_us(fn, calls: int, sync) -> float:
    """Wall time per call of `calls` back-to-back calls, the GPU drained before and after."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def pieces(cp, a, b, ta: bool, tb: bool, calls: int, sync) -> list[tuple[str, float]]:
    """(step, us a call) for the steps of gemm(a, b)'s repeated call (runtime/gemm.py _repeat_call,
    the one function a loop's call runs), each timed alone; the last row is the whole call, the one
    before it what the steps leave unexplained."""
    gemm(a, b, trans_a=ta, trans_b=tb)
    gemm(a, b, trans_a=ta, trans_b=tb)              # the second call arms the repeated call's path
    plan = _last_launch[0]
    r = gemm_module._repeat
    torch = type(a) is r.tensor
    if not torch and type(a) is not r.ndarray:
        raise AsmError("host_profile --pieces: the repeated call's path is not armed for these arrays")
    if torch:
        def keys():
            pa, pb = a.data_ptr(), b.data_ptr()
            return ((a.shape, a.stride(), a.dtype, pa & 15, a.get_device()),
                    (b.shape, b.stride(), b.dtype, pb & 15, b.get_device()))
    else:
        def keys():
            da, db = a.data, b.data
            return ((a.shape, a.strides, a.dtype.char, da.ptr & 15, da.device_id),
                    (b.shape, b.strides, b.dtype.char, db.ptr & 15, db.device_id))
    key_a, key_b = keys()
    key = (key_a, key_b, True, ta, tb, (None, None, r.lookups_off), None, 0)
    if r.plans.get(key) is not plan:
        raise AsmError("host_profile --pieces: the kept plan is not under the key this tool builds (gemm's key "
                       "changed: update pieces())")
    memo = kernel_spec.version_memo

    def checks():
        for k, v in r.env_values:
            if r.env_data.get(k) is not v:
                return False
        return not (memo[2] is not r.token or r.token[0] != kernel_spec.registry_counter[0]
                    or time.monotonic() - memo[0] >= kernel_spec.SPEC_RECHECK_S or sys.modules.get("cupy") is not r.cupy)
    steps = [("the checks (environment, specs token, CuPy)", checks), ("A's and B's keys", keys),
             ("key tuple + plans.get", lambda: r.plans.get((key_a, key_b, True, ta, tb, (None, None, r.lookups_off),
                                                             None, 0))),
             ("plan.current()", plan.current), ("getDevice", r.get_device)]
    direct = plan.direct
    if direct is not None:
        launch, handle, gx, gy, gz, bx, by, bz, smem, block, c_strides = direct
        if torch:
            c = a.new_empty_strided(plan.c_shape, c_strides)
            steps += [("C allocation", lambda: a.new_empty_strided(plan.c_shape, c_strides)), ("C ptr", c.data_ptr),
                      ("stream", lambda: r.raw_stream(plan.device))]
            stream_ptr = r.raw_stream(plan.device)
        else:
            c = cp.empty(plan.c_shape, dtype=plan.c_dtype or a.dtype)
            steps += [("C allocation", lambda: cp.empty(plan.c_shape, dtype=plan.c_dtype or a.dtype)),
                      ("C ptr", lambda: c.data.ptr), ("stream", lambda: r.current_stream().ptr)]
            stream_ptr = r.current_stream().ptr
        pa, pb = (b.data_ptr(), a.data_ptr()) if torch and plan.swapped else (a.data_ptr(), b.data_ptr()) if torch \
            else (b.data.ptr, a.data.ptr) if plan.swapped else (a.data.ptr, b.data.ptr)
        pc = c.data_ptr() if torch else c.data.ptr

        def write():
            with block.lock:
                block.write(pa, pb, pc, 1.0, 0.0)
        steps += [("argument block write (under its lock)", write),
                  ("driver launch", lambda: launch(handle, gx, gy, gz, bx, by, bz, smem, stream_ptr, block.address, 0))]
    whole = per_call_us(lambda: gemm(a, b, trans_a=ta, trans_b=tb), calls, sync)
    rows = [(name, per_call_us(fn, calls, sync)) for name, fn in steps]
    loop = per_call_us(lambda: None, calls, sync)      # the timing loop's own cost, taken off each row
    rows = [(name, max(0.0, us - loop)) for name, us in rows]
    rows.append(("rest (glue: the call less the steps)", whole - loop - sum(us for _, us in rows)))
    rows.append(("the whole call", whole - loop))
    return rows


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
    ap.add_argument("--pieces", action="store_true",
                    help="time each step of the repeated call alone (no profiler), not cProfile")
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

        if args.pieces:
            pieces(cp, a, b, ta, tb, 200, sync)         # warm
            print(f"{args.m}x{args.n}x{args.k} {args.dtype} {args.layout} "
                  f"({'torch' if args.torch else 'CuPy'} operands): us a call, each step alone, median of 5 loops")
            runs = [pieces(cp, a, b, ta, tb, args.calls, sync) for _ in range(5)]
            for i, (name, _) in enumerate(runs[0]):
                print(f"  {name:38s} {statistics.median(r[i][1] for r in runs):7.2f}")
            print(f"  {ref_name:38s} {statistics.median(per_call_us(ref, args.calls, sync) for _ in range(5)):7.2f}")
            return 0

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
