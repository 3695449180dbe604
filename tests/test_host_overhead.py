"""The repeated-call path of asmgemm.gemm (runtime/gemm.py: launch plans kept per key) and the
host-overhead benchmark, on the CPU: a stand-in CuPy whose "kernel" computes what its packed
arguments say (fake_cupy.interpreting_kernel), so a plan reused for the wrong shape, stride,
pointer or layout gives a wrong C. The kernel is tests/data/tiny_gemm (float64, built by ptxas),
copied per test so that a test can edit its spec file and source."""
from __future__ import annotations

import json
import os
import shutil
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from asmgemm import kernel_spec
from asmgemm.errors import AsmError
from asmgemm.toolchain import find_tool
from fake_cupy import FakeArray, forget_loaded, interpreting_kernel, make_cupy

TINY = Path(__file__).parent / "data" / "tiny_gemm"
pytestmark = [pytest.mark.toolchain,
              pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")]


@pytest.fixture
def gpu(monkeypatch, tmp_path):
    """The tiny kernel (a private copy) as the float64 kernel, a private kernel cache, a stand-in
    CuPy whose kernel interprets its arguments, and counters of the planning steps gemm takes."""
    specs = tmp_path / "specs"
    shutil.copytree(TINY, specs)
    monkeypatch.setenv(kernel_spec.SPECS_ENV, str(specs / "tiny_dgemm.toml"))
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "1")
    from asmgemm.runtime import build_cache, kept_launch, launch_config
    build_cache.clear_memory_cache()
    launches, loads = [], []
    interpret = interpreting_kernel(launches)

    def function(path, entry):
        loads.append(path)
        return interpret(path, entry)
    monkeypatch.setitem(sys.modules, "cupy", make_cupy(function))
    forget_loaded(monkeypatch)
    counts = {"plan_launch": 0, "build_kernel": 0, "spec_for_dtype": 0}

    def counting(name):
        # the runtime modules that call it (the planning in launch_config, split-K's reduce build
        # in kept_launch)
        for module in (launch_config, kept_launch):
            real = getattr(module, name, None)
            if real is None:
                continue

            def wrapper(*args, real=real, **kw):
                counts[name] += 1
                return real(*args, **kw)
            monkeypatch.setattr(module, name, wrapper)
    for name in counts:
        counting(name)
    yield types.SimpleNamespace(launches=launches, loads=loads, counts=counts, specs=specs)
    build_cache.clear_memory_cache()
    kernel_spec.refresh_specs()


def rand(*shape, seed=0, order="C"):
    a = np.random.default_rng(seed + sum(shape)).standard_normal(shape)
    return (np.asfortranarray(a) if order == "F" else np.ascontiguousarray(a)).view(FakeArray)


def check(a, b, c, *, alpha=1.0, beta=0.0, ta=False, tb=False):
    """gemm on (a, b, c) against numpy, C poisoned when beta == 0 (so an unwritten C fails)."""
    import asmgemm
    a_, b_ = np.asarray(a), np.asarray(b)
    c0 = np.array(c)
    if beta == 0:
        np.asarray(c)[...] = np.nan
    out = asmgemm.gemm(a, b, c, alpha=alpha, beta=beta, trans_a=ta, trans_b=tb)
    want = alpha * ((a_.T if ta else a_) @ (b_.T if tb else b_)) + (beta * c0 if beta else 0)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-12, atol=1e-12)
    return out


def test_a_repeated_call_reuses_its_launch_plan(gpu):
    a, b, c = rand(37, 29), rand(29, 45), rand(37, 45)
    check(a, b, c, alpha=0.5, beta=-2.0)
    assert gpu.counts == {"plan_launch": 1, "build_kernel": 1, "spec_for_dtype": 1}
    for i in range(3):
        check(a, b, c, alpha=1.5 + i, beta=0.25)         # alpha and beta are per call, not per plan
    # new arrays of the same shapes (other pointers): the same plan, their own pointers packed
    a2, b2, c2 = rand(37, 29, seed=5), rand(29, 45, seed=6), rand(37, 45, seed=7)
    check(a2, b2, c2)
    assert gpu.counts == {"plan_launch": 1, "build_kernel": 1, "spec_for_dtype": 1}
    assert len(gpu.launches) == 5 and len(gpu.loads) == 1
    args = dict(zip(["M", "N", "K", "alpha", "A", "lda", "B", "ldb", "beta", "C", "ldc"], gpu.launches[-1][2]))
    assert (int(args["A"]), int(args["B"]), int(args["C"])) == (a2.ctypes.data, b2.ctypes.data, c2.ctypes.data)
    assert gpu.launches[-1][4] is None                   # CuPy arrays: CuPy's current stream (stream= left out)


