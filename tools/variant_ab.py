#!/usr/bin/env python3
"""Time -D variants of one spec'd kernel against each other and cuBLAS, interleaved in one process.

Each variant is a name and a set of -D overrides laid over what `asmgemm.gemm` would run untuned at
that shape with this kernel, as configured on the CPU (launch_config.untuned_defines: the catalog's
pick with its split, or the spec's size rule and split rule: SPLIT_K=S; with --from-dispatch, what
gemm's dispatch ran for the plain kernel on the GPU, database exact hits included, as last_launch()
names it), so `--variant old:DEFER_C_ASKED=0` changes one knob and nothing
else. A variant may also patch the cubin's control codes (issue 35): `NAME:K=V@reuse,stall,
yield_every=4,rules=FILE` runs the same build through a copy of the kernel's table with that
`sass_patch` (kernel_spec.SASS_PATCH_KEYS; docs/design/sass-patching.md), so ptxas's code and the
patched code are timed side by side with the same -D parameters. Per shape the script checks every variant against an fp32
reference (fresh random-normal inputs, C poisoned with NaN first; the spec's rel_err_limit), then
times the variants, cupy.matmul and torch.matmul (when importable) with asmgemm's benchmark timer
(CUDA events around one call each, interleaved rep by rep, L2 flushed, a GPU pre-roll hiding the
host time; medians). The table gives TFLOP/s and each variant's ratio to the faster cuBLAS.

Usage (GPU, from the project root after `source tools/device_setup.sh`):
    python3 tools/variant_ab.py hgemm --shape 4096,4096,4096 --variant new: --variant old:DEFER_C_ASKED=0
    python3 tools/variant_ab.py sgemm --shape 1024,1024,1024 --variant bk8:BK=8 --variant bk16:BK=16 --json $OUT/ab.json
    python3 tools/variant_ab.py sgemm --from-dispatch --shape 4096,4096,4096 --variant ptxas: \
        --variant noreuse:@rules=tools/sass_rules/sgemm_strip_loop_reuse.toml --variant y2:@yield_every=2

Exit status: 0 done; 1 usage error, build error or no GPU; 2 a variant gave a wrong result.
"""
from __future__ import annotations

import argparse
import json
import sys

from asmgemm.bench.problem import cublas_gemm_ex
from asmgemm.bench.shapes import parse_shape
from asmgemm.bench.timing import L2Flusher, make_pre_roll, tflops, time_interleaved
from asmgemm.commands.common import integer_defines
from asmgemm.errors import AsmError
from asmgemm.files import write_atomic
from asmgemm.kernel_spec import SASS_PATCH_KEYS, get_spec, register, with_sass_patch
from asmgemm.runtime.gemm import gemm, last_launch
from asmgemm.runtime.gpu import device_facts, require_gpu
from asmgemm.runtime.launch_config import untuned_defines


def parse_variant(text: str) -> tuple[str, dict[str, int], dict[str, object]]:
    """'name:K=V,K=V[@pass,pass=V,...]' (or 'name:' for no overrides) -> (name, {K: V}, sass_patch
    options): a bare pass name is true, yield_every takes a number, rules a file name."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise ValueError(f"--variant {text!r}: expected NAME:K=V,K=V[@PASS,...] (or NAME: for none)")
    rest, _, patch_text = rest.partition("@")
    patch: dict[str, object] = {}
    for item in filter(None, patch_text.split(",")):
        key, eq, value = item.partition("=")
        if key not in SASS_PATCH_KEYS:
            raise ValueError(f"--variant {text!r}: '{key}' is not a sass_patch key ({', '.join(SASS_PATCH_KEYS)})")
        kind = SASS_PATCH_KEYS[key][1]
        if kind is bool:
            if eq:
                raise ValueError(f"--variant {text!r}: '{key}' takes no value")
            patch[key] = True
        elif kind is int:
            if not value.isdigit():
                raise ValueError(f"--variant {text!r}: '{key}' takes a whole number")
            patch[key] = int(value)
        else:
            if not value:
                raise ValueError(f"--variant {text!r}: '{key}' takes a file name")
            patch[key] = value
    try:
        return name, integer_defines(list(filter(None, rest.split(",")))), patch
    except AsmError as exc:
        raise ValueError(f"--variant {text!r}: {exc.message}") from None


def variant_kernel(spec, name: str, patch: dict) -> str:
    """The kernel a variant runs: the spec itself, or a registered copy with `patch` as sass_patch."""
    if not patch:
        return spec.name
    copy = with_sass_patch(spec, f"{spec.name}__{name}", patch)
    register(copy)
    return copy.name


def patched_spec(ap, spec, passes: str):
    """The registered kernel spec for a tool's `--sass-patch PASSES` option (variant_ab's @PASSES
    syntax: reuse,stall,yield_every=N,rules=FILE); a bad list is the tool's usage error (ap.error)."""
    try:
        _name, _defines, patch = parse_variant(f"patched:@{passes}")
    except ValueError as exc:
        ap.error(str(exc))
    return get_spec(variant_kernel(spec, "patched", patch))



