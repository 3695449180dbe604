"""asmgemm.gemm under random calls, on the CPU (the stand-in CuPy with the driver's launch and the
tiny float64 kernel, tests/test_host_overhead.py's fixture): every call either gives numpy's C or
raises AsmError, never another exception, whatever the shapes (empty ones too), layouts, views,
C, scalars and options, good or of the wrong kind; a call torch.matmul would take must give C. Each
call is made twice, so the repeated call's one function (runtime/gemm.py _repeat_call) meets the
same mix as the whole way."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asmgemm.errors import AsmError
from fake_cupy import FakeArray, with_raw_launch
from test_host_overhead import gpu  # noqa: F401  (the fixture: tiny kernel, stand-in CuPy)

dims = st.integers(0, 9)
good_scalars = st.sampled_from([1.0, 0.0, -0.5, 2, np.float64(0.25), np.float32(1.5)])
bad_scalars = st.sampled_from(["x", None, 1 + 2j, [1.0]])
EQUIVALENT = {False: [False, 0, np.bool_(False)], True: [True, 1, np.bool_(True)]}
bad_flags = st.sampled_from(["yes", [1], 2, None])


def _matrix(draw, rows, cols, seed):
    """A float64 rows x cols operand in one of the layouts a caller hands over."""
    kind = draw(st.sampled_from(["c", "f", "strided", "offset", "transposed view"]))
    rng = np.random.default_rng(seed)
    if kind == "c":
        x = rng.standard_normal((rows, cols))
    elif kind == "f":
        x = np.asfortranarray(rng.standard_normal((rows, cols)))
    elif kind == "strided":
        x = rng.standard_normal((rows, cols + 3))[:, :cols]
    elif kind == "offset":
        x = rng.standard_normal((rows + 1, cols + 2))[1:, 1:cols + 1]
    else:
        x = rng.standard_normal((cols, rows)).T
    return x.view(FakeArray)


def _same_layout(c):
    """A fresh copy of C in C's own layout (a column-major C stays column-major: the operand swap)."""
    out = np.empty_like(c, order="F" if c.flags.f_contiguous and not c.flags.c_contiguous else "C")
    out[...] = c
    return out.view(FakeArray)


@st.composite
def calls(draw):
    m, n, k = draw(dims), draw(dims), draw(dims)
    ta, tb = draw(st.booleans()), draw(st.booleans())
    a = _matrix(draw, *((k, m) if ta else (m, k)), seed=draw(st.integers(0, 99)))
    b = _matrix(draw, *((n, k) if tb else (k, n)), seed=draw(st.integers(0, 99)))
    kw = {"trans_a": ta, "trans_b": tb, "alpha": draw(good_scalars)}
    c = None
    valid = True                    # a call torch.matmul would take: it must give C, not an error
    if draw(st.booleans()):
        right = draw(st.integers(0, 5)) > 0
        c = _matrix(draw, m, n, seed=7) if right else _matrix(draw, m + 1, n, seed=7)
        kw["beta"] = draw(good_scalars)
        valid = right
    # one option of the wrong kind now and then
    bad = draw(st.sampled_from([None] * 10 + ["alpha", "beta", "trans_a", "params", "kernel"]))
    if bad in ("alpha", "beta"):
        kw[bad] = draw(bad_scalars)
    elif bad == "trans_a":
        kw["trans_a"] = draw(bad_flags)
    elif bad == "params":
        kw["params"] = draw(st.sampled_from(["BK=16", 3, {"TILE": "x"}, {"NO_SUCH": 1}]))
    elif bad == "kernel":
        kw["kernel"] = draw(st.sampled_from([5, ["tiny_dgemm"], "no_such_kernel"]))
    if draw(st.booleans()) and bad != "kernel":
        kw["kernel"] = "tiny_dgemm"
    if bad != "trans_a":            # the same flag as an int or a numpy bool
        kw["trans_a"] = draw(st.sampled_from(EQUIVALENT[ta]))
    if c is None and draw(st.integers(0, 9)) == 0:
        kw["beta"] = 0.5            # beta without a C to scale
        valid = False
    return a, b, c, kw, valid and bad is None


FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(case=calls())
def test_a_call_on_cupy_arrays_gives_numpys_c_or_an_asm_error(gpu, case):  # noqa: F811
    _run(case, lambda x: x.view(FakeArray))


@FUZZ
@given(case=calls())
def test_a_call_on_torch_tensors_gives_numpys_c_or_an_asm_error(gpu, monkeypatch, case):  # noqa: F811
    import sys

    from fake_cupy import make_torch
    torch = sys.modules.get("torch")
    if getattr(torch, "__name__", None) != "torch" or not hasattr(torch, "stream_ptr"):
        torch = make_torch()
        monkeypatch.setitem(sys.modules, "torch", torch)
    _run(case, torch.from_numpy)


def _run(case, wrap):
    """The call, twice, on operands `wrap` makes of the numpy arrays (CuPy's stand-in arrays as
    they are, or torch's stand-in tensors over the same memory)."""
    import sys

    import asmgemm
    cupy = sys.modules["cupy"]
    if not hasattr(cupy.cuda, "driver"):
        with_raw_launch(cupy)
    a, b, c, kw, valid = case
    for _ in range(2):
        c_in = None if c is None else _same_layout(c)
        before = None if c_in is None else np.array(c_in)
        try:
            out = asmgemm.gemm(wrap(np.asarray(a)), wrap(np.asarray(b)), None if c_in is None else wrap(np.asarray(c_in)),
                               **kw)
        except AsmError:
            assert not valid, "a call torch.matmul would take was refused"
            continue
        out = np.asarray(out.numpy() if hasattr(out, "numpy") and not isinstance(out, np.ndarray) else out)
        ta, tb = bool(kw["trans_a"]), bool(kw["trans_b"])
        want = float(kw["alpha"]) * ((np.asarray(a).T if ta else np.asarray(a)) @ (np.asarray(b).T if tb
                                                                                 else np.asarray(b)))
        if c_in is not None:
            want = want + (float(kw.get("beta", 0.0)) * before if float(kw.get("beta", 0.0)) else 0)
            out = np.asarray(c_in)      # (the C given, written in place)
        np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-10)
