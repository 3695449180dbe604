#!/usr/bin/env python3
"""Issue 31's benchmark of the mma.sync GEMM (hgemm_mma, bgemm_mma) on the H100, in one process.

  a  forced hgemm_mma (--dtypes fp16,bf16: bgemm_mma too) at 4096^3, 8192^3, 2048^3 and
     4096x4096x1024 (nn), in TFLOP/s, beside cuBLAS (the faster of cupy.matmul and torch.matmul) and
     Triton's own mma.sync path (DISABLE_MMA_V3=1, autotuned over 10 configurations: `asmgemm
     bench --triton-mma`'s column, asmgemm/bench/triton_ref.py), interleaved with asmgemm's timer
     (CUDA events around one call, rep by rep, L2 flushed, a GPU pre-roll hiding the host time; the
     median of --reps). Ratios to Triton's mma.sync path and to cuBLAS; the goal: >= 1.15x Triton's
     mma.sync path (the issue's anchors, measured earlier with Triton 3.6, are shown beside it).
     --params JSON and --variant NAME:JSON (repeatable, timed interleaved) lay -D overrides over what
     asmgemm.gemm(kernel=...) runs untuned at that shape (launch_config.untuned_defines: the catalog's
     pick, split included); with neither,
     the forced call runs exactly as a user's gemm(a, b, kernel="hgemm_mma") does.
  b  odd operands (leading dimensions that are not multiples of 8) by the default choice,
     asmgemm.gemm(a, b) with no kernel= and C allocated as torch.matmul allocates it, on fp16 torch
     tensors and on CuPy arrays (an NT shape's B is a transposed view of an (N, K) array): the time
     per call with the host work included (--calls calls, one synchronize, the total / calls; the
     median of 3 such loops), and one call between CUDA events with no pre-roll (the GPU idle
     before it; the median of --reps), beside torch.matmul (and cupy.matmul) timed the same ways;
     which kernel ran, the copies it made and its parameters (last_launch()). The goal: asmgemm's
     time per call at or below torch.matmul's.
  c  4095^3 against 4096^3 by the default choice (CuPy arrays, TFLOP/s timed as in a, cuBLAS
     beside), with what ran. The goal: 4095^3 >= 0.95x of 4096^3's TFLOP/s.

Every timed configuration is checked first: C poisoned with NaN, then ||C - ref|| / ||ref|| against
an fp32 product of the same (rounded) operands, within the kernel spec's rel_err_limit; a wrong
asmgemm configuration is reported and not timed. A compact table of all parts comes last.
The default run is meant to stay under 3 minutes on an H100; most of it is Triton's autotuning (10
compilations, then each shape's tuning) and the first build of each kernel configuration.

Usage (GPU, from the repository root after `source tools/device_setup.sh`):
    python3 tools/mma_bench.py --json $OUT/mma_bench.json
    python3 tools/mma_bench.py --parts a --shapes 4096x4096x4096 --variant base: \\
        --variant s3:'{"STAGES": 3}' --variant big:'{"BM": 128, "BN": 256, "WM": 64, "WN": 64}'
    python3 tools/mma_bench.py --parts a --params '{"BK": 64, "STAGES": 3}' --dtypes fp16,bf16
    python3 tools/mma_bench.py --parts b --odd-shapes 305x923x6,524x455x55:nt --calls 500
    python3 tools/mma_bench.py --parts c --edge-pair 4095x4095x4095,4096x4096x4096

Exit status: 0 done (goals met or not: the tables say); 1 no GPU (or an error before timing);
2 usage error; 3 an asmgemm call failed or gave a wrong result (named on standard error).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from typing import NamedTuple

from asmgemm.bench.shapes import Shape, parse_shape
from asmgemm.errors import AsmError

KERNELS = {"fp16": "hgemm_mma", "bf16": "bgemm_mma"}
DTYPES = {"fp16": "float16", "bf16": "bfloat16"}
SHAPES_A = "4096x4096x4096,8192x8192x8192,2048x2048x2048,4096x4096x1024"
SHAPES_B = "305x923x6,652x415x148,524x455x55:nt,2833x2x89:nt,1000x1000x999"
EDGE_PAIR = "4095x4095x4095,4096x4096x4096"
# Triton 3.6's mma.sync path (DISABLE_MMA_V3=1, 10 configurations autotuned), fp16, H100, TFLOP/s:
# issue 31's table (../shared/reference/triton-mma-sync-h100.json)
ANCHORS = {"4096x4096x4096": 358.5, "8192x8192x8192": 394.7, "2048x2048x2048": 219.9, "4096x4096x1024": 288.4}
GOAL_A = 1.15           # hgemm_mma / Triton's mma.sync path, at least
GOAL_B = 1.0            # asmgemm's time per call / torch.matmul's, at most
GOAL_C = 0.95           # 4095^3's TFLOP/s / 4096^3's, at least
REFS = ("cupy", "torch", "triton-mma")
EXIT_FAILED = 3
LOOP_ROUNDS = 3         # part b: loops of --calls calls per implementation, interleaved; their median


# ---- arguments (pure: tested on the CPU) ---------------------------------------------------------
def parse_overrides(text: str, where: str) -> dict[str, int]:
    """'{"BM": 128, "STAGES": 3}' (or an empty string: none) -> {name: int}."""
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not JSON ({exc.msg}): {text!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{where}: expected a JSON object of -D overrides such as '{{\"BM\": 128}}', got {text!r}")
    out = {}
    for name, v in value.items():
        if not name.isidentifier():
            raise ValueError(f"{where}: '{name}' is not a parameter name")
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{where}: {name} must be an integer, not {v!r}")
        out[name] = v
    return out


def parse_variant(text: str) -> tuple[str, dict[str, int]]:
    """'NAME:{"K": V, ...}' (or 'NAME:' for no overrides) -> (NAME, {K: V})."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not name:
        raise ValueError(f"--variant {text!r}: expected NAME:JSON, e.g. s3:'{{\"STAGES\": 3}}' (NAME: for none)")
    if name in REFS:
        raise ValueError(f"--variant {text!r}: '{name}' names a reference column; choose another name")
    return name, parse_overrides(rest, f"--variant {name}")


