"""One launch of a spec'd kernel, without the GPU: which -D parameters it is built with, the
argument tuple CuPy passes (or the parameter block cuLaunchKernel takes), and the grid. Pure Python
(numpy scalars and ctypes buffers), tested on the CPU.

Parameter precedence (`choose_params`): `params=` (-D overrides: the benchmark, the tuner, a
user's experiment), else the tuning cache's entry for this GPU, kernel, layout and shape bucket,
else the spec's size rule over the kernel's source defaults. The call-derived parameters (the
spec's `call_params`: transposes after the storage/operand-swap logic, 128-bit loads from
alignment) are always set from the call: a caller may turn 128-bit loads off, never on where they
would be misaligned.
"""
from __future__ import annotations

import ctypes
import functools
import math
import struct
import threading

import numpy as np

from ..errors import AsmError
from ..kernel_spec import ARRAY_ARGUMENTS, DTYPE_ITEMSIZE, KernelSpec
from . import tensor_map
from .build_cache import BuiltKernel
from .plan import LaunchPlan, call_values_for, transposed_bias_mode

MAX_GRID_Y = 65535
MAX_GRID_Z = 65535
_SCALAR = {".u64": np.uint64, ".b64": np.uint64, ".s64": np.int64, ".u32": np.uint32, ".b32": np.uint32,
           ".s32": np.int32, ".f32": np.float32, ".f64": np.float64}


@functools.lru_cache(maxsize=None)
def _default_params(name: str, source: str) -> tuple[tuple[str, object], ...]:
    from ..pipeline import build_file    # loaded when first needed, not with the runtime (test_layers)
    result = build_file(source)
    return tuple((n, result.parameters[n]) for n in result.tunables if n in result.parameters)


def default_params(spec: KernelSpec) -> dict:
    """The kernel's tunable parameters (those with a `.tune` line) at their source defaults, e.g.
    {'THREADS': 256, 'BK': 8} for sgemm. Builds the kernel on the CPU once (no GPU, no ptxas)."""
    return dict(_default_params(spec.name, str(spec.source)))


def call_defines(spec: KernelSpec, plan_values: dict, chosen: dict | None = None) -> dict:
    """The spec's call-derived -D parameters for a launch. A `vec_*` value only ever lowers what
    `chosen` asks for (128-bit loads where the call allows them, off where a caller turned them off),
    and so does c_piece (a narrower piece of C than the call allows: an A/B of the epilogues)."""
    chosen = chosen or {}
    out = {}
    for param, value in spec.call_params:
        v = int(plan_values[value])
        lowers = value.startswith("vec_") or value == "c_piece"
        out[param] = min(int(chosen.get(param, v)), v) if lowers else v
    return out


def operand_pitches(spec: KernelSpec, plan: LaunchPlan) -> dict[str, int]:
    """The size rules' PITCH_NAMES of a launch: bytes between the stored rows of its A and B
    (plan.itemsize is C's, which an fp32-C kernel's 16-bit operands do not share)."""
    return {"PITCH_A": plan.a.ld * DTYPE_ITEMSIZE[spec.dtypes.a], "PITCH_B": plan.b.ld * DTYPE_ITEMSIZE[spec.dtypes.b]}


def choose_params(spec: KernelSpec, plan: LaunchPlan, params: dict | None, tuned: dict | None,
                  sm_count: int, launch_defines: dict | None = None, dram_per_sm_cycle: int | None = None) -> dict:
    """-D defines for this launch (see the module docstring for the precedence). `launch_defines`:
    what the runtime decided for this launch besides the call values (split-K's switch, which
    replaces the split count params= or a tuning entry may carry under the same name).
    `dram_per_sm_cycle`: the GPU's DeviceFacts.dram_per_sm_cycle, which the size rules see (None: the H100's)."""
    chosen = default_params(spec)
    if params is not None:
        chosen.update(params)
    elif tuned:
        chosen.update(tuned)
    else:
        i = size_rule_index(spec, plan, sm_count, dram_per_sm_cycle)
        if i is not None:
            chosen.update(spec.size_rules[i].set)
    chosen.update(launch_defines or {})
    chosen.update(call_defines(spec, plan.call_values, chosen))
    chosen.update(spec.defines)       # what makes this kernel this kernel (e.g. BF16=1): never overridden
    return chosen


