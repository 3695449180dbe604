"""TMA tensor maps for the Hopper kernels: what to encode (pure, tested on the CPU) and the encoding
itself through NVIDIA's `cuda-bindings` (cuda.bindings.driver.cuTensorMapEncodeTiled), cached.

The contract with the kernels (kernels_ptx/hopper.inc, "128-byte swizzle contract"): an operand's
map covers its *stored* row-major matrix (rows x cols, leading dimension ld elements) as a 2-D
tensor {cols, rows} (the contiguous dimension first, as the driver counts them); a box is one
128-byte swizzle row wide (64 halves) and `box_rows` rows tall; 128-byte swizzle; elements outside
the matrix read as zero (that is how the kernels handle the M, N and K edges). A batch of matrices
(hgemm's BATCHED) is a 3-D tensor {cols, rows, batches}, the batch outermost with its own stride,
read a box {64, box_rows, 1} at a time: the rank is the map's data (TileMap.dims), one encode for both.

The driver's rules (CUDA Driver API, cuTensorMapEncodeTiled) that a call can break are checked
here first, so a user gets a sentence instead of CUDA_ERROR_INVALID_VALUE: the base address
16-byte aligned, every stride a multiple of 16 bytes and under 2^40, each dimension 1..2^32, the
box at most 256 per dimension (rank up to 5; hgemm's maps have 2 or 3).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..errors import AsmError

SWIZZLE_BYTES = 128            # the box's row: one 128-byte swizzle span
MAX_BOX = 256
MAX_DIM = 1 << 32
MAX_STRIDE = 1 << 40
ALIGN = 16
CACHE_ENTRIES = 512            # encoded maps kept per process (one per operand shape and pointer)
_DTYPES = {"float16": 2, "bfloat16": 2, "float32": 4}       # float32: an fp32 C stored by TMA

TMA_HINT = ("TMA needs 16-byte aligned operands whose rows start at multiples of 16 bytes (a leading "
            "dimension that is a multiple of 8 halves); pass a contiguous copy, e.g. cupy.ascontiguousarray(x) "
            "with an even number of 8-element groups per row, or pad the leading dimension")


@dataclass(frozen=True)
class TileMap:
    """One tensor map to encode: the stored matrix and the box. Hashable: the cache key."""

    ptr: int
    dtype: str         # 'float16' | 'bfloat16' | 'float32'
    rows: int
    cols: int
    row_bytes: int     # stride between rows in bytes
    box_rows: int
    batches: int = 0   # matrices of a 3-D map (the batch, outermost); 0: a 2-D map of one matrix
    batch_bytes: int = 0   # stride between the matrices in bytes (3-D maps)

    @property
    def itemsize(self) -> int:
        return _DTYPES[self.dtype]

    @property
    def dims(self) -> tuple[int, ...]:
        """The tensor's extents, the contiguous dimension first (the driver's order); its length is the rank."""
        return (self.cols, self.rows, self.batches) if self.batches else (self.cols, self.rows)

    @property
    def strides(self) -> tuple[int, ...]:
        """Bytes between consecutive indices of each dimension but the first (the driver's globalStrides)."""
        return (self.row_bytes, self.batch_bytes) if self.batches else (self.row_bytes,)

    @property
    def box(self) -> tuple[int, ...]:
        """The box a load or store moves: one swizzle row wide, box_rows tall (and one matrix deep)."""
        return (SWIZZLE_BYTES // self.itemsize, self.box_rows) + ((1,) if self.batches else ())

    @property
    def l2_promotion(self) -> int:
        """Bytes L2 fetches around each request of this map's loads (the driver's L2 promotion):
        256 where every row starts on a 256-byte line, else 128. Measured on the H100 (fp16,
        interleaved with cuBLAS, docs/log/hgemm.md "L2 promotion"): with rows 2000 or 4000 bytes
        apart, 256-byte promotion ran 1000^3 at 127 TFLOP/s and 2000^3 at 473, 128-byte 134 and 536
        (none: 138 and 537); with aligned rows all were within 1-3% (4096^3 734-738, 1024^3 202-210)."""
        return 256 if self.rows == 1 or self.row_bytes % 256 == 0 else 128


def addressable(ptr: int, rows: int, ld: int, itemsize: int) -> bool:
    """TMA's alignment rules for a stored matrix: base and row starts on 16-byte boundaries (a
    single row is never stepped over, so its stride does not count)."""
    return ptr % ALIGN == 0 and (rows == 1 or ld * itemsize % ALIGN == 0)


def padded_pitch(pitch: int) -> int:
    """The row pitch in bytes of the copy the runtime makes of an operand TMA cannot address
    (arrays.padded: rows padded to whole ALIGN-byte pieces)."""
    return -(-pitch // ALIGN) * ALIGN


def batch_addressable(batch_stride: int, itemsize: int) -> bool:
    """TMA's rule for the stride between the matrices of a batch (elements; 0: one matrix every
    batch shares, mapped as a batch of one): whole 16-byte pieces, under 2^40 bytes."""
    step = batch_stride * itemsize
    return step % ALIGN == 0 and 0 <= step < MAX_STRIDE


def tile_map(name: str, ptr: int, dtype: str, rows: int, cols: int, ld: int, box_rows: int,
             batches: int = 0, batch_stride: int = 0) -> TileMap:
    """The map for operand `name` stored as rows x cols (ld elements apart), checked against TMA's
    rules; AsmError saying which rule fails otherwise. batches > 0: a 3-D map of that many
    matrices batch_stride elements apart (batch_stride 0: one matrix the whole batch shares, mapped
    as a batch of one that the kernel reads at matrix 0)."""
    if dtype not in _DTYPES:
        raise AsmError(f"{name}: TMA tensor maps are built here for {', '.join(_DTYPES)}, not {dtype}")
    item = _DTYPES[dtype]
    if not 1 <= box_rows <= MAX_BOX:
        raise AsmError(f"{name}: a TMA box of {box_rows} rows (the kernel's constant) is outside 1..{MAX_BOX}")
    for what, v in (("rows", rows), ("columns", cols)):
        if not 1 <= v <= MAX_DIM:
            raise AsmError(f"{name}: {v} {what} is outside what a TMA tensor map can describe (1..{MAX_DIM})")
    if not addressable(ptr, rows, ld, item):
        why = f"its data starts at 0x{ptr:x}" if ptr % ALIGN else \
            f"rows are {ld * item} bytes apart (leading dimension {ld})"
        raise AsmError(f"{name}: {why}, not a multiple of {ALIGN} bytes as TMA requires", hint=TMA_HINT)
    if rows == 1:
        # never stepped over: any legal stride describes the one row
        row_bytes = -(-cols * item // ALIGN) * ALIGN
    else:
        row_bytes = ld * item
        if row_bytes >= MAX_STRIDE:
            raise AsmError(f"{name}: a row stride of {row_bytes} bytes exceeds TMA's limit (2^40)")
    if not batches:
        return TileMap(ptr, dtype, rows, cols, row_bytes, box_rows)
    if not batch_addressable(batch_stride, item):
        raise AsmError(f"{name}: its matrices are {batch_stride * item} bytes apart, not a multiple of {ALIGN} bytes "
                       "under 2^40 as the batch stride of a TMA tensor map must be", hint=TMA_HINT)
    if batch_stride == 0:
        # shared by the batch: one matrix, read at matrix 0 (a stride of 0 is no stride the driver
        # documents); a dimension of extent 1 is never stepped over, so the packed matrix's serves
        return TileMap(ptr, dtype, rows, cols, row_bytes, box_rows, 1, rows * row_bytes)
    if not 1 <= batches <= MAX_DIM:
        raise AsmError(f"{name}: a batch of {batches} matrices is outside what a TMA tensor map can describe "
                       f"(1..{MAX_DIM})")
    return TileMap(ptr, dtype, rows, cols, row_bytes, box_rows, batches, batch_stride * item)


_cache: OrderedDict[TileMap, object] = OrderedDict()


def encode(tm: TileMap):
    """The 128-byte kernel argument for `tm`: a numpy V128 scalar holding the driver's CUtensorMap
    (CuPy passes it by value into a `.param .align 64 .b8 [128]`). Cached per TileMap."""
    hit = _cache.get(tm)
    if hit is not None:
        _cache.move_to_end(tm)
        return hit
    value = _encode(tm)
    _cache[tm] = value
    if len(_cache) > CACHE_ENTRIES:
        _cache.popitem(last=False)
    return value


def _encode(tm: TileMap):
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise AsmError(f"the Hopper kernels need NVIDIA's cuda-bindings for their TMA tensor maps ({exc})",
                       hint="pip install 'asmgemm[gpu]'") from None
    dtype = {"float16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             "bfloat16": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
             "float32": driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT32}[tm.dtype]
    err, tmap = driver.cuTensorMapEncodeTiled(
        dtype, len(tm.dims), tm.ptr,
        [driver.cuuint64_t(d) for d in tm.dims],
        [driver.cuuint64_t(s) for s in tm.strides],
        [driver.cuuint32_t(b) for b in tm.box],
        [driver.cuuint32_t(1)] * len(tm.dims),
        driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        {256: driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
         128: driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B}[tm.l2_promotion],
        driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise AsmError(f"cuTensorMapEncodeTiled refused the map {tm} ({err})")
    words = np.array([int(w) for w in tmap.opaque], dtype=np.uint64)
    return np.frombuffer(words.tobytes(), dtype="V128")[0]


def clear_cache() -> None:
    _cache.clear()


# ---- a map moved to another address ----------------------------------------------------------------
# A kept launch's operands come at new addresses from call to call (gemm's own new C, a caller's new
# activations), and encoding the moved map through the driver cost ~23 us of host time on the H100
# (cuda-bindings' call and its argument objects), more than the rest of a call. On the H100's driver
# (CUDA 13.0) the 128-byte CUtensorMap holds the global address plainly in its first 8 bytes, and
# two maps 4096 bytes apart differ there only. That layout is not documented, so it is not assumed:
# `mover` learns it per map from the driver. It encodes the map at addresses with a low, a middle and
# a high bit of the address flipped, and moves the map by rewriting word 0 only when each of those is
# the map's own bytes with word 0 replaced by its address; otherwise every new address goes to the
# driver, as before. The probes' addresses need no memory behind them: an encode reads none.
ADDRESS_WORD = 0
_ADDRESS_PROBES = (1 << 4, 1 << 21, 1 << 40)      # bits flipped in the probes' addresses


def mover(tm: TileMap):
    """ptr -> the encoded map `tm` at address ptr (what encode(tm with that ptr) gives): by rewriting
    the address word of tm's own encoding where the driver's maps were checked to hold the address
    there and nowhere else (the block above), else through encode."""
    first = encode(tm)

    def by_driver(ptr: int):
        return first if ptr == tm.ptr else encode(_moved(tm, ptr))
    raw = first.tobytes() if hasattr(first, "tobytes") else b""
    if len(raw) != 128:                 # not a CUtensorMap (a test's stand-in encode): ask encode each time
        return by_driver
    words = np.frombuffer(raw, dtype=np.uint64).copy()
    if int(words[ADDRESS_WORD]) != tm.ptr:
        return by_driver
    for bit in _ADDRESS_PROBES:
        probe = tm.ptr ^ bit
        want = words.copy()
        want[ADDRESS_WORD] = probe
        if not np.array_equal(np.frombuffer(encode(_moved(tm, probe)).tobytes(), dtype=np.uint64), want):
            return by_driver

    def rewritten(ptr: int):
        check_moved_address(ptr)            # the address rule, as for any map
        moved = words.copy()
        moved[ADDRESS_WORD] = ptr
        return moved.view("V128")[0]
    # a holder of this map's bytes may move it itself: check_moved_address, then the address into
    # this word (launch.ParamBlock does, where numpy's copy and conversion cost ~3.5 us a call)
    rewritten.address_word = ADDRESS_WORD
    return rewritten


def check_moved_address(ptr: int) -> None:
    """AsmError for an address TMA cannot start at (the plan's key keeps a kept launch's pointers at
    the alignment it was planned with, so this is a safeguard)."""
    if ptr % ALIGN:
        raise AsmError(f"a tensor map's data starts at 0x{ptr:x}, not a multiple of {ALIGN} bytes as TMA requires",
                       hint=TMA_HINT)


def _moved(tm: TileMap, ptr: int) -> TileMap:
    """tm at address ptr; AsmError for an address TMA cannot start at (check_moved_address)."""
    check_moved_address(ptr)
    return TileMap(ptr, tm.dtype, tm.rows, tm.cols, tm.row_bytes, tm.box_rows, tm.batches, tm.batch_bytes)
