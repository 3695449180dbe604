"""Kernel specs: what the runtime, `run`, `bench`, `tune` and `kernels` need to know about a GEMM
kernel beyond its .sasm source. One TOML table per kernel; the shipped ones are in
kernels_ptx/kernels.toml, and more spec files can be named in $ASMGEMM_KERNEL_SPECS (paths joined
by ':') or registered from Python with `register(load_spec_file(path))`.

A table (every key is checked; an unknown one is an error, so a typo never passes silently):

    [NAME]                              # the kernel's name: asmgemm run NAME, gemm(..., kernel=NAME)
    like = "OTHER"                      # start from the table OTHER above in this file (its entry
                                        # too); every key given here replaces OTHER's whole key
    source = "sgemm.sasm"               # relative to the spec file
    entry = "sgemm"                     # the .entry to launch (default: NAME)
    summary = "one line"
    dtypes = { a = "float32", b = "float32", acc = "float32", c = "float32" }
    targets = ["sm_80", "sm_90"]        # targets it is built for; sm_90a-only kernels list "sm_90a"
    abi = ["A", "B", "C", "M", ...]     # the entry's .param list, in order, from the runtime's
                                        # argument vocabulary (ARGUMENTS below); types are checked
                                        # against the built PTX
    call_params = { TRANS_A = "trans_a", ... }   # -D parameters the runtime derives from the call
    defines = { BF16 = 1 }              # -D parameters fixed for this kernel (one source, several
                                        # kernels: e.g. the bf16 HGEMM is hgemm.sasm with BF16=1)
    rel_err_limit = 1e-4                # ‖C − ref‖/‖ref‖ against float64 that a correct result stays under
    [NAME.launch]                       # launch geometry: names of constants of the built kernel
    threads = "THREADS"; tile_m = "TM"; tile_n = "TN"; smem_bytes = "SMEM_BYTES"; grid = "tiles" (or "persistent")
    box_rows_a = "BOX_A_ROWS"; box_rows_b = "BOX_B_ROWS"   # TMA box heights (kernels taking tmap_a/b)
    cluster = "CLUSTER_M"               # blocks per cluster (the kernel's .reqnctapercluster x); grid
                                        # "persistent" then walks units of that many tile rows
    cluster_rows = "CLUSTER_M"          # tile rows of such a unit, when not the cluster's size (hgemm's
                                        # CLUSTER_K blocks split one tile's K instead: one row a unit)
    cluster_cols = "CLUSTER_N"          # tile columns of a unit (default 1; rows default to cluster / cols)
    c_stream = "C_STREAM"               # a switch the runtime sets to 1 where C is larger than the GPU's L2:
                                        # C's stores then evict first (they would only push out A and B)
    [NAME.terms]                        # optional: named subexpressions the size rules may use,
    TILES_128 = "ceil_div(M, 128) * ceil_div(N, 128)"   # each over the names a size rule sees and
                                        # the terms above it (in file order); NAME = "expression"
    [[NAME.size_rule]]                  # the untuned choice: the first rule whose `when` holds wins
    when = "2 * ceil_div(M, 128) * ceil_div(N, 128) <= SMS"    # asmgemm's expression language
    set = { THREADS = 64, BK = 16 }     # names M, N, K (after the operand swap), SMS (SM count),
                                        # the call parameters (e.g. ACT; 0 where a caller gives none)
                                        # PITCH_A, PITCH_B (bytes between the stored rows of the
                                        # kernel's A and B), C_BYTES (bytes of C's dtype) and the
                                        # terms (these three: size rules only)
    [NAME.split_k]                      # optional: split-K (runtime/split_k.py) for plain 2-D calls
    switch = "SPLIT_K"                  # the kernel's 0/1 parameter that builds the partial pass
                                        # (abi needs k_chunk and split_stride; grid z = splits)
    reduce = "splitk_reduce.sasm"       # the reduction kernel, relative to the spec file
    k_multiple = 16                     # k_chunk is a multiple of this (default 16; hgemm: 64)
                                        # (grid "tiles": z = splits; "persistent": S copies of the walk)
    cluster_switch = "CLUSTER_K"        # optional, grid "tiles": on targets with clusters (sm_90+) a
                                        # split of S <= 8 is one launch instead, built with
                                        # CLUSTER_K=S and SPLIT_K=0: grid z = S, the S blocks of a tile
                                        # one cluster (.reqnctapercluster 1, 1, S) adding their sums
                                        # in rank order; no workspace, no reduce kernel
    cluster_when = "N * S <= 30000"     # optional: only where this holds (M, N, K, SMS and S)
    fixup_switch = "SPLIT_FIXUP"        # optional, grid "tiles": a split is one launch instead, built
                                        # with the switch and SPLIT_FIXUP=1: the partial pass's last
                                        # block of each tile (an atomic count per tile in the abi's
                                        # tile_counters) sums the slices of the abi's `workspace`
                                        # into C, as the reduce kernel would; the reduce stays for
                                        # params= naming SPLIT_FIXUP=0
    [[NAME.split_k.rule]]               # the untuned number of splits S: the first rule whose
    when = "M * N <= 65536"             # `when` holds gives `splits` (an expression in M, N, K,
    splits = "min(K // 256, 8)"         # SMS); none, or S <= 1: no split
    # or: candidates and a cost model, the candidate of least `cost` (an expression in M, N, K,
    # SMS and S, the candidate) wins, the earlier one on a tie:
    #   splits = [1, 2, 3, 4]; cost = "ceil_div(ceil_div(M, 128) * ceil_div(N, 128) * S, SMS) * K / S"
    [[NAME.route]]                      # optional: an untuned 2-D call (no params=) runs another
    when = "M <= 16 and TRANS_B == 0"   # kernel of the same dtypes where `when` holds (sizes and
    kernel = "sgemm_skinny"             # this kernel's call parameters); the first that holds wins
    in_place = "hgemm_mma"              # optional: a kernel of the same dtypes that reads any operand
                                        # in place; where this kernel would first copy an operand
                                        # into padded storage (TMA cannot read its rows), the
                                        # runtime's path model (runtime/path_model.py) picks the
                                        # copy or that kernel, whichever it expects to finish first
    [[NAME.swap_rule]]                  # optional: a row-major C computed as C^T = op(B)^T op(A)^T
    when = "M <= 64 and TRANS_A == 0"   # (the operand swap), the kernel storing its result
                                        # transposed (call value c_trans, which call_params must
                                        # map); `when` sees the user's sizes and the unswapped call
                                        # parameters; any rule that holds swaps
    sass_patch = { reuse = true }       # optional: control-code passes on the cubin after ptxas
                                        # (SASS_PATCH_KEYS: reuse, stall, yield_every, rules = a
                                        # rules file); checked at build, run only by name

Pure data and checks: nothing here builds, imports CuPy or touches a GPU.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from .environment import env_value
from .errors import AsmError
from .expr import evaluate
from .parse_tree import parse_expression
from .source import SourceFile, Span
from .targets import SUPPORTED_TARGETS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SPECS_ENV = "ASMGEMM_KERNEL_SPECS"

# The runtime's argument vocabulary: a name in `abi` -> the PTX .param types it may have. A new
# argument kind (a batch stride) is added here and in runtime/launch.py.
ARGUMENTS: dict[str, tuple[str, ...]] = {
    "A": (".u64", ".b64", ".s64"), "B": (".u64", ".b64", ".s64"), "C": (".u64", ".b64", ".s64"),
    "M": (".u32", ".s32", ".b32"), "N": (".u32", ".s32", ".b32"), "K": (".u32", ".s32", ".b32"),
    "lda": (".u32", ".s32", ".b32"), "ldb": (".u32", ".s32", ".b32"), "ldc": (".u32", ".s32", ".b32"),
    "alpha": (".f32", ".f64"), "beta": (".f32", ".f64"),
    # TMA tensor maps of A and B (runtime/tensor_map.py): a CUtensorMap passed by value,
    # `.param .align 64 .b8 name[128]`; the spec's launch table names the box heights.
    "tmap_a": (".b8",), "tmap_b": (".b8",), "tmap_c": (".b8",),
    # the fused epilogue's bias vector (gemm(bias=...)): a generic pointer, 0 when the call has none
    "bias": (".u64", ".b64", ".s64"),
    # batched kernels (call value "batched"): elements between the batches of the kernel's A, B and
    # C (after the operand swap); 0 = one matrix shared by every batch
    "batch_stride_a": (".u64", ".b64", ".s64"), "batch_stride_b": (".u64", ".b64", ".s64"),
    "batch_stride_c": (".u64", ".b64", ".s64"),
    # ... and the count of matrices, for a kernel whose persistent grid walks the whole batch (hgemm)
    "batch": (".u32", ".s32", ".b32"),
    # grouped kernels (call value "grouped", asmgemm.grouped_gemm): the device's int32 end rows of
    # the problems (a pointer the host never reads) and their count
    "offs": (".u64", ".b64", ".s64"), "groups": (".u32", ".s32", ".b32"),
    # split-K (runtime/split_k.py): the GEMM's partial pass takes the k extent of one split and the
    # elements between two workspace slices; the reduce kernel takes the workspace W and S.
    "k_chunk": (".u32", ".s32", ".b32"), "split_stride": (".u64", ".s64", ".b64"),
    "W": (".u64", ".b64", ".s64"), "splits": (".u32", ".s32", ".b32"),
    # split-K summed inside the partial pass ([NAME.split_k] fixup_switch): the slices' workspace
    # (C is then the call's own) and one int32 arrival counter per tile of C, zero between launches
    "workspace": (".u64", ".b64", ".s64"), "tile_counters": (".u64", ".b64", ".s64"),
    # the runtime's padded copy of an operand TMA cannot read (pad_rows.sasm, runtime/pad_copy.py):
    # source and copy, the source matrix's end (its last byte + 1), the two row pitches in bytes,
    # the rows and the bytes of each
    "src": (".u64", ".b64", ".s64"), "dst": (".u64", ".b64", ".s64"), "src_end": (".u64", ".b64", ".s64"),
    "src_pitch": (".u64", ".b64", ".s64"), "dst_pitch": (".u32", ".s32", ".b32"),
    "rows": (".u32", ".s32", ".b32"), "row_bytes": (".u32", ".s32", ".b32"),
}
# Arguments passed as a .param array: their element count.
ARRAY_ARGUMENTS = {"tmap_a": 128, "tmap_b": 128, "tmap_c": 128}
# -D parameters the runtime can derive from a call (runtime/plan.py computes them).
CALL_VALUES = ("trans_a", "trans_b", "vec_a", "vec_b", "vec_c", "wide_c",
               # c_piece: the widest aligned piece (16, 8, 4 bytes, else C's element size) that every
               # row of C is a whole number of (wide_c is c_piece == 16); the element size for c_trans
               "c_piece",
               # the fused epilogue (gemm(bias=, activation=)), after the operand swap:
               # bias: 0 none, 1 one value per kernel column n, 2 one per kernel row m (BIAS_MODES);
               # activation: 0 none, then ACTIVATIONS in order (1 relu, 2 gelu, 3 gelu_tanh, 4 silu)
               "bias", "activation",
               # batched: 1 when the launch runs a batch (grid z = batch, batch_stride_* arguments)
               "batched",
               # grouped: 1 when the launch runs grouped problems along M (offs, groups arguments)
               "grouped",
               # c_trans: 1 when a row-major C is computed through the operand swap and the kernel
               # stores its M x N result transposed (element (i, j) at C + j * ldc + i; [[NAME.swap_rule]])
               "c_trans",
               # a_ldg: 1 when the kernel's A is K-contiguous with rows TMA cannot address (base or
               # leading dimension not a multiple of 16 bytes) and K <= LDG_A_MAX_K (runtime/plan.py):
               # a kernel mapping it reads A by its own loads; one that does not gets a padded copy
               "a_ldg",
               # align_a, align_b: the widest copy (16, 8, 4 or 2 bytes) every row of the kernel's
               # A (B) allows: the largest of those dividing its base address and its row pitch
               "align_a", "align_b",
               # shifted_c: 1 when C is 16-bit, row-major and unswapped but its rows are not whole,
               # aligned 16-byte pieces (wide_c 0): a kernel mapping it stages the tile with each
               # row shifted to C's 16-byte boundaries and stores whole aligned pieces (hgemm)
               "shifted_c")
BIAS_MODES = {"none": 0, "column": 1, "row": 2}
ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
_ACTIVATION_CODES = {None: 0, **{name: i + 1 for i, name in enumerate(ACTIVATIONS)}}


def activation_code(activation) -> int:
    """gemm(activation=...) -> the "activation" call value (0: None, then ACTIVATIONS in order)."""
    try:
        return _ACTIVATION_CODES[activation]
    except (KeyError, TypeError):
        raise AsmError(f"unknown activation {activation!r}: the fused epilogue has "
                       f"{', '.join(repr(a) for a in ACTIVATIONS)} (or None)",
                       hint="PyTorch's definitions: gelu is the exact erf form, gelu_tanh is approximate='tanh'") from None
# tiles: (ceil(N / tile_n), ceil(M / tile_m), batch), a block per tile of C (batch: 1 unless the
# kernel maps the call value "batched").
_BATCH_STRIDES = ("batch_stride_a", "batch_stride_b", "batch_stride_c")
# what a grouped kernel takes: the problems' end rows, their count, and B's stride between problems
_GROUPED_ABI = ("offs", "groups", "batch_stride_b")
# persistent: (min(units, SMs / cluster) * cluster, 1, 1): each cluster walks units (`cluster_rows`,
# by default `cluster` / `cluster_cols`, tile rows by `cluster_cols`, by default 1, tile columns)
# clusterid.x, + nclusterid.x, ... itself.
GRIDS = ("tiles", "persistent")
DTYPES = ("float32", "float64", "float16", "bfloat16")
DTYPE_ITEMSIZE = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}   # bytes (numpy knows no bfloat16)
SIZE_NAMES = ("M", "N", "K", "SMS")
# What a size rule sees of the operands besides their sizes: the bytes between consecutive stored rows
# of the kernel's A and B (after the operand swap; a padded copy's own), since a row pitch that is no
# multiple of 256 bytes costs TMA loads whole extra L2 lines (docs/log/hgemm.md, "L2 promotion")
# and can favour another tiling. Fresh contiguous operands where a caller gives none.
PITCH_NAMES = ("PITCH_A", "PITCH_B")
# ... and the bytes of one element of C (the spec's C dtype): kernels that share a source and its
# rules (`like`) may store C in another type, and the epilogue's share of the time with it
# (hgemm_f32c's fp32 pair stores against hgemm's 16-bit ones: docs/log/hgemm.md).
C_BYTES_NAME = "C_BYTES"
# ... and, of the GPU besides its SM count, its DRAM's nominal bytes per SM and SM clock cycle
# (runtime/gpu.py, DeviceFacts.dram_per_sm_cycle: 2 x memory clock x bus width / (SMs x clock),
# rounded down): whether a launch's C stores or its SMs bound it turns on that ratio, not on the
# SM count alone (hgemm's rule 1c: one consumer a block pays where DRAM bounds the stores, the H100's
# 12; two where the SMs do, the H200's 18). Where the caller knows no GPU (plans made on the CPU, the
# golden walks, scripts' defaults) the H100 SXM's, the GPU the rules were measured on.
DRAM_RATE_NAME = "DRAM_PER_SM_CYCLE"
H100_DRAM_PER_SM_CYCLE = 12         # 3.35e12 B/s / (132 SMs x 1.98e9 Hz) = 12.8

_TOP_KEYS = {"source", "entry", "summary", "dtypes", "targets", "abi", "call_params", "defines", "rel_err_limit",
             "launch", "terms", "size_rule", "like", "split_k", "route", "swap_rule", "in_place", "config",
             "sass_patch"}
# `sass_patch = { ... }`: control-code passes applied to the cubin after ptxas (issue 35,
# docs/design/sass-patching.md), opt-in: a kernel table that has it is its own kernel name, run only
# where a call says kernel="NAME" (the cost model never picks it). key -> (the keyword of
# asmgemm.sass.patch.plan_patch it sets, the value type it takes). "rules" names a rules file
# (asmgemm patch's format) relative to the spec file.
# The reorder pass goes by "experimental_reorder": its check once accepted an sgemm that faulted on
# the H100 (docs/design/sass-patching.md), so a table must say plainly that it runs it.
# reorder_blocks / reorder_moves apply only part of it (0: all), for tools/reorder_bisect.py.
SASS_PATCH_KEYS = {"reuse": ("reuse_pass", bool), "stall": ("stall_pass", bool), "yield_every": ("yield_every", int),
                   "experimental_reorder": ("reorder_pass", bool), "reorder_blocks": ("reorder_blocks", int),
                   "reorder_moves": ("reorder_moves", int), "rules": ("rules", str)}
_CONFIG_KEYS = {"name", "kernel", "set", "tile", "tile_kmajor_b", "splits", "max_m", "note", "swap", "cluster"}
_SPLIT_K_KEYS = {"switch", "reduce", "rule", "k_multiple", "cluster_switch", "cluster_when", "c_trans",
                 "fixup_switch"}
# what a kernel with a split_k table must take: the partial pass's k extent and slice distance
SPLIT_K_ABI = ("k_chunk", "split_stride")
# and one with a fixup_switch: the slices' workspace and the tiles' arrival counters
SPLIT_FIXUP_ABI = ("workspace", "tile_counters")
_LAUNCH_KEYS = {"threads", "tile_m", "tile_n", "smem_bytes", "grid", "box_rows_a", "box_rows_b", "box_rows_c",
                "cluster", "cluster_rows", "cluster_cols", "c_stream"}
# abi argument -> the launch key naming the constant it needs
_NEEDS_LAUNCH_KEY = {"tmap_a": "box_rows_a", "tmap_b": "box_rows_b", "tmap_c": "box_rows_c"}


@dataclass(frozen=True)
class Dtypes:
    a: str
    b: str
    acc: str
    c: str


@dataclass(frozen=True)
class Launch:
    threads: str          # constant names in the built kernel
    tile_m: str
    tile_n: str
    smem_bytes: str
    grid: str = "tiles"
    box_rows_a: str | None = None   # TMA box heights, for kernels that take tmap_a / tmap_b
    box_rows_b: str | None = None
    box_rows_c: str | None = None   # the box height of C's tensor map (kernels storing C by TMA)
    cluster: str | None = None      # blocks per cluster along the grid's x (.reqnctapercluster); default 1
    cluster_rows: str | None = None  # tile rows of a persistent cluster's unit; default: the cluster's blocks
    cluster_cols: str | None = None  # tile columns of that unit; default 1 (hgemm's CLUSTER_N)
    c_stream: str | None = None     # the switch storing C evict-first in L2 (launch_config.c_stream_defines)


@dataclass(frozen=True)
class Term:
    """One entry of `[NAME.terms]`: a name for an expression the size rules repeat (the tile counts
    of one tiling, say), evaluated over what a size rule sees and the terms before it."""

    name: str
    text: str
    tree: object = field(compare=False, repr=False, default=None)


@dataclass(frozen=True)
class SizeRule:
    """One `[[NAME.size_rule]]`: where `when` holds, the untuned call runs with `set`. `when` sees
    the sizes (SIZE_NAMES, after the operand swap), this kernel's call parameters (e.g. ACT:
    a fused activation can favour another tile than the plain GEMM), the operands' row pitches
    (PITCH_NAMES), C's element size (C_BYTES_NAME) and the GPU's DRAM rate (DRAM_RATE_NAME)."""

    when: str
    set: tuple[tuple[str, int], ...]
    tree: object = field(compare=False, repr=False, default=None)

    def holds(self, m: int, n: int, k: int, sms: int, call_defines: dict | None = None) -> bool:
        return bool(_evaluate_sizes(self.tree, m, n, k, sms, call_defines, "a size rule"))


def _evaluate_sizes(tree, m: int, n: int, k: int, sms: int, more: dict | None = None, what: str = "a size rule"):
    """A rule expression over the launch's sizes (SIZE_NAMES) and the names in `more`."""
    values = {"M": m, "N": n, "K": k, "SMS": sms, **(more or {})}

    def lookup(name, span):
        if name in values:
            return values[name]
        raise AsmError(f"undefined name '{name}' in {what} (known: {', '.join(values)})", span)
    return evaluate(tree, lookup)


