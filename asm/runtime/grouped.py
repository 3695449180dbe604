"""`asmgemm.grouped_gemm`: a mixture of experts' grouped GEMM in one launch.

The contiguous form follows torch._grouped_mm: A is (total_tokens, K) with each expert's rows one
after the other, `offs` holds each expert's END row (int32, on the device: offs[e - 1] .. offs[e]
are expert e's rows, offs[-1] = 0), B is (E, K, N) (or a transposed (E, N, K) tensor viewed as
(E, K, N): each expert's matrix in either storage order, any stride between experts) and out is
(total_tokens, N): out[offs[e-1]:offs[e]] = act(alpha * A[offs[e-1]:offs[e]] @ B[e] + beta * out[...]).

Where TMA can read A and B in place (16-byte aligned bases, rows and experts whole 16-byte pieces
apart: `tma_reads`) on a device with wgmma, it runs the Hopper kernel's grouped mode (hgemm.sasm
GROUPED=1: A a 2-D tensor map over all tokens, B a 3-D map with the expert outermost; a persistent
grid walks (tile row of all experts, tile column), every block counting the experts' tile rows
from offs at its start; hgemm/config.inc). Elsewhere it runs the family's portable kernel in its
grouped mode (mma_gemm.sasm, GROUPED=1: grid y an upper bound on the experts' tile rows,
ceil(total_tokens / BM) + E, each expert having at most one partial tile row). Either way each
block finds its (expert, tile row) from offs on the device, so the host never reads offs (no
synchronisation; the call can be captured in a CUDA graph). Empty experts and experts with fewer
rows than a tile need nothing special. Rows of out past offs[-1] are not written. Offsets on the device cannot be checked without reading them: the kernel clamps
them to 0 .. total_tokens (an end below its start is an empty expert), so bad offsets give wrong
rows, never an access outside A or out; offsets given as a host sequence are checked (AsmError).

The list form (`grouped_gemm([a0, a1, ...], [b0, b1, ...])`) is for ragged problems whose
operands do not lie one after the other: each problem is one asmgemm.gemm launch (E launches).

The checks (`check_grouped`, `check_offsets`) are pure functions of arrays.Matrix descriptions,
tested on the CPU (tests/test_grouped_cpu.py).
"""
from __future__ import annotations

import dataclasses
import sys

import numpy as np

from ..errors import AsmError
from ..kernel_spec import KernelSpec, activation_code, get_spec, specs_version
from . import dispatch, kept_launch, overlap, tensor_map
from .arrays import Matrix, as_cupy, ptr_of
from .build_cache import build_kernel
from .gemm import gemm
from .gpu import DeviceFacts, device_facts, on_device, require_gpu
from .launch import choose_params
from .launch_config import LaunchConfig, build_choice, missing_epilogue, new_c_dtype, pick_spec
from .plan import LaunchPlan, plan_launch
from .plan_cache import PlanCache

# (CuPy has no bfloat16: its bf16 data travels as 16-bit patterns, to a kernel named with kernel=)
_DTYPES = ("float16", "bfloat16", "uint16", "int16")
_cache = PlanCache()               # the kept grouped launches of this process, by call key


def _matrix_of(x: Matrix) -> Matrix:
    """Expert 0's matrix of a 3-D B (its storage order and leading dimension are every expert's)."""
    return x._replace(shape=tuple(x.shape[1:]), strides=tuple(x.strides[1:]))


