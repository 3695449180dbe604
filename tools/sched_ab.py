#!/usr/bin/env python3
"""Scheduled vs `--no-schedule`: time one GEMM kernel built both ways, in one process, on the GPU.

For each variant (the .schedule regions in scheduled order, and in source order) the script builds
the kernel with asmgemm, assembles it with ptxas, checks the result against a float64 reference
(fresh random inputs, C poisoned with NaN, then once more with alpha=1.5, beta=0.5) and times the
two builds and cuBLAS (cupy.matmul) with asmgemm's benchmark timer
(asmgemm.bench.timing.time_interleaved: CUDA events around one call each, the three interleaved
rep by rep, warm-up, L2 flushed, a GPU pre-roll hiding the host time). It prints the median time,
TFLOP/s and the ratio scheduled/source order per shape, plus how many of the scheduler's
modelled stall counts equal ptxas's (CPU side: ptxas and nvdisasm, no GPU; --model-only stops
there).

The launch contract is the kernel spec's (kernels_ptx/kernels.toml, `asmgemm kernels`): launch
geometry from the constants it names (asmgemm.runtime.build_cache.launch_geometry; grid
ceil(N/tile_n) x ceil(M/tile_m)), the arguments in its abi order (abi_params,
asmgemm.runtime.launch.pack_args), and the call-derived parameters (TRANS_*, VEC_*) set for each
shape as asmgemm.gemm sets them (so an odd shape gets its own build). A .sasm path is launched
under the spec of its file name, or the one --spec names.

Usage (GPU, from the project root; the `sched` part of tools/device_verify.sh):
    python3 tools/sched_ab.py sgemm --shape 4096,4096,4096 --shape 1000,3000,700 --json $OUT/ab.json
    python3 tools/sched_ab.py sgemm -D BK=16 --reps 30
    python3 tools/sched_ab.py sgemm -D RQ=4 -D LOAD_AHEAD=1 -D LDG_NC=0 -D BK=16   # the 4096^3 default
    python3 tools/sched_ab.py my_sgemm.sasm --spec sgemm --model-only              # no GPU

Exit status: 0 done; 1 usage, build or no GPU; 2 a build gave a wrong result.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from asmgemm.bench.shapes import shape_argument
from asmgemm.bench.timing import L2Flusher, make_pre_roll, tflops, time_interleaved
from asmgemm.errors import AsmError
from asmgemm.files import write_atomic
from asmgemm.kernel_spec import DTYPE_ITEMSIZE, get_spec
from asmgemm.pipeline import BuildOptions, assemble_traced, build_file
from asmgemm.runtime.build_cache import BuiltKernel, abi_params, launch_geometry
from asmgemm.runtime.gpu import require_gpu
from asmgemm.runtime.launch import call_defines, grid, pack_args
from asmgemm.runtime.plan import call_values_for, plan_launch
from asmgemm.sass.inspect import inspect_build
from asmgemm.scheduler import compare_with_sass

VARIANTS = (("scheduled", True), ("source order", False))
STATIC_SMEM = 48 * 1024          # above this, a kernel must opt in to dynamic shared memory


def _define_value(v: str):
    return int(v) if v.lstrip("-").isdigit() else v


def shape_defines(spec, user: dict, m: int, n: int, k: int) -> dict:
    """The -D set asmgemm.gemm(params=user) builds for a fresh row-major M x N x K problem: the
    user's overrides plus the call-derived parameters (transposes, 128-bit loads)."""
    values = call_values_for(m, n, k, "nn", DTYPE_ITEMSIZE[spec.dtypes.a])
    return {**user, **call_defines(spec, values, user)}


def build_pair(spec, source, defines: dict, target: str) -> dict:
    """label -> (traced build, geometry, abi params), for the scheduled and source-order builds."""
    out = {}
    for label, schedule in VARIANTS:
        res = build_file(source, BuildOptions(defines={k: str(v) for k, v in defines.items()}, target=target,
                                              schedule=schedule, trace="ptx-lines"))
        out[label] = (assemble_traced(res), launch_geometry(spec, res), abi_params(spec, res))
    return out


def model_vs_ptxas(traced) -> dict:
    try:
        cmp = compare_with_sass(traced.build, inspect_build(traced))
    except AsmError as exc:          # no nvdisasm: the timing half does not need it
        return {"error": exc.message}
    kept, pairs = cmp.order_kept()
    return {"matched": cmp.matched, "instructions": len(cmp.rows), "stall_matches": cmp.stall_matches,
            "by_opcode": {k: list(v) for k, v in cmp.by_opcode().items()}, "order_kept": [kept, pairs]}