@dataclass(frozen=True)
class Route:
    """One `[[NAME.route]]`: where `when` holds, an untuned 2-D call of this kernel runs `kernel`
    instead (same dtypes; e.g. sgemm sends M <= 16 to sgemm_skinny). `when` sees the sizes
    (SIZE_NAMES, after the operand swap) and this kernel's call parameters (e.g. TRANS_B)."""

    when: str
    kernel: str
    tree: object = field(compare=False, repr=False, default=None)

    def holds(self, m: int, n: int, k: int, sms: int, call_defines: dict) -> bool:
        return bool(_evaluate_sizes(self.tree, m, n, k, sms, call_defines, "a route"))


@dataclass(frozen=True)
class SwapRule:
    """One `[[NAME.swap_rule]]`: where `when` holds, a row-major C is computed as C^T through the
    operand swap with the kernel's transposed store (call value c_trans): for few rows of C, whose
    count would otherwise be padded to the kernel's tile height. `when` sees the user's sizes and
    this kernel's call parameters before the swap."""

    when: str
    tree: object = field(compare=False, repr=False, default=None)

    def holds(self, m: int, n: int, k: int, sms: int, call_defines: dict) -> bool:
        return bool(_evaluate_sizes(self.tree, m, n, k, sms, call_defines, "a swap rule"))


