"""`asmgemm.gemm`: C = alpha * op(A) * op(B) + beta * C on CuPy arrays, through the spec'd kernels.

The dtype picks the kernel: the first spec in kernels_ptx/kernels.toml (then $ASMGEMM_KERNEL_SPECS,
then `asmgemm.kernel_spec.register`) whose A, B and C dtype it is and that supports the device;
`kernel=` names one. runtime/launch.py chooses the -D parameters (params=, the tuning cache, the
spec's size rule), packs the arguments and sizes the grid; build_cache.py builds once.
"""
from __future__ import annotations

from pathlib import Path

from ..errors import AsmError
from ..files import warn_cache
from ..isa.arch import arch_for
from ..kernel_spec import KernelSpec, get_spec, spec_for_dtype
from .build_cache import BuiltKernel, build_kernel
from .gpu import device_facts, require_gpu
from .launch import choose_params, grid, pack_args
from .plan import LaunchPlan, plan_launch
from .tune_cache import lookup_tuned

_functions: dict[tuple[str, int], object] = {}
_modules: dict[tuple[str, int], object] = {}


def _load(cupy, built: BuiltKernel, static_smem_limit: int):
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
        except Exception as exc:  # CuPy's CUDADriverError: a cubin this driver cannot load
            errors.append(f"{Path(path).name}: {exc}")
    else:
        raise AsmError(f"the driver could not load kernel '{built.name}': " + "; ".join(errors))
    if built.smem_bytes > static_smem_limit:
        fn.max_dynamic_shared_size_bytes = built.smem_bytes
    _modules[(built.key, dev)] = module  # keep the module alive as long as its function
    _functions[(built.key, dev)] = fn
    return fn


_tuned: dict[tuple, dict | None] = {}
# (kernel, target, tuned parameters) the kernel refused to build: never tried again in this process
_rejected: set[tuple] = set()


def _lookup_tuned(gpu_name: str, spec: KernelSpec, plan: LaunchPlan) -> dict | None:
    """The tuning cache's choice for this launch (kernel-level layout and M, N, K, i.e. after the
    operand swap), remembered per process; None when there is none."""
    key = (gpu_name, spec.name, plan.layout, plan.m, plan.n, plan.k)
    if key not in _tuned:
        _tuned[key] = lookup_tuned(gpu_name, spec.name, plan.layout, plan.m, plan.n, plan.k)
    return _tuned[key]


def forget_tuned_choices() -> None:
    """Forget the tuning-cache answers remembered by this process (after `asmgemm tune` stored one)."""
    _tuned.clear()


def _build_for(spec: KernelSpec, plan: LaunchPlan, params: dict | None, tuned: dict | None, facts,
               target: str) -> BuiltKernel:
    """The kernel built with the caller's params, else the tuning cache's choice, else the untuned
    choice. A tuning-cache entry the kernel refuses (an `.error`, an unknown parameter) costs one
    warning and falls back to the untuned choice; it is remembered, so no later call rebuilds it.
    The caller's own params= that fail raise."""
    if tuned:
        rejected = (spec.name, target, tuple(sorted((k, str(v)) for k, v in tuned.items())))
        if rejected not in _rejected:
            try:
                return build_kernel(spec, choose_params(spec, plan, None, tuned, facts.sm_count), target)
            except (AsmError, ValueError, TypeError) as exc:
                failure = exc
        else:
            failure = None
        built = build_kernel(spec, choose_params(spec, plan, None, None, facts.sm_count), target)
        if failure is not None:    # the untuned build works, so the entry was at fault
            _rejected.add(rejected)
            why = failure.message if isinstance(failure, AsmError) else str(failure)
            where = f"{failure.span.path}:{failure.span.line}: " if getattr(failure, "span", None) else ""
            shown = " ".join(f"{k}={v}" for k, v in tuned.items())
            warn_cache(f"asmgemm: the tuning cache entry for {spec.name} {plan.layout} {plan.m}x{plan.n}x{plan.k} "
                       f"({shown}) does not build ({where}{why.splitlines()[0] if why else 'error'}); "
                       "using the untuned choice", once=f"tuned:{rejected}")
        return built
    return build_kernel(spec, choose_params(spec, plan, params, None, facts.sm_count), target)


# CuPy has no bfloat16 dtype: bfloat16 data in CuPy arrays travels as its 16-bit patterns (uint16 or
# int16 arrays) to a kernel whose spec says bfloat16, named with kernel= (e.g. 'bgemm').
_BITS_OF = {"bfloat16": ("uint16", "int16")}


def _pick_spec(kernel: str | None, dtype: str, target: str) -> KernelSpec:
    spec = get_spec(kernel) if kernel else spec_for_dtype(dtype, target)
    d = spec.dtypes
    if not (d.a == d.b == d.c == dtype or (d.a == d.b == d.c and dtype in _BITS_OF.get(d.a, ()))):
        raise AsmError(f"kernel '{spec.name}' takes A/B {d.a}, C {d.c}; the arrays are {dtype}")
    return spec


def gemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
         trans_b: bool = False, params: dict | None = None, kernel: str | None = None):
    """C = alpha * op(A) * op(B) + beta * C on the current CuPy device; returns C.

    a, b: 2-D CuPy arrays; op(X) = X.T when trans_x. Row-major, column-major (e.g. `.T` views) and
    strided views (a leading dimension larger than the row) are accepted; the last or the first
    dimension must be contiguous. c: M x N output, updated in place (row- or column-major); None
    allocates a new row-major C (then beta must be 0). beta == 0 never reads C.
    params: -D overrides for the kernel (e.g. {'BK': 16, 'THREADS': 64}), bypassing tuned choices.
    kernel: a kernel spec's name (`asmgemm kernels`; default: chosen by dtype). bfloat16 kernels
    take CuPy uint16/int16 arrays holding bfloat16 bit patterns (CuPy has no bfloat16 dtype).
    Operands TMA cannot read in place (Hopper kernels: rows not 16-byte aligned) are copied into
    padded storage first.
    Raises AsmError for unsupported dtypes, mismatched shapes, unsupported strides, or no GPU.
    """
    cupy = require_gpu("asmgemm.gemm")
    for name, x in (("A", a), ("B", b)) + ((("C", c),) if c is not None else ()):
        if not isinstance(x, cupy.ndarray):
            raise AsmError(f"{name} must be a cupy.ndarray, got {type(x).__name__}")
    dtypes = {str(a.dtype), str(b.dtype)} | ({str(c.dtype)} if c is not None else set())
    if len(dtypes) != 1:
        raise AsmError(f"A, B and C must share one dtype, got {sorted(dtypes)}")
    dtype = next(iter(dtypes))
    if a.ndim != 2 or b.ndim != 2:
        raise AsmError(f"A and B must be 2-D matrices, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    if a.device.id != b.device.id or (c is not None and a.device.id != c.device.id):
        raise AsmError("A, B and C must be on the same GPU")
    facts = device_facts(a.device.id)
    spec = _pick_spec(kernel, dtype, facts.target)
    target = spec.build_target(facts.target)
    if target is None:
        raise AsmError(f"kernel '{spec.name}' is not built for {facts.target} ({facts.name}); "
                       f"its targets: {', '.join(spec.targets)}")
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    if c is None:
        if beta != 0:
            raise AsmError(f"beta = {beta} needs a C to scale; pass c= or beta=0")
        with a.device:
            c = cupy.empty((m, n), dtype=dtype)
    with a.device:
        plan = plan_launch(a, b, c, trans_a=trans_a, trans_b=trans_b)
        if _takes_tensor_maps(spec):
            a, b, plan = _tma_ready(cupy, spec, a, b, c, plan, trans_a, trans_b)
        if plan.m == 0 or plan.n == 0:
            return c
        if plan.k == 0:
            if beta == 0:
                c.fill(0)
            else:
                c *= beta
            return c
        tuned = None if params is not None else _lookup_tuned(facts.name, spec, plan)
        built = _build_for(spec, plan, params, tuned, facts, target)
        fn = _load(cupy, built, arch_for(target).limits.static_shared_per_block)
        fn(grid(spec, built, plan, facts.sm_count), (built.threads, 1, 1), pack_args(built, plan, alpha, beta, spec.dtypes.a),
           shared_mem=built.smem_bytes)
    return c


def _takes_tensor_maps(spec: KernelSpec) -> bool:
    return "tmap_a" in spec.abi or "tmap_b" in spec.abi


def _tma_ready(cupy, spec: KernelSpec, a, b, c, plan: LaunchPlan, trans_a: bool, trans_b: bool):
    """(a, b, plan) with every operand TMA can read: one whose base or row stride is not a multiple
    of 16 bytes is copied into row-major storage with a padded leading dimension (the copy costs
    one pass over that operand; the alternative is TMA's refusal)."""
    from .tensor_map import ALIGN

    def legal(op) -> bool:
        return op.ptr % ALIGN == 0 and (op.rows == 1 or op.ld * plan.itemsize % ALIGN == 0)
    if legal(plan.a) and legal(plan.b):
        return a, b, plan
    user_a_is_kernel_a = not plan.swapped

    def padded(x):
        elems = ALIGN // plan.itemsize
        rows, cols = x.shape
        y = cupy.empty((rows, -(-cols // elems) * elems), dtype=x.dtype)[:, :cols]
        y[...] = x
        return y
    if not legal(plan.a if user_a_is_kernel_a else plan.b):
        a = padded(a)
    if not legal(plan.b if user_a_is_kernel_a else plan.a):
        b = padded(b)
    return a, b, plan_launch(a, b, c, trans_a=trans_a, trans_b=trans_b)
