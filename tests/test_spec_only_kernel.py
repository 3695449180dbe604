"""A GEMM kernel that the project knows only through a spec entry (tests/data/tiny_gemm: float64,
a 1-D block of TILE*TILE threads, a .param order unlike sgemm's) goes through asmgemm.gemm,
`asmgemm run`, `bench`, `tune` and `kernels` without any Python of its own.

On the CPU: built with ptxas, its arguments packed by the spec's abi, and gemm() driven to the
launch with a stand-in CuPy whose "kernel" reads the packed arguments the way the PTX does
(pointers into real memory), so a wrong order or type gives a wrong C. On the GPU: the same
through the real launch, and the command line end to end.
"""
from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from asmgemm import kernel_spec
from asmgemm.toolchain import find_tool
from fake_cupy import FakeArray, forget_loaded, make_cupy, read_bytes

TINY = Path(__file__).parent / "data" / "tiny_gemm"
SPEC_FILE = TINY / "tiny_dgemm.toml"
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="ptxas not installed")


@pytest.fixture
def tiny(monkeypatch, tmp_path):
    """The tiny kernel's spec file named in $ASMGEMM_KERNEL_SPECS, and a private kernel cache."""
    monkeypatch.setenv(kernel_spec.SPECS_ENV, str(SPEC_FILE))
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "1")
    from asmgemm.runtime import build_cache
    build_cache.clear_memory_cache()
    yield kernel_spec.get_spec("tiny_dgemm")
    build_cache.clear_memory_cache()


# ---- a stand-in CuPy that launches by interpreting the tiny kernel's arguments -------------------
def _matrix(ptr: int, rows: int, cols: int, ld: int) -> np.ndarray:
    """A float64 rows x cols row-major view (leading dimension ld) of memory at ptr, as the kernel reads it."""
    count = (rows - 1) * ld + cols
    flat = np.ctypeslib.as_array((ctypes.c_double * count).from_address(ptr))
    return np.lib.stride_tricks.as_strided(flat, (rows, cols), (ld * 8, 8))


def _tiny_dgemm_launch(launches):
    """What tiny_dgemm.sasm computes (TRANS_A = TRANS_B = 0), reading the arguments in its .param order."""
    def fn(grid, block, args, shared_mem=0):
        launches.append((grid, block, args, shared_mem))
        M, N, K, alpha, A, lda, B, ldb, beta, C, ldc = args
        assert [type(x) for x in args] == [np.uint32, np.uint32, np.uint32, np.float64, np.uint64, np.uint32,
                                          np.uint64, np.uint32, np.float64, np.uint64, np.uint32]
        M, N, K, lda, ldb, ldc = (int(x) for x in (M, N, K, lda, ldb, ldc))
        a, b, c = _matrix(int(A), M, K, lda), _matrix(int(B), K, N, ldb), _matrix(int(C), M, N, ldc)
        c[...] = float(alpha) * (a @ b) + (float(beta) * c if beta != 0 else 0.0)
    return fn


@pytest.fixture
def fake_cupy(monkeypatch):
    launches = []

    def function(path, entry):
        assert read_bytes(path)[:4] == b"\x7fELF", "the runtime loads the cubin ptxas made"
        assert entry == "tiny_dgemm"
        return _tiny_dgemm_launch(launches)
    monkeypatch.setitem(sys.modules, "cupy", make_cupy(function))
    forget_loaded(monkeypatch)
    return launches


def _arrays(*shapes, seed=0):
    rs = np.random.default_rng(seed)
    return [rs.standard_normal(s).view(FakeArray) for s in shapes]


@pytest.mark.toolchain
@needs_ptxas
def test_built_from_its_spec_with_its_own_geometry_and_argument_order(tiny):
    from asmgemm.runtime.build_cache import build_kernel
    built = build_kernel(tiny, {"TILE": 16, "TRANS_A": 0, "TRANS_B": 0}, "sm_90")
    assert (built.threads, built.tile_m, built.tile_n, built.smem_bytes) == (256, 16, 16, 0)
    assert built.params == (("M", ".u32"), ("N", ".u32"), ("K", ".u32"), ("alpha", ".f64"), ("A", ".u64"),
                            ("lda", ".u32"), ("B", ".u64"), ("ldb", ".u32"), ("beta", ".f64"), ("C", ".u64"),
                            ("ldc", ".u32"))


@pytest.mark.toolchain
@needs_ptxas
def test_gemm_picks_it_by_dtype_and_launches_it_by_its_spec(tiny, fake_cupy):
    import asmgemm
    a, b, c = _arrays((37, 29), (29, 45), (37, 45))
    c0 = np.array(c)
    out = asmgemm.gemm(a, b, c, alpha=0.5, beta=-2.0)           # float64: the only float64 kernel is tiny_dgemm
    assert out is c
    np.testing.assert_allclose(np.asarray(c), 0.5 * np.asarray(a) @ np.asarray(b) - 2.0 * c0, rtol=1e-12, atol=1e-12)
    (grid, block, args, smem), = fake_cupy
    # 5 x 6 tiles of 8x8: the size rule keeps TILE=8 up to 64 tiles
    assert grid == (6, 5, 1) and block == (64, 1, 1) and smem == 0


