"""`asmgemm.gemm`: C = alpha * op(A) * op(B) + beta * C on CuPy arrays, through the shipped .sasm kernels.

The dtype picks the kernel (float32 -> kernels_ptx/sgemm.sasm). Parameters, in order of precedence:
`params=` (-D overrides, for the benchmark and the tuner), else the tuning cache
(`asmgemm.bench.tune_cache.lookup_tuned`, when present), else the kernel's defaults with one size
rule (`size_rule`: the 64-thread 64x64 variant, with cp.async for the smallest problems, where
128x128 tiles would not fill the SMs; the 256x128 load-ahead variant, BK=16 for deep K, where its
tiles fill them; the 128x128 source default in between). The call-dependent parameters
(TRANS_A/TRANS_B after the storage/operand-swap logic, VEC_A/VEC_B from alignment) are always set
here: a caller may turn 128-bit loads off, never on where they would be misaligned.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

from ..errors import AsmError
from .build_cache import BuiltKernel, build_kernel
from .plan import LaunchPlan, plan_launch

# dtype name -> shipped kernel. Only fp32 exists so far.
KERNEL_FOR_DTYPE = {"float32": "sgemm"}
# Parameters the runtime derives from the call; `params=` cannot set these (VEC_* only downwards).
CALL_PARAMS = ("TRANS_A", "TRANS_B", "VEC_A", "VEC_B")
# The size rule, measured on the H100 with asmgemm bench against cuBLAS in the same runs
# (tools/SGEMM_NOTES.md "Small problems" and "Between the paths"; shapes in tools/data/):
#
# 1. At most half as many 128x128 tiles of C as SMs: the 64-thread 64x64-tile kernel (4x the
#    blocks) with BK=16 and cp.async. It beat plain THREADS=64 on all eight such shapes (1024^3
#    0.70x -> 0.94x cuBLAS, 512^3 0.39x -> 0.61x) and lost at 100 and 121 tiles (1280^3 0.87x vs
#    1.03x for THREADS=64 BK=16 without cp.async).
# 2. 256x128 tiles covering at least 15/16 of the SMs: the load-ahead kernel (16x8 per thread, the
#    next-but-one tile's loads held across the barrier), BK=16 for deep K (below). 4096^3, 8192^3,
#    2048^3 (128 tiles on 132 SMs), 3000x5000x700 and the T=4096 transformer projections run at
#    0.98-1.03x cuBLAS with it.
# 3. Fewer 128x128 tiles than SMs otherwise: the 64-thread kernel with BK=16 (1280^3 1.03x and
#    1408x1408x512 0.99x, vs 0.99x/0.91x for THREADS=64 BK=8).
# 4. Everything else: the source defaults (the 128x128 8x8 kernel). Measured there, the 64-thread
#    BK=16 kernel won at 512x6144x4096 (1.05x vs 0.80x) and 512x4608x3584 (0.90x vs 0.68x) but lost
#    at 2048^3 (0.82x vs 0.96x for 8x8 BK=16); not enough to move this branch (SGEMM_NOTES.md
#    "Between the paths"). `asmgemm tune` finds the better one per shape.
SMALL_ASYNC_VARIANT = {"THREADS": 64, "BK": 16, "ASYNC": 1}
LARGE_VARIANT = {"RQ": 4, "BK": 8, "LOAD_AHEAD": 1, "LDG_NC": 0}
LARGE_VARIANT_TILE = (256, 128)
SMALL_VARIANT = {"THREADS": 64, "BK": 16}
LARGE_TILE = 128
# ... with BK=16 (one barrier per 16 k-steps: ncu barrier stalls 0.14 -> 0.01 per issue at 4096^3)
# when K is a multiple of 16 and at least 2048: faster than BK=8 at 2048^3, 4096^3 and 8192^3, but
# 0.78x cuBLAS at 3000x5000x700 (K=700: a partial K tile, and the kernel's four unrolled
# 2048-FFMA tile bodies exceed the instruction cache; ncu no_instruction 0.07 even at 4096^3).
DEEP_K_VARIANT = {"BK": 16}
DEEP_K_MIN = 2048
MAX_GRID_Y = 65535
DEFAULT_SMEM_LIMIT = 48 * 1024   # above this a block needs cudaFuncAttributeMaxDynamicSharedMemorySize


_CUPY = []


def _cupy():
    if _CUPY:
        return _CUPY[0]
    try:
        import cupy
    except ImportError:
        raise AsmError("asmgemm.gemm needs CuPy, which is not installed",
                       hint="pip install 'asmgemm[gpu]' (cupy-cuda13x)") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver, no device
        raise AsmError(f"no usable CUDA GPU: {exc}") from None
    if count < 1:
        raise AsmError("no CUDA GPU found")
    _CUPY.append(cupy)
    return cupy


@functools.lru_cache(maxsize=None)
def default_params(kernel: str = "sgemm") -> dict:
    """The kernel's tunable parameters (those with a `.tune` line) at their source defaults, e.g.
    {'THREADS': 256, 'BK': 8} for sgemm. Call-dependent parameters (TRANS_*, VEC_*) are not listed.
    Builds the kernel on the CPU once (no GPU, no ptxas)."""
    from ..pipeline import build_file
    result = build_file(kernel)
    return {name: result.parameters[name] for name in result.tunables if name in result.parameters}


def _device_target(cupy) -> str:
    from ..isa.register_banks import SUPPORTED_TARGETS
    cc = cupy.cuda.Device().compute_capability      # e.g. '90'
    target = f"sm_{cc}"
    if target not in SUPPORTED_TARGETS:
        raise AsmError(f"GPU compute capability {cc} ({target}) is not a supported target "
                       f"(supported: {', '.join(SUPPORTED_TARGETS)})")
    return target


@functools.lru_cache(maxsize=None)
def _device_facts(device_id: int) -> tuple[str, str, int]:
    """(name, target, SM count) of a device, asked once per process."""
    import cupy
    with cupy.cuda.Device(device_id):
        return _gpu_name(cupy), _device_target(cupy), cupy.cuda.Device().attributes["MultiProcessorCount"]


def _gpu_name(cupy) -> str:
    dev = cupy.cuda.Device()
    try:
        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return f"cuda:{dev.id}"


_functions: dict[tuple[str, int], object] = {}
_modules: dict[tuple[str, int], object] = {}


def _load(cupy, built: BuiltKernel):
    """cupy.RawModule over the cubin (ptxas 13.0 matches the driver); the PTX if the driver refuses it."""
    dev = cupy.cuda.Device().id
    fn = _functions.get((built.key, dev))
    if fn is not None:
        return fn
    errors = []
    for path in (built.cubin_path, built.ptx_path):
        try:
            module = cupy.RawModule(path=path)
            fn = module.get_function(built.name)
            break
        except Exception as exc:
            errors.append(f"{Path(path).name}: {exc}")
    else:
        raise AsmError(f"the driver could not load kernel '{built.name}': " + "; ".join(errors))
    if built.smem_bytes > DEFAULT_SMEM_LIMIT:
        fn.max_dynamic_shared_size_bytes = built.smem_bytes
    _modules[(built.key, dev)] = module  # keep the module alive as long as its function
    _functions[(built.key, dev)] = fn
    return fn


def size_rule(m: int, n: int, k: int, sm_count: int) -> dict:
    """The untuned parameter overrides for an M x N x K problem (kernel-level, after the operand
    swap); {} keeps the kernel's source defaults."""
    tiles = math.ceil(m / LARGE_TILE) * math.ceil(n / LARGE_TILE)
    if 2 * tiles <= sm_count:
        return dict(SMALL_ASYNC_VARIANT)
    if tiles < sm_count:
        return dict(SMALL_VARIANT)
    large_blocks = math.ceil(m / LARGE_VARIANT_TILE[0]) * math.ceil(n / LARGE_VARIANT_TILE[1])
    if 16 * large_blocks >= 15 * sm_count:
        chosen = dict(LARGE_VARIANT)
        if k >= DEEP_K_MIN and k % DEEP_K_VARIANT["BK"] == 0:
            chosen.update(DEEP_K_VARIANT)
        return chosen
    return {}