def parse_layout_shapes(spec: str, where: str) -> list[tuple[Shape, str]]:
    """'MxNxK[:LAYOUT],...' -> [(Shape, layout)], layout nn unless given (nn, nt, tn, tt)."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        text, _, layout = part.partition(":")
        layout = (layout or "nn").lower()
        if layout not in ("nn", "nt", "tn", "tt"):
            raise ValueError(f"{where} {part!r}: unknown layout '{layout}' (nn, nt, tn or tt)")
        try:
            out.append((parse_shape(text, where=f"{where} "), layout))
        except AsmError as exc:
            raise ValueError(exc.message) from None
    if not out:
        raise ValueError(f"{where}: no shape given")
    return out


def parse_parts(spec: str) -> list[str]:
    """'a,b,c', 'abc' or 'b' -> the parts in order a, b, c."""
    parts = set(spec.replace(",", "").strip().lower())
    unknown = parts - set("abc")
    if unknown or not parts:
        raise ValueError(f"--parts {spec!r}: choose from a, b and c (e.g. 'a,c')")
    return sorted(parts)


def parse_dtypes(spec: str) -> list[str]:
    out = [d.strip().lower() for d in spec.split(",") if d.strip()]
    bad = [d for d in out if d not in KERNELS]
    if bad or not out:
        raise ValueError(f"--dtypes {spec!r}: choose from {', '.join(KERNELS)}")
    return list(dict.fromkeys(out))


def build_variants(params: dict[str, int], variants: list[tuple[str, dict[str, int]]]) -> list[tuple[str, dict]]:
    """The forced runs of part a: each --variant's overrides over --params; without --variant one
    run, 'asm', with --params alone."""
    if not variants:
        return [("asm", dict(params))]
    names = [n for n, _ in variants]
    if len(set(names)) != len(names):
        raise ValueError("--variant names must be distinct")
    return [(name, {**params, **over}) for name, over in variants]


# ---- verdicts and tables (pure) ------------------------------------------------------------------
def verdict(value: float | None, goal: float, at_least: bool = True) -> str:
    if value is None or math.isnan(value):
        return "-"
    return "met" if (value >= goal if at_least else value <= goal) else "NOT met"


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def text_table(headers: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell; the first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))
    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def fmt_params(params: dict | None) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted((params or {}).items())) or "-"


def ran_of(info: dict | None) -> dict:
    """The parts of last_launch() a report keeps: kernel, copies, params."""
    if info is None:
        return {"kernel": None, "copies": [], "params": None}
    return {"kernel": info["kernel"], "copies": list(info.get("copies") or ()), "params": info.get("params")}


def ran_text(ran: dict) -> str:
    copies = "+".join(ran["copies"])
    return f"{ran['kernel']}" + (f" (copies {copies})" if copies else "")


# ---- the GPU side --------------------------------------------------------------------------------
class Operands(NamedTuple):
    a: object               # stored A and B, as gemm gets them with trans_a/trans_b
    b: object
    trans_a: bool
    trans_b: bool
    top_a: object           # torch views op(A), op(B) (None without torch)
    top_b: object
    cop_a: object           # CuPy views op(A), op(B) (None for bf16: CuPy has no such dtype)
    cop_b: object
    ref: object             # op(A) @ op(B) of the rounded operands, fp32, CuPy


class Gpu:
    """CuPy, torch (TF32 off; None when absent), asmgemm's gemm and timer pieces, in one place."""

    def __init__(self, use_torch: bool = True):
        from asmgemm.runtime.gpu import device_facts, gpu_name, require_gpu
        self.cp = require_gpu("tools/mma_bench.py")
        from asmgemm.bench.runner import torch_module
        self.torch = torch_module() if use_torch else None
        self.name = gpu_name()
        self.facts = device_facts()

    def sync(self):
        self.cp.cuda.Device().synchronize()

    def is_torch(self, x) -> bool:
        return self.torch is not None and isinstance(x, self.torch.Tensor)

    def operands(self, dtype: str, m: int, n: int, k: int, layout: str, seed: int) -> Operands:
        cp, torch = self.cp, self.torch
        ta, tb = layout[0] == "t", layout[1] == "t"
        rs = cp.random.RandomState(seed)
        a32 = rs.uniform(-1.0, 1.0, (k, m) if ta else (m, k), dtype=cp.float32)
        b32 = rs.uniform(-1.0, 1.0, (n, k) if tb else (k, n), dtype=cp.float32)
        if dtype == "float16":
            a, b = a32.astype(cp.float16), b32.astype(cp.float16)
            a_r, b_r = a.astype(cp.float32), b.astype(cp.float32)
            t_a = torch.from_dlpack(a) if torch is not None else None
            t_b = torch.from_dlpack(b) if torch is not None else None
            cop = (a.T if ta else a, b.T if tb else b)
        else:                   # bfloat16: torch tensors (CuPy has no bfloat16 dtype)
            t_a, t_b = torch.from_dlpack(a32).to(torch.bfloat16), torch.from_dlpack(b32).to(torch.bfloat16)
            a, b = t_a, t_b
            a_r, b_r = cp.from_dlpack(t_a.float()), cp.from_dlpack(t_b.float())
            cop = (None, None)
        del a32, b32
        ref = cp.matmul(a_r.T if ta else a_r, b_r.T if tb else b_r)
        top = ((t_a.t() if ta else t_a), (t_b.t() if tb else t_b)) if t_a is not None else (None, None)
        return Operands(a, b, ta, tb, *top, *cop, ref)

    def new_c(self, like, m: int, n: int):
        if self.is_torch(like):
            return self.torch.empty((m, n), dtype=like.dtype, device=like.device)
        return self.cp.empty((m, n), dtype=like.dtype)

    def poison(self, c):
        if self.is_torch(c):
            c.fill_(float("nan"))
        else:
            c.fill(float("nan"))

    def rel_error(self, c, ref) -> float:
        """||c - ref|| / ||ref|| in fp32; inf when c holds NaN or inf (an element left unwritten)."""
        cp = self.cp
        x = cp.from_dlpack(c.float().contiguous()) if self.is_torch(c) else c.astype(cp.float32)
        if not bool(cp.isfinite(x).all()):
            return float("inf")
        return float(cp.linalg.norm(x - ref) / cp.linalg.norm(ref))