def describe(pair) -> dict:
    """The CPU-side figures of one build pair, printed and kept for the JSON."""
    info = {}
    for label, (traced, geo, _params) in pair.items():
        res = traced.build
        regions = res.schedule_report.regions if res.schedule_report else []
        v = {"regions": len(regions),
             "model_cycles": sum(r.cycles_scheduled if label == "scheduled" else r.cycles_source for r in regions),
             "geometry": geo, "ptxas": [k.to_json() for k in traced.assembled.kernels],
             "model_vs_ptxas": model_vs_ptxas(traced)}
        info[label] = v
        print(f"  {label:13s}: {v['regions']} regions, modelled region cycles {v['model_cycles']}, "
              f"registers {[k['registers'] for k in v['ptxas']]}")
        mv = v["model_vs_ptxas"]
        if "error" in mv:
            print(f"                 model vs ptxas: not compared ({mv['error']})")
        else:
            print(f"                 model vs ptxas: stall equal {mv['stall_matches']}/{mv['matched']} "
                  f"(by opcode {mv['by_opcode']}), ptxas kept {mv['order_kept'][0]}/{mv['order_kept'][1]} pairs in order")
    return info


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", nargs="?", default="sgemm",
                    help="kernel spec name (`asmgemm kernels`) or a .sasm path (default sgemm)")
    ap.add_argument("--spec", help="the kernel spec whose launch contract a .sasm path follows "
                                   "(default: the spec named like the file)")
    ap.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                    help="parameter override for both builds (repeatable)")
    ap.add_argument("--target", default="sm_90", help="GPU target of the builds (default sm_90)")
    ap.add_argument("--shape", action="append", type=shape_argument, default=[], metavar="M,N,K",
                    help="repeatable; default 4096,4096,4096 and 1000,3000,700")
    ap.add_argument("--reps", type=int, default=25, help="timed repetitions per variant, median reported (default 25)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per variant first (default 3)")
    ap.add_argument("--no-flush", action="store_true", help="do not flush L2 between repetitions")
    ap.add_argument("--model-only", action="store_true",
                    help="stop after the CPU half (builds, model vs ptxas); no GPU needed")
    ap.add_argument("--json", help="write all numbers here")
    args = ap.parse_args(argv)
    bad = [d for d in args.defines if "=" not in d]
    if bad:
        ap.error(f"-D {bad[0]}: expected NAME=VALUE")
    user = {k: _define_value(v) for k, v in (d.split("=", 1) for d in args.defines)}
    shapes = args.shape or [(4096, 4096, 4096), (1000, 3000, 700)]
    try:
        return _run(args, user, shapes)
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 1


