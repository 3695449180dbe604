"""mma_gemm.sasm's C in pieces narrower than 16 bytes (C_PIECE, the runtime's c_piece: rows of C
that are whole 8- or 4-byte pieces but not 16-byte ones, e.g. an even ldc) run by the interpreter
of tests/ptx_sim.py: C must be bit for bit what the one-element-a-lane path (C_PIECE = 2, every
lane one element) gives, with alpha and beta, a bias and an activation, fp16, bf16 and fp32 C, the
32- and 64-column warp tiles; and the columns past N (C's padding) untouched. Why: a large C over a
small K is its store's cost, and on the H200 the one-element path ran 4543x4546x3 in 53.8 us
against 33.1 for 16-byte pieces and cuBLAS's 32.1 (ncu: the same store requests as cuBLAS, the SM
busier: the per-element read-back and guards; docs/log/mma.md)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asmgemm.runtime.plan import c_piece
from ptx_sim import Memory
from test_mma_gemm_sim import _aligned, _args, _halves, _kernel


def _run(piece, *, m, n, k, ldc, c_f32=False, bf16=False, tiling=None, beta=0.0, bias=0, act=0):
    align = [next(w for w in (16, 8, 4, 2) if ld * 2 % w == 0) for ld in (k, n)]
    defines = dict(C_PIECE=piece, C_F32=int(c_f32), BF16=int(bf16), BIAS=bias, ACT=act, ALIGN_A=align[0],
                   ALIGN_B=align[1], **(tiling or {}))
    kern, threads, smem, bm, bn = _kernel(**defines)
    a, b = _halves(m, k), _halves(k, n, seed=1)
    if bf16:
        a, b = a.view(np.uint16) & 0xFF80, b.view(np.uint16) & 0xFF80      # bf16 bit patterns
    c_dtype = np.float32 if c_f32 else (np.uint16 if bf16 else np.float16)
    c = _aligned((m, ldc), c_dtype)
    c[...] = (np.random.default_rng(3).uniform(-1, 1, (m, ldc)).astype(np.float32).view(np.uint32) >> 16
              ).astype(np.uint16) if bf16 else np.random.default_rng(3).uniform(-1, 1, (m, ldc))
    before = c.copy()
    bvec = _aligned((n,), c_dtype)
    bvec[...] = before[0, :n]
    mem = Memory()
    extra = dict(alpha=0.75, beta=beta)
    if bias:
        extra["bias"] = mem.add(bvec)
    kern.run((math.ceil(n / bn), math.ceil(m / bm), 1), (threads, 1, 1),
             _args(a, b, c, m, n, k, k, n, ldc, mem, **extra), mem, smem)
    return c, before


CASES = {
    # 70 x 70, ldc 74 (148-byte rows: 4-byte pieces), beta reads C
    "f16_piece4_beta": dict(piece=4, m=70, n=70, k=40, ldc=74, beta=-0.5),
    # ldc 76 (152 bytes: 8-byte pieces), a bias per column and gelu
    "f16_piece8_bias_gelu": dict(piece=8, m=66, n=68, k=24, ldc=76, bias=1, act=2),
    "bf16_piece4_bias_rows": dict(piece=4, m=40, n=34, k=16, ldc=34, bf16=True, bias=2, act=1, beta=0.25),
    # fp32 C, ldc 74 (296 bytes: 8-byte pieces)
    "f32_piece8_beta": dict(piece=8, m=70, n=70, k=40, ldc=74, c_f32=True, beta=2.0),
    # the 64-column warp tile: 32 lanes a row of 4-byte pieces
    "f16_piece4_wn64": dict(piece=4, m=40, n=130, k=16, ldc=132, tiling=dict(BM=64, BN=128, WM=32, WN=64)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pieces_give_the_one_element_paths_bits(name):
    case = dict(CASES[name])
    piece = case.pop("piece")
    n, ldc = case["n"], case["ldc"]
    itemsize = 4 if case.get("c_f32") else 2
    assert c_piece(n, ldc, 256, 0, itemsize) == piece           # what the runtime would ask for
    got, before = _run(piece, **case)
    want, _ = _run(2 if itemsize == 2 else 4, **case)
    word = np.uint32 if itemsize == 4 else np.uint16
    assert not np.isnan(got.view(np.float32 if itemsize == 4 else np.float16)[:, :n].astype(np.float32)).any() \
        or case.get("bf16")
    assert np.array_equal(got.view(word), want.view(word)), "C's bits differ from the one-element path's"
    assert np.array_equal(got[:, n:].view(word), before[:, n:].view(word)), "C's padding written"
    assert not np.array_equal(got[:, :n].view(word), before[:, :n].view(word))


def test_the_call_value():
    assert c_piece(4546, 4546, 256, 0, 2) == 4 and c_piece(4544, 4544, 256, 0, 2) == 16
    assert c_piece(68, 76, 256, 0, 2) == 8 and c_piece(68, 76, 260, 0, 2) == 4 and c_piece(68, 76, 258, 0, 2) == 2
    assert c_piece(4543, 4546, 256, 0, 2) == 2 and c_piece(70, 74, 256, 0, 4) == 8 and c_piece(70, 71, 256, 0, 4) == 4
    assert c_piece(64, 64, 256, 3, 2) == 2          # a batch stride of an odd count of elements


def test_params_may_narrow_the_piece_never_widen_it():
    """params= C_PIECE lowers the call's piece (an A/B of the epilogues: tools/call_gap_diag.py
    --variant C_PIECE=2), never raises it past what C's rows allow."""
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime.launch import call_defines
    from asmgemm.runtime.plan import fresh_plan
    spec = get_spec("hgemm_mma")
    values = fresh_plan(70, 70, 40, "nn", 2).call_values
    assert values["c_piece"] == 4
    assert call_defines(spec, values)["C_PIECE"] == 4
    assert call_defines(spec, values, {"C_PIECE": 2})["C_PIECE"] == 2
    assert call_defines(spec, values, {"C_PIECE": 16})["C_PIECE"] == 4