def _first_line(exc: Exception) -> str:
    if isinstance(exc, AsmError):
        return exc.message.splitlines()[0]
    return f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"


def _check(gpu: Gpu, fns: dict, outs: dict, ref, asm_names, default_limit: float) -> dict:
    """Each fn once (on its poisoned output when `outs` has one, else on the C it returns), checked
    against `ref`; one that fails or is wrong leaves `fns`. The limit is the spec's rel_err_limit of
    the kernel an asmgemm call ran (last_launch()), else `default_limit`. Returns {"rel_err",
    "ran" (asmgemm's calls: kernel, copies, params), "notes", "failed" (asmgemm's calls that did not
    run or were wrong)}."""
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.gemm import clear_last_launch, last_launch
    res = {"rel_err": {}, "ran": {}, "notes": [], "failed": []}
    for name in list(fns):
        if name in outs:
            gpu.poison(outs[name])
        clear_last_launch()
        try:
            out = fns[name]()
            gpu.sync()
        except Exception as exc:            # AsmError, a CUDA launch error
            fns.pop(name)
            res["notes"].append(f"{name} did not run: {_first_line(exc)}")
            if name in asm_names:
                res["failed"].append(name)
            continue
        limit = default_limit
        if name in asm_names:
            ran = res["ran"][name] = ran_of(last_launch())
            if ran["kernel"]:
                limit = get_spec(ran["kernel"]).rel_err_limit
        err = res["rel_err"][name] = gpu.rel_error(outs.get(name, out), ref)
        if not err <= limit:
            fns.pop(name)
            res["notes"].append(f"{name} WRONG: relative error {err:.2e} > {limit:.0e}")
            if name in asm_names:
                res["failed"].append(name)
    return res


