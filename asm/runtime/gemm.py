"""`asmgemm.gemm`: C = act(alpha * op(A) * op(B) + beta * C + bias) on GPU arrays, through the
spec'd kernels (bias and act: the fused epilogue of kernels whose spec maps the call values
"bias" and "activation", e.g. sgemm).

The dtype picks the kernel: the first spec in kernels_ptx/kernels.toml (then $ASMGEMM_KERNEL_SPECS,
then `asmgemm.kernel_spec.register`) whose A, B and C dtype it is and that supports the device;
`kernel=` names one. A kernel family with a catalog ([[NAME.config]]: sgemm, the mma.sync
kernels) runs, for a call without params= and without the user's own tuning-cache entry, the
configuration dispatch.py chooses: the GPU's dispatch database's exact hit, else the cost model's
ranking (cost_model.py), the first whose build the kernel's guards accept; with
$ASMGEMM_AUTOTUNE=1 the model's best few are timed once per call key and the fastest runs. Other
families still follow their spec's rules ([[NAME.route]], size rules, split rules), on the
kernel's sizes after the operand swap and its call parameters. runtime/launch.py turns the choice
into -D parameters, packs the arguments and sizes the grid; build_cache.py builds once.

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
Calls that launch nothing (M, N or K zero) are not kept. A call whose operand TMA cannot read in
place keeps a plan made on the padded copy's layout (a copy of the same shape always has it) and
which of A and B to copy: a repeated call copies, then launches, without planning again.
A split-K launch plan (runtime/split_k.py) keeps both kernels, the partial pass and the reduce;
only its workspace is allocated per call.

Arrays: CuPy arrays; PyTorch CUDA tensors (launched on torch's current stream, results as
tensors, no copies); any other object with __cuda_array_interface__ or __dlpack__ (viewed as a
CuPy array without a copy, launched on CuPy's current stream; a new C is a CuPy array).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NamedTuple

from ..errors import AsmError
from ..files import warn_cache
from ..isa.arch import arch_for
from ..kernel_spec import ACTIVATIONS, KernelSpec, activation_code, get_spec, spec_for_dtype, specs_version
from . import build_cache, dispatch, overlap, path_model, split_k
from .build_cache import BuiltKernel, build_kernel
from .cluster_capacity import blocks_per_sm, max_active_clusters
from .gpu import device_facts, function_handle, require_gpu
from .launch import ArgPacker, ParamBlock, call_defines, choose_params, grid, launch_block, takes_c_trans
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
        pitch = -(-cols // elems) * elems
        y = self.cupy.empty((rows, pitch), dtype=x.dtype)[:, :cols]
        item = x.dtype.itemsize
        row_stride, col_stride = x.strides
        if rows and cols and col_stride == item and row_stride >= cols * item:
            # whole rows of elements: one 2-D copy on the current stream, which ran 2-3x the speed of
            # the elementwise kernel `y[...] = x` on the H100 (4099 x 509 halves: 12 against 28 us,
            # 4097 x 4097: 55 against 96, with a launch's ~9 us in each; tools/HGEMM_NOTES.md)
            runtime = self.cupy.cuda.runtime
            runtime.memcpy2DAsync(y.data.ptr, pitch * item, x.data.ptr, row_stride, cols * item, rows,
                                  runtime.memcpyDeviceToDevice, self.cupy.cuda.get_current_stream().ptr)
        else:
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
        # the current stream's handle without building a torch.cuda.Stream object on every call
        # (the handle query Triton and Inductor launch with); absent: the public call below
        self._raw_stream = getattr(getattr(torch, "_C", None), "_cuda_getCurrentRawStream", None)

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
        raw = self._raw_stream
        ptr = int(raw(device)) if raw is not None else int(self.torch.cuda.current_stream(device).cuda_stream)
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
                 "device", "c_dtype", "split", "spec_name", "c_trans", "cluster_splits", "copied", "a_ldg", "raw",
                 "current_stream", "alias", "config", "chosen_by")

    def __init__(self, built: BuiltKernel, fn, fn_key, grid_, packer: ArgPacker, swapped: bool, c_shape, c_align: int,
                 device: int, c_dtype: str | None = None, split: split_k.SplitLaunch | None = None,
                 spec_name: str | None = None, c_trans: bool = False, cluster_splits: int = 0):
        self.built, self.fn, self.fn_key = built, fn, fn_key
        self.cluster_splits = cluster_splits    # S of a split summed inside clusters (one launch); 0: none
        self.c_trans = c_trans          # the kernel stores C^T (the swap rule's launch)
        self.spec_name = spec_name or built.name    # the kernel spec that ran (after a route)
        self.grid, self.block, self.smem = grid_, (built.threads, 1, 1), built.smem_bytes
        self.packer, self.swapped = packer, swapped
        self.c_shape, self.c_align, self.device = c_shape, c_align, device
        self.c_dtype = c_dtype          # of a C gemm allocates; None: A's
        self.split = split              # split-K: the reduce launched after this kernel; None: no split
        # (the caller's A, B): the element size of an operand copied to padded rows first (TMA reads
        # only 16-byte aligned rows), as when the plan was made; 0: read in place
        self.copied = (0, 0)
        self.a_ldg = False              # the kernel reads its A by its own loads (call value a_ldg, A_LDG)
        # cuLaunchKernel over a kept parameter block (_raw_launcher), or None: CuPy's call of fn
        self.raw, self.current_stream = None, None
        # overlap.kept_bounds of a caller's C against A, B and the bias: where `c_ptr - x_ptr`
        # means the output shares memory with an input (all (0, 0) for a C gemm allocates)
        self.alias = (0, 0, 0, 0, 0, 0)
        self.config = None              # the catalog configuration that ran (dispatch.py), or None
        self.chosen_by = None           # "database", "model", "params", "tuning cache" or "size rules"

    def current(self) -> bool:
        """Still what planning afresh would give: the build cache still holds this very build and
        the function is still loaded (a rebuilt kernel or a reloaded module replaces them)."""
        s = self.split
        return (build_cache._memory.get(self.built.key) is self.built and _functions.get(self.fn_key) is self.fn
                and (s is None or build_cache._memory.get(s.built.key) is s.built and _functions.get(s.fn_key) is s.fn))

    def launch(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha, beta, stream, bias_ptr: int = 0,
               workspace_ptr: int = 0) -> None:
        """The kernel on the kernel's A, B and C (and the epilogue's bias) at these addresses
        (split-K: the partial pass into the workspace at workspace_ptr, then the reduce into C)."""
        _last_launch[0] = self
        raw = self.raw
        stream_ptr = 0 if raw is None else stream.ptr if stream is not None else self.current_stream().ptr
        if self.split is not None:
            self.split.launch(self.fn, self.grid, self.block, self.smem, self.packer, a_ptr, b_ptr, c_ptr, alpha, beta,
                              stream, workspace_ptr, raw, stream_ptr)
            return
        if raw is not None:
            launch_block(raw, self.grid, self.block, self.smem, stream_ptr, a_ptr, b_ptr, c_ptr, alpha, beta, bias_ptr)
            return
        args = self.packer.pack(a_ptr, b_ptr, c_ptr, alpha, beta, bias_ptr)
        if stream is None:
            self.fn(self.grid, self.block, args, shared_mem=self.smem)
        else:
            self.fn(self.grid, self.block, args, shared_mem=self.smem, stream=stream)


MAX_PLANS = 4096                 # launch plans kept; the oldest goes first
_last_launch: list = [None]      # the _LaunchPlan of this process's latest launch (last_launch())


def clear_last_launch() -> None:
    """Forget the latest launch (last_launch() answers None until the next one)."""
    _last_launch[0] = None


def last_launch() -> dict | None:
    """What this process's latest asmgemm.gemm launch ran (None before the first one): the kernel
    spec ("kernel", after its routes: e.g. sgemm_skinny for a decoding shape given to sgemm), the
    entry point, the grid and block, the block's tile of C (rows, columns), the cluster size, the
    K splits (1: none), where they were added ("reduce": "kernel", the reduce kernel after a
    workspace; "cluster", inside clusters of that many blocks, one launch; None without a split)
    and "c_trans" (the swap rule's launch: the kernel computed C^T and stored it transposed, its
    tile counted in C^T's rows and columns), "copies" (the caller's operands, "A" and/or "B", copied
    to padded rows first because TMA could not read them in place) and "a_ldg" (the kernel read
    its A by its own loads instead: call value a_ldg), "target" (what the kernel was built for) and
    "params" (the -D parameters of the build: the configuration that ran), "config" (its name in the
    family's catalog, e.g. 't128x128_k16/s4'; None where no catalog decided) and "chosen_by" (what
    decided: "database", "model", "params", "tuning cache" or "size rules"), "blocks_per_sm" and
    "clusters_at_once" (the driver's occupancy of the build; None where it cannot say). For reports such as `asmgemm bench`'s;
    calls from several threads at once each overwrite it."""
    kept = _last_launch[0]
    if kept is None:
        return None
    splits = kept.split.split.splits if kept.split is not None else max(1, kept.cluster_splits)
    return {"kernel": kept.spec_name, "entry": kept.built.name, "grid": tuple(kept.grid), "block": kept.block,
            "tile": (kept.built.tile_m, kept.built.tile_n),
            "cluster": kept.cluster_splits or kept.built.cluster, "splits": splits,
            "reduce": "kernel" if kept.split is not None else ("cluster" if kept.cluster_splits else None),
            "c_trans": kept.c_trans, "copies": tuple(name for name, size in zip("AB", kept.copied) if size),
            "a_ldg": kept.a_ldg, "target": kept.built.target, "params": build_cache.defines_of(kept.built),
            "config": kept.config, "chosen_by": kept.chosen_by,
            "blocks_per_sm": blocks_per_sm(kept.fn, kept.built, kept.device),
            "clusters_at_once": max_active_clusters(kept.fn, kept.built, kept.device, kept.cluster_splits)}
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
         trans_b: bool = False, bias=None, activation: str | None = None, params: dict | None = None,
         kernel: str | None = None):
    """C = act(alpha * op(A) * op(B) + beta * C + bias) on the GPU; returns C.

    a, b: 2-D GPU arrays: CuPy arrays, PyTorch CUDA tensors, or any object with
    __cuda_array_interface__ or __dlpack__; never copied (except for TMA padding, below).
    op(X) = X.T when trans_x. Row-major, column-major (e.g. `.T` views) and strided views (a
    leading dimension larger than the row) are accepted; the last or the first dimension must be
    contiguous. c: M x N output, updated in place (row- or column-major); None allocates a new
    row-major C (then beta must be 0). beta == 0 never reads C.
    Batches: A and B may be 3-D (batch, rows, cols); a batch of 1 or a 2-D operand is shared by
    every batch (torch.matmul's broadcast), trans_a/trans_b transpose the last two dimensions, and C
    is (batch, M, N). A batched call that is one 2-D GEMM (B shared, A not transposed, A's and C's
    batches contiguous row-major matrices one after the other: M' = batch * M) runs as that;
    otherwise a kernel with a batched mode (sgemm) runs the batch as grid z with per-operand batch
    strides (any layout of each batch, column-major C included), and other kernels raise AsmError.
    bias, activation: the fused epilogue, computed in fp32 before C is stored (kernels whose spec
    maps them, e.g. sgemm; others raise AsmError). bias: a GPU array of C's dtype (same library
    as A and B), shape (N,) or (1, N) for one value per column of C (torch.nn.Linear's bias) or
    (M, 1) for one per row, contiguous. activation: None, 'relu', 'gelu' (erf form), 'gelu_tanh'
    (PyTorch's approximate='tanh') or 'silu', with PyTorch's definitions.
    The result follows the inputs: torch tensors in, a torch tensor out, launched on
    torch.cuda.current_stream() of their device; otherwise CuPy's current stream, and a new C is a
    CuPy array (a given C is returned as passed). Torch tensors and other arrays do not mix in one call.
    params: -D overrides for the kernel (e.g. {'BK': 16, 'THREADS': 64}), bypassing tuned choices.
    kernel: a kernel spec's name (`asmgemm kernels`; default: chosen by dtype). bfloat16 kernels
    take torch bfloat16 tensors, or CuPy uint16/int16 arrays holding bfloat16 bit patterns.
    Operands TMA cannot read in place (Hopper kernels: rows not 16-byte aligned) are copied into
    padded storage first.
    Repeated calls with the same shapes, strides, dtype and options reuse their launch plan (the
    module docstring says when a plan is made again).
    For a kernel with split-K (sgemm), params['SPLIT_K'] is the number of K splits S (1: off; absent
    with params given: off); without params= small M x N with deep K is split by the spec's rule
    (runtime/split_k.py: an fp32 workspace of S x M x N from the arrays' allocator, then a
    deterministic reduce into C).
    Raises AsmError for unsupported dtypes, mismatched shapes, unsupported strides, or no GPU.
    """
    act = activation_code(activation)
    cupy = require_gpu("asmgemm.gemm")
    state = _state if cupy is _state[1] and specs_version() is _state[0] else _current_state(cupy)
    nd = cupy.ndarray
    if type(a) is nd and type(b) is nd and (c is None or type(c) is nd) and (bias is None or type(bias) is nd):
        return _gemm(cupy, state[2], a, b, c, alpha, beta, trans_a, trans_b, params, kernel, bias, act)
    torch = sys.modules.get("torch")      # a torch tensor exists only once torch was imported
    if torch is not None:
        # the repeated call on plain tensors, without the per-argument checks below (~3.5 us of
        # the ~18 us a call cost on the H100's host: tools/MMA_NOTES.md, "Host time")
        tensor = torch.Tensor
        if type(a) is tensor and type(b) is tensor and (c is None or type(c) is tensor) and (
                bias is None or type(bias) is tensor):
            return _gemm(cupy, _torch_arrays(state, cupy, torch), a, b, c, alpha, beta, trans_a, trans_b, params,
                         kernel, bias, act)
    names = ("A", "B", "C", "bias")
    arrays = (a, b, c, bias)
    is_torch = [torch is not None and isinstance(x, torch.Tensor) for x in arrays]
    if any(is_torch):
        if not all(t for t, x in zip(is_torch, arrays) if x is not None):
            kinds = [f"{n} is a {type(x).__module__}.{type(x).__name__}" for n, x in zip(names, arrays)
                     if x is not None]
            raise AsmError("torch tensors cannot be mixed with other arrays in one call (" + ", ".join(kinds) + ")",
                           hint="pass all of them as torch tensors (torch.from_dlpack(x)) or all as CuPy arrays "
                                "(cupy.from_dlpack(t))")
        return _gemm(cupy, _torch_arrays(state, cupy, torch), a, b, c, alpha, beta, trans_a, trans_b, params, kernel,
                     bias, act)
    a, b, c_view, bias = [_as_cupy(cupy, x, name) if x is not None else None for name, x in zip(names, arrays)]
    out = _gemm(cupy, state[2], a, b, c_view, alpha, beta, trans_a, trans_b, params, kernel, bias, act)
    return c if c is not None else out


def _torch_arrays(state: list, cupy, torch) -> "_TorchArrays":
    """The plan cache's _TorchArrays for this torch module (made on first use)."""
    if state[3] is None or state[3].torch is not torch:
        state[3] = _TorchArrays(cupy, torch)
    return state[3]


def _gemm(cupy, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, bias=None, act=0):
    """One call on arrays of one library (`arrays`: _CupyArrays or _TorchArrays): through the kept
    launch plan of its key, else planned afresh."""
    options = _options_key(params, kernel)
    key = None
    if options is not None:
        # C: its own key, or (when gemm allocates it) whether beta == 0, the one case that runs;
        # the bias: its layout, dtype and alignment (arrays.key), and the activation
        key = (arrays.key(a), arrays.key(b), arrays.key(c) if c is not None else beta == 0, trans_a, trans_b, options,
               arrays.key(bias) if bias is not None else None, act)
        plan = _plans.get(key)
        if plan is not None and plan.current():
            if cupy.cuda.runtime.getDevice() == plan.device:
                out = _launch_kept(arrays, plan, a, b, c, alpha, beta, bias)
            else:
                with cupy.cuda.Device(plan.device):
                    out = _launch_kept(arrays, plan, a, b, c, alpha, beta, bias)
            if out is not None:
                return out
            key = None          # a new C of another alignment than planned: plan this call alone
    return _plan_and_launch(cupy, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, key, bias, act)


def _check_alias(mc: _Matrix, ma: _Matrix, mb: _Matrix, mbias: _Matrix | None) -> tuple[int, ...]:
    """AsmError when the caller's C shares memory with A, B or the bias (runtime/overlap.py);
    else the bounds a kept plan tests a repeated call's pointers against."""
    def named(name, x):
        return None if x is None else (name, x.ptr, x.shape, x.strides, x.dtype.itemsize)
    overlap.check_output(named("C", mc), [named("A", ma), named("B", mb), named("bias", mbias)])
    return overlap.kept_bounds((mc.shape, mc.strides, mc.dtype.itemsize),
                               [None if x is None else (x.shape, x.strides, x.dtype.itemsize) for x in (ma, mb, mbias)])


def _launch_kept(arrays, plan: _LaunchPlan, a, b, c, alpha, beta, bias=None):
    """The launch through a kept plan, on the plan's device; None when gemm's own new C is not
    aligned as the plan assumed (allocators align far more, so this is a safeguard)."""
    given = c is not None
    if not given:
        c = arrays.empty(a, plan.c_shape, plan.c_dtype)
        if arrays.ptr(c) & 15 != plan.c_align:
            return None
    a_ptr, b_ptr, c_ptr = arrays.ptr(a), arrays.ptr(b), arrays.ptr(c)
    bias_ptr = arrays.ptr(bias) if bias is not None else 0
    if given:
        # the pointers are new on every call; the shapes and strides are the plan's (its key)
        lo_a, hi_a, lo_b, hi_b, lo_bias, hi_bias = plan.alias
        if (lo_a < c_ptr - a_ptr < hi_a or lo_b < c_ptr - b_ptr < hi_b
                or bias_ptr and lo_bias < c_ptr - bias_ptr < hi_bias):
            _check_alias(arrays.matrix(c, "C"), arrays.matrix(a, "A"), arrays.matrix(b, "B"),
                         arrays.matrix(bias, "bias") if bias is not None else None)
    copy_a, copy_b = plan.copied
    if copy_a or copy_b:                # held until the launch is queued (then reused in stream order)
        a = _padded(arrays, a, copy_a) if copy_a else a
        b = _padded(arrays, b, copy_b) if copy_b else b
        a_ptr, b_ptr = arrays.ptr(a), arrays.ptr(b)
    if plan.swapped:                # column-major C: the kernel's A is the user's B
        a_ptr, b_ptr = b_ptr, a_ptr
    workspace = _workspace(arrays, a, plan)      # held until both split-K launches are queued
    plan.launch(a_ptr, b_ptr, c_ptr, alpha, beta, arrays.stream(plan.device),
                bias_ptr, arrays.ptr(workspace) if workspace is not None else 0)
    return c


def _workspace(arrays, like, plan: _LaunchPlan):
    """Split-K's fp32 workspace (S x M x N) from the arrays' own allocator (CuPy's or torch's
    pool, so a per-call allocation is cheap and reused in stream order); None without a split."""
    if plan.split is None:
        return None
    return arrays.empty(like, plan.split.workspace_shape, "float32")


def _takes_call(spec: KernelSpec, bias, act: int, batch: int) -> bool:
    """Whether a catalog entry's kernel can take this call: its fused epilogue, and a batch (grid z)
    only where the kernel has a batched mode (sgemm_skinny has none)."""
    return not _missing_epilogue(spec, bias, act) and (batch == 1 or spec.call_value_param("batched") is not None)


def _missing_epilogue(spec: KernelSpec, bias, act: int) -> list[str]:
    """The call values of this call's fused epilogue ("bias", "activation") the kernel maps no
    parameter to."""
    wants = [what for what, on in (("bias", bias is not None), ("activation", act != 0)) if on]
    return [what for what in wants if spec.call_value_param(what) is None]


def _check_epilogue(spec: KernelSpec, bias, act: int) -> None:
    """AsmError unless the kernel has the fused epilogue this call asks for."""
    missing = _missing_epilogue(spec, bias, act)
    if missing:
        raise AsmError(f"kernel '{spec.name}' has no fused epilogue for {' and '.join(missing)} (its spec maps no "
                       f"parameter to the call value{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))})",
                       hint="apply the bias/activation in a separate pass, or pick a kernel with a fused epilogue "
                            "(sgemm for float32)")


def _routed(spec: KernelSpec, plan: LaunchPlan, sm_count: int, device_target: str, bias, act: int) -> KernelSpec:
    """The kernel the spec's routes ([[NAME.route]]) send this launch to, else `spec`. A route whose
    kernel lacks this call's fused epilogue or the device is not taken (the call stays with `spec`);
    one naming a kernel of other dtypes is a spec error."""
    name = spec.route_for(plan.m, plan.n, plan.k, sm_count, call_defines(spec, plan.call_values))
    if name is None:
        return spec
    return _other_kernel(spec, name, "routes to", bias, act, device_target) or spec


def _other_kernel(spec: KernelSpec, name: str, relation: str, bias, act: int, device_target: str) -> KernelSpec | None:
    """The kernel `spec` names (a route's, `in_place`) where it can take this call, else None: one
    lacking the call's fused epilogue or the device is not taken; one of other dtypes is a spec error."""
    other = get_spec(name)
    if other.dtypes != spec.dtypes:
        raise AsmError(f"kernel '{spec.name}' {relation} '{other.name}', whose dtypes differ "
                       f"({vars(other.dtypes)} against {vars(spec.dtypes)})", hint=f"see {spec.spec_file}")
    if _missing_epilogue(other, bias, act) or other.build_target(device_target) is None:
        return None
    return other


def _in_place_or(spec: KernelSpec, plan: LaunchPlan, itemsize: int, facts, bias, act: int) -> KernelSpec:
    """The spec's `in_place` kernel where this launch would copy an operand into padded storage
    for `spec` (TMA cannot read its rows) and the path model expects the in-place kernel to finish
    no later than the copy and `spec`; else `spec` (also where the in-place kernel lacks this
    call's fused epilogue or the device)."""
    copied = sum(op.rows * op.cols * itemsize for op in _unreadable(spec, plan, itemsize))
    if not copied:
        return spec
    other = _other_kernel(spec, spec.in_place, "names in_place", bias, act, facts.target)
    if other is None:
        return spec
    model = path_model.coefficients(facts.name, facts.sm_count)
    # the in-place kernel's tile for this call: its catalog's pick (or its size rule over the
    # source's 128 x 128, for a kernel without a catalog)
    if other.configs:
        pick = dispatch.choose(other, plan.layout, plan.m, plan.n, plan.k, call_values=plan.call_values, gpu=facts.name, target=facts.target,
                               sms=facts.sm_count, plain=False, clock_hz=facts.clock_hz,
                               dram_bytes_per_s=facts.dram_bytes_per_s).pick
        tile = pick.tile[:2] if pick is not None else (128, 128)
    else:
        chosen = other.size_rule(plan.m, plan.n, plan.k, facts.sm_count, call_defines(other, plan.call_values))
        tile = (int(chosen.get("BM", 128)), int(chosen.get("BN", 128)))
    return other if path_model.in_place_wins(plan.m, plan.n, plan.k, copied, model, tile) else spec


def _takes_c_trans(spec: KernelSpec, plan: LaunchPlan, params: dict | None, sm_count: int) -> bool:
    """Whether this 2-D launch with a row-major C runs as C^T with the kernel's transposed store:
    untuned, the spec's swap rules on the user's sizes (plan is not swapped yet); with params=, only
    where they name the kernel's c_trans parameter (e.g. {'C_T': 1, 'BN': 16, ...})."""
    if plan.swapped or plan.batch != 1:
        return False
    return takes_c_trans(spec, plan.m, plan.n, plan.k, sm_count, plan.call_values, params)


def _plan_and_launch(cupy, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, key, bias=None, act=0):
    """The whole way: check the arrays, pick the spec, plan, build, load, launch; keep the launch
    plan under `key` (None: keep nothing)."""
    ma, mb = arrays.matrix(a, "A"), arrays.matrix(b, "B")
    mc = arrays.matrix(c, "C") if c is not None else None
    mbias = arrays.matrix(bias, "bias") if bias is not None else None
    mats = (ma, mb) + ((mc,) if mc is not None else ()) + ((mbias,) if mbias is not None else ())
    alias = _check_alias(mc, ma, mb, mbias) if mc is not None else None
    if ma.dtype.name != mb.dtype.name:
        raise AsmError(f"A and B must share one dtype, got {ma.dtype.name} and {mb.dtype.name}")
    dtype = ma.dtype.name
    c_dtype = mc.dtype.name if mc is not None else None
    batch, batched, m, n = _batch_shape(ma, mb, trans_a, trans_b)
    if len({x.device for x in mats}) != 1:
        raise AsmError("A, B and C" + (" and the bias" if mbias is not None else "") + " must be on the same GPU")
    # spec lookup -> plan -> build -> launch
    facts = device_facts(ma.device)
    spec = _pick_spec(kernel, dtype, c_dtype, facts.target)
    _check_epilogue(spec, bias, act)
    # a C gemm allocates: the kernel's C type when it differs from its A type (fp32 C of a 16-bit GEMM)
    new_c_dtype = spec.dtypes.c if spec.dtypes.c != spec.dtypes.a else None
    target = spec.build_target(facts.target)
    if target is None:
        raise AsmError(f"kernel '{spec.name}' is not built for {facts.target} ({facts.name}); "
                       f"its targets: {', '.join(spec.targets)}")
    c_shape = (batch, m, n) if batched else (m, n)
    with cupy.cuda.Device(ma.device):
        if c is None:
            if beta != 0:
                raise AsmError(f"beta = {beta} needs a C to scale; pass c= or beta=0")
            c = arrays.empty(a, c_shape, new_c_dtype)
            mc = arrays.matrix(c, "C")
        kernel_batch, batch_strides = 1, (0, 0, 0)
        if batched:
            ma, mb, mc, kernel_batch, batch_strides = _fold_batch(spec, ma, mb, mc, batch, m, n, trans_a, mbias)
            if _takes_tensor_maps(spec) and not all(addressable(x.ptr, x.shape[0], x.strides[0] // x.dtype.itemsize,
                                                                x.dtype.itemsize) for x in (ma, mb)):
                # (the TMA padding copies 2-D operands only)
                raise AsmError(f"kernel '{spec.name}' reads A and B through TMA, which needs 16-byte aligned rows; "
                               "a batched call gets no padded copies", hint="pass operands whose rows are 16-byte aligned")
        plan = plan_launch(ma, mb, mc, trans_a=trans_a, trans_b=trans_b, ptr_of=_ptr_of, bias=mbias, activation=act,
                           batch=kernel_batch, batch_strides=batch_strides)
        if params is None and kernel_batch == 1 and spec.routes:
            # an untuned 2-D call: the spec may send this shape to another kernel (params= are
            # -D parameters of the kernel asked for, so they keep it)
            spec = _routed(spec, plan, facts.sm_count, facts.target, mbias, act)
            target = spec.build_target(facts.target)
        if params is None and kernel_batch == 1 and spec.in_place and _takes_tensor_maps(spec):
            # operands TMA cannot read: a padded copy, or the spec's in-place kernel (path_model); a
            # kernel named with kernel= is the family asked for, so this choice is still open (params=
            # pin one build, so they keep the kernel)
            spec = _in_place_or(spec, plan, ma.dtype.itemsize, facts, mbias, act)
            target = spec.build_target(facts.target)
        # the tuning cache's entry for the launch as called (an entry was timed unswapped: it keeps
        # the call off the swap rule's transposed store)
        tuned = None if params is not None or lookups_disabled() else _lookup_tuned(facts.name, spec, plan)
        # a family with a catalog: the dispatch database's exact hit or the cost model's ranking
        # (runtime/dispatch.py) decides, unless params= or the user's own tuning entry do
        choice = plan_ct = None
        if params is None and not tuned and spec.configs and min(plan.m, plan.n, plan.k) > 0:
            plain = mbias is None and act == 0 and kernel_batch == 1
            if kernel_batch == 1 and not plan.swapped and any(e.swap for e in spec.configs):
                # the catalog may run this call as C^T (a skinny kernel for few columns)
                plan_ct = plan_launch(ma, mb, mc, trans_a=trans_a, trans_b=trans_b, ptr_of=_ptr_of, bias=mbias,
                                      activation=act, c_trans=True)
            choice = dispatch.choose(spec, plan.layout, plan.m, plan.n, plan.k, call_values=plan.call_values, gpu=facts.name, target=facts.target,
                                     sms=facts.sm_count, plain=plain, clock_hz=facts.clock_hz,
                                     dram_bytes_per_s=facts.dram_bytes_per_s,
                                     usable=lambda name: _takes_call(get_spec(name), mbias, act, kernel_batch),
                                     swapped=(plan_ct.layout, plan_ct.call_values) if plan_ct is not None else None)
            if choice.chosen_by == "model" and not plan.swapped and os.environ.get(AUTOTUNE_ENV) == "1":
                _autotune(cupy, arrays, choice, a, b, c, trans_a, trans_b, bias, act, c_shape, new_c_dtype)
        if not tuned and _takes_c_trans(spec, plan, params, facts.sm_count):
            plan = plan_launch(ma, mb, mc, trans_a=trans_a, trans_b=trans_b, ptr_of=_ptr_of, bias=mbias,
                               activation=act, c_trans=True)
        held, copied = (), (0, 0)        # held: the padded copies, alive until the launch is queued
        if _takes_tensor_maps(spec):
            plan, held, copied = _tma_ready(arrays, spec, a, b, ma, mb, mc, plan, trans_a, trans_b, mbias, act)
        if plan.m == 0 or plan.n == 0:
            return c
        if plan.k == 0 and mbias is None and act == 0:
            # (with a fused epilogue the kernel runs: its K loop does nothing and the epilogue
            # still applies beta, the bias and the activation)
            if beta == 0:
                arrays.zero(c)
            else:
                c *= beta
            return c
        # split-K only on plain 2-D calls: no fused epilogue (the partial pass stores raw sums), no batch
        plain = mbias is None and act == 0 and kernel_batch == 1
        if choice is not None:
            spec, picked, split, in_cluster, built = _build_choice(choice, plan, facts, plain, plan_ct)
            target = built.target
            if picked.swap:
                plan = plan_ct
        else:
            picked = None
            split = split_k.choose_split(spec, plan, params, tuned, facts.sm_count, plain=plain)
            in_cluster = split_k.cluster_splits(spec, split, target, params if params is not None else tuned, plan,
                                                facts.sm_count)
            built = _build_for(spec, plan, params, tuned, facts, target,
                               split_k.switch_define(spec, split, in_cluster))
        static_smem = _static_smem_limit(target)
        fn = _load(cupy, built, static_smem)
        if split is None or in_cluster:
            # (a split in one cluster: one launch whose grid's z is S, no workspace, no reduce; its
            # k_chunk is the partial pass's, so both modes cut K at the same places)
            dev = cupy.cuda.Device().id
            kept = _LaunchPlan(built, fn, (built.key, dev),
                               grid(spec, built, plan, facts.sm_count, max(1, in_cluster),
                                    _cluster_capacity(spec, fn, built, dev)),
                               ArgPacker(built, plan, spec.dtypes.a, spec.dtypes.c,
                                         {"k_chunk": split.k_chunk} if in_cluster else None,
                                         a_map=not _loads_a_itself(spec, plan)), plan.swapped, c_shape,
                               mc.ptr & 15, ma.device, new_c_dtype, spec_name=spec.name, c_trans=plan.c_trans,
                               cluster_splits=in_cluster)
        else:
            kept = _split_plan(cupy, spec, built, fn, plan, split, target, static_smem, facts.sm_count, c_shape,
                               mc.ptr & 15, ma.device, new_c_dtype)
        kept.copied = copied
        kept.config = picked.label if picked is not None else None
        kept.chosen_by = (choice.chosen_by if choice is not None else
                          "params" if params is not None else "tuning cache" if tuned else "size rules")
        if alias is not None:
            kept.alias = alias
        kept.a_ldg = _loads_a_itself(spec, plan)
        _use_raw_launch(cupy, kept)
        workspace = _workspace(arrays, a, kept)
        kept.launch(plan.a.ptr, plan.b.ptr, plan.c_ptr, alpha, beta, arrays.stream(ma.device), plan.bias_ptr,
                    arrays.ptr(workspace) if workspace is not None else 0)
    if key is not None:
        if len(_plans) >= MAX_PLANS:
            del _plans[next(iter(_plans))]
        _plans[key] = kept
    return c


_ACTIVATION_NAMES = {i + 1: name for i, name in enumerate(ACTIVATIONS)}
AUTOTUNE_ENV = "ASMGEMM_AUTOTUNE"
AUTOTUNE_TOP = 4                 # the model's best few, timed once per call key
AUTOTUNE_REPS = 3
_autotuned: dict[str, str] = {}  # exact-hit key -> the label timed fastest in this process


def _autotune(cupy, arrays, choice: dispatch.Choice, a, b, c, trans_a, trans_b, bias, act, c_shape, c_dtype) -> None:
    """$ASMGEMM_AUTOTUNE=1: time the model's AUTOTUNE_TOP best candidates once for this call (into a
    scratch C, so the caller's C is untouched) and put the fastest first in `choice`; remembered
    per process under the call's key. A candidate that cannot run is skipped. (Triton's
    prune_configs_by: the model prunes, the clock decides.)"""
    label = _autotuned.get(choice.key)
    if label is None:
        scratch = arrays.empty(a, c_shape, c_dtype)
        times = {}
        for cand in choice.order[:AUTOTUNE_TOP]:
            run = (lambda cand=cand: gemm(a, b, scratch, trans_a=trans_a, trans_b=trans_b, bias=bias,
                                          activation=_ACTIVATION_NAMES.get(act), params=cand.params(),
                                          kernel=cand.kernel))
            try:
                run()
                stream = arrays.stream(arrays.matrix(a, "A").device)
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                best = float("inf")
                for _ in range(AUTOTUNE_REPS):
                    start.record(stream)
                    run()
                    end.record(stream)
                    end.synchronize()
                    best = min(best, cupy.cuda.get_elapsed_time(start, end))
                times[cand.label] = best
            except (AsmError, RuntimeError):
                continue
        if not times:
            return
        label = min(times, key=times.get)
        _autotuned[choice.key] = label
    found = [x for x in choice.order if x.label == label]
    if found:
        choice.order.remove(found[0])
        choice.order.insert(0, found[0])
        choice.chosen_by = "autotune"


def _build_choice(choice: dispatch.Choice, plan: LaunchPlan, facts, plain: bool, plan_ct: LaunchPlan | None = None):
    """(spec, candidate, split, cluster S, build) of the first candidate of `choice` whose build the
    kernel's guards accept (a swap candidate built for `plan_ct`, the C^T launch); a refusal is
    remembered per build, so it costs one expansion per process. Every candidate refused: the
    first refusal is the error."""
    first = None
    for cand in choice.order:
        cb = dispatch.candidate_build(cand, plan_ct if cand.swap else plan, facts.sm_count, facts.target, plain)
        why = dispatch.refusal(cb.key)
        if why is None:
            try:
                return cb.spec, cand, cb.split, cb.in_cluster, build_kernel(cb.spec, cb.defines, cb.target)
            except AsmError as exc:
                why = exc.message.splitlines()[0] if exc.message else "error"
                dispatch.refuse(cb.key, why)
                first = first or exc
        choice.refused[cand.label] = why
        if choice.chosen_by == "database" and cand is choice.order[0]:
            choice.chosen_by = "model"          # the exact hit's build is refused: the model's order runs
    if first is not None:
        raise first
    raise AsmError(f"kernel family '{choice.family}': no configuration of its catalog can run this call "
                   f"({len(choice.order)} candidates, every one refused: {'; '.join(choice.refused.values())})")


STATIC_SMEM_DEFAULT = 48 * 1024     # CUDA's static shared-memory limit per block, on every architecture so far


def _static_smem_limit(target: str) -> int:
    """The shared memory a block gets without raising its dynamic limit: the arch table's, or
    CUDA's 48 KB for a target asmgemm has no table for (sm_120: the portable kernels run there)."""
    arch = arch_for(target)
    return arch.limits.static_shared_per_block if arch.sm_limits is not None else STATIC_SMEM_DEFAULT


def _cluster_capacity(spec: KernelSpec, fn, built: BuiltKernel, device: int) -> int | None:
    """The clusters a persistent kernel's grid may hold (its clusters lie along x); None for the
    other grid kinds, whose grid follows the tiles."""
    return max_active_clusters(fn, built, device) if spec.launch.grid == "persistent" else None


def _raw_launcher(cupy, fn):
    """(cuLaunchKernel, the function's CUfunction handle) where this CuPy and its loaded function
    offer them, else None (a stand-in CuPy; ASMGEMM_RAW_LAUNCH=0). CuPy's own call of a RawKernel
    converts the argument tuple on every call: ~10 us of host time on the H100's host against
    ~3.5 us for cuLaunchKernel over kept argument bytes (tools/HGEMM_NOTES.md, "Host time")."""
    if os.environ.get("ASMGEMM_RAW_LAUNCH", "1") == "0":
        return None
    driver = getattr(getattr(cupy, "cuda", None), "driver", None)
    launch = getattr(driver, "launchKernel", None)
    handle = function_handle(fn)
    if launch is None or handle is None:
        return None
    return launch, handle


def _use_raw_launch(cupy, kept: _LaunchPlan) -> None:
    """Switch a new launch plan (and its split's reduce) to cuLaunchKernel where _raw_launcher
    allows it for every kernel it launches."""
    main = _raw_launcher(cupy, kept.fn)
    if main is None:
        return
    if kept.split is not None:
        reduce = _raw_launcher(cupy, kept.split.fn)
        if reduce is None:
            return
        kept.split.raw = (*reduce, ParamBlock(kept.split.packer, kept.split.built.params))
    kept.raw = (*main, ParamBlock(kept.packer, kept.built.params))
    kept.current_stream = cupy.cuda.get_current_stream


def _split_plan(cupy, spec: KernelSpec, built: BuiltKernel, fn, plan: LaunchPlan, split, target: str,
                static_smem: int, sm_count: int, c_shape, c_align: int, device: int, c_dtype) -> _LaunchPlan:
    """A launch plan of split-K: the partial pass (this build: grid z = S, C = a workspace slice of
    ld N, k_chunk and split_stride packed) and the reduce kernel into the call's C."""
    ws_plan = split_k.workspace_plan(plan)
    packer = ArgPacker(built, ws_plan, spec.dtypes.a, "float32", split_k.partial_values(split, plan), c_map=False,
                       a_map=not _loads_a_itself(spec, plan))
    rspec = split_k.reduce_spec(spec)
    rbuilt = build_kernel(rspec, split_k.reduce_defines(spec, plan), target)
    rfn = _load(cupy, rbuilt, static_smem)
    dev = cupy.cuda.Device().id
    reduce = split_k.SplitLaunch(split, rbuilt, rfn, (rbuilt.key, dev), split_k.reduce_grid(rbuilt, plan),
                                 ArgPacker(rbuilt, plan, "float32", spec.dtypes.c, split_k.reduce_values(split, plan)),
                                 plan.m, plan.n)
    return _LaunchPlan(built, fn, (built.key, dev),
                       grid(spec, built, plan, sm_count, split.splits, _cluster_capacity(spec, fn, built, dev)), packer,
                       plan.swapped, c_shape, c_align, device, c_dtype, reduce, spec_name=spec.name)


# ---- batches (3-D operands) ---------------------------------------------------------------------
def _batch_shape(ma: _Matrix, mb: _Matrix, trans_a: bool, trans_b: bool) -> tuple[int, bool, int, int]:
    """(batch, batched, M, N) of a call: A and B are matrices or batches (batch, rows, cols) of
    them; a batch of 1 or a 2-D operand is shared by every batch (torch.matmul's broadcast of one
    batch dimension); batched: whether C has the batch dimension (some operand is 3-D)."""
    if ma.ndim not in (2, 3) or mb.ndim not in (2, 3):
        raise AsmError(f"A and B must be 2-D matrices or 3-D batches (batch, rows, cols), got shapes {ma.shape} "
                       f"and {mb.shape}")
    ba = ma.shape[0] if ma.ndim == 3 else 1
    bb = mb.shape[0] if mb.ndim == 3 else 1
    if ba != bb and 1 not in (ba, bb):
        raise AsmError(f"batch sizes differ: A has {ba} matrices, B has {bb} (one of them may be 1, or 2-D, to be "
                       "shared by every batch)")
    rows_a, cols_a = ma.shape[-2:]
    rows_b, cols_b = mb.shape[-2:]
    return max(ba, bb), ma.ndim == 3 or mb.ndim == 3, (cols_a if trans_a else rows_a), (rows_b if trans_b else cols_b)


def _fold_batch(spec: KernelSpec, ma: _Matrix, mb: _Matrix, mc: _Matrix, batch: int, m: int, n: int, trans_a: bool,
                mbias: _Matrix | None) -> tuple[_Matrix, _Matrix, _Matrix, int, tuple]:
    """(A, B, C, kernel batch, batch strides) for a batched call. One 2-D GEMM where it is one,
    with no kernel change: the batches' matrices without the batch dimension when there is one
    batch; when B is shared and A's batches stack as rows (not transposed, rows contiguous, batch
    stride = M rows) and C's do too, C' = A' B with M' = batch * M. Otherwise a batched kernel
    (its spec maps the call value "batched"): the first batch's matrices, the batch, and the
    elements between batches of A, B and C (0: shared). No batched kernel: AsmError naming it."""
    if tuple(mc.shape) != (batch, m, n):
        raise AsmError(f"C has shape {tuple(mc.shape)}, expected ({batch}, {m}, {n}) = the batch of op(A) x op(B)")

    def matrix(x: _Matrix) -> _Matrix:            # one batch (or a 2-D operand): the matrix itself
        return x._replace(shape=tuple(x.shape[-2:]), strides=tuple(x.strides[-2:])) if x.ndim == 3 else x
    ba = ma.shape[0] if ma.ndim == 3 else 1
    bb = mb.shape[0] if mb.ndim == 3 else 1
    if batch <= 1 or (ba == 1 and bb == 1):
        return matrix(ma), matrix(mb), matrix(mc), 1, (0, 0, 0)

    def stacked_rows(x: _Matrix):
        """The row stride of x's batches read as one (batch * rows) x cols row-major matrix, or None."""
        _, rows, cols = x.shape
        s_batch, s_row, s_col = x.strides
        if cols > 1 and s_col != x.dtype.itemsize:
            return None
        if rows == 1:
            return s_batch
        return s_row if s_batch == rows * s_row else None
    why = None
    if bb != 1:
        why = "B has a matrix per batch"
    elif ba == 1:
        why = "A is shared but C is not"
    elif trans_a:
        why = "A is transposed, so its batches do not stack as rows"
    elif stacked_rows(ma) is None:
        why = "A's batches are not contiguous row-major matrices one after the other (batch stride = M rows)"
    elif stacked_rows(mc) is None:
        why = "C's batches are not contiguous row-major matrices one after the other (batch stride = M rows)"
    elif mbias is not None and tuple(mbias.shape) == (m, 1) and m > 1:
        why = "a per-row bias would have to repeat in every batch"
    if why is None:
        rows = batch * m
        return (ma._replace(shape=(rows, ma.shape[2]), strides=(stacked_rows(ma), ma.strides[2])), matrix(mb),
                mc._replace(shape=(rows, n), strides=(stacked_rows(mc), mc.strides[2])), 1, (0, 0, 0))
    if spec.call_value_param("batched") is None:
        raise AsmError(f"kernel '{spec.name}' has no batched mode, and this batched call is not one 2-D GEMM: {why}",
                       hint="share a 2-D B between contiguous row-major batches of A and C (one GEMM with batch*M "
                            "rows), or call gemm once per batch")

    def stride(x: _Matrix, name: str) -> int:
        """Elements from one batch of x to the next; 0 for a matrix every batch shares."""
        if x.ndim != 3 or x.shape[0] == 1:
            return 0
        s, item = x.strides[0], x.dtype.itemsize
        if s % item or s < 0 or (s == 0 and name == "C"):
            raise AsmError(f"{name}: a batch stride of {s} bytes is not supported (a non-negative whole number of "
                           f"{item}-byte elements{', and not 0 for C' if name == 'C' else ''})")
        return s // item
    return matrix(ma), matrix(mb), matrix(mc), batch, (stride(ma, "A"), stride(mb, "B"), stride(mc, "C"))


def _takes_tensor_maps(spec: KernelSpec) -> bool:
    return "tmap_a" in spec.abi or "tmap_b" in spec.abi


def _loads_a_itself(spec: KernelSpec, plan: LaunchPlan) -> bool:
    """Whether the kernel reads this launch's A by its own loads instead of TMA: the plan's call
    value a_ldg (rows TMA cannot address, K <= LDG_A_MAX_K) in a kernel whose spec maps it."""
    return bool(plan.call_values.get("a_ldg")) and spec.call_value_param("a_ldg") is not None


def _unreadable(spec: KernelSpec, plan: LaunchPlan, itemsize: int) -> list:
    """The kernel operands of this launch (plan.a, plan.b) that TMA cannot read in place (rows not
    16-byte addressable) and the kernel does not load itself (A_LDG): each needs a padded copy."""
    loads_a = _loads_a_itself(spec, plan)
    return [op for op in (plan.a, plan.b)
            if not (op is plan.a and loads_a) and not addressable(op.ptr, op.rows, op.ld, itemsize)]


def _padded(arrays, x, itemsize: int):
    """x copied into row-major storage whose rows start at multiples of 16 bytes (TMA's rule; its
    pitch: tensor_map.padded_pitch)."""
    return arrays.padded_copy(x, ALIGN // itemsize)


def _tma_ready(arrays, spec: KernelSpec, a, b, ma: _Matrix, mb: _Matrix, mc: _Matrix, plan: LaunchPlan,
               trans_a: bool, trans_b: bool, mbias: _Matrix | None = None, act: int = 0) -> tuple[LaunchPlan, tuple, tuple]:
    """(plan, copies, copied) with every operand TMA can read: one whose base or row stride is not
    a multiple of 16 bytes is copied into row-major storage with a padded leading dimension (the
    copy costs one pass over that operand; the alternative is TMA's refusal). `copies` keeps the
    copies alive until the launch is queued (their memory is then reused in stream order); copied:
    (the caller's A, B): the element size of one copied, 0 for one read in place, for the kept plan
    to copy again. A kernel that maps the call value a_ldg reads such an A itself where the plan
    says so (K-major, K <= LDG_A_MAX_K): no copy of it then."""
    unreadable = _unreadable(spec, plan, ma.dtype.itemsize)
    if not unreadable:
        return plan, (), (0, 0)
    user_a_is_kernel_a = not plan.swapped
    copies = []
    copy_a = any(op is (plan.a if user_a_is_kernel_a else plan.b) for op in unreadable)
    copy_b = any(op is (plan.b if user_a_is_kernel_a else plan.a) for op in unreadable)
    if copy_a:
        a = _padded(arrays, a, ma.dtype.itemsize)
        ma = arrays.matrix(a, "A")
        copies.append(a)
    if copy_b:
        b = _padded(arrays, b, mb.dtype.itemsize)
        mb = arrays.matrix(b, "B")
        copies.append(b)
    item = ma.dtype.itemsize
    return (plan_launch(ma, mb, mc, trans_a=trans_a, trans_b=trans_b, ptr_of=_ptr_of, bias=mbias, activation=act,
                        c_trans=plan.c_trans), tuple(copies), (item if copy_a else 0, item if copy_b else 0))