@pytest.mark.toolchain
@needs_ptxas
def test_the_size_rule_of_the_spec_decides_the_tile(tiny, fake_cupy):
    import asmgemm
    a, b = _arrays((100, 20), (20, 90))
    c = asmgemm.gemm(a, b)                                     # 13 x 12 tiles of 8 > 64: TILE=16
    np.testing.assert_allclose(np.asarray(c), np.asarray(a) @ np.asarray(b), rtol=1e-12, atol=1e-12)
    assert fake_cupy[-1][0] == (6, 7, 1) and fake_cupy[-1][1] == (256, 1, 1)
    asmgemm.gemm(a, b, params={"TILE": 8})                     # params= overrides the rule
    assert fake_cupy[-1][1] == (64, 1, 1)


def test_the_command_line_knows_it_through_the_spec_file(tiny, run_cli):
    code, out, err = run_cli("kernels", "--json")
    assert code == 0, err
    rows = {r["name"]: r for r in json.loads(out)}
    assert rows["tiny_dgemm"]["spec"]["dtypes"]["a"] == "float64" and rows["sgemm"]["spec"] is not None
    assert rows["sgemm_naive"]["spec"] is None                  # shipped, buildable, not launchable


@pytest.mark.parametrize("command", [["run", "tiny_dgemm", "--m", "8", "--n", "8", "--k", "8"],
                                     ["bench", "tiny_dgemm", "--shapes", "64x64x64"]])
def test_run_and_bench_go_as_far_as_the_gpu(tiny, run_cli, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "cupy", None)             # this machine has no GPU: a clear stop
    code, out, err = run_cli(*command)
    assert code == 1 and "needs a GPU" in err and "Traceback" not in err


def test_run_refuses_a_kernel_without_a_spec(run_cli):
    code, _, err = run_cli("run", "sgemm_naive", "--m", "8", "--n", "8", "--k", "8")
    assert code == 1 and "'sgemm_naive' is not a GEMM kernel asmgemm can launch" in err


@pytest.mark.toolchain
@needs_ptxas
def test_tune_dry_run_builds_its_space(tiny, run_cli):
    code, out, err = run_cli("tune", "tiny_dgemm", "--shape", "64,64,64", "--dry-run", "--json", "-j", "1")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["kernel"] == "tiny_dgemm" and rep["candidates"] == 2 and rep["survivors"] == 2
    assert rep["build_defines"] == {"TRANS_A": "0", "TRANS_B": "0"}


# ---- on the GPU ----------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_gemm_runs_it_on_the_gpu(tiny, cuda_gpu, layout):
    import asmgemm
    cp = cuda_gpu
    ta, tb = layout[0] == "t", layout[1] == "t"
    m, n, k = 77, 45, 31
    rs = cp.random.RandomState(1)
    a = rs.standard_normal((k, m) if ta else (m, k))
    b = rs.standard_normal((n, k) if tb else (k, n))
    c = rs.standard_normal((m, n))
    product = (a.T if ta else a) @ (b.T if tb else b)
    want = 1.5 * product + 0.25 * c
    asmgemm.gemm(a, b, c, alpha=1.5, beta=0.25, trans_a=ta, trans_b=tb)
    assert float(cp.abs(c - want).max()) < 1e-10
    cf = cp.asfortranarray(cp.full((m, n), cp.nan))            # column-major C: the operand swap; beta=0 never reads it
    asmgemm.gemm(a, b, cf, trans_a=ta, trans_b=tb)
    assert float(cp.abs(cf - product).max()) < 1e-10


@pytest.mark.gpu
def test_run_and_bench_run_it_on_the_gpu(tiny, cuda_gpu, run_cli):
    code, out, err = run_cli("run", "tiny_dgemm", "--m", "130", "--n", "70", "--k", "33", "--layout", "tn",
                             "--alpha", "0.5", "--beta", "2", "--reps", "3", "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res["ok"] and res["kernel"] == "tiny_dgemm" and res["errors"]["rel_norm_err_vs_fp64"] < 1e-12
    code, out, err = run_cli("bench", "tiny_dgemm", "--shapes", "96x80x40", "--layouts", "nn,tt", "--reps", "3",
                             "--no-torch", "--json")
    assert code == 0, err
    rows = json.loads(out)["rows"]
    assert len(rows) == 2 and all(r["correct"] and r["kernel"] == "tiny_dgemm" for r in rows)
