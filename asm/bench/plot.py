"""A picture of a benchmark report (`asmgemm bench --plot FILE`), two panels over the problem's
size (FLOPs = 2·M·N·K, log axis), one colour per operand dtype and one marker per layout:
  left   asmgemm's ratio to the faster cuBLAS path (cupy.matmul or torch.matmul) in call time (what
         a caller waits for; timing.py), a line at 1.0, the 5 slowest shapes labelled M×N×K layout;
  right  TFLOP/s (call time) of asmgemm (filled) and of the faster cuBLAS path (hollow), with the
         GPU's peak for each dtype as a dashed line.
Works from the report's JSON alone (`asmgemm bench --plot OUT.png --from results.json`), so a stored
result is redrawn without a GPU; a report from before the call-time measurement is drawn from its
(gpu-time) tflops, and says so. Needs matplotlib (the `plot` extra).

Peaks (dense, no sparsity; TFLOP/s) from NVIDIA's datasheets: FP32 is the CUDA-core rate (what
SGEMM without TF32 can reach), FP16/BF16 the tensor-core rate with FP32 accumulation.
  H100 SXM5 / H200 SXM: FP32 66.9, FP16/BF16 989.4 (NVIDIA H100 and H200 datasheets)
  H100 PCIe: FP32 51.2, FP16/BF16 756.5 (NVIDIA H100 datasheet)
  A100 (SXM and PCIe): FP32 19.5, FP16/BF16 312 (NVIDIA A100 datasheet)
"""
from __future__ import annotations

import io
import json
from pathlib import Path

from ..errors import AsmError

FORMATS = ("png", "svg", "pdf")
PLOT_HINT = "pip install 'asmgemm[plot]' (or pip install matplotlib)"

# (name fragments that must all occur, fp32 peak, fp16/bf16 tensor peak); the first match wins
_PEAKS = (
    (("H100", "PCIe"), 51.2, 756.5),
    (("H100",), 66.9, 989.4),
    (("H200",), 66.9, 989.4),
    (("A100",), 19.5, 312.0),
)


def peak_tflops(gpu: str) -> dict[str, float] | None:
    """{'float32': ..., 'float16': ..., 'bfloat16': ...} for a known GPU name, else None."""
    for parts, fp32, tensor in _PEAKS:
        if all(p in gpu for p in parts):
            return {"float32": fp32, "float16": tensor, "bfloat16": tensor}
    return None


