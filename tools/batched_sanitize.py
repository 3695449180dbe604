#!/usr/bin/env python3
"""Issue 33's compute-sanitizer workload: one odd batched 16-bit shape (a B per batch, odd s and d,
heads as the batch of a (b, s, h, d) view: row stride h * d, batch stride d), which the in-place
kernel runs (rows of 65 halves: no TMA); the same with d = 72, whose 144-byte rows and batches TMA
reads, so that hgemm's batched mode runs it (3-D maps; Q.K^T and then P.V, s = 77 odd: partial
tiles and the TMA store's clipped edge in every matrix; a case that ran elsewhere is WRONG); and one
ragged grouped shape (empty experts, an expert of one row, one of several tile rows, odd K, B as a
transposed (E, N, K) view) on the portable kernel, and the same experts with K = 72 on hgemm's
grouped mode (TMA-legal: a case that ran elsewhere is WRONG; rows of out past offs[-1] must keep
their values), fp16 and bf16, each checked against float64. Prints one line per case and
`SANITIZE_RESULTS OK` (exit 0) or `SANITIZE_RESULTS WRONG` (exit 1) last; compute-sanitizer exits 3
on a memory error. Needs a GPU, CuPy and torch with CUDA.

Usage (GPU):
    compute-sanitizer --tool memcheck --error-exitcode 3 python3 tools/batched_sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 3 python3 tools/batched_sanitize.py
"""
from __future__ import annotations

import argparse
import sys

from asmgemm.kernel_spec import get_spec
from asmgemm.runtime.gemm import gemm, last_launch
from asmgemm.runtime.gpu import require_gpu
from asmgemm.runtime.grouped import grouped_gemm


def _err(torch, got, want) -> float:
    return float(torch.linalg.norm(got.double() - want) / torch.linalg.norm(want))


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    require_gpu("tools/batched_sanitize.py")
    import torch
    ok = True
    g = torch.Generator(device="cuda").manual_seed(0)
    for dtype, kernel, hopper in ((torch.float16, "hgemm_mma", "hgemm"), (torch.bfloat16, "bgemm_mma", "bgemm")):
        limit = get_spec(kernel).rel_err_limit
        q = torch.randn(2, 77, 3, 65, device="cuda", generator=g).to(dtype)          # (b, s, h, d)
        k = torch.randn(2, 77, 3, 65, device="cuda", generator=g).to(dtype)
        qh, kh = q.transpose(1, 2)[1], k.transpose(1, 2)[1]                          # (h, s, d) views
        scores = gemm(qh, kh, trans_b=True)
        err = _err(torch, scores, qh.double() @ kh.double().transpose(1, 2))
        ran = last_launch()
        print(f"batched {dtype} Q.K^T 3x77x77x65: {ran['kernel']} {ran['params']} rel err {err:.2e}")
        ok &= err < limit
        # hgemm's batched mode: TMA-legal views of the same odd s (rows 3 x 72 halves, matrices 72 apart)
        q, k, v = (torch.randn(2, 77, 3, 72, device="cuda", generator=g).to(dtype) for _ in range(3))
        qh, kh, vh = (x.transpose(1, 2)[1] for x in (q, k, v))
        scores = gemm(qh, kh, trans_b=True)
        err = _err(torch, scores, qh.double() @ kh.double().transpose(1, 2))
        ran = last_launch()
        batched = ran["kernel"] == hopper and ran["params"].get("BATCHED") == "1"
        print(f"batched {dtype} Q.K^T 3x77x77x72: {ran['kernel']} {ran['params']} rel err {err:.2e}"
              + ("" if batched else f" (WRONG: not {hopper}'s batched mode)"))
        ok &= err < limit and batched
        # P in rows padded to 80 halves (160 bytes): the 77 x 77 matrices of a contiguous P have rows
        # of 154 bytes, which TMA cannot step (the in-place kernel would run it)
        p = torch.zeros(3, 77, 80, device="cuda", dtype=dtype)[:, :, :77]
        p.copy_(torch.softmax(scores.float(), dim=-1))
        out = gemm(p, vh)
        err = _err(torch, out, p.double() @ vh.double())
        ran = last_launch()
        batched = ran["kernel"] == hopper and ran["params"].get("BATCHED") == "1"
        print(f"batched {dtype} P.V 3x77x72x77: {ran['kernel']} rel err {err:.2e}"
              + ("" if batched else f" (WRONG: not {hopper}'s batched mode)"))
        ok &= err < limit and batched
        sizes = [5, 0, 1, 150, 0, 33]
        a = torch.randn(sum(sizes), 45, device="cuda", generator=g).to(dtype)
        b = torch.randn(len(sizes), 70, 45, device="cuda", generator=g).to(dtype).transpose(1, 2)
        offs = torch.tensor(sizes, device="cuda").cumsum(0).to(torch.int32)
        out = grouped_gemm(a, b, offs)
        want, start = [], 0
        for e, end in enumerate(offs.tolist()):
            want.append(a[start:end].double() @ b[e].double())
            start = end
        err = _err(torch, out, torch.cat(want))
        print(f"grouped {dtype} experts {sizes} K=45 N=70: {last_launch()['kernel']} rel err {err:.2e}")
        ok &= err < limit
        # hgemm's grouped mode: the same ragged experts with K = 72 and N = 136 (rows of 144 and 272
        # bytes, TMA-legal), B as a transposed (E, N, K) view; rows of out past offs[-1] untouched
        a = torch.randn(sum(sizes) + 7, 72, device="cuda", generator=g).to(dtype)
        b = torch.randn(len(sizes), 136, 72, device="cuda", generator=g).to(dtype).transpose(1, 2)
        out = torch.full((a.shape[0], 136), 5.0, device="cuda", dtype=dtype)
        grouped_gemm(a, b, offs, out)
        want, start = [], 0
        for e, end in enumerate(offs.tolist()):
            want.append(a[start:end].double() @ b[e].double())
            start = end
        err = _err(torch, out[:start], torch.cat(want))
        ran = last_launch()
        wgmma = ran["kernel"] == hopper and ran["params"].get("GROUPED") == "1"
        kept = bool((out[start:] == 5.0).all())
        print(f"grouped {dtype} experts {sizes} K=72 N=136: {ran['kernel']} rel err {err:.2e}"
              + ("" if wgmma else f" (WRONG: not {hopper}'s grouped mode)")
              + ("" if kept else " (WRONG: rows past offs[-1] written)"))
        ok &= err < get_spec(hopper).rel_err_limit and wgmma and kept
    torch.cuda.synchronize()
    print("SANITIZE_RESULTS " + ("OK" if ok else "WRONG"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
