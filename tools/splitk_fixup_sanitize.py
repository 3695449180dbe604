#!/usr/bin/env python3
"""Issue 32's compute-sanitizer workload for split-K in one launch (mma_gemm.sasm's SPLIT_FIXUP):
one odd split shape per mode, fp16 and bf16 (16x314x1725, S = 27: the last block of each tile
reads the 27 slices and the tile-width pad past the last one; 133x33x4290 tn, S = 5, beta != 0),
each checked against float64 and the one-launch C against the reduce kernel's bit for bit. Prints
one line per case and `SANITIZE_RESULTS OK` (exit 0) or `SANITIZE_RESULTS WRONG` (exit 1) last;
compute-sanitizer exits 3 on a memory error (memcheck) or a shared-memory hazard (racecheck).
Needs a GPU and CuPy.

Usage (GPU):
    compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/splitk_fixup_sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python3 tools/splitk_fixup_sanitize.py
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.gemm import gemm, last_launch
from asmgemm.runtime.gpu import require_gpu

SMALL = {"BM": 64, "BN": 64, "WM": 32, "WN": 32}
CASES = [(16, 314, 1725, 27, "nn", 1.0, 0.0), (133, 33, 4290, 5, "tn", 0.75, -0.5)]


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    cp = require_gpu("tools/splitk_fixup_sanitize.py")
    ok = True
    rng = np.random.default_rng(0)
    for kernel in ("hgemm_mma", "bgemm_mma"):
        limit = get_spec(kernel).rel_err_limit
        for m, n, k, s, layout, alpha, beta in CASES:
            def operand(rows, cols):
                x = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
                if kernel == "bgemm_mma":
                    bits = (x.view(np.uint32) >> 16).astype(np.uint16)
                    return cp.asarray(bits), (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
                h = x.astype(np.float16)
                return cp.asarray(h), h.astype(np.float64)
            a, av = operand(*((k, m) if layout[0] == "t" else (m, k)))
            b, bv = operand(*((n, k) if layout[1] == "t" else (k, n)))
            c0, cv = operand(m, n)
            a_op, av_op = (a.T, av.T) if layout[0] == "t" else (a, av)
            b_op, bv_op = (b.T, bv.T) if layout[1] == "t" else (b, bv)
            want = alpha * (av_op @ bv_op) + beta * cv
            outs = {}
            for fixup in (1, 0):
                c = c0.copy()
                gemm(a_op, b_op, c, alpha=alpha, beta=beta, kernel=kernel,
                     params={**SMALL, "SPLIT_K": s, "SPLIT_FIXUP": fixup})
                ran = last_launch()
                got = cp.asnumpy(c)
                vals = ((got.astype(np.uint32) << 16).view(np.float32) if kernel == "bgemm_mma"
                        else got.astype(np.float32)).astype(np.float64)
                err = float(np.linalg.norm(vals - want) / np.linalg.norm(want))
                print(f"{kernel} {m}x{n}x{k} {layout} S={ran['splits']} reduce={ran['reduce']}: rel err {err:.2e}")
                ok &= err < limit and ran["splits"] == s
                outs[fixup] = got
            same = bool((outs[0].view(np.uint16) == outs[1].view(np.uint16)).all())
            print(f"  one launch == two launches bit for bit: {same}")
            ok &= same
    cp.cuda.get_current_stream().synchronize()
    print("SANITIZE_RESULTS " + ("OK" if ok else "WRONG"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
