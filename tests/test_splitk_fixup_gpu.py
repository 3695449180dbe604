"""Split-K in one launch (issue 32, mma_gemm.sasm's SPLIT_FIXUP) on the GPU: the last block of each
tile sums the tile's slices into C with the reduce kernel's instructions, so C must have the very
bits of the two-launch split (the partial pass, then splitk_reduce.sasm). params= force each mode
(SPLIT_FIXUP = 1 / 0) with the same split: fp16 and bf16 inputs, fp16/bf16 and fp32 C, alpha and
beta, the four layouts, odd shapes, S = 2, 5 and 27; repeated calls (each tile's counter must be
back at 0 for the next launch, else a tile is never summed: C is NaN-filled before each call);
two streams alternating (each its own kept workspace and counters); a torch CUDA graph capturing
a split call. Skipped without CuPy and a GPU of sm_80 or later. The CPU side (the interpreter's
bit-for-bit check, the build, the model, the kept scratch) is tests/test_splitk_fixup.py."""
from __future__ import annotations

import types

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

from asmgemm.runtime.gpu import gpu_available  # noqa: E402

if not gpu_available():
    pytest.skip("needs CuPy and a CUDA GPU", allow_module_level=True)
import cupy as cp  # noqa: E402

import asmgemm  # noqa: E402
from asmgemm.runtime import split_scratch  # noqa: E402
from asmgemm.runtime.gemm import last_launch  # noqa: E402
from asmgemm.runtime.gpu import device_facts  # noqa: E402

if int(device_facts().target[3:].rstrip("af")) < 80:
    pytest.skip("mma_gemm needs sm_80 or later", allow_module_level=True)

KERNEL = {("float16", False): "hgemm_mma", ("bfloat16", False): "bgemm_mma", ("float16", True): "hgemm_mma_f32c"}
SMALL = {"BM": 64, "BN": 64, "WM": 32, "WN": 32}
# (M, N, K, S asked): S comes out as asked (k_chunk = ceil(K / S) rounded up to 64 keeps S splits)
SHAPES = [(16, 314, 1725, 27), (133, 33, 4290, 5), (31, 747, 7681, 2)]


def _operand(rng, rows, cols, dtype):
    x = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
    if dtype == "bfloat16":
        return cp.asarray((x.view(np.uint32) >> 16).astype(np.uint16))     # bf16 bit patterns
    return cp.asarray(x.astype(np.float16))


def _operands(m, n, k, layout, dtype, seed=0):
    rng = np.random.default_rng(seed)
    ta, tb = layout[0] == "t", layout[1] == "t"
    a = _operand(rng, *((k, m) if ta else (m, k)), dtype)
    b = _operand(rng, *((n, k) if tb else (k, n)), dtype)
    return (a.T if ta else a), (b.T if tb else b)


def _c(m, n, dtype, c_f32, seed=9):
    x = np.random.default_rng(seed).uniform(-1, 1, (m, n)).astype(np.float32)
    if c_f32:
        return cp.asarray(x)
    if dtype == "bfloat16":
        return cp.asarray((x.view(np.uint32) >> 16).astype(np.uint16))
    return cp.asarray(x.astype(np.float16))


def _both(m, n, k, splits, layout, dtype, c_f32, alpha, beta, tiling=SMALL):
    """C from each mode (same inputs, same initial C) and what each launch reported."""
    a, b = _operands(m, n, k, layout, dtype)
    out, runs = {}, {}
    for fixup in (0, 1):
        c = _c(m, n, dtype, c_f32)
        asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, kernel=KERNEL[(dtype, c_f32)],
                     params={**tiling, "SPLIT_K": splits, "SPLIT_FIXUP": fixup})
        cp.cuda.get_current_stream().synchronize()
        out[fixup], runs[fixup] = c, last_launch()
    return out, runs


CASES = ([(layout, "float16", False) for layout in ("nn", "nt", "tn", "tt")]
         + [(layout, "bfloat16", False) for layout in ("nn", "tt")]
         + [(layout, "float16", True) for layout in ("nt", "tn")])


@pytest.mark.parametrize("m,n,k,splits", SHAPES, ids=[f"{m}x{n}x{k}_s{s}" for m, n, k, s in SHAPES])
@pytest.mark.parametrize("layout,dtype,c_f32", CASES, ids=[f"{lay}-{d}{'-f32c' if f else ''}" for lay, d, f in CASES])
def test_one_launch_gives_the_two_launch_bits(m, n, k, splits, layout, dtype, c_f32):
    out, runs = _both(m, n, k, splits, layout, dtype, c_f32, alpha=0.75, beta=-0.5)
    assert runs[0]["reduce"] == "kernel" and runs[1]["reduce"] == "in_kernel", runs
    assert runs[0]["splits"] == runs[1]["splits"] == splits, runs
    assert runs[1]["grid"] == runs[0]["grid"] and runs[1]["rerun_params"]["SPLIT_FIXUP"] == 1
    word = cp.uint32 if c_f32 else cp.uint16
    assert bool((out[0].view(word) == out[1].view(word)).all()), "C's bits differ between the two modes"


