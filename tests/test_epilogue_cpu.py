"""The fused epilogue's plumbing on the CPU (gemm(bias=, activation=)): bias layouts and the
operand swap, call values, the packed bias pointer, errors, the launch-plan cache key; and builds
of every BIAS x ACT combination of sgemm without spills (ptxas).

gemm() runs to the launch with the stand-in CuPy of tests/fake_cupy.py, whose "kernel" reads the
packed arguments by the build's .param list and its BIAS/ACT defines, and computes in float64
what the kernel would (tests/epilogue_reference.py): a wrong mode, a missing swap or a pointer in
the wrong slot gives a wrong C. The numerics of the .sasm activations are tests/test_epilogue_math.py;
on the GPU, tests/test_epilogue_gpu.py."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from asmgemm import kernel_spec
from asmgemm.errors import AsmError
from asmgemm.runtime.plan import plan_launch
from asmgemm.toolchain import find_tool
from epilogue_reference import epilogue
from dispatch_helpers import dispatch_dir  # noqa: F401  (the fixture)
from fake_cupy import FakeArray, install_fakes
from sweeps import sample_every

TINY = Path(__file__).parent / "data" / "tiny_gemm"
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")
BIAS_SLOT = kernel_spec.get_spec("sgemm").abi.index("bias")      # where sgemm's .param list has the bias


def ptr(x):
    return x.ctypes.data


def f32(*shape, seed=0, order="C"):
    x = np.random.default_rng(seed + 31 * sum(shape)).standard_normal(shape).astype(np.float32)
    return np.asfortranarray(x) if order == "F" else x


# ---- the plan: bias layouts, the swap, errors (pure Python) ----------------------------------------
@pytest.mark.parametrize("c_order", ["C", "F"])
def test_bias_layout_is_per_user_column_or_row_and_swaps_with_column_major_c(c_order):
    a, b, c = f32(6, 4), f32(4, 5), f32(6, 5, order=c_order)
    flip = c_order == "F"             # the kernel computes C^T: user columns are kernel rows
    for bias, user_mode in ((f32(5), 1), (f32(1, 5), 1), (f32(6, 1), 2)):
        p = plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=ptr, bias=bias, activation=3)
        assert p.call_values["bias"] == (3 - user_mode if flip else user_mode)
        assert p.call_values["activation"] == 3 and p.bias_ptr == ptr(bias) and p.swapped == flip
    p = plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=ptr)
    assert (p.call_values["bias"], p.call_values["activation"], p.bias_ptr) == (0, 0, 0)


def test_a_square_c_takes_an_n_vector_as_per_column_like_torch_linear():
    a, b, c = f32(5, 3), f32(3, 5), f32(5, 5)
    p = plan_launch(a, b, c, trans_a=False, trans_b=False, ptr_of=ptr, bias=f32(5))
    assert p.call_values["bias"] == 1


def _misaligned_bias(n):
    raw = np.zeros(4 * n + 1, np.uint8)
    return np.frombuffer(raw.data, dtype=np.float32, count=n, offset=1)


@pytest.mark.parametrize("bias, words", [
    (f32(6), "must be (5,) or (1, 5) (one value per column) or (6, 1)"),      # M values without the (M, 1) shape
    (f32(5, 1), "bias has shape (5, 1)"),
    (f32(6, 5), "bias has shape (6, 5)"),
    (np.zeros(5, np.float64), "bias has dtype float64; the epilogue adds it in C's dtype float32"),
    (f32(10)[::2], "not contiguous"),
    (f32(6, 2)[:, :1], "not contiguous"),
    (_misaligned_bias(5), "not aligned to its 4-byte elements"),
])
def test_bad_biases_are_clear_errors(bias, words):
    with pytest.raises(AsmError) as e:
        plan_launch(f32(6, 4), f32(4, 5), f32(6, 5), trans_a=False, trans_b=False, ptr_of=ptr, bias=bias)
    assert words in str(e.value) and e.value.hint


def test_an_unknown_activation_names_the_valid_ones():
    import asmgemm
    with pytest.raises(AsmError) as e:
        asmgemm.gemm(None, None, activation="tanh")     # checked first: no GPU, no arrays needed
    assert "'tanh'" in str(e.value) and "'relu', 'gelu', 'gelu_tanh', 'silu'" in str(e.value)
    with pytest.raises(AsmError):
        asmgemm.gemm(None, None, activation=["gelu"])   # unhashable: the same error, no TypeError


# ---- gemm() to the launch with the stand-in CuPy ---------------------------------------------------
@pytest.fixture
def fake(monkeypatch, tmp_path):
    """Stand-in CuPy (a float32 interpreting kernel) and torch; sgemm is built by ptxas for sm_90;
    the spec-only float64 kernel tests/data/tiny_gemm is known too (it has no fused epilogue)."""
    from asmgemm.runtime import build_cache
    cp, torch, launches = install_fakes(monkeypatch, tmp_path, TINY / "tiny_dgemm.toml", np.float32)
    yield cp, torch, launches
    build_cache.clear_memory_cache()


def _defines(launches):
    """BIAS and ACT of the build the last launch ran."""
    from asmgemm.runtime import build_cache
    fn_args = launches[-1][2]
    for cfg, built in build_cache._by_config.items():
        d = dict(cfg[2])
        if len(built.params) == len(fn_args):
            yield d


def _check(c, a, b, c0, alpha, beta, ta=False, tb=False, **epi):
    acc = (a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)
    want = epilogue(acc, alpha, beta, c0, **epi)
    np.testing.assert_allclose(np.asarray(c, np.float64), want, rtol=2e-5, atol=2e-5)


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("c_order", sample_every(2, ["C", "F"]))
@pytest.mark.parametrize("where", sample_every(2, ["cols", "cols_2d", "rows"]))
def test_bias_lands_on_the_users_columns_or_rows_in_both_c_orders(fake, c_order, where):
    import asmgemm
    cp, torch, launches = fake
    m, n, k = 37, 29, 11
    a, b = f32(m, k).view(FakeArray), f32(k, n).view(FakeArray)
    c = f32(m, n, seed=3, order=c_order).view(FakeArray)
    c0 = np.array(c)
    vec = {"cols": f32(n, seed=5), "cols_2d": f32(1, n, seed=5), "rows": f32(m, 1, seed=5)}[where].view(FakeArray)
    out = asmgemm.gemm(a, b, c, alpha=0.5, beta=2.0, bias=vec, activation="gelu")
    assert out is c
    epi = {"bias_rows": vec.ravel()} if where == "rows" else {"bias_cols": vec.ravel()}
    _check(c, a, b, c0, 0.5, 2.0, activation="gelu", **epi)
    args = launches[-1][2]
    assert int(args[BIAS_SLOT]) == vec.ctypes.data   # the bias argument: the vector's address


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("layout", sample_every(2, ["nn", "tn", "nt", "tt"]))
def test_each_activation_in_each_layout_with_a_new_c(fake, layout):
    import asmgemm
    cp, torch, launches = fake
    ta, tb = layout[0] == "t", layout[1] == "t"
    m, n, k = 20, 12, 9
    a = f32(*((k, m) if ta else (m, k))).view(FakeArray)
    b = f32(*((n, k) if tb else (k, n))).view(FakeArray)
    act = {"nn": "relu", "tn": "gelu_tanh", "nt": "silu", "tt": None}[layout]
    bias = f32(n, seed=9).view(FakeArray)
    c = asmgemm.gemm(a, b, trans_a=ta, trans_b=tb, bias=bias, activation=act)
    _check(c, a, b, None, 1.0, 0.0, ta, tb, bias_cols=bias, activation=act)


@pytest.mark.toolchain
@needs_ptxas
def test_the_plan_cache_keys_on_the_bias_layout_and_the_activation(fake):
    import asmgemm
    from asmgemm.runtime import gemm as gemm_mod
    cp, torch, launches = fake
    a, b = f32(16, 8).view(FakeArray), f32(8, 12).view(FakeArray)
    cols, rows = f32(12).view(FakeArray), f32(16, 1).view(FakeArray)
    asmgemm.gemm(a, b)
    start = len(gemm_mod._cache.plans)
    asmgemm.gemm(a, b, bias=cols, activation="relu")
    asmgemm.gemm(a, b, bias=cols, activation="relu")          # the same key: the kept plan
    assert len(gemm_mod._cache.plans) == start + 1
    c = asmgemm.gemm(a, b, bias=rows, activation="relu")      # another layout: its own plan and build
    _check(c, a, b, None, 1.0, 0.0, bias_rows=rows.ravel(), activation="relu")
    c = asmgemm.gemm(a, b, bias=cols, activation="silu")      # another activation: its own plan
    _check(c, a, b, None, 1.0, 0.0, bias_cols=cols, activation="silu")
    c = asmgemm.gemm(a, b)                                     # and none again: no bias, no activation
    _check(c, a, b, None, 1.0, 0.0)
    assert int(launches[-1][2][BIAS_SLOT]) == 0
    assert len(gemm_mod._cache.plans) == start + 3
    other = f32(13).view(FakeArray)[1:]                        # the same shape, 4 bytes off 16-byte alignment
    c = asmgemm.gemm(a, b, bias=other, activation="relu")
    _check(c, a, b, None, 1.0, 0.0, bias_cols=other, activation="relu")
    assert len(gemm_mod._cache.plans) == start + 4


@pytest.mark.toolchain
@needs_ptxas
def test_torch_tensors_take_a_torch_bias_and_do_not_mix(fake):
    import asmgemm
    cp, torch, launches = fake
    a, b, bias = f32(10, 6), f32(6, 7), f32(7, seed=2)
    out = asmgemm.gemm(torch.from_numpy(a), torch.from_numpy(b), bias=torch.from_numpy(bias), activation="gelu")
    assert isinstance(out, torch.Tensor)
    _check(out.numpy(), a, b, None, 1.0, 0.0, bias_cols=bias, activation="gelu")
    with pytest.raises(AsmError) as e:
        asmgemm.gemm(torch.from_numpy(a), torch.from_numpy(b), bias=bias.view(FakeArray))
    assert "cannot be mixed" in str(e.value) and "bias is a" in str(e.value)


@pytest.mark.toolchain
@needs_ptxas
def test_k_zero_with_an_epilogue_still_applies_beta_bias_and_activation(fake):
    import asmgemm
    cp, torch, launches = fake
    # (views of real rows: a (5, 0) array of its own has stride 0, which storage_of refuses)
    a, b = np.zeros((5, 8), np.float32)[:, :0].view(FakeArray), np.zeros((8, 4), np.float32)[:0].view(FakeArray)
    c = f32(5, 4).view(FakeArray)
    c0 = np.array(c)
    bias = f32(4, seed=1).view(FakeArray)
    asmgemm.gemm(a, b, c, beta=0.5, bias=bias, activation="relu")
    np.testing.assert_allclose(c, np.maximum(0.5 * c0 + bias, 0), rtol=1e-6)


def test_a_kernel_without_a_fused_epilogue_refuses_by_name(fake):
    import asmgemm
    cp, torch, launches = fake
    a = np.ones((4, 4)).view(FakeArray)                        # float64: tests/data/tiny_gemm's kernel
    with pytest.raises(AsmError) as e:
        asmgemm.gemm(a, a, bias=np.ones(4).view(FakeArray))
    assert "kernel 'tiny_dgemm' has no fused epilogue for bias" in str(e.value) and e.value.hint
    with pytest.raises(AsmError) as e:
        asmgemm.gemm(a, a, activation="gelu")
    assert "kernel 'tiny_dgemm' has no fused epilogue for activation" in str(e.value)
    assert not launches


def load_tiny_with_call_param(tmp_path, mapping: str):
    """tests/data/tiny_gemm's spec with one more call_params entry (e.g. 'BIAS = "bias"'), loaded."""
    src = (TINY / "tiny_dgemm.toml").read_text().replace(
        'call_params = { TRANS_A = "trans_a", TRANS_B = "trans_b" }',
        'call_params = { TRANS_A = "trans_a", TRANS_B = "trans_b", ' + mapping + ' }')
    (tmp_path / "tiny_dgemm.sasm").write_text((TINY / "tiny_dgemm.sasm").read_text())
    (tmp_path / "t.toml").write_text(src)
    return kernel_spec.load_spec_file(tmp_path / "t.toml")


