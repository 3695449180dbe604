"""Issue 33 on the GPU: 16-bit batched gemm() (attention's Q.K^T and P.V) and asmgemm.grouped_gemm
(a mixture of experts), against float64 torch/numpy under the kernels' rel_err_limit.

Batched: a matrix per batch in all four layouts, odd s and d, broadcast (a shared 2-D or batch-of-1
operand), heads as the batch of a (b, s, h, d) tensor (q.transpose(1, 2): a row stride of h * d),
alpha/beta, a bias and an activation, an fp32 C, bf16; each must run (no refusal) on the portable
kernel's batched mode where hgemm cannot take it as one 2-D GEMM. Grouped: uneven experts with
empty ones, one expert holding every token, experts of fewer rows than a tile, B as (E, K, N) and
as a transposed (E, N, K) view, an fp32 out, offsets on the device (no host read: the call is
captured in a CUDA graph and replayed with other offsets). Shapes are small: the whole file runs in
well under a minute. Needs torch with CUDA (and CuPy, as every GPU test)."""
from __future__ import annotations

import pytest

from asmgemm.kernel_spec import get_spec

pytestmark = pytest.mark.gpu


@pytest.fixture
def torch_cuda(cuda_gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def _err(torch, got, want):
    return float(torch.linalg.norm(got.double() - want) / torch.linalg.norm(want))


def _limit(dtype, c_f32=False):
    name = {("float16", False): "hgemm_mma", ("bfloat16", False): "bgemm_mma", ("float16", True): "hgemm_mma_f32c",
            ("bfloat16", True): "bgemm_mma_f32c"}[(str(dtype).removeprefix("torch."), c_f32)]
    return get_spec(name).rel_err_limit


# ---- batched ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_batched_all_layouts_odd_sizes(torch_cuda, layout, dtype):
    torch = torch_cuda
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    dt = getattr(torch, dtype)
    g = torch.Generator(device="cuda").manual_seed(0)
    bt, m, n, k = 6, 77, 65, 33
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = torch.randn((bt, k, m) if ta else (bt, m, k), device="cuda", generator=g).to(dt)
    b = torch.randn((bt, n, k) if tb else (bt, k, n), device="cuda", generator=g).to(dt)
    c = asmgemm.gemm(a, b, trans_a=ta, trans_b=tb)
    assert last_launch()["kernel"].endswith("_mma")
    want = (a.double().transpose(1, 2) if ta else a.double()) @ (b.double().transpose(1, 2) if tb else b.double())
    assert c.shape == (bt, m, n) and _err(torch, c, want) < _limit(dt)


@pytest.mark.parametrize("s, d", [(77, 64), (128, 65), (33, 128)])
def test_attention_heads_as_the_batch(torch_cuda, s, d):
    """Q.K^T and P.V on q.transpose(1, 2) of (b, s, h, d) tensors: heads as the batch, rows h * d apart."""
    torch = torch_cuda
    import asmgemm
    g = torch.Generator(device="cuda").manual_seed(1)
    b, h = 2, 3
    q, k, v = (torch.randn(b, s, h, d, device="cuda", generator=g, dtype=torch.float16) for _ in range(3))
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))     # (b, h, s, d) views
    for i in range(b):                                     # (h, s, d) views with row stride h * d
        scores = asmgemm.gemm(qh[i], kh[i], trans_b=True, alpha=d ** -0.5)
        want = (qh[i].double() @ kh[i].double().transpose(1, 2)) * d ** -0.5
        assert _err(torch, scores, want) < _limit(torch.float16)
        p = torch.softmax(scores.float(), -1).half()
        out = asmgemm.gemm(p, vh[i])
        assert _err(torch, out, p.double() @ vh[i].double()) < _limit(torch.float16)