def part_a(gpu: Gpu, dtypes, shapes, layout, variants, reps, warmup, use_triton, log) -> list[dict]:
    from asmgemm.bench.timing import L2Flusher, make_pre_roll, tflops, time_interleaved
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.gemm import gemm
    from asmgemm.runtime.launch_config import untuned_defines
    torch = gpu.torch
    flush, pre_roll = L2Flusher(), make_pre_roll(True)
    make_tmma = None
    if use_triton:
        from asmgemm.bench.triton_ref import make_triton_mma_matmul, triton_available
        if torch is not None and triton_available():
            make_tmma = make_triton_mma_matmul
        else:
            log("part a: Triton's mma.sync column left out: Triton and torch (with CUDA) do not import here")
    rows = []
    for dt in dtypes:
        spec = get_spec(KERNELS[dt])
        if DTYPES[dt] == "bfloat16" and torch is None:
            log(f"part a: {spec.name} left out: bf16 operands are torch tensors here, and torch does not import")
            continue
        for i, shape in enumerate(shapes):
            m, n, k = shape.m, shape.n, shape.k
            ops = gpu.operands(DTYPES[dt], m, n, k, layout, seed=1000 + i)
            fns, outs = {}, {}
            untuned = None
            for name, over in variants:
                if over and untuned is None:
                    untuned = untuned_defines(spec, m, n, k, layout, gpu.facts)
                params = {**untuned, **over} if over else None
                c = outs[name] = gpu.new_c(ops.a, m, n)
                fns[name] = (lambda c=c, p=params: gemm(ops.a, ops.b, c, trans_a=ops.trans_a, trans_b=ops.trans_b,
                                                        params=p, kernel=spec.name))
            if ops.cop_a is not None:
                c = outs["cupy"] = gpu.new_c(ops.cop_a, m, n)
                fns["cupy"] = lambda c=c: gpu.cp.matmul(ops.cop_a, ops.cop_b, out=c)
            if torch is not None:
                c = outs["torch"] = gpu.new_c(ops.top_a, m, n)
                fns["torch"] = lambda c=c: torch.matmul(ops.top_a, ops.top_b, out=c)
            config, notes = None, []
            if make_tmma is not None:
                c = gpu.new_c(ops.top_a, m, n)
                try:
                    fns["triton-mma"], config = make_tmma(ops.top_a, ops.top_b, c)    # autotunes (seconds)
                    outs["triton-mma"] = c
                except Exception as exc:
                    notes.append(f"triton-mma not run: {_first_line(exc)}")
            names = [n for n, _ in variants]
            checked = _check(gpu, fns, outs, ops.ref, names, spec.rel_err_limit)
            notes += checked["notes"]
            errors, ran = checked["rel_err"], checked["ran"]
            stats = time_interleaved(fns, reps=reps, warmup=warmup, flush=flush, pre_roll=pre_roll) if fns else {}
            tf = {x: tflops(shape.flops, s.median_ms) for x, s in stats.items()}
            cublas = max((tf[x] for x in ("cupy", "torch") if x in tf), default=None)
            tmma = tf.get("triton-mma")
            anchor = ANCHORS.get(shape.key) if dt == "fp16" else None
            row = {"dtype": dt, "kernel": spec.name, "shape": shape.key, "layout": layout, "tflops": tf,
                   "cublas_tflops": cublas, "triton_mma_config": config, "anchor_triton_mma": anchor,
                   "rel_err": errors, "ran": ran, "notes": notes, "failed": checked["failed"], "variants": []}
            for name, over in variants:
                mine = tf.get(name)
                v = {"name": name, "overrides": over, "tflops": mine,
                     "to_triton_mma": round(mine / tmma, 3) if mine and tmma else None,
                     "to_anchor": round(mine / anchor, 3) if mine and anchor else None,
                     "to_cublas": round(mine / cublas, 3) if mine and cublas else None}
                v["goal"] = verdict(v["to_triton_mma"] if tmma else v["to_anchor"], GOAL_A)
                row["variants"].append(v)
            rows.append(row)
            refs = "  ".join(f"{x} {fmt(tf.get(x))}" for x in REFS if x in tf)
            log(f"a {spec.name} {layout} {shape.key}: " + "  ".join(
                f"{v['name']} {fmt(v['tflops'])} TFLOP/s ({fmt(v['to_triton_mma'], 2)}x triton-mma, "
                f"{fmt(v['to_cublas'], 2)}x cuBLAS)" for v in row["variants"]) + f"  | {refs}"
                + (f"  | triton-mma chose {config}" if config else ""))
            for name in names:
                if name in ran:
                    log(f"    {name}: ran {ran_text(ran[name])}, {fmt_params(ran[name]['params'])}")
            for note in notes:
                log(f"    note: {note}")
    return rows


