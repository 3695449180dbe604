"""Optional Triton references for `asmgemm bench`, imported only when Triton and torch are installed.

"triton": a plain Triton matmul, one fixed configuration per operand width, no autotuning. fp32
operands: IEEE fp32 (no TF32), 128x128 tiles, k-step 32, 8 warps, 3 stages. 16-bit operands
(fp16/bf16, fp32 accumulation, tensor cores): 128x256 tiles, k-step 64, 8 warps, 3 stages, Triton's
usual Hopper matmul shape. Grouped tile order in both. It shows what a straightforward Triton kernel
reaches on the same problem; it is not Triton at its best.

"triton-mma" (`asmgemm bench --triton-mma`, tools/mma_bench.py): the same kernel source compiled
with DISABLE_MMA_V3=1, so that Triton multiplies with Ampere's mma.sync instead of Hopper's wgmma,
autotuned over MMA_CONFIGS (triton.autotune, per shape and strides): Triton's own portable
tensor-core path, the anchor of issue 31's mma.sync kernel (hgemm_mma). 16-bit operands only. The
variable is set around this kernel's compilations and launches alone (a JIT function of its own,
so no kernel compiled without it is ever reused), and the compiled kernel's PTX is checked: mma.sync
in it and no wgmma, else it is not run.
"""
from __future__ import annotations

import contextlib
import os

# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages) per operand width in bytes
CONFIGS = {4: (128, 128, 32, 8, 8, 3), 2: (128, 256, 64, 8, 8, 3)}

# Triton's mma.sync path (DISABLE_MMA_V3=1), 16-bit operands: the autotuner's configurations, as
# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, num_warps, num_stages): tiles 64-256, 3-5 stages, 4-8 warps.
# They hold the winners Triton 3.6 picked on the H100 (../shared/reference/triton-mma-sync-h100.json:
# 256x128x64/8 warps/3 stages at 4096^3, 128x128x32/4/4 at 8192^3, 2048^3 and 4096x4096x1024).
MMA_CONFIGS = (
    (128, 256, 64, 8, 8, 3),
    (256, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 8, 3),
    (128, 128, 64, 8, 4, 3),
    (128, 128, 32, 8, 4, 4),
    (128, 128, 32, 8, 8, 5),
    (64, 256, 32, 8, 4, 4),
    (256, 64, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4),
    (64, 128, 32, 8, 4, 4),
)
TRITON_MMA = "triton-mma"              # its column in `asmgemm bench` and the tools' reports
MMA_ENV = ("DISABLE_MMA_V3", "1")      # read by Triton's compiler (AccelerateMatmul) when it picks the MMA version

_kernel = None
_mma_kernel = None


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


@contextlib.contextmanager
def env_set(name: str, value: str):
    """os.environ[name] = value inside the block, the earlier state (set or not) restored after it."""
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def mma_sync_problem(ptx: str) -> str | None:
    """None when a compiled kernel's PTX multiplies with mma.sync alone; else what is wrong with it."""
    if "wgmma" in ptx:
        return f"its PTX has wgmma instructions (Hopper's path): {MMA_ENV[0]}={MMA_ENV[1]} did not take effect"
    if "mma.sync" not in ptx:
        return "its PTX has no mma.sync instruction"
    return None


def format_config(config) -> str:
    """A triton.Config as '256x128x64 GM8 w8 s3' (tile, group, warps, stages)."""
    kw = config.kwargs
    return f"{kw['BM']}x{kw['BN']}x{kw['BK']} GM{kw['GM']} w{config.num_warps} s{config.num_stages}"


def _build_mma():
    """A JIT function of its own (compiled only with MMA_ENV set), autotuned over MMA_CONFIGS per
    problem size and strides (strides: each layout gets its own choice)."""
    triton, kernel = _build()
    configs = [triton.Config({"BM": bm, "BN": bn, "BK": bk, "GM": gm}, num_warps=warps, num_stages=stages)
               for bm, bn, bk, gm, warps, stages in MMA_CONFIGS]
    tuned = triton.autotune(configs=configs, key=["M", "N", "K", "s_am", "s_ak", "s_bk", "s_bn"])(kernel)
    return triton, tuned


def make_triton_mma_matmul(op_a, op_b, c):
    """(fn, config): fn() computes c = op_a @ op_b (16-bit torch tensors, any strides) with Triton's
    mma.sync path; config, the autotuner's choice ('256x128x64 GM8 w8 s3'). The first call, here,
    autotunes (compiling every configuration: seconds). RuntimeError when the operands are not
    16-bit or the compiled kernel is not an mma.sync one."""
    global _mma_kernel
    if op_a.element_size() != 2 or op_b.element_size() != 2:
        raise RuntimeError(f"Triton's mma.sync reference takes 16-bit operands, not {op_a.dtype}")
    if _mma_kernel is None:
        _mma_kernel = _build_mma()
    triton, kernel = _mma_kernel
    m, k = op_a.shape
    n = op_b.shape[1]

    def grid(meta):
        return (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)

    def run():
        # set at every launch, so that a compilation this launch may need (a new specialization)
        # cannot pick wgmma; a launch of a compiled kernel does not read it
        with env_set(*MMA_ENV):
            return kernel[grid](op_a, op_b, c, m, n, k, op_a.stride(0), op_a.stride(1), op_b.stride(0),
                                op_b.stride(1), c.stride(0), c.stride(1), IEEE=False)

    compiled = run()            # autotunes this problem (or finds its earlier choice), then runs the best
    try:
        ptx = compiled.asm["ptx"]   # the launch's CompiledKernel (JITFunction.run returns it)
    except (AttributeError, KeyError, TypeError):
        raise RuntimeError("cannot read the compiled kernel's PTX to check that it is Triton's mma.sync "
                           f"path (the launch returned {type(compiled).__name__})") from None
    problem = mma_sync_problem(ptx)
    if problem:
        raise RuntimeError(f"Triton's kernel is not the mma.sync path: {problem}")
    return run, format_config(kernel.best_config)
