"""Split-K: one GEMM launch as two, for small M x N with deep K (decoding shapes), where one block
per tile of C leaves most SMs idle.

  1. the partial pass: the GEMM kernel built with its split-K switch (the spec's
     `[NAME.split_k] switch`, sgemm's SPLIT_K=1) on a grid of (tiles_x, tiles_y, S); block (x, y, s)
     computes its tile over k in [s*k_chunk, min(K, (s+1)*k_chunk)) into slice s of an fp32
     workspace of S x M x N (row-major, ld = N, `split_stride` = M*N elements), alpha = 1, beta = 0;
  2. the reduce (the spec's `reduce` source, kernels_ptx/splitk_reduce.sasm): C = alpha * sum_s W[s]
     + beta * C, summing s = 0..S-1 in that order, so the result is deterministic (bit-identical
     from run to run) and beta = 0 never reads C.

Both run on the same stream, one after the other. M, N, C and ldc are the kernel's (after the
operand swap of a column-major C), so the reduce only ever sees a row-major C.

A kernel whose spec names a `fixup_switch` (mma_gemm.sasm: SPLIT_FIXUP) sums in the partial pass
instead, one launch (`in_kernel_fixup`, last_launch()["reduce"] == "in_kernel"): each block stores
its slice, then counts itself in on its tile's int32 counter (an atomic, after a fence), and the
block that counts last sums the tile's S slices into C in slice order with the reduce kernel's own
instructions (kernels_ptx/splitk_sum.inc), so C has the same bits either way. The counter array
(`tile_counters`) is zeroed once when it is allocated; the last block's atomic wraps its tile's
counter back to 0, so the next launch on the stream finds them zero again.

The workspace and the counters (`KeptScratch`) are kept per (device, stream) and grown when a call
needs more, so a repeated call allocates nothing; a workspace past WORKSPACE_CAP_BYTES is not kept
(allocated per call from the arrays' allocator, as every split was before, and released once
queued: the pools reuse it in stream order). Two streams never share counters: two launches
counting on the same tile's counter at once would race (one could see the other's blocks' arrivals).

Choosing S (`choose_split`), the pseudo-parameter being the spec's switch name ('SPLIT_K'):
  * params= given: params['SPLIT_K'] is S (absent or 1: off). The tuner's trials and bench's -D
    sets pass params, so they run unsplit unless they ask for it.
  * a tuning-cache entry that names SPLIT_K: that S (1: off).
  * otherwise (no params=, or a tuning-cache entry of tile parameters only) the spec's split rules
    (kernels.toml), evaluated on the kernel's M, N, K and the SM count. `asmgemm tune` does not
    search S: it times its candidates unsplit (they run with params=) and stores tile parameters,
    so the split stays the rule's on a tuned shape. Dropping it there would make a decode shape
    several times slower after tuning (the split is worth 3-4x there, the tile choice far less);
    the price is that the tuned tile then runs split without having been timed split.
  Then k_chunk = S's share of K rounded up to a multiple of CHUNK_MULTIPLE, and S = ceil(K /
  k_chunk): a split never starts past K (no empty split, no block without work), so S may come out
  smaller than asked. S = 1 is no split: one ordinary launch.
Split-K applies only to a plain 2-D GEMM call (`plain=False`: fused epilogues, batches: off) whose
kernel stores C in its own orientation (not c_trans: the partial pass would write the workspace
transposed; measured on the small-M shapes that swap, the split did not pay there either).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from ..errors import AsmError
from ..isa.arch import arch_for
from ..kernel_spec import Dtypes, KernelSpec, Launch, get_spec
from .launch import launch_block, untuned_launch
from .plan import LaunchPlan

# k_chunk is a multiple of the spec's k_multiple, by default 16 elements: every split but the last
# is whole BK=16 (and BK=8) tiles, and the operands' K offsets keep 64-byte alignment along K, so
# the 128-bit load flags (VEC_A, VEC_B) computed for the whole call stay valid for every split (an
# MN-contiguous operand moves by whole rows, which its own alignment already covers). hgemm's is 64
# (its BK, and the TMA boxes' K origins).
CHUNK_MULTIPLE = 16
# A bound on S (the grid's z allows 65535): the workspace is S x M x N floats, and past a few
# dozen splits the reduce reads more than the partial pass saves.
MAX_SPLITS = 256
# The reduce kernel's .param list (kernel_spec.ARGUMENTS), checked against its build.
REDUCE_ABI = ("W", "C", "M", "N", "ldc", "splits", "split_stride", "alpha", "beta")
# C's type in the reduce (its C_TYPE parameter): fp32, or rounded to fp16 / bf16 for 16-bit GEMMs.
C_TYPES = {"float32": 0, "float16": 1, "bfloat16": 2}
MAX_GRID_Y = 65535


@dataclass(frozen=True)
class Split:
    """How one launch is split: S splits of k_chunk (the last one shorter) over K."""

    splits: int
    k_chunk: int

    def workspace_elems(self, m: int, n: int) -> int:
        return self.splits * m * n


def split_for(k: int, requested: int, multiple: int = CHUNK_MULTIPLE) -> Split | None:
    """S and k_chunk for K = k and a requested number of splits; None when that is no split.
    k_chunk is a multiple of `multiple` and S = ceil(K / k_chunk), so every split has work."""
    if requested <= 1 or k <= multiple:
        return None
    chunk = -(-k // requested)
    chunk = -(-chunk // multiple) * multiple
    splits = -(-k // chunk)
    return Split(splits, chunk) if splits > 1 else None


def requested_splits(value, switch: str, where: str) -> int:
    """A requested number of splits from params= or a tuning-cache entry (an int, or the digits
    bench's -D passes)."""
    try:
        s = int(value) if not isinstance(value, bool) and str(value).strip().lstrip("+").isdigit() else None
    except (TypeError, ValueError):
        s = None
    if s is None or not 1 <= s <= MAX_SPLITS:
        raise AsmError(f"{where} {switch}={value!r}: the number of K splits is an integer from 1 (no split) to "
                       f"{MAX_SPLITS}")
    return s


def choose_split(spec: KernelSpec, plan: LaunchPlan, params: dict | None, tuned: dict | None, sm_count: int,
                 plain: bool = True) -> Split | None:
    """The split of this launch, or None for one ordinary launch (the module docstring says how)."""
    sk = spec.split_k
    if sk is None:
        return None
    if params is not None:
        requested = requested_splits(params.get(sk.switch, 1), sk.switch, "params:")
    elif tuned and sk.switch in tuned:
        requested = requested_splits(tuned[sk.switch], sk.switch, "tuning-cache entry:")
    else:
        requested = _rule_request(spec, plan.m, plan.n, plan.k, sm_count)
    if requested > 1 and (not plain or (plan.c_trans and not sk.c_trans)):
        if params is not None and params.get(sk.switch, 1) not in (1, "1"):
            why = "a C stored transposed (c_trans)" if plain else "a fused epilogue or a batch"
            raise AsmError(f"params: {sk.switch}={params[sk.switch]!r}: split-K runs only for a plain 2-D GEMM "
                           f"(no fused epilogue, no batch, no transposed store); this call has {why}")
        return None
    return split_for(plan.k, requested, sk.k_multiple)


def _rule_request(spec: KernelSpec, m: int, n: int, k: int, sm_count: int) -> int:
    """The spec's split rules for the kernel's M, N, K; a rule's value is data, kept in range."""
    return max(1, min(spec.split_k.splits(m, n, k, sm_count), MAX_SPLITS))


def untuned_split(spec: KernelSpec, m: int, n: int, k: int, sm_count: int, layout: str = "nn") -> Split | None:
    """What gemm() without params= (and without a tuning entry naming the split) runs for an
    M x N x K call of this layout on fresh operands with a row-major C (a reporting aid: `asmgemm
    bench` shows it next to 'defaults' or 'tuned'): none where the spec's swap rules send the call
    to the transposed store, else the split rules on the sizes."""
    if spec.split_k is None:
        return None
    if untuned_launch(spec, m, n, k, layout, sm_count)[2].get("c_trans"):
        return None
    return split_for(k, _rule_request(spec, m, n, k, sm_count), spec.split_k.k_multiple)


# The most blocks a cluster may have without the non-portable size attribute (CUDA Programming
# Guide, "Thread Block Clusters": 8 is portable; 16 needs cudaFuncAttributeNonPortableClusterSizeAllowed,
# which CuPy's launch does not set).
MAX_CLUSTER_SPLITS = 8


def cluster_splits(spec: KernelSpec, split: Split | None, target: str, params: dict | None = None,
                   plan: LaunchPlan | None = None, sm_count: int = 0) -> int:
    """S where this split runs as one launch, its S blocks of a tile a cluster adding their sums
    through distributed shared memory (the spec's cluster_switch and cluster_when for this plan, a
    target with clusters, S <= 8); 0 where it runs as the partial pass and the reduce kernel (or
    does not split). params= (or a tuning entry) naming the cluster switch asks for one of the two
    whatever cluster_when says (an A/B of the two): 1 the reduce kernel, any other value clusters
    (of the split's S blocks, S <= 8, on a target with clusters). params= naming the fixup switch
    and not the cluster switch ask for a workspace split (the in-kernel sum or the reduce kernel,
    in_kernel_fixup), not clusters; naming both (the fixup switch 1, the cluster switch C of 2..8)
    ask for clusters of C blocks whose sums the kernel adds from a workspace (any S: grid z is S
    rounded up to whole clusters, grid_splits): C is returned."""
    sk = spec.split_k
    if split is None or sk is None or sk.cluster_switch is None:
        return 0
    asked = str(params.get(sk.cluster_switch, "")).strip() if params else ""
    if asked == "1":
        return 0
    if asked and _fixup_asked(sk, params):
        # clusters of `asked` blocks whose sums the last block of each rank adds (any S)
        size = requested_splits(asked, sk.cluster_switch, "params:")
        if size > MAX_CLUSTER_SPLITS:
            raise AsmError(f"params: {sk.cluster_switch}={asked}: a cluster has 2 to {MAX_CLUSTER_SPLITS} blocks "
                           "(the portable cluster size)")
        return size if "clusters" in arch_for(target).features else 0
    if split.splits > MAX_CLUSTER_SPLITS:
        return 0
    if not asked and params and sk.fixup_switch is not None and sk.fixup_switch in params:
        return 0
    if not asked and plan is not None and not sk.in_clusters(plan.m, plan.n, plan.k, sm_count, split.splits):
        return 0
    return split.splits if "clusters" in arch_for(target).features else 0


def _fixup_asked(sk, params: dict | None) -> bool:
    """Whether params= (or a tuning entry) name the fixup switch 1 (AsmError for a value not 0/1)."""
    asked = params.get(sk.fixup_switch) if params and sk.fixup_switch is not None else None
    if asked is None:
        return False
    if str(asked).strip() not in ("0", "1") or isinstance(asked, float):
        raise AsmError(f"params: {sk.fixup_switch}={asked!r}: 1 sums split-K's slices inside the kernel (one "
                       "launch), 0 in the reduce kernel (two)")
    return str(asked).strip() == "1"


def in_kernel_fixup(spec: KernelSpec, split: Split | None, params: dict | None = None, clustered: int = 0) -> bool:
    """Whether this split sums its slices inside the launch from a workspace (the spec's
    fixup_switch) rather than in the reduce kernel: only where params= (or a tuning entry) name
    the fixup switch 1. With `clustered` (cluster_splits: the cluster switch named too) the
    slices are the clusters' sums ("cluster+in_kernel"); without, the partial pass's ("in_kernel").
    The plain in-kernel sum is not the dispatch's choice: on the H100 (2026-11-27, fourth session)
    it doubled the GPU time of small split calls (8880x30x161 bf16: 11.2 -> 23.7 us; random seed
    62's GPU-time geomean 1.104 -> 1.019; docs/log/mma.md, step 6): one block of each tile reads
    all S slices alone. The clusters' version reads S / cluster slices, spread over a cluster's
    worth of blocks a tile (catalog.py offers it past MAX_CLUSTER_SPLITS)."""
    sk = spec.split_k
    if split is None or sk is None or sk.fixup_switch is None:
        return False
    if clustered and not (params and str(params.get(sk.cluster_switch, "")).strip()):
        return False             # clusters of S (cluster_splits' own choice): their sum is C's
    return _fixup_asked(sk, params)


def hybrid_cluster(splits: int) -> int:
    """The cluster size of a "cluster+in_kernel" split of `splits` (> MAX_CLUSTER_SPLITS): 8 or 4,
    whichever rounds the grid up by fewer empty blocks, 8 on a tie (fewer slices to sum; and the
    H100's driver packs clusters of 4 and 8 best, cost_model.cluster_slots)."""
    return min((8, 4), key=lambda c: (-(-splits // c) * c - splits, -c))


def grid_splits(splits: int, clustered: int = 0) -> int:
    """Grid z of a split launch of S = `splits`: S, or S rounded up to whole clusters of
    `clustered` blocks."""
    return -(-splits // clustered) * clustered if clustered else splits


def slices(splits: int, clustered: int = 0) -> int:
    """The workspace slices a one-launch split of S = `splits` sums: S, or one per cluster
    (G = grid z / cluster)."""
    return grid_splits(splits, clustered) // clustered if clustered else splits


def switch_define(spec: KernelSpec, split: Split | None, clustered: int = 0, fixup: bool = False) -> dict:
    """The -D values of the kernel's split-K switches for this launch ({} for a kernel without
    them): they replace the pseudo-parameter S that params= or a tuning entry may carry under the
    switch's name. A split in one cluster (`clustered` = S from cluster_splits) builds with the
    switch off and the cluster switch at S; `fixup` (in_kernel_fixup) sets the fixup switch, which
    a kernel that has one always gets (0 unsplit), so a params= value of it never reaches an
    unsplit build."""
    sk = spec.split_k
    if sk is None:
        return {}
    fix = {} if sk.fixup_switch is None else {sk.fixup_switch: int(bool(fixup and split is not None))}
    if clustered:
        return {sk.switch: 0, sk.cluster_switch: clustered, **fix}
    return {sk.switch: 1 if split is not None else 0, **fix}


def fixup_values(split: Split, plan: LaunchPlan) -> dict:
    """The one-launch split's arguments (ArgPacker's `extra`): C stays the call's; the workspace
    and the counters are pointers of the kept scratch (KeptScratch), given per call."""
    return {"k_chunk": split.k_chunk, "split_stride": plan.m * plan.n}


def fixup_counters(grid_: tuple[int, int, int], clustered: int = 0) -> int:
    """The int32 arrival counters a one-launch split needs: one per tile of C (grid x * grid y;
    the kernel's counter of block (x, y, s) is y * grid x + x), times the cluster's ranks where
    clusters' sums are the slices (rank r's counter: (y * grid x + x) * cluster + r)."""
    return grid_[0] * grid_[1] * max(1, clustered)


def fixup_workspace_elems(split: Split, plan: LaunchPlan, tile_n: int, clustered: int = 0) -> int:
    """fp32 elements of a one-launch split's workspace: its slices (slices()) and tile_n more,
    which the last block's loads of a partial tile's columns past N may read (their sums are never
    stored; the loads stay unguarded: mma_gemm.sasm, SPLIT_FIXUP_TILE)."""
    return slices(split.splits, clustered) * plan.m * plan.n + tile_n


def workspace_plan(plan: LaunchPlan) -> LaunchPlan:
    """The partial pass's launch plan: C is a workspace slice, row-major M x N with ld = N."""
    return replace(plan, c_ptr=0, ldc=plan.n)


def partial_values(split: Split, plan: LaunchPlan) -> dict:
    """The partial pass's split arguments (ArgPacker's `extra`)."""
    return {"k_chunk": split.k_chunk, "split_stride": plan.m * plan.n}


@functools.lru_cache(maxsize=None)
def reduce_spec(spec: KernelSpec) -> KernelSpec:
    """The reduce kernel of a split-K spec, as a spec the build cache can build and check (its abi,
    its launch constants); not a GEMM anyone launches by name."""
    sk = spec.split_k
    if sk is None:
        raise AsmError(f"kernel '{spec.name}' has no split_k table")
    d = spec.dtypes
    return KernelSpec(f"{spec.name}.split_k.reduce", sk.reduce, "splitk_reduce",
                      f"split-K reduction for {spec.name}", Dtypes(d.acc, d.acc, d.acc, d.c), spec.targets, REDUCE_ABI,
                      (), spec.rel_err_limit, Launch("THREADS", "ROWS", "COLS", "SMEM_BYTES"), (), spec.spec_file)


def reduce_defines(spec: KernelSpec, plan: LaunchPlan) -> dict:
    """C_TYPE from the spec's C dtype; VEC=1 where 4-column vectors are aligned: N % 4 == 0 (every
    workspace row then starts 16-byte aligned), ldc % 4 == 0 and C aligned to 4 elements."""
    c_type = C_TYPES.get(spec.dtypes.c)
    if c_type is None:
        raise AsmError(f"split-K: the reduce writes C as {', '.join(C_TYPES)}; kernel '{spec.name}' has C "
                       f"{spec.dtypes.c}")
    vec = plan.n % 4 == 0 and plan.ldc % 4 == 0 and plan.c_ptr % (4 * plan.itemsize) == 0
    # C_T: the launch stores C transposed (its clusters and the reduce alike; SplitK.c_trans)
    return {"C_TYPE": c_type, "VEC": int(vec), **({"C_T": 1} if plan.c_trans else {})}


def reduce_grid(built, plan: LaunchPlan) -> tuple[int, int, int]:
    """Blocks of COLS columns (tile_n) across N, one row per block row; rows past the grid's y
    limit are walked by the kernel (row += nctaid.y)."""
    return math.ceil(plan.n / built.tile_n), max(1, min(plan.m, MAX_GRID_Y)), 1


def reduce_values(split: Split, plan: LaunchPlan) -> dict:
    """The reduce's split arguments (ArgPacker's `extra`; M, N, ldc come from the plan)."""
    return {"splits": split.splits, "split_stride": plan.m * plan.n}


class SplitLaunch:
    """The reduce half of a kept split-K launch plan (the partial half is the plan's own kernel,
    built with the switch on, its grid's z = S and k_chunk / split_stride in its packed arguments)."""

    __slots__ = ("split", "built", "fn", "fn_key", "grid", "block", "packer", "workspace_shape", "workspace_elems",
                 "raw")

    def __init__(self, split: Split, built, fn, fn_key, grid_, packer, m: int, n: int):
        self.split, self.built, self.fn, self.fn_key = split, built, fn, fn_key
        self.grid, self.block, self.packer = grid_, (built.threads, 1, 1), packer
        self.workspace_shape = (split.splits, m, n)
        self.workspace_elems = split.workspace_elems(m, n)
        # the reduce's (launch, handle, ParamBlock) for cuLaunchKernel, set with the plan's own
        # (kept_launch.use_raw_launch); None: fn's call
        self.raw = None

    def launch(self, gemm_fn, gemm_grid, gemm_block, gemm_smem, gemm_packer, a_ptr: int, b_ptr: int, c_ptr: int,
               alpha, beta, stream, workspace_ptr: int, gemm_raw=None, stream_ptr: int = 0) -> None:
        """The partial pass into the workspace, then the reduce into C, on one stream (through
        cuLaunchKernel on stream_ptr where gemm_raw and self.raw are given)."""
        if workspace_ptr % 16:
            raise AsmError(f"split-K workspace at 0x{workspace_ptr:x} is not 16-byte aligned (the reduce reads it "
                           "128 bits at a time)")
        if gemm_raw is not None and self.raw is not None:
            launch_block(gemm_raw, gemm_grid, gemm_block, gemm_smem, stream_ptr, a_ptr, b_ptr, workspace_ptr, 1.0, 0.0)
            launch_block(self.raw, self.grid, self.block, 0, stream_ptr, workspace_ptr, 0, c_ptr, alpha, beta)
            return
        kw = {} if stream is None else {"stream": stream}
        gemm_fn(gemm_grid, gemm_block, gemm_packer.pack(a_ptr, b_ptr, workspace_ptr, 1.0, 0.0), shared_mem=gemm_smem,
                **kw)
        self.fn(self.grid, self.block, self.packer.pack(workspace_ptr, 0, c_ptr, alpha, beta), shared_mem=0, **kw)


def rerun_params(spec_name: str, params: dict, split: Split | None, summed_in_kernel: bool,
                 cluster_splits: int) -> dict:
    """params= for a build's configuration (its -D values `params`): a plain build's split-K switch
    is 0, while params= name a split by its count (S of a partial pass whose reduce is a kernel, or
    that sums itself: then the fixup switch says which, 1 in the kernel, 0 the reduce kernel; S of
    a split summed in clusters, whose build's cluster switch is S already: without the count,
    params= would build the cluster kernel for an unsplit grid)."""
    rerun = {k: int(v) for k, v in params.items()}
    split_spec = get_spec(spec_name).split_k
    if split_spec is not None:
        rerun.pop(split_spec.switch, None)
        if split_spec.fixup_switch is not None:
            rerun.pop(split_spec.fixup_switch, None)
        if split is not None:
            rerun[split_spec.switch] = split.splits
            if split_spec.fixup_switch is not None:
                rerun[split_spec.fixup_switch] = int(summed_in_kernel)
        elif cluster_splits:
            rerun[split_spec.switch] = cluster_splits
    return rerun
