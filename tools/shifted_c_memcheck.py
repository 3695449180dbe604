#!/usr/bin/env python3
"""One hgemm call whose 16-bit C ends at the last byte of its own cudaMalloc, for compute-sanitizer
memcheck of the SHIFTED_C store (kernels_ptx/hgemm/epilogue_staged.inc, STORE_TILE_SHIFTED): rows
LDC halves apart, the first OFF halves into the allocation, the last row ending the allocation, so a
16-byte piece or an end element stored past the matrix is an out-of-bounds write memcheck reports.

Run each case in its own process: after the first invalid access the CUDA context is gone. CuPy's
memory pool is off, so memcheck knows each allocation's exact size. The call takes hgemm's own path
(path_model.in_place_off: odd A, B copied to padded rows) with C_T = 0 (no swap). Prints what ran (the launch's
c_shifted, split and tiling) and the relative error against an fp32 product; exits 1 on a wrong
result, 2 when the call did not take the shifted store (nothing checked).

Usage (GPU, after `source tools/device_setup.sh`):
    compute-sanitizer --tool memcheck --report-api-errors no python3 tools/shifted_c_memcheck.py 515x333x301 341 3
"""
from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", help="MxNxK (layout nn)")
    ap.add_argument("ldc", type=int, help="C's leading dimension in halves (>= N)")
    ap.add_argument("off", type=int, nargs="?", default=0, help="C's first element, halves into its allocation")
    ap.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    args = ap.parse_args(argv)
    try:
        m, n, k = (int(x) for x in args.shape.split("x"))
    except ValueError:
        ap.error(f"shape {args.shape!r} is not MxNxK")
    if args.ldc < n:
        ap.error(f"ldc {args.ldc} < N {n}")
    import cupy as cp
    import asmgemm
    from asmgemm.runtime import path_model
    from asmgemm.runtime.gemm import last_launch
    cp.cuda.set_allocator(None)             # one cudaMalloc an array: memcheck sees each one's end
    rng = cp.random.default_rng(m + 7 * n + 13 * k)
    a32 = rng.standard_normal((m, k), dtype=cp.float32)
    b32 = rng.standard_normal((k, n), dtype=cp.float32)
    store = cp.zeros((args.off + (m - 1) * args.ldc + n,), dtype=cp.uint16)
    c = cp.ndarray((m, n), cp.uint16, store.data + 2 * args.off, strides=(2 * args.ldc, 2))
    if args.dtype == "float16":
        a, b, c = a32.astype(cp.float16), b32.astype(cp.float16), c.view(cp.float16)
        av, bv = a.astype(cp.float32), b.astype(cp.float32)
        kernel = "hgemm"
    else:
        a = (a32.view(cp.uint32) >> 16).astype(cp.uint16)
        b = (b32.view(cp.uint32) >> 16).astype(cp.uint16)
        av, bv = (a.astype(cp.uint32) << 16).view(cp.float32), (b.astype(cp.uint32) << 16).view(cp.float32)
        kernel = "bgemm"
    print(f"launching {args.shape} ldc {args.ldc} off {args.off} {args.dtype}", flush=True)
    # hgemm's own path (an odd B copied to padded rows, not the in-place kernel) and unswapped (the
    # size rules swap some of these shapes, whose C^T leaves by pairs): the shifted store runs
    with path_model.in_place_off():
        asmgemm.gemm(a, b, c, kernel=kernel, params={"C_T": 0})
    cp.cuda.runtime.deviceSynchronize()
    ran = last_launch()
    got = (c.astype(cp.uint32) << 16).view(cp.float32) if args.dtype == "bfloat16" else c.astype(cp.float32)
    ref = av @ bv
    err = float(cp.linalg.norm(got - ref) / cp.linalg.norm(ref))
    print(f"ran c_shifted={ran.get('c_shifted')} split={ran.get('split')} params={ran.get('params')} "
          f"rel err {err:.2e}", flush=True)
    if not ran.get("c_shifted"):
        return 2
    return 0 if err < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
