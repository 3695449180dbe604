#!/usr/bin/env python3
"""Fit the TMA kernel's time model (asmgemm.runtime.path_model.TmaTime) on GPU times of the TMA
kernel at the configurations its size rules give, and print the coefficients path_model ships.

Each call is configured again on the CPU as the runtime would run it on the TMA kernel (the
in-place choice off), built (ptxas: the build gives the tile and the cluster), and read into the
model's terms by launch_config.tma_launch_terms, the function the runtime weighs with: a block's
chain of K tiles, its tiles, the tile's area, the bytes of A, B and C. The coefficients minimise
the squared log error (Gauss-Newton, kept non-negative); the leave-one-out error is what
path_model.aligned_margin combines with the in-place estimate's.

Input: `tools/call_gap_diag.py --paths --json` documents (a list of cases, each with a "tma" timing
in ms), or documents with "rows" of {"case", "tma": {"gpu_us"}} (tools/data/path_train_h100.json.gz).

    python3 tools/fit_tma_time.py tools/data/path_train_h100.json.gz
    python3 tools/fit_tma_time.py paths_*.json --gpu "NVIDIA H200" --worst 8 --json fit.json

--gpu names the GPU whose facts configure the calls (its DRAM rate enters the floor and the size
rules): the document's own "gpu" where it has one, else the H100 SXM."""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys

# the GPUs whose facts a fit may configure calls with (sm_90; DRAM: 2 x memory clock x bus width)
GPUS = {
    "NVIDIA H100 80GB HBM3": (132, 1.98e9, 3.35e12, 50 * 1024 * 1024),
    "NVIDIA H200": (132, 1.98e9, 4.8e12, 60 * 1024 * 1024),
}
NAMES = ("launch_s", "k_tile_s", "k_tile_area_s", "tile_area_s")


def facts_of(gpu: str):
    """The DeviceFacts (device 0, sm_90) of a GPU of GPUS, to configure calls with on the CPU."""
    from asmgemm.runtime.gpu import DeviceFacts
    sms, clock, dram, l2 = GPUS[gpu]
    return DeviceFacts(0, gpu, "sm_90", sms, clock, dram, l2)


