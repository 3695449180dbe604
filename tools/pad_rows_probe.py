#!/usr/bin/env python3
"""The padded copy of an operand TMA cannot read in place, two ways: cudaMemcpy2DAsync (what
asm/runtime/arrays.py's copy_padded_into did) and kernels_ptx/pad_rows.sasm (16-byte pieces
realigned by funnel shifts). For each case (rows x cols halves, rows ld halves apart, the matrix
starting OFF halves into its allocation, which ends at the matrix's last byte): whether the kernel's
copy holds every element of the matrix, and the GPU time of each (CUDA events, median of REPS, the
copies interleaved), with the rate as bytes read + written per second.

Usage (GPU, after `source tools/device_setup.sh`):
    python3 tools/pad_rows_probe.py 4095x4095 1000x999 300x7:7:3 --json out.json
    compute-sanitizer --tool memcheck python3 tools/pad_rows_probe.py 129x65:67:5 --reps 1
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _case(text: str) -> tuple[int, int, int, int]:
    """ROWSxCOLS[:LD[:OFF]] -> (rows, cols, ld, off)."""
    try:
        shape, *rest = text.split(":")
        rows, cols = (int(x) for x in shape.split("x"))
        ld = int(rest[0]) if rest else cols
        off = int(rest[1]) if len(rest) > 1 else 0
    except ValueError:
        raise SystemExit(f"pad_rows_probe: bad case {text!r} (ROWSxCOLS[:LD[:OFF]])")
    if ld < cols or min(rows, cols) < 1 or off < 0:
        raise SystemExit(f"pad_rows_probe: bad case {text!r} (LD >= COLS >= 1, ROWS >= 1, OFF >= 0)")
    return rows, cols, ld, off


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+", help="ROWSxCOLS[:LD[:OFF]] in halves")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    cases = [_case(c) for c in args.cases]
    import cupy as cp
    import numpy as np

    from asmgemm.pipeline import BuildOptions, assemble, build_file
    from asmgemm.runtime.tensor_map import padded_pitch
    cp.cuda.set_allocator(None)             # one cudaMalloc an array: memcheck sees each one's end
    result = build_file(ROOT / "kernels_ptx" / "pad_rows.sasm", BuildOptions(target="sm_90"))
    cub = os.path.join(tempfile.mkdtemp(), "pad_rows.cubin")
    with open(cub, "wb") as f:
        f.write(assemble(result).cubin)
    fn = cp.RawModule(path=cub).get_function("pad_rows")
    rt = cp.cuda.runtime
    out = []
    for rows, cols, ld, off in cases:
        row_bytes = 2 * cols
        pitch = padded_pitch(row_bytes)
        store = cp.asarray(np.random.default_rng(rows + cols).integers(0, 65535, off + (rows - 1) * ld + cols,
                                                                        dtype=np.uint16))
        src = store.data.ptr + 2 * off
        src_end = src + 2 * ((rows - 1) * ld + cols)
        want = cp.lib.stride_tricks.as_strided(store[off:], (rows, cols), (2 * ld, 2))
        dst_k = cp.zeros(rows * pitch // 2, dtype=cp.uint16)
        dst_m = cp.zeros(rows * pitch // 2, dtype=cp.uint16)
        pieces = -(-row_bytes // 16)
        grid = (-(-pieces // 256), min(-(-rows // result.constants["GROUP"]), 65535), 1)
        kargs = (np.uint64(src), np.uint64(dst_k.data.ptr), np.uint64(src_end), np.uint64(2 * ld),
                 np.uint32(pitch), np.uint32(rows), np.uint32(row_bytes))

        def kernel():
            fn(grid, (256, 1, 1), kargs)

        def memcpy():
            rt.memcpy2DAsync(dst_m.data.ptr, pitch, src, 2 * ld, row_bytes, rows, rt.memcpyDeviceToDevice, 0)
        kernel()
        memcpy()
        cp.cuda.Device().synchronize()
        got = dst_k.reshape(rows, pitch // 2)[:, :cols]
        ok = bool((got == want).all()) and bool((dst_m.reshape(rows, pitch // 2)[:, :cols] == want).all())
        times = {"kernel": [], "memcpy2d": []}
        for _ in range(args.reps):
            for name, f in (("kernel", kernel), ("memcpy2d", memcpy)):
                start, stop = cp.cuda.Event(), cp.cuda.Event()
                start.record()
                f()
                stop.record()
                stop.synchronize()
                times[name].append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
        moved = 2 * rows * row_bytes
        row = {"rows": rows, "cols": cols, "ld": ld, "off": off, "exact": ok}
        for name, ts in times.items():
            us = float(np.median(ts))
            row[f"{name}_us"] = round(us, 2)
            row[f"{name}_tb_s"] = round(moved / us / 1e6, 3)
        out.append(row)
        print(f"{rows}x{cols} ld {ld} off {off}: {'exact' if ok else 'WRONG'}  kernel {row['kernel_us']:.1f} us "
              f"({row['kernel_tb_s']:.2f} TB/s)  memcpy2D {row['memcpy2d_us']:.1f} us ({row['memcpy2d_tb_s']:.2f} TB/s)",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r["exact"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
