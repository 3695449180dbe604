"""`asmgemm.gemm`: C = alpha * op(A) * op(B) + beta * C on GPU arrays, through the spec'd kernels.

The dtype picks the kernel: the first spec in kernels_ptx/kernels.toml (then $ASMGEMM_KERNEL_SPECS,
then `asmgemm.kernel_spec.register`) whose A, B and C dtype it is and that supports the device;
`kernel=` names one. runtime/launch.py chooses the -D parameters (params=, the tuning cache, the
spec's size rule), packs the arguments and sizes the grid; build_cache.py builds once.

A call goes: arrays -> (spec lookup -> plan -> build -> launch plan) -> launch. Everything in the
parentheses depends only on a key of the call (shapes, strides, dtype, 16-byte alignment of each
pointer, device, flags, params, kernel), so it is done once per key and kept (`_plans`); a repeated
call builds the key, finds its launch plan, fills in the pointers and scalars and launches.
A kept launch plan is used only while what it was made from is still current:
  * the kernel specs (kernel_spec.specs_version: registry and environment exactly, spec files'
    stamps at most every SPEC_RECHECK_S seconds), the CuPy module, and the tuning-cache choices
    of this process (forget_tuned_choices) -- each of these clears all launch plans;
  * its BuiltKernel is still what the build cache holds (build_cache.clear_memory_cache() after a
    kernel edit: the next call builds again) and its loaded function is still loaded.
Calls that copy operands first (TMA padding) or launch nothing (M, N or K zero) are not kept.
A split-K launch plan (runtime/split_k.py) keeps both kernels, the partial pass and the reduce;
only its workspace is allocated per call.

Arrays: CuPy arrays; PyTorch CUDA tensors (launched on torch's current stream, results as
tensors, no copies); any other object with __cuda_array_interface__ or __dlpack__ (viewed as a
CuPy array without a copy, launched on CuPy's current stream; a new C is a CuPy array).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

from ..errors import AsmError
from ..files import warn_cache
from ..isa.arch import arch_for
from ..kernel_spec import KernelSpec, get_spec, spec_for_dtype, specs_version
from . import build_cache, split_k
from .build_cache import BuiltKernel, build_kernel
from .gpu import device_facts, require_gpu
from .launch import ArgPacker, choose_params, grid
from .plan import LaunchPlan, plan_launch
from .tensor_map import ALIGN, addressable
from .tune_cache import lookup_tuned, lookups_disabled

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
    """Forget the tuning-cache answers remembered by this process (after `asmgemm tune` stored one),
    and the launch plans made with them."""
    _tuned.clear()
    clear_plan_cache()


def _build_for(spec: KernelSpec, plan: LaunchPlan, params: dict | None, tuned: dict | None, facts,
               target: str, launch_defines: dict | None = None) -> BuiltKernel:
    """The kernel built with the caller's params, else the tuning cache's choice, else the untuned
    choice. A tuning-cache entry the kernel refuses (an `.error`, an unknown parameter) costs one
    warning and falls back to the untuned choice; it is remembered, so no later call rebuilds it.
    The caller's own params= that fail raise."""
    if tuned:
        rejected = (spec.name, target, tuple(sorted((k, str(v)) for k, v in tuned.items())))
        if rejected not in _rejected:
            try:
                return build_kernel(spec, choose_params(spec, plan, None, tuned, facts.sm_count, launch_defines),
                                    target)
            except (AsmError, ValueError, TypeError) as exc:
                failure = exc
        else:
            failure = None
        built = build_kernel(spec, choose_params(spec, plan, None, None, facts.sm_count, launch_defines), target)
        if failure is not None:    # the untuned build works, so the entry was at fault
            _rejected.add(rejected)
            why = failure.message if isinstance(failure, AsmError) else str(failure)
            where = f"{failure.span.path}:{failure.span.line}: " if getattr(failure, "span", None) else ""
            shown = " ".join(f"{k}={v}" for k, v in tuned.items())
            warn_cache(f"asmgemm: the tuning cache entry for {spec.name} {plan.layout} {plan.m}x{plan.n}x{plan.k} "
                       f"({shown}) does not build ({where}{why.splitlines()[0] if why else 'error'}); "
                       "using the untuned choice", once=f"tuned:{rejected}")
        return built
    return build_kernel(spec, choose_params(spec, plan, params, None, facts.sm_count, launch_defines), target)


