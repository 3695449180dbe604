"""An optional third reference for `asmgemm bench`: a plain Triton matmul, one fixed configuration
per operand width, no autotuning. fp32 operands: IEEE fp32 (no TF32), 128x128 tiles, k-step 32, 8
warps, 3 stages. 16-bit operands (fp16/bf16, fp32 accumulation, tensor cores): 128x256 tiles, k-step
64, 8 warps, 3 stages, Triton's usual Hopper matmul shape. Grouped tile order in both. It shows what
a straightforward Triton kernel reaches on the same problem; it is not Triton at its best.
Imported only when Triton and torch are installed."""
from __future__ import annotations

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) per operand width in bytes
CONFIGS = {4: (128, 128, 32, 8, 8, 3), 2: (128, 256, 64, 8, 8, 3)}

_kernel = None


def _build():
    import triton
    import triton.language as tl

    @triton.jit
    def asmgemm_ref_matmul(a_ptr, b_ptr, c_ptr, M, N, K, s_am, s_ak, s_bk, s_bn, s_cm, s_cn,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GM: tl.constexpr,
                           IEEE: tl.constexpr):
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        # grouped order: GM tile rows share the B tiles they read while those are still in L2
        per_group = GM * tiles_n
        first_m = (pid // per_group) * GM
        rows = min(tiles_m - first_m, GM)
        tile_m = first_m + (pid % per_group) % rows
        tile_n = (pid % per_group) // rows
        rm = tile_m * BM + tl.arange(0, BM)
        rn = tile_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        a = a_ptr + rm[:, None] * s_am + rk[None, :] * s_ak
        b = b_ptr + rk[:, None] * s_bk + rn[None, :] * s_bn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            ta = tl.load(a, mask=(rm[:, None] < M) & (rk[None, :] + k0 < K), other=0.0)
            tb = tl.load(b, mask=(rk[:, None] + k0 < K) & (rn[None, :] < N), other=0.0)
            if IEEE:
                acc = tl.dot(ta, tb, acc, input_precision="ieee")
            else:
                acc = tl.dot(ta, tb, acc)
            a += BK * s_ak
            b += BK * s_bk
        c = c_ptr + rm[:, None] * s_cm + rn[None, :] * s_cn
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))

    return triton, asmgemm_ref_matmul


def triton_available() -> bool:
    try:
        import triton  # noqa: F401
        import torch  # noqa: F401
    except Exception:
        return False
    return True


def make_triton_matmul(op_a, op_b, c):
    """fn() computing c = op_a @ op_b (torch tensors, any strides) with the Triton kernel."""
    global _kernel
    if _kernel is None:
        _kernel = _build()
    triton, kernel = _kernel
    m, k = op_a.shape
    n = op_b.shape[1]
    width = op_a.element_size()
    bm, bn, bk, gm, warps, stages = CONFIGS.get(width, CONFIGS[4])
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)

    def run():
        kernel[grid](op_a, op_b, c, m, n, k, op_a.stride(0), op_a.stride(1), op_b.stride(0), op_b.stride(1),
                     c.stride(0), c.stride(1), BM=bm, BN=bn, BK=bk, GM=gm, IEEE=width == 4,
                     num_warps=warps, num_stages=stages)

    return run
