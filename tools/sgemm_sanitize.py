"""A small odd-shaped SGEMM workload for `compute-sanitizer --tool memcheck`: every layout, both
variants, a misaligned strided view, beta != 0, and checks the results against float64."""
import sys

import cupy as cp

import asmgemm

ok = True
rng = cp.random.default_rng(3)
for params in (None, {"THREADS": 64, "BK": 8}, {"THREADS": 256, "BK": 16}, {"THREADS": 256, "RQ": 4, "BK": 8},
               {"THREADS": 256, "RQ": 4, "BK": 16}, {"THREADS": 256, "BK": 8, "ASYNC": 1}, {"THREADS": 256, "RQ": 4, "BK": 8, "PREFETCH": 1},
               {"THREADS": 256, "RQ": 4, "BK": 8, "LOAD_AHEAD": 1, "LDG_NC": 0},
               {"THREADS": 256, "RQ": 4, "BK": 16, "LOAD_AHEAD": 1, "LDG_NC": 0}):
    for layout in ("nn", "nt", "tn", "tt"):
        m, n, k = 131, 67, 45
        ta, tb = layout[0] == "t", layout[1] == "t"
        a = rng.standard_normal((k, m) if ta else (m, k), dtype=cp.float32)
        b = rng.standard_normal((n, k) if tb else (k, n), dtype=cp.float32)
        c0 = rng.standard_normal((m, n), dtype=cp.float32)
        c = c0.copy()
        asmgemm.gemm(a, b, c, alpha=1.5, beta=0.5, trans_a=ta, trans_b=tb, params=params)
        ref = 1.5 * ((a.T if ta else a).astype(cp.float64) @ (b.T if tb else b).astype(cp.float64)) + 0.5 * c0
        err = float(cp.linalg.norm(c - ref) / cp.linalg.norm(ref))
        ok &= err < 2e-5
        print(f"sanitize {layout} {params}: rel err {err:.2e}")
big = rng.standard_normal((300, 301), dtype=cp.float32)
a = big[3:130, 5:78]
b = big[1:74, 2:99]
c = asmgemm.gemm(a, b)
err = float(cp.linalg.norm(c - a.astype(cp.float64) @ b.astype(cp.float64)) / cp.linalg.norm(a.astype(cp.float64) @ b.astype(cp.float64)))
ok &= err < 2e-5
print(f"sanitize strided view: rel err {err:.2e}")
cp.cuda.Device().synchronize()
print("SANITIZE_RESULTS", "OK" if ok else "WRONG")
sys.exit(0 if ok else 1)
