"""One GEMM problem on the GPU: random operands in the requested layout, a float64 reference, and
correctness checks with poisoned outputs. Inputs are fresh uniform(-1, 1) draws, never zeros (zeros
hide unwritten outputs and wrong indexing, and can even run faster than real data); the output is
NaN-filled before each run, so an element the kernel never wrote cannot pass.

C may have another dtype than A and B (hgemm_f32c: fp16 A and B, fp32 C). cupy.matmul cannot
produce that without a second pass (it multiplies in A's dtype, then casts), so cuBLAS is then
called directly: cublasGemmEx with C's type and fp32 compute, the call CUTLASS and PyTorch users
compare such kernels with."""
from __future__ import annotations

import numpy as np

from .shapes import Shape, layout_flags


class GemmProblem:
    def __init__(self, cp, shape: Shape, layout: str, dtype: str, seed: int = 0, c_dtype: str | None = None):
        self.cp = cp
        self.shape = shape
        self.layout = layout
        self.dtype = cp.dtype(dtype)
        self.c_dtype = cp.dtype(c_dtype) if c_dtype else self.dtype
        self.trans_a, self.trans_b = layout_flags(layout)
        m, n, k = shape.m, shape.n, shape.k
        rs = cp.random.RandomState(seed)
        a_shape = (k, m) if self.trans_a else (m, k)
        b_shape = (n, k) if self.trans_b else (k, n)
        # uniform(-1, 1): no zeros, both signs, so cancellation and sign errors show up
        self.a = rs.uniform(-1.0, 1.0, a_shape, dtype=cp.float32).astype(self.dtype)
        self.b = rs.uniform(-1.0, 1.0, b_shape, dtype=cp.float32).astype(self.dtype)
        self.op_a = self.a.T if self.trans_a else self.a
        self.op_b = self.b.T if self.trans_b else self.b
        self._ref = None
        self._ref_norm = None

    def output(self):
        return self.cp.empty((self.shape.m, self.shape.n), dtype=self.c_dtype)

    def reference(self):
        if self._ref is None:
            cp = self.cp
            self._ref = cp.matmul(self.op_a.astype(cp.float64), self.op_b.astype(cp.float64))
            self._ref_norm = float(cp.linalg.norm(self._ref))
        return self._ref

    def release_reference(self):
        self._ref = None

    def poison(self, c):
        c.fill(float("nan"))

    def rel_error(self, c) -> float:
        """‖c − ref‖ / ‖ref‖ in float64; inf when any element is NaN/inf (e.g. left unwritten)."""
        cp = self.cp
        ref = self.reference()
        if not bool(cp.isfinite(c).all()):
            return float("inf")
        diff = float(cp.linalg.norm(c.astype(cp.float64) - ref))
        return diff / self._ref_norm if self._ref_norm else diff

    def cublas(self, c):
        if c.dtype == self.dtype:
            return self.cp.matmul(self.op_a, self.op_b, out=c)
        return cublas_gemm_ex(self.cp, self.a, self.b, c, self.trans_a, self.trans_b)


_CUDA_TYPES = {"float16": 2, "bfloat16": 14, "float32": 0}       # cudaDataType_t: CUDA_R_16F, _16BF, _32F
# alpha = 1 and beta = 0 in host memory (the handle's default pointer mode), made once: the call is
# timed, and --host-overhead counts its host time against asmgemm's
_ONE, _ZERO = np.ones(1, np.float32), np.zeros(1, np.float32)


def cublas_gemm_ex(cp, a, b, c, trans_a: bool, trans_b: bool):
    """c = op(A) op(B) by cublasGemmEx on CuPy's handle and current stream: A and B (stored
    row-major, transposed by the flags) of their dtype, C of its own, fp32 compute (tensor cores
    for 16-bit A and B). Row-major C is column-major C^T = op(B)^T op(A)^T, so B goes first."""
    from cupy_backends.cuda.libs import cublas
    m, n = c.shape
    k = a.shape[0] if trans_a else a.shape[1]
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setStream(handle, cp.cuda.get_current_stream().ptr)
    ab = _CUDA_TYPES[a.dtype.name]
    cublas.gemmEx(handle, int(trans_b), int(trans_a), n, m, k, _ONE.ctypes.data,
                  b.data.ptr, ab, k if trans_b else n, a.data.ptr, ab, m if trans_a else k,
                  _ZERO.ctypes.data, c.data.ptr, _CUDA_TYPES[c.dtype.name], n,
                  68, -1)                                      # CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT
    return c