def test_the_other_tilings_give_the_same_bits_and_the_model_pick_never_sums_in_the_kernel():
    """The catalog's 128 x 128 tilings (four warps of 64 x 64 on 16-byte rows; eight of 64 x 32 on
    odd ones) give the same bits too; untuned, the model's pick for 16x314x1725 never sums its split
    by each tile's last block alone (the one-launch sum is params= only: split_k.in_kernel_fixup):
    it runs unsplit, the reduce kernel or, on a GPU with clusters, a split in clusters
    (tests/test_mma_cluster_k_gpu.py) or past 8 splits clusters whose sums the kernel adds
    (tests/test_mma_cluster_fixup_gpu.py; on the H200 the model picked s14c8 here, 2026-11-28)."""
    out, runs = _both(64, 256, 4096, 8, "nn", "float16", False, 1.0, 0.0, tiling={})
    assert bool((out[0].view(cp.uint16) == out[1].view(cp.uint16)).all()) and runs[1]["tile"] == (128, 128)
    out, runs = _both(77, 301, 3001, 6, "tn", "bfloat16", False, -1.5, 0.25, tiling={"WN": 32})
    assert bool((out[0].view(cp.uint16) == out[1].view(cp.uint16)).all())
    a, b = _operands(16, 314, 1725, "nn", "float16")
    asmgemm.gemm(a, b, kernel="hgemm_mma")
    run = last_launch()
    assert run["splits"] == 1 or run["reduce"] in ("kernel", "cluster", "cluster+in_kernel"), run
    assert run["chosen_by"] in ("model", "database"), run


def test_repeated_calls_find_the_counters_back_at_zero():
    """C NaN-filled before each call (beta = 0 never reads it): a tile whose counter a launch left
    non-zero would never be summed again and stay NaN."""
    m, n, k, s = 133, 33, 4290, 5
    a, b = _operands(m, n, k, "tn", "bfloat16")
    first = None
    for _ in range(6):
        c = cp.full((m, n), 0xFFFF, dtype=cp.uint16)            # bf16 NaN
        asmgemm.gemm(a, b, c, beta=0.0, kernel="bgemm_mma", params={**SMALL, "SPLIT_K": s, "SPLIT_FIXUP": 1})
        assert last_launch()["reduce"] == "in_kernel"
        if first is None:
            first = c.copy()
            assert not bool((first == 0xFFFF).any())
        assert bool((c == first).all())


def test_two_streams_alternating_keep_their_own_scratch():
    """Calls alternate between two streams with no sync between them: each stream counts on its
    own counters in its own workspace (shared ones would race), and each C is right."""
    m, n, k, s = 16, 314, 1725, 27
    a, b = _operands(m, n, k, "nn", "float16")
    ref = asmgemm.gemm(a, b, kernel="hgemm_mma", params={**SMALL, "SPLIT_K": s, "SPLIT_FIXUP": 0})
    cp.cuda.Device().synchronize()          # (the streams below do not wait for the default one)
    streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
    outs = [[], []]
    for i in range(8):
        with streams[i % 2]:
            c = cp.empty((m, n), cp.float16)
            asmgemm.gemm(a, b, c, kernel="hgemm_mma", params={**SMALL, "SPLIT_K": s, "SPLIT_FIXUP": 1})
            outs[i % 2].append(c)
    for st in streams:
        st.synchronize()
    for c in outs[0] + outs[1]:
        assert bool((c.view(cp.uint16) == ref.view(cp.uint16)).all())
    arrays, dev = types.SimpleNamespace(cupy=cp), cp.cuda.Device().id      # (the scratch is kept per CuPy module)
    assert all(split_scratch.SCRATCH.kept(arrays, dev, st.ptr)[1] > 0 for st in streams)


def test_a_torch_graph_captures_a_one_launch_split():
    """A split call captured in a CUDA graph (torch) and replayed on new inputs: inside the capture
    the call takes its workspace and counters from the graph's pool (the counters' zeroing is a
    node of the graph), nothing kept is baked into it."""
    torch = pytest.importorskip("torch")
    m, n, k, s = 16, 314, 1725, 27
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        asmgemm.gemm(a, b, c, kernel="hgemm_mma", params={**SMALL, "SPLIT_K": s, "SPLIT_FIXUP": 1})             # warm: plan and scratch kept
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            asmgemm.gemm(a, b, c, kernel="hgemm_mma", params={**SMALL, "SPLIT_K": s, "SPLIT_FIXUP": 1})
    for seed in range(3):
        torch.manual_seed(seed)
        a.copy_(torch.randn(m, k, device="cuda", dtype=torch.float16))
        graph.replay()
        torch.cuda.synchronize()
        want = asmgemm.gemm(a, b, kernel="hgemm_mma", params={**SMALL, "SPLIT_K": s, "SPLIT_FIXUP": 0})
        torch.cuda.synchronize()
        assert torch.equal(c.view(torch.int16), want.view(torch.int16))
