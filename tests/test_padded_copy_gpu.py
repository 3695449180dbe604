"""The copy path of the TMA kernel on the GPU (issue 31: "a copy costs no per-call allocation or host
work beyond the copy launch itself"): an operand whose rows TMA cannot read is copied by one copy
launch (runtime/pad_copy.py) into storage kept per stream (runtime/split_scratch.py, SplitScratch.buffer), the same
address every call. Repeated calls on new data, two streams alternating without a sync, and a
torch CUDA graph replayed on new inputs must each give C right. The CPU side (the plan kept on
the copy's layout, the kept address, the graph's per-call storage) is tests/test_host_overhead.py
and tests/test_splitk_fixup.py."""
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

if not device_facts().target.startswith("sm_90"):
    pytest.skip("the TMA kernel (hgemm) needs sm_90a", allow_module_level=True)

# K = 14 halves: rows of 28 bytes, which TMA cannot address; kernel="hgemm" with params= keeps the
# TMA kernel (the path model may otherwise run the in-place kernel)
M, N, K = 300, 200, 14
PINNED = {"kernel": "hgemm", "params": {}}


def _pair(seed: int):
    rng = np.random.default_rng(seed)
    a = cp.asarray(rng.uniform(-1, 1, (M, K)).astype(np.float16))
    bt = cp.asarray(rng.uniform(-1, 1, (N, K)).astype(np.float16))     # B stored (N, K): nt
    return a, bt


def _check(a, bt, c):
    want = a.astype(cp.float32) @ bt.T.astype(cp.float32)
    err = float(cp.linalg.norm(c.astype(cp.float32) - want) / cp.linalg.norm(want))
    assert err < 2e-3, err


def test_repeated_calls_copy_new_data_into_the_same_storage():
    stream_ptr = cp.cuda.get_current_stream().ptr
    arrays, dev = types.SimpleNamespace(cupy=cp), cp.cuda.Device().id
    seen = set()
    for seed in range(4):
        a, bt = _pair(seed)
        c = cp.full((M, N), np.nan, cp.float16)
        asmgemm.gemm(a, bt.T, c, **PINNED)
        assert last_launch()["copies"], "the call was meant to copy an operand"
        _check(a, bt, c)
        entry = split_scratch.SCRATCH._kept[(arrays.cupy, dev, stream_ptr)]
        seen.add(tuple(ptr for _, ptr, _ in entry.buffers.values()))
    assert len(seen) == 1           # no new storage after the first call


def test_two_streams_alternating_copy_into_their_own_storage():
    pairs = [_pair(seed) for seed in range(8)]
    cp.cuda.Device().synchronize()
    streams = [cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)]
    outs = []
    for i, (a, bt) in enumerate(pairs):
        with streams[i % 2]:
            c = cp.full((M, N), np.nan, cp.float16)
            asmgemm.gemm(a, bt.T, c, **PINNED)
            outs.append(c)
    for st in streams:
        st.synchronize()
    for (a, bt), c in zip(pairs, outs):
        _check(a, bt, c)


def test_a_torch_graph_replays_a_call_that_copies():
    """Inside the capture the copy goes to storage from the graph's pool (nothing kept is baked
    into the graph); replays on new inputs give their products."""
    torch = pytest.importorskip("torch")
    a = torch.randn(M, K, device="cuda", dtype=torch.float16)
    bt = torch.randn(N, K, device="cuda", dtype=torch.float16)
    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        asmgemm.gemm(a, bt.T, c, **PINNED)          # warm: the plan and the kept storage
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            asmgemm.gemm(a, bt.T, c, **PINNED)
    for seed in range(3):
        torch.manual_seed(seed)
        a.copy_(torch.randn(M, K, device="cuda", dtype=torch.float16))
        bt.copy_(torch.randn(N, K, device="cuda", dtype=torch.float16))
        with torch.cuda.stream(stream):             # an eager call between replays reuses the kept storage
            asmgemm.gemm(torch.randn(M, K, device="cuda", dtype=torch.float16), bt.T, **PINNED)
        graph.replay()
        torch.cuda.synchronize()
        want = a.float() @ bt.T.float()
        assert float((c.float() - want).norm() / want.norm()) < 2e-3
