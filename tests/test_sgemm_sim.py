"""sgemm.sasm's own PTX run on the CPU by the interpreter of tests/ptx_sim.py: the cp.async build
(ASYNC=1, the catalog's t64x64_k16_cpasync) at a shape whose stored matrices end at the last byte
of their buffers, K odd and M, N not multiples of the 128-bit loads' four floats, so that every
copy at a row's end is an edge case. ptx_sim reads the whole copy for a partial src-size (as
compute-sanitizer reports sm_90's LDGSTS.ZFILL doing), so a copy reaching past the matrix fails
here (the class mma_gemm had: docs/log/mma.md, step 10)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asmgemm.pipeline import BuildOptions, build_file
from ptx_sim import Kernel, Memory, aligned_array, matrix_at_end


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m,n", [(70, 66), (72, 68)], ids=["edges", "vector-rows"])
def test_cp_async_copies_stay_inside_matrices_at_their_buffers_ends(layout, m, n):
    ta, tb = layout[0] == "t", layout[1] == "t"
    k = 65
    # the runtime's call values: 128-bit loads where rows (and, along M or N, the edge) allow them
    defines = {"THREADS": 64, "BK": 16, "ASYNC": 1, "TRANS_A": int(ta), "TRANS_B": int(tb),
               "VEC_A": int(not ta or m % 4 == 0), "VEC_B": int(tb or n % 4 == 0)}
    result = build_file("sgemm", BuildOptions(defines={k_: str(v) for k_, v in defines.items()}, target="sm_80"))
    c = result.constants
    ra, ca = (k, m) if ta else (m, k)
    rb, cb = (n, k) if tb else (k, n)
    lda, ldb = -(-ca // 4) * 4, -(-cb // 4) * 4          # rows padded to 16 bytes, the last one not
    keep = []
    a_buf, a = matrix_at_end(ra, ca, lda, np.float32, keep, seed=0)
    b_buf, b = matrix_at_end(rb, cb, ldb, np.float32, keep, seed=1)
    out = aligned_array((m, n), np.float32, np.nan)
    mem = Memory()
    args = dict(A=mem.add(a_buf), B=mem.add(b_buf), C=mem.add(out), M=m, N=n, K=k, lda=lda, ldb=ldb, ldc=n,
                alpha=1.0, beta=0.0, bias=0, batch_stride_a=0, batch_stride_b=0, batch_stride_c=0, k_chunk=0,
                split_stride=0, workspace=0, tile_counters=0)
    Kernel(result.ptx).run((math.ceil(n / c["TN"]), math.ceil(m / c["TM"]), 1), (c["THREADS"], 1, 1), args, mem,
                           int(c["SMEM_BYTES"]))
    np.testing.assert_allclose(out, (a.T if ta else a) @ (b.T if tb else b), rtol=1e-4, atol=1e-4)