@dataclass(frozen=True)
class SplitRule:
    """One `[[NAME.split_k.rule]]`: where `when` holds, `splits` is the number of K splits: an
    expression, or (with `cost`) the candidate whose modelled cost is least, so that the model a
    rule was fitted with stays readable in the spec instead of being folded into a formula."""

    when: str
    splits: str | tuple[int, ...]
    when_tree: object = field(compare=False, repr=False, default=None)
    splits_tree: object = field(compare=False, repr=False, default=None)
    cost: str | None = None
    cost_tree: object = field(compare=False, repr=False, default=None)

    def holds(self, m: int, n: int, k: int, sms: int) -> bool:
        return bool(_evaluate_sizes(self.when_tree, m, n, k, sms))

    def count(self, m: int, n: int, k: int, sms: int) -> int:
        if self.cost_tree is not None:
            return min(self.splits, key=lambda s: self.cost_of(m, n, k, sms, s))    # min keeps the first tie
        value = _evaluate_sizes(self.splits_tree, m, n, k, sms)
        if isinstance(value, bool) or not isinstance(value, int):
            raise AsmError(f"split_k rule: splits = '{self.splits}' gave {value!r} for M={m} N={n} K={k} SMS={sms}, "
                           "not an integer", hint="use // and ceil_div for integer division")
        return value

    def cost_of(self, m: int, n: int, k: int, sms: int, s: int) -> float:
        """The rule's modelled cost of S = s splits (the rule must have a `cost`)."""
        value = _evaluate_sizes(self.cost_tree, m, n, k, sms, {"S": s}, "a split rule's cost")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise AsmError(f"split_k rule: cost = '{self.cost}' gave {value!r} for M={m} N={n} K={k} SMS={sms} S={s}, "
                           "not a number")
        return value


@dataclass(frozen=True)
class SplitK:
    """A kernel's split-K support ([NAME.split_k]): the kernel parameter that builds its partial
    pass, the reduction kernel's source, and the rules choosing the number of splits."""

    switch: str
    reduce: Path
    rules: tuple[SplitRule, ...] = ()
    # k_chunk is a multiple of this: whole K tiles of the partial pass's kernel (sgemm: BK <= 16;
    # hgemm: BK = 64, its TMA box origins along K)
    k_multiple: int = 16
    # the kernel parameter that splits K over a cluster of S blocks along grid z instead (None: the
    # kernel has no such mode; runtime/split_k.py, cluster_splits)
    cluster_switch: str | None = None
    cluster_when: str | None = None          # where a split may run in clusters (None: always)
    cluster_when_tree: object = field(compare=False, repr=False, default=None)
    # whether a launch with the transposed store (c_trans) may split: the kernel's clusters and the
    # reduce kernel (C_T) store C transposed too
    c_trans: bool = False
    # the kernel parameter that makes the partial pass's last block of each tile sum the slices
    # into C (one launch; runtime/split_k.py, in_kernel_fixup); None: the kernel has no such mode
    fixup_switch: str | None = None

    def in_clusters(self, m: int, n: int, k: int, sms: int, s: int) -> bool:
        """Whether S = s splits of this launch may run in clusters (cluster_switch, cluster_when)."""
        if self.cluster_switch is None:
            return False
        return self.cluster_when_tree is None or bool(
            _evaluate_sizes(self.cluster_when_tree, m, n, k, sms, {"S": s}, "split_k.cluster_when"))

    def splits(self, m: int, n: int, k: int, sms: int) -> int:
        """The untuned number of splits for an M x N x K launch (1: none)."""
        for rule in self.rules:
            if rule.holds(m, n, k, sms):
                return rule.count(m, n, k, sms)
        return 1


