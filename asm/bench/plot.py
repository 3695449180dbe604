"""A picture of a benchmark report (`asmgemm bench --plot FILE`): TFLOP/s per shape for asmgemm,
cuBLAS, torch, Triton and Triton's mma.sync path (whichever columns the report has), one panel per
kernel and layout, and the GPU's peak for the kernel's dtype as a dashed line -- the picture
Triton's `perf_report` users know. Works from the report's JSON alone (`asmgemm bench --plot OUT.png
--from results.json`), so a stored result is redrawn without a GPU. Needs matplotlib (the `plot` extra).

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
IMPLS = (("asmgemm", "asmgemm"), ("cublas", "cuBLAS"), ("torch", "torch"), ("triton", "Triton"),
         ("triton-mma", "Triton mma.sync"))
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
            and all(isinstance(v, (int, float)) for v in row["tflops"].values())
        if not ok:
            raise AsmError(f"{path}: rows[{i}] is not a benchmark row (m, n, k and a tflops table)")
    return report


def _groups(rows: list[dict]) -> dict[tuple[str, str, str], list[dict]]:
    out: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((str(r.get("kernel", "?")), str(r.get("layout", "nn")), str(r.get("dtype", ""))), []).append(r)
    return out


def render(report: dict, fmt: str) -> bytes:
    """The picture of `report` as bytes of format `fmt` (png, svg or pdf)."""
    Figure = require_matplotlib()
    groups = _groups(report["rows"])
    if not groups:
        raise AsmError("the benchmark result has no rows to draw")
    peaks = report.get("peak_tflops") or peak_tflops(str(report.get("gpu", ""))) or {}
    fig = Figure(figsize=(max(6.0, 0.9 * max(len(g) for g in groups.values()) + 3), 4.2 * len(groups)),
                 layout="constrained")
    axes = fig.subplots(len(groups), 1, squeeze=False)[:, 0]
    for ax, ((kernel, layout, dtype), rows) in zip(axes, groups.items()):
        labels = [f"{r['m']}×{r['n']}×{r['k']}" for r in rows]
        x = list(range(len(rows)))
        for impl, shown in IMPLS:
            ys = [r["tflops"].get(impl) for r in rows]
            if any(y is not None for y in ys):
                ax.plot(x, [float("nan") if y is None else y for y in ys], marker="o", label=shown)
        peak = peaks.get(dtype)
        if peak:
            kind = "FP32" if dtype == "float32" else f"{dtype} tensor"
            ax.axhline(peak, linestyle="--", color="gray", label=f"{kind} peak {peak:g}")
        ax.set_xticks(x, labels, rotation=30 if len(rows) > 4 else 0, ha="right" if len(rows) > 4 else "center")
        ax.set_xlabel("M×N×K")
        ax.set_ylabel("TFLOP/s")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{kernel} ({dtype or '?'}, {layout}) on {report.get('gpu', 'an unnamed GPU')}")
        ax.grid(True, alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt)
    return buf.getvalue()
