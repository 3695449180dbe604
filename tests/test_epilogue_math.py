"""The numerics of kernels_ptx/epilogue.inc, on the CPU: a float32 model of each macro's
instruction sequence (one rounding per mul.rn/add.rn/fma.rn, fma exact before its rounding,
ex2.approx.f32 as the correctly rounded 2^p perturbed by +-2 ulp, div.full.f32 as a correctly
rounded division) against PyTorch's formulas in float64 (tests/epilogue_reference.py).

The model is only as good as its match with the macros: the constants it uses are the fp32 bit
patterns the .inc file holds (checked below), and its steps follow the macros line by line. The
GPU runs the real instructions (tests/test_epilogue_gpu.py)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pytest

import epilogue_reference as ref

INC = Path(__file__).parent.parent / "kernels_ptx" / "epilogue.inc"
f = np.float32


def bits(x: float) -> str:
    return "0f%08X" % np.float32(x).view(np.uint32)


L2E = f(1 / math.log(2))
L2E_LO = f(1 / math.log(2) - float(L2E))
LN2 = f(math.log(2))
# Numerical Recipes' erfcc coefficients, highest degree first (as the Horner steps use them)
NR = [f(c) for c in (0.17087277, -0.82215223, 1.48851587, -1.13520398, 0.27886807, -0.18628806,
                     0.09678418, 0.37409196, 1.00002368, -1.26551223)]
# EPI_GELU16's Q' (tools/fit_gelu16.py), highest degree first, as fp32 bit patterns
Q16 = [np.uint32(v).view(f) for v in (0x52A902DE, 0xCF82F8E9, 0x4B2F441B, 0x46BBECA0, 0x43BBFE2A, 0x40A5874C)]
LOG2E = 1 / math.log(2)
CONSTANTS16 = [f(256 / (2 * math.sqrt(2))), f(256), f(-LOG2E / 2), f(-LOG2E), f(-2 * math.sqrt(2 / math.pi) * LOG2E)] + Q16
CONSTANTS = [L2E, L2E_LO, LN2, f(-104), f(88), f(1 / math.sqrt(2)), f(0.5), f(1), f(-0.5), f(0.044715),
             f(-2 * math.sqrt(2 / math.pi)), f(0), f(np.inf)] + NR + CONSTANTS16


def fma(a, b, c):
    # a*b of two fp32 values is exact in float64; the sum's float64 rounding before the fp32 one
    # is far below what the tests resolve
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(f)


def ex2(p, ulps):
    r = np.exp2(p.astype(np.float64)).astype(f)
    return (r * (1 + ulps * 2.0 ** -23)).astype(f) if ulps else r


def EXP(x, ulps):
    overflow = x > f(88)
    x = np.minimum(np.maximum(x, f(-104)), f(88))
    p = (x * L2E).astype(f)
    e = fma(x, L2E, -p)
    e = fma(x, L2E_LO, e)
    y = ex2(p, ulps)
    e = (e * LN2).astype(f)
    return np.where(overflow, f(np.inf), fma(y, e, y))


def div(a, b):
    return (np.float64(a) / np.float64(b)).astype(f)


def gelu(x, ulps=0):
    s0 = (np.abs(x) * f(1 / math.sqrt(2))).astype(f)
    s0 = fma(s0, f(0.5), f(1))
    s0 = div(np.ones_like(s0), s0)
    s1 = np.full_like(x, NR[0])
    for c in NR[1:]:
        s1 = fma(s1, s0, c)
    s2 = (x * f(-0.5)).astype(f)
    s1 = fma(s2, x, s1)
    s2 = EXP(s1, ulps)
    s0 = (s0 * f(0.5)).astype(f)
    s0 = (s0 * s2).astype(f)
    s0 = np.where(x >= 0, (f(1) - s0).astype(f), s0)
    return (x * s0).astype(f)


def gelu_tanh(x, ulps=0):
    s0 = (x * x).astype(f)
    s0 = fma(s0, f(0.044715), f(1))
    s1 = (x * f(-2 * math.sqrt(2 / math.pi))).astype(f)
    s1 = (s1 * s0).astype(f)
    s0 = EXP(s1, ulps)
    s0 = (s0 + f(1)).astype(f)
    return div(x, s0)


def silu(x, ulps=0):
    s0 = EXP(-x, ulps)
    s0 = (s0 + f(1)).astype(f)
    return div(x, s0)


MODELS = {"gelu": (gelu, ref.gelu), "gelu_tanh": (gelu_tanh, ref.gelu_tanh), "silu": (silu, ref.silu)}


def test_the_model_uses_the_constants_the_macros_hold():
    text = INC.read_text()
    held = set(re.findall(r"\b0f[0-9A-F]{8}\b", text))
    assert held == {bits(c) for c in CONSTANTS}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("ulps", [0, 2, -2])
def test_typical_inputs_are_within_1e_6_relative(name, ulps):
    model, want = MODELS[name]
    x = np.random.default_rng(1).uniform(-3, 3, 100_000).astype(f)
    with np.errstate(over="ignore"):
        got, exact = model(x, ulps).astype(np.float64), want(x.astype(np.float64))
    rel = np.abs(got - exact) / np.maximum(np.abs(exact), 1e-30)
    # gelu_tanh's tail: -2u is formed in two roundings and exp amplifies its error by |2u| (~7 at x=-3)
    assert rel[np.abs(exact) > 1e-30].max() < (1.5e-6 if name == "gelu_tanh" else 1e-6)
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 1e-7


@pytest.mark.parametrize("name", list(MODELS))
def test_wide_inputs_keep_the_frobenius_error_small_and_finite(name):
    model, want = MODELS[name]
    x = np.random.default_rng(2).uniform(-20, 20, 100_000).astype(f)
    with np.errstate(over="ignore"):
        got, exact = model(x, 2).astype(np.float64), want(x.astype(np.float64))
    assert np.isfinite(got).all()
    assert np.linalg.norm(got - exact) / np.linalg.norm(exact) < 1e-7


def test_large_arguments_give_signed_zeros_and_identities_not_nan():
    big = np.array([-30, 30, -100, 100, -1e30, 1e30, -3e38, 3e38], f)    # (at -inf torch gives NaN too: -inf * 0)
    with np.errstate(over="ignore", invalid="ignore"):
        g, gt, s = gelu(big), gelu_tanh(big), silu(big)
    for out, want in ((g, ref.gelu), (gt, ref.gelu_tanh), (s, ref.silu)):
        assert not np.isnan(out).any()
        np.testing.assert_array_equal(out[1::2], big[1::2])        # large positive x: x itself
        neg = big[0::2].astype(np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            exact = np.nan_to_num(want(neg))                       # (x * 0 in float64 at -3e38)
        np.testing.assert_allclose(out[0::2], exact, rtol=1e-5, atol=1e-37)   # silu(-30) = -2.8e-12, else -0
        assert np.signbit(out[0::2]).all()
    assert g[0] == 0 and np.signbit(g[0]) and s[2] == 0 and np.signbit(s[2])   # gelu(-30), silu(-100): -0
    nan = np.array([np.nan], f)
    assert np.isnan(gelu(nan)).all() and np.isnan(gelu_tanh(nan)).all() and np.isnan(silu(nan)).all()


# ---- ACTIVATE16: every fp16 and every bf16 input ---------------------------------------------------
TINY = np.float32(2.0 ** -126)


def ftz(y):
    return np.where(np.abs(y) < TINY, f(0), y).astype(f)


def ex2_ftz(p, ulps):
    with np.errstate(over="ignore"):
        return ftz(ex2(p, ulps))


def rcp_ftz(b, ulps):
    """rcp.approx.ftz.f32: 1 / b within 1 ulp (PTX ISA), subnormal inputs and results flushed."""
    with np.errstate(divide="ignore", over="ignore"):
        r = (np.float64(1) / np.float64(ftz(b))).astype(f)
    return ftz((r * (1 + np.sign(ulps) * 2.0 ** -23)).astype(f) if ulps else r)


def gelu16(x, ulps=0):
    s0 = fma(np.abs(x), f(256 / (2 * math.sqrt(2))), f(256))
    s0 = rcp_ftz(s0, ulps)
    s1 = fma(s0, Q16[0], Q16[1])
    for c in Q16[2:]:
        s1 = fma(s1, s0, c)
    s2 = (x * f(-LOG2E / 2)).astype(f)
    s1 = fma(s2, x, s1)
    s1 = ex2_ftz(s1, ulps)
    s0 = (s0 * s1).astype(f)
    s0 = np.where(x >= 0, (f(1) - s0).astype(f), s0)
    return (x * s0).astype(f)


def gelu_tanh16(x, ulps=0):
    s0 = fma((x * x).astype(f), f(0.044715), f(1))
    s1 = ((x * f(-2 * math.sqrt(2 / math.pi) * LOG2E)).astype(f) * s0).astype(f)
    s1 = (ex2_ftz(s1, ulps) + f(1)).astype(f)
    return (x * rcp_ftz(s1, ulps)).astype(f)


def silu16(x, ulps=0):
    s0 = (ex2_ftz((x * f(-LOG2E)).astype(f), ulps) + f(1)).astype(f)
    return (x * rcp_ftz(s0, ulps)).astype(f)


# gelu_tanh and silu divide by 1 + 2^a with rcp.approx.ftz, which gives 0 for a divisor above
# 2^126: their results under ~|x| 2^-126 (bf16's x below -9.9 and -87) come out -0 (documented)
FLUSHED = 2.0 ** -119


def _all_16_bit(kind):
    """Every finite value of fp16 or bf16, as float32, and the rounding back to that type."""
    pats = np.arange(1 << 16, dtype=np.uint32)
    if kind == "float16":
        x = pats.astype(np.uint16).view(np.float16).astype(f)

        def back(y):
            with np.errstate(over="ignore"):
                return np.asarray(y, f).astype(np.float16).astype(f)
        smallest_normal = 2.0 ** -14
    else:
        x = (pats << 16).view(f)

        def back(y):
            u = np.asarray(y, f).view(np.uint32)
            return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16).astype(np.uint32).view(f)
        smallest_normal = 2.0 ** -126
    return x[np.isfinite(x)], back, smallest_normal


MODELS16 = {"gelu": (gelu16, ref.gelu), "gelu_tanh": (gelu_tanh16, ref.gelu_tanh), "silu": (silu16, ref.silu)}


@pytest.mark.parametrize("kind", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", list(MODELS16))
@pytest.mark.parametrize("ulps", [0, 2, -2])
def test_16_bit_activations_on_every_input(kind, name, ulps):
    """ACTIVATE16 on all 63,488 finite fp16 (65,280 bf16) inputs: within 2^-15 of the float64 value
    wherever that is a normal number of the type (the fit's 2^-17 plus ex2/rcp's few ulps and the
    rounding of the exponent, ~|x|^2 2^-24 in gelu's tail), and after rounding back to the type off
    by at most one unit in the last place from the correctly rounded value, for under 1% of them."""
    model, want = MODELS16[name]
    x, back, smallest_normal = _all_16_bit(kind)
    with np.errstate(over="ignore", invalid="ignore"):
        got = model(x, ulps)
        exact = want(x.astype(np.float64))
    normal = np.abs(exact) >= max(smallest_normal, FLUSHED)
    rel = np.abs(got.astype(np.float64) - exact) / np.where(normal, np.abs(exact), 1.0)
    assert rel[normal].max() < 2.0 ** -15, (x[normal][np.argmax(rel[normal])], rel[normal].max())
    assert (np.abs(got[~normal]) <= max(smallest_normal, FLUSHED)).all()
    rounded, correct = back(got), back(exact.astype(f))
    off = rounded != correct
    assert off.mean() < 0.01, off.mean()
    # at most one unit in the last place of the 16-bit type (fp16's subnormals: 2^-24)
    unit = (np.spacing(np.abs(correct[off]).astype(np.float16)).astype(np.float64) if kind == "float16"
            else np.spacing(np.abs(correct[off])).astype(np.float64) * 2.0 ** 16)
    diff = np.abs(rounded[off].astype(np.float64) - correct[off].astype(np.float64))
    assert ((diff <= unit * (1 + 1e-9)) | (np.abs(correct[off]) < max(smallest_normal, FLUSHED))).all()
    assert not np.isnan(got).any()