@dataclass(frozen=True)
class ConfigEntry:
    """One `[[NAME.config]]`: a named configuration of a kernel family's catalog, which the cost
    model (asm/runtime/cost_model.py) ranks for each call. `kernel`: the spec it builds (this
    family's own, or another of its dtypes, e.g. sgemm_skinny); `set`: its -D parameters; `tile`:
    (rows, columns, k) of C and K one block covers per K step (the model's unit of work; a test
    builds every entry and checks it against the kernel's own launch constants); `splits`: the
    split-K counts the model may pair it with (1: unsplit); `max_m`: the largest kernel M the
    configuration is meant for (its domain: a GEMV kernel is legal at M = 4096, but nobody should
    run it there, and the model was never fitted there); `swap`: the configuration runs the call
    as C^T = op(B)^T op(A)^T with the kernel's transposed store (its c_trans parameter), so its M
    is the call's N (a skinny kernel serving few columns)."""
    name: str
    kernel: str
    set: tuple[tuple[str, int], ...]
    tile: tuple[int, int, int]
    splits: tuple[int, ...] = (1,)
    max_m: int | None = None
    note: str = ""
    swap: bool = False
    tile_kmajor_b: tuple[int, int, int] | None = None    # the tile where the kernel's B is K-major, if other
    # blocks of one cluster along C's rows, C's columns and K: tiles that share their loads
    # (multicast: a persistent kernel walks such a cluster of tiles as one unit, so tile rows and
    # columns round up to whole clusters) and blocks that split one tile's K among them (the kernel
    # sums them itself: no workspace, no split-K switch). (1, 1, 1): none
    cluster: tuple[int, int, int] = (1, 1, 1)

    def tile_for(self, trans_b: int) -> tuple[int, int, int]:
        """The tile of a launch whose B is K-major (trans_b) or not: a kernel may lay its work out
        differently for each (gemm_skinny: 128 columns a block row-major, 32 K-major)."""
        return self.tile_kmajor_b if trans_b and self.tile_kmajor_b is not None else self.tile


@dataclass(frozen=True)
class KernelSpec:
    name: str
    source: Path
    entry: str
    summary: str
    dtypes: Dtypes
    targets: tuple[str, ...]
    abi: tuple[str, ...]
    call_params: tuple[tuple[str, str], ...]     # (-D name, call value)
    rel_err_limit: float
    launch: Launch
    size_rules: tuple[SizeRule, ...]
    spec_file: Path
    defines: tuple[tuple[str, int], ...] = ()    # fixed -D parameters of this kernel
    split_k: SplitK | None = None                # split-K support ([NAME.split_k]); None: none
    routes: tuple[Route, ...] = ()               # other kernels for some calls ([[NAME.route]])
    swap_rules: tuple[SwapRule, ...] = ()        # C^T with a transposed store ([[NAME.swap_rule]])
    terms: tuple[Term, ...] = ()                 # named subexpressions of the size rules ([NAME.terms])
    in_place: str | None = None                  # a kernel reading any operand in place (`in_place`)
    configs: tuple[ConfigEntry, ...] = ()        # the family's catalog ([[NAME.config]]): the cost model picks
    # control-code passes after ptxas (`sass_patch`, SASS_PATCH_KEYS order), "rules" as a resolved
    # path string; () for ptxas's own code
    sass_patch: tuple[tuple[str, object], ...] = ()

    def route_for(self, m: int, n: int, k: int, sms: int, call_defines: dict) -> str | None:
        """The kernel the first route that holds names for this launch, or None (run this one)."""
        for route in self.routes:
            if route.holds(m, n, k, sms, call_defines):
                return route.kernel
        return None

    def swaps(self, m: int, n: int, k: int, sms: int, call_defines: dict) -> bool:
        """Whether an M x N x K call with a row-major C runs as C^T with the transposed store."""
        return any(rule.holds(m, n, k, sms, call_defines) for rule in self.swap_rules)

    def size_rule(self, m: int, n: int, k: int, sms: int, call_defines: dict | None = None,
                  pitches: dict | None = None, dram_per_sm_cycle: int | None = None) -> dict[str, int]:
        """The untuned -D overrides for an M x N x K launch (after the operand swap) on a GPU with
        `sms` SMs and the call's parameters `call_defines` (those not given count as 0: no bias,
        no activation, operands as stored), row pitches `pitches` (PITCH_NAMES; default: those of
        contiguous operands, self.fresh_pitches) and DRAM rate `dram_per_sm_cycle` (DRAM_RATE_NAME;
        None: the H100's): the first rule that holds; {} keeps the source defaults."""
        i = self.size_rule_index(m, n, k, sms, call_defines, pitches, dram_per_sm_cycle)
        return {} if i is None else dict(self.size_rules[i].set)

    def size_rule_index(self, m: int, n: int, k: int, sms: int, call_defines: dict | None = None,
                        pitches: dict | None = None, dram_per_sm_cycle: int | None = None) -> int | None:
        """The position in self.size_rules of the rule size_rule takes (the first that holds; the
        same arguments), or None where none holds (the source's defaults)."""
        calls = {**dict.fromkeys((p for p, _ in self.call_params), 0), **(call_defines or {})}
        names = {**calls, **(pitches if pitches is not None else self.fresh_pitches(m, n, k, calls)),
                 C_BYTES_NAME: DTYPE_ITEMSIZE[self.dtypes.c],
                 DRAM_RATE_NAME: H100_DRAM_PER_SM_CYCLE if dram_per_sm_cycle is None else int(dram_per_sm_cycle)}
        _add_terms(self.terms, names, m, n, k, sms)
        return next((i for i, rule in enumerate(self.size_rules) if rule.holds(m, n, k, sms, names)), None)

    def fresh_pitches(self, m: int, n: int, k: int, call_defines: dict) -> dict[str, int]:
        """PITCH_NAMES of contiguous operands of an M x N x K launch whose orientation the call
        parameters give (trans_a: A stored K x M; trans_b: B stored N x K)."""
        def flag(value: str) -> bool:
            param = self.call_value_param(value)
            return bool(param and call_defines.get(param))
        return {"PITCH_A": (m if flag("trans_a") else k) * DTYPE_ITEMSIZE[self.dtypes.a],
                "PITCH_B": (k if flag("trans_b") else n) * DTYPE_ITEMSIZE[self.dtypes.b]}

    def build_target(self, device_target: str) -> str | None:
        """The target to build for on a device of `device_target` (sm_90 runs sm_90a code too),
        or None when the kernel does not support that device."""
        if device_target in self.targets:
            return device_target
        if device_target + "a" in self.targets:
            return device_target + "a"
        return None

    def call_value_param(self, value: str) -> str | None:
        """The -D parameter this kernel maps the call value `value` onto, or None (e.g. a kernel
        without a fused epilogue has no parameter for "bias" or "activation")."""
        for param, v in self.call_params:
            if v == value:
                return param
        return None

    def to_json(self) -> dict:
        return {"name": self.name, "source": str(self.source), "entry": self.entry, "summary": self.summary,
                "dtypes": vars(self.dtypes), "targets": list(self.targets), "abi": list(self.abi),
                "call_params": dict(self.call_params), "rel_err_limit": self.rel_err_limit,
                "launch": vars(self.launch), "terms": {t.name: t.text for t in self.terms},
                "size_rules": [{"when": r.when, "set": dict(r.set)} for r in self.size_rules],
                "defines": dict(self.defines), "spec_file": str(self.spec_file),
                "split_k": None if self.split_k is None else {
                    "switch": self.split_k.switch, "reduce": str(self.split_k.reduce),
                    "k_multiple": self.split_k.k_multiple, "cluster_switch": self.split_k.cluster_switch,
                    "cluster_when": self.split_k.cluster_when, "fixup_switch": self.split_k.fixup_switch,
                    "rules": [_split_rule_json(r) for r in self.split_k.rules]},
                "routes": [{"when": r.when, "kernel": r.kernel} for r in self.routes],
                "in_place": self.in_place,
                "configs": [{"name": c.name, "kernel": c.kernel, "set": dict(c.set), "tile": list(c.tile),
                             "splits": list(c.splits), "max_m": c.max_m, "note": c.note, "swap": c.swap,
                             "tile_kmajor_b": list(c.tile_kmajor_b) if c.tile_kmajor_b else None}
                            for c in self.configs],
                "swap_rules": [{"when": r.when} for r in self.swap_rules],
                "sass_patch": dict(self.sass_patch) or None}


def _split_rule_json(r: SplitRule) -> dict:
    if r.cost is None:
        return {"when": r.when, "splits": r.splits}
    return {"when": r.when, "splits": list(r.splits), "cost": r.cost}