def check_grouped(ma: Matrix, mb: Matrix, mc: Matrix | None, moffs: Matrix) -> tuple[int, int, int, int]:
    """(E, total_tokens, K, N) of a contiguous grouped call, or AsmError naming what does not fit:
    A 2-D and B 3-D of one 16-bit dtype with the same K, offs a 1-D int32 array of E values, out
    (total_tokens, N) with its rows contiguous (row-major: each expert's rows are a block of them),
    everything on one device."""
    if ma.ndim != 2:
        raise AsmError(f"grouped_gemm: A must be 2-D (total_tokens, K), the experts' rows one after the other; "
                       f"got shape {ma.shape}")
    if mb.ndim != 3:
        raise AsmError(f"grouped_gemm: B must be 3-D (E, K, N), one matrix per expert (a transposed (E, N, K) "
                       f"tensor as .transpose(1, 2)); got shape {mb.shape}")
    if ma.dtype.name != mb.dtype.name:
        raise AsmError(f"grouped_gemm: A and B must share one dtype, got {ma.dtype.name} and {mb.dtype.name}")
    if ma.dtype.name not in _DTYPES:
        raise AsmError(f"grouped_gemm: A and B are {ma.dtype.name}; the grouped kernels take {' or '.join(_DTYPES)}",
                       hint="convert them (torch: x.to(torch.bfloat16))")
    total, k = ma.shape
    experts, k_b, n = mb.shape
    if k != k_b:
        raise AsmError(f"grouped_gemm: inner dimensions differ: A is {total} x {k}, each expert's B is {k_b} x {n}")
    if moffs.ndim != 1 or moffs.dtype.name != "int32":
        raise AsmError(f"grouped_gemm: offs must be a 1-D int32 array (each expert's end row); got shape "
                       f"{moffs.shape} of {moffs.dtype.name}", hint="torch: offs.to(torch.int32)")
    if moffs.shape[0] != experts:
        raise AsmError(f"grouped_gemm: offs has {moffs.shape[0]} end rows, but B has {experts} experts")
    if experts and moffs.shape[0] > 1 and moffs.strides[0] != 4:
        raise AsmError("grouped_gemm: offs must be contiguous", hint="pass offs.contiguous()")
    if mb.strides[0] < 0 or mb.strides[0] % mb.dtype.itemsize:
        raise AsmError(f"grouped_gemm: B's experts are {mb.strides[0]} bytes apart: not a non-negative whole number "
                       f"of {mb.dtype.itemsize}-byte elements")
    if mc is not None:
        if tuple(mc.shape) != (total, n):
            raise AsmError(f"grouped_gemm: out has shape {tuple(mc.shape)}, expected ({total}, {n}) = "
                           "(total_tokens, N)")
        if n > 1 and mc.strides[1] != mc.dtype.itemsize:
            raise AsmError(f"grouped_gemm: out's rows must be contiguous (strides {mc.strides} bytes): each expert "
                           "writes a block of its rows", hint="pass a row-major out, or leave it out")
    devices = {x.device for x in (ma, mb, moffs) + ((mc,) if mc is not None else ())}
    if len(devices) != 1:
        raise AsmError("grouped_gemm: A, B, offs and out must be on the same GPU")
    return experts, total, k, n


def check_offsets(offs, experts: int, total: int) -> np.ndarray:
    """Offsets given on the host (a sequence or numpy array): as int32, or AsmError when there are
    not E of them, one is negative, one is below the one before, or one passes total_tokens."""
    values = np.asarray(offs)
    if values.ndim != 1 or values.shape[0] != experts or (values.size and values.dtype.kind not in "iu"):
        raise AsmError(f"grouped_gemm: offs must be {experts} integer end rows (one per expert), got "
                       f"{values.shape[0] if values.ndim == 1 else values.shape} of {values.dtype}")
    values = values.astype(np.int64)
    if values.size and values[0] < 0:
        raise AsmError(f"grouped_gemm: offs[0] = {values[0]} is negative")
    down = np.nonzero(np.diff(values) < 0)[0]
    if down.size:
        i = int(down[0]) + 1
        raise AsmError(f"grouped_gemm: offsets must not decrease: offs[{i}] = {values[i]} < offs[{i - 1}] = "
                       f"{values[i - 1]}")
    if values.size and values[-1] > total:
        raise AsmError(f"grouped_gemm: offs[{experts - 1}] = {values[-1]} passes A's {total} rows")
    return values.astype(np.int32)


