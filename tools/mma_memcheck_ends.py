#!/usr/bin/env python3
"""One hgemm_mma call whose operands end at the last byte of their own cudaMalloc, for
compute-sanitizer memcheck (issue 31: the kernel reads any operand in place and nothing past it).

Run each case in its own process under memcheck: after the first invalid access the CUDA context is
gone, so a second call in the same process would fail for that reason and hide which build read
past the matrix (the REALIGN = 2 ring's reads were first reported beside a REALIGN = 1 result line).

  odd CASE REALIGN   rows of an odd number of halves (ALIGN 2): A's and B's leading dimensions
                     their rows' lengths + 1 or 2, laid out as the dispatch plans the call, then the
                     same build with -D REALIGN laid over it (0: 2-byte loads, 1: granules realigned
                     in registers, 2: through the cp.async ring); CASE is MxNxK:layout
  cut CASE           the cp.async paths (16-, 8-, 4-byte copies): leading dimensions padded up to the
                     copy width, K and M, N not multiples of 8, so that the stored matrices' last
                     rows end inside a chunk (COPY_TILE's `last`); CASE is MxNxK:layout:ALIGN_A:ALIGN_B

CuPy's memory pool is off, so memcheck knows each allocation's exact size. Prints what ran and the
relative error against an fp64 product; exits 1 on a wrong result.

Usage (GPU, after `source tools/device_setup.sh`):
    compute-sanitizer --tool memcheck --report-api-errors no python3 tools/mma_memcheck_ends.py odd 127x129x65:tt 2
    compute-sanitizer --tool memcheck --report-api-errors no python3 tools/mma_memcheck_ends.py cut 70x66x65:nt:8:4
"""
from __future__ import annotations

import argparse
import sys


def _case(text: str, fields: int) -> list[str]:
    parts = text.split(":")
    if len(parts) != fields or len(parts[0].split("x")) != 3 or parts[1] not in ("nn", "nt", "tn", "tt"):
        raise SystemExit(f"mma_memcheck_ends: bad case {text!r}")
    return parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=("odd", "cut"))
    ap.add_argument("case")
    ap.add_argument("realign", nargs="?", type=int, choices=(0, 1, 2))
    args = ap.parse_args(argv)
    import cupy as cp
    import numpy as np
    from asmgemm.runtime.gemm import gemm, last_launch
    cp.cuda.set_allocator(None)             # one cudaMalloc an array: memcheck sees each one's end
    parts = _case(args.case, 2 if args.kind == "odd" else 4)
    m, n, k = (int(x) for x in parts[0].split("x"))
    layout = parts[1]
    ta, tb = layout[0] == "t", layout[1] == "t"
    ar, ac = (k, m) if ta else (m, k)
    br, bc = (n, k) if tb else (k, n)
    if args.kind == "odd":
        lda, ldb = ac + (2 if ac % 2 else 1), bc + (2 if bc % 2 else 3)
    else:
        ea, eb = int(parts[2]) // 2, int(parts[3]) // 2
        lda, ldb = -(-ac // ea) * ea, -(-bc // eb) * eb
    rng = np.random.default_rng(0)

    def at_end(rows, cols, ld, pad=0):
        store = cp.asarray(rng.uniform(-1, 1, (rows - 1) * ld + cols + pad).astype(np.float16))
        return cp.ndarray((rows, cols), cp.float16, store.data, strides=(2 * ld, 2)), store

    def operands(pad):
        a, sa = at_end(ar, ac, lda, pad)
        b, sb = at_end(br, bc, ldb, pad)
        return (a.T if ta else a), (b.T if tb else b), (sa, sb)

    params = None
    if args.kind == "odd":
        if args.realign is None:
            ap.error("odd needs REALIGN")
        # the dispatch's plan first, on operands with room after them (no memcheck report there)
        pa, pb, _keep = operands(64)
        gemm(pa, pb, kernel="hgemm_mma")
        params = {**last_launch()["rerun_params"], "REALIGN": args.realign}
    a, b, _keep = operands(0)
    print(f"launching {args.kind} {args.case} lda {lda} ldb {ldb}" + (f" REALIGN={args.realign}" if params else ""),
          flush=True)
    c = gemm(a, b, kernel="hgemm_mma", params=params)
    cp.cuda.runtime.deviceSynchronize()
    ran = last_launch()["params"]
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
    print(f"ran ALIGN_A={ran.get('ALIGN_A')} ALIGN_B={ran.get('ALIGN_B')} REALIGN={ran.get('REALIGN', '1')} "
          f"rel err {err:.2e}", flush=True)
    return 0 if err < 2e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