# ---- reading spec files --------------------------------------------------------------------------
def load_spec_file(path: str | os.PathLike) -> list[KernelSpec]:
    """Every kernel table of one TOML spec file, checked. AsmError names the file and the key."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise AsmError(f"cannot read the kernel spec file {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AsmError(f"{path}: not valid TOML: {exc}") from None
    source = SourceFile.from_text(str(path), text)
    places = _value_places(source.text)
    resolved: dict[str, dict] = {}
    origins: dict[str, dict[str, str]] = {}
    for name, table in data.items():
        resolved[name] = _inherit(path, name, table, resolved)
        origins[name] = _origins(name, table, origins)
    return [_spec(path, _Locator(source, places, name, origins[name]), name, table)
            for name, table in resolved.items()]


def _inherit(path: Path, name: str, t, above: dict[str, dict]):
    """The table `t` with `like = "OTHER"` resolved: OTHER's keys (its entry included), then t's own."""
    if not isinstance(t, dict) or "like" not in t:
        return t
    base_name = t["like"]
    if not isinstance(base_name, str) or base_name not in above or not isinstance(above[base_name], dict):
        raise AsmError(f"{path}: [{name}] like: {base_name!r} is not a kernel table defined above in this file "
                       f"(above: {', '.join(above) or 'none'})")
    base = above[base_name]
    out = {**base, "entry": base.get("entry", base_name)}
    out.update({k: v for k, v in t.items() if k != "like"})
    return out


def _origins(name: str, t, above: dict[str, dict[str, str]]) -> dict[str, str]:
    """For each key of table `name` after `like`: the table whose text holds it (its own, or the
    table it is like, and so on up)."""
    if not isinstance(t, dict):
        return {}
    out = dict(above.get(t.get("like"), {})) if isinstance(t.get("like"), str) else {}
    out.update(dict.fromkeys(t, name))
    return out


def _spec(path: Path, loc: "_Locator", name: str, t) -> KernelSpec:
    where = f"{path}: [{name}]"

    def fail(msg: str, span: Span | None = None):
        raise AsmError(f"{where} {msg}", span)

    if not isinstance(t, dict):
        fail("must be a table of kernel fields")
    if not name.isidentifier():
        fail("a kernel name is a plain identifier (letters, digits, '_')")
    unknown = sorted(set(t) - _TOP_KEYS)
    if unknown:
        fail(f"unknown key '{unknown[0]}' (known: {', '.join(sorted(_TOP_KEYS))})")
    for key in ("source", "dtypes", "targets", "abi", "launch", "rel_err_limit"):
        if key not in t:
            fail(f"needs '{key}'")
    src = path.parent / _str(t["source"], f"{where} source")
    if not src.is_file():
        fail(f"source: no such file {src}")
    d = t["dtypes"]
    if not isinstance(d, dict) or set(d) != {"a", "b", "acc", "c"}:
        fail("dtypes: a table with exactly a, b, acc and c")
    for k, v in d.items():
        if v not in DTYPES:
            fail(f"dtypes.{k}: '{v}' is not one of {', '.join(DTYPES)}")
    targets = _str_list(t["targets"], f"{where} targets")
    for tg in targets:
        if tg not in SUPPORTED_TARGETS:
            fail(f"targets: '{tg}' is not a supported target ({', '.join(SUPPORTED_TARGETS)})")
    abi = _str_list(t["abi"], f"{where} abi")
    for a in abi:
        if a not in ARGUMENTS:
            fail(f"abi: '{a}' is not an argument the runtime can pass (known: {', '.join(ARGUMENTS)})")
    if len(set(abi)) != len(abi):
        fail("abi: an argument is listed twice")
    calls = t.get("call_params", {})
    if not isinstance(calls, dict):
        fail("call_params: a table of PARAM = call value")
    for k, v in calls.items():
        if v not in CALL_VALUES:
            fail(f"call_params.{k}: '{v}' is not a call value (known: {', '.join(CALL_VALUES)})")
    if "batched" in calls.values() and not set(_BATCH_STRIDES) <= set(abi):
        fail("call_params: maps the call value 'batched' but abi lacks " +
             ", ".join(f"'{x}'" for x in _BATCH_STRIDES if x not in abi))
    if "grouped" in calls.values() and not set(_GROUPED_ABI) <= set(abi):
        fail("call_params: maps the call value 'grouped' but abi lacks " +
             ", ".join(f"'{x}'" for x in _GROUPED_ABI if x not in abi))
    # a "tiles" grid's z is the batch; a persistent grid walks the batch's tiles itself, told its count
    if "batched" in calls.values() and la_grid(t) != "tiles" and "batch" not in abi:
        fail("call_params: 'batched' needs launch.grid = \"tiles\" (the batch is the grid's z), or a persistent "
             "grid with the abi argument 'batch' (the count of matrices its walk covers)")
    # a "tiles" grid's y bounds the problems' tile rows; a persistent grid walks them itself, counted
    # from offs on the device (hgemm GROUPED=1), its grid sized to the SMs
    if "grouped" in calls.values() and la_grid(t) not in ("tiles", "persistent"):
        fail("call_params: 'grouped' needs launch.grid = \"tiles\" (grid y bounds the problems' tile rows) or "
             "\"persistent\" (the kernel walks them itself)")
    if "bias" in calls.values() and "bias" not in abi:
        fail("call_params: maps the call value 'bias' but abi has no 'bias' argument to pass the vector in")
    defines = t.get("defines", {})
    if not isinstance(defines, dict) or not all(isinstance(v, int) and not isinstance(v, bool)
                                                for v in defines.values()):
        fail("defines: a table of PARAM = integer")
    for k in defines:
        if not k.isidentifier():
            fail(f"defines: '{k}' is not a parameter name")
        if k in calls:
            fail(f"defines.{k}: also a call parameter; the call sets it")
    limit = t["rel_err_limit"]
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 < limit < 1:
        fail("rel_err_limit: a number between 0 and 1")
    la = t["launch"]
    if not isinstance(la, dict):
        fail("launch: a table")
    unknown = sorted(set(la) - _LAUNCH_KEYS)
    missing = sorted({"threads", "tile_m", "tile_n", "smem_bytes"} - set(la))
    if unknown or missing:
        fail(f"launch: unknown key '{unknown[0]}'" if unknown else f"launch: needs '{missing[0]}'")
    if la.get("grid", "tiles") not in GRIDS:
        fail(f"launch.grid: '{la['grid']}' is not one of {', '.join(GRIDS)}")
    launch = Launch(**{k: _str(v, f"{where} launch.{k}") for k, v in la.items()})
    for arg, key in _NEEDS_LAUNCH_KEY.items():
        if arg in abi and getattr(launch, key) is None:
            fail(f"launch: needs '{key}' (the constant with the TMA box height of abi argument '{arg}')")
    terms = _terms(loc, where, t.get("terms", {}), calls)
    # what the load-time check of a size rule binds: every call parameter, pitch and C_BYTES as 0,
    # and the terms' values there (a term naming an unknown or later name fails here)
    check_names = dict.fromkeys((*calls, *PITCH_NAMES, C_BYTES_NAME, DRAM_RATE_NAME), 0)
    _add_terms(terms, check_names, 1, 1, 1, 1)
    rules = t.get("size_rule", [])
    if not isinstance(rules, list):
        fail("size_rule: an array of tables ([[NAME.size_rule]])")
    size_rules = tuple(_size_rule(loc, where, i, r, check_names) for i, r in enumerate(rules))
    split_k = None
    if "split_k" in t:
        if d["acc"] != "float32":
            fail("split_k: needs a float32 accumulator (the workspace holds fp32 partial sums)")
        split_k = _split_k(path, loc, where, t["split_k"], abi, calls, defines)
    routes = t.get("route", [])
    if not isinstance(routes, list):
        fail("route: an array of tables ([[NAME.route]])")
    routes = tuple(_route(loc, where, name, i, r, calls) for i, r in enumerate(routes))
    swaps = t.get("swap_rule", [])
    if not isinstance(swaps, list):
        fail("swap_rule: an array of tables ([[NAME.swap_rule]])")
    if swaps and "c_trans" not in calls.values():
        fail("swap_rule: the kernel must map the call value 'c_trans' in call_params (its transposed store)")
    swaps = tuple(_swap_rule(loc, where, i, r, calls) for i, r in enumerate(swaps))
    in_place = t.get("in_place")
    if in_place is not None:
        in_place = _str(in_place, f"{where} in_place")
        if not in_place.isidentifier() or in_place == name:
            fail(f"in_place: '{in_place}' is not another kernel's name")
    configs = t.get("config", [])
    if not isinstance(configs, list):
        fail("config: an array of tables ([[NAME.config]])")
    configs = tuple(_config(where, name, i, c) for i, c in enumerate(configs))
    if len({c.name for c in configs}) != len(configs):
        fail("config: two entries share a name")
    if configs and (size_rules or swaps or (split_k is not None and split_k.rules)):
        fail("config: a kernel with a catalog is dispatched by the cost model; its size_rule, swap_rule and "
             "split_k.rule tables would never be read (remove them; a configuration that runs as C^T is an "
             "entry with swap = true)")
    return KernelSpec(name, src, _str(t.get("entry", name), f"{where} entry"), str(t.get("summary", "")),
                      Dtypes(**d), tuple(targets), tuple(abi), tuple(calls.items()), float(limit), launch,
                      size_rules, path, tuple(defines.items()), split_k, routes, swaps, terms, in_place, configs,
                      _sass_patch(path, where, t.get("sass_patch")))


def with_sass_patch(spec: KernelSpec, name: str, options: dict) -> KernelSpec:
    """A copy of `spec` named `name` whose cubin gets the control-code passes `options` (the keys of
    a `sass_patch` table; a rules file relative to the working folder), checked as in a spec file.
    For A/B scripts that time ptxas's code against a patch without writing a spec file
    (tools/variant_ab.py); register() it to launch it by name. The copy runs itself: its routes
    and in_place kernel (unpatched kernels) are dropped, so a call of the copy never lands on
    ptxas's code by a route."""
    if not name.isidentifier():
        raise AsmError(f"'{name}' is not a kernel name (letters, digits, '_')")
    patch = _sass_patch(Path.cwd() / "<command line>", f"[{name}]", dict(options))
    # the catalog's own entries run the copy (as `like` gives a table's configs its own name);
    # entries naming another kernel (sgemm's skinny ones) keep it
    configs = tuple(dataclasses.replace(c, kernel=name) if c.kernel == spec.name else c for c in spec.configs)
    return dataclasses.replace(spec, name=name, entry=spec.entry, sass_patch=patch, configs=configs, routes=(),
                               in_place=None)