@pytest.mark.parametrize("case", ["b_2d", "b_batch1", "a_2d", "a_batch1"])
def test_batched_broadcast(torch_cuda, case):
    torch = torch_cuda
    import asmgemm
    g = torch.Generator(device="cuda").manual_seed(2)
    bt, m, n, k = 5, 65, 33, 47                            # K = 47: rows TMA cannot address
    a = torch.randn({"a_2d": (m, k), "a_batch1": (1, m, k)}.get(case, (bt, m, k)), device="cuda", generator=g).half()
    b = torch.randn({"b_2d": (k, n), "b_batch1": (1, k, n)}.get(case, (bt, k, n)), device="cuda", generator=g).half()
    c = asmgemm.gemm(a, b)
    want = torch.matmul(a.double(), b.double())
    assert c.shape == want.shape and _err(torch, c, want) < _limit(torch.float16)


def test_issue_33_calls_run(torch_cuda):
    """The three calls the issue found refused."""
    torch = torch_cuda
    import asmgemm
    g = torch.Generator(device="cuda").manual_seed(3)
    for sa, sb in (((8, 128, 64), (8, 64, 96)), ((1, 77, 65), (12, 65, 33)), ((4, 1000, 300), (300, 700))):
        a = torch.randn(sa, device="cuda", generator=g).half()
        b = torch.randn(sb, device="cuda", generator=g).half()
        c = asmgemm.gemm(a, b)
        want = torch.matmul(a.double(), b.double())
        assert c.shape == want.shape and _err(torch, c, want) < _limit(torch.float16), (sa, sb)


def test_batched_epilogue_beta_and_fp32_c(torch_cuda):
    torch = torch_cuda
    import asmgemm
    g = torch.Generator(device="cuda").manual_seed(4)
    bt, m, n, k = 3, 70, 90, 41
    a = torch.randn(bt, m, k, device="cuda", generator=g).bfloat16()
    b = torch.randn(bt, n, k, device="cuda", generator=g).bfloat16()
    bias = torch.randn(n, device="cuda", generator=g).bfloat16()
    c0 = torch.randn(bt, m, n, device="cuda", generator=g).bfloat16()
    c = c0.clone()
    asmgemm.gemm(a, b, c, trans_b=True, alpha=0.5, beta=2.0, bias=bias, activation="gelu")
    want = torch.nn.functional.gelu(0.5 * (a.double() @ b.double().transpose(1, 2)) + 2.0 * c0.double()
                                    + bias.double())
    assert _err(torch, c, want) < _limit(torch.bfloat16)
    c32 = torch.empty(bt, m, n, device="cuda", dtype=torch.float32)
    asmgemm.gemm(a, b, c32, trans_b=True)
    assert _err(torch, c32, a.double() @ b.double().transpose(1, 2)) < _limit(torch.bfloat16, c_f32=True)


# ---- grouped --------------------------------------------------------------------------------------------
def _experts(torch, sizes, k, n, dtype, trans_b=False, seed=5):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(sum(sizes), k, device="cuda", generator=g).to(dtype)
    if trans_b:
        b = torch.randn(len(sizes), n, k, device="cuda", generator=g).to(dtype).transpose(1, 2)
    else:
        b = torch.randn(len(sizes), k, n, device="cuda", generator=g).to(dtype)
    offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
    return a, b, offs


def _want(torch, a, b, offs):
    out, start = [], 0
    for e, end in enumerate(offs.tolist()):
        out.append(a[start:end].double() @ b[e].double())
        start = end
    return torch.cat(out)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("trans_b", [False, True], ids=["b_ekn", "b_enk"])
@pytest.mark.parametrize("sizes", [[37, 0, 300, 1, 0, 129, 64], [0, 0, 411, 0]], ids=["skewed", "one_expert"])
def test_grouped_gemm(torch_cuda, dtype, trans_b, sizes):
    torch = torch_cuda
    import asmgemm
    dt = getattr(torch, dtype)
    a, b, offs = _experts(torch, sizes, 72, 130, dt, trans_b)
    out = asmgemm.grouped_gemm(a, b, offs)
    assert out.shape == (sum(sizes), 130) and out.dtype == dt
    assert _err(torch, out, _want(torch, a, b, offs)) < _limit(dt)


