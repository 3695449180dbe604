#!/usr/bin/env python3
"""A small odd-shaped GEMM workload for `compute-sanitizer --tool memcheck`: every layout (nn, nt,
tn, tt) for each kernel variant, alpha/beta != 0/1, partial tiles in every dimension, and a
misaligned strided view (no 128-bit loads), each result checked against float64.

For sgemm the variants are the parameter sets asmgemm.gemm can pick (both tile sizes, BK 8/16,
RQ 2/4, cp.async, prefetch, load-ahead); for another kernel, what asmgemm.gemm picks for it, or
the sets given with --params. Prints one line per case and `SANITIZE_RESULTS OK` (exit 0) or
`SANITIZE_RESULTS WRONG` (exit 1) last. The `sanitize` part of tools/device_verify.sh runs it
under compute-sanitizer, which exits 3 on a memory error. Needs a GPU and CuPy.

Usage (GPU):
    compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/sgemm_sanitize.py
    python3 tools/sgemm_sanitize.py sgemm --params '{"BK": 16}' --params null --shape 257,129,65
    compute-sanitizer --tool memcheck python3 tools/sgemm_sanitize.py sgemm --sass-patch stall,yield_every=4
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asmgemm.bench.shapes import shape_argument
from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.gemm import gemm
from asmgemm.runtime.gpu import require_gpu

# None: what asmgemm.gemm chooses at this size (the size rule, or a tuned entry).
SGEMM_VARIANTS = (
    None,
    {"THREADS": 64, "BK": 8},
    {"THREADS": 256, "BK": 16},
    {"THREADS": 256, "RQ": 4, "BK": 8},
    {"THREADS": 256, "RQ": 4, "BK": 16},
    {"THREADS": 256, "BK": 8, "ASYNC": 1},
    {"THREADS": 256, "RQ": 4, "BK": 8, "PREFETCH": 1},
    {"THREADS": 256, "RQ": 4, "BK": 8, "LOAD_AHEAD": 1, "LDG_NC": 0},
    {"THREADS": 256, "RQ": 4, "BK": 16, "LOAD_AHEAD": 1, "LDG_NC": 0},
)
FP32_MAX_ERR = 2e-5       # float32 results land near 1e-6 against float64 at these sizes


def _params(text: str):
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if value is not None and not isinstance(value, dict):
        raise argparse.ArgumentTypeError("a JSON object of NAME: value, or null")
    return value


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", nargs="?", default="sgemm", help="kernel spec name (`asmgemm kernels`; default sgemm)")
    ap.add_argument("--params", type=_params, action="append", metavar="JSON",
                    help="a variant's -D overrides, e.g. '{\"BK\": 16}', or null for gemm's own choice "
                         "(repeatable; default: the sgemm variants listed above, or null for other kernels)")
    ap.add_argument("--shape", type=shape_argument, default=(131, 67, 45), metavar="M,N,K",
                    help="the odd shape (default 131,67,45)")
    ap.add_argument("--max-err", type=float, default=None,
                    help=f"largest ‖C − ref‖/‖ref‖ against float64 that passes (default {FP32_MAX_ERR} for "
                         "float32 kernels, else the kernel spec's rel_err_limit)")
    ap.add_argument("--sass-patch", metavar="PASSES",
                    help="run the kernel with these control-code passes applied to its cubin (issue 35), as "
                         "tools/variant_ab.py's @PASSES: reuse,stall,yield_every=N,rules=FILE")
    args = ap.parse_args(argv)

    try:
        spec = get_spec(args.kernel)
        if args.sass_patch:
            sys.path.insert(0, str(Path(__file__).parent))
            from variant_ab import patched_spec     # one parser of the pass list for the tools
            spec = patched_spec(ap, spec, args.sass_patch)
        variants = args.params or (list(SGEMM_VARIANTS) if spec.name == "sgemm" else [None])
        limit = args.max_err if args.max_err is not None else (
            FP32_MAX_ERR if spec.dtypes.a == "float32" else spec.rel_err_limit)
        cp = require_gpu("sgemm_sanitize.py")
        return _run(cp, spec, variants, args.shape, limit)
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 2


def _run(cp, spec, variants, shape, limit) -> int:
    dtype = cp.dtype(spec.dtypes.a)
    f64 = cp.float64
    rng = cp.random.default_rng(3)

    def normal(rows, cols):
        return rng.standard_normal((rows, cols), dtype=cp.float32).astype(dtype)

    def rel_err(c, ref):
        return float(cp.linalg.norm(c.astype(f64) - ref) / cp.linalg.norm(ref))

    ok = True
    m, n, k = shape
    for params in variants:
        for layout in ("nn", "nt", "tn", "tt"):
            ta, tb = layout[0] == "t", layout[1] == "t"
            a = normal(k, m) if ta else normal(m, k)
            b = normal(n, k) if tb else normal(k, n)
            c0 = normal(m, n)
            c = c0.copy()
            gemm(a, b, c, alpha=1.5, beta=0.5, trans_a=ta, trans_b=tb, params=params, kernel=spec.name)
            ref = 1.5 * ((a.T if ta else a).astype(f64) @ (b.T if tb else b).astype(f64)) + 0.5 * c0.astype(f64)
            err = rel_err(c, ref)
            ok &= err < limit
            print(f"sanitize {spec.name} {layout} {params}: rel err {err:.2e}")
    # A view whose rows start at odd offsets: 4-byte aligned only, leading dimension 301.
    big = normal(300, 301)
    a = big[3:130, 5:78]
    b = big[1:74, 2:99]
    c = gemm(a, b, kernel=spec.name)
    err = rel_err(c, a.astype(f64) @ b.astype(f64))
    ok &= err < limit
    print(f"sanitize {spec.name} strided view: rel err {err:.2e}")
    cp.cuda.Device().synchronize()
    print("SANITIZE_RESULTS", "OK" if ok else "WRONG")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