def tma_reads(ma: Matrix, mb: Matrix) -> bool:
    """Whether TMA reads a grouped call's A and B in place: A's base and rows, and expert 0's B and
    its rows, on 16-byte boundaries, and B's experts a whole number of 16-byte pieces apart (the
    3-D map's outermost stride; tensor_map.addressable, batch_addressable). A K-major A is
    (total_tokens, K) with rows strides[0] apart; a transposed view (its columns contiguous) is
    stored K x total_tokens."""
    item = ma.dtype.itemsize
    a_rows, a_ld = (ma.shape[0], ma.strides[0]) if ma.strides[-1] == item or ma.shape[1] == 1 else (ma.shape[1], ma.strides[1])
    b0 = _matrix_of(mb)
    b_rows, b_ld = (b0.shape[0], b0.strides[0]) if b0.strides[-1] == item or b0.shape[1] == 1 else (b0.shape[1], b0.strides[1])
    stride_b = mb.strides[0] // item if mb.shape[0] > 1 else 0
    if mb.shape[0] > 1 and stride_b == 0:
        # every expert's B one matrix (an expand()ed weight): the kernel reads expert e at matrix
        # e of B's map, which a map of one matrix does not hold; the portable kernel steps by 0
        return False
    if ma.shape[1] == 0:
        return False                    # K = 0: no map has a column to describe
    return (a_ld % item == 0 and b_ld % item == 0
            and tensor_map.addressable(ma.ptr, a_rows, a_ld // item, item)
            and tensor_map.addressable(mb.ptr, b_rows, b_ld // item, item)
            and tensor_map.batch_addressable(stride_b, item))


def grouped_kernel(spec: KernelSpec, facts: DeviceFacts, act: int, ma: Matrix, mb: Matrix) -> KernelSpec:
    """The kernel that runs a grouped call of `spec`'s family: `spec` itself where it has a grouped
    mode, builds for the device and, being a TMA kernel (hgemm), TMA reads A and B in place
    (`tma_reads`); else its `in_place` kernel (the Hopper kernels' portable twin, which reads any
    strides as they are: a grouped call gets no padded copies); AsmError when neither has one."""
    tma = "tmap_a" in spec.abi
    if (spec.call_value_param("grouped") is not None and spec.build_target(facts.target) is not None
            and (not tma or tma_reads(ma, mb))):
        return spec
    cand = spec
    if spec.in_place:
        other = get_spec(spec.in_place)
        if other.call_value_param("grouped") is not None and not missing_epilogue(other, None, act):
            cand = other
    if cand.call_value_param("grouped") is None or cand.build_target(facts.target) is None:
        raise AsmError(f"kernel '{spec.name}' has no grouped mode for this call (nor has its in-place kernel)",
                       hint="the grouped kernels are hgemm / bgemm (operands TMA reads, sm_90a), hgemm_mma / "
                            "bgemm_mma and their _f32c twins")
    return cand


def grouped_plan(ma: Matrix, mb: Matrix, mc: Matrix, experts: int, act: int) -> LaunchPlan:
    """The launch plan of a grouped call: expert 0's problem over all of A's rows (M = total_tokens:
    what the kernel clamps offsets to and the grid's bound counts), B's stride between experts, the
    call value grouped. An MN-major A (a transposed view) starts each expert at a column only the
    device knows, so its copies are 2 bytes wide."""
    mb0 = _matrix_of(mb)
    sb = mb.strides[0] // mb.dtype.itemsize if experts > 1 else 0
    plan = plan_launch(ma, mb0, mc, trans_a=False, trans_b=False, ptr_of=ptr_of, activation=act,
                       batch_strides=(0, sb, 0))
    values = dict(plan.call_values, grouped=1)
    if plan.a.trans:
        values["align_a"] = 2
    # (the Hopper kernel's, hgemm/guards.inc): A through its map, C unswapped; wide_c stays the
    # plan's (the staged C: the kernel stores a warpgroup's rows that cross its expert's end by pairs)
    values.update(a_ldg=0, c_trans=0, shifted_c=0)    # (the grouped tiles' C by TMA or pairs: tested so)
    return dataclasses.replace(plan, call_values=values, groups=experts)


# The Hopper kernel's grouped tile: 64-row tiles (CONSUMERS = 1) where the experts average at most 64
# rows (E = 64 over 4096 tokens), since an expert's last tile row is partial: at 64 rows an expert
# fills half of a 128-row tile and the other half's MMAs are wasted; at 128 rows and more the
# 128-row tile wastes at most a quarter on average and keeps both consumers on the tensor cores.
SMALL_EXPERT_ROWS = 64


def grouped_defines(spec: KernelSpec, plan: LaunchPlan) -> dict:
    """-D values a grouped launch of a persistent TMA kernel (hgemm GROUPED=1) gets besides its
    size rule, which sees the GEMM of all tokens (total_tokens x N x K: the tile work the walk
    covers): no clusters down a tile column (CLUSTER_M: their tile rows may belong to different
    experts), no split of K, no streamed loads (hgemm/guards.inc), and 64-row tiles where the
    experts average SMALL_EXPERT_ROWS rows or fewer (the pairs of a tile row along N: a_multicast).
    The portable kernel: nothing (its catalog and cost model choose, counting the experts' extra
    tile rows)."""
    if spec.launch.grid != "persistent":
        return {}
    defines = {"CLUSTER_M": 1, "CLUSTER_N": 1, "CLUSTER_K": 1, "SPLIT_K": 0, "STREAM": 0}
    if plan.m <= SMALL_EXPERT_ROWS * plan.groups:
        defines["CONSUMERS"] = 1
    return defines


# A grouped tile row's blocks in pairs along N (CLUSTER_N = 2: the two blocks of a cluster take
# one tile row, so one expert, and load half of its A tile each, multicast into both). Measured
# on the H100 (tools/moe_diag.py, bf16, GPU time; docs/log/hgemm.md "Grouped pairs"): E=8
# K=14336 N=4096 32768 tokens 438 -> 698 TFLOP/s (torch._grouped_mm 694), E=8 K=4096 N=14336 653
# -> 705, E=64 K=7168 N=2048 478 -> 572. A pair whose second tile lies right of N runs empty, so
# pairs go where that wastes at most one tile column in PAIR_WASTE_MAX.
PAIR_WASTE_MAX = 8


def a_multicast(n: int, tile_n: int) -> int:
    """CLUSTER_N of a grouped launch whose tiles are tile_n wide: 2 where the tile columns pair up
    with at most one column in PAIR_WASTE_MAX left empty, else 1."""
    tiles_n = -(-n // tile_n)
    pairs = -(-tiles_n // 2)
    return 2 if tiles_n >= 2 and (2 * pairs - tiles_n) * PAIR_WASTE_MAX <= 2 * pairs else 1


def grouped_params(spec: KernelSpec, plan: LaunchPlan, params: dict | None, sm_count: int,
                   dram_per_sm_cycle: int | None = None) -> dict:
    """The -D values of a grouped launch on a kernel's own configuration (no catalog ranking):
    params= as given, else its size rule for all tokens, if any (the source defaults on the TMA
    kernel), with grouped_defines and, on the persistent TMA kernel, its tile columns in pairs where
    they pair up (a_multicast). dram_per_sm_cycle: the GPU's, as choose_params."""
    defines = None if params is not None else grouped_defines(spec, plan)
    chosen = choose_params(spec, plan, params, None, sm_count, defines, dram_per_sm_cycle)
    if defines:
        # (the persistent kernel's tile is BN columns wide: hgemm/config.inc's TN = BN)
        chosen["CLUSTER_N"] = a_multicast(plan.n, int(chosen["BN"]))
    return chosen


def grouped_config(spec: KernelSpec, plan: LaunchPlan, facts: DeviceFacts, params: dict | None) -> LaunchConfig:
    """What runs: params= pin the build; the persistent TMA kernel (hgemm) takes the source's
    defaults plus grouped_defines and its pairs along N (grouped_params: measured for this mode,
    tools/moe_diag.py; its catalog's sweeps time 2-D launches, which walk no experts); else the
    family's catalog ranked by the cost model for the grid's tile rows (all tokens, plus one
    partial row per expert), the first build the kernel's guards accept."""
    cfg = LaunchConfig(spec, plan, (plan.m, plan.n), new_c_dtype(spec), chosen_by="params" if params else "model")
    target = spec.build_target(facts.target)
    if params is not None or not spec.configs or spec.launch.grid == "persistent":
        if params is None:
            cfg.chosen_by = "grouped defaults"
        cfg.built = build_kernel(spec, grouped_params(spec, plan, params, facts.sm_count, facts.dram_per_sm_cycle),
                                 target)
        return cfg
    choice = dispatch.choose(spec, plan.layout, plan.m, plan.n, plan.k, call_values=plan.call_values,
                             gpu=facts.name, target=facts.target, sms=facts.sm_count, plain=False,
                             clock_hz=facts.clock_hz, dram_bytes_per_s=facts.dram_bytes_per_s,
                             usable=lambda name: get_spec(name).call_value_param("grouped") is not None,
                             extra_tile_rows=plan.groups)
    cfg.spec, picked, _, _, cfg.built, _ = build_choice(choice, plan, facts, False)
    cfg.config, cfg.chosen_by = picked.label, choice.chosen_by
    return cfg


def grouped_gemm(a, b, offs=None, out=None, *, alpha: float = 1.0, beta: float = 0.0, activation: str | None = None,
                 params: dict | None = None, kernel: str | None = None):
    """out[offs[e-1]:offs[e]] = act(alpha * a[offs[e-1]:offs[e]] @ b[e] + beta * out[...]) for every
    expert e, in one launch; returns out (module docstring). a: (total_tokens, K); b: (E, K, N) (a
    transposed (E, N, K) weight as w.transpose(1, 2)); offs: each expert's end row, int32 on the
    device (or a host sequence, checked, then copied to the device); out: (total_tokens, N),
    row-major, None for a new one of the kernel's C dtype (16-bit, or float32 for an fp32 out).
    activation: as gemm's. torch tensors or CuPy arrays (bfloat16: torch tensors, or CuPy
    uint16/int16 bit patterns with kernel='bgemm_mma').
    List form: a and b lists of 2-D operands (problem i: a[i] @ b[i], shapes free), offs None, out
    None or a list: one asmgemm.gemm launch per problem."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return _grouped_list(a, b, offs, out, alpha, beta, activation, params, kernel)
    if offs is None:
        raise AsmError("grouped_gemm: the contiguous form needs offs (each expert's end row in A)",
                       hint="or pass lists of matrices for the list form")
    act = activation_code(activation)
    cupy = require_gpu("asmgemm.grouped_gemm")
    cache = _cache.current(cupy)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(a, torch.Tensor):
        arrays = cache.torch(cupy, torch)
    else:
        arrays = cache.cupy_arrays
        a, b = as_cupy(cupy, a, "A"), as_cupy(cupy, b, "B")
        out = as_cupy(cupy, out, "out") if out is not None else None
    # on the device: a CuPy array, a torch tensor, anything exposing __cuda_array_interface__;
    # else host values (a sequence, a numpy array), checked and copied over
    host_offs = not (isinstance(offs, cupy.ndarray) or torch is not None and isinstance(offs, torch.Tensor)
                     or hasattr(offs, "__cuda_array_interface__"))
    if not host_offs and arrays is cache.cupy_arrays:
        offs = as_cupy(cupy, offs, "offs")
    if not host_offs and out is None and beta == 0:
        # a repeated call: its kept launch, found by the operands' layouts (arrays.key: shape,
        # strides, dtype, alignment, device) before any check, since the checks of the call that made
        # it hold for every call with this key. Only where gemm allocates out (no overlap to check)
        # and offs are on the device (host offsets are checked on every call). On the H100's host a
        # small E = 8 call took 113 us from an idle GPU through the checks, against torch._grouped_mm's 51.
        key = _grouped_key(arrays, a, b, None, offs, act, kernel, params)
        kept = cache.get(key)
        if kept is not None and kept.current():
            got = on_device(cupy, kept.device, _launch_kept, arrays, kept, a, b, offs, alpha, beta)
            if got is not None:
                return got
    ma, mb = arrays.matrix(a, "A"), arrays.matrix(b, "B")
    if host_offs:
        values = check_offsets(offs, mb.shape[0] if mb.ndim == 3 else -1, ma.shape[0] if ma.ndim == 2 else -1)
        offs = (torch.tensor(values, dtype=torch.int32, device=a.device) if arrays is not cache.cupy_arrays
                else cupy.asarray(values))
    moffs = arrays.matrix(offs, "offs")
    mc = arrays.matrix(out, "out") if out is not None else None
    experts, total, k, n = check_grouped(ma, mb, mc, moffs)
    if mc is not None:
        overlap.check_output(overlap.described("out", mc), [overlap.described("A", ma), overlap.described("B", mb),
                                                            overlap.described("offs", moffs)])
    elif beta != 0:
        raise AsmError(f"beta = {beta} needs an out to scale; pass out= or beta=0")
    key = _grouped_key(arrays, a, b, out, offs, act, kernel, params)
    kept = cache.get(key)
    with cupy.cuda.Device(ma.device):
        if kept is None or not kept.current():
            facts = device_facts(ma.device)
            spec = pick_spec(kernel, ma.dtype.name, mc.dtype.name if mc is not None else None, facts, None, act)
            spec = grouped_kernel(spec, facts, act, ma, mb) if kernel is None else _named_grouped(spec, ma, mb)
            if out is None:
                out = arrays.empty(a, (total, n), new_c_dtype(spec))
                mc = arrays.matrix(out, "out")
            if experts == 0 or total == 0 or n == 0:
                return out
            cfg = grouped_config(spec, grouped_plan(ma, mb, mc, experts, act), facts, params)
            kept = kept_launch.make(cupy, cfg, facts, mc.ptr & 15, ma.device)
            cache.keep(key, kept)
        elif out is None:
            out = arrays.empty(a, kept.c_shape, kept.c_dtype)
            if arrays.ptr(out) & 15 != kept.c_align:
                cache.plans.pop(key, None)
                return grouped_gemm(a, b, offs, out, alpha=alpha, beta=beta, activation=activation, params=params,
                                    kernel=kernel)
        if experts == 0 or total == 0 or n == 0:
            return out
        kept.launch(arrays.ptr(a), arrays.ptr(b), arrays.ptr(out), alpha, beta, arrays.stream(ma.device), 0, 0,
                    arrays.ptr(offs))
    return out


def _grouped_key(arrays, a, b, out, offs, act: int, kernel: str | None, params: dict | None) -> tuple:
    """The kept launch's key: every operand's layout (arrays.key), the epilogue and the build asked for."""
    return (arrays.key(a), arrays.key(b), arrays.key(out) if out is not None else None, arrays.key(offs), act,
            kernel, tuple(sorted(params.items())) if params else None, specs_version())


def _launch_kept(arrays, kept, a, b, offs, alpha, beta):
    """A repeated call with a new out through its kept launch; None where the allocator's out is not
    aligned as the kept launch was made for (the caller then plans this call afresh)."""
    out = arrays.empty(a, kept.c_shape, kept.c_dtype)
    if arrays.ptr(out) & 15 != kept.c_align:
        return None
    kept.launch(arrays.ptr(a), arrays.ptr(b), arrays.ptr(out), alpha, beta, arrays.stream(kept.device), 0, 0,
                arrays.ptr(offs))
    return out


def _named_grouped(spec: KernelSpec, ma: Matrix, mb: Matrix) -> KernelSpec:
    if spec.call_value_param("grouped") is None:
        raise AsmError(f"kernel '{spec.name}' has no grouped mode (its spec maps no parameter to the call value "
                       "'grouped')", hint="leave kernel= out, or name hgemm_mma / bgemm_mma (or their _f32c twins)")
    if "tmap_a" in spec.abi and not tma_reads(ma, mb):
        raise AsmError(f"kernel '{spec.name}' reads a grouped call through TMA maps, which need 16-byte aligned "
                       "rows and experts; A's or B's are not, and a grouped call gets no padded copies",
                       hint=f"leave kernel= out, or name '{spec.in_place}'" if spec.in_place else tensor_map.TMA_HINT)
    return spec


def _grouped_list(a, b, offs, out, alpha, beta, activation, params, kernel):
    """The list form: problem i is a[i] @ b[i] into out[i] (a new C where out is None), one
    asmgemm.gemm launch each."""
    if not isinstance(a, (list, tuple)) or not isinstance(b, (list, tuple)):
        raise AsmError("grouped_gemm: the list form takes lists of A and of B matrices (one of each per problem)")
    if offs is not None:
        raise AsmError("grouped_gemm: the list form takes no offs (each problem is its own pair of matrices)")
    if len(a) != len(b) or (out is not None and len(out) != len(a)):
        raise AsmError(f"grouped_gemm: {len(a)} A matrices, {len(b)} B matrices"
                       + (f" and {len(out)} outputs" if out is not None else "") + ": one of each per problem")
    results = []
    for i, (ai, bi) in enumerate(zip(a, b)):
        if getattr(ai, "ndim", 2) != 2 or getattr(bi, "ndim", 2) != 2:
            raise AsmError(f"grouped_gemm: problem {i}: A and B must be 2-D, got {tuple(ai.shape)} and "
                           f"{tuple(bi.shape)}")
        results.append(gemm(ai, bi, out[i] if out is not None else None, alpha=alpha, beta=beta,
                            activation=activation, params=params, kernel=kernel))
    return results
