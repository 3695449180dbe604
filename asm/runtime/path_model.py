"""Padded copy or in place: the model that decides, for an operand a TMA kernel cannot read (rows
not 16-byte aligned), between copying it into padded storage and running the TMA kernel, and
running the spec's `in_place` kernel (kernels.toml, e.g. hgemm -> hgemm_mma) on the operands as
they are.

Each path's time is modelled from the problem and a few per-GPU coefficients, never a size
threshold:

    copy path     = copies * copy_host_s + copied_bytes * 2 / copy_bytes_per_s + TMA kernel
    TMA kernel    = the cost model's GPU time of the TMA kernel's pick (its catalog, on the padded
                    operands), or where C is written in elements or pairs (C's rows not whole
                    16-byte pieces, wide_c = 0) max(padded flops / (tma_flops * fill), C bytes / the
                    kernel's C store rate, far below DRAM's), tiles of 128 x 128
    in-place path = the cost model's GPU time of the in-place kernel's pick (runtime/cost_model.py:
                    its catalog, split-K included), or, for a kernel without a catalog,
                    padded flops / (in_place_flops * fill) with its tile

(copied_bytes * 2: the copy reads and writes every byte; fill <= 1: the share of the GPU's block
slots the tiles fill, so a 5 x 4096 x 4096 call whose tiles are 92% padding and fill an eighth of
the slots is charged for it). copy_host_s is what each copied operand adds to a call besides moving
bytes: the copy's launch and its start on the GPU (the storage is kept per stream since
2026-11-28, so no allocation and no new tensor map: in a loop the copy adds 1-12 us a call, but a
call from an idle GPU, the benchmark's headline, still paid ~28 us more than in place:
5546x2800x14 against 5546x2800x16 bf16 nt, `tools/call_gap_diag.py`, 85 against 57 us). The copy wins
where the GEMM is long enough for the faster TMA kernel to earn its copy back: at 4095^3 (fp16,
both operands copied: 134 MB moved, ~58 us on the H200 by pad_copy.py's kernel) against ~340 us of
GEMM in place; at 1000^3 the copies' host work alone costs more than the in-place GEMM.

Operands TMA reads in place (aligned rows, C in whole 16-byte pieces) are weighed too, kernel against
kernel: the cost model's time of the TMA kernel's pick against that of the in-place kernel's pick,
the in-place kernel running only where its time times the two estimates' combined error at their
sizes (`aligned_margin`) is still the shorter. The deep-K calls over few outputs are why: the TMA kernel
splits K at most 4 ways where the in-place catalog splits 50-60 ways (16x16x13344 tt on the H200:
22.8 us on the TMA kernel, 8.9 in place; docs/log/dispatch.md).

Pure: the runtime passes the numbers; tests check the decision on the CPU.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class PathCoefficients:
    copy_bytes_per_s: float      # a device-to-device copy, counting bytes read plus bytes written
    copy_host_s: float           # what each copied operand adds to a call besides moving bytes
    tma_flops: float             # the TMA kernel's sustained rate on large problems
    in_place_flops: float        # the in-place kernel's sustained rate on large problems
    sms: int = 132               # multiprocessors (the fill of a launch's tiles)
    c_store_bytes_per_s: float = 1.5e12         # the TMA kernel writing C in 16-byte pieces (wide_c)
    c_narrow_store_bytes_per_s: float = 0.45e12  # ... in elements or pairs (rows not whole pieces)


# NVIDIA H100 80GB HBM3 (nvidia-h100-x1): the copy bandwidth is the workplace's reading of a large
# device-to-device copy (~3.0 TB/s read + write, /work/.library/device/KINDS.md; rows at odd pitches
# by cudaMemcpy2DAsync reached only 1.3-1.5 TB/s on the H200, the runtime's own copy since,
# pad_copy.py, 2.3-3.8 there: tools/pad_rows_probe.py, not yet read on the H100); the host cost per
# copied operand from `asmgemm bench hgemm|bgemm --shapes random:41:60|random:43:60` (2026-11-27,
# docs/log/dispatch.md): a call's host time was 12-19 us in place, 29-48 us with one operand
# copied and 40-78 us with two; the rates are the kernels' measured TFLOP/s at 4096^3-8192^3
# (hgemm ~700, mma_gemm ~400-450: docs/log/mma.md); C in elements or pairs: hgemm's GPU time on
# large M x N at K <= 98 with rows of C not whole 16-byte pieces in the same benchmark, 0.32-0.61
# TB/s of C written (3658x15588x20 nt 187 us, 9152x3028x2 97 us, 3112x8147x5 bf16 147 us).
H100 = PathCoefficients(copy_bytes_per_s=3.0e12, copy_host_s=20e-6, tma_flops=700e12, in_place_flops=400e12)

# Devices without a measurement of their own scale the H100's by their SM count (rates and
# bandwidth per SM as the H100's): a model, not a reading, until a sweep of that device replaces it.
_MEASURED = {"NVIDIA H100 80GB HBM3": H100}
_H100_SMS = 132


def coefficients(device_name: str, sm_count: int) -> PathCoefficients:
    """The measured coefficients of this device, else the H100's scaled by SM count."""
    hit = _MEASURED.get(device_name)
    if hit is not None:
        return hit
    f = max(1, sm_count) / _H100_SMS
    return PathCoefficients(H100.copy_bytes_per_s * f, H100.copy_host_s, H100.tma_flops * f, H100.in_place_flops * f,
                            max(1, sm_count))