# (A storage, B storage, C storage, trans_a, trans_b): each a way to hold the same 23 x 17 x 11 product
def _cases():
    m, n, k = 23, 17, 11
    big = rand(40, 40, seed=9)
    return {
        "row-major": (rand(m, k), rand(k, n), rand(m, n), False, False),
        "trans flags": (rand(k, m), rand(n, k), rand(m, n), True, True),
        "column-major A and B": (rand(m, k, order="F"), rand(k, n, order="F"), rand(m, n), False, False),
        "column-major C (operand swap)": (rand(m, k), rand(k, n), rand(m, n, order="F"), False, False),
        "strided A (lda 40)": (big[:m, :k], rand(k, n), rand(m, n), False, False),
        "strided A (lda 40), 8-byte offset": (big[1:m + 1, 1:k + 1], rand(k, n), rand(m, n), False, False),
        "strided B and C": (rand(m, k), rand(30, 30, seed=3)[:k, :n], rand(50, 50, seed=4)[:m, :n], False, False),
        "transposed view of B": (rand(m, k), rand(n, k).T, rand(m, n), False, False),
    }


def test_every_layout_and_stride_gets_its_own_plan_and_the_right_c(gpu):
    cases = _cases()
    for _ in range(2):                                   # the second round runs on kept plans only
        for name, (a, b, c, ta, tb) in cases.items():
            check(a, b, c, alpha=0.75, beta=0.5, ta=ta, tb=tb)
        planned = gpu.counts["plan_launch"]
    assert planned == len(cases)                         # one key each; no plan served another case
    assert len(gpu.launches) == 2 * len(cases)


@pytest.mark.parametrize("which", ["A", "B", "A and B", "swapped (column-major C)"])
def test_a_call_that_pads_a_copy_keeps_its_plan_and_copies_again(gpu, monkeypatch, which):
    """An operand TMA cannot read in place (rows not 16-byte aligned) is copied to padded rows; the
    plan made on the copy's layout is kept under the caller's key, and a repeated call copies the
    new data again and launches without planning (the tiny float64 kernel stands in for a TMA
    kernel: 3 or 5 doubles a row are 24 or 40 bytes)."""
    from asmgemm.runtime import launch_config
    monkeypatch.setattr(launch_config, "takes_tensor_maps", lambda spec: True)
    m, n, k = 9, 5 if "B" in which else 6, 3 if "A" in which or "swapped" in which else 4
    order = "F" if "swapped" in which else "C"
    copies = []
    for round_ in range(3):
        a, b, c = rand(m, k, seed=round_), rand(k, n, seed=10 + round_), rand(m, n, seed=20 + round_, order=order)
        check(a, b, c, alpha=0.5, beta=0.25)
        args = gpu.launches[-1][2]
        # the kernel's A and B (the swap: the caller's B^T and A^T), and whether each is a copy
        operands = [(args[4], b, False), (args[6], a, True)] if "swapped" in which else \
            [(args[4], a, "A" in which), (args[6], b, "B" in which)]
        for ptr, given, copied in operands:
            assert (int(ptr) != given.ctypes.data) == copied
        assert int(args[5]) % 2 == 0 and int(args[7]) % 2 == 0    # each row the kernel reads is 16-byte aligned
        copies.append(tuple(int(ptr) for ptr, _, copied in operands if copied))
    assert gpu.counts["plan_launch"] == 2                  # the call as given, then on the copies; then kept
    assert copies[0] == copies[1] == copies[2]              # the copies go to kept storage (split_scratch)
    assert len(gpu.launches) == 3