def _run(args, user: dict, shapes) -> int:
    path = Path(args.kernel)
    is_file = path.suffix == ".sasm" or path.is_file()
    spec = get_spec(args.spec or (path.stem if is_file else args.kernel))
    source = path if is_file else spec.source
    if spec.dtypes.a not in DTYPE_ITEMSIZE:
        raise AsmError(f"kernel '{spec.name}': dtype {spec.dtypes.a} is not one this script handles")

    # CPU half: one build pair per distinct -D set the shapes need (usually one).
    builds: dict[tuple, dict] = {}
    report: dict = {"kernel": args.kernel, "spec": spec.name, "defines": user, "target": args.target,
                    "builds": [], "shapes": []}
    for m, n, k in shapes:
        defines = shape_defines(spec, user, m, n, k)
        key = tuple(sorted(defines.items()))
        if key in builds:
            continue
        print(f"build {' '.join(f'-D {a}={b}' for a, b in key)}")
        builds[key] = build_pair(spec, source, defines, args.target)
        report["builds"].append({"defines": defines, "variants": describe(builds[key])})
    if args.model_only:
        _write_json(args.json, report)
        return 0

    try:
        cp = require_gpu("the timing half of sched_ab.py")
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        print("(the model-vs-ptxas figures above need no GPU: --model-only stops there)", file=sys.stderr)
        return 1
    import numpy as np

    dev = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"]
    report["device"] = name.decode() if isinstance(name, bytes) else str(name)
    print(f"device: {report['device']}")
    dtype = cp.dtype(spec.dtypes.a)
    flush = None if args.no_flush else L2Flusher()
    pre_roll = make_pre_roll(True)
    rng = np.random.default_rng(1234)
    all_ok = True
    with tempfile.TemporaryDirectory() as tmp:
        loaded: dict[tuple, dict] = {}

        def load(key) -> dict:
            """label -> (function, BuiltKernel) of one build pair, loaded once."""
            if key not in loaded:
                loaded[key] = {}
                for i, (label, (traced, geo, params)) in enumerate(builds[key].items()):
                    stem = os.path.join(tmp, f"{len(loaded)}_{i}")
                    write_atomic(stem + ".cubin", traced.assembled.cubin)
                    write_atomic(stem + ".ptx", traced.build.ptx)
                    built = BuiltKernel(f"{label} {len(loaded)}", spec.entry, geo["threads"], geo["tile_m"],
                                        geo["tile_n"], geo["smem_bytes"], params, stem + ".cubin", stem + ".ptx",
                                        traced.build.target)
                    fn = cp.RawModule(path=built.cubin_path).get_function(built.name)
                    if built.smem_bytes > STATIC_SMEM:
                        fn.max_dynamic_shared_size_bytes = built.smem_bytes
                    loaded[key][label] = (fn, built)
            return loaded[key]

        for m, n, k in shapes:
            defines = shape_defines(spec, user, m, n, k)
            funcs = load(tuple(sorted(defines.items())))
            a = cp.asarray(rng.standard_normal((m, k), dtype=np.float32)).astype(dtype)
            b = cp.asarray(rng.standard_normal((k, n), dtype=np.float32)).astype(dtype)
            c0 = cp.asarray(rng.standard_normal((m, n), dtype=np.float32)).astype(dtype)
            ref = a.astype(cp.float64) @ b.astype(cp.float64)
            ref_ab = 1.5 * ref + 0.5 * c0.astype(cp.float64)
            row = {"shape": [m, n, k], "defines": defines, "variants": {}}

            def launcher(label, c, alpha=1.0, beta=0.0):
                fn, built = funcs[label]
                plan = plan_launch(a, b, c, trans_a=False, trans_b=False)
                got = call_defines(spec, plan.call_values, user)
                if any(defines[p] != v for p, v in got.items()):
                    raise AsmError(f"{m}x{n}x{k}: the arrays need {got}, the build has {defines}")
                g, blk, kargs = grid(spec, built, plan), (built.threads, 1, 1), pack_args(built, plan, alpha, beta)
                return lambda: fn(g, blk, kargs, shared_mem=built.smem_bytes)

            for label in funcs:
                c = cp.full((m, n), cp.nan, dtype=dtype)
                launcher(label, c)()
                cp.cuda.runtime.deviceSynchronize()
                err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
                c = c0.copy()
                launcher(label, c, 1.5, 0.5)()
                cp.cuda.runtime.deviceSynchronize()
                err_ab = float(cp.linalg.norm(c.astype(cp.float64) - ref_ab) / cp.linalg.norm(ref_ab))
                ok = bool(np.isfinite(err) and err < spec.rel_err_limit and np.isfinite(err_ab)
                          and err_ab < spec.rel_err_limit)
                all_ok &= ok
                row["variants"][label] = {"rel_err": err, "rel_err_alpha_beta": err_ab, "correct": ok}
            del ref, ref_ab

            c = cp.empty((m, n), dtype=dtype)
            c_ref = cp.empty((m, n), dtype=dtype)
            runs = {label: launcher(label, c) for label in funcs}
            runs["cuBLAS"] = lambda: cp.matmul(a, b, out=c_ref)
            stats = time_interleaved(runs, reps=args.reps, warmup=args.warmup, flush=flush, pre_roll=pre_roll)
            flops = 2.0 * m * n * k
            for label, s in stats.items():
                row["variants"].setdefault(label, {}).update(
                    {"median_ms": s.median_ms, "min_ms": s.min_ms, "max_ms": s.max_ms,
                     "tflops": tflops(flops, s.median_ms)})
            row["time_ratio_scheduled_over_source"] = stats["scheduled"].median_ms / stats["source order"].median_ms
            report["shapes"].append(row)
            del a, b, c0, c, c_ref

    report.update({"reps": args.reps, "warmup": args.warmup, "l2_flush": flush is not None,
                   "pre_roll": pre_roll is not None})
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
    _write_json(args.json, report)
    return 0 if all_ok else 2


def _write_json(path: str | None, report: dict) -> None:
    if path:
        write_atomic(path, json.dumps(report, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
