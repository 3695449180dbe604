"""hgemm's batched mode on the H100 (BATCHED=1: 3-D TMA maps, the persistent grid over batch x
tiles; issue 33): batched fp16/bf16 gemm() against torch.matmul in fp32, for the calls that do not
fold into one 2-D GEMM. Where TMA reads every matrix in place (rows and batch strides multiples of
16 bytes) last_launch() must name the Hopper kernel with BATCHED=1; elsewhere the in-place
kernel's batched mode (hgemm_mma, grid z) runs, and the result must be as right. torch tensors,
outputs allocated by gemm() unless a case gives C. Skipped without CuPy, torch with CUDA and a GPU;
tests/test_hgemm_batched.py checks the same routing on the CPU."""
from __future__ import annotations

import pytest

from asmgemm.kernel_spec import get_spec

pytestmark = pytest.mark.gpu

DTYPES = ("float16", "bfloat16")
HOPPER = {"float16": "hgemm", "bfloat16": "bgemm"}
IN_PLACE = {"float16": "hgemm_mma", "bfloat16": "bgemm_mma"}


@pytest.fixture(scope="module")
def torch_gpu(cuda_gpu):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


def rand(torch, *shape, dtype="float16", seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g).to(getattr(torch, dtype))


def reference(torch, a, b, trans_a=False, trans_b=False):
    """op(A) op(B) in fp32 with torch.matmul's broadcast of a batch of one or a 2-D operand."""
    a32, b32 = a.float(), b.float()
    return torch.matmul(a32.transpose(-1, -2) if trans_a else a32, b32.transpose(-1, -2) if trans_b else b32)


def rel_err(torch, got, want) -> float:
    return float(torch.linalg.norm(got.double() - want.double()) / torch.linalg.norm(want.double()))


def check(torch, got, want, batched_on: str | None):
    """got against want under the kernel's limit; batched_on: the kernel last_launch() must name
    with BATCHED=1 (None: a call that ran as one 2-D GEMM)."""
    from asmgemm.runtime.gemm import last_launch
    ran = last_launch()
    assert got.shape == want.shape
    err = rel_err(torch, got, want)
    assert err < get_spec(ran["kernel"]).rel_err_limit, (err, ran["kernel"], ran["params"])
    if batched_on is not None:
        assert ran["kernel"] == batched_on and ran["params"].get("BATCHED") == "1", ran
    return ran


# (a's shape, b's shape, trans_a, trans_b, runs on: "hopper" (BATCHED=1), "in_place" or "2d")
SHAPES = {
    "batch1": ((1, 128, 64), (1, 64, 96), False, False, "2d"),              # a batch of one: the matrix
    "batch3_odd_s": ((3, 77, 64), (3, 64, 40), False, False, "hopper"),
    "batch8_issue": ((8, 128, 64), (8, 64, 96), False, False, "hopper"),     # the first call
    "batch12_shared_a_odd_k": ((1, 77, 65), (12, 65, 33), False, False, "in_place"),   # the second
    "batch12_shared_a_legal": ((1, 77, 72), (12, 72, 40), False, False, "hopper"),
    "batch3_qk_odd": ((3, 129, 72), (3, 131, 72), False, True, "hopper"),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(SHAPES))