def test_a_spec_mapping_bias_needs_the_abi_argument(tmp_path):
    with pytest.raises(AsmError) as e:
        load_tiny_with_call_param(tmp_path, 'BIAS = "bias"')
    assert "maps the call value 'bias' but abi has no 'bias' argument" in str(e.value)


# ---- every BIAS x ACT build of sgemm, without spills ---------------------------------------------
LARGE = ("-D", "RQ=4", "-D", "BK=16", "-D", "LOAD_AHEAD=1", "-D", "LDG_NC=0")


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("variant", sample_every(2, [(), LARGE]), ids=["default", "rq4_bk16_ahead"])
@pytest.mark.parametrize("bias", sample_every(3, [0, 1, 2]))
@pytest.mark.parametrize("act", sample_every(4, [0, 1, 2, 3, 4]))
def test_every_epilogue_builds_without_spills(run_cli, variant, bias, act):
    code, out, err = run_cli("check", "sgemm", "--no-spills", *variant, "-D", f"BIAS={bias}", "-D", f"ACT={act}")
    assert code == 0, err


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("define, words", [("BIAS=3", "BIAS is 0 (none), 1"), ("ACT=5", "ACT is 0 (none), 1 relu")])
def test_invalid_epilogue_parameters_stop_the_build(run_cli, define, words):
    code, out, err = run_cli("build", "sgemm", "-D", define, "-o", "-")
    assert code == 1 and words in err and "Traceback" not in err


