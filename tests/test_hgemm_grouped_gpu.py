"""hgemm's grouped mode (GROUPED=1, issue 33) on the H100: asmgemm.grouped_gemm against torch.matmul
per expert in float64 (the kernels' rel_err_limit), fp16 and bf16 in, 16-bit or fp32 out; E = 1, 3,
8, 64; empty experts, one expert holding every token, experts of fewer rows than a tile, a total
that is no multiple of the tile's rows; B as (E, K, N) and as a transposed (E, N, K) view;
alpha/beta; rows of out past offs[-1] untouched; a CUDA-graph capture. Each TMA-legal call must
name hgemm/bgemm with GROUPED=1 in last_launch(); K * 2 % 16 != 0 runs on the portable kernel
(hgemm_mma). Needs torch with CUDA and an sm_90 device (the other GPUs run the portable kernel:
tests/test_grouped_gpu.py)."""
from __future__ import annotations

import pytest

from asmgemm.kernel_spec import get_spec
from test_grouped_gpu import _experts, _want  # the expert set-up and the fp64 reference per expert

pytestmark = pytest.mark.gpu

HOPPER = {"float16": "hgemm", "bfloat16": "bgemm"}


@pytest.fixture
def torch_cuda(cuda_gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("hgemm's grouped mode is sm_90a (wgmma)")
    return torch


def _err(torch, got, want):
    return float(torch.linalg.norm(got.double() - want) / max(float(torch.linalg.norm(want)), 1e-30))


def _limit(dtype, c_f32=False):
    name = HOPPER[str(dtype).removeprefix("torch.")] + ("_f32c" if c_f32 else "")
    return get_spec(name).rel_err_limit


def _ran_grouped_hopper(dtype, c_f32=False):
    from asmgemm.runtime.gemm import last_launch
    ran = last_launch()
    want = HOPPER[str(dtype).removeprefix("torch.")] + ("_f32c" if c_f32 else "")
    return ran["kernel"] == want and ran["params"].get("GROUPED") == "1", ran


def _skewed(e, total, seed):
    """E expert sizes summing to `total`, skewed (a few large, some empty): a Zipf-like draw."""
    import random
    rng = random.Random(seed)
    weights = [0.0 if rng.random() < 0.2 else 1.0 / (1 + i) ** 1.2 for i in range(e)]
    rng.shuffle(weights)
    weights[rng.randrange(e)] += 1.0                               # never all empty
    sizes = [int(total * w / sum(weights)) for w in weights]
    sizes[max(range(e), key=lambda i: sizes[i])] += total - sum(sizes)
    return sizes


CASES = {
    "e1": [200],
    "e3_empty_first": [0, 130, 67],
    "e8_small": [1, 0, 63, 5, 200, 0, 17, 129],
    "one_expert_all": [0, 0, 0, 333, 0],
    "e64_skewed": _skewed(64, 1000, 3),
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["b_ekn", "b_enk"])
@pytest.mark.parametrize("case", list(CASES))
def test_grouped_on_hgemm(torch_cuda, dtype, trans_b, case):
    torch = torch_cuda
    import asmgemm
    dt = getattr(torch, dtype)
    sizes = CASES[case]
    a, b, offs = _experts(torch, sizes, 192, 136, dt, trans_b, seed=len(sizes))
    out = asmgemm.grouped_gemm(a, b, offs)
    ran, info = _ran_grouped_hopper(dt)
    assert ran, info
    assert out.shape == (sum(sizes), 136) and out.dtype == dt
    assert _err(torch, out, _want(torch, a, b, offs)) < _limit(dt)


def test_fp32_out_alpha_beta_and_rows_past_the_last_expert(torch_cuda):
    """out has 20 rows past offs[-1]: they keep their values; alpha, beta and relu on the rest."""
    torch = torch_cuda
    import asmgemm
    sizes = [70, 0, 3, 150]
    a, b, offs = _experts(torch, sizes, 128, 72, torch.bfloat16, seed=11)
    a = torch.cat([a, torch.randn(20, 128, device="cuda").to(torch.bfloat16)])
    out = torch.full((a.shape[0], 72), 7.0, device="cuda", dtype=torch.float32)
    asmgemm.grouped_gemm(a, b, offs, out, alpha=0.5, beta=2.0, activation="relu")
    ran, info = _ran_grouped_hopper(torch.bfloat16, c_f32=True)
    assert ran, info
    want = torch.relu(0.5 * _want(torch, a, b, offs) + 14.0)
    assert _err(torch, out[:223], want) < _limit(torch.bfloat16, c_f32=True)
    assert bool((out[223:] == 7.0).all())


def test_fp16_out_beta_keeps_rows_past_the_end(torch_cuda):
    torch = torch_cuda
    import asmgemm
    sizes = [0, 257, 9]
    a, b, offs = _experts(torch, sizes, 64, 264, torch.float16, trans_b=True, seed=12)
    a = torch.cat([a, torch.zeros(5, 64, device="cuda", dtype=torch.float16)])
    c0 = torch.randn(a.shape[0], 264, device="cuda").to(torch.float16)
    out = c0.clone()
    asmgemm.grouped_gemm(a, b, offs, out, alpha=1.5, beta=-1.0)
    ran, info = _ran_grouped_hopper(torch.float16)
    assert ran, info
    want = 1.5 * _want(torch, a, b, offs) - c0[:266].double()
    assert _err(torch, out[:266], want) < _limit(torch.float16)
    assert torch.equal(out[266:], c0[266:])


def test_rows_no_multiple_of_the_tile_and_64_row_tiles(torch_cuda):
    """E = 64 experts averaging fewer than 64 rows (the 64-row tiles, CONSUMERS = 1), 1999 tokens."""
    torch = torch_cuda
    import asmgemm
    sizes = _skewed(64, 1999, 7)
    a, b, offs = _experts(torch, sizes, 256, 128, torch.bfloat16, seed=13)
    out = asmgemm.grouped_gemm(a, b, offs)
    ran, info = _ran_grouped_hopper(torch.bfloat16)
    assert ran and info["params"].get("CONSUMERS") == "1", info
    assert _err(torch, out, _want(torch, a, b, offs)) < _limit(torch.bfloat16)


def test_k_tma_cannot_step_runs_on_the_portable_kernel(torch_cuda):
    """K = 60: rows of 120 bytes, no multiple of 16: hgemm_mma, in place."""
    torch = torch_cuda
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    a, b, offs = _experts(torch, [30, 0, 90], 60, 64, torch.float16, seed=14)
    out = asmgemm.grouped_gemm(a, b, offs)
    assert last_launch()["kernel"] == "hgemm_mma" and last_launch()["params"]["GROUPED"] == "1"
    assert _err(torch, out, _want(torch, a, b, offs)) < get_spec("hgemm_mma").rel_err_limit


def test_a_cuda_graph_replays_with_new_offsets(torch_cuda):
    """Captured (a host read of offs would fail the capture), replayed after offs changed in place."""
    torch = torch_cuda
    import asmgemm
    a, b, offs = _experts(torch, [40, 0, 100, 3], 128, 128, torch.bfloat16, seed=15)
    out = torch.zeros(143, 128, device="cuda", dtype=torch.bfloat16)
    asmgemm.grouped_gemm(a, b, offs, out)                   # planned and built outside the capture
    ran, info = _ran_grouped_hopper(torch.bfloat16)
    assert ran, info
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        asmgemm.grouped_gemm(a, b, offs, out)
    offs.copy_(torch.tensor([3, 3, 130, 143], device="cuda", dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert _err(torch, out, _want(torch, a, b, offs)) < _limit(torch.bfloat16)


def test_the_issue_shape_against_torch_grouped_mm(torch_cuda):
    """E = 8 over 4096 skewed tokens, K x N = 7168 x 2048 in bf16, against torch._grouped_mm."""
    torch = torch_cuda
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    import asmgemm
    a, b, offs = _experts(torch, _skewed(8, 4096, 1), 7168, 2048, torch.bfloat16, trans_b=True, seed=16)
    try:
        theirs = torch._grouped_mm(a, b, offs=offs)
    except RuntimeError as exc:
        pytest.skip(f"torch._grouped_mm: {exc}")
    ours = asmgemm.grouped_gemm(a, b, offs)
    ran, info = _ran_grouped_hopper(torch.bfloat16)
    assert ran, info
    assert _err(torch, ours, theirs.double()) < _limit(torch.bfloat16)