def size_rule_index(spec: KernelSpec, plan: LaunchPlan, sm_count: int, dram_per_sm_cycle: int | None = None) -> int | None:
    """The position in spec.size_rules of the rule an untuned launch of this plan takes (what
    choose_params applies; `asmgemm explain` names it), or None where none holds (the source's defaults)."""
    return spec.size_rule_index(rules_rows(spec, plan), plan.n, plan.k, sm_count, call_defines(spec, plan.call_values),
                                operand_pitches(spec, plan), dram_per_sm_cycle)


# The tile height the rows of a batch are counted in for a persistent kernel's size rules (rules_rows):
# the TMA kernel's default tile (128 rows; path_model.TMA_TILE), each matrix starting a tile row of
# its own. (The shipped persistent kernel, hgemm, is dispatched by its catalog since 2026-11-29.)
BATCH_ROWS_TILE = 128


def rules_rows(spec: KernelSpec, plan: LaunchPlan) -> int:
    """The M a launch's size rules see. A batch on a persistent kernel is walked as batch x the
    tiles of one matrix, so the rules, written for one GEMM, see the GEMM the batch makes stacked
    along M: batch x M rounded up to whole BATCH_ROWS_TILE-row tiles (the tile counts the grid
    walks; N, K and the pitches stay one matrix's). A "tiles" grid's batch is grid z: its M."""
    if plan.batch <= 1 or spec.launch.grid != "persistent":
        return plan.m
    return plan.batch * -(-plan.m // BATCH_ROWS_TILE) * BATCH_ROWS_TILE


def takes_c_trans(spec: KernelSpec, m: int, n: int, k: int, sm_count: int, values: dict,
                  params: dict | None = None) -> bool:
    """Whether an M x N x K call (the user's sizes; `values`: its call values before any swap) with
    a row-major C runs as C^T with the kernel's transposed store. The swap is part of the untuned
    choice (as a route is): params=None, the spec's swap rules; with params=, only the kernel's
    c_trans parameter among them swaps (-D sets, the tuner's candidates: timed as given)."""
    param = spec.call_value_param("c_trans")
    if param is None:
        return False
    if params is not None:
        return bool(int(params.get(param, 0)))
    return spec.swaps(m, n, k, sm_count, call_defines(spec, values))


def untuned_launch(spec: KernelSpec, m: int, n: int, k: int, layout: str, sm_count: int, *, bias: int = 0,
                   activation: int = 0) -> tuple[int, int, dict]:
    """(kernel M, kernel N, call values) of a call of this shape and layout on fresh row-major
    operands and C (plan.call_values_for, with this bias mode and activation code), after the
    swap the spec's swap rules ask for."""
    item = DTYPE_ITEMSIZE[spec.dtypes.a]
    values = {**call_values_for(m, n, k, layout, item, activation=activation), "bias": bias}
    if not takes_c_trans(spec, m, n, k, sm_count, values):
        return m, n, values
    return n, m, {**call_values_for(m, n, k, layout, item, c_trans=True, activation=activation),
                  "bias": transposed_bias_mode(bias)}


def untuned_size_rule(spec: KernelSpec, m: int, n: int, k: int, layout: str, sm_count: int, *, bias: int = 0,
                      activation: int = 0, dram_per_sm_cycle: int | None = None) -> dict:
    """The size rule's choice for a call of this shape and layout on fresh row-major operands (the
    call values plan.call_values_for gives them, with this bias mode and activation code, after the
    spec's swap): what choose_params picks for such a call untuned, for scripts that lay -D
    overrides over it (a swapped call's includes the c_trans parameter, e.g. C_T=1, since params=
    swap only when they say so)."""
    km, kn, values = untuned_launch(spec, m, n, k, layout, sm_count, bias=bias, activation=activation)
    defines = call_defines(spec, values)
    # the pitches the launch plans with: an operand read by TMA whose rows it cannot address is
    # read from a padded copy (launch_config._tma_plan), unless it is an A the kernel loads itself (a_ldg)
    fresh = spec.fresh_pitches(km, kn, k, defines)
    padded = {"PITCH_A": "tmap_a" in spec.abi and not values.get("a_ldg"), "PITCH_B": "tmap_b" in spec.abi}
    pitches = {name: tensor_map.padded_pitch(p) if padded[name] else p for name, p in fresh.items()}
    chosen = spec.size_rule(km, kn, k, sm_count, defines, pitches, dram_per_sm_cycle)
    if values.get("c_trans"):         # params= swap only when they say so
        chosen[spec.call_value_param("c_trans")] = 1
    return chosen


def grid(spec: KernelSpec, built: BuiltKernel, plan: LaunchPlan, sm_count: int = 1, copies: int = 1,
         cluster_capacity: int | None = None) -> tuple[int, int, int]:
    """The launch grid of the spec's grid kind (kernel_spec.GRIDS); `sm_count`: the device's SMs;
    `copies`: split-K's S splits, a "tiles" grid's z (a split launch is never batched) or the times
    a persistent kernel walks its units (a batch multiplies them too: it walks every matrix's);
    `cluster_capacity`: the clusters the device runs at once (cluster_capacity.max_active_clusters;
    None: unknown), which a persistent grid does not exceed."""
    if spec.launch.grid == "tiles":
        gx, gy = _tile_grid(built, plan)
        if gy > MAX_GRID_Y:
            raise AsmError(f"M = {plan.m} needs {gy} block rows, more than the grid allows ({MAX_GRID_Y})")
        if plan.batch > MAX_GRID_Z:
            raise AsmError(f"a batch of {plan.batch} matrices needs {plan.batch} grid layers, more than the grid "
                           f"allows ({MAX_GRID_Z})", hint=f"split the batch into calls of at most {MAX_GRID_Z}")
        return gx, gy, plan.batch * copies
    if spec.launch.grid == "persistent":
        units, clusters = persistent_walk(built, plan, sm_count, copies, cluster_capacity)
        if units > 0xFFFFFFFF:
            shown = f"a batch of {plan.batch} matrices of {plan.m} x {plan.n}" if plan.batch > 1 else f"{plan.m} x {plan.n}"
            raise AsmError(f"{shown} is {units} tiles, more than the kernel counts in 32 bits")
        return clusters * built.cluster, 1, 1
    raise AsmError(f"unknown grid kind '{spec.launch.grid}'")


def _tile_grid(built: BuiltKernel, plan: LaunchPlan) -> tuple[int, int]:
    """(tile columns, tile rows) of C. Grouped problems along M: each has at most one partial tile
    row, so the problems' tile rows are at most ceil(M / tile_m) + groups (the blocks past the last
    one return)."""
    return math.ceil(plan.n / built.tile_n), math.ceil(plan.m / built.tile_m) + plan.groups


def persistent_walk(built: BuiltKernel, plan: LaunchPlan, sm_count: int, copies: int = 1,
                    cluster_capacity: int | None = None) -> tuple[int, int]:
    """(units, clusters) of a persistent launch: the units its clusters walk (a unit: cluster_rows
    tile rows by cluster_cols tile columns, times `copies` and the batch) and the clusters of its
    grid (at most one a unit, SMs / cluster, and `cluster_capacity`)."""
    gx, gy = _tile_grid(built, plan)
    c = built.cluster
    units = -(-gx // built.cluster_cols) * -(-gy // built.cluster_rows) * copies * plan.batch
    fit = sm_count // c if cluster_capacity is None else min(sm_count // c, cluster_capacity)
    return units, max(1, min(units, fit))


# Per-call values of a launch: the pointers (kernel A, kernel B, C: after the operand swap) and the
# scalars. Everything else in the argument tuple is fixed by the plan.
# The split-K reduce kernel's workspace W takes the first pointer (its C the third); the fused
# epilogue's bias vector the fourth, a grouped launch's offsets (on the device, new per call) the fifth.
_CALL_SLOTS = {"A": 0, "B": 1, "C": 2, "alpha": 3, "beta": 4, "tmap_a": 0, "tmap_b": 1, "tmap_c": 2, "bias": 3,
               "W": 0, "offs": 4, "workspace": 5, "tile_counters": 6}
# A tensor-map argument the kernel does not read in this launch (tmap_c without 16-byte rows of C)
_NO_MAP = np.zeros((), dtype="V128")


def _same_scalars(memo: tuple, alpha, beta) -> bool:
    """Whether (alpha, beta) are those of `memo` (its first two items): the scalar slots of a
    repeated call are converted again only when they changed."""
    return not (memo[0] is not alpha and memo[0] != alpha or memo[1] is not beta and memo[1] != beta)


class ArgPacker:
    """The argument tuple of one launch plan, built once: every argument that the plan fixes (sizes,
    leading dimensions) is converted to its numpy scalar here, and `pack` only fills in what changes
    between calls with the same plan (pointers; alpha and beta, converted again only when they
    change; a tensor map follows its pointer). c_map=False: tmap_c is never encoded (split-K's
    partial pass, whose workspace is new each call); a_map=False: nor tmap_a (the kernel loads A
    itself, A_LDG)."""

    __slots__ = ("template", "pointer_slots", "scalar_slots", "_scalars")

    def __init__(self, built: BuiltKernel, plan: LaunchPlan, dtype: str = "", c_dtype: str | None = None,
                 extra: dict | None = None, c_map: bool = True, a_map: bool = True):
        # k_chunk / split_stride: one split over all of K, no slices (a kernel built without its
        # split-K pass ignores them); runtime/split_k.py passes its own in `extra`.
        values = {"M": plan.m, "N": plan.n, "K": plan.k, "lda": plan.a.ld, "ldb": plan.b.ld, "ldc": plan.ldc,
                  "batch_stride_a": plan.batch_strides[0], "batch_stride_b": plan.batch_strides[1],
                  "batch_stride_c": plan.batch_strides[2], "batch": plan.batch, "k_chunk": plan.k, "split_stride": 0,
                  "groups": plan.groups, **(extra or {})}
        template, pointers, scalars = [], [], []
        for i, (name, ptype) in enumerate(built.params):
            if name == "tmap_c" and not (plan.call_values.get("wide_c") and c_map):
                # the kernel stores C by TMA only with whole 16-byte rows (WIDE_C), and never a
                # split-K partial tile (c_map False: its workspace is new each call)
                template.append(_NO_MAP)
            elif name == "tmap_a" and not a_map:
                # A read by the kernel's own loads (A_LDG: rows TMA cannot address): no map to encode
                template.append(_NO_MAP)
            elif name in ("tmap_a", "tmap_b", "tmap_c"):
                template.append(None)
                pointers.append((i, _CALL_SLOTS[name],
                                 _tensor_map_of(built, plan, name, (c_dtype or dtype) if name == "tmap_c" else dtype)))
            elif name in ("alpha", "beta"):
                template.append(None)
                scalars.append((i, _CALL_SLOTS[name] - 3, _SCALAR[ptype]))
            elif name in _CALL_SLOTS:
                template.append(None)
                pointers.append((i, _CALL_SLOTS[name], _SCALAR[ptype]))
            else:
                template.append(_SCALAR[ptype](values[name]))
        self.template = tuple(template)
        self.pointer_slots = tuple(pointers)
        self.scalar_slots = tuple(scalars)
        self._scalars = (None, None, ())      # (alpha, beta, ((position, converted), ...)) of the last call

    def pack(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha: float, beta: float, bias_ptr: int = 0,
             offs_ptr: int = 0, workspace_ptr: int = 0, counters_ptr: int = 0) -> tuple:
        """The arguments for kernel operands at these addresses (same shapes, strides and 16-byte
        alignment as the plan's: the caller's cache key guarantees it); bias_ptr: the fused
        epilogue's vector, 0 without one; offs_ptr: a grouped launch's end rows, 0 otherwise;
        workspace_ptr, counters_ptr: a one-launch split-K's slices and tile counters, 0 otherwise."""
        out = list(self.template)
        ptrs = (a_ptr, b_ptr, c_ptr, bias_ptr, offs_ptr, workspace_ptr, counters_ptr)
        for i, which, convert in self.pointer_slots:
            out[i] = convert(ptrs[which])
        memo = self._scalars            # one read and one write: threads sharing a plan never mix two calls
        if not _same_scalars(memo, alpha, beta):
            ab = (alpha, beta)
            memo = self._scalars = (alpha, beta, tuple((i, convert(ab[which])) for i, which, convert in self.scalar_slots))
        for i, value in memo[2]:
            out[i] = value
        return tuple(out)


def packed_arguments(fmt: str) -> tuple[object, object]:
    """cuLaunchKernel's `kernelParams` for arguments laid out by the struct format `fmt` (standard
    sizes, "<", each field at an offset its size divides): one buffer that a launch rewrites with a
    single struct.pack_into, and the array of pointers to its fields (keep both alive while the
    driver may read them)."""
    fields = fmt[1:]
    if not fmt.startswith("<") or not fields or any(f not in "bBhHiIqQfd" for f in fields):
        raise AsmError(f"packed_arguments: {fmt!r} is not '<' and one letter a scalar field")
    offsets = [struct.calcsize("<" + fields[:i]) for i in range(len(fields))]
    if any(o % struct.calcsize("<" + f) for o, f in zip(offsets, fields)):
        raise AsmError(f"packed_arguments: {fmt!r} has a field at an offset its size does not divide")
    block = ctypes.create_string_buffer(struct.calcsize(fmt))
    base = ctypes.addressof(block)
    return block, (ctypes.c_void_p * len(fields))(*[base + o for o in offsets])


def argument_buffers(sizes) -> tuple[list, object]:
    """cuLaunchKernel's `kernelParams` for arguments of these byte sizes: one zeroed buffer each
    and the array of pointers to them (keep both alive while the driver may read them)."""
    buffers = [ctypes.create_string_buffer(size) for size in sizes]
    return buffers, (ctypes.c_void_p * len(buffers))(*[ctypes.addressof(b) for b in buffers])


class ParamBlock:
    """An ArgPacker's arguments in the form cuLaunchKernel takes them (`kernelParams`: an array of
    pointers, one per .param, each to that argument's bytes), kept for the plan's lifetime and
    rewritten in place per call: only the pointers (a tensor map only when its pointer changed)
    and alpha/beta (only when they changed). `address` is the array's address for the driver.
    The bytes are those of `packer.pack(...)` (tests/test_raw_launch.py decodes them against it).
    Not thread-safe by itself: a launch writes and launches under `lock` (the driver copies the
    arguments during the call, so the block is free again when cuLaunchKernel returns). A call
    whose pointers are the previous call's (a loop over the same arrays, whose new C the caching
    allocator hands back at the same address) writes none of them."""

    __slots__ = ("address", "lock", "_buffers", "_array", "_ints", "_maps", "_floats", "_last_maps", "_words", "_ab",
                 "_ptrs")

    def __init__(self, packer: ArgPacker, params: tuple[tuple[str, str], ...]):
        if len(params) != len(packer.template):
            raise AsmError(f"a parameter block of {len(params)} .params for {len(packer.template)} arguments")
        # an argument's bytes: its PTX type's (the numpy scalar ArgPacker packs), an array argument's
        # count of them (a tensor map: .b8 [128])
        self._buffers, self._array = argument_buffers(
            ARRAY_ARGUMENTS.get(name) or np.dtype(_SCALAR[ptype]).itemsize for name, ptype in params)
        for buf, value in zip(self._buffers, packer.template):
            if value is not None:
                raw = np.asarray(value).tobytes()
                ctypes.memmove(buf, raw, len(raw))
        self.address = ctypes.addressof(self._array)
        ints, maps = [], []
        for i, which, convert in packer.pointer_slots:
            if params[i][0] in ARRAY_ARGUMENTS:     # a tensor map: `convert` encodes the map of a pointer
                maps.append((i, which, convert))
            else:
                ints.append((self._view(i, params), which))
        self._ints, self._maps = tuple(ints), tuple(maps)
        self._floats = tuple((self._view(i, params), which) for i, which, _ in packer.scalar_slots)
        self._last_maps = [None] * len(params)
        # a map's address word, once the map is written whole and its encode moves it by that word
        # alone (tensor_map.mover's `address_word`): a view of those 8 bytes, else None
        self._words: list = [None] * len(params)
        self._ab = (None, None)
        self._ptrs = None               # the pointers the block holds (None: none written yet)
        self.lock = threading.Lock()

    def _view(self, i: int, params):
        """Argument i's buffer as the ctypes scalar of its PTX type (its `.value` writes the bytes)."""
        return np.ctypeslib.as_ctypes_type(_SCALAR[params[i][1]]).from_buffer(self._buffers[i])

    def write(self, a_ptr: int, b_ptr: int, c_ptr: int, alpha: float, beta: float, bias_ptr: int = 0,
              offs_ptr: int = 0, workspace_ptr: int = 0, counters_ptr: int = 0) -> None:
        """The per-call arguments into the block (what ArgPacker.pack would return, in place)."""
        ptrs = (a_ptr, b_ptr, c_ptr, bias_ptr, offs_ptr, workspace_ptr, counters_ptr)
        if ptrs != self._ptrs:
            self._write_pointers(ptrs)
            self._ptrs = ptrs
        if not _same_scalars(self._ab, alpha, beta):
            values = (alpha, beta)
            self._ab = (None, None)     # until both are written (a scalar that fails to convert leaves them unknown)
            for slot, which in self._floats:
                slot.value = values[which]
            self._ab = values

    def _write_pointers(self, ptrs: tuple) -> None:
        for slot, which in self._ints:
            slot.value = ptrs[which]
        for i, which, encode in self._maps:
            ptr = ptrs[which]
            if self._last_maps[i] != ptr:
                word = self._words[i]
                if word is not None:
                    # the map is written whole already and only its address moves: that word alone
                    # (encode's copy of the map and its conversions cost ~3.5 us a moved operand)
                    tensor_map.check_moved_address(ptr)
                    word.value = ptr
                else:
                    raw = np.asarray(encode(ptr)).tobytes()
                    ctypes.memmove(self._buffers[i], raw, len(raw))
                    at = getattr(encode, "address_word", None)
                    if at is not None:
                        self._words[i] = ctypes.c_uint64.from_buffer(self._buffers[i], 8 * at)
                self._last_maps[i] = ptr

    def arguments(self) -> list[bytes]:
        """The bytes of each argument as they stand (for tests and debugging)."""
        return [bytes(b) for b in self._buffers]


def launch_block(raw, grid_: tuple, block: tuple, smem: int, stream_ptr: int, a_ptr: int, b_ptr: int, c_ptr: int,
                 alpha: float, beta: float, bias_ptr: int = 0, offs_ptr: int = 0, workspace_ptr: int = 0,
                 counters_ptr: int = 0) -> None:
    """One launch through cuLaunchKernel: raw = (the driver's launch function, the CUfunction
    handle, the plan's ParamBlock); the block is written and launched under its lock."""
    launch, function, params = raw
    with params.lock:
        params.write(a_ptr, b_ptr, c_ptr, alpha, beta, bias_ptr, offs_ptr, workspace_ptr, counters_ptr)
        launch(function, grid_[0], grid_[1], grid_[2], block[0], block[1], block[2], smem, stream_ptr,
               params.address, 0)


def pack_args(built: BuiltKernel, plan: LaunchPlan, alpha: float, beta: float, dtype: str = "",
              c_dtype: str | None = None) -> tuple:
    """The kernel's arguments in .param order, each as the numpy scalar of its PTX type (a tensor
    map: the 128-byte value runtime/tensor_map.py encodes)."""
    return ArgPacker(built, plan, dtype, c_dtype).pack(plan.a.ptr, plan.b.ptr, plan.c_ptr, alpha, beta, plan.bias_ptr)


def _tensor_map_of(built: BuiltKernel, plan: LaunchPlan, name: str, dtype: str):
    """ptr -> the encoded map at that address of the kernel's A (tmap_a), B (tmap_b) or C (tmap_c:
    M x N with ldc, after the operand swap); shape and leading dimension from the plan, the box
    height from the build (BOX_*_ROWS). A batched launch's maps are 3-D: the plan's batch of
    matrices its batch strides apart (0: the operand every batch shares); a grouped launch's B
    too: its experts, batch_strides[1] apart (A and C stay 2-D: all experts' rows)."""
    which = "abc".index(name[-1])
    if name == "tmap_c":
        label, rows, cols, ld = "C", plan.m, plan.n, plan.ldc
    else:
        op = plan.a if name == "tmap_a" else plan.b
        label, rows, cols, ld = name[-1].upper(), op.rows, op.cols, op.ld
    box = built.box_rows[which]
    batches, batch_stride = (plan.batch, plan.batch_strides[which]) if plan.batch > 1 else (0, 0)
    if plan.groups and name == "tmap_b":
        # a grouped launch (hgemm GROUPED=1): B's experts, the outermost coordinate; A's rows and
        # C's are every expert's one after the other (2-D)
        batches, batch_stride = plan.groups, plan.batch_strides[1]
    # (pointer, map) of the previous call, one object (threads sharing a plan never pair one call's
    # pointer with another's map): a repeated call on the same arrays skips the encode cache's lookup;
    # the map at a new address comes from the first map's tensor_map.mover (its address rewritten)
    last = [(None, None)]
    move = [None]

    def encoded(ptr: int):
        memo = last[0]
        if memo[0] != ptr:
            if move[0] is None:
                move[0] = tensor_map.mover(tensor_map.tile_map(label, ptr, dtype, rows, cols, ld, box, batches,
                                                               batch_stride))
                # the mover's word, for a holder of the map's bytes that moves it itself (ParamBlock)
                encoded.address_word = getattr(move[0], "address_word", None)
            memo = last[0] = (ptr, move[0](ptr))
        return memo[1]
    encoded.address_word = None             # not known before the first map is encoded
    return encoded