# ---- tools/epilogue_bench.py without a GPU ---------------------------------------------------------
def _bench_tool():
    from conftest import load_tool
    return load_tool("epilogue_bench")


def test_the_bench_tool_explains_itself_and_stops_cleanly_without_a_gpu(monkeypatch, capsys):
    tool = _bench_tool()
    with pytest.raises(SystemExit) as e:
        tool.main(["--help"])
    assert e.value.code == 0 and "fused" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "cupy", None)              # no CuPy: require_gpu's clear stop
    assert tool.main(["--shapes", "64x64x64"]) == 1
    err = capsys.readouterr().err
    assert "needs a GPU" in err and "Traceback" not in err
    assert tool.main(["--kernel", "hgemm"]) == 1                 # the HGEMM's epilogue too: the GPU stop
    assert "needs a GPU" in capsys.readouterr().err


def test_the_bench_tools_separate_pass_covers_every_activation():
    tool = _bench_tool()
    assert set(tool._BODIES) == {"none", *kernel_spec.ACTIVATIONS}


def test_the_bench_tool_refuses_to_fuse_nothing(capsys):
    tool = _bench_tool()
    with pytest.raises(SystemExit) as e:
        tool.main(["--activation", "none", "--bias", "none"])
    assert e.value.code == 2 and "nothing to fuse" in capsys.readouterr().err


