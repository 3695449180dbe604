"""The coefficients of epilogue.inc's EPI_GELU16 (gelu for 16-bit inputs), and their error.

EPI_GELU16 computes Phi(-|x|) = erfc(z) / 2, z = |x| / sqrt 2, as t * 2^(Q(t) log2 e - 1 - z^2 log2 e)
with t = 1 / (1 + z / 2) (the form of Numerical Recipes' erfcc, section 6.2, at a lower degree):
Q(t) is the degree-5 polynomial that best fits log(erfc(z) / t) + z^2 in the minimax sense over z
in [0, 10] (x to -14, past where bf16's gelu underflows), found here by linear programming on 4001
points. Its largest error, which is the relative error of erfc, is 7.7e-6 (2^-17) with the
coefficients rounded to fp32: far under the last place of fp16 (2^-11) and bf16 (2^-8), the types
whose values the activation warps take and round back to. (Degree 6 gives 6.6e-6, degree 4 1.8e-4.)

The kernel evaluates it in t' = t / 256 (rcp of 256 + 256 z / 2) with the exponent 8 higher, which
is the same number: so that 2^(exponent) stays a normal fp32 number (ex2.approx.ftz flushes
results under 2^-126) for bf16's x down to -13.2, where gelu's value is still a normal bf16 number.
The polynomial printed is Q'(t') = Q(256 t') log2 e - 1 + 8.

Usage (needs scipy, which asmgemm does not): python3 tools/fit_gelu16.py
Prints the fp32 bit patterns in Horner order (highest degree first) as epilogue.inc holds them."""
from __future__ import annotations

import math
import sys


SCALE = 256.0          # t' = t / SCALE, the exponent log2(SCALE) higher


def fit(degree: int = 5, z_max: float = 10.0, points: int = 4001):
    import numpy as np
    from scipy.optimize import linprog
    from scipy.special import erfc
    z = np.linspace(0.0, z_max, points)
    t = 1.0 / (1.0 + z / 2.0)
    q = np.log(erfc(z) / t) + z * z
    v = np.vander(t, degree + 1, increasing=True)
    n = degree + 1
    a_ub = np.vstack([np.hstack([v, -np.ones((points, 1))]), np.hstack([-v, -np.ones((points, 1))])])
    res = linprog(np.r_[np.zeros(n), 1.0], A_ub=a_ub, b_ub=np.concatenate([q, -q]),
                  bounds=[(None, None)] * n + [(0, None)], method="highs")
    if not res.success:
        raise RuntimeError(res.message)
    return [float(c) for c in res.x[:n]]


def main() -> int:
    try:
        import numpy as np
        from scipy.special import erfc
        coeffs = fit()
    except ImportError as exc:
        print(f"fit_gelu16: needs numpy and scipy ({exc})", file=sys.stderr)
        return 1
    l2e = 1.0 / math.log(2.0)
    folded = [c * l2e * SCALE ** j for j, c in enumerate(coeffs)]
    folded[0] += math.log2(SCALE) - 1.0                # Phi(-|x|) = erfc(z) / 2; t' = t / SCALE
    c32 = [np.float32(c) for c in folded]
    zz = np.linspace(0.0, 10.0, 1_000_001)
    tt = 1.0 / (1.0 + zz / 2.0)
    approx = np.polynomial.polynomial.polyval(tt / SCALE, np.array(c32, np.float64))
    exact = np.log2(erfc(zz) / (2.0 * tt)) + math.log2(SCALE) + zz * zz * l2e
    print(f"relative error of erfc, fp32 coefficients: {np.abs(approx - exact).max() * math.log(2.0):.2e}")
    for j in reversed(range(len(c32))):
        print(f"  t'^{j}: 0f{np.float32(c32[j]).view(np.uint32):08X}  ({float(c32[j]):+.9f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
