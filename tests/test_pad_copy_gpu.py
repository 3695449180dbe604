"""The runtime's padded copy (asm/runtime/pad_copy.py, kernels_ptx/pad_rows.sasm) on the GPU: an
operand TMA cannot read, copied into rows 16 bytes aligned, holds every element where the copy's
layout puts it, for odd leading dimensions, a base off 16 bytes, one row, one column, and rows past
the grid's y limit; through cuLaunchKernel and through CuPy's call alike. And hgemm on such operands
(its own path: the copies, not the in-place kernel) against an fp32 reference. Skipped without CuPy,
a GPU, or off sm_90."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.gpu]

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

from asmgemm.runtime import pad_copy  # noqa: E402
from asmgemm.runtime.arrays import CupyArrays  # noqa: E402
from asmgemm.runtime.gpu import device_facts  # noqa: E402
from asmgemm.runtime.tensor_map import padded_pitch  # noqa: E402

if device_facts().target != "sm_90":
    pytest.skip("the padded copy feeds TMA: an sm_90 (Hopper) GPU", allow_module_level=True)


def _copy(x, raw: bool, monkeypatch):
    if not raw:
        monkeypatch.setattr(pad_copy, "raw_launcher", lambda cupy, fn: None)
    monkeypatch.setattr(pad_copy, "_kept", {})
    rows, cols = x.shape
    pitch = padded_pitch(cols * 2)
    out = cp.full((rows * pitch // 2,), 0x5A5A, dtype=cp.uint16)
    stream = cp.cuda.get_current_stream()
    assert pad_copy.copy_padded_into(CupyArrays(cp), x, 2, out.data.ptr, stream.ptr)
    stream.synchronize()
    return out.reshape(rows, pitch // 2)[:, :cols]


@pytest.mark.parametrize("raw", [True, False], ids=["cuLaunchKernel", "cupy-call"])
@pytest.mark.parametrize("rows,cols,ld,off", [
    (4095, 4095, 4095, 0), (1000, 999, 1001, 3), (300, 7, 7, 1), (1, 12903, 12903, 5), (513, 1, 1, 0),
    (70000, 3, 5, 7), (64, 16, 16, 0), (33, 8, 9, 2),
])
def test_rows_land_in_the_padded_layout(rows, cols, ld, off, raw, monkeypatch):
    store = cp.random.default_rng(rows + cols).integers(0, 65535, off + (rows - 1) * ld + cols, dtype=cp.uint16)
    x = cp.lib.stride_tricks.as_strided(store[off:], (rows, cols), (2 * ld, 2))
    got = _copy(x, raw, monkeypatch)
    assert bool((got == x).all())


def test_rows_that_are_not_runs_are_refused(monkeypatch):
    x = cp.zeros((40, 30), dtype=cp.uint16)[:, ::2]
    assert not pad_copy.copy_padded_into(CupyArrays(cp), x, 2, cp.zeros(4096, cp.uint16).data.ptr, 0)


@pytest.mark.parametrize("m,n,k,layout", [(4095, 4095, 4095, "nn"), (1000, 999, 333, "tn"), (517, 300, 65, "nt")])
def test_hgemm_on_copied_operands(m, n, k, layout):
    import asmgemm
    from asmgemm.runtime import gemm, path_model
    rng = cp.random.default_rng(m + n + k)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32).astype(cp.float16)
    with path_model.in_place_off():
        gemm.clear_plan_cache()
        c = asmgemm.gemm(a, b, trans_a=ta, trans_b=tb, kernel="hgemm")
        ran = gemm.last_launch()
    gemm.clear_plan_cache()
    ref = (a.T if ta else a).astype(cp.float32) @ (b.T if tb else b).astype(cp.float32)
    err = float(cp.linalg.norm(c.astype(cp.float32) - ref) / cp.linalg.norm(ref))
    assert ran["copies"], ran
    assert err < 2e-3, err
