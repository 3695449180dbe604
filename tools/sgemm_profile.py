"""Runs asmgemm and cuBLAS SGEMM a few times at one size, for ncu. Usage: sgemm_profile.py M N K [params-json]"""
import json
import sys

import cupy as cp

import asmgemm

m, n, k = (int(x) for x in sys.argv[1:4])
params = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
rng = cp.random.default_rng(0)
a = rng.standard_normal((m, k), dtype=cp.float32)
b = rng.standard_normal((k, n), dtype=cp.float32)
c = cp.empty((m, n), dtype=cp.float32)
for _ in range(3):
    asmgemm.gemm(a, b, c, params=params)
    cp.matmul(a, b, out=c)
cp.cuda.Device().synchronize()
