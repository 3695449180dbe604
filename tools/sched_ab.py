#!/usr/bin/env python3
"""Scheduled vs `--no-schedule`: time one GEMM kernel built both ways, in one process, on the GPU.

For each variant (the .schedule regions in scheduled order, and in source order) the script builds
the kernel with asmgemm, assembles it with ptxas, checks the result against a float64 reference
(fresh random inputs, C poisoned with NaN, then once more with alpha/beta), and times it with CUDA
events, interleaving the variants and cuBLAS (cupy.matmul) rep by rep so that clock and thermal
drift hit all of them alike. It prints the median time, TFLOP/s and the ratio scheduled/unscheduled
per shape, plus how many of the scheduler's modelled stall counts equal ptxas's (CPU side, when
the SASS inspector is installed).

The kernel must take (A, B, C, M, N, K, lda, ldb, ldc, alpha, beta) with row-major storage, as
kernels_ptx/sgemm.sasm and sgemm_naive.sasm do. Launch geometry: from the `<entry>_meta_threads_T`,
`_meta_tilem_M`, `_meta_tilen_N`, `_meta_smem_B` symbols the kernel declares, read by the same
function the runtime uses (asmgemm.runtime.build_cache.launch_meta; grid ceil(N/tile n) x
ceil(M/tile m)), else from its BLOCK_X/BLOCK_Y parameters (one thread per element of C).

Usage (GPU, from the project root):
    python3 tools/sched_ab.py sgemm --shape 4096,4096,4096 --shape 1000,3000,700 --json $OUT/ab.json
    python3 tools/sched_ab.py sgemm -D BK=16 --reps 30
    python3 tools/sched_ab.py sgemm -D RQ=4 -D LOAD_AHEAD=1 -D LDG_NC=0 -D BK=16   # the 4096^3 default
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import sys
import tempfile

EXPECTED_PARAMS = ["A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta"]


def build_variants(kernel: str, defines: dict[str, str], target: str):
    from asmgemm.pipeline import BuildOptions, assemble, build_file
    out = {}
    for label, schedule in (("scheduled", True), ("source order", False)):
        res = build_file(kernel, BuildOptions(defines=dict(defines), target=target, schedule=schedule,
                                              trace="ptx-lines"))
        asm = assemble(res)
        out[label] = (res, asm)
    return out


def model_vs_ptxas(build, asm) -> dict | None:
    try:
        from asmgemm.sass.inspect import inspect_cubin
    except ImportError:
        return None
    from asmgemm.scheduler import compare_with_sass
    cmp = compare_with_sass(build, inspect_cubin(asm.cubin, build.target))
    kept, pairs = cmp.order_kept()
    return {"matched": cmp.matched, "instructions": len(cmp.rows), "stall_matches": cmp.stall_matches,
            "by_opcode": {k: list(v) for k, v in cmp.by_opcode().items()}, "order_kept": [kept, pairs]}


def geometry(build) -> tuple[tuple[int, int], int, int, int]:
    """((block x, block y), tile n, tile m, dynamic shared bytes)."""
    from asmgemm.errors import AsmError
    from asmgemm.runtime.build_cache import launch_meta
    try:
        meta = launch_meta(build.ptx, build.kernel_names[0])
        return (meta["threads"], 1), meta["tilen"], meta["tilem"], meta["smem"]
    except AsmError as exc:
        reason = str(exc)
    p = build.parameters
    if "BLOCK_X" in p and "BLOCK_Y" in p:
        return (int(p["BLOCK_X"]), int(p["BLOCK_Y"])), int(p["BLOCK_X"]), int(p["BLOCK_Y"]), 0
    raise SystemExit(f"cannot tell the launch geometry: {reason}, and no BLOCK_X/BLOCK_Y parameters")


def check_params(build, name: str) -> None:
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", build.ptx, re.S)
    names = re.findall(r"\.param\s+\.\w+\s+(\w+)", m.group(1)) if m else []
    short = [n.split("_")[-1] for n in names]
    if short != EXPECTED_PARAMS:
        raise SystemExit(f"{name}: parameters {names} are not (A, B, C, M, N, K, lda, ldb, ldc, alpha, beta)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kernel", nargs="?", default="sgemm", help="shipped kernel name or .sasm path (default sgemm)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--shape", action="append", default=[], metavar="M,N,K",
                    help="repeatable; default 4096,4096,4096 and 1000,3000,700")
    ap.add_argument("--reps", type=int, default=25, help="timed repetitions per variant (median reported)")
    ap.add_argument("--inner", type=int, default=5, help="launches per timed repetition")
    ap.add_argument("--json", help="write all numbers here")
    args = ap.parse_args(argv)
    defines = dict(d.split("=", 1) for d in args.defines)
    shapes = [tuple(int(x) for x in s.split(",")) for s in (args.shape or ["4096,4096,4096", "1000,3000,700"])]

    variants = build_variants(args.kernel, defines, args.target)
    report: dict = {"kernel": args.kernel, "defines": defines, "variants": {}, "shapes": []}
    for label, (res, asm) in variants.items():
        regions = res.schedule_report.regions if res.schedule_report else []
        info = {"regions": len(regions),
                "model_cycles": sum(r.cycles_scheduled if label == "scheduled" else r.cycles_source for r in regions),
                "ptxas": [k.to_json() for k in asm.kernels], "model_vs_ptxas": model_vs_ptxas(res, asm)}
        report["variants"][label] = info
        print(f"{label:13s}: {info['regions']} regions, modelled region cycles {info['model_cycles']}, "
              f"registers {[k['registers'] if isinstance(k, dict) and 'registers' in k else k for k in info['ptxas']]}")
        mv = info["model_vs_ptxas"]
        if mv:
            print(f"               model vs ptxas: stall equal {mv['stall_matches']}/{mv['matched']} "
                  f"(by opcode {mv['by_opcode']}), ptxas kept {mv['order_kept'][0]}/{mv['order_kept'][1]} pairs in order")

    try:
        import cupy as cp
    except ImportError:
        raise SystemExit("the timing half needs CuPy and a GPU (pip install 'asmgemm[gpu]'); "
                         "the model-vs-ptxas figures above need neither")
    import numpy as np

    dev = cp.cuda.Device()
    props = cp.cuda.runtime.getDeviceProperties(dev.id)
    report["device"] = props["name"].decode()
    print(f"device: {report['device']}")
    name = variants["scheduled"][0].kernel_names[0]
    funcs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, (res, asm) in variants.items():
            check_params(res, name)
            path = os.path.join(tmp, f"{label.replace(' ', '_')}.cubin")
            with open(path, "wb") as fh:
                fh.write(asm.cubin)
            fn = cp.RawModule(path=path).get_function(name)
            block, tile_n, tile_m, smem = geometry(res)
            if smem > 48 * 1024:
                fn.max_dynamic_shared_size_bytes = smem
            funcs[label] = (fn, block, tile_n, tile_m, smem)

    rng = np.random.default_rng(1234)
    for (m, n, k) in shapes:
        a = cp.asarray(rng.standard_normal((m, k), dtype=np.float32))
        b = cp.asarray(rng.standard_normal((k, n), dtype=np.float32))
        ref = a.astype(cp.float64) @ b.astype(cp.float64)
        c0 = cp.asarray(rng.standard_normal((m, n), dtype=np.float32))
        ref_ab = 1.5 * ref + 0.5 * c0.astype(cp.float64)
        row = {"shape": [m, n, k], "variants": {}}

        def launch(label, c, alpha=1.0, beta=0.0):
            fn, block, tn, tm, smem = funcs[label]
            grid = (math.ceil(n / tn), math.ceil(m / tm))
            fn(grid, block, (a, b, c, np.uint32(m), np.uint32(n), np.uint32(k), np.uint32(k), np.uint32(n),
                             np.uint32(n), np.float32(alpha), np.float32(beta)), shared_mem=smem)

        for label in funcs:
            c = cp.full((m, n), cp.nan, dtype=cp.float32)
            launch(label, c)
            cp.cuda.runtime.deviceSynchronize()
            err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
            c = c0.copy()
            launch(label, c, 1.5, 0.5)
            err_ab = float(cp.linalg.norm(c.astype(cp.float64) - ref_ab) / cp.linalg.norm(ref_ab))
            ok = bool(np.isfinite(err) and err < 1e-5 and np.isfinite(err_ab) and err_ab < 1e-5)
            row["variants"][label] = {"rel_err": err, "rel_err_alpha_beta": err_ab, "correct": ok}

        c = cp.empty((m, n), dtype=cp.float32)
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        runs = {label: (lambda label=label: launch(label, c)) for label in funcs}
        runs["cuBLAS"] = lambda: cp.matmul(a, b, out=c)
        for fn in runs.values():          # warm-up
            for _ in range(3):
                fn()
        cp.cuda.runtime.deviceSynchronize()
        times = {label: [] for label in runs}
        for _ in range(args.reps):
            for label, fn in runs.items():
                start.record()
                for _ in range(args.inner):
                    fn()
                stop.record()
                stop.synchronize()
                times[label].append(cp.cuda.get_elapsed_time(start, stop) / args.inner)
        flops = 2.0 * m * n * k
        for label, ts in times.items():
            med = statistics.median(ts)
            entry = row["variants"].setdefault(label, {})
            entry.update({"median_ms": med, "min_ms": min(ts), "max_ms": max(ts), "tflops": flops / med / 1e9})
        s, u = row["variants"]["scheduled"]["median_ms"], row["variants"]["source order"]["median_ms"]
        row["time_ratio_scheduled_over_source"] = s / u
        report["shapes"].append(row)

    print(f"\n{'shape':>18s} {'variant':>13s} {'correct':>8s} {'rel.err':>9s} {'median ms':>10s} "
          f"{'min..max ms':>17s} {'TFLOP/s':>8s}")
    for row in report["shapes"]:
        shape = "x".join(map(str, row["shape"]))
        for label, v in row["variants"].items():
            corr = "-" if "correct" not in v else ("yes" if v["correct"] else "NO")
            err = "-" if "rel_err" not in v else f"{max(v['rel_err'], v['rel_err_alpha_beta']):.1e}"
            print(f"{shape:>18s} {label:>13s} {corr:>8s} {err:>9s} {v['median_ms']:10.4f} "
                  f"{v['min_ms']:8.4f}..{v['max_ms']:<8.4f} {v['tflops']:8.2f}")
        print(f"{shape:>18s} time scheduled / source order = {row['time_ratio_scheduled_over_source']:.4f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
