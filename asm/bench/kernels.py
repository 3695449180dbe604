"""The kernels `asmgemm bench` and `asmgemm tune` can run on the GPU, and how: through the CuPy runtime
(`asmgemm.runtime.gemm.gemm`), which picks the kernel from the dtype. A new GEMM kernel becomes
benchable by adding a row here once the runtime dispatches to it."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

from ..errors import AsmError


@dataclass(frozen=True)
class BenchKernel:
    name: str          # shipped kernel name (kernels_ptx/<name>.sasm)
    dtype: str         # operand/result dtype the runtime dispatches on
    summary: str


BENCH_KERNELS: dict[str, BenchKernel] = {
    "sgemm": BenchKernel("sgemm", "float32", "fp32 SGEMM, maxas-style (kernels_ptx/sgemm.sasm)"),
}

# ‖out − ref‖ / ‖ref‖ against a float64 reference that a correct kernel stays under (METHOD.md:
# float32 lands far under 1e-3, TF32 near 3e-4; 1e-4 therefore also catches a silent TF32 path).
REL_ERR_LIMIT = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 2e-2}


def resolve_kernels(names: list[str]) -> list[BenchKernel]:
    if not names:
        return [BENCH_KERNELS["sgemm"]]
    out = []
    for n in names:
        n = n[:-5] if n.endswith(".sasm") else n
        if n not in BENCH_KERNELS:
            raise AsmError(f"'{n}' is not a kernel bench/tune can run on the GPU "
                           f"(runnable: {', '.join(BENCH_KERNELS)})",
                           hint="`asmgemm tune FILE --dry-run` works for any .sasm")
        out.append(BENCH_KERNELS[n])
    return list(dict.fromkeys(out))


def runtime_api():
    """(gemm, default_params) from the runtime, with a clear error while it is missing."""
    try:
        from ..runtime.gemm import default_params, gemm
    except ImportError as exc:
        raise AsmError(f"the CuPy runtime (asmgemm.runtime.gemm) is not available: {exc}") from None
    return gemm, default_params


def make_runner(kernel: BenchKernel) -> Callable:
    """run(a, b, c, trans_a, trans_b, params) for this kernel; passes kernel= when the runtime takes it."""
    gemm, _ = runtime_api()
    try:
        takes_kernel = "kernel" in inspect.signature(gemm).parameters
    except (TypeError, ValueError):
        takes_kernel = False

    def run(a, b, c, trans_a, trans_b, params):
        kw = {"kernel": kernel.name} if takes_kernel else {}
        return gemm(a, b, c, alpha=1.0, beta=0.0, trans_a=trans_a, trans_b=trans_b, params=params, **kw)

    return run


def kernel_default_params(kernel: BenchKernel) -> dict:
    _, default_params = runtime_api()
    try:
        return dict(default_params(kernel.name))
    except TypeError:
        return dict(default_params())


def call_defines(shape, layout: str, itemsize: int = 4) -> dict[str, str]:
    """The call-dependent -D values (TRANS_*, VEC_*) the runtime will set for a freshly allocated,
    contiguous problem of this shape and layout, so that `tune` builds exactly what then runs.
    Asks the runtime's own planner (pure Python) with stand-in arrays; CuPy allocations are
    256-byte aligned. Falls back to the transposes alone when the planner is not there."""
    from types import SimpleNamespace

    trans_a, trans_b = layout[0] == "t", layout[1] == "t"

    def matrix(rows, cols):
        return SimpleNamespace(shape=(rows, cols), ndim=2, strides=(cols * itemsize, itemsize),
                               dtype=SimpleNamespace(itemsize=itemsize))

    a = matrix(shape.k, shape.m) if trans_a else matrix(shape.m, shape.k)
    b = matrix(shape.n, shape.k) if trans_b else matrix(shape.k, shape.n)
    c = matrix(shape.m, shape.n)
    try:
        from ..runtime.plan import plan_launch
        plan = plan_launch(a, b, c, trans_a=trans_a, trans_b=trans_b, ptr_of=lambda x: 256)
        return {k: str(int(v)) for k, v in plan.defines.items()}
    except ImportError:
        return {"TRANS_A": str(int(trans_a)), "TRANS_B": str(int(trans_b))}