def test_a_new_c_each_call_and_beta_still_checked(gpu):
    import asmgemm
    a, b = rand(20, 10), rand(10, 30)
    c1, c2 = asmgemm.gemm(a, b), asmgemm.gemm(a, b)
    assert c1 is not c2 and c1.shape == (20, 30)
    np.testing.assert_allclose(np.asarray(c2), np.asarray(a) @ np.asarray(b), rtol=1e-12)
    assert gpu.counts["plan_launch"] == 1
    with pytest.raises(AsmError, match="needs a C to scale"):
        asmgemm.gemm(a, b, beta=1.0)


def test_params_and_tuning_lookups_are_part_of_the_key(gpu, monkeypatch):
    import asmgemm
    a, b, c = rand(20, 10), rand(10, 30), rand(20, 30)
    asmgemm.gemm(a, b, c)
    asmgemm.gemm(a, b, c, params={"TILE": 16})
    asmgemm.gemm(a, b, c, params={"TILE": 16})
    assert [l[1] for l in gpu.launches] == [(64, 1, 1), (256, 1, 1), (256, 1, 1)]
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "0")     # tuning-cache lookups on: another key
    asmgemm.gemm(a, b, c)
    assert gpu.counts["plan_launch"] == 3


def test_no_file_system_check_on_a_repeated_call(gpu, monkeypatch):
    import asmgemm
    a, b, c = rand(20, 10), rand(10, 30), rand(20, 30)
    asmgemm.gemm(a, b, c)
    monkeypatch.setattr(kernel_spec, "SPEC_RECHECK_S", 3600.0)
    kernel_spec.refresh_specs()
    asmgemm.gemm(a, b, c)                                # looks at the spec files once, now
    seen = []
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda *args, **kw: seen.append(args[0]) or real_stat(*args, **kw))
    for _ in range(50):
        asmgemm.gemm(a, b, c)
    monkeypatch.setattr(os, "stat", real_stat)
    assert seen == [] and gpu.counts["plan_launch"] == 1 and len(gpu.launches) == 52


# ---- invalidation ------------------------------------------------------------------------------
def test_an_edited_spec_file_is_not_served_stale(gpu, monkeypatch):
    import asmgemm
    a, b, c = rand(20, 10), rand(10, 30), rand(20, 30)
    asmgemm.gemm(a, b, c)
    assert gpu.launches[-1][1] == (64, 1, 1)             # 3 x 4 tiles of 8: TILE=8
    spec_file = gpu.specs / "tiny_dgemm.toml"
    spec_file.write_text(spec_file.read_text().replace("ceil_div(M, 8) * ceil_div(N, 8) > 64", "M > 0"))
    # within SPEC_RECHECK_S the files are not looked at ...
    monkeypatch.setattr(kernel_spec, "SPEC_RECHECK_S", 3600.0)
    asmgemm.gemm(a, b, c)
    assert gpu.launches[-1][1] == (64, 1, 1)
    # ... once it passed (here: at once), the edit is seen and the call planned again
    monkeypatch.setattr(kernel_spec, "SPEC_RECHECK_S", 0.0)
    check(a, b, c)
    assert gpu.launches[-1][1] == (256, 1, 1) and gpu.counts["plan_launch"] == 2


def test_registering_a_spec_drops_the_plans(gpu):
    import asmgemm
    a, b, c = rand(20, 10), rand(10, 30), rand(20, 30)
    asmgemm.gemm(a, b, c)
    (spec,) = kernel_spec.load_spec_file(gpu.specs / "tiny_dgemm.toml")
    other = spec.__class__(**{**spec.__dict__, "name": "tiny_again"})
    kernel_spec.register(other)
    try:
        asmgemm.gemm(a, b, c)
        assert gpu.counts["plan_launch"] == 2
        asmgemm.gemm(a, b, c, kernel="tiny_again")
    finally:
        kernel_spec.unregister("tiny_again")
    asmgemm.gemm(a, b, c)
    assert gpu.counts["plan_launch"] == 4


