"""The padded copy of an operand TMA cannot read in place (its rows not 16-byte aligned), by
kernels_ptx/pad_rows.sasm: every row's bytes to the start of a 16-byte aligned row of the copy, in
whole 16-byte pieces realigned by funnel shifts, nothing past the matrix read.

It replaced one cudaMemcpy2DAsync, which moves rows at odd pitches at well under DRAM speed: on the
H200 (tools/pad_rows_probe.py, GPU time with CuPy's launch inside, 2026-11-28) 4095 x 4095 halves
50.7 us (1.32 TB/s read + written) against the kernel's 25.8 (2.60), 8191 x 8191 180.3 against 74.9
(3.58), 2000 x 2001 14.7 against 11.3; 4095^3 fp16 copies both operands. Small copies are
launch-bound either way. The kernel goes through cuLaunchKernel over kept argument bytes where
CuPy offers it (kept_launch.raw_launcher: CuPy's own call of a kernel costs ~10 us of host time),
else CuPy's call.

The kernel is built once per target (build cache) and loaded once per device; a launch writes its
seven arguments into the device's kept block under a lock."""
from __future__ import annotations

import ctypes
import functools
import struct
import threading

import numpy as np

from ..kernel_spec import Dtypes, KernelSpec, Launch, shipped_spec_file
from .build_cache import build_kernel
from .gpu import device_facts
from .kept_launch import STATIC_SMEM_DEFAULT, load, raw_launcher
from .launch import packed_arguments
from .tensor_map import padded_pitch

PAD_ABI = ("src", "dst", "src_end", "src_pitch", "dst_pitch", "rows", "row_bytes")
# the arguments' layout, in .param order (pad_rows.sasm's entry: four .u64, three .u32): a launch
# packs all seven with one struct.pack_into (seven numpy scalars, their tobytes and memmoves were
# the largest own time in a cProfile of idle-GPU calls of the copy path, H200, 2026-11-28); CuPy's
# own call (no raw launcher) takes them as numpy scalars of the same types
_LAYOUT = "<QQQQIII"
_TYPES = tuple({"Q": np.uint64, "I": np.uint32}[f] for f in _LAYOUT[1:])
MAX_GRID_Y = 65535


@functools.lru_cache(maxsize=1)
def pad_spec() -> KernelSpec:
    """pad_rows.sasm as a spec the build cache can build and check (its abi, its launch
    constants); not a GEMM anyone launches by name."""
    spec_file = shipped_spec_file()
    return KernelSpec("pad_rows", spec_file.parent / "pad_rows.sasm", "pad_rows",
                      "padded copy of rows TMA cannot read in place", Dtypes("float16", "float16", "float16", "float16"),
                      ("sm_90", "sm_90a"), PAD_ABI, (), 0.0, Launch("THREADS", "ROWS", "COLS", "SMEM_BYTES"), (),
                      spec_file)


class _KeptCopy:
    """One device's loaded kernel and its kept argument block for cuLaunchKernel."""

    def __init__(self, cupy, device: int):
        built = build_kernel(pad_spec(), {}, device_facts(device).target)
        self.fn = load(cupy, built, STATIC_SMEM_DEFAULT)
        self.threads = built.threads
        self.rows_per_block = built.tile_m        # the rows a thread copies at once (pad_rows.sasm's GROUP)
        self.raw = raw_launcher(cupy, self.fn)
        self.lock = threading.Lock()
        self._block, self._array = packed_arguments(_LAYOUT)
        self._array_address = ctypes.addressof(self._array)

    def launch(self, args: tuple, grid: tuple, stream_ptr: int, cupy) -> None:
        if self.raw is None:
            stream = cupy.cuda.ExternalStream(stream_ptr) if stream_ptr else None
            self.fn(grid, (self.threads, 1, 1), tuple(t(v) for t, v in zip(_TYPES, args)), stream=stream)
            return
        launch, handle = self.raw
        with self.lock:
            struct.pack_into(_LAYOUT, self._block, 0, *args)
            launch(handle, grid[0], grid[1], grid[2], self.threads, 1, 1, 0, stream_ptr, self._array_address, 0)


_kept: dict[int, _KeptCopy] = {}
_kept_lock = threading.Lock()


def _kept_copy(cupy) -> _KeptCopy:
    device = cupy.cuda.Device().id
    kept = _kept.get(device)
    if kept is None:
        with _kept_lock:
            kept = _kept.get(device)
            if kept is None:
                kept = _kept[device] = _KeptCopy(cupy, device)
    return kept


def copy_padded_into(arrays, x, itemsize: int, dst_ptr: int, stream_ptr: int) -> bool:
    """x's rows into storage at dst_ptr (16-byte aligned) laid out as arrays.padded lays them
    (rows padded_pitch bytes apart), by one launch of pad_rows on stream_ptr, on the current
    device; False, copying nothing, where x's rows are not runs of adjacent elements (the caller
    then uses arrays.padded)."""
    ptr, (rows, cols), (row_stride, col_stride) = arrays.layout(x)
    width = cols * itemsize
    if rows == 1:
        row_stride = width              # a lone row's stride is free (torch gives size-1 dims any)
    if cols == 1:
        col_stride = itemsize
    if col_stride != itemsize or row_stride < width or itemsize % 2:
        return False                    # (the kernel moves 2-byte elements: rows at even addresses)
    if rows and cols:
        kept = _kept_copy(arrays.cupy)
        pieces = -(-width // 16)
        grid = (-(-pieces // kept.threads), min(-(-rows // kept.rows_per_block), MAX_GRID_Y), 1)
        src_end = ptr + (rows - 1) * row_stride + width
        kept.launch((ptr, dst_ptr, src_end, row_stride, padded_pitch(width), rows, width), grid, stream_ptr,
                    arrays.cupy)
    return True
