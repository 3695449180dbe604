"""Fixtures shared by the test modules: the GPU gate, the in-process CLI runner, a private build
cache and asmgemm.gemm through a stand-in CuPy that computes what a kernel's packed arguments ask."""
import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from asmgemm.runtime.gpu import require_gpu
from asmgemm.errors import AsmError


MEMOS = {"ASMGEMM_TOOL_MEMO": "asmgemm-tool-memo-", "ASMGEMM_BUILD_MEMO": "asmgemm-build-memo-"}
# NumPy's BLAS (OpenBLAS) starts a thread per core for each large product. Under `pytest -n auto`
# every core already runs a worker, so those threads only fight the other workers for the cores.
# On the 2-core machine test_splitk's bench test (a NumPy stand-in kernel timed a few hundred times)
# took 2.4 s with two threads beside a busy worker and 1.2 s with one; with other work on the
# machine as well (load ~4), 17 to 43 s against 1.6 s. The run's processes get one BLAS thread each.
ONE_BLAS_THREAD = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def pytest_configure(config):
    """One ptxas/nvdisasm memo (asmgemm.toolchain, ASMGEMM_TOOL_MEMO) and one build memo
    (asmgemm.build_memo, ASMGEMM_BUILD_MEMO) for the whole run: the suite builds, assembles and
    disassembles the same kernels in many tests; each distinct build or tool run still happens
    once. Set by the process that starts the run, so `pytest -n 2`'s workers (started after this,
    with its environment) share them; removed when that process ends. A caller's own setting is
    kept. The folders are private (tempfile.mkdtemp): the build memo holds pickles. And one BLAS
    thread a process (ONE_BLAS_THREAD), unless the caller set its own."""
    if hasattr(config, "workerinput"):
        return
    config._asmgemm_memos = []
    for env, prefix in MEMOS.items():
        if os.environ.get(env):
            continue
        folder = tempfile.mkdtemp(prefix=prefix)
        os.environ[env] = folder
        config._asmgemm_memos.append((env, folder))
    # (the workers start after this and import NumPy themselves; this process has it already, so
    # a run without -n keeps its threads)
    config._asmgemm_blas = [env for env in ONE_BLAS_THREAD if env not in os.environ]
    for env in config._asmgemm_blas:
        os.environ[env] = "1"


# The collector's thresholds for the test processes. The suite keeps large object graphs alive
# (module-scoped decoded kernels, dependence graphs, ASTs, grammars), and at the default (700, 10,
# 10) each full collection walks them all again: on the 2-core machine test_sass_stall_pass took
# 48 s of CPU that way and 40-43 s with what collection built frozen (gc.freeze) and these
# thresholds (two runs each, the same peak memory). Cyclic garbage is still collected.
GC_THRESHOLDS = (50_000, 50, 100)


def pytest_collection_finish(session):
    """Freeze what collection built (modules, parametrize values, the grammar) out of the
    collector's sight and collect less often (GC_THRESHOLDS); in each process that runs tests."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def pytest_unconfigure(config):
    for env, folder in getattr(config, "_asmgemm_memos", []):
        shutil.rmtree(folder, ignore_errors=True)
        os.environ.pop(env, None)
    for env in getattr(config, "_asmgemm_blas", []):
        os.environ.pop(env, None)


@pytest.fixture(scope="session")
def cuda_gpu():
    """The cupy module when CuPy is installed and a CUDA device answers; otherwise the test that
    asks for it is skipped with the reason (so `-m gpu` on a CPU machine reports skips, not errors)."""
    try:
        return require_gpu("this test")
    except AsmError as exc:
        pytest.skip(exc.message)


@pytest.fixture
def run_cli(capsys):
    """Run `asmgemm ARGS...` in this process; returns (exit code, stdout, stderr)."""
    from asmgemm.cli import main

    def run(*args) -> tuple[int, str, str]:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return run


# The target each shipped kernel builds for by default (the wgmma kernel needs sm_90a).
SHIPPED_TARGETS = {"hgemm": "sm_90a"}


@pytest.fixture(scope="session")
def shipped_cubins() -> dict:
    """name -> ptxas's cubin of every shipped kernel at its defaults, built once per worker for the
    modules that patch, reorder or check them (test_sass_patch, _stall_pass, _reorder_pass)."""
    from asmgemm.pipeline import BuildOptions, assemble, build_file, shipped_kernels
    return {name: assemble(build_file(name, BuildOptions(target=SHIPPED_TARGETS.get(name, "sm_90")))).cubin
            for name in sorted(shipped_kernels())}


@pytest.fixture
def private_cache(monkeypatch, tmp_path):
    """A build cache of this test's own (and no tuning cache), emptied in memory before and after."""
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "1")
    from asmgemm.runtime import build_cache
    build_cache.clear_memory_cache()
    yield
    build_cache.clear_memory_cache()


@pytest.fixture
def hgemm_own_path():
    """The Hopper HGEMM's own route for every call of the test: the path model's in-place choice
    (an operand TMA cannot read goes to the spec's `in_place` kernel, hgemm_mma, when the model
    says that beats the padded copy) is turned off, so odd operands take hgemm's padded copies,
    A_LDG and swap, which these tests cover. The in-place route has its own tests
    (test_mma_gemm_gpu.py). Kept launches are forgotten before and after: a launch planned
    without the fixture must not answer a call made with it."""
    from asmgemm.runtime import gemm, path_model
    with path_model.in_place_off():
        gemm.clear_plan_cache()
        yield
    gemm.clear_plan_cache()


@pytest.fixture
def recorded_builds(monkeypatch):
    """configure() without ptxas: the (kernel, -D values) of each build it asks for, in order, by
    the rules' path (launch_config) and the catalog's (dispatch). The stand-in build evaluates no
    guard, so every candidate builds."""
    from types import SimpleNamespace
    from asmgemm.runtime import dispatch, launch_config
    seen = []

    def build(spec, defines, target):
        seen.append((spec.name, defines))
        return SimpleNamespace(name=spec.name)
    monkeypatch.setattr(launch_config, "build_kernel", build)
    monkeypatch.setattr(dispatch, "build_kernel", build)
    return seen


@pytest.fixture
def fake_fp32_gemm(monkeypatch, private_cache):
    """(cupy stand-in, launches): asmgemm.gemm builds for real and its kernels compute in fp32 numpy
    from their packed arguments (fake_cupy.interpreting_kernel); each launch is recorded."""
    from fake_cupy import forget_loaded, interpreting_kernel, make_cupy
    launches = []
    cp = make_cupy(interpreting_kernel(launches, dtype=np.float32))
    monkeypatch.setitem(sys.modules, "cupy", cp)
    forget_loaded(monkeypatch)
    from asmgemm.runtime import gemm
    gemm.clear_plan_cache()
    yield cp, launches
    gemm.clear_plan_cache()


class InterfaceOnly:
    """A GPU array seen only through __cuda_array_interface__ (as numba's device arrays are): what
    asmgemm.gemm views as a CuPy array without a copy (tests/test_cuda_arrays.py, test_overlap.py)."""

    def __init__(self, x):
        self.x = x
        self.__cuda_array_interface__ = x.__cuda_array_interface__


def load_tool(name: str):
    """tools/NAME.py loaded as a module (the scripts there are no package), for CPU tests of their
    pure parts."""
    import importlib.util
    path = Path(__file__).parent.parent / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
