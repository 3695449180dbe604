"""The one GPU probe: import CuPy and check that a CUDA device answers, with a clear error (never a
traceback) when there is none; and the facts about a device the runtime keys on, asked once per
process."""
from __future__ import annotations

import dataclasses
import functools
import os
import sys
from dataclasses import dataclass

from ..errors import AsmError
from ..isa.arch import arch_for_compute_capability, target_number

GPU_HINT = ("run it on a machine with an NVIDIA GPU and CuPy (pip install 'asmgemm[gpu]'); "
            "`asmgemm tune --dry-run` builds and lists candidates without a GPU")

_verified: list = [None]      # the cupy module that last answered with a device


def require_gpu(what: str = "this command"):
    """The cupy module, once CuPy imports and CUDA reports at least one device; AsmError otherwise.
    Asked once per cupy module (gemm calls this per launch); a different module in sys.modules
    (a test's stand-in, or none) is asked afresh."""
    if sys.modules.get("cupy") is _verified[0] is not None:
        return _verified[0]
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
    _verified[0] = cupy
    return cupy


def gpu_available() -> bool:
    try:
        require_gpu()
        return True
    except AsmError:
        return False


@dataclass(frozen=True)
class DeviceFacts:
    id: int
    name: str            # 'NVIDIA H100 80GB HBM3': what the tuning cache and baselines key on
    target: str          # 'sm_90': what the kernels are built for
    sm_count: int
    clock_hz: float = 0.0           # the SMs' clock (0: unknown; a stand-in CuPy)
    dram_bytes_per_s: float = 0.0   # 2 x memory clock x bus width (DDR), the cost model's DRAM rate
    l2_bytes: int = 0               # the L2 cache (0: unknown): C beyond it is stored evict-first (C_STREAM)

    @property
    def dram_per_sm_cycle(self) -> int | None:
        """The size rules' DRAM_PER_SM_CYCLE (kernel_spec.DRAM_RATE_NAME): nominal DRAM bytes per SM
        and SM clock cycle, rounded down (H100 SXM 12, H200 18); None where either rate is unknown."""
        if self.dram_bytes_per_s <= 0 or self.clock_hz <= 0 or self.sm_count <= 0:
            return None
        return int(self.dram_bytes_per_s / (self.sm_count * self.clock_hz))


TARGET_ENV = "ASMGEMM_TARGET"


def device_facts(device_id: int | None = None) -> DeviceFacts:
    """Name, target and SM count of a device (the current one when None), asked once per process.
    $ASMGEMM_TARGET names an older target to build for instead of the device's own (sm_80 on an
    H100: what an A100 would run, e.g. the portable tensor-core kernel instead of the Hopper one)."""
    cupy = require_gpu()
    facts = _device_facts(cupy, cupy.cuda.Device().id if device_id is None else int(device_id))
    wanted = os.environ.get(TARGET_ENV)
    return facts if not wanted else _older_target(facts, wanted)


def _older_target(facts: DeviceFacts, wanted: str) -> DeviceFacts:
    """facts with target `wanted`, which the device must be able to run: the device's own target,
    or an older one without an architecture- or family-specific suffix."""
    try:
        number, suffix = target_number(wanted)
        have, _ = target_number(facts.target)
    except ValueError as exc:
        raise AsmError(f"${TARGET_ENV}: {exc}") from None
    if number > have or (suffix and number != have):
        raise AsmError(f"${TARGET_ENV}={wanted}: {facts.name} ({facts.target}) cannot run code built for it",
                       hint=f"name {facts.target} or an older target without a suffix (sm_80, sm_86, ...)")
    return dataclasses.replace(facts, target=wanted)


@functools.lru_cache(maxsize=None)
def _device_facts(cupy, device_id: int) -> DeviceFacts:
    # keyed on the module too: a test's stand-in CuPy never answers for the real one
    dev = cupy.cuda.Device(device_id)
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    name = name.decode() if isinstance(name, bytes) else str(name)
    target = arch_for_compute_capability(dev.compute_capability).name
    attrs = dev.attributes
    clock = float(attrs.get("ClockRate", 0)) * 1e3                  # kHz
    dram = 2.0 * float(attrs.get("MemoryClockRate", 0)) * 1e3 * float(attrs.get("GlobalMemoryBusWidth", 0)) / 8
    return DeviceFacts(dev.id, name, target, int(attrs["MultiProcessorCount"]), clock, dram,
                       int(attrs.get("L2CacheSize", 0)))


def on_device(cupy, device: int, fn, *args):
    """fn(*args) with `device` current: through CuPy's Device context only where another device is
    current (entering it costs host time a repeated call on the current device need not pay)."""
    if cupy.cuda.runtime.getDevice() == device:
        return fn(*args)
    with cupy.cuda.Device(device):
        return fn(*args)


def gpu_name(device_id: int | None = None) -> str:
    return device_facts(device_id).name


def function_handle(fn) -> int | None:
    """The driver's CUfunction handle of a function CuPy loaded (fn.kernel.ptr), for the driver
    calls CuPy does not wrap; None for a stand-in function or a null handle."""
    handle = getattr(getattr(fn, "kernel", None), "ptr", None)
    return handle if isinstance(handle, int) and handle else None
