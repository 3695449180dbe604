"""What bench/tune need to know about the GPU, with a clear error (never a traceback) when there is
none: CuPy missing, no CUDA driver, or no device."""
from __future__ import annotations

from ..errors import AsmError

GPU_HINT = ("run it on a machine with an NVIDIA GPU and CuPy (pip install 'asmgemm[gpu]'); "
            "`asmgemm tune --dry-run` builds and lists candidates without a GPU")


def require_gpu(what: str = "this command"):
    """Import CuPy and check that a CUDA device answers; return the cupy module."""
    try:
        import cupy
    except ImportError as exc:
        raise AsmError(f"{what} needs a GPU, but CuPy is not installed ({exc})", hint=GPU_HINT) from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver, no device, driver too old
        raise AsmError(f"{what} needs a GPU, but CUDA reports: {exc}", hint=GPU_HINT) from None
    if count < 1:
        raise AsmError(f"{what} needs a GPU, but CUDA found no device", hint=GPU_HINT)
    return cupy


def gpu_available() -> bool:
    try:
        require_gpu()
        return True
    except AsmError:
        return False


def gpu_name(device: int | None = None) -> str:
    """The device's marketing name as CUDA reports it, e.g. 'NVIDIA H100 80GB HBM3'."""
    cupy = require_gpu()
    dev = cupy.cuda.Device().id if device is None else device
    name = cupy.cuda.runtime.getDeviceProperties(dev)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def gpu_target(device: int | None = None) -> str:
    """sm_XY of the device, for ptxas."""
    cupy = require_gpu()
    dev = cupy.cuda.Device(device) if device is not None else cupy.cuda.Device()
    cc = dev.compute_capability  # e.g. '90'
    return f"sm_{cc}"
