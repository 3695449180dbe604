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

A call goes: arrays -> (spec lookup -> launch_config.configure -> kept_launch.make) -> launch.
Everything in the parentheses depends only on a key of the call (shapes, strides, dtype, 16-byte
alignment of each pointer, device, flags, params, kernel), so it is done once per key and kept
(plan_cache.py); a repeated call builds the key, finds its kept launch, fills in the pointers and
scalars and launches (`_launch_kept`, the one launch path, the first call's too). The call a loop
repeats (CuPy arrays or torch tensors, C given or allocated, no bias, activation or params) does
all of that in one function, `_repeat_call`, against what the last call that went the whole way
saw (the specs token, the environment read per call, the tuning cache's switch): where its kept
launch is one cuLaunchKernel it allocates C and launches itself, else it hands the kept launch to
`_launch_kept`; anything else it leaves to the whole way. The modules:
arrays.py (CuPy/torch adapters), launch_config.py (the pure decision: spec, problem, device ->
configuration), kept_launch.py (loading, grid, argument packing), plan_cache.py.
A kept launch plan is used only while what it was made from is still current:
  * the kernel specs (kernel_spec.specs_version: registry and environment exactly, spec files'
    stamps at most every SPEC_RECHECK_S seconds), the CuPy module, and the tuning-cache choices
    of this process (forget_tuned_choices) -- each of these clears all launch plans;
  * its BuiltKernel is still what the build cache holds (build_cache.clear_memory_cache() after a
    kernel edit: the next call builds again) and its loaded function is still loaded.
Calls that launch nothing (M, N or K zero) are not kept. A call whose operand TMA cannot read in
place keeps a plan made on the padded copy's layout (a copy of the same shape always has it) and
which of A and B to copy: a repeated call copies (one launch of pad_copy.py's kernel into storage
kept per stream, the same address every call, so the tensor map is not encoded again), then
launches, without planning again.
A split-K launch plan (runtime/split_k.py) keeps both kernels, the partial pass and the reduce
(or the one kernel that sums its own splits); its workspace and tile counters are kept per
(device, stream) and grown when a call needs more (runtime/split_scratch.py), so a repeated call
allocates nothing.

Arrays: CuPy arrays; PyTorch CUDA tensors (launched on torch's current stream, results as
tensors, no copies); any other object with __cuda_array_interface__ or __dlpack__ (viewed as a
CuPy array without a copy, launched on CuPy's current stream; a new C is a CuPy array).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import NamedTuple

from .. import kernel_spec
from ..environment import raw_values
from ..errors import AsmError
from ..kernel_spec import ACTIVATIONS, activation_code, specs_version
from . import dispatch, kept_launch, launch_config, overlap, split_scratch
from .arrays import Matrix, as_cupy, padded, padded_bytes
from .gpu import device_facts, on_device, require_gpu
from .kept_launch import KeptLaunch, clear_last_launch, last_launch  # noqa: F401  (re-exported: the facade)
from .launch_config import Problem
from .pad_copy import copy_padded_into
from .plan_cache import PlanCache
from .tune_cache import NO_TUNE_CACHE_ENV, lookups_disabled

_cache = PlanCache()             # the kept launches of this process, by call key


class _Unarmed:
    """No argument is of this type: the repeated call's path is off until a call arms it."""


class _RepeatState(NamedTuple):
    """What the repeated call (_repeat_call) trusts, taken by the last call that went the whole way
    on arrays of a library it knows (_arm_repeat): while none of it changed, a kept launch found
    under the call's key is what gemm's own checks would have found. One object, swapped whole, so
    that a call on another thread never reads half of one arming and half of another."""
    tensor: type                    # torch.Tensor, exactly (a subclass goes the whole way); _Unarmed: off
    ndarray: type                   # cupy.ndarray, exactly; _Unarmed: off
    cupy: object                    # the CuPy module the plans were loaded with
    torch_arrays: object            # the plan cache's TorchArrays (None: no torch call yet)
    cupy_arrays: object             # and its CupyArrays
    plans: dict                     # the plan cache's dict (emptied in place when plans are forgotten)
    lookups_off: bool               # _options_key's tuning-cache switch then
    token: tuple                    # kernel_spec.specs_version() the plans were made under
    environ: object                 # os.environ, its item dict, and the raw values of the variables read per call
    env_data: dict
    env_values: tuple
    get_device: object              # cupy.cuda.runtime.getDevice
    raw_stream: object              # torch's current raw stream of a device (None: no torch call yet)
    current_stream: object          # cupy.cuda.get_current_stream


_repeat = _RepeatState(_Unarmed, _Unarmed, None, None, None, {}, False, (), None, {}, (), None, None, None)
_monotonic = time.monotonic
_registry_counter = kernel_spec.registry_counter
_spec_memo = kernel_spec.version_memo


def _arm_repeat(cupy, torch, cache: PlanCache) -> None:
    """After a call that went the whole way on CuPy arrays or (torch given) torch tensors: the state
    _repeat_call checks against (the tuning cache's switch, the plan cache's dict and specs token,
    the environment read per call). Torch tensors only where torch offers its raw stream query;
    nothing where os.environ keeps no item dict."""
    global _repeat
    env = raw_values((kernel_spec.SPECS_ENV, NO_TUNE_CACHE_ENV))
    if env is None or cache.specs_token is None:
        _repeat = _repeat._replace(tensor=_Unarmed, ndarray=_Unarmed)
        return
    tensors = cache.torch(cupy, torch) if torch is not None else cache.torch_arrays
    raw = tensors.raw_stream if tensors is not None else None
    _repeat = _RepeatState(tensors.torch.Tensor if raw is not None else _Unarmed, cupy.ndarray, cupy, tensors,
                           cache.cupy_arrays, cache.plans, lookups_disabled(), cache.specs_token, *env,
                           cupy.cuda.runtime.getDevice, raw, cupy.cuda.get_current_stream)


def _repeat_call(r: _RepeatState, a, b, c, alpha, beta, trans_a, trans_b, kernel):
    """gemm(a, b, c, alpha=, beta=, trans_a=, trans_b=, kernel=) on CuPy arrays or torch tensors
    (one library, C given or allocated), no bias, activation or params: the call a loop repeats,
    in one function (each Python call and check on the way costs 0.1-0.6 us on the H200's host:
    docs/log/mma.md, "Host time: the repeated call in one function"). C, or None where the whole
    way must decide: a key not kept, anything the plans were made under changed (the specs token,
    which specs_version() would look at again now; its environment variable; the tuning cache's
    switch; CuPy), a caller's C that overlaps an operand, a new C not aligned as planned, or beta
    without a C. A kept launch with copies or a split goes through _launch_kept as on the whole
    way; one cuLaunchKernel goes here."""
    data = r.env_data
    for key, value in r.env_values:
        if data.get(key) is not value:
            return None
    memo, token = _spec_memo, r.token
    # specs_version()'s own test for returning its token without looking at the files
    if (memo[2] is not token or token[0] != _registry_counter[0]
            or _monotonic() - memo[0] >= kernel_spec.SPEC_RECHECK_S
            or os.environ is not r.environ or sys.modules.get("cupy") is not r.cupy):
        return None
    torch = type(a) is r.tensor
    if torch:
        pa, pb = a.data_ptr(), b.data_ptr()
        key_a, key_b = (a.shape, a.stride(), a.dtype, pa & 15, a.get_device()), (b.shape, b.stride(), b.dtype,
                                                                                 pb & 15, b.get_device())
    else:
        da, db = a.data, b.data
        pa, pb = da.ptr, db.ptr
        key_a, key_b = (a.shape, a.strides, a.dtype.char, pa & 15, da.device_id), (b.shape, b.strides, b.dtype.char,
                                                                                   pb & 15, db.device_id)
    if c is None:
        if beta != 0:
            return None             # (the whole way says why)
        key_c, pc = True, 0
    elif torch:
        pc = c.data_ptr()
        key_c = (c.shape, c.stride(), c.dtype, pc & 15, c.get_device())
    else:
        dc = c.data
        pc = dc.ptr
        key_c = (c.shape, c.strides, c.dtype.char, pc & 15, dc.device_id)
    try:
        kept = r.plans.get((key_a, key_b, key_c, trans_a, trans_b, (kernel, None, r.lookups_off), None, 0))
    except TypeError:
        return None                 # an unhashable option: the whole way says which
    if kept is None or not kept.current():
        return None
    if c is not None:
        lo_a, hi_a, lo_b, hi_b, _, _ = kept.alias
        if lo_a < pc - pa < hi_a or lo_b < pc - pb < hi_b:
            return None             # C shares memory with A or B: the whole way says how
    arrays = r.torch_arrays if torch else r.cupy_arrays
    direct = kept.direct
    if direct is None or r.get_device() != kept.device:
        try:
            return on_device(r.cupy, kept.device, _launch_kept, arrays, kept, a, b, c, alpha, beta, None, (pa, pb, pc))
        except (TypeError, ValueError):
            return None             # alpha or beta not a number (its packing failed): the whole way says which
    launch, handle, gx, gy, gz, bx, by, bz, smem, params, c_strides = direct
    if c is None:
        if torch:
            c = (a.new_empty_strided(kept.c_shape, c_strides) if kept.c_dtype is None
                 else arrays.empty(a, kept.c_shape, kept.c_dtype))
            pc = c.data_ptr()
        else:
            c = r.cupy.empty(kept.c_shape, dtype=kept.c_dtype or a.dtype)
            pc = c.data.ptr
        if pc & 15 != kept.c_align:
            return None
    if kept.swapped:                # column-major C (or the transposed store): the kernel's A is the user's B
        pa, pb = pb, pa
    stream = r.raw_stream(kept.device) if torch else r.current_stream().ptr
    with params.lock:
        try:
            params.write(pa, pb, pc, alpha, beta)
        except (TypeError, ValueError):
            return None             # alpha or beta not a number: the whole way says which
        launch(handle, gx, gy, gz, bx, by, bz, smem, stream, params.address, 0)
    kept_launch._last_launch[0] = kept
    return c


def clear_plan_cache() -> None:
    """Forget every kept launch (the next call of each key plans again)."""
    _cache.clear()


def forget_tuned_choices() -> None:
    """Forget the tuning-cache answers remembered by this process (after `asmgemm tune` stored one),
    and the launches kept with them."""
    launch_config.forget_tuned_lookups()
    clear_plan_cache()


_PLAIN_NUMBERS = (float, int)


def check_call_options(alpha, beta, trans_a, trans_b, params, kernel) -> None:
    """AsmError, saying which argument and what it takes, for options of the wrong kind (a list
    for trans_a, a string for alpha, a name that is not a str): without it such a call failed
    deep in the runtime with a TypeError, AttributeError or ValueError of Python's own."""
    for name, value in (("alpha", alpha), ("beta", beta)):
        try:
            float(value)
        except (TypeError, ValueError):
            raise AsmError(f"{name} takes a real number, got {value!r:.60} ({type(value).__name__})") from None
    for name, value in (("trans_a", trans_a), ("trans_b", trans_b)):
        try:
            hash(value)             # (it goes into the plan's key)
            ok = value in (False, True)
        except (TypeError, ValueError):     # unhashable, or an array whose truth is ambiguous
            ok = False
        if not ok:
            raise AsmError(f"{name} takes True or False, got {value!r:.60} ({type(value).__name__})")
    if params is not None and not isinstance(params, Mapping):
        raise AsmError(f"params takes a dict of -D values, got {params!r:.60} ({type(params).__name__})",
                       hint="e.g. params={'BK': 16, 'THREADS': 64} (`asmgemm kernels` lists each kernel's parameters)")
    if kernel is not None and not isinstance(kernel, str):
        raise AsmError(f"kernel takes a kernel spec's name, got {kernel!r:.60} ({type(kernel).__name__})",
                       hint="`asmgemm kernels` lists them, e.g. kernel='sgemm'")


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
    (runtime/split_k.py: an fp32 workspace of S x M x N, kept per stream, then a deterministic
    reduce into C: by the reduce kernel, or by the GEMM's own last block of each tile where the
    kernel has that mode, params['SPLIT_FIXUP'] = 0 forcing the reduce kernel there).
    Raises AsmError for unsupported dtypes, mismatched shapes, unsupported strides, options of the
    wrong kind (alpha/beta not numbers, trans_a/trans_b not True or False, params not a dict, kernel
    not a name), or no GPU.
    """
    r = _repeat
    if ((type(a) is r.tensor or type(a) is r.ndarray) and type(b) is type(a) and (c is None or type(c) is type(a))
            and bias is None and activation is None and params is None):
        out = _repeat_call(r, a, b, c, alpha, beta, trans_a, trans_b, kernel)
        if out is not None:
            return out
    act = activation_code(activation)
    if not (type(alpha) in _PLAIN_NUMBERS and type(beta) in _PLAIN_NUMBERS and type(trans_a) is bool
            and type(trans_b) is bool and (params is None or type(params) is dict)
            and (kernel is None or type(kernel) is str)):
        check_call_options(alpha, beta, trans_a, trans_b, params, kernel)      # the rest, looked at closely
    cupy = require_gpu("asmgemm.gemm")
    cache = _cache if cupy is _cache.cupy and specs_version() is _cache.specs_token else _cache.current(cupy)
    nd = cupy.ndarray
    if type(a) is nd and type(b) is nd and (c is None or type(c) is nd) and (bias is None or type(bias) is nd):
        out = _gemm(cupy, cache, cache.cupy_arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, bias, act)
        if bias is None and act == 0 and params is None:
            _arm_repeat(cupy, None, cache)
        return out
    torch = sys.modules.get("torch")      # a torch tensor exists only once torch was imported
    if torch is not None:
        # the repeated call on plain tensors, without the per-argument checks below (~3.5 us of
        # the ~18 us a call cost on the H100's host: docs/log/mma.md, "Host time")
        tensor = torch.Tensor
        if type(a) is tensor and type(b) is tensor and (c is None or type(c) is tensor) and (
                bias is None or type(bias) is tensor):
            out = _gemm(cupy, cache, cache.torch(cupy, torch), a, b, c, alpha, beta, trans_a, trans_b, params,
                        kernel, bias, act)
            if bias is None and act == 0 and params is None:
                _arm_repeat(cupy, torch, cache)
            return out
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
        return _gemm(cupy, cache, cache.torch(cupy, torch), a, b, c, alpha, beta, trans_a, trans_b, params, kernel,
                     bias, act)
    a, b, c_view, bias = [as_cupy(cupy, x, name) if x is not None else None for name, x in zip(names, arrays)]
    out = _gemm(cupy, cache, cache.cupy_arrays, a, b, c_view, alpha, beta, trans_a, trans_b, params, kernel, bias,
                act)
    return c if c is not None else out


def _gemm(cupy, cache: PlanCache, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, bias=None, act=0):
    """One call on arrays of one library (`arrays`: CupyArrays or TorchArrays): through the kept
    launch of its key, else planned afresh (and kept under that key)."""
    options = _options_key(params, kernel)
    key = None
    if options is not None:
        # C: its own key, or (when gemm allocates it) whether beta == 0, the one case that runs;
        # the bias: its layout, dtype and alignment (arrays.key), and the activation
        (key_a, a_ptr), (key_b, b_ptr) = arrays.key_ptr(a), arrays.key_ptr(b)
        key_c, c_ptr = arrays.key_ptr(c) if c is not None else (beta == 0, 0)
        key = (key_a, key_b, key_c, trans_a, trans_b, options, arrays.key(bias) if bias is not None else None, act)
        kept = cache.get(key)
        if kept is not None and kept.current():
            out = on_device(cupy, kept.device, _launch_kept, arrays, kept, a, b, c, alpha, beta, bias,
                            (a_ptr, b_ptr, c_ptr))
            if out is not None:
                return out
            key = None          # a new C of another alignment than planned: plan this call alone
    return _plan_and_launch(cupy, cache, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, key, bias,
                            act)


def _check_alias(mc: Matrix, ma: Matrix, mb: Matrix, mbias: Matrix | None) -> tuple[int, ...]:
    """AsmError when the caller's C shares memory with A, B or the bias (runtime/overlap.py);
    else the bounds a kept plan tests a repeated call's pointers against."""
    overlap.check_output(overlap.described("C", mc), [overlap.described("A", ma), overlap.described("B", mb),
                                                      overlap.described("bias", mbias)])
    return overlap.kept_bounds((mc.shape, mc.strides, mc.dtype.itemsize),
                               [None if x is None else (x.shape, x.strides, x.dtype.itemsize) for x in (ma, mb, mbias)])


def _launch_kept(arrays, plan: KeptLaunch, a, b, c, alpha, beta, bias=None, ptrs: tuple | None = None):
    """The launch through a kept plan, on the plan's device; None when gemm's own new C is not
    aligned as the plan assumed (allocators align far more, so this is a safeguard). ptrs: the
    (A, B, C) pointers the caller already read (C's: 0 when gemm allocates it), or None."""
    given = c is not None
    a_ptr, b_ptr, c_ptr = ptrs if ptrs is not None else (arrays.ptr(a), arrays.ptr(b), arrays.ptr(c) if given else 0)
    if not given:
        c = arrays.empty(a, plan.c_shape, plan.c_dtype)
        c_ptr = arrays.ptr(c)
        if c_ptr & 15 != plan.c_align:
            return None
    bias_ptr = arrays.ptr(bias) if bias is not None else 0
    if given:
        # the pointers are new on every call; the shapes and strides are the plan's (its key)
        lo_a, hi_a, lo_b, hi_b, lo_bias, hi_bias = plan.alias
        if (lo_a < c_ptr - a_ptr < hi_a or lo_b < c_ptr - b_ptr < hi_b
                or bias_ptr and lo_bias < c_ptr - bias_ptr < hi_bias):
            _check_alias(arrays.matrix(c, "C"), arrays.matrix(a, "A"), arrays.matrix(b, "B"),
                         arrays.matrix(bias, "bias") if bias is not None else None)
    copy_a, copy_b = plan.copied
    stream = arrays.stream(plan.device)
    workspace_elems, counters = plan.scratch_needs()
    if not (copy_a or copy_b or workspace_elems):
        if plan.swapped:            # column-major C: the kernel's A is the user's B
            a_ptr, b_ptr = b_ptr, a_ptr
        plan.launch(a_ptr, b_ptr, c_ptr, alpha, beta, stream, bias_ptr)
        return c
    # the stream's kept scratch: padded copies of operands TMA cannot read, split-K's workspace
    cupy = arrays.cupy
    stream_ptr = stream.ptr if stream is not None else cupy.cuda.get_current_stream().ptr
    capturing = split_scratch.stream_capturing(cupy, stream_ptr)
    kept = split_scratch.SCRATCH
    with kept.lock(arrays, plan.device, stream_ptr):
        held = []               # per-call arrays, held until the launches are queued
        if copy_a:
            a_ptr = _padded_copy(arrays, a, copy_a, plan.device, stream_ptr, "A", capturing, held)
        if copy_b:
            b_ptr = _padded_copy(arrays, b, copy_b, plan.device, stream_ptr, "B", capturing, held)
        if plan.swapped:
            a_ptr, b_ptr = b_ptr, a_ptr
        if workspace_elems:
            scratch = kept.take(arrays, a, plan.device, stream_ptr, workspace_elems, counters, capturing)
            held.append(scratch.held)
            plan.launch(a_ptr, b_ptr, c_ptr, alpha, beta, stream, bias_ptr, scratch.workspace_ptr,
                        counters_ptr=scratch.counters_ptr)
        else:
            plan.launch(a_ptr, b_ptr, c_ptr, alpha, beta, stream, bias_ptr)
    return c


def _padded_copy(arrays, x, itemsize: int, device: int, stream_ptr: int, slot: str, capturing: bool,
                 held: list) -> int:
    """The address of x copied into padded rows for TMA, in the stream's kept storage for `slot`
    (split_scratch.SplitScratch.buffer: the same address every call, so the plan's tensor map is
    reused), by one launch of the realigning copy (pad_copy.py); rows that are not runs of adjacent
    elements are copied elementwise into a fresh array (appended to `held`)."""
    ptr, fresh = split_scratch.SCRATCH.buffer(arrays, x, device, stream_ptr, slot, padded_bytes(x, itemsize),
                                              capturing)
    held.extend(fresh)
    if copy_padded_into(arrays, x, itemsize, ptr, stream_ptr):
        return ptr
    y = padded(arrays, x, itemsize)
    held.append(y)
    return arrays.ptr(y)


def _plan_and_launch(cupy, cache: PlanCache, arrays, a, b, c, alpha, beta, trans_a, trans_b, params, kernel, key,
                     bias=None, act=0):
    """The whole way: check the arrays, pick the spec, allocate a new C, configure
    (launch_config.configure), make the kept launch (kept_launch.make), launch it as a kept one;
    keep it under `key` (None: keep nothing)."""
    ma, mb = arrays.matrix(a, "A"), arrays.matrix(b, "B")
    mc = arrays.matrix(c, "C") if c is not None else None
    mbias = arrays.matrix(bias, "bias") if bias is not None else None
    mats = (ma, mb) + ((mc,) if mc is not None else ()) + ((mbias,) if mbias is not None else ())
    alias = _check_alias(mc, ma, mb, mbias) if mc is not None else None
    if ma.dtype.name != mb.dtype.name:
        raise AsmError(f"A and B must share one dtype, got {ma.dtype.name} and {mb.dtype.name}")
    batch, batched, m, n = launch_config.batch_shape(ma, mb, trans_a, trans_b)
    if len({x.device for x in mats}) != 1:
        raise AsmError("A, B and C" + (" and the bias" if mbias is not None else "") + " must be on the same GPU")
    facts = device_facts(ma.device)
    spec = launch_config.pick_spec(kernel, ma.dtype.name, mc.dtype.name if mc is not None else None, facts, bias, act)
    c_dtype = launch_config.new_c_dtype(spec)
    with cupy.cuda.Device(ma.device):
        if c is None:
            if beta != 0:
                raise AsmError(f"beta = {beta} needs a C to scale; pass c= or beta=0")
            c = arrays.empty(a, (batch, m, n) if batched else (m, n), c_dtype)
            mc = arrays.matrix(c, "C")
        timed = None
        if os.environ.get(AUTOTUNE_ENV) == "1":
            c_shape = tuple(mc.shape)

            def timed(choice):
                _autotune(cupy, arrays, choice, a, b, trans_a, trans_b, bias, act, c_shape, c_dtype)
        cfg = launch_config.configure(spec, Problem(ma, mb, mc, mbias, trans_a, trans_b, act, params), facts, timed)
        if cfg.empty:
            return c
        if cfg.built is None:           # K = 0 without a fused epilogue: C = beta * C
            if beta == 0:
                arrays.zero(c)
            else:
                c *= beta
            return c
        kept = kept_launch.make(cupy, cfg, facts, mc.ptr & 15, ma.device)
        if alias is not None:
            kept.alias = alias
        _launch_kept(arrays, kept, a, b, c, alpha, beta, bias)
    if key is not None:
        cache.keep(key, kept)
    return c


_ACTIVATION_NAMES = {i + 1: name for i, name in enumerate(ACTIVATIONS)}
AUTOTUNE_ENV = "ASMGEMM_AUTOTUNE"
AUTOTUNE_TOP = 4                 # the model's best few, timed once per call key
AUTOTUNE_REPS = 3
_autotuned: dict[str, str] = {}  # exact-hit key -> the label timed fastest in this process


def _autotune(cupy, arrays, choice: dispatch.Choice, a, b, trans_a, trans_b, bias, act, c_shape, c_dtype) -> None:
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
