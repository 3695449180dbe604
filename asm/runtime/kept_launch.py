"""A kept launch: everything a repeated `asmgemm.gemm` call needs that does not change with its
pointers and scalars — the loaded function, grid, block, shared memory, the packed argument
layout (and a kept parameter block for cuLaunchKernel), split-K's reduce or the scratch sizes of
a split the kernel sums itself — made once from a
launch_config.LaunchConfig (`make`), launched with new pointers on every call. Also the
process's loaded modules (`load`) and what the latest launch ran (`last_launch`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from ..errors import AsmError
from ..isa.arch import arch_for
from ..kernel_spec import KernelSpec
from . import build_cache, split_k
from .split_k import rerun_params
from .arrays import row_major_strides
from .build_cache import BuiltKernel, build_kernel
from .cluster_capacity import blocks_per_sm, max_active_clusters
from .gpu import DeviceFacts, function_handle
from .launch import ArgPacker, ParamBlock, grid, launch_block
from .launch_config import LaunchConfig, loads_a_itself, stores_c_shifted
from .plan import LaunchPlan

_functions: dict[tuple[str, int], object] = {}
_modules: dict[tuple[str, int], object] = {}


def load(cupy, built: BuiltKernel, static_smem_limit: int):
    """cupy.RawModule over the cubin (ptxas 13.0 matches the driver); the PTX if the driver refuses it."""
    dev = cupy.cuda.Device().id
    fn = _functions.get((built.key, dev))
    if fn is not None:
        return fn
    errors = []
    # a patched kernel only from its cubin: the PTX would be scheduled by the driver's JIT again
    for path in (built.cubin_path,) if built.sass_patch else (built.cubin_path, built.ptx_path):
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


class KeptLaunch:
    """Everything a repeated call needs that does not change with the pointers and scalars."""

    __slots__ = ("built", "fn", "fn_key", "grid", "block", "smem", "packer", "swapped", "c_shape", "c_align",
                 "device", "c_dtype", "split", "spec_name", "c_trans", "cluster_splits", "copied", "a_ldg", "c_shifted", "raw",
                 "current_stream", "alias", "config", "chosen_by", "fixup", "direct")

    def __init__(self, built: BuiltKernel, fn, fn_key, grid_, packer: ArgPacker, swapped: bool, c_shape, c_align: int,
                 device: int, c_dtype: str | None = None, split: split_k.SplitLaunch | None = None,
                 spec_name: str | None = None, c_trans: bool = False, cluster_splits: int = 0):
        self.built, self.fn, self.fn_key = built, fn, fn_key
        # blocks of a split's clusters along z (S, or a cluster+in_kernel split's cluster); 0: none
        self.cluster_splits = cluster_splits
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
        self.c_shifted = False          # C staged with shifted rows, stored in whole pieces (SHIFTED_C)
        # cuLaunchKernel over a kept parameter block (raw_launcher), or None: CuPy's call of fn
        self.raw, self.current_stream = None, None
        # overlap.kept_bounds of a caller's C against A, B and the bias: where `c_ptr - x_ptr`
        # means the output shares memory with an input (all (0, 0) for a C gemm allocates)
        self.alias = (0, 0, 0, 0, 0, 0)
        self.config = None              # the catalog configuration that ran (dispatch.py), or None
        self.chosen_by = None           # "database", "model", "params", "tuning cache" or "size rules"
        # a split summed by each tile's last block in this one launch (split_k.in_kernel_fixup), or None
        self.fixup: FixupNeeds | None = None
        # what gemm's repeated call launches with, where a launch is one cuLaunchKernel on the
        # caller's operands and a new C, nothing kept per stream (direct_launch); None otherwise
        self.direct: DirectLaunch | None = None

    def scratch_needs(self) -> tuple[int, int]:
        """(fp32 workspace elements, int32 tile counters) a launch of this plan needs; (0, 0): none."""
        if self.fixup is not None:
            return self.fixup.workspace_elems, self.fixup.counters
        if self.split is not None:
            return self.split.workspace_elems, 0
        return 0, 0

    def current(self) -> bool:
        """Still what planning afresh would give: the build cache still holds this very build and
        the function is still loaded (a rebuilt kernel or a reloaded module replaces them)."""
        s = self.split
        return (build_cache._memory.get(self.built.key) is self.built and _functions.get(self.fn_key) is self.fn
                and (s is None or build_cache._memory.get(s.built.key) is s.built and _functions.get(s.fn_key) is s.fn))

    def launch(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha, beta, stream, bias_ptr: int = 0,
               workspace_ptr: int = 0, offs_ptr: int = 0, counters_ptr: int = 0) -> None:
        """The kernel on the kernel's A, B and C (and the epilogue's bias) at these addresses
        (split-K: the partial pass into the workspace at workspace_ptr, then the reduce into C, or
        one launch whose tiles' last blocks sum the workspace into C, counting on counters_ptr;
        a grouped launch: the problems' end rows at offs_ptr)."""
        _last_launch[0] = self
        raw = self.raw
        stream_ptr = 0 if raw is None else stream.ptr if stream is not None else self.current_stream().ptr
        if self.split is not None:
            self.split.launch(self.fn, self.grid, self.block, self.smem, self.packer, a_ptr, b_ptr, c_ptr, alpha, beta,
                              stream, workspace_ptr, raw, stream_ptr)
            return
        if self.fixup is not None and (workspace_ptr % 16 or not counters_ptr):
            raise AsmError(f"split-K summed in the kernel needs a 16-byte aligned workspace and tile counters; got "
                           f"workspace 0x{workspace_ptr:x}, counters 0x{counters_ptr:x}")
        if raw is not None:
            launch_block(raw, self.grid, self.block, self.smem, stream_ptr, a_ptr, b_ptr, c_ptr, alpha, beta, bias_ptr,
                         offs_ptr, workspace_ptr, counters_ptr)
            return
        args = self.packer.pack(a_ptr, b_ptr, c_ptr, alpha, beta, bias_ptr, offs_ptr, workspace_ptr, counters_ptr)
        if stream is None:
            self.fn(self.grid, self.block, args, shared_mem=self.smem)
        else:
            self.fn(self.grid, self.block, args, shared_mem=self.smem, stream=stream)


_last_launch: list = [None]      # the KeptLaunch of this process's latest launch (last_launch())


def clear_last_launch() -> None:
    """Forget the latest launch (last_launch() answers None until the next one)."""
    _last_launch[0] = None


def last_launch() -> dict | None:
    """What this process's latest asmgemm.gemm launch ran (None before the first one): the kernel
    spec ("kernel", after its routes: e.g. sgemm_skinny for a decoding shape given to sgemm), the
    entry point, the grid and block, the block's tile of C (rows, columns), the cluster size, the
    K splits (1: none), where they were added ("reduce": "kernel", the reduce kernel after a
    workspace; "cluster", inside clusters of that many blocks, one launch; "in_kernel", by the last
    block of each tile from a workspace, one launch; "cluster+in_kernel", inside clusters of
    "cluster" blocks into a workspace slice each, which the last block of each rank adds, one
    launch; None without a split)
    and "c_trans" (the swap rule's launch: the kernel computed C^T and stored it transposed, its
    tile counted in C^T's rows and columns), "copies" (the caller's operands, "A" and/or "B", copied
    to padded rows first because TMA could not read them in place) and "a_ldg" (the kernel read
    its A by its own loads instead: call value a_ldg), "c_shifted" (the kernel stages a C whose rows are
    not whole 16-byte pieces, each row shifted, and stores it in whole aligned pieces where beta = 0:
    call value shifted_c; never a split launch), "target" (what the kernel was built for) and
    "params" (the -D parameters of the build: the configuration that ran), "config" (its name in the
    family's catalog, e.g. 't128x128_k16/s4'; None where no catalog decided) and "chosen_by" (what
    decided: "database", "model", "params", "tuning cache" or "size rules"), "sass_patch" (the
    control-code passes applied to the cubin after ptxas, from the spec's sass_patch; None: ptxas's
    own codes), "ptxas_options" (the options of the ptxas run that shipped where the source names
    `.ptxas_alternative`s, asmgemm.ptxas_choice; None: ptxas's defaults), "rerun_params" (the
    params= that make gemm run this configuration again: "params" with split-K's switch given as
    the split count, the way params= name a split), "blocks_per_sm" and
    "clusters_at_once" (the driver's occupancy of the build; None where it cannot say). A launch in
    the kernel's batched mode shows it in its params (BATCHED=1; a batch folded into one GEMM does
    not: it ran as that GEMM). For reports such as `asmgemm bench`'s;
    calls from several threads at once each overwrite it."""
    kept = _last_launch[0]
    if kept is None:
        return None
    split = _split_of(kept)
    splits = split.splits if split is not None else max(1, kept.cluster_splits)
    params = build_cache.defines_of(kept.built)
    return {"kernel": kept.spec_name, "entry": kept.built.name, "grid": tuple(kept.grid), "block": kept.block,
            "tile": (kept.built.tile_m, kept.built.tile_n),
            "cluster": kept.cluster_splits or kept.built.cluster, "splits": splits,
            "reduce": _reduce_kind(kept),
            "c_trans": kept.c_trans, "copies": tuple(name for name, size in zip("AB", kept.copied) if size),
            "a_ldg": kept.a_ldg, "c_shifted": kept.c_shifted, "target": kept.built.target, "params": params,
            "rerun_params": _rerun_params(kept, params),
            "config": kept.config, "chosen_by": kept.chosen_by,
            "sass_patch": {k: v for k, v in kept.built.sass_patch} or None,
            "ptxas_options": list(kept.built.ptxas_options) or None,
            "blocks_per_sm": blocks_per_sm(kept.fn, kept.built, kept.device),
            "clusters_at_once": max_active_clusters(kept.fn, kept.built, kept.device, kept.cluster_splits)}


def _split_of(kept: KeptLaunch) -> split_k.Split | None:
    """The split the launch sums through a workspace (the reduce kernel's or its own), or None."""
    if kept.split is not None:
        return kept.split.split
    return kept.fixup.split if kept.fixup is not None else None


def _reduce_kind(kept: KeptLaunch) -> str | None:
    """Where the launch's split was summed (last_launch()["reduce"])."""
    if kept.split is not None:
        return "kernel"
    if kept.fixup is not None:
        return "cluster+in_kernel" if kept.cluster_splits else "in_kernel"
    return "cluster" if kept.cluster_splits else None


def _rerun_params(kept: KeptLaunch, params: dict) -> dict:
    """rerun_params of a kept launch's build."""
    return rerun_params(kept.spec_name, params, _split_of(kept), kept.fixup is not None, kept.cluster_splits)


def make(cupy, cfg: LaunchConfig, facts: DeviceFacts, c_align: int, device: int) -> KeptLaunch:
    """The kept launch of a configuration that launches (cfg.built set): its function loaded on the
    current device, the grid sized, the arguments' layout packed once, split-K's reduce built and
    loaded, cuLaunchKernel where this CuPy offers it. c_align: the caller's C pointer & 15 (a C
    gemm allocates must have it again to reuse the plan)."""
    spec, built, plan, split, in_cluster = cfg.spec, cfg.built, cfg.plan, cfg.split, cfg.in_cluster
    target = built.target
    static_smem = _static_smem_limit(target)
    fn = load(cupy, built, static_smem)
    if split is not None and cfg.fixup:
        kept = _fixup_launch(cupy, spec, built, fn, plan, split, in_cluster, facts.sm_count, cfg.c_shape, c_align,
                             device, cfg.new_c_dtype)
    elif split is None or in_cluster:
        # (a split in one cluster: one launch whose grid's z is S, no workspace, no reduce; its
        # k_chunk is the partial pass's, so both modes cut K at the same places)
        dev = cupy.cuda.Device().id
        kept = KeptLaunch(built, fn, (built.key, dev),
                          grid(spec, built, plan, facts.sm_count, max(1, in_cluster),
                               _cluster_capacity(spec, fn, built, dev)),
                          ArgPacker(built, plan, spec.dtypes.a, spec.dtypes.c,
                                    {"k_chunk": split.k_chunk} if in_cluster else None,
                                    a_map=not loads_a_itself(spec, plan)), plan.swapped, cfg.c_shape,
                          c_align, device, cfg.new_c_dtype, spec_name=spec.name, c_trans=plan.c_trans,
                          cluster_splits=in_cluster)
    else:
        kept = _split_launch(cupy, spec, built, fn, plan, split, target, static_smem, facts.sm_count, cfg.c_shape,
                             c_align, device, cfg.new_c_dtype)
    kept.copied = cfg.copied
    kept.config = cfg.config
    kept.chosen_by = cfg.chosen_by
    kept.a_ldg = loads_a_itself(spec, plan)
    # (a split launch stages nothing: its partial pass writes fp32 slices, a reduce or a cluster sum C)
    kept.c_shifted = stores_c_shifted(spec, plan) and split is None
    use_raw_launch(cupy, kept)
    return kept


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


def raw_launcher(cupy, fn):
    """(cuLaunchKernel, the function's CUfunction handle) where this CuPy and its loaded function
    offer them, else None (a stand-in CuPy; ASMGEMM_RAW_LAUNCH=0). CuPy's own call of a RawKernel
    converts the argument tuple on every call: ~10 us of host time on the H100's host against
    ~3.5 us for cuLaunchKernel over kept argument bytes (docs/log/hgemm.md, "Host time")."""
    if os.environ.get("ASMGEMM_RAW_LAUNCH", "1") == "0":
        return None
    driver = getattr(getattr(cupy, "cuda", None), "driver", None)
    launch = getattr(driver, "launchKernel", None)
    handle = function_handle(fn)
    if launch is None or handle is None:
        return None
    return launch, handle


def use_raw_launch(cupy, kept: KeptLaunch) -> None:
    """Switch a new kept launch (and its split's reduce) to cuLaunchKernel where raw_launcher
    allows it for every kernel it launches."""
    main = raw_launcher(cupy, kept.fn)
    if main is None:
        return
    if kept.split is not None:
        reduce = raw_launcher(cupy, kept.split.fn)
        if reduce is None:
            return
        kept.split.raw = (*reduce, ParamBlock(kept.split.packer, kept.split.built.params))
    kept.raw = (*main, ParamBlock(kept.packer, kept.built.params))
    kept.current_stream = cupy.cuda.get_current_stream
    kept.direct = direct_launch(kept)


class DirectLaunch(NamedTuple):
    """One cuLaunchKernel of a kept launch, unpacked for gemm's repeated call (runtime/gemm.py,
    _repeat_call): the driver's function and handle, grid, block, shared memory, the parameter
    block, and the row-major strides (in elements) of the C gemm allocates."""
    launch: object
    handle: int
    grid_x: int
    grid_y: int
    grid_z: int
    block_x: int
    block_y: int
    block_z: int
    smem: int
    params: ParamBlock
    c_strides: tuple


def direct_launch(kept: KeptLaunch) -> DirectLaunch | None:
    """The launch unpacked where it is one cuLaunchKernel and nothing else: no operand copied to
    padded rows, no split-K workspace or reduce (those take the stream's kept scratch under its
    lock: runtime/gemm.py _launch_kept); None otherwise."""
    if kept.raw is None or kept.split is not None or kept.fixup is not None or any(kept.copied):
        return None
    launch, handle, block = kept.raw
    return DirectLaunch(launch, handle, *kept.grid, *kept.block, kept.smem, block, row_major_strides(kept.c_shape))


class FixupNeeds:
    """A split its kernel sums itself (one launch): the split, and the scratch each launch needs."""

    __slots__ = ("split", "workspace_elems", "counters")

    def __init__(self, split: split_k.Split, workspace_elems: int, counters: int):
        self.split, self.workspace_elems, self.counters = split, workspace_elems, counters


def _fixup_launch(cupy, spec: KernelSpec, built: BuiltKernel, fn, plan: LaunchPlan, split, in_cluster: int,
                  sm_count: int, c_shape, c_align: int, device: int, c_dtype) -> KeptLaunch:
    """A kept launch of a split summed in the kernel: the partial pass's grid (z = S, or S rounded
    up to whole clusters of in_cluster blocks whose sums are the slices) on the call's C, k_chunk
    and split_stride packed; the workspace and tile counters come per call (split_scratch.py keeps
    them per stream)."""
    dev = cupy.cuda.Device().id
    grid_ = grid(spec, built, plan, sm_count, split_k.grid_splits(split.splits, in_cluster),
                 _cluster_capacity(spec, fn, built, dev))
    packer = ArgPacker(built, plan, spec.dtypes.a, spec.dtypes.c, split_k.fixup_values(split, plan),
                       a_map=not loads_a_itself(spec, plan))
    kept = KeptLaunch(built, fn, (built.key, dev), grid_, packer, plan.swapped, c_shape, c_align, device, c_dtype,
                      spec_name=spec.name, cluster_splits=in_cluster)
    kept.fixup = FixupNeeds(split, split_k.fixup_workspace_elems(split, plan, built.tile_n, in_cluster),
                            split_k.fixup_counters(grid_, in_cluster))
    return kept


def _split_launch(cupy, spec: KernelSpec, built: BuiltKernel, fn, plan: LaunchPlan, split, target: str,
                  static_smem: int, sm_count: int, c_shape, c_align: int, device: int, c_dtype) -> KeptLaunch:
    """A kept launch of split-K: the partial pass (this build: grid z = S, C = a workspace slice of
    ld N, k_chunk and split_stride packed) and the reduce kernel into the call's C."""
    ws_plan = split_k.workspace_plan(plan)
    packer = ArgPacker(built, ws_plan, spec.dtypes.a, "float32", split_k.partial_values(split, plan), c_map=False,
                       a_map=not loads_a_itself(spec, plan))
    rspec = split_k.reduce_spec(spec)
    rbuilt = build_kernel(rspec, split_k.reduce_defines(spec, plan), target)
    rfn = load(cupy, rbuilt, static_smem)
    dev = cupy.cuda.Device().id
    reduce = split_k.SplitLaunch(split, rbuilt, rfn, (rbuilt.key, dev), split_k.reduce_grid(rbuilt, plan),
                                 ArgPacker(rbuilt, plan, "float32", spec.dtypes.c, split_k.reduce_values(split, plan)),
                                 plan.m, plan.n)
    return KeptLaunch(built, fn, (built.key, dev),
                      grid(spec, built, plan, sm_count, split.splits, _cluster_capacity(spec, fn, built, dev)), packer,
                      plan.swapped, c_shape, c_align, device, c_dtype, reduce, spec_name=spec.name)


