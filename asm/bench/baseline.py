"""Performance baselines per GPU model: the ratio of each kernel's throughput to cuBLAS, per
(kernel, layout, shape), saved by `asmgemm bench --save-baseline` and checked by the `perf` tests.

Ratios, not TFLOP/s, are stored and compared: cuBLAS runs interleaved with the kernel in the same
process, so clock, power and temperature state cancel out, and the baseline stays meaningful on
another card of the same model.

File: <baseline dir>/<GPU name with non-alphanumerics as '_'>.json, e.g.
tests/perf/baselines/NVIDIA_H100_80GB_HBM3.json:

    {"format": 1, "gpu": "NVIDIA H100 80GB HBM3", "tolerance": 0.05,
     "entries": {"sgemm/nn/4096x4096x4096": {"kernel": "sgemm", "layout": "nn", "m": 4096, "n": 4096,
                 "k": 4096, "ratio": 0.97, "tflops": 48.3, "cublas_tflops": 49.8, "saved": "..."}}}

A regression is a ratio below old x (1 - tolerance). The default tolerance, 5 %, is above the
run-to-run spread of the interleaved ratio that bench reports (max-min over median) for shapes
that fill the H100; a file may set its own "tolerance", an entry too.
"""
from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import AsmError
from ..files import write_atomic

BASELINE_FORMAT = 1
DEFAULT_TOLERANCE = 0.05


def baseline_file_name(gpu_name: str) -> str:
    stem = re.sub(r"[^A-Za-z0-9-]+", "_", gpu_name).strip("_") or "unknown_gpu"
    return f"{stem}.json"


def repo_baseline_dir() -> Path:
    """tests/perf/baselines of the source checkout this package runs from (editable installs), else
    of the current directory (an installed package has no checkout of its own)."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file():
        return checkout / "tests" / "perf" / "baselines"
    return Path.cwd() / "tests" / "perf" / "baselines"


def default_baseline_dir() -> Path:
    env = os.environ.get("ASMGEMM_BASELINE_DIR")
    if env:
        return Path(env)
    return repo_baseline_dir()


def entry_key(kernel: str, layout: str, m: int, n: int, k: int) -> str:
    return f"{kernel}/{layout}/{m}x{n}x{k}"


@dataclass
class Comparison:
    key: str
    old_ratio: float | None
    new_ratio: float | None
    tolerance: float
    status: str        # ok | regressed | improved | new | missing

    @property
    def change(self) -> float | None:
        if self.old_ratio and self.new_ratio is not None:
            return self.new_ratio / self.old_ratio - 1.0
        return None

    def message(self) -> str:
        old = f"{self.old_ratio:.3f}" if self.old_ratio is not None else "-"
        new = f"{self.new_ratio:.3f}" if self.new_ratio is not None else "-"
        ch = f" ({self.change:+.1%})" if self.change is not None else ""
        return (f"{self.key}: ratio to cuBLAS {old} (baseline) -> {new} (now){ch}; "
                f"allowed drop {self.tolerance:.0%}")


def new_entry(kernel: str, layout: str, m: int, n: int, k: int, ratio: float, tflops: float,
              cublas_tflops: float, **extra) -> dict:
    e = {"kernel": kernel, "layout": layout, "m": m, "n": n, "k": k, "ratio": round(ratio, 4),
         "tflops": round(tflops, 3), "cublas_tflops": round(cublas_tflops, 3),
         "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    e.update(extra)
    return e


def load_baseline(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise AsmError(f"no baseline file {path}",
                       hint="create it on this GPU with `asmgemm bench --save-baseline`") from None
    except json.JSONDecodeError as exc:
        raise AsmError(f"{path}:{exc.lineno}:{exc.colno}: error: invalid JSON in baseline: {exc.msg}") from None
    except OSError as exc:
        raise AsmError(f"cannot read baseline {path}: {exc.strerror}") from None
    if not isinstance(data, dict) or data.get("format") != BASELINE_FORMAT or not isinstance(data.get("entries"), dict):
        raise AsmError(f"{path} is not an asmgemm baseline (format {BASELINE_FORMAT} with 'entries')")
    for key, e in data["entries"].items():
        if not isinstance(e, dict) or not isinstance(e.get("ratio"), (int, float)) or not e["ratio"] > 0:
            raise AsmError(f"{path}: entry {key!r} has no positive 'ratio'")
    return data


def merge_baseline(old: dict | None, gpu_name: str, entries: dict[str, dict], meta: dict | None = None) -> dict:
    """Entries measured now replace the same keys; others are kept (a partial bench run does not
    erase the rest of the baseline)."""
    merged = dict(old["entries"]) if old else {}
    merged.update(entries)
    out = {"format": BASELINE_FORMAT, "gpu": gpu_name,
           "tolerance": (old or {}).get("tolerance", DEFAULT_TOLERANCE)}
    out.update(meta or {})
    out["entries"] = dict(sorted(merged.items()))
    return out


def baseline_update(folder: str | os.PathLike, gpu_name: str, entries: dict[str, dict],
                    meta: dict | None = None) -> tuple[Path, str]:
    """(the baseline file, its new text): the measured entries merged into the existing file, not
    written yet, so that a command can commit it together with its other outputs."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AsmError(f"cannot create the baseline folder {folder}: {exc.strerror}") from None
    path = folder / baseline_file_name(gpu_name)
    old = load_baseline(path) if path.exists() else None
    if old is not None and old.get("gpu") not in (None, gpu_name):
        raise AsmError(f"{path} belongs to GPU '{old.get('gpu')}', not '{gpu_name}'")
    return path, json.dumps(merge_baseline(old, gpu_name, entries, meta), indent=1) + "\n"


def save_baseline(folder: str | os.PathLike, gpu_name: str, entries: dict[str, dict],
                  meta: dict | None = None) -> Path:
    path, text = baseline_update(folder, gpu_name, entries, meta)
    write_atomic(path, text)
    return path


def compare(baseline: dict, measured: dict[str, float], tolerance: float | None = None) -> list[Comparison]:
    """Compare measured ratios {key: ratio} with a baseline. `tolerance` overrides the file's; an
    entry's own "tolerance" wins over both."""
    if tolerance is not None and not 0 <= tolerance < 1:
        raise AsmError(f"tolerance must be in [0, 1), got {tolerance}")
    file_tol = baseline.get("tolerance", DEFAULT_TOLERANCE) if tolerance is None else tolerance
    out: list[Comparison] = []
    for key, e in baseline["entries"].items():
        tol = float(e.get("tolerance", file_tol))
        new = measured.get(key)
        old = float(e["ratio"])
        if new is None:
            out.append(Comparison(key, old, None, tol, "missing"))
        elif new < old * (1.0 - tol):
            out.append(Comparison(key, old, new, tol, "regressed"))
        elif new > old * (1.0 + tol):
            out.append(Comparison(key, old, new, tol, "improved"))
        else:
            out.append(Comparison(key, old, new, tol, "ok"))
    for key in measured:
        if key not in baseline["entries"]:
            out.append(Comparison(key, None, measured[key], file_tol, "new"))
    return out


def regressions_report(comparisons: list[Comparison]) -> str:
    bad = [c for c in comparisons if c.status == "regressed"]
    if not bad:
        return ""
    lines = [f"{len(bad)} kernel/shape(s) lost ground against cuBLAS:"]
    lines += ["  " + c.message() for c in bad]
    return "\n".join(lines)
