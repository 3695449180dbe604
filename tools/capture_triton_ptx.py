#!/usr/bin/env python3
"""Capture the PTX Triton generates, for the PTX corpus (tests/corpus/ptx/triton_*.ptx).

Triton emits PTX through LLVM's NVPTX backend, a different producer from nvcc: other register
naming, other directives, wgmma/TMA code of its own on Hopper. tools/regen_corpus.sh leaves
triton_*.ptx alone (there is no .cu behind them); re-capture with this script on a GPU machine
with Triton and torch, then check the files in (the corpus tests assemble them with ptxas).

Usage (GPU): python3 tools/capture_triton_ptx.py OUT_DIR
Writes OUT_DIR/triton_matmul_fp16.ptx (a 128x128x64 fp16 matmul, tensor cores) and
OUT_DIR/triton_softmax.ptx (a row softmax), and prints their sizes and targets.
"""
from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if argv in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        import torch
        import triton
        import triton.language as tl
    except ImportError as exc:
        print(f"capture_triton_ptx.py: needs torch and Triton on a GPU machine ({exc})", file=sys.stderr)
        return 1
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)

    @triton.jit
    def matmul_fp16(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            a = tl.load(a_ptr + rm[:, None] * K + (k0 + rk)[None, :], mask=rm[:, None] < M, other=0.0)
            b = tl.load(b_ptr + (k0 + rk)[:, None] * N + rn[None, :], mask=rn[None, :] < N, other=0.0)
            acc = tl.dot(a, b, acc)
        tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc.to(tl.float16),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    @triton.jit
    def softmax(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
        x = x - tl.max(x, axis=0)
        e = tl.exp(x)
        tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)

    m = n = k = 256
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(k, n, device="cuda", dtype=torch.float16)
    c = torch.empty(m, n, device="cuda", dtype=torch.float16)
    mm = matmul_fp16[(m // 128, n // 128)](a, b, c, m, n, k, BM=128, BN=128, BK=64, num_warps=4, num_stages=3)
    x = torch.randn(64, 1000, device="cuda")
    y = torch.empty_like(x)
    sm = softmax[(64,)](x, y, 1000, BLOCK=1024, num_warps=4)
    torch.cuda.synchronize()
    for name, compiled in (("triton_matmul_fp16", mm), ("triton_softmax", sm)):
        ptx = compiled.asm["ptx"]
        path = out / f"{name}.ptx"
        path.write_text(ptx)
        target = next((ln.split()[1] for ln in ptx.splitlines() if ln.startswith(".target")), "?")
        print(f"{path}: {len(ptx)} bytes, .target {target}, triton {triton.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