def test_batch_shapes(torch_gpu, dtype, case):
    torch = torch_gpu
    import asmgemm
    sa, sb, ta, tb, runs = SHAPES[case]
    a, b = rand(torch, *sa, dtype=dtype), rand(torch, *sb, dtype=dtype, seed=1)
    got = asmgemm.gemm(a, b, trans_a=ta, trans_b=tb)
    ran = check(torch, got, reference(torch, a, b, ta, tb), HOPPER[dtype] if runs == "hopper" else None)
    if runs == "in_place":
        assert ran["kernel"] == IN_PLACE[dtype] and ran["params"].get("BATCHED") == "1", ran
    if runs == "2d":
        assert ran["params"].get("BATCHED", "0") == "0", ran


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_batch_all_four_layouts(torch_gpu, dtype, layout):
    torch = torch_gpu
    import asmgemm
    ta, tb = layout[0] == "t", layout[1] == "t"
    bt, m, n, k = 3, 96, 80, 136
    a = rand(torch, *((bt, k, m) if ta else (bt, m, k)), dtype=dtype)
    b = rand(torch, *((bt, n, k) if tb else (bt, k, n)), dtype=dtype, seed=1)
    got = asmgemm.gemm(a, b, trans_a=ta, trans_b=tb)
    check(torch, got, reference(torch, a, b, ta, tb), HOPPER[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_heads_of_a_transposed_view(torch_gpu, dtype):
    """Attention's heads as the batch: q.transpose(1, 2)[i] of a (b, s, h, d) tensor is (h, s, d)
    with rows h * d apart and matrices d apart; Q.K^T and then P.V on such views, read in place."""
    torch = torch_gpu
    import asmgemm
    b_, s, h, d = 2, 77, 4, 64
    q, k, v = (rand(torch, b_, s, h, d, dtype=dtype, seed=i) for i in range(3))
    qh, kh, vh = (x.transpose(1, 2)[1] for x in (q, k, v))                 # (h, s, d) views
    assert qh.stride() == (d, h * d, 1)
    scores = asmgemm.gemm(qh, kh, trans_b=True)
    check(torch, scores, reference(torch, qh, kh, trans_b=True), HOPPER[dtype])
    # P with rows padded to 80 halves: a contiguous (h, 77, 77) P has rows of 154 bytes, which TMA
    # cannot step (test_batch_shapes' in-place cases cover that)
    p = torch.zeros(h, s, 80, device="cuda", dtype=scores.dtype)[:, :, :s]
    p.copy_(torch.softmax(scores.float(), dim=-1))
    out = asmgemm.gemm(p, vh)
    check(torch, out, reference(torch, p, vh), HOPPER[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_shared_b_under_a_transposed_a(torch_gpu, dtype):
    """B 2-D (or a batch of one), A transposed: the batch does not stack as rows (no fold), B's one
    matrix is read for every batch (batch stride 0)."""
    torch = torch_gpu
    import asmgemm
    a = rand(torch, 5, 72, 80, dtype=dtype)                                 # op(A) = A^T: 80 x 72
    for b in (rand(torch, 72, 48, dtype=dtype, seed=1), rand(torch, 1, 72, 48, dtype=dtype, seed=2)):
        got = asmgemm.gemm(a, b, trans_a=True)
        check(torch, got, reference(torch, a, b, trans_a=True), HOPPER[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_alpha_beta_into_a_given_c(torch_gpu, dtype):
    torch = torch_gpu
    import asmgemm
    a, b = rand(torch, 4, 129, 64, dtype=dtype), rand(torch, 4, 64, 72, dtype=dtype, seed=1)
    c0 = rand(torch, 4, 129, 72, dtype=dtype, seed=2)
    c = c0.clone()
    asmgemm.gemm(a, b, c, alpha=0.5, beta=2.0)
    check(torch, c, 0.5 * reference(torch, a, b) + 2.0 * c0.float(), HOPPER[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("where", ["cols", "rows"])
def test_batch_bias_relu_shared_by_the_batch(torch_gpu, dtype, where):
    torch = torch_gpu
    import asmgemm
    a, b = rand(torch, 3, 200, 64, dtype=dtype), rand(torch, 3, 64, 136, dtype=dtype, seed=1)
    bias = rand(torch, *((136,) if where == "cols" else (200, 1)), dtype=dtype, seed=2)
    got = asmgemm.gemm(a, b, bias=bias, activation="relu")
    want = torch.relu(reference(torch, a, b) + bias.float())
    check(torch, got, want, HOPPER[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_fp32_c(torch_gpu, dtype):
    """A float32 C of 16-bit A and B: hgemm_f32c / bgemm_f32c's batched mode (fp32 C staged by TMA
    through a 3-D map where its rows are whole 16-byte pieces; pairs where they are not)."""
    torch = torch_gpu
    import asmgemm
    a, b = rand(torch, 3, 150, 64, dtype=dtype), rand(torch, 3, 64, 96, dtype=dtype, seed=1)
    kernel = HOPPER[dtype] + "_f32c"
    for n in (96, 90):
        c = torch.empty(3, 150, n, device="cuda", dtype=torch.float32)
        asmgemm.gemm(a, b[:, :, :n], c)
        check(torch, c, reference(torch, a, b[:, :, :n]), kernel)


def test_batch_repeated_calls_follow_new_pointers(torch_gpu):
    """A kept launch re-encodes its 3-D maps for new arrays of the same layout."""
    torch = torch_gpu
    import asmgemm
    for seed in range(3):
        a, b = rand(torch, 6, 128, 64, seed=seed), rand(torch, 6, 64, 128, seed=seed + 10)
        check(torch, asmgemm.gemm(a, b), reference(torch, a, b), "hgemm")
