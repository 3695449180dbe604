#!/usr/bin/env python3
"""The target of an Nsight Compute (ncu) profile: one GEMM shape, asmgemm.gemm then cuBLAS
(cupy.matmul), --rounds times, nothing else launched in between.

Each round launches the asmgemm kernel once and cuBLAS once, so with the default 3 rounds
`ncu -k regex:'sgemm|gemm|Kernel' --launch-skip 4 --launch-count 2` profiles round 3's pair
(warm: module loaded, kernel built, cuBLAS handle made). The `ncu` part of tools/device_verify.sh
runs it that way. Needs a GPU and CuPy.

Usage (GPU):
    ncu ... python3 tools/sgemm_profile.py 4096 4096 4096             # what asmgemm.gemm picks
    ncu ... python3 tools/sgemm_profile.py 4096 4096 4096 '{"BK": 16, "RQ": 4}'
"""
from __future__ import annotations

import argparse
import json
import sys

from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.gemm import gemm
from asmgemm.runtime.gpu import require_gpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("m", type=int, help="rows of C")
    ap.add_argument("n", type=int, help="columns of C")
    ap.add_argument("k", type=int, help="inner dimension")
    ap.add_argument("params", nargs="?", default="null",
                    help="-D overrides as a JSON object, e.g. '{\"BK\": 16}'; 'null' (default): what "
                         "asmgemm.gemm chooses (tuning cache, else the size rule)")
    ap.add_argument("--kernel", default="sgemm", help="kernel spec name (`asmgemm kernels`; default sgemm)")
    ap.add_argument("--layout", choices=("nn", "nt", "tn", "tt"), default="nn",
                    help="op(A), op(B): t = stored transposed (default nn)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (asmgemm, cuBLAS) launches (default 3)")
    args = ap.parse_args(argv)
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        ap.error(f"params: not JSON ({exc})")
    if params is not None and not isinstance(params, dict):
        ap.error("params: a JSON object of NAME: value, or null")

    try:
        spec = get_spec(args.kernel)
        cp = require_gpu("sgemm_profile.py")
        dtype = cp.dtype(spec.dtypes.a)
        ta, tb = args.layout[0] == "t", args.layout[1] == "t"
        m, n, k = args.m, args.n, args.k
        rng = cp.random.default_rng(0)
        a = rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32).astype(dtype, copy=False)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32).astype(dtype, copy=False)
        c = cp.empty((m, n), dtype=dtype)
        op_a, op_b = (a.T if ta else a), (b.T if tb else b)
        for _ in range(args.rounds):
            gemm(a, b, c, trans_a=ta, trans_b=tb, params=params, kernel=spec.name)
            cp.matmul(op_a, op_b, out=c)
        cp.cuda.Device().synchronize()
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