@needs_ptxas
def test_a_fused_epilogue_reaches_the_dispatch(fake_fp32_gemm, dispatch_dir):
    """The runtime gives dispatch the call's epilogue: at 2048x2048x2048 the plain call runs its
    exact hit (a split, in clusters of 2), a call with a bias or an activation the fused key's hit,
    unsplit (a split's partial pass stores raw sums), and each result carries the epilogue."""
    import asmgemm
    from asmgemm.runtime.gemm import last_launch
    dispatch_dir("Fake GPU", best={"sgemm|nn|2048x2048x2048|plain": "t64x64_k16/s2c",
                                   "sgemm|nn|2048x2048x2048|fused": "t128x128_k8"})
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2048, 2048), dtype=np.float32).view(FakeArray)
    b = rng.standard_normal((2048, 2048), dtype=np.float32).view(FakeArray)
    bias = rng.standard_normal(2048, dtype=np.float32).view(FakeArray)
    ran = {}
    ab = np.asarray(a, np.float64) @ np.asarray(b, np.float64)     # (the four calls' product: once)
    for act, with_bias in ((None, False), (None, True), ("relu", True), ("relu", False)):
        c = np.zeros((2048, 2048), np.float32).view(FakeArray)
        asmgemm.gemm(a, b, c, bias=bias if with_bias else None, activation=act)
        ran[act, with_bias] = (last_launch()["config"], last_launch()["splits"], last_launch()["tile"])
        want = epilogue(ab, 1.0, 0.0, None, activation=act, bias_cols=np.asarray(bias) if with_bias else None)
        np.testing.assert_allclose(np.asarray(c), want, rtol=1e-4, atol=1e-3)
    assert ran == {(None, False): ("t64x64_k16/s2c", 2, (64, 64)), (None, True): ("t128x128_k8", 1, (128, 128)),
                   ("relu", True): ("t128x128_k8", 1, (128, 128)), ("relu", False): ("t128x128_k8", 1, (128, 128))}
