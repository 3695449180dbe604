"""PyTorch's definitions of the fused epilogue's activations in float64 numpy: the reference of the
CPU stand-in kernel (fake_cupy.interpreting_kernel), the float32 model test and the GPU tests.
torch.nn.functional: relu, gelu (approximate='none': 0.5 x (1 + erf(x / sqrt 2))), gelu with
approximate='tanh', silu (x * sigmoid(x))."""
from __future__ import annotations

import math

import numpy as np

# The formulas are PyTorch's, written so that float64 keeps its relative accuracy in the negative
# tails, where the kernels keep theirs: 1 + erf(y) = erfc(-y) and 1 + tanh(u) = 2 / (1 + exp(-2u)).
# (As 1 + erf(x / sqrt 2), gelu(-11.4) came out -0.0 in float64 while the kernel gave the true
# -3.4e-29; seen in the H100 run of test_large_values_stay_finite.)
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def relu(x):
    return np.where(x < 0, 0.0, x)


def gelu(x):
    return 0.5 * x * _erfc(-x / math.sqrt(2.0))


def gelu_tanh(x):
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-2.0 * math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


# kernel_spec's activation codes (0: none)
BY_CODE = {0: lambda x: x, 1: relu, 2: gelu, 3: gelu_tanh, 4: silu}
BY_NAME = {None: BY_CODE[0], "relu": relu, "gelu": gelu, "gelu_tanh": gelu_tanh, "silu": silu}


def epilogue(acc, alpha: float, beta: float, c0, bias_rows=None, bias_cols=None, activation=None):
    """act(alpha * acc + beta * c0 + bias) in float64; bias_cols: one value per column (N,),
    bias_rows: one per row (M,)."""
    out = alpha * np.asarray(acc, np.float64)
    if beta != 0:
        out = out + beta * np.asarray(c0, np.float64)
    if bias_cols is not None:
        out = out + np.asarray(bias_cols, np.float64).reshape(1, -1)
    if bias_rows is not None:
        out = out + np.asarray(bias_rows, np.float64).reshape(-1, 1)
    return BY_NAME[activation](out)
