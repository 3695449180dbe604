#!/usr/bin/env python3
"""The target of an Nsight Compute (ncu) profile: one GEMM shape (or several, --shape), asmgemm.gemm
then cuBLAS, --rounds times, nothing else launched in between. cuBLAS is cupy.matmul, or
cublasGemmEx where C's dtype is not A's (hgemm_f32c: fp16 A and B, fp32 C), as `asmgemm bench`
times it.

Each round launches the asmgemm kernel once and cuBLAS once, so with the default 3 rounds
`ncu -k regex:'sgemm|gemm|Kernel' --launch-skip 4 --launch-count 2` profiles round 3's pair
(warm: module loaded, kernel built, cuBLAS handle made). The `ncu` part of tools/device_verify.sh
runs it that way. Needs a GPU and CuPy.

Usage (GPU):
    ncu ... python3 tools/sgemm_profile.py 4096 4096 4096             # what asmgemm.gemm picks
    ncu ... python3 tools/sgemm_profile.py 4096 4096 4096 '{"BK": 16, "RQ": 4}'
    ncu ... python3 tools/sgemm_profile.py 4096 4096 4096 --sass-patch stall   # a patched cubin
    ncu ... python3 tools/sgemm_profile.py --kernel hgemm_f32c --rounds 1 --shape 1024x1024x1024 \
        --shape 512x768x3072                                            # shapes in turn, one process
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asmgemm.bench.problem import GemmProblem
from asmgemm.bench.shapes import make_shape, parse_shape
from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.gemm import gemm, last_launch
from asmgemm.runtime.gpu import require_gpu


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("m", type=int, nargs="?", help="rows of C")
    ap.add_argument("n", type=int, nargs="?", help="columns of C")
    ap.add_argument("k", type=int, nargs="?", help="inner dimension")
    ap.add_argument("params", nargs="?", default="null",
                    help="-D overrides as a JSON object, e.g. '{\"BK\": 16}'; 'null' (default): what "
                         "asmgemm.gemm chooses (tuning cache, else the size rule)")
    ap.add_argument("--kernel", default="sgemm", help="kernel spec name (`asmgemm kernels`; default sgemm)")
    ap.add_argument("--layout", choices=("nn", "nt", "tn", "tt"), default="nn",
                    help="op(A), op(B): t = stored transposed (default nn)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of (asmgemm, cuBLAS) launches (default 3)")
    ap.add_argument("--shape", action="append", default=[], metavar="MxNxK",
                    help="a shape to run instead of m n k (repeatable: each in turn, its rounds "
                         "together; ncu replays every launch with caches flushed, so --rounds 1 "
                         "profiles each shape once)")
    ap.add_argument("--sass-patch", metavar="PASSES",
                    help="run the kernel with these control-code passes applied to its cubin (issue 35), as "
                         "tools/variant_ab.py's @PASSES: reuse,stall,yield_every=N,rules=FILE")
    ap.add_argument("--params", dest="params_opt", metavar="JSON",
                    help="the -D overrides, as the positional params (which --shape alone cannot reach)")
    args = ap.parse_args(argv)
    if args.params_opt is not None:
        args.params = args.params_opt
    shapes = []
    try:
        if args.m is not None:
            if args.k is None:
                ap.error("m n k: give all three (or --shape MxNxK)")
            shapes.append(make_shape(args.m, args.n, args.k, where="m n k: "))
        shapes += [parse_shape(text, "--shape ") for text in args.shape]
    except AsmError as exc:
        ap.error(exc.message)
    if not shapes:
        ap.error("no shape: give m n k or --shape MxNxK")
    try:
        params = json.loads(args.params)
    except ValueError as exc:
        ap.error(f"params: not JSON ({exc})")
    if params is not None and not isinstance(params, dict):
        ap.error("params: a JSON object of NAME: value, or null")

    try:
        spec = get_spec(args.kernel)
        if args.sass_patch:
            sys.path.insert(0, str(Path(__file__).parent))
            from variant_ab import patched_spec     # one parser of the pass list for the tools
            spec = patched_spec(ap, spec, args.sass_patch)
        cp = require_gpu("sgemm_profile.py")
        for shape in shapes:
            # the benchmark's problem: operands in the layout, C of the spec's dtype, and cuBLAS as
            # `asmgemm bench` times it (cupy.matmul; cublasGemmEx where C's dtype is not A's)
            prob = GemmProblem(cp, shape, args.layout, spec.dtypes.a, c_dtype=spec.dtypes.c)
            c = prob.output()
            if args.sass_patch and params is None:
                # the configuration the plain kernel's dispatch runs (a patched copy has no database
                # entries of its own, so left to choose it may pick another): ptxas's code and the
                # patch are profiled on the same tiling, as tools/variant_ab.py --from-dispatch times them
                gemm(prob.a, prob.b, c, trans_a=prob.trans_a, trans_b=prob.trans_b, kernel=args.kernel)
                ran = last_launch()
                shape_params = ran["rerun_params"] if ran["kernel"] == args.kernel else {}
                print(f"{shape}: profiling {spec.name} with the plain dispatch's {shape_params}", file=sys.stderr)
            else:
                shape_params = params
            for _ in range(args.rounds):
                gemm(prob.a, prob.b, c, trans_a=prob.trans_a, trans_b=prob.trans_b, params=shape_params, kernel=spec.name)
                prob.cublas(c)
        cp.cuda.Device().synchronize()
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