# CuPy has no bfloat16 dtype: bfloat16 data in CuPy arrays travels as its 16-bit patterns (uint16 or
# int16 arrays) to a kernel whose spec says bfloat16, named with kernel= (e.g. 'bgemm').
_BITS_OF = {"bfloat16": ("uint16", "int16")}


def _pick_spec(kernel: str | None, dtype: str, c_dtype: str | None, target: str) -> KernelSpec:
    """The spec for A/B of `dtype` and C of `c_dtype` (None: gemm allocates C; the kernel decides)."""
    spec = get_spec(kernel) if kernel else spec_for_dtype(dtype, target, c_dtype)
    d = spec.dtypes

    def takes(want: str, got: str) -> bool:
        return got == want or got in _BITS_OF.get(want, ())
    if not (d.a == d.b and takes(d.a, dtype) and (c_dtype is None or takes(d.c, c_dtype))):
        shown = dtype if c_dtype in (None, dtype) else f"{dtype} (A, B) and {c_dtype} (C)"
        raise AsmError(f"kernel '{spec.name}' takes A/B {d.a}, C {d.c}; the arrays are {shown}")
    return spec


# ---- arrays of several libraries ---------------------------------------------------------------
class _Dtype(NamedTuple):
    name: str
    itemsize: int


class _Matrix(NamedTuple):
    """What plan_launch reads of an operand, whichever library holds it (strides in bytes)."""

    shape: tuple
    strides: tuple
    dtype: _Dtype
    ptr: int
    device: int

    @property
    def ndim(self) -> int:
        return len(self.shape)


def _ptr_of(x: _Matrix) -> int:
    return x.ptr


