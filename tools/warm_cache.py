"""Fill the build cache for a benchmark before timing it: each (kernel, shape, layout) is called once
through asmgemm.gemm, exactly as `asmgemm bench` will call it, in WORKERS GPU processes at once, so
the ptxas runs of a cold machine (a few seconds each, one process at a time inside gemm()) spread
over the CPUs instead of landing inside the benchmark. The builds land in the shared disk cache
($ASMGEMM_CACHE_DIR); nothing is timed.

    python3 tools/warm_cache.py --kernels sgemm,hgemm --shapes random:11:60,random:12:60:16 -j 12
"""
from __future__ import annotations

import argparse
import multiprocessing
import sys
import time


def _work(job):
    kernel, m, n, k, layout, seed = job
    import cupy as cp

    from asmgemm.bench.problem import GemmProblem
    from asmgemm.bench.runner import make_runner
    from asmgemm.bench.shapes import Shape
    from asmgemm.kernel_spec import get_spec

    spec = get_spec(kernel)
    try:
        prob = GemmProblem(cp, Shape(m, n, k), layout, spec.dtypes.a, seed=seed, c_dtype=spec.dtypes.c)
        make_runner(spec)(prob.a, prob.b, prob.output(), prob.trans_a, prob.trans_b, None)
        cp.cuda.Device().synchronize()
        return None
    except Exception as exc:  # reported, never fatal: the benchmark shows the same error in its row
        return f"{kernel} {m}x{n}x{k} {layout}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", required=True, help="comma-separated kernel names")
    ap.add_argument("--shapes", required=True, help="as asmgemm bench --shapes")
    ap.add_argument("--layouts", default="nn", help="for shapes without a layout of their own")
    ap.add_argument("-j", "--jobs", type=int, default=8)
    args = ap.parse_args(argv)
    from asmgemm.bench.shapes import parse_layouts, parse_shapes

    layouts = parse_layouts(args.layouts)
    jobs = []
    for kernel in args.kernels.split(","):
        for i, s in enumerate(parse_shapes(args.shapes)):
            for layout in ([s.layout] if getattr(s, "layout", None) else layouts):
                jobs.append((kernel, s.m, s.n, s.k, layout, i))
    t0 = time.time()
    ctx = multiprocessing.get_context("spawn")       # CUDA: never fork a process that holds a context
    failed = 0
    with ctx.Pool(args.jobs) as pool:
        for done, err in enumerate(pool.imap_unordered(_work, jobs), 1):
            if err:
                failed += 1
                print(err, file=sys.stderr)
            if done % 20 == 0 or done == len(jobs):
                print(f"warm_cache: {done}/{len(jobs)} calls, {time.time() - t0:.0f} s", file=sys.stderr)
    print(f"warm_cache: {len(jobs)} calls ({failed} failed) in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