def _sass_patch(path: Path, where: str, t) -> tuple[tuple[str, object], ...]:
    """The checked `sass_patch` table, in SASS_PATCH_KEYS order; () when absent."""
    if t is None:
        return ()
    if not isinstance(t, dict) or not t:
        raise AsmError(f"{where} sass_patch: a table of passes, e.g. {{ reuse = true, yield_every = 4 }} "
                       f"(keys: {', '.join(SASS_PATCH_KEYS)})")
    out = []
    for key, (_keyword, kind) in SASS_PATCH_KEYS.items():
        if key not in t:
            continue
        v = t[key]
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise AsmError(f"{where} sass_patch.{key}: a whole number >= 0 (0: off), not {v!r}")
        if kind is not int and not isinstance(v, kind):
            raise AsmError(f"{where} sass_patch.{key}: {'true or false' if kind is bool else 'a file name'}, not {v!r}")
        if key == "rules":
            v = str(path.parent / v)
            if not Path(v).is_file():
                raise AsmError(f"{where} sass_patch.rules: no such file {v}")
        out.append((key, v))
    unknown = sorted(set(t) - set(SASS_PATCH_KEYS))
    if unknown:
        raise AsmError(f"{where} sass_patch: unknown key '{unknown[0]}' (known: {', '.join(SASS_PATCH_KEYS)})")
    return tuple(out)


_CONFIG_NAME = re.compile(r"[A-Za-z0-9_]+")


def _config(where: str, family: str, i: int, c) -> ConfigEntry:
    """[[NAME.config]] entry i, checked for shape (that its kernel exists, builds and has the tile it
    says is checked where the specs are all known: tests/test_dispatch_catalog.py)."""
    at = f"{where} config[{i}]"
    if not isinstance(c, dict):
        raise AsmError(f"{at}: a table with 'name', 'set' and 'tile'")
    unknown = sorted(set(c) - _CONFIG_KEYS)
    missing = sorted({"name", "set", "tile"} - set(c))
    if unknown or missing:
        raise AsmError(f"{at}: unknown key '{unknown[0]}' (known: {', '.join(sorted(_CONFIG_KEYS))})" if unknown
                       else f"{at}: needs '{missing[0]}'")
    name = _str(c["name"], f"{at}.name")
    if not _CONFIG_NAME.fullmatch(name):
        raise AsmError(f"{at}.name: '{name}' may hold only letters, digits and '_' (it names the configuration "
                       "in explain, last_launch() and the sweep database)")
    kernel = _str(c.get("kernel", family), f"{at}.kernel")
    sets = c["set"]
    if not isinstance(sets, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in sets.values()):
        raise AsmError(f"{at}.set: a table of PARAM = integer")
    tiles = []
    for key in ("tile", "tile_kmajor_b"):
        tile = c.get(key)
        if tile is None and key == "tile_kmajor_b":
            tiles.append(None)
            continue
        if (not isinstance(tile, list) or len(tile) != 3
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in tile)):
            raise AsmError(f"{at}.{key}: [rows, columns, k] of one block's tile, positive integers")
        tiles.append(tuple(tile))
    splits = c.get("splits", [1])
    if (not isinstance(splits, list) or not splits or 1 not in splits
            or not all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 64 for v in splits)):
        raise AsmError(f"{at}.splits: a list of split-K counts from 1 to 64 that includes 1 (unsplit)")
    swap = c.get("swap", False)
    if not isinstance(swap, bool):
        raise AsmError(f"{at}.swap: true or false")
    max_m = c.get("max_m")
    if max_m is not None and (not isinstance(max_m, int) or isinstance(max_m, bool) or max_m < 1):
        raise AsmError(f"{at}.max_m: a positive integer")
    cluster = c.get("cluster", [1, 1, 1])
    if (not isinstance(cluster, list) or len(cluster) != 3
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in cluster)
            or cluster[0] * cluster[1] * cluster[2] > 8):
        raise AsmError(f"{at}.cluster: [rows, columns, k] blocks of one cluster, positive integers whose product "
                       "is at most 8 (the portable cluster size)")
    return ConfigEntry(name, kernel, tuple(sets.items()), tiles[0], tuple(sorted(set(splits))), max_m,
                       str(c.get("note", "")), swap, tiles[1], tuple(cluster))


def _route(loc: "_Locator", where: str, name: str, i: int, r, calls: dict) -> Route:
    if not isinstance(r, dict) or set(r) != {"when", "kernel"}:
        raise AsmError(f"{where} route[{i}]: a table with exactly 'when' and 'kernel'")
    when = _str(r["when"], f"{where} route[{i}].when")
    kernel = _str(r["kernel"], f"{where} route[{i}].kernel")
    if not kernel.isidentifier() or kernel == name:
        raise AsmError(f"{where} route[{i}].kernel: '{kernel}' is not another kernel's name")
    route = Route(when, kernel, loc.expression(("route", i, "when"), when))
    route.holds(1, 1, 1, 1, dict.fromkeys(calls, 0))    # an unknown name fails now, at load
    return route


def _swap_rule(loc: "_Locator", where: str, i: int, r, calls: dict) -> SwapRule:
    if not isinstance(r, dict) or set(r) != {"when"}:
        raise AsmError(f"{where} swap_rule[{i}]: a table with exactly 'when'")
    when = _str(r["when"], f"{where} swap_rule[{i}].when")
    rule = SwapRule(when, loc.expression(("swap_rule", i, "when"), when))
    rule.holds(1, 1, 1, 1, dict.fromkeys(calls, 0))    # an unknown name fails now, at load
    return rule


