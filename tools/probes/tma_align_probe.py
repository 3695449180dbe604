"""Does TMA's tile mode take a box origin off a 16-byte boundary of the row (an element-granular
contiguous coordinate)? tools/probes/tma_align_probe.sasm loads one {64 halves, 16 rows} box from
src at (x0, 2) and stores it to dst at (x1, 3), both maps with or without the 128-byte swizzle.
One process a case (a fault ends the CUDA context); prints ok / WRONG / FAIL. Measured on the
H200 (2026-11-28): x0, x1 multiples of 8 halves run, any other origin faults with an illegal
instruction, swizzled or not, load or store (docs/design/hgemm.md, "Hopper facts").

Usage (GPU, from the project root after `source tools/device_setup.sh`):
    python3 tools/probes/tma_align_probe.py none 3 5
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("swizzle", choices=["none", "128"])
    ap.add_argument("x0", type=int, help="the load's contiguous coordinate (halves)")
    ap.add_argument("x1", type=int, help="the store's contiguous coordinate (halves)")
    args = ap.parse_args()
    import cupy as cp
    import numpy as np
    from cuda.bindings import driver

    from asmgemm.pipeline import BuildOptions, assemble, build_file
    swz, x0, x1 = args.swizzle, args.x0, args.x1
    y0, y1 = 2, 3
    rows, cols, ld = 40, 200, 208              # rows 416 bytes apart: a legal stride

    def tmap(ptr):
        sw = {"none": driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
              "128": driver.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B}[swz]
        err, m = driver.cuTensorMapEncodeTiled(
            driver.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, ptr,
            [driver.cuuint64_t(cols), driver.cuuint64_t(rows)], [driver.cuuint64_t(ld * 2)],
            [driver.cuuint32_t(64), driver.cuuint32_t(16)], [driver.cuuint32_t(1)] * 2,
            driver.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, sw,
            driver.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            driver.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
        assert err == driver.CUresult.CUDA_SUCCESS, err
        return np.frombuffer(np.array([int(w) for w in m.opaque], dtype=np.uint64).tobytes(), dtype="V128")[0]

    result = build_file(HERE / "tma_align_probe.sasm",
                        BuildOptions(target="sm_90a", include_dirs=[str(HERE.parent.parent / "kernels_ptx")]))
    cub = os.path.join(tempfile.mkdtemp(), "p.cubin")
    with open(cub, "wb") as f:
        f.write(assemble(result).cubin)
    fn = cp.RawModule(path=cub).get_function("tma_align_probe")
    src = cp.arange(rows * ld, dtype=cp.uint16).reshape(rows, ld)
    dst = cp.zeros((rows, ld), dtype=cp.uint16)
    try:
        fn((1, 1, 1), (32, 1, 1), (tmap(src.data.ptr), tmap(dst.data.ptr), np.int32(x0), np.int32(y0),
                                   np.int32(x1), np.int32(y1)), shared_mem=4096)
        cp.cuda.Device().synchronize()
    except Exception as e:                      # noqa: BLE001
        print(f"FAIL swizzle {swz} x0 {x0} x1 {x1}: {type(e).__name__} {e}")
        return 1
    h, d = cp.asnumpy(src), cp.asnumpy(dst)
    want = np.zeros_like(d)
    w = min(64, cols - x0, cols - x1)
    want[y1:y1 + 16, x1:x1 + w] = h[y0:y0 + 16, x0:x0 + w]
    ok = (d == want).all()
    print(f"{'ok' if ok else 'WRONG'} swizzle {swz} x0 {x0} x1 {x1}: dst row {y1} cols {x1}..: {d[y1, x1:x1 + 4]} "
          f"(src {h[y0, x0:x0 + 4]}); nonzero {int((d != 0).sum())} of {16 * w}")
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(main())