def _loop_us(gpu: Gpu, fn, calls: int) -> float:
    """Time per call, host work included: `calls` calls, one synchronize, the total / calls (us)."""
    gpu.sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    gpu.sync()
    return (time.perf_counter() - t0) / calls * 1e6


def _one_call_us(gpu: Gpu, timer, fn) -> float:
    """One call between CUDA events, the GPU idle before it (no pre-roll): host and device time (us)."""
    gpu.sync()
    start = timer.mark()
    fn()
    end = timer.mark()
    gpu.sync()
    return timer.elapsed_ms(start, end) * 1e3


def part_b(gpu: Gpu, cases, calls, reps, warmup, log) -> list[dict]:
    from asmgemm.bench.timing import CudaEventTimer, interleaved_order
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.gemm import gemm
    cp, torch = gpu.cp, gpu.torch
    timer = CudaEventTimer()
    rows = []
    for i, (shape, layout) in enumerate(cases):
        m, n, k = shape.m, shape.n, shape.k
        ops = gpu.operands("float16", m, n, k, layout, seed=2000 + i)
        # what a user passes: op(A) and op(B) as views (an NT shape's B: the transpose of an (N, K) array)
        fns = {"asm cupy": lambda: gemm(ops.cop_a, ops.cop_b),
               "cupy.matmul": lambda: cp.matmul(ops.cop_a, ops.cop_b)}
        if torch is not None:
            fns["asm torch"] = lambda: gemm(ops.top_a, ops.top_b)
            fns["torch.matmul"] = lambda: torch.matmul(ops.top_a, ops.top_b)
        checked = _check(gpu, fns, {}, ops.ref, ("asm cupy", "asm torch"), get_spec("hgemm_mma").rel_err_limit)
        errors, ran, notes = checked["rel_err"], checked["ran"], checked["notes"]
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        names = list(fns)
        loops = {x: [] for x in names}
        singles = {x: [] for x in names}
        for r in range(LOOP_ROUNDS):
            for x in interleaved_order(names, r):
                loops[x].append(_loop_us(gpu, fns[x], calls))
        for r in range(reps):
            for x in interleaved_order(names, r):
                singles[x].append(_one_call_us(gpu, timer, fns[x]))
        loop_us = {x: round(statistics.median(v), 2) for x, v in loops.items()}
        one_us = {x: round(statistics.median(v), 2) for x, v in singles.items()}
        ref_us = loop_us.get("torch.matmul")
        row = {"shape": shape.key, "layout": layout, "loop_us": loop_us, "one_call_us": one_us, "rel_err": errors,
               "ran": ran, "notes": notes, "failed": checked["failed"], "to_torch": {}}
        for x in ("asm torch", "asm cupy"):
            if x in loop_us and ref_us:
                row["to_torch"][x] = round(loop_us[x] / ref_us, 3)
        row["goal"] = {x: verdict(v, GOAL_B, at_least=False) for x, v in row["to_torch"].items()}
        rows.append(row)
        log(f"b {shape.key} {layout}: per call (loop of {calls}) " + "  ".join(f"{x} {fmt(loop_us[x])}" for x in names)
            + " us;  one call between events " + "  ".join(f"{x} {fmt(one_us[x])}" for x in names) + " us")
        for x, info in ran.items():
            log(f"    {x}: ran {ran_text(info)}, {fmt_params(info['params'])}")
        for note in notes:
            log(f"    note: {note}")
    return rows


