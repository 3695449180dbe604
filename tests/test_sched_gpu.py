"""GPU: the SGEMM kernel built with its .schedule regions reordered computes the same, correct
result as the one built in source order (fresh random inputs, C poisoned, float64 reference)."""
import math

import pytest

from asmgemm.pipeline import BuildOptions, assemble, build_file, shipped_kernels
from asmgemm.toolchain import find_tool

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas"),
              pytest.mark.skipif("sgemm" not in shipped_kernels(), reason="no sgemm kernel shipped yet")]


def _geometry(res):
    """(threads, tile m, tile n, dynamic shared bytes), read as the runtime reads them."""
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.build_cache import launch_geometry
    geo = launch_geometry(get_spec("sgemm"), res)
    return geo["threads"], geo["tile_m"], geo["tile_n"], geo["smem_bytes"]


def _abi():
    from asmgemm.kernel_spec import get_spec
    return get_spec("sgemm").abi


# The source defaults (8x8 per thread, 128x128 tile) and the variant asmgemm.gemm picks for large
# problems (16x8 per thread with load-ahead, 256x128 tile, BK=16), both with .schedule regions.
VARIANTS = {"default": {}, "large": {"RQ": "4", "LOAD_AHEAD": "1", "LDG_NC": "0", "BK": "16"}}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("shape", [(257, 129, 67), (128, 128, 8), (1, 300, 33)])
def test_scheduled_sgemm_is_correct(shape, variant, tmp_path, cuda_gpu):
    cp = cuda_gpu
    import numpy as np
    m, n, k = shape
    rng = np.random.default_rng(sum(shape))
    a = cp.asarray(rng.standard_normal((m, k), dtype=np.float32))
    b = cp.asarray(rng.standard_normal((k, n), dtype=np.float32))
    ref = a.astype(cp.float64) @ b.astype(cp.float64)
    # 128-bit global loads need lda (= K) and ldb (= N) to be multiples of 4 floats.
    params = build_file("sgemm").parameters
    defines = {name: str(int(ld % 4 == 0)) for name, ld in (("VEC_A", k), ("VEC_B", n)) if name in params}
    defines.update(VARIANTS[variant])
    outs = {}
    for schedule in (True, False):
        res = build_file("sgemm", BuildOptions(schedule=schedule, defines=defines))
        if schedule:
            assert res.schedule_report.regions, "sgemm has no .schedule regions"
        path = tmp_path / f"s{int(schedule)}.cubin"
        path.write_bytes(assemble(res).cubin)
        fn = cp.RawModule(path=str(path)).get_function(res.kernel_names[0])
        threads, tile_m, tile_n, smem = _geometry(res)
        if smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = smem
        c = cp.full((m, n), cp.nan, dtype=cp.float32)
        # every .param of the entry, in the spec's abi order (a short tuple makes the driver read
        # past it: a segfault on the host, seen on the H100 when the abi grew); off modes get zeros
        values = {"A": a, "B": b, "C": c, "M": np.uint32(m), "N": np.uint32(n), "K": np.uint32(k),
                  "lda": np.uint32(k), "ldb": np.uint32(n), "ldc": np.uint32(n), "alpha": np.float32(1.0),
                  "beta": np.float32(0.0), "bias": np.uint64(0), "batch_stride_a": np.uint64(0),
                  "batch_stride_b": np.uint64(0), "batch_stride_c": np.uint64(0), "k_chunk": np.uint32(k),
                  "split_stride": np.uint64(0), "workspace": np.uint64(0), "tile_counters": np.uint64(0)}
        fn((math.ceil(n / tile_n), math.ceil(m / tile_m)), (threads,), tuple(values[x] for x in _abi()),
           shared_mem=smem)
        cp.cuda.runtime.deviceSynchronize()
        assert not bool(cp.isnan(c).any()), "some elements of C were not written"
        err = float(cp.linalg.norm(c.astype(cp.float64) - ref) / cp.linalg.norm(ref))
        assert err < 1e-5, f"schedule={schedule}: relative error {err:.2e}"
        outs[schedule] = c
    # Reordering independent FMAs of distinct accumulators does not change any rounding.
    assert bool(cp.array_equal(outs[True], outs[False]))
