"""cuLaunchKernel over kept parameter blocks against CuPy's RawKernel call (ASMGEMM_RAW_LAUNCH=0), on
the GPU: the same bits in C for sgemm (plain, split through the reduce, split in clusters, a fused
epilogue), hgemm (tensor maps, new C pointers each call) and a torch call on a side stream; and the
raw path is what a kept plan uses. Skipped without CuPy or a GPU."""
from __future__ import annotations

import pytest

import asmgemm
from asmgemm.runtime import gemm as gemm_module
from asmgemm.runtime import kept_launch

pytestmark = pytest.mark.gpu


def _both(monkeypatch, run):
    """run() under each launch path, the plan cache emptied before each; (raw, cupy's) results."""
    out = []
    for flag in ("1", "0"):
        monkeypatch.setenv("ASMGEMM_RAW_LAUNCH", flag)
        gemm_module.clear_plan_cache()
        first = run()
        kept = kept_launch._last_launch[0]
        assert (kept.raw is not None) == (flag == "1"), f"ASMGEMM_RAW_LAUNCH={flag}: raw={kept.raw}"
        second = run()                                   # through the kept plan
        out.append((first, second))
    gemm_module.clear_plan_cache()
    return out


@pytest.mark.parametrize("m,n,k,params,bias", [
    (1000, 1000, 1000, None, False),                      # split 4 ways through the reduce
    (512, 768, 768, None, False),                         # 8 splits in clusters
    (300, 200, 100, {"THREADS": 64}, False),
    (256, 384, 512, None, True),                          # fused bias + gelu
])
def test_sgemm_same_bits_both_paths(cuda_gpu, monkeypatch, m, n, k, params, bias):
    cp = cuda_gpu
    rng = cp.random.default_rng(m + n + k)
    a = rng.standard_normal((m, k), dtype=cp.float32)
    b = rng.standard_normal((k, n), dtype=cp.float32)
    c0 = rng.standard_normal((m, n), dtype=cp.float32)
    vec = rng.standard_normal((n,), dtype=cp.float32) if bias else None

    def run():
        c = c0.copy()
        asmgemm.gemm(a, b, c, alpha=0.75, beta=0.5, params=params, bias=vec, activation="gelu" if bias else None)
        return c
    (raw1, raw2), (ref1, ref2) = _both(monkeypatch, run)
    for x in (raw1, raw2, ref2):
        assert bool((x == ref1).all())


@pytest.mark.parametrize("m,n,k", [(1024, 1024, 1024), (512, 768, 3072), (2048, 2048, 7), (300, 77, 500)])
def test_hgemm_same_bits_both_paths(cuda_gpu, monkeypatch, m, n, k):
    """New C arrays each call: the tensor map of C is rewritten when its pointer moves."""
    cp = cuda_gpu
    rng = cp.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k), dtype=cp.float32).astype(cp.float16)
    b = rng.standard_normal((k, n), dtype=cp.float32).astype(cp.float16)

    def run():
        return [asmgemm.gemm(a, b) for _ in range(3)]
    (raw1, raw2), (ref1, ref2) = _both(monkeypatch, run)
    for got in raw1 + raw2 + ref2:
        assert bool((got == ref1[0]).all())


def test_torch_call_on_a_side_stream(cuda_gpu, monkeypatch):
    """The raw launch goes to torch's current stream: the inputs are written on a side stream that
    is still busy when gemm is called on it, and C is read after that stream only."""
    torch = pytest.importorskip("torch")
    monkeypatch.setenv("ASMGEMM_RAW_LAUNCH", "1")
    gemm_module.clear_plan_cache()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        a = torch.empty(2048, 2048, device="cuda")
        b = torch.empty(2048, 2048, device="cuda")
        for _ in range(20):                                # keep the side stream busy before the writes land
            a.normal_()
            b.normal_()
        a.mul_(1.0)
        c = asmgemm.gemm(a, b)
        c2 = asmgemm.gemm(a, b)                            # the kept plan
    side.synchronize()
    assert kept_launch._last_launch[0].raw is not None
    ref = a.double() @ b.double()
    for out in (c, c2):
        assert float((out.double() - ref).norm() / ref.norm()) < 1e-5
    gemm_module.clear_plan_cache()