def part_c(gpu: Gpu, pair, reps, warmup, log) -> dict:
    from asmgemm.bench.timing import L2Flusher, make_pre_roll, tflops, time_interleaved
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.gemm import gemm
    cp, torch = gpu.cp, gpu.torch
    fns, keys = {}, []
    errors, ran, notes, failed = {}, {}, [], []
    for i, shape in enumerate(pair):
        key = shape.key
        keys.append(key)
        ops = gpu.operands("float16", shape.m, shape.n, shape.k, "nn", seed=3000 + i)
        these = {"asm": lambda o=ops: gemm(o.cop_a, o.cop_b)}          # C allocated, as users call it
        outs = {"cupy": cp.empty((shape.m, shape.n), cp.float16)}
        these["cupy"] = lambda o=ops, c=outs["cupy"]: cp.matmul(o.cop_a, o.cop_b, out=c)
        if torch is not None:
            outs["torch"] = torch.empty((shape.m, shape.n), dtype=torch.float16, device="cuda")
            these["torch"] = lambda o=ops, c=outs["torch"]: torch.matmul(o.top_a, o.top_b, out=c)
        checked = _check(gpu, these, outs, ops.ref, ("asm",), get_spec("hgemm").rel_err_limit)
        errors.update({f"{x} {key}": e for x, e in checked["rel_err"].items()})
        notes += [f"{key}: {note}" for note in checked["notes"]]
        failed += [f"{x} {key}" for x in checked["failed"]]
        if "asm" in checked["ran"]:
            ran[key] = checked["ran"]["asm"]
        fns.update({f"{x} {key}": fn for x, fn in these.items()})
    stats = {}
    if fns:
        stats = time_interleaved(fns, reps=reps, warmup=warmup, flush=L2Flusher(), pre_roll=make_pre_roll(True))
    flops = {s.key: s.flops for s in pair}
    tf = {x: tflops(flops[x.split()[1]], s.median_ms) for x, s in stats.items()}
    odd, even = keys
    asm_odd, asm_even = tf.get(f"asm {odd}"), tf.get(f"asm {even}")
    ratio = round(asm_odd / asm_even, 3) if asm_odd and asm_even else None
    cublas = {key: max((tf[f"{x} {key}"] for x in ("cupy", "torch") if f"{x} {key}" in tf), default=None)
              for key in keys}
    result = {"odd": odd, "even": even, "tflops": tf, "cublas_tflops": cublas, "ratio": ratio,
              "goal": verdict(ratio, GOAL_C), "rel_err": errors, "ran": ran, "notes": notes, "failed": failed}
    log(f"c {odd} vs {even} (default choice): " + "  ".join(f"{x} {fmt(v)}" for x, v in tf.items())
        + f" TFLOP/s; {odd}/{even} = {fmt(ratio, 3)} (goal >= {GOAL_C}: {result['goal']})")
    for key, info in ran.items():
        log(f"    {key}: ran {ran_text(info)}, {fmt_params(info['params'])}")
    for note in notes:
        log(f"    note: {note}")
    return result


