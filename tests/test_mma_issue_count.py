"""What a block of mma_gemm.sasm issues where K is a tile or two, counted by the interpreter of
tests/ptx_sim.py (instructions a warp issues, predicated off or not, as ncu's inst_executed).

Why: a large C over a K of 2-9 is issued-instruction bound (ncu on the H200, 4543x4546x3 fp16:
ALU pipe 72%, 1347 SASS instructions a warp of the 64 x 64 tile), and the prologue spent about a
third of them copying the STAGES - 1 - KT tiles past K (zero-filled cp.async, or the realigned
path's granule loads and shifts), and each pass of the loop past K stored the realigned
registers of a tile already stored. Now tiles past K only commit their empty groups, so a K of one
or two tiles issues the same copies whatever the ring's depth, and only a few instructions of
bookkeeping more for each stage (docs/log/mma.md, step 13)."""
from __future__ import annotations

import collections
import math

import numpy as np
import pytest

from ptx_sim import Memory
from test_mma_gemm_sim import _aligned, _args, _halves, _kernel

# the copies and the realigned path's loads and stores into the ring
COPIES = ("cp.async.ca", "cp.async.cg", "ld.global", "st.shared.v4")
# an empty tile a stage: the commit, the stage's move (4), the prologue's KT test and branch (2)
BOOKKEEPING_PER_STAGE = 8


def _issued(stages, *, m, n, k, lda, ldb, **defines):
    kern, threads, smem, bm, bn = _kernel(STAGES=stages, **defines)
    a, b = _halves(m, lda), _halves(k, ldb, seed=1)
    c = _aligned((m, n), np.float16)
    mem = Memory()
    issued = collections.Counter()
    kern.run((math.ceil(n / bn), math.ceil(m / bm), 1), (threads, 1, 1), _args(a, b, c, m, n, k, lda, ldb, n, mem),
             mem, smem, issued=issued)
    want = a[:, :k].astype(np.float64) @ b[:, :n].astype(np.float64)
    np.testing.assert_allclose(c.astype(np.float64), want, rtol=1e-2, atol=1e-2)
    blocks_warps = math.ceil(n / bn) * math.ceil(m / bm) * threads // 32
    copies = sum(v for op, v in kern.by_opcode(issued).items() if op.startswith(COPIES))
    return sum(issued.values()) / blocks_warps, copies / blocks_warps


# operand paths: realigned in registers (ALIGN 2, REALIGN 1), through the cp.async ring (REALIGN 2),
# 2-byte loads (REALIGN 0), 16- and 4-byte cp.async
PATHS = {
    "realign": dict(ldb=67, ALIGN_A=2, ALIGN_B=2),
    "ring": dict(ldb=67, ALIGN_A=2, ALIGN_B=2, REALIGN=2),
    "two_byte": dict(ldb=67, ALIGN_A=2, ALIGN_B=2, REALIGN=0),
    "cp16": dict(ldb=72, ALIGN_A=16, ALIGN_B=16),
    "cp4": dict(ldb=66, ALIGN_A=8, ALIGN_B=4),
}


@pytest.mark.parametrize("k", [3, 40])
@pytest.mark.parametrize("path", list(PATHS))
def test_tiles_past_k_issue_no_copies(path, k):
    case = dict(PATHS[path])
    # A's rows: an odd count of halves where ALIGN_A is 2, whole 16 bytes otherwise
    case["lda"] = k | 1 if case["ALIGN_A"] == 2 else -(-k // 8) * 8
    m, n = 70, 66
    total3, copies3 = _issued(3, m=m, n=n, k=k, **case)
    total5, copies5 = _issued(5, m=m, n=n, k=k, **case)
    assert copies5 == copies3, f"a deeper ring copies more for K = {k}: {copies3} -> {copies5} a warp"
    assert 0 <= total5 - total3 <= 2 * BOOKKEEPING_PER_STAGE, (
        f"two more stages cost {total5 - total3:.0f} instructions a warp for K = {k} ({total3:.0f} -> {total5:.0f})")