class _CupyArrays:
    """CuPy arrays (and what was viewed as one): launched on CuPy's current stream."""

    def __init__(self, cupy):
        self.cupy = cupy

    @staticmethod
    def key(x) -> tuple:
        # Everything the launch plan depends on; of the pointer only its 16-byte alignment (the
        # 128-bit load and paired-store flags, TMA's rule), so new arrays of a shape reuse the plan.
        d = x.data
        return (x.shape, x.strides, x.dtype.char, d.ptr & 15, d.device_id)

    @staticmethod
    def ptr(x) -> int:
        return x.data.ptr

    @staticmethod
    def matrix(x, name: str) -> _Matrix:
        return _Matrix(tuple(x.shape), tuple(x.strides), _Dtype(str(x.dtype), int(x.dtype.itemsize)), int(x.data.ptr),
                       int(x.data.device_id))

    def empty(self, like, shape, dtype: str | None = None):
        return self.cupy.empty(shape, dtype=dtype or like.dtype)

    @staticmethod
    def stream(device: int):
        return None                     # CuPy's current stream: the launch leaves stream= out

    def padded_copy(self, x, elems: int):
        rows, cols = x.shape
        y = self.cupy.empty((rows, -(-cols // elems) * elems), dtype=x.dtype)[:, :cols]
        y[...] = x
        return y

    @staticmethod
    def zero(c) -> None:
        c.fill(0)


class _TorchArrays:
    """PyTorch CUDA tensors: read in place, launched on torch's current stream of their device (so
    the kernel is ordered after the work that wrote the inputs), a new C allocated by torch."""

    def __init__(self, cupy, torch):
        self.cupy, self.torch = cupy, torch
        self._streams: dict[tuple[int, int], object] = {}

    @staticmethod
    def key(x) -> tuple:
        return (x.shape, x.stride(), x.dtype, x.data_ptr() & 15, x.get_device())

    @staticmethod
    def ptr(x) -> int:
        return x.data_ptr()

    @staticmethod
    def matrix(x, name: str) -> _Matrix:
        device = x.get_device()
        if device < 0:
            raise AsmError(f"{name} is a torch tensor on '{x.device}'; asmgemm.gemm runs on CUDA tensors",
                           hint="move it with x.cuda() (or x.to('cuda'))")
        item = int(x.element_size())
        return _Matrix(tuple(x.shape), tuple(int(s) * item for s in x.stride()),
                       _Dtype(str(x.dtype).removeprefix("torch."), item), int(x.data_ptr()), int(device))

    def empty(self, like, shape, dtype: str | None = None):
        return self.torch.empty(shape, dtype=getattr(self.torch, dtype) if dtype else like.dtype, device=like.device)

    def stream(self, device: int):
        """torch's current stream on `device`, as the CuPy stream object the launch takes."""
        ptr = int(self.torch.cuda.current_stream(device).cuda_stream)
        hit = self._streams.get((ptr, device))
        if hit is None:
            if len(self._streams) >= 64:      # streams come and go: keep the wrappers bounded
                self._streams.clear()
            hit = self._streams[(ptr, device)] = self.cupy.cuda.ExternalStream(ptr, device)
        return hit

    def padded_copy(self, x, elems: int):
        rows, cols = x.shape
        y = self.torch.empty((rows, -(-cols // elems) * elems), dtype=x.dtype, device=x.device)[:, :cols]
        y.copy_(x)
        return y

    @staticmethod
    def zero(c) -> None:
        c.zero_()


_DLPACK_CUDA = (2, 13)          # DLDeviceType kDLCUDA, kDLCUDAManaged


def _as_cupy(cupy, x, name: str):
    """A CuPy view (no copy) of a GPU array of another library, through DLPack (which lets the
    producer order its stream before CuPy's current one) or __cuda_array_interface__."""
    if isinstance(x, cupy.ndarray):
        return x
    kind = type(x).__name__
    try:
        if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
            device_type = int(x.__dlpack_device__()[0])
            if device_type not in _DLPACK_CUDA:
                raise AsmError(f"{name} ({kind}) lives in host memory (DLPack device type {device_type}); "
                               "asmgemm.gemm takes GPU arrays", hint="copy it to the GPU first, e.g. cupy.asarray(x)")
            return cupy.from_dlpack(x)
        if hasattr(x, "__cuda_array_interface__"):
            return cupy.asarray(x)
    except AsmError:
        raise
    except Exception as exc:
        raise AsmError(f"{name} ({kind}) could not be viewed as a CuPy array: {type(exc).__name__}: {exc}") from None
    raise AsmError(f"{name} must be a GPU array (cupy.ndarray, a CUDA torch.Tensor, or an object with "
                   f"__cuda_array_interface__ or __dlpack__), got {kind}")


# ---- launch plans ------------------------------------------------------------------------------
class _LaunchPlan:
    """Everything a repeated call needs that does not change with the pointers and scalars."""

    __slots__ = ("built", "fn", "fn_key", "grid", "block", "smem", "packer", "swapped", "c_shape", "c_align",
                 "device", "c_dtype", "split")

    def __init__(self, built: BuiltKernel, fn, fn_key, grid_, packer: ArgPacker, swapped: bool, c_shape, c_align: int,
                 device: int, c_dtype: str | None = None, split: split_k.SplitLaunch | None = None):
        self.built, self.fn, self.fn_key = built, fn, fn_key
        self.grid, self.block, self.smem = grid_, (built.threads, 1, 1), built.smem_bytes
        self.packer, self.swapped = packer, swapped
        self.c_shape, self.c_align, self.device = c_shape, c_align, device
        self.c_dtype = c_dtype          # of a C gemm allocates; None: A's
        self.split = split              # split-K: the reduce launched after this kernel; None: no split

    def current(self) -> bool:
        """Still what planning afresh would give: the build cache still holds this very build and
        the function is still loaded (a rebuilt kernel or a reloaded module replaces them)."""
        s = self.split
        return (build_cache._memory.get(self.built.key) is self.built and _functions.get(self.fn_key) is self.fn
                and (s is None or build_cache._memory.get(s.built.key) is s.built and _functions.get(s.fn_key) is s.fn))

    def launch(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha, beta, stream, workspace_ptr: int = 0) -> None:
        """The kernel on the kernel's A, B and C at these addresses (split-K: the partial pass into
        the workspace at workspace_ptr, then the reduce into C)."""
        if self.split is not None:
            self.split.launch(self.fn, self.grid, self.block, self.smem, self.packer, a_ptr, b_ptr, c_ptr, alpha, beta,
                              stream, workspace_ptr)
            return
        args = self.packer.pack(a_ptr, b_ptr, c_ptr, alpha, beta)
        if stream is None:
            self.fn(self.grid, self.block, args, shared_mem=self.smem)
        else:
            self.fn(self.grid, self.block, args, shared_mem=self.smem, stream=stream)


MAX_PLANS = 4096                 # launch plans kept; the oldest goes first
_plans: dict[tuple, _LaunchPlan] = {}
_state: list = [None, None, None, None]      # [specs_version token, cupy module, _CupyArrays, _TorchArrays]


def clear_plan_cache() -> None:
    """Forget every launch plan (the next call of each key plans again)."""
    _plans.clear()


def _current_state(cupy):
    """The plan cache's state for this cupy module; every plan is dropped when the kernel specs
    changed since (specs_version) or the cupy module is another (a test's stand-in)."""
    token = specs_version()
    if token is not _state[0] or cupy is not _state[1]:
        _plans.clear()
        _state[:] = [token, cupy, _CupyArrays(cupy), None]
    return _state


def _options_key(params: dict | None, kernel: str | None):
    """The part of the key the caller's options make; None when params cannot be part of a key
    (unhashable values: such a call is planned afresh each time)."""
    if params is None:
        # the tuning cache is consulted only with lookups on (`asmgemm bench --defaults` turns them off)
        return (kernel, None, lookups_disabled())
    try:
        items = tuple(sorted(params.items()))
        hash(items)
    except TypeError:
        return None
    return (kernel, items, True)


def gemm(a, b, c=None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
         trans_b: bool = False, params: dict | None = None, kernel: str | None = None):
    """C = alpha * op(A) * op(B) + beta * C on the GPU; returns C.

    a, b: 2-D GPU arrays: CuPy arrays, PyTorch CUDA tensors, or any object with
    __cuda_array_interface__ or __dlpack__; never copied (except for TMA padding, below).
    op(X) = X.T when trans_x. Row-major, column-major (e.g. `.T` views) and strided views (a
    leading dimension larger than the row) are accepted; the last or the first dimension must be
    contiguous. c: M x N output, updated in place (row- or column-major); None allocates a new
    row-major C (then beta must be 0). beta == 0 never reads C.
    The result follows the inputs: torch tensors in, a torch tensor out, launched on
    torch.cuda.current_stream() of their device; otherwise CuPy's current stream, and a new C is a
    CuPy array (a given C is returned as passed). Torch tensors and other arrays do not mix in one call.
    params: -D overrides for the kernel (e.g. {'BK': 16, 'THREADS': 64}), bypassing tuned choices.
    For a kernel with split-K (sgemm), params['SPLIT_K'] is the number of K splits S (1: off; absent
    with params given: off); without params= small M x N with deep K is split by the spec's rule
    (runtime/split_k.py: an fp32 workspace of S x M x N from the arrays' allocator, then a
    deterministic reduce into C).
    kernel: a kernel spec's name (`asmgemm kernels`; default: chosen by dtype). bfloat16 kernels
    take torch bfloat16 tensors, or CuPy uint16/int16 arrays holding bfloat16 bit patterns.
    Operands TMA cannot read in place (Hopper kernels: rows not 16-byte aligned) are copied into
    padded storage first.
    Repeated calls with the same shapes, strides, dtype and options reuse their launch plan (the
    module docstring says when a plan is made again).
    Raises AsmError for unsupported dtypes, mismatched shapes, unsupported strides, or no GPU.
    """
    cupy = require_gpu("asmgemm.gemm")
    state = _state if cupy is _state[1] and specs_version() is _state[0] else _current_state(cupy)
    nd = cupy.ndarray
    if type(a) is nd and type(b) is nd and (c is None or type(c) is nd):
        return _gemm(cupy, state[2], a, b, c, alpha, beta, trans_a, trans_b, params, kernel)
    torch = sys.modules.get("torch")      # a torch tensor exists only once torch was imported
    is_torch = [torch is not None and isinstance(x, torch.Tensor) for x in (a, b, c)]
    if any(is_torch):
        if not all(t for t, x in zip(is_torch, (a, b, c)) if x is not None):
            kinds = [f"{n} is a {type(x).__module__}.{type(x).__name__}" for n, x in zip("ABC", (a, b, c))
                     if x is not None]
            raise AsmError("torch tensors cannot be mixed with other arrays in one call (" + ", ".join(kinds) + ")",
                           hint="pass all of them as torch tensors (torch.from_dlpack(x)) or all as CuPy arrays "
                                "(cupy.from_dlpack(t))")
        if state[3] is None or state[3].torch is not torch:
            state[3] = _TorchArrays(cupy, torch)
        return _gemm(cupy, state[3], a, b, c, alpha, beta, trans_a, trans_b, params, kernel)
    views = [_as_cupy(cupy, x, name) if x is not None else None for name, x in zip("ABC", (a, b, c))]
    out = _gemm(cupy, state[2], *views, alpha, beta, trans_a, trans_b, params, kernel)
    return c if c is not None else out


def _gemm(cupy, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel):
    """One call on arrays of one library (`arrays`: _CupyArrays or _TorchArrays): through the kept
    launch plan of its key, else planned afresh."""
    options = _options_key(params, kernel)
    key = None
    if options is not None:
        # C: its own key, or (when gemm allocates it) whether beta == 0, the one case that runs
        key = (arrays.key(a), arrays.key(b), arrays.key(c) if c is not None else beta == 0, trans_a, trans_b, options)
        plan = _plans.get(key)
        if plan is not None and plan.current():
            if cupy.cuda.runtime.getDevice() == plan.device:
                out = _launch_kept(arrays, plan, a, b, c, alpha, beta)
            else:
                with cupy.cuda.Device(plan.device):
                    out = _launch_kept(arrays, plan, a, b, c, alpha, beta)
            if out is not None:
                return out
            key = None          # a new C of another alignment than planned: plan this call alone
    return _plan_and_launch(cupy, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, key)


def _launch_kept(arrays, plan: _LaunchPlan, a, b, c, alpha, beta):
    """The launch through a kept plan, on the plan's device; None when gemm's own new C is not
    aligned as the plan assumed (allocators align far more, so this is a safeguard)."""
    if c is None:
        c = arrays.empty(a, plan.c_shape, plan.c_dtype)
        if arrays.ptr(c) & 15 != plan.c_align:
            return None
    a_ptr, b_ptr = arrays.ptr(a), arrays.ptr(b)
    if plan.swapped:                # column-major C: the kernel's A is the user's B
        a_ptr, b_ptr = b_ptr, a_ptr
    workspace = _workspace(arrays, a, plan)      # held until both split-K launches are queued
    plan.launch(a_ptr, b_ptr, arrays.ptr(c), alpha, beta, arrays.stream(plan.device),
                arrays.ptr(workspace) if workspace is not None else 0)
    return c


def _workspace(arrays, like, plan: _LaunchPlan):
    """Split-K's fp32 workspace (S x M x N) from the arrays' own allocator (CuPy's or torch's
    pool, so a per-call allocation is cheap and reused in stream order); None without a split."""
    if plan.split is None:
        return None
    return arrays.empty(like, plan.split.workspace_shape, "float32")


def _plan_and_launch(cupy, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, key):
    """The whole way: check the arrays, pick the spec, plan, build, load, launch; keep the launch
    plan under `key` (None: keep nothing)."""
    ma, mb = arrays.matrix(a, "A"), arrays.matrix(b, "B")
    mc = arrays.matrix(c, "C") if c is not None else None
    mats = (ma, mb) + ((mc,) if mc is not None else ())
    if ma.dtype.name != mb.dtype.name:
        raise AsmError(f"A and B must share one dtype, got {ma.dtype.name} and {mb.dtype.name}")
    dtype = ma.dtype.name
    c_dtype = mc.dtype.name if mc is not None else None
    if ma.ndim != 2 or mb.ndim != 2:
        raise AsmError(f"A and B must be 2-D matrices, got shapes {ma.shape} and {mb.shape}")
    if len({x.device for x in mats}) != 1:
        raise AsmError("A, B and C must be on the same GPU")
    # spec lookup -> plan -> build -> launch
    facts = device_facts(ma.device)
    spec = _pick_spec(kernel, dtype, c_dtype, facts.target)
    # a C gemm allocates: the kernel's C type when it differs from its A type (fp32 C of a 16-bit GEMM)
    new_c_dtype = spec.dtypes.c if spec.dtypes.c != spec.dtypes.a else None
    target = spec.build_target(facts.target)
    if target is None:
        raise AsmError(f"kernel '{spec.name}' is not built for {facts.target} ({facts.name}); "
                       f"its targets: {', '.join(spec.targets)}")
    m = ma.shape[1] if trans_a else ma.shape[0]
    n = mb.shape[0] if trans_b else mb.shape[1]
    with cupy.cuda.Device(ma.device):
        if c is None:
            if beta != 0:
                raise AsmError(f"beta = {beta} needs a C to scale; pass c= or beta=0")
            c = arrays.empty(a, (m, n), new_c_dtype)
            mc = arrays.matrix(c, "C")
        plan = plan_launch(ma, mb, mc, trans_a=trans_a, trans_b=trans_b, ptr_of=_ptr_of)
        copies = ()
        if _takes_tensor_maps(spec):
            plan, copies = _tma_ready(arrays, a, b, ma, mb, mc, plan, trans_a, trans_b)
        if plan.m == 0 or plan.n == 0:
            return c
        if plan.k == 0:
            if beta == 0:
                arrays.zero(c)
            else:
                c *= beta
            return c
        tuned = None if params is not None or lookups_disabled() else _lookup_tuned(facts.name, spec, plan)
        # split-K only on plain 2-D calls (this gemm() has no fused epilogue or batch yet: plain)
        split = split_k.choose_split(spec, plan, params, tuned, facts.sm_count, plain=True)
        built = _build_for(spec, plan, params, tuned, facts, target, split_k.switch_define(spec, split))
        static_smem = arch_for(target).limits.static_shared_per_block
        fn = _load(cupy, built, static_smem)
        if split is None:
            kept = _LaunchPlan(built, fn, (built.key, cupy.cuda.Device().id), grid(spec, built, plan, facts.sm_count),
                               ArgPacker(built, plan, spec.dtypes.a, spec.dtypes.c), plan.swapped, (m, n), mc.ptr & 15,
                               ma.device, new_c_dtype)
        else:
            kept = _split_plan(cupy, spec, built, fn, plan, split, target, static_smem, facts.sm_count, (m, n),
                               mc.ptr & 15, ma.device, new_c_dtype)
        workspace = _workspace(arrays, a, kept)
        kept.launch(plan.a.ptr, plan.b.ptr, plan.c_ptr, alpha, beta, arrays.stream(ma.device),
                    arrays.ptr(workspace) if workspace is not None else 0)
    # A plan made on padded copies holds their pointers' layout, not the caller's: not kept.
    if key is not None and not copies:
        if len(_plans) >= MAX_PLANS:
            del _plans[next(iter(_plans))]
        _plans[key] = kept
    return c


def _split_plan(cupy, spec: KernelSpec, built: BuiltKernel, fn, plan: LaunchPlan, split, target: str,
                static_smem: int, sm_count: int, c_shape, c_align: int, device: int, c_dtype) -> _LaunchPlan:
    """A launch plan of split-K: the partial pass (this build: grid z = S, C = a workspace slice of
    ld N, k_chunk and split_stride packed) and the reduce kernel into the call's C."""
    ws_plan = split_k.workspace_plan(plan)
    packer = ArgPacker(built, ws_plan, spec.dtypes.a, "float32", split_k.partial_values(split, plan))
    rspec = split_k.reduce_spec(spec)
    rbuilt = build_kernel(rspec, split_k.reduce_defines(spec, plan), target)
    rfn = _load(cupy, rbuilt, static_smem)
    dev = cupy.cuda.Device().id
    reduce = split_k.SplitLaunch(split, rbuilt, rfn, (rbuilt.key, dev), split_k.reduce_grid(rbuilt, plan),
                                 ArgPacker(rbuilt, plan, "float32", spec.dtypes.c, split_k.reduce_values(split, plan)),
                                 plan.m, plan.n)
    return _LaunchPlan(built, fn, (built.key, dev), split_k.partial_grid(grid(spec, built, plan, sm_count), split),
                       packer, plan.swapped, c_shape, c_align, device, c_dtype, reduce)


def _takes_tensor_maps(spec: KernelSpec) -> bool:
    return "tmap_a" in spec.abi or "tmap_b" in spec.abi


def _tma_ready(arrays, a, b, ma: _Matrix, mb: _Matrix, mc: _Matrix, plan: LaunchPlan, trans_a: bool,
               trans_b: bool) -> tuple[LaunchPlan, tuple]:
    """(plan, copies) with every operand TMA can read: one whose base or row stride is not a
    multiple of 16 bytes is copied into row-major storage with a padded leading dimension (the
    copy costs one pass over that operand; the alternative is TMA's refusal). `copies` keeps the
    copies alive until the launch is queued (their memory is then reused in stream order)."""
    def legal(op) -> bool:
        return addressable(op.ptr, op.rows, op.ld, ma.dtype.itemsize)
    if legal(plan.a) and legal(plan.b):
        return plan, ()
    user_a_is_kernel_a = not plan.swapped
    elems = ALIGN // ma.dtype.itemsize
    copies = []
    if not legal(plan.a if user_a_is_kernel_a else plan.b):
        a = arrays.padded_copy(a, elems)
        ma = arrays.matrix(a, "A")
        copies.append(a)
    if not legal(plan.b if user_a_is_kernel_a else plan.a):
        b = arrays.padded_copy(b, elems)
        mb = arrays.matrix(b, "B")
        copies.append(b)
    return plan_launch(ma, mb, mc, trans_a=trans_a, trans_b=trans_b, ptr_of=_ptr_of), tuple(copies)
