"""One launch of a spec'd kernel, without the GPU: which -D parameters it is built with, the
argument tuple CuPy passes, and the grid. Pure Python (numpy scalars only), tested on the CPU.

Parameter precedence (`choose_params`): `params=` (-D overrides: the benchmark, the tuner, a
user's experiment), else the tuning cache's entry for this GPU, kernel, layout and shape bucket,
else the spec's size rule over the kernel's source defaults. The call-derived parameters (the
spec's `call_params`: transposes after the storage/operand-swap logic, 128-bit loads from
alignment) are always set from the call: a caller may turn 128-bit loads off, never on where they
would be misaligned.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..errors import AsmError
from ..kernel_spec import KernelSpec
from .build_cache import BuiltKernel
from .plan import LaunchPlan

MAX_GRID_Y = 65535
_SCALAR = {".u64": np.uint64, ".b64": np.uint64, ".s64": np.int64, ".u32": np.uint32, ".b32": np.uint32,
           ".s32": np.int32, ".f32": np.float32, ".f64": np.float64}


@functools.lru_cache(maxsize=None)
def _default_params(name: str, source: str) -> tuple[tuple[str, object], ...]:
    from ..pipeline import build_file
    result = build_file(source)
    return tuple((n, result.parameters[n]) for n in result.tunables if n in result.parameters)


def default_params(spec: KernelSpec) -> dict:
    """The kernel's tunable parameters (those with a `.tune` line) at their source defaults, e.g.
    {'THREADS': 256, 'BK': 8} for sgemm. Builds the kernel on the CPU once (no GPU, no ptxas)."""
    return dict(_default_params(spec.name, str(spec.source)))


def call_defines(spec: KernelSpec, plan_values: dict, chosen: dict | None = None) -> dict:
    """The spec's call-derived -D parameters for a launch. A `vec_*` value only ever lowers what
    `chosen` asks for (128-bit loads where the call allows them, off where a caller turned them off)."""
    chosen = chosen or {}
    out = {}
    for param, value in spec.call_params:
        v = int(plan_values[value])
        out[param] = min(int(chosen.get(param, 1)), v) if value.startswith("vec_") else v
    return out


def choose_params(spec: KernelSpec, plan: LaunchPlan, params: dict | None, tuned: dict | None,
                  sm_count: int) -> dict:
    """-D defines for this launch (see the module docstring for the precedence)."""
    chosen = default_params(spec)
    if params is not None:
        chosen.update(params)
    elif tuned:
        chosen.update(tuned)
    else:
        chosen.update(spec.size_rule(plan.m, plan.n, plan.k, sm_count))
    chosen.update(call_defines(spec, plan.call_values, chosen))
    chosen.update(spec.defines)       # what makes this kernel this kernel (e.g. BF16=1): never overridden
    return chosen


def grid(spec: KernelSpec, built: BuiltKernel, plan: LaunchPlan, sm_count: int = 1) -> tuple[int, int, int]:
    """The launch grid of the spec's grid kind (kernel_spec.GRIDS); `sm_count`: the device's SMs."""
    gx, gy = math.ceil(plan.n / built.tile_n), math.ceil(plan.m / built.tile_m)
    if spec.launch.grid == "tiles":
        if gy > MAX_GRID_Y:
            raise AsmError(f"M = {plan.m} needs {gy} block rows, more than the grid allows ({MAX_GRID_Y})")
        return gx, gy, 1
    if spec.launch.grid == "persistent":
        if gx * gy > 0xFFFFFFFF:
            raise AsmError(f"{plan.m} x {plan.n} is {gx * gy} tiles, more than the kernel counts in 32 bits")
        return max(1, min(gx * gy, sm_count)), 1, 1
    raise AsmError(f"unknown grid kind '{spec.launch.grid}'")


def pack_args(built: BuiltKernel, plan: LaunchPlan, alpha: float, beta: float, dtype: str = "") -> tuple:
    """The kernel's arguments in .param order, each as the numpy scalar of its PTX type (a tensor
    map: the 128-byte value runtime/tensor_map.py encodes)."""
    values = {"A": plan.a.ptr, "B": plan.b.ptr, "C": plan.c_ptr, "M": plan.m, "N": plan.n, "K": plan.k,
              "lda": plan.a.ld, "ldb": plan.b.ld, "ldc": plan.ldc, "alpha": alpha, "beta": beta}
    out = []
    for name, ptype in built.params:
        if name in ("tmap_a", "tmap_b"):
            out.append(operand_tensor_map(built, plan, name, dtype))
        else:
            out.append(_SCALAR[ptype](values[name]))
    return tuple(out)


def operand_tensor_map(built: BuiltKernel, plan: LaunchPlan, name: str, dtype: str):
    """The encoded TMA map of the kernel's A (tmap_a) or B (tmap_b): over the stored matrix, boxes
    as tall as the kernel's BOX_*_ROWS constant."""
    from .tensor_map import encode, tile_map
    op, rows = (plan.a, built.box_rows[0]) if name == "tmap_a" else (plan.b, built.box_rows[1])
    return encode(tile_map("A" if name == "tmap_a" else "B", op.ptr, dtype, op.rows, op.cols, op.ld, rows))
