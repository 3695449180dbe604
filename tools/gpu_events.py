"""What the device diagnostics (tools/moe_diag.py, tools/attention_diag.py, tools/call_gap_diag.py,
tools/skinny16_probe.py) share: torch where it is installed (None elsewhere, so their `--help`
works on a machine without it) and the check that stops them there, GPU time of a call between
CUDA events, and -D variants as given on their command lines."""
from __future__ import annotations

try:
    import torch
except ImportError:     # `--help` works without it; require_torch says what is missing
    torch = None


def require_torch(tool: str):
    """torch, or SystemExit saying `tool` needs it (after its arguments are parsed)."""
    if torch is None:
        raise SystemExit(f"{tool}: needs torch and a CUDA GPU (the device machine: source tools/device_setup.sh)")
    return torch


def gpu_ms(fn, reps: int = 7, warmup: int = 2) -> float:
    """Median GPU time of `reps` calls of fn, each between two CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def variant_params(base: dict, variant: str) -> dict:
    """base with a variant's overrides laid over it: 'NAME=V[,NAME=V]' (integers)."""
    out = dict(base)
    for item in variant.split(","):
        name, value = item.split("=")
        out[name.strip()] = int(value)
    return out