def test_grouped_gemm_odd_k_fp32_out_and_beta(torch_cuda):
    torch = torch_cuda
    import asmgemm
    sizes = [5, 17, 0, 90]
    a, b, offs = _experts(torch, sizes, 45, 33, torch.bfloat16, seed=6)      # K = 45: 2-byte copies
    out = torch.ones(sum(sizes), 33, device="cuda", dtype=torch.float32)
    asmgemm.grouped_gemm(a, b, offs, out, alpha=2.0, beta=-1.0, activation="relu")
    want = torch.relu(2.0 * _want(torch, a, b, offs) - 1.0)
    assert _err(torch, out, want) < _limit(torch.bfloat16, c_f32=True)


def test_grouped_gemm_against_torch_grouped_mm(torch_cuda):
    torch = torch_cuda
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    import asmgemm
    a, b, offs = _experts(torch, [16, 0, 48, 64], 64, 128, torch.bfloat16, trans_b=True, seed=7)
    try:
        theirs = torch._grouped_mm(a, b, offs=offs)
    except RuntimeError as exc:                  # (sm_90 and a torch build with it only)
        pytest.skip(f"torch._grouped_mm: {exc}")
    ours = asmgemm.grouped_gemm(a, b, offs)
    assert _err(torch, ours, theirs.double()) < _limit(torch.bfloat16)


def test_grouped_gemm_offsets_stay_on_the_device(torch_cuda):
    """Captured in a CUDA graph (a host read of offs would fail the capture), then replayed after the
    offsets changed in place: the kernel reads them on each launch."""
    torch = torch_cuda
    import asmgemm
    a, b, offs = _experts(torch, [40, 0, 100, 3], 64, 96, torch.float16, seed=8)
    out = torch.zeros(143, 96, device="cuda", dtype=torch.float16)
    asmgemm.grouped_gemm(a, b, offs, out)                   # planned and built outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        asmgemm.grouped_gemm(a, b, offs, out)
    offs.copy_(torch.tensor([3, 3, 3, 143], device="cuda", dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    assert _err(torch, out, _want(torch, a, b, offs)) < _limit(torch.float16)


def test_grouped_gemm_repeated_calls_take_new_operands(torch_cuda, monkeypatch):
    """The kept launch of a repeated call (gemm allocates out: the lane that skips the checks, made
    to fail here after the first call) reads each call's own A, B and offs: new tensors of the same
    layout with other offsets, each result right."""
    torch = torch_cuda
    import asmgemm
    from asmgemm.runtime import grouped
    first = grouped.check_grouped
    for dtype in (torch.float16, torch.bfloat16):
        monkeypatch.setattr(grouped, "check_grouped", first)
        outs = []
        for seed, sizes in ((11, [40, 0, 100, 3]), (12, [3, 3, 0, 137]), (13, [0, 143, 0, 0])):
            a, b, offs = _experts(torch, sizes, 64, 96, dtype, trans_b=True, seed=seed)
            outs.append((asmgemm.grouped_gemm(a, b, offs), _want(torch, a, b, offs)))
            monkeypatch.setattr(grouped, "check_grouped", lambda *args: pytest.fail("a repeated call was checked"))
        for out, want in outs:
            assert out.shape == (143, 96) and _err(torch, out, want) < _limit(dtype)


def test_grouped_gemm_list_form(torch_cuda):
    torch = torch_cuda
    import asmgemm
    g = torch.Generator(device="cuda").manual_seed(9)
    a = [torch.randn(m, 40, device="cuda", generator=g).half() for m in (3, 70, 1)]
    b = [torch.randn(40, n, device="cuda", generator=g).half() for n in (8, 33, 130)]
    for x, y, c in zip(a, b, asmgemm.grouped_gemm(a, b)):
        assert _err(torch, c, x.double() @ y.double()) < _limit(torch.float16)