# ---- the summary ---------------------------------------------------------------------------------
def summary(gpu_name: str, report: dict) -> str:
    """The compact tables of every part that ran (from the report alone)."""
    out = [f"== summary on {gpu_name} =="]
    if report.get("a"):
        rows = []
        for r in report["a"]:
            for v in r["variants"]:
                tf = r["tflops"]
                rows.append([f"{r['kernel']} {r['layout']} {r['shape']}", v["name"], fmt(v["tflops"]),
                             fmt(tf.get("triton-mma")), fmt(r["anchor_triton_mma"]), fmt(r["cublas_tflops"]),
                             fmt(v["to_triton_mma"], 2), fmt(v["to_anchor"], 2), fmt(v["to_cublas"], 2),
                             f"{r['rel_err'].get(v['name'], float('nan')):.1e}", v["goal"]])
        out += [f"a) forced mma.sync kernel, TFLOP/s (goal >= {GOAL_A}x Triton's mma.sync path; "
                "the anchor: the issue's measurement, when Triton is not timed here)",
                text_table(["shape", "run", "asm", "triton-mma", "anchor", "cuBLAS", "/triton-mma", "/anchor",
                            "/cuBLAS", "rel err", "goal"], rows), ""]
    if report.get("b"):
        rows = []
        for r in report["b"]:
            for x in ("asm torch", "asm cupy"):
                if x not in r["loop_us"]:
                    continue
                ran = r["ran"].get(x)
                rows.append([f"{r['shape']} {r['layout']}", x.split()[1], ran_text(ran) if ran else "-",
                             fmt(r["loop_us"][x]), fmt(r["loop_us"].get("torch.matmul")),
                             fmt(r["loop_us"].get("cupy.matmul")), fmt(r["to_torch"].get(x), 2),
                             fmt(r["one_call_us"].get(x)), fmt(r["one_call_us"].get("torch.matmul")),
                             r["goal"].get(x, "-")])
        out += [f"b) odd operands, default choice: us per call, host work included (goal <= {GOAL_B}x torch.matmul); "
                "then one call between events, no pre-roll",
                text_table(["shape", "arrays", "ran", "asm/call", "torch/call", "cupy/call", "asm/torch",
                            "asm 1 call", "torch 1 call", "goal"], rows), ""]
    if report.get("c"):
        c = report["c"]
        rows = [[key, ran_text(c["ran"][key]) if key in c["ran"] else "-", fmt(c["tflops"].get(f"asm {key}")),
                 fmt(c["cublas_tflops"].get(key))] for key in (c["odd"], c["even"])]
        out += [f"c) default choice, TFLOP/s: {c['odd']} / {c['even']} = {fmt(c['ratio'], 3)} "
                f"(goal >= {GOAL_C}: {c['goal']})",
                text_table(["shape", "ran", "asm", "cuBLAS"], rows), ""]
    return "\n".join(out)