def require_matplotlib():
    """matplotlib's Figure class; AsmError (one line and a hint) when matplotlib is not installed."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise AsmError(f"--plot needs matplotlib, which is not installed ({exc})", hint=PLOT_HINT) from None
    return Figure


def plot_format(path: str) -> str:
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise AsmError(f"--plot {path}: the file name must end in {', '.join('.' + f for f in FORMATS)} "
                       "(the picture's format)")
    return fmt


def load_report(path: str) -> dict:
    """A report `asmgemm bench --json OUT` wrote, checked enough to draw it."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AsmError(f"cannot read the benchmark result {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        report = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AsmError(f"{path}:{exc.lineno}:{exc.colno}: error: invalid JSON: {exc.msg}") from None
    if not isinstance(report, dict) or not isinstance(report.get("rows"), list):
        raise AsmError(f"{path}: not a benchmark result (`asmgemm bench --json OUT` writes one): no 'rows' list")
    for i, row in enumerate(report["rows"]):
        ok = isinstance(row, dict) and all(isinstance(row.get(d), int) for d in "mnk") \
            and isinstance(row.get("tflops"), dict) \
            and all(isinstance(v, (int, float)) for v in row["tflops"].values()) \
            and (not isinstance(row.get("call_ms"), dict)
                 or all(isinstance(v, (int, float)) for v in row["call_ms"].values()))
        if not ok:
            raise AsmError(f"{path}: rows[{i}] is not a benchmark row (m, n, k and a tflops table of numbers)")
    return report


REFS = ("cublas", "torch")          # the cuBLAS paths; a row's best is the faster of those it has
LABELLED = 5                       # the slowest shapes named in the left panel
COLOURS = {"float32": "tab:blue", "float16": "tab:orange", "bfloat16": "tab:green"}
OTHER_COLOURS = ("tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan")
MARKERS = {"nn": "o", "nt": "s", "tn": "^", "tt": "D"}


def _dtype(row: dict) -> str:
    """The operands' dtype (it sets the peak; a_dtype since the call-time reports), else C's."""
    return str(row.get("a_dtype") or row.get("dtype") or "?")


def _tflops(row: dict) -> tuple[dict, bool]:
    """(TFLOP/s per implementation in call time, whether it is call time), from the row's call_ms
    (exact; its tflops tables are rounded to 0.001, nothing left of a 2^18-FLOP shape); reports of
    before the call-time measurement have only the gpu-time `tflops`."""
    ms = row.get("call_ms")
    if isinstance(ms, dict) and ms:
        flops = 2 * row["m"] * row["n"] * row["k"]
        return {i: flops / (v * 1e-3) / 1e12 for i, v in ms.items() if v > 0}, True
    return row["tflops"], False


def _point(row: dict) -> dict | None:
    """What the panels draw of one row: flops, asmgemm's and the best reference's TFLOP/s, their
    ratio; None for a row without asmgemm or a reference (a wrong or failed kernel)."""
    tf, is_call = _tflops(row)
    mine = tf.get("asmgemm")
    refs = [tf[i] for i in REFS if isinstance(tf.get(i), (int, float)) and tf[i] > 0]
    if not isinstance(mine, (int, float)) or mine <= 0 or not refs or row.get("correct") is False:
        return None
    return {"flops": 2 * row["m"] * row["n"] * row["k"], "mine": float(mine), "best": float(max(refs)),
            "ratio": float(mine) / max(refs), "dtype": _dtype(row), "layout": str(row.get("layout", "nn")),
            "name": f"{row['m']}x{row['n']}x{row['k']} {row.get('layout', 'nn')}", "call": is_call}


def render(report: dict, fmt: str) -> bytes:
    """The picture of `report` as bytes of format `fmt` (png, svg or pdf)."""
    Figure = require_matplotlib()
    from matplotlib.lines import Line2D
    if not report["rows"]:
        raise AsmError("the benchmark result has no rows to draw")
    # rows without both asmgemm and a reference timed (a wrong kernel) are left out; with none
    # left the panels stay empty with a note: the run's own exit status tells what went wrong
    points = [p for p in (_point(r) for r in report["rows"]) if p is not None]
    peaks = report.get("peak_tflops") or peak_tflops(str(report.get("gpu", ""))) or {}
    dtypes = list(dict.fromkeys(p["dtype"] for p in points))
    colour = {d: COLOURS.get(d) or OTHER_COLOURS[i % len(OTHER_COLOURS)] for i, d in enumerate(dtypes)}
    layouts = list(dict.fromkeys(p["layout"] for p in points))
    timing = "call time" if all(p["call"] for p in points) else "gpu time (a report without call times)"

    fig = Figure(figsize=(12, 5), layout="constrained")
    left, right = fig.subplots(1, 2)
    for d in dtypes:
        for lay in layouts:
            pts = [p for p in points if p["dtype"] == d and p["layout"] == lay]
            if not pts:
                continue
            style = dict(marker=MARKERS.get(lay, "x"), color=colour[d], linestyle="none", markersize=6)
            xs = [p["flops"] for p in pts]
            left.plot(xs, [p["ratio"] for p in pts], alpha=0.85, **style)
            right.plot(xs, [p["mine"] for p in pts], alpha=0.85, **style)
            right.plot(xs, [p["best"] for p in pts], markerfacecolor="none", alpha=0.6, **style)

    left.axhline(1.0, color="black", linewidth=1)
    # the slowest, left to right, labelled alternately below and above their points (slow shapes
    # of similar size would print their names over each other), a thin line to the point
    slowest = sorted(sorted(points, key=lambda p: p["ratio"])[:LABELLED], key=lambda p: p["flops"])
    for i, p in enumerate(slowest):
        left.annotate(p["name"], (p["flops"], p["ratio"]), xytext=(6, -16 - 10 * (i % 3) if i % 2 == 0 else 10),
                      textcoords="offset points", fontsize="x-small", color=colour[p["dtype"]],
                      arrowprops=dict(arrowstyle="-", color=colour[p["dtype"]], linewidth=0.5, alpha=0.6))
    left.set_xscale("log")
    left.set_ylim(bottom=0, top=max([1.2] + [1.05 * p["ratio"] for p in points]))
    if not points:
        left.text(0.5, 0.5, "no shape with asmgemm and cuBLAS both timed", transform=left.transAxes,
                  ha="center")
    left.set_xlabel("problem size, FLOPs (2·M·N·K)")
    left.set_ylabel("asmgemm / faster cuBLAS path (cupy or torch)")
    left.set_title(f"ratio to the faster cuBLAS path, {timing}", fontsize="medium")
    left.grid(True, which="both", alpha=0.3)

    for d in dtypes:
        peak = peaks.get(d)
        if peak:
            kind = "FP32" if d == "float32" else f"{d} tensor"
            right.axhline(peak, linestyle="--", color=colour[d], linewidth=1)
            right.annotate(f"{kind} peak {peak:g}", (0.01, peak), xycoords=("axes fraction", "data"),
                           xytext=(0, 2), textcoords="offset points", fontsize="x-small", color=colour[d])
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel("problem size, FLOPs (2·M·N·K)")
    right.set_ylabel("TFLOP/s")
    right.set_title(f"TFLOP/s, {timing}: asmgemm filled, cuBLAS hollow", fontsize="medium")
    right.grid(True, which="both", alpha=0.3)

    handles = [Line2D([], [], color=colour[d], marker="o", linestyle="none", label=d) for d in dtypes]
    handles += [Line2D([], [], color="gray", marker=MARKERS.get(lay, "x"), linestyle="none", label=lay)
                for lay in layouts]
    handles += [Line2D([], [], color="gray", marker="o", linestyle="none", label="asmgemm"),
                Line2D([], [], color="gray", marker="o", markerfacecolor="none", linestyle="none",
                       label="cuBLAS (faster of cupy, torch)")]
    right.legend(handles=handles, loc="lower right", fontsize="small")
    kernels = ", ".join(dict.fromkeys(str(r.get("kernel", "?")) for r in report["rows"]))
    fig.suptitle(f"asmgemm bench: {kernels} on {report.get('gpu', 'an unnamed GPU')}, {len(points)} shapes")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    return buf.getvalue()