def test_a_rebuilt_kernel_is_not_served_stale(gpu):
    """An edited kernel source, after build_cache.clear_memory_cache() (what build_cache asks for
    after an edit): the next call builds and loads the new kernel."""
    import asmgemm
    from asmgemm.runtime import build_cache
    a, b, c = rand(20, 10), rand(10, 30), rand(20, 30)
    asmgemm.gemm(a, b, c)
    source = gpu.specs / "tiny_dgemm.sasm"
    source.write_text(source.read_text() + "\n// edited: another kernel-cache key\n")
    asmgemm.gemm(a, b, c)
    assert len(gpu.loads) == 1                           # nothing said the kernel changed yet
    build_cache.clear_memory_cache()
    check(a, b, c)
    assert len(gpu.loads) == 2 and gpu.loads[1] != gpu.loads[0] and gpu.counts["build_kernel"] == 2


def test_forgetting_tuned_choices_drops_the_plans(gpu):
    import asmgemm
    from asmgemm.runtime import gemm
    a, b, c = rand(20, 10), rand(10, 30), rand(20, 30)
    asmgemm.gemm(a, b, c)
    gemm.forget_tuned_choices()
    asmgemm.gemm(a, b, c)
    assert gpu.counts["plan_launch"] == 2


def test_spec_version_is_exact_for_the_environment_and_cheap_for_files(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel_spec, "SPEC_RECHECK_S", 3600.0)
    kernel_spec.refresh_specs()
    stats = []
    real = kernel_spec._stamp
    monkeypatch.setattr(kernel_spec, "_stamp", lambda p: stats.append(p) or real(p))
    first = kernel_spec.specs_version()
    assert kernel_spec.specs_version() is first and len(stats) == 1      # the shipped file, once
    spec_file = tmp_path / "x.toml"
    spec_file.write_text("")
    monkeypatch.setenv(kernel_spec.SPECS_ENV, str(spec_file))
    second = kernel_spec.specs_version()
    assert second is not first and kernel_spec.specs_version() is second
    monkeypatch.delenv(kernel_spec.SPECS_ENV)
    assert kernel_spec.specs_version() == first
    kernel_spec.refresh_specs()


# ---- the host-overhead benchmark -------------------------------------------------------------
def test_time_host_counts_each_call_and_alternates_blocks():
    from asmgemm.bench.host_overhead import time_host
    ticks = [0]
    order = []

    def clock():
        ticks[0] += 1000                                 # 1 us per reading
        return ticks[0]
    fns = {"x": lambda: order.append("x"), "y": lambda: (order.append("y"), clock())}
    res = time_host(fns, calls=7, synchronize=lambda: None, warmup=0, block=3, clock=clock)
    assert res["x"].calls == res["y"].calls == 7
    assert res["x"].median_us == 1.0 and res["y"].median_us == 2.0            # y reads the clock once more
    assert order == ["x"] * 3 + ["y"] * 3 + ["y"] * 3 + ["x"] * 3 + ["x"] + ["y"]


def test_bench_host_overhead_reports_us_per_call(gpu, run_cli, tmp_path):
    out = tmp_path / "host.json"
    code, stdout, err = run_cli("bench", "tiny_dgemm", "--host-overhead", "--calls", "300", "--shapes", "24x16x8",
                                "--no-torch", "--json", out)
    assert code == 0, err
    rep = json.loads(out.read_text())
    assert rep["m"] == 24 and rep["calls"] == 300 and rep["kernel"] == "tiny_dgemm"
    assert set(rep["host_us"]) == {"asmgemm", "cublas"} and rep["host_us"]["asmgemm"]["calls"] == 300
    assert rep["host_us"]["asmgemm"]["mean_us"] > 0 and "asmgemm" in rep["overhead_over_cublas_us"]
    assert gpu.counts["plan_launch"] == 1 and len(gpu.launches) == 300 + 50       # warm-up included
    assert "host time per call" in stdout and "mean over cuBLAS" in stdout


def test_bench_host_overhead_refuses_a_picture(run_cli, tmp_path):
    code, _, err = run_cli("bench", "--host-overhead", "--plot", tmp_path / "x.png")
    assert code == 1 and "--host-overhead has no picture" in err and "Traceback" not in err