def _versions(gpu: Gpu) -> dict:
    import asmgemm
    out = {"asmgemm": asmgemm.__version__, "cupy": gpu.cp.__version__}
    if gpu.torch is not None:
        out["torch"] = gpu.torch.__version__
    try:
        import triton
        out["triton"] = triton.__version__
    except Exception:
        pass
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mma_bench.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="a,b,c", help="which parts to run: a, b, c (default a,b,c)")
    ap.add_argument("--dtypes", default="fp16", help="part a: fp16 (hgemm_mma) and/or bf16 (bgemm_mma); default fp16")
    ap.add_argument("--shapes", default=SHAPES_A, metavar="MxNxK,...", help=f"part a's shapes (default {SHAPES_A})")
    ap.add_argument("--layout", choices=("nn", "nt", "tn", "tt"), default="nn", help="part a's layout (default nn)")
    ap.add_argument("--params", default="", metavar="JSON",
                    help="part a: -D overrides of the forced runs, e.g. '{\"BK\": 64, \"STAGES\": 3}', laid over "
                         "the kernel's untuned choice at each shape")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:JSON",
                    help="part a: a named run with these overrides over --params (repeatable; timed interleaved; "
                         "NAME: for --params alone)")
    ap.add_argument("--odd-shapes", default=SHAPES_B, metavar="MxNxK[:LAYOUT],...",
                    help=f"part b's shapes, layout nn unless given (default {SHAPES_B})")
    ap.add_argument("--edge-pair", default=EDGE_PAIR, metavar="ODD,EVEN",
                    help=f"part c: the shape whose ratio is taken, then the one it is compared with "
                         f"(default {EDGE_PAIR})")
    ap.add_argument("--reps", type=int, default=20, help="timed repetitions (median) per implementation (default 20)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per implementation first (default 3)")
    ap.add_argument("--calls", type=int, default=200, help="part b: calls per timed loop (default 200)")
    ap.add_argument("--no-triton", action="store_true", help="part a: leave Triton's mma.sync path out (no autotuning)")
    ap.add_argument("--no-torch", action="store_true",
                    help="leave torch out (and with it Triton, bf16 and the torch tensors of part b)")
    ap.add_argument("--json", metavar="PATH", help="write every number as JSON to PATH")
    args = ap.parse_args(argv)
    try:
        parts = parse_parts(args.parts)
        dtypes = parse_dtypes(args.dtypes)
        shapes_a = [s for s, _ in parse_layout_shapes(args.shapes, "--shapes")]
        variants = build_variants(parse_overrides(args.params, "--params"), [parse_variant(v) for v in args.variant])
        cases_b = parse_layout_shapes(args.odd_shapes, "--odd-shapes")
        pair = [s for s, _ in parse_layout_shapes(args.edge_pair, "--edge-pair")]
        if len(pair) != 2 or pair[0] == pair[1]:
            raise ValueError(f"--edge-pair {args.edge_pair!r}: give two different shapes, ODD,EVEN")
        if min(args.reps, args.calls) < 1 or args.warmup < 0:
            raise ValueError("--reps and --calls must be >= 1, --warmup >= 0")
    except ValueError as exc:
        ap.error(str(exc))
    if args.json:
        from asmgemm.files import check_outputs
        try:
            check_outputs([args.json])
        except AsmError as exc:
            print(exc.format(), file=sys.stderr)
            return 1

    def log(line: str):
        print(line, flush=True)

    t0 = time.perf_counter()
    try:
        gpu = Gpu(use_torch=not args.no_torch)
        report = {"gpu": gpu.name, "versions": _versions(gpu), "reps": args.reps, "calls": args.calls,
                  "goals": {"a_to_triton_mma": GOAL_A, "b_to_torch": GOAL_B, "c_odd_to_even": GOAL_C}}
        log(f"mma_bench on {gpu.name}: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()))
        if "a" in parts:
            report["a"] = part_a(gpu, dtypes, shapes_a, args.layout, variants, args.reps, args.warmup,
                                 not args.no_triton, log)
        if "b" in parts:
            report["b"] = part_b(gpu, cases_b, args.calls, args.reps, args.warmup, log)
        if "c" in parts:
            report["c"] = part_c(gpu, pair, args.reps, args.warmup, log)
    except AsmError as exc:
        print(exc.format(), file=sys.stderr)
        return 1
    report["seconds"] = round(time.perf_counter() - t0, 1)
    print()
    print(summary(gpu.name, report))
    print(f"({report['seconds']} s)")
    if args.json:
        from asmgemm.files import write_atomic
        write_atomic(args.json, json.dumps(report, indent=1) + "\n")
    failed = [f for part in ("a", "b") for r in report.get(part, []) for f in r["failed"]]
    failed += report.get("c", {}).get("failed", [])
    if failed:
        print(f"asmgemm's calls that failed or were wrong: {', '.join(failed)}", file=sys.stderr)
    return EXIT_FAILED if failed else 0


if __name__ == "__main__":
    sys.exit(main())