def choose_params(kernel: str, plan: LaunchPlan, params: dict | None, tuned: dict | None, sm_count: int) -> dict:
    """-D defines for this launch (see the module docstring for the precedence)."""
    chosen = dict(default_params(kernel))
    if params is not None:
        chosen.update(params)
    elif tuned:
        chosen.update(tuned)
    else:
        chosen.update(size_rule(plan.m, plan.n, plan.k, sm_count))
    for name in ("TRANS_A", "TRANS_B"):
        chosen[name] = plan.defines[name]
    for name in ("VEC_A", "VEC_B"):
        chosen[name] = min(int(chosen.get(name, 1)), plan.defines[name])
    return chosen


_tuned: dict[tuple, dict | None] = {}


def _lookup_tuned(gpu_name: str, dtype: str, plan: LaunchPlan) -> dict | None:
    """The tuning cache's choice for this launch (kernel-level layout and M, N, K, i.e. after the
    operand swap), remembered per process; None when there is none or no tuning module."""
    key = (gpu_name, dtype, plan.layout, plan.m, plan.n, plan.k)
    if key in _tuned:
        return _tuned[key]
    try:
        from ..bench.tune_cache import lookup_tuned
    except ImportError:
        found = None
    else:
        try:
            found = lookup_tuned(gpu_name, dtype, plan.layout, plan.m, plan.n, plan.k)
        except Exception:  # the cache must never break gemm
            found = None
    _tuned[key] = found
    return found