def _split_k(path: Path, loc: "_Locator", where: str, t, abi: list[str], calls: dict, defines: dict) -> SplitK:
    """[NAME.split_k], checked: known keys, the switch a free parameter name, the reduce source
    present, the abi taking the partial pass's arguments, every rule's expressions parsed."""
    def fail(msg: str):
        raise AsmError(f"{where} split_k: {msg}")

    if not isinstance(t, dict):
        fail("a table with 'switch', 'reduce' and 'rule'")
    unknown = sorted(set(t) - _SPLIT_K_KEYS)
    if unknown:
        fail(f"unknown key '{unknown[0]}' (known: {', '.join(sorted(_SPLIT_K_KEYS))})")
    for key in ("switch", "reduce"):
        if key not in t:
            fail(f"needs '{key}'")
    switch = _str(t["switch"], f"{where} split_k.switch")
    if not switch.isidentifier():
        fail(f"switch: '{switch}' is not a parameter name")
    if switch in calls or switch in defines:
        fail(f"switch: '{switch}' is also a {'call parameter' if switch in calls else 'define'}; "
             "the runtime sets it per launch")
    reduce = path.parent / _str(t["reduce"], f"{where} split_k.reduce")
    if not reduce.is_file():
        fail(f"reduce: no such file {reduce}")
    missing = [a for a in SPLIT_K_ABI if a not in abi]
    if missing:
        fail(f"the abi must take the partial pass's arguments ({', '.join(SPLIT_K_ABI)}); missing '{missing[0]}'")
    rules = t.get("rule", [])
    if not isinstance(rules, list):
        fail("rule: an array of tables ([[NAME.split_k.rule]])")
    k_multiple = t.get("k_multiple", 16)
    if not isinstance(k_multiple, int) or isinstance(k_multiple, bool) or not 1 <= k_multiple <= 4096 \
            or k_multiple & (k_multiple - 1):
        fail(f"k_multiple: {k_multiple!r} is not a power of two from 1 to 4096")
    cluster_switch = t.get("cluster_switch")
    if cluster_switch is not None:
        cluster_switch = _str(cluster_switch, f"{where} split_k.cluster_switch")
        if not cluster_switch.isidentifier() or cluster_switch == switch:
            fail(f"cluster_switch: '{cluster_switch}' is not a parameter name other than the switch")
        if cluster_switch in calls or cluster_switch in defines:
            fail(f"cluster_switch: '{cluster_switch}' is also a "
                 f"{'call parameter' if cluster_switch in calls else 'define'}; the runtime sets it per launch")
    cluster_when = t.get("cluster_when")
    when_tree = None
    if cluster_when is not None:
        if cluster_switch is None:
            fail("cluster_when needs cluster_switch")
        cluster_when = _str(cluster_when, f"{where} split_k.cluster_when")
        when_tree = loc.expression(("split_k", "cluster_when"), cluster_when)
        _evaluate_sizes(when_tree, 1, 1, 1, 1, {"S": 2}, "split_k.cluster_when")   # unknown names fail now
    c_trans = t.get("c_trans", False)
    if not isinstance(c_trans, bool):
        fail("c_trans: true or false")
    fixup_switch = t.get("fixup_switch")
    if fixup_switch is not None:
        fixup_switch = _str(fixup_switch, f"{where} split_k.fixup_switch")
        if not fixup_switch.isidentifier() or fixup_switch in (switch, cluster_switch):
            fail(f"fixup_switch: '{fixup_switch}' is not a parameter name other than the switch and cluster_switch")
        if fixup_switch in calls or fixup_switch in defines:
            fail(f"fixup_switch: '{fixup_switch}' is also a "
                 f"{'call parameter' if fixup_switch in calls else 'define'}; the runtime sets it per launch")
        if c_trans:
            fail("fixup_switch: the in-kernel sum stores C as the kernel's C (row-major); c_trans splits need the "
                 "reduce kernel")
        missing = [a for a in SPLIT_FIXUP_ABI if a not in abi]
        if missing:
            fail(f"fixup_switch: the abi must take the fixup's arguments ({', '.join(SPLIT_FIXUP_ABI)}); missing "
                 f"'{missing[0]}'")
    return SplitK(switch, reduce, tuple(_split_rule(loc, where, i, r) for i, r in enumerate(rules)), k_multiple,
                  cluster_switch, cluster_when, when_tree, c_trans, fixup_switch)


MAX_SPLIT_CANDIDATES = 64


def _split_rule(loc: "_Locator", where: str, i: int, r) -> SplitRule:
    at = f"{where} split_k.rule[{i}]"
    if not isinstance(r, dict) or set(r) not in ({"when", "splits"}, {"when", "splits", "cost"}):
        raise AsmError(f"{at}: a table with 'when' and 'splits' (and optionally 'cost')")
    when = _str(r["when"], f"{at}.when")
    if "cost" not in r:
        splits = _str(r["splits"], f"{at}.splits")
        rule = SplitRule(when, splits, loc.expression(("split_k", "rule", i, "when"), when),
                         loc.expression(("split_k", "rule", i, "splits"), splits))
    else:
        cands = r["splits"]
        if not isinstance(cands, list) or not 1 <= len(cands) <= MAX_SPLIT_CANDIDATES \
                or any(isinstance(c, bool) or not isinstance(c, int) or not 1 <= c <= 4096 for c in cands):
            raise AsmError(f"{at}.splits: with 'cost', a list of 1 to {MAX_SPLIT_CANDIDATES} candidate split "
                           f"counts (integers from 1 to 4096), not {cands!r}")
        if len(set(cands)) != len(cands):
            raise AsmError(f"{at}.splits: candidate {next(c for c in cands if cands.count(c) > 1)} is listed twice")
        cost = _str(r["cost"], f"{at}.cost")
        rule = SplitRule(when, tuple(cands), loc.expression(("split_k", "rule", i, "when"), when), None, cost,
                         loc.expression(("split_k", "rule", i, "cost"), cost))
    rule.holds(1, 1, 1, 1)      # unknown names fail now, at load
    rule.count(1, 1, 1, 1)
    return rule


# ---- where each expression stands in the spec file -----------------------------------------------
# A table header, [a.b] or [[a.b]] (an element of the array of tables a.b), and a line
# `key = "value"` or `key = 'value'` (a bare or dotted key; a one-line string).
_HEADER = re.compile(r"[ \t]*(\[\[?)[ \t]*([A-Za-z0-9_.\- \t]+?)[ \t]*\]\]?[ \t]*(?:#.*)?$")
_KEY_STRING = re.compile(r"[ \t]*([A-Za-z0-9_\-]+(?:[ \t]*\.[ \t]*[A-Za-z0-9_\-]+)*)[ \t]*=[ \t]*([\"'])")


def _value_places(text: str) -> tuple[dict[tuple, int], dict[str, int]]:
    """Where the one-line string values and the top-level tables of a TOML text stand: offsets of
    each value's first character by its key path (("sgemm", "size_rule", 3, "when"): the fourth
    [[sgemm.size_rule]]'s `when`), and of each top-level table's header by its name. Values the
    scan does not follow (inline tables, multi-line strings, quoted keys) are not in it."""
    values: dict[tuple, int] = {}
    headers: dict[str, int] = {}
    counts: dict[tuple, int] = {}
    table: tuple = ()
    at = 0
    for line in text.split("\n"):
        m = _HEADER.match(line)
        if m is not None:
            path = tuple(part.strip() for part in m.group(2).split("."))
            headers.setdefault(path[0], at)
            if m.group(1) == "[[":
                n = counts.get(path, 0)
                counts[path] = n + 1
                table = path + (n,)
            else:
                table = path
        else:
            m = _KEY_STRING.match(line)
            if m is not None:
                key = tuple(part.strip() for part in m.group(1).split("."))
                values.setdefault(table + key, at + m.end())
        at += len(line) + 1
    return values, headers


class _Locator:
    """Parses the expressions of one kernel table where they stand in the spec file, so that their
    errors point at file:line:col: each one by its key in the table that holds its text (the
    kernel's own, or the table it is `like`)."""

    def __init__(self, source: SourceFile, places, name: str, origins: dict[str, str]):
        self.source = source
        self.values, self.headers = places
        self.name = name
        self.origins = origins

    def expression(self, key: tuple, text: str):
        """`text`, the value of `key` (("size_rule", 3, "when")) in this kernel's table, parsed at
        its place: the key's line when the scan found it; else the first quoted `text` after the
        header of the table that holds it (an inline table); else, where neither holds the text as
        it is (a TOML escape in it), on its own, under a name that says which key it is."""
        origin = self.origins.get(key[0], self.name)
        at = self.values.get((origin, *key))
        if at is not None and self.source.text.startswith(text, at):
            return parse_expression(text, self.source, at)
        header = self.headers.get(origin, 0)
        for quote in '"\'':
            found = self.source.text.find(quote + text + quote, header)
            if found >= 0:
                return parse_expression(text, self.source, found + 1)
        shown = ".".join(f"[{k}]" if isinstance(k, int) else str(k) for k in key).replace(".[", "[")
        return parse_expression(text, SourceFile.from_text(f"{self.source.path} [{origin}] {shown}", text), 0)