def copy_path_s(m: int, n: int, k: int, copied_bytes: int, c: PathCoefficients, copies: int = 1,
                c_bytes: int = 0, c_wide: bool = True) -> float:
    """Modelled seconds of the padded copies (`copies` operands, copied_bytes in all) and the TMA
    kernel (writing c_bytes of C, in 16-byte pieces or narrower)."""
    return sum(_copy_terms(m, n, k, copied_bytes, c, copies, c_bytes, c_wide))


def _copy_terms(m: int, n: int, k: int, copied_bytes: int, c: PathCoefficients, copies: int, c_bytes: int,
                c_wide: bool) -> tuple[float, float, float]:
    """The copy path's seconds: (the copies' per-call cost, their bytes read and written, the TMA kernel)."""
    return copies * c.copy_host_s, 2 * copied_bytes / c.copy_bytes_per_s, tma_kernel_s(m, n, k, c, c_bytes, c_wide)


TMA_TILE = (128, 128)            # the TMA kernel's tile the fill is counted in (one block a multiprocessor)


def tma_kernel_s(m: int, n: int, k: int, c: PathCoefficients, c_bytes: int = 0, c_wide: bool = True) -> float:
    """Modelled seconds of the TMA kernel: its padded flops at its rate times the share of the
    multiprocessors its tiles fill, or writing C (c_bytes) where that takes longer. A roofline of
    128 x 128 tiles, not the kernel's own configuration nor its fixed cost a launch: good enough to
    weigh a narrow store, not to weigh the two kernels on calls TMA reads and writes in place (there
    the in-place kernel won 26 of 44 launches under 8 us and lost 15 of 22 large ones on the H100,
    docs/log/dispatch.md); those are weighed with the cost model's time of the TMA kernel's pick."""
    tm, tn = TMA_TILE
    tiles = -(-m // tm) * -(-n // tn)
    fill = min(1.0, tiles / c.sms)
    store = c_bytes / (c.c_store_bytes_per_s if c_wide else c.c_narrow_store_bytes_per_s)
    return max(2 * tiles * tm * tn * k / (c.tma_flops * fill), store)


def narrow_store_bound(m: int, n: int, k: int, c: PathCoefficients, c_bytes: int) -> bool:
    """Whether the TMA kernel's modelled time for a C written in elements or pairs (not whole
    16-byte pieces) is that store's, not its FLOPs': where the in-place kernel may win with no copy."""
    return tma_kernel_s(m, n, k, c, c_bytes, False) > tma_kernel_s(m, n, k, c, 0, True)


def blocks_per_sm(tile_m: int, tile_n: int) -> int:
    """The in-place kernel's blocks a multiprocessor runs at once: 2 of its 128 x 128 tiles (230-240
    registers for 128 threads, `asmgemm check mma_gemm`), 4 of smaller ones (64 x 64: 92 registers,
    32 KB of shared memory; 5 would fit)."""
    return 2 if tile_m * tile_n >= 128 * 128 else 4


def in_place_path_s(m: int, n: int, k: int, c: PathCoefficients, tile: tuple[int, int] | None = None) -> float:
    """Modelled seconds of the in-place kernel; tile (rows, columns): its tiling for this call
    (None: no padding, the whole GPU busy)."""
    if tile is None:
        return 2 * m * n * k / c.in_place_flops
    tm, tn = tile
    tiles = -(-m // tm) * -(-n // tn)
    fill = min(1.0, tiles / (c.sms * blocks_per_sm(tm, tn)))
    return 2 * tiles * tm * tn * k / (c.in_place_flops * fill)


# The two estimates' errors, by how long each estimate is (rms of log(estimate / measured) over the
# calls whose estimate is under each bound, seconds): the error grows with the call, and one rms for
# all sizes (the constants 0.133 and 0.216 until 2026-11-30) made the margin on tiny aligned calls,
# where both estimates are good to 7-14%, as wide as on 30 us ones, where the in-place one errs by
# 28%: tiny calls the in-place kernel runs 10-20% faster stayed on the TMA kernel (docs/log/dispatch.md,
# "The neighbours' factor on its own term"). Both tables are of the cost model whose neighbours scale
# the term they were measured against (cost_model.py, 2026-11-30).
# The TMA kernel's side: the modelled GPU time of its catalog's pick (neighbours included) against
# the measured, on the 283 calls held out of the H200's fit ("A few tile rows over a large B"):
# 126 / 78 / 79 calls (all sizes: 0.117).
TMA_PICK_RMS_LOG = ((8e-6, 0.072), (16e-6, 0.125), (math.inf, 0.159))
# The in-place kernel's: the estimate the path weighs against its measured GPU time, on 180 aligned
# H200 calls of training seeds (`git show a3d138b:tools/data/path_aligned_h200.json.gz`, random_9154-
# 9156): 74 / 65 / 41 calls (all sizes: 0.209). Both trees' estimates on those calls and the choices
# timed: `git show ba85375:tools/data/neighbours_2026-11-30/`.
IN_PLACE_RMS_LOG = ((8e-6, 0.144), (16e-6, 0.218), (math.inf, 0.280))


def rms_log_at(table: tuple, estimate_s: float) -> float:
    """The rms log error of an estimate of `estimate_s` seconds (TMA_PICK_RMS_LOG, IN_PLACE_RMS_LOG)."""
    return next(rms for bound, rms in table if estimate_s < bound)


def aligned_margin(tma_s: float, in_place_s: float, tma_table: tuple = TMA_PICK_RMS_LOG,
                   in_place_table: tuple = IN_PLACE_RMS_LOG) -> float:
    """The factor by which the in-place estimate must beat the TMA kernel's: e^(the two estimates'
    rms log errors at their sizes, combined): 1.17 where both are under 8 us, 1.38 past 16 (a move
    is made where the model's advantage exceeds one standard error of the difference, not on its
    point estimate). It does not fall as in_place_s grows, so a candidate that cannot win by it
    leaves every slower one unable to."""
    return math.exp(math.hypot(rms_log_at(tma_table, tma_s), rms_log_at(in_place_table, in_place_s)))


@dataclass(frozen=True)
class PathDecision:
    """One call's choice between the padded copies plus the TMA kernel and the in-place kernel,
    with the terms that decided it (what `asmgemm explain` shows)."""
    copies: int                  # operands copied on the copy path
    copied_bytes: int
    copy_host_s: float           # copies x copy_host_s
    copy_bytes_s: float          # the copies' bytes, read and written
    tma_kernel_s: float
    in_place_s: float
    in_place: bool               # the in-place kernel runs
    narrow_c: bool = False       # the TMA kernel would write C in elements or pairs
    # operands TMA reads in place: tma_kernel_s is the cost model's time of the TMA kernel's pick,
    # and the in-place kernel runs only where in_place_s x margin is the shorter (aligned_margin)
    margin: float = 1.0

    @property
    def copy_path_s(self) -> float:
        return self.copy_host_s + self.copy_bytes_s + self.tma_kernel_s

    def to_json(self) -> dict:
        us = 1e6
        return {"copies": self.copies, "copied_bytes": self.copied_bytes,
                "copy_path_us": round(self.copy_path_s * us, 3), "copy_host_us": round(self.copy_host_s * us, 3),
                "copy_bytes_us": round(self.copy_bytes_s * us, 3), "tma_kernel_us": round(self.tma_kernel_s * us, 3),
                "in_place_us": round(self.in_place_s * us, 3), "in_place": self.in_place, "narrow_c": self.narrow_c,
                "margin": round(self.margin, 3)}


def decide(m: int, n: int, k: int, copied_bytes: int, c: PathCoefficients, tile: tuple[int, int] | None = None,
           copies: int = 1, in_place_s: float | None = None, c_bytes: int = 0, c_wide: bool = True,
           tma_s: float | None = None, margin: float = 1.0) -> PathDecision:
    """The in-place kernel runs where it is expected to finish no later than the copies and the TMA
    kernel (its time x margin); in_place_s: its modelled time where the caller has one (the cost
    model's), else in_place_path_s with `tile`; tma_s: the TMA kernel's time at its own
    configuration (the cost model's) where the caller has one, else the roofline (tma_kernel_s)."""
    if in_place_s is None:
        in_place_s = in_place_path_s(m, n, k, c, tile)
    host, moved, kernel = _copy_terms(m, n, k, copied_bytes, c, copies, c_bytes, c_wide)
    if tma_s is not None:
        kernel = tma_s
    return PathDecision(copies, copied_bytes, host, moved, kernel, in_place_s,
                        in_place_s * margin <= host + moved + kernel, not c_wide, margin)


@contextlib.contextmanager
def in_place_off():
    """Within the block every path decision keeps the TMA kernel (decide's in_place is False), its
    terms still computed: for the TMA kernel's own GPU tests and for tools that time it
    (tools/call_gap_diag.py --paths). Launch plans made inside are planned so: callers forget kept
    plans on both sides (asmgemm.runtime.gemm.clear_plan_cache)."""
    global decide
    original = decide

    def keep_tma(*args, **kwargs) -> PathDecision:
        return replace(original(*args, **kwargs), in_place=False)
    decide = keep_tma
    try:
        yield
    finally:
        decide = original