def clear_caches() -> None:
    """Forget remembered tuning choices and built kernels (after a tune run, or a kernel edit)."""
    from .build_cache import clear_memory_cache
    _tuned.clear()
    clear_memory_cache()


def gemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
         trans_b: bool = False, params: dict | None = None, kernel: str | None = None):
    """C = alpha * op(A) * op(B) + beta * C on the current CuPy device; returns C.

    a, b: 2-D CuPy arrays; op(X) = X.T when trans_x. Row-major, column-major (e.g. `.T` views) and
    strided views (a leading dimension larger than the row) are accepted; the last or the first
    dimension must be contiguous. c: M x N output, updated in place (row- or column-major); None
    allocates a new row-major C (then beta must be 0). beta == 0 never reads C.
    params: -D overrides for the kernel (e.g. {'BK': 16, 'THREADS': 64}), bypassing tuned choices.
    kernel: force a shipped kernel name (default: chosen by dtype).
    Raises AsmError for unsupported dtypes, mismatched shapes, unsupported strides, or no GPU.
    """
    cupy = _cupy()
    for name, x in (("A", a), ("B", b)) + ((("C", c),) if c is not None else ()):
        if not isinstance(x, cupy.ndarray):
            raise AsmError(f"{name} must be a cupy.ndarray, got {type(x).__name__}")
    dtypes = {str(a.dtype), str(b.dtype)} | ({str(c.dtype)} if c is not None else set())
    if len(dtypes) != 1 or next(iter(dtypes)) not in KERNEL_FOR_DTYPE:
        raise AsmError(f"unsupported dtypes {sorted(dtypes)}: asmgemm.gemm supports "
                       + ", ".join(f"{d} ({k})" for d, k in KERNEL_FOR_DTYPE.items())
                       + " with A, B and C of the same dtype")
    dtype = next(iter(dtypes))
    kernel = kernel or KERNEL_FOR_DTYPE[dtype]
    if a.ndim != 2 or b.ndim != 2:
        raise AsmError(f"A and B must be 2-D matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    if c is None:
        if beta != 0:
            raise AsmError(f"beta = {beta} needs a C to scale; pass c= or beta=0")
        c = cupy.empty((m, n), dtype=dtype)
    if a.device.id != b.device.id or a.device.id != c.device.id:
        raise AsmError("A, B and C must be on the same GPU")
    with a.device:
        plan = plan_launch(a, b, c, trans_a=trans_a, trans_b=trans_b)
        if plan.m == 0 or plan.n == 0:
            return c
        if plan.k == 0:
            if beta == 0:
                c.fill(0)
            else:
                c *= beta
            return c
        gpu_name, target, sm_count = _device_facts(a.device.id)
        tuned = None if params is not None else _lookup_tuned(gpu_name, dtype, plan)
        defines = choose_params(kernel, plan, params, tuned, sm_count)
        built = build_kernel(kernel, defines, target)
        fn = _load(cupy, built)
        grid_x = math.ceil(plan.n / built.tile_n)
        grid_y = math.ceil(plan.m / built.tile_m)
        if grid_y > MAX_GRID_Y:
            raise AsmError(f"M = {plan.m} needs {grid_y} block rows, more than the grid allows ({MAX_GRID_Y})")
        import numpy as np
        args = (np.uint64(plan.a.ptr), np.uint64(plan.b.ptr), np.uint64(plan.c_ptr),
                np.uint32(plan.m), np.uint32(plan.n), np.uint32(plan.k),
                np.uint32(plan.a.ld), np.uint32(plan.b.ld), np.uint32(plan.ldc),
                np.float32(alpha), np.float32(beta))
        fn((grid_x, grid_y, 1), (built.threads, 1, 1), args, shared_mem=built.smem_bytes)
    return c