def la_grid(t: dict) -> str:
    la = t.get("launch")
    return la.get("grid", "tiles") if isinstance(la, dict) else "tiles"


def _add_terms(terms: tuple[Term, ...], names: dict, m: int, n: int, k: int, sms: int) -> None:
    """The terms' values into `names`, in order (each sees the ones before it)."""
    for term in terms:
        names[term.name] = _evaluate_sizes(term.tree, m, n, k, sms, names, f"the term {term.name}")


def _terms(loc: "_Locator", where: str, table, calls: dict) -> tuple[Term, ...]:
    if not isinstance(table, dict):
        raise AsmError(f"{where} terms: a table of NAME = \"expression\"")
    taken = {*SIZE_NAMES, *calls, *PITCH_NAMES, C_BYTES_NAME, DRAM_RATE_NAME}
    out = []
    for name, text in table.items():
        if not (name.isidentifier() and name.isupper()):
            raise AsmError(f"{where} terms.{name}: a term's name is an upper-case identifier (letters, digits, '_')")
        if name in taken:
            raise AsmError(f"{where} terms.{name}: already a name the size rules see (a size, call "
                           f"parameter, pitch or C_BYTES)")
        out.append(Term(name, _str(text, f"{where} terms.{name}"), loc.expression(("terms", name), text)))
    return tuple(out)


def _size_rule(loc: "_Locator", where: str, i: int, r, check_names: dict) -> SizeRule:
    if not isinstance(r, dict) or set(r) != {"when", "set"}:
        raise AsmError(f"{where} size_rule[{i}]: a table with exactly 'when' and 'set'")
    when = _str(r["when"], f"{where} size_rule[{i}].when")
    sets = r["set"]
    if not isinstance(sets, dict) or not all(isinstance(v, int) and not isinstance(v, bool) for v in sets.values()):
        raise AsmError(f"{where} size_rule[{i}].set: a table of PARAM = integer")
    rule = SizeRule(when, tuple(sets.items()), loc.expression(("size_rule", i, "when"), when))
    rule.holds(1, 1, 1, 1, check_names)     # an unknown name fails now, at load
    return rule


def _str(v, what: str) -> str:
    if not isinstance(v, str) or not v:
        raise AsmError(f"{what}: a non-empty string")
    return v


def _str_list(v, what: str) -> list[str]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise AsmError(f"{what}: a non-empty list of strings")
    return v


# ---- the registry --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def shipped_spec_file() -> Path:
    """kernels_ptx/kernels.toml of this installation (where the package lies does not change)."""
    return Path(str(resources.files("asmgemm.kernels_ptx") / "kernels.toml"))


_registered: dict[str, KernelSpec] = {}
_loaded: dict[tuple, dict[str, KernelSpec]] = {}


def _spec_files() -> list[Path]:
    extra = [Path(p) for p in os.environ.get(SPECS_ENV, "").split(os.pathsep) if p]
    return [shipped_spec_file(), *extra]


def all_specs() -> dict[str, KernelSpec]:
    """Every known kernel spec by name: the shipped ones, those in $ASMGEMM_KERNEL_SPECS, then those
    registered from Python. A name defined twice is an error."""
    files = tuple(_spec_files())
    key = tuple((str(p), _stamp(p)) for p in files)
    found = _loaded.get(key)
    if found is None:
        found = {}
        for p in files:
            for spec in load_spec_file(p):
                if spec.name in found:
                    raise AsmError(f"{p}: kernel '{spec.name}' is already defined in {found[spec.name].spec_file}")
                found[spec.name] = spec
        _loaded.clear()
        _loaded[key] = found
    out = dict(found)
    for name, spec in _registered.items():
        if name in out and out[name] != spec:
            raise AsmError(f"kernel '{name}' is registered twice ({out[name].spec_file} and {spec.spec_file})")
        out[name] = spec
    return out


def _stamp(p: Path):
    try:
        st = p.stat()
        return (st.st_mtime_ns, st.st_size)
    except OSError:
        return None


def register(specs: KernelSpec | list[KernelSpec]) -> None:
    """Make kernels known to gemm/run/bench/tune in this process (tests, notebooks)."""
    for spec in [specs] if isinstance(specs, KernelSpec) else specs:
        _registered[spec.name] = spec
    _registry_generation[0] += 1


def unregister(name: str) -> None:
    _registered.pop(name, None)
    _registry_generation[0] += 1


# ---- cheap change detection (the runtime's launch-plan cache, asmgemm.gemm) -------------------------
# all_specs() stats every spec file per call (microseconds); gemm's repeated-call path must not.
# specs_version() is exact for what a process does itself (register/unregister, the environment
# variable) and looks at the files' stamps at most every SPEC_RECHECK_S seconds: an edited spec
# file reaches a running gemm() within that time (refresh_specs() makes it immediate).
SPEC_RECHECK_S = 0.5
_registry_generation = [0]
_version_memo: list = [float("-inf"), None, None]     # [monotonic time of the last stat, env value, token]
# read-only for others (gemm's repeated call repeats specs_version's check inline: runtime/gemm.py)
registry_counter = _registry_generation             # [n]: n changes with every register/unregister
version_memo = _version_memo


def specs_version():
    """A token that stays the *same object* while all_specs() would answer the same, and is a new
    object when the registry, $ASMGEMM_KERNEL_SPECS or a spec file's stamp changed (files looked at
    no more often than every SPEC_RECHECK_S seconds). Costs an environment read (environment.py:
    without os.environ.get's KeyError) and a clock read."""
    env = env_value(SPECS_ENV, "")
    now = time.monotonic()
    last, last_env, token = _version_memo
    if token is not None and env == last_env and token[0] == _registry_generation[0] and now - last < SPEC_RECHECK_S:
        return token
    new = (_registry_generation[0], env, tuple((str(p), _stamp(p)) for p in _spec_files()))
    _version_memo[:] = [now, env, token if new == token else new]
    return _version_memo[2]


def refresh_specs() -> None:
    """Make the next specs_version() look at the spec files now (after editing one)."""
    _version_memo[0] = float("-inf")


def twins(a: KernelSpec, b: KernelSpec) -> bool:
    """Whether two kernels are the same source entry built for operands of one width (bgemm_mma is
    hgemm_mma with BF16=1, hgemm_f32c is hgemm with C_F32=1: the same loads, the same MMA rate), so
    a sweep of one prices the other (the cost model's twin fit, the dispatch database's family)."""
    return (a.source, a.entry) == (b.source, b.entry) and DTYPE_ITEMSIZE[a.dtypes.a] == DTYPE_ITEMSIZE[b.dtypes.a]


def get_spec(name: str) -> KernelSpec:
    specs = all_specs()
    name = name[:-5] if name.endswith(".sasm") else name
    if name not in specs:
        raise AsmError(f"'{name}' is not a GEMM kernel asmgemm can launch (known: {', '.join(specs) or 'none'})",
                       hint=f"a kernel becomes launchable through a spec entry (kernels_ptx/kernels.toml, or a file "
                            f"named in ${SPECS_ENV}); `asmgemm build/check/sass/tune --dry-run` work on any .sasm")
    return specs[name]


def spec_for_dtype(dtype: str, device_target: str | None = None, c_dtype: str | None = None) -> KernelSpec:
    """The first spec (in file order) whose A/B dtype is `dtype`, whose C dtype is `c_dtype` (default:
    `dtype`) and that supports the device. A table with sass_patch is never chosen by dtype: its
    control codes run only where a call names it (kernel="NAME")."""
    c_dtype = c_dtype or dtype
    candidates = [s for s in all_specs().values()
                  if s.dtypes.a == s.dtypes.b == dtype and s.dtypes.c == c_dtype and not s.sass_patch]
    for s in candidates:
        if device_target is None or s.build_target(device_target) is not None:
            return s
    known = sorted({s.dtypes.a for s in all_specs().values()})
    what = dtype if c_dtype == dtype else f"{dtype} -> {c_dtype}"
    if candidates:
        raise AsmError(f"no {what} GEMM kernel supports {device_target} "
                       f"({', '.join(f'{s.name}: {s.targets}' for s in candidates)})")
    if c_dtype != dtype and dtype in known:
        pairs = sorted({f"{s.dtypes.a} -> {s.dtypes.c}" for s in all_specs().values()})
        raise AsmError(f"no GEMM kernel takes {what} (A/B -> C: {', '.join(pairs)})")
    raise AsmError(f"unsupported dtype {dtype}: asmgemm has GEMM kernels for {', '.join(known)}",
                   hint="A and B share one dtype; C has it too, or float32 for the 16-bit kernels")