def read_calls(path: str) -> tuple[str | None, list[tuple[int, int, int, str, str, float]]]:
    """(the document's GPU or None, [(m, n, k, layout, dtype, TMA GPU seconds)])."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        sys.exit(f"fit_tma_time: cannot read {path}: {exc}")
    rows, gpu = (doc.get("rows"), doc.get("gpu")) if isinstance(doc, dict) else (doc, None)
    if not isinstance(rows, list):
        sys.exit(f"fit_tma_time: {path} has neither a list of cases nor 'rows'")
    calls = []
    for row in rows:
        try:
            kind, mnk, layout, dtype = row["case"].split()
            m, n, k = (int(x) for x in mnk.split("x"))
            tma = row["tma"]
            seconds = tma["gpu_us"] * 1e-6 if "gpu_us" in tma else tma["gpu"] * 1e-3
        except (KeyError, ValueError, TypeError, AttributeError):
            sys.exit(f"fit_tma_time: {path}: a case without 'gemm MxNxK LAYOUT DTYPE' and a TMA time: {row!r:.200}")
        if kind == "gemm" and seconds > 0:
            calls.append((m, n, k, layout, dtype, seconds))
    return gpu, calls


def launch_terms(m: int, n: int, k: int, layout: str, dtype: str, facts):
    """launch_config.tma_launch_terms of the call as the runtime would run it on the TMA kernel, on
    freshly allocated operands (plan.fresh_operands, what explain and the sweep configure), or None."""
    from asmgemm.runtime import launch_config, path_model
    from asmgemm.runtime.arrays import Dtype
    from asmgemm.runtime.plan import fresh_operands
    a, b, c, trans_a, trans_b = fresh_operands(m, n, k, layout, Dtype(dtype, 2))
    with path_model.in_place_off():
        cfg = launch_config.configure(launch_config.pick_spec(None, dtype, None, facts),
                                      launch_config.Problem(a, b, c, trans_a=trans_a, trans_b=trans_b), facts)
    if cfg.built is None or cfg.copied != (0, 0):
        return None
    # the rules' own clusters: the training calls were timed before the time model could leave them
    return launch_config.tma_launch_terms(cfg.spec, cfg.plan, facts, 2, rules_only=True)


def predict(theta, terms, dram: float):
    import numpy as np
    chain, tiles, area, moved = (np.asarray(x, dtype=float) for x in zip(*terms))
    compute = theta[0] + chain * (theta[1] + theta[2] * area) + tiles * theta[3] * area
    floor = theta[0] + moved / dram
    x = np.stack([np.ones_like(chain), chain, chain * area, tiles * area], axis=1)
    bound = compute >= floor
    return np.maximum(compute, floor), np.where(bound[:, None], x, np.eye(4)[0][None, :])


def fit(terms, seconds, dram: float):
    """Coefficients (seconds) minimising sum(log(model / measured)^2), each >= 0."""
    import numpy as np
    y = np.asarray(seconds, dtype=float)
    theta = np.array([5e-6, 0.15e-6, 0.3e-6, 1e-6])
    lam = 1e-3
    for _ in range(200):
        p, x = predict(theta, terms, dram)
        r = np.log(p / y)
        jac = x / p[:, None]
        scale = np.maximum(np.abs(theta), 1e-9)          # coefficients span 1e-7..1e-5: solve in relative units
        js = jac * scale
        step = np.linalg.solve(js.T @ js + lam * np.eye(4), -js.T @ r) * scale
        trial = np.maximum(theta + step, 0.0)
        if np.sum(np.log(predict(trial, terms, dram)[0] / y) ** 2) < np.sum(r ** 2):
            theta, lam = trial, lam / 3
            if np.max(np.abs(step) / scale) < 1e-7:
                break
        else:
            lam *= 10
            if lam > 1e8:
                break
    return theta


def rms_log(theta, terms, seconds, dram: float) -> float:
    import numpy as np
    return float(np.sqrt(np.mean(np.log(predict(theta, terms, dram)[0] / np.asarray(seconds)) ** 2)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", help="TMA kernel timings (call_gap_diag --paths --json, or rows)")
    ap.add_argument("--gpu", choices=sorted(GPUS), help="the GPU whose facts configure the calls")
    ap.add_argument("--worst", type=int, default=0, help="list the N calls the fit errs most on")
    ap.add_argument("--json", metavar="PATH", help="write the coefficients and errors here")
    args = ap.parse_args(argv)

    from asmgemm.errors import AsmError
    calls, gpus = [], set()
    for path in args.files:
        gpu, got = read_calls(path)
        gpus.add(args.gpu or gpu or "NVIDIA H100 80GB HBM3")
        calls += got
    if len(gpus) != 1:
        sys.exit(f"fit_tma_time: the files are of several GPUs ({', '.join(sorted(gpus))}): fit one at a time")
    gpu = gpus.pop()
    if gpu not in GPUS:
        sys.exit(f"fit_tma_time: no facts for '{gpu}' (--gpu: {', '.join(sorted(GPUS))})")
    facts = facts_of(gpu)
    dram = facts.dram_bytes_per_s
    terms, seconds, cases = [], [], []
    for i, (m, n, k, layout, dtype, t) in enumerate(calls):
        print(f"\rconfiguring {i + 1}/{len(calls)}", end="", file=sys.stderr, flush=True)
        try:
            got = launch_terms(m, n, k, layout, dtype, facts)
        except AsmError as exc:
            print(f"\nfit_tma_time: {m}x{n}x{k} {layout} {dtype} left out: {exc.message}", file=sys.stderr)
            continue
        if got is not None:
            terms.append(got)
            seconds.append(t)
            cases.append(f"{m}x{n}x{k} {layout} {dtype}")
    print(file=sys.stderr)
    if len(terms) < 8:
        sys.exit(f"fit_tma_time: {len(terms)} calls run on the TMA kernel's modelled launch; 8 at least are needed")
    theta = fit(terms, seconds, dram)
    loo = []
    for i in range(len(terms)):
        rest = fit(terms[:i] + terms[i + 1:], seconds[:i] + seconds[i + 1:], dram)
        loo.append(math.log(predict(rest, [terms[i]], dram)[0][0] / seconds[i]))
    result = {"gpu": gpu, "calls": len(terms), **{name: float(v) for name, v in zip(NAMES, theta)},
              "rms_log": round(rms_log(theta, terms, seconds, dram), 4),
              "loo_rms_log": round(math.sqrt(sum(e * e for e in loo) / len(loo)), 4)}
    print(f"{gpu}: {len(terms)} calls on the TMA kernel")
    print("  " + ", ".join(f"{name} {result[name] * 1e6:.3f} us" for name in NAMES))
    print(f"  rms log error {result['rms_log']:.3f} in sample, {result['loo_rms_log']:.3f} leave-one-out")
    if args.worst:
        model, _ = predict(theta, terms, dram)
        order = sorted(range(len(terms)), key=lambda i: -abs(math.log(model[i] / seconds[i])))
        for i in order[:args.worst]:
            chain, tiles, area, _ = terms[i]
            print(f"  {cases[i]:28s} measured {seconds[i] * 1e6:7.1f} us, modelled {model[i] * 1e6:7.1f} "
                  f"(chain {chain}, tiles a block {tiles}, area {area:g})")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