def _operands(cp, spec, m: int, n: int, k: int, layout: str, seed: int):
    rng = cp.random.default_rng(seed)
    ta, tb = layout[0] == "t", layout[1] == "t"
    try:
        dtype = cp.dtype(spec.dtypes.a)
    except TypeError:
        raise AsmError(f"variant_ab.py compares CuPy-typed kernels; this CuPy has no {spec.dtypes.a} dtype") from None
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32).astype(dtype)
    return a, b, ta, tb


def dispatch_params(spec, a, b, c, ta: bool, tb: bool) -> dict:
    """The -D parameters gemm's own choice runs for this call of the plain kernel (database, cost
    model or size rule), with split-K's S as the switch's value the way params= name a split; None
    where the dispatch ran another kernel (a route or the in-place kernel: the size rule's choice
    for this kernel is laid over then)."""
    gemm(a, b, c, trans_a=ta, trans_b=tb, kernel=spec.name)
    ran = last_launch()
    if ran["kernel"] != spec.name:
        return None           # the dispatch sent this call to another kernel (a route, in place)
    return ran["rerun_params"]


def run_shape(cp, torch, spec, facts, shape, layout: str, variants, reps: int, flush, pre_roll,
              from_dispatch: bool = False, kernels: dict | None = None) -> dict:
    """One shape's check and timing of every variant; `kernels`: variant name -> the kernel it
    runs (variant_kernel, made once for all shapes; default: the spec itself)."""
    kernels = kernels or {}
    m, n, k = shape.m, shape.n, shape.k
    a, b, ta, tb = _operands(cp, spec, m, n, k, layout, seed=m * 7 + n * 3 + k)
    op_a, op_b = (a.T if ta else a), (b.T if tb else b)
    c_dtype = cp.dtype(spec.dtypes.c)
    ref = cp.matmul(op_a.astype(cp.float32), op_b.astype(cp.float32))
    untuned = dispatch_params(spec, a, b, cp.empty((m, n), dtype=c_dtype), ta, tb) if from_dispatch else None
    if untuned is None:
        untuned = untuned_defines(spec, m, n, k, layout, facts)
    fns, outs, errors, refused = {}, {}, {}, {}
    for name, defines, patch in variants:
        params = {**untuned, **defines}
        kernel = kernels.get(name, spec.name)
        c = cp.full((m, n), cp.nan, dtype=c_dtype)
        try:
            gemm(a, b, c, trans_a=ta, trans_b=tb, params=params, kernel=kernel)
        except AsmError as exc:
            if not patch:
                raise
            # a patch the safety check refuses for this build (another configuration at another
            # shape): reported as such, the other variants still timed
            refused[name] = exc.message
            print(f"{m}x{n}x{k}: variant {name} refused: {exc.message.splitlines()[0]}", file=sys.stderr)
            continue
        ran = last_launch()["sass_patch"]
        if bool(ran) != bool(patch):
            raise AsmError(f"variant {name}: asked for sass_patch {patch or None}, the launch ran {ran}")
        err = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
        errors[name] = err
        outs[name] = c
        fns[name] = (lambda c=c, p=params, kn=kernel: gemm(a, b, c, trans_a=ta, trans_b=tb, params=p, kernel=kn))
    cub = cp.empty((m, n), dtype=c_dtype)
    if c_dtype == a.dtype:
        fns["cupy"] = lambda: cp.matmul(op_a, op_b, out=cub)
    else:       # an fp32 C of 16-bit A and B: cuBLAS's own call of those types; torch has none
        fns["cupy"] = lambda: cublas_gemm_ex(cp, a, b, cub, ta, tb)
        torch = None
    if torch is not None:
        tta, ttb = torch.from_dlpack(op_a), torch.from_dlpack(op_b)
        ttc = torch.from_dlpack(cp.empty((m, n), dtype=c_dtype))
        fns["torch"] = lambda: torch.matmul(tta, ttb, out=ttc)
    stats = time_interleaved(fns, reps=reps, flush=flush, pre_roll=pre_roll)
    flops = 2.0 * m * n * k
    rate = {name: tflops(flops, st.median_ms) for name, st in stats.items()}
    cublas = max(rate[x] for x in ("cupy", "torch") if x in rate)
    return {"shape": [m, n, k], "layout": layout, "untuned": untuned, "tflops": rate,
            "ratio": {name: rate[name] / cublas for name, *_ in variants if name in rate},
            "rel_err": errors, "refused": refused, "ok": all(e < spec.rel_err_limit for e in errors.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", help="kernel spec name (`asmgemm kernels`)")
    ap.add_argument("--shape", action="append", required=True, help="M,N,K (repeatable)")
    ap.add_argument("--variant", action="append", required=True,
                    help="NAME:K=V,K=V[@PASS,...] -D overrides over the untuned choice, and control-code passes "
                         "(reuse, stall, yield_every=N, rules=FILE) applied to its cubin (repeatable; "
                         "NAME: for none)")
    ap.add_argument("--from-dispatch", action="store_true",
                    help="lay the overrides over what gemm's dispatch runs (database or cost model) instead of "
                         "the source defaults and size rules")
    ap.add_argument("--layout", choices=("nn", "nt", "tn", "tt"), default="nn")
    ap.add_argument("--reps", type=int, default=15, help="timed repetitions per implementation (default 15)")
    ap.add_argument("--no-torch", action="store_true", help="leave torch.matmul out")
    ap.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    args = ap.parse_args(argv)
    try:
        variants = [parse_variant(v) for v in args.variant]
        shapes = [parse_shape(s.replace(",", "x")) for s in args.shape]
    except (ValueError, AsmError) as exc:
        ap.error(str(exc))
    if len({name for name, *_ in variants}) != len(variants) or {"cupy", "torch"} & {n for n, *_ in variants}:
        ap.error("variant names must be distinct and not 'cupy' or 'torch'")
    try:
        cp = require_gpu("variant_ab.py")
        spec = get_spec(args.kernel)
        torch = None
        if not args.no_torch:
            try:
                import torch as _torch
                torch = _torch if _torch.cuda.is_available() else None
            except ImportError:
                torch = None
        facts = device_facts()
        kernels = {name: variant_kernel(spec, name, patch) for name, _defines, patch in variants}
        flush, pre_roll = L2Flusher(), make_pre_roll(True)
        results = []
        for shape in shapes:
            r = run_shape(cp, torch, spec, facts, shape, args.layout, variants, args.reps, flush, pre_roll,
                          args.from_dispatch, kernels)
            results.append(r)
            m, n, k = r["shape"]
            cells = "  ".join(f"{name} {r['tflops'][name]:6.1f} ({r['ratio'][name]:.3f})" if name in r["tflops"]
                              else f"{name} refused" for name, *_ in variants)
            ref = "  ".join(f"{x} {r['tflops'][x]:6.1f}" for x in ("cupy", "torch") if x in r["tflops"])
            bad = "" if r["ok"] else "  WRONG: " + ", ".join(f"{n}={e:.1e}" for n, e in r["rel_err"].items())
            print(f"{m}x{n}x{k} {args.layout}: {cells}  | {ref}{bad}", flush=True)
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 1
    if args.json:
        write_atomic(args.json, json.dumps({"kernel": args.kernel,
                                            "variants": {n: {"params": d, "sass_patch": p} for n, d, p in variants},
                                            "results": results}, indent=1))
    return 0 if all(r["ok"] for r in results) else 2


if __name__ == "__main__":
    sys.exit(main())
