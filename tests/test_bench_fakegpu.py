"""The GPU paths of `asmgemm bench` and `asmgemm tune`, end to end on the CPU: NumPy poses as CuPy
(events read the host clock) and a Python function as the kernel. This checks the commands'
wiring (tables, JSON, baselines, the tuning cache) where CI has no GPU; the real numbers come from
the GPU tests."""
import json
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from asmgemm.toolchain import find_tool

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")


# A virtual device clock (ms): fake kernels advance it by their cost, events read it, so timings
# are exact and independent of the host's load.
CLOCK = [0.0]


def spend(ms):
    CLOCK[0] += ms


class _Event:
    t = 0.0

    def record(self):
        self.t = CLOCK[0]


class _RandomState:
    def __init__(self, seed):
        self._rs = np.random.RandomState(seed)

    def uniform(self, low, high, size, dtype=float):
        return self._rs.uniform(low, high, size).astype(dtype)


class _Device:
    id = 0
    compute_capability = "90"
    attributes = {"L2CacheSize": 1 << 16, "MultiProcessorCount": 132}

    def __init__(self, *args):
        pass

    def synchronize(self):
        pass


def _fake_cupy():
    cp = types.ModuleType("cupy")
    cp.__version__ = "fake"
    cp.float32, cp.float64, cp.int32, cp.uint64, cp.dtype = np.float32, np.float64, np.int32, np.uint64, np.dtype
    cp.empty, cp.isfinite, cp.linalg = np.empty, np.isfinite, np.linalg

    def matmul(a, b, out=None):
        if a.dtype == np.float32:
            spend(1.0)               # "cuBLAS" takes 1 ms; the float64 reference is not timed
        return np.matmul(a, b, out=out)
    cp.matmul = matmul
    cp.random = types.SimpleNamespace(RandomState=_RandomState)
    cp.RawKernel = lambda src, name: (lambda grid, block, args: None)
    cp.cuda = types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceCount=lambda: 1,
                                      getDeviceProperties=lambda d: {"name": b"Fake GPU 80GB"}),
        Device=_Device, Event=_Event, get_elapsed_time=lambda a, b: b.t - a.t,
        get_current_stream=lambda: types.SimpleNamespace(synchronize=lambda: None),
        memory=types.SimpleNamespace(OutOfMemoryError=MemoryError))
    return cp


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """Fake CuPy; `set_kernel(fn)` chooses what gemm() does: fn(a, b, c, trans_a, trans_b, params)."""
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setitem(sys.modules, "torch", None)       # no torch reference here
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(tmp_path / "tune.json"))
    monkeypatch.delenv("ASMGEMM_NO_TUNE_CACHE", raising=False)
    from asmgemm.bench import runner
    from asmgemm.tuning import trials

    def set_kernel(fn):
        for mod in (runner, trials):
            monkeypatch.setattr(mod, "make_runner", lambda kernel: fn)
    set_kernel(lambda a, b, c, ta, tb, params: gemm_cost(a, b, c, ta, tb, 2.0))
    return set_kernel


def gemm_cost(a, b, c, ta, tb, ms):
    c[...] = (a.T if ta else a) @ (b.T if tb else b)
    spend(ms)


def test_bench_table_json_and_baselines(fake_gpu, run_cli, tmp_path):
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli("bench", "sgemm", "--shapes", "small", "--layouts", "nn,tn", "--reps", "3",
                                "--json", str(out), "--save-baseline", "--baseline-dir", str(tmp_path / "bl"))
    assert code == 0, err
    assert "asm/cuBLAS" in stdout and "129x65x33" in stdout and "0.50×" in stdout
    rep = json.loads(out.read_text())
    assert rep["gpu"] == "Fake GPU 80GB" and len(rep["rows"]) == 4
    assert all(r["correct"] and r["rel_err"]["asmgemm"] < 1e-6 for r in rep["rows"])
    assert all(r["ratio_to_cublas"]["asmgemm"] == 0.5 for r in rep["rows"])     # 2 ms vs 1 ms
    assert rep["summary"]["shapes"] == 4 and rep["summary"]["geomean_to_best_cublas"] == 0.5
    assert rep["summary"]["shapes_under"] == 4 and "4 shapes: geomean 0.500x" in stdout
    base = json.loads((tmp_path / "bl" / "Fake_GPU_80GB.json").read_text())
    assert set(base["entries"]) == {"sgemm/nn/128x128x128", "sgemm/nn/129x65x33", "sgemm/tn/128x128x128",
                                    "sgemm/tn/129x65x33"}
    # a baseline 100x better than anything measurable: --check-baseline must fail with old vs new
    for e in base["entries"].values():
        e["ratio"] = 100.0
    (tmp_path / "bl" / "Fake_GPU_80GB.json").write_text(json.dumps(base))
    code, stdout, _ = run_cli("bench", "sgemm", "--shapes", "128x128x128", "--reps", "2", "--check-baseline",
                              "--baseline-dir", str(tmp_path / "bl"))
    assert code == 3 and "regressed" in stdout and "100.000 (baseline)" in stdout


def test_bench_wrong_kernel_exits_2(fake_gpu, run_cli):
    fake_gpu(lambda a, b, c, ta, tb, params: c.fill(1.0))
    code, stdout, _ = run_cli("bench", "sgemm", "--shapes", "small", "--reps", "2")
    assert code == 2 and "wrong result" in stdout


@pytest.fixture
def tune_sum(tmp_path):
    """Let the tuner time tests/data/tune/tune_sum.sasm (its space: THREADS x LIVE, 2 survivors),
    registered through a kernel spec (the fake GPU stands in for its launches)."""
    from asmgemm import kernel_spec
    source = Path(__file__).parent / "data" / "tune" / "tune_sum.sasm"
    spec_file = tmp_path / "specs.toml"
    spec_file.write_text(f"""[tune_sum]
source = "{source}"
dtypes = {{ a = "float32", b = "float32", acc = "float32", c = "float32" }}
targets = ["sm_90"]
abi = ["A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta"]
rel_err_limit = 1e-4
launch = {{ threads = "THREADS", tile_m = "THREADS", tile_n = "THREADS", smem_bytes = "THREADS" }}
""")
    kernel_spec.register(kernel_spec.load_spec_file(spec_file))
    yield str(source)
    kernel_spec.unregister("tune_sum")


@pytest.mark.toolchain
@needs_ptxas
def test_tune_stores_the_best_and_gemm_finds_it(fake_gpu, tune_sum, run_cli):
    fake_gpu(lambda a, b, c, ta, tb, params: gemm_cost(a, b, c, ta, tb, 1.0 if params and params["THREADS"] == 256 else 3.0))
    code, out, err = run_cli("tune", tune_sum, "--shape", "300,200,100", "--reps", "3", "-j", "2", "--json")
    assert code == 0, err
    rep = json.loads(out)
    assert rep["candidates"] == 4 and rep["survivors"] == 2 and rep["pruned"] == {"spills": 1, "error": 1}
    assert rep["stored"] and rep["best"]["params"] == {"THREADS": 256, "LIVE": 4}
    assert rep["gain_over_default"] == pytest.approx(2.0)      # 3 ms untuned vs 1 ms
    from asmgemm.runtime.tune_cache import lookup_tuned
    assert lookup_tuned("Fake GPU 80GB", "tune_sum", "nn", 300, 200, 100) == {"THREADS": 256, "LIVE": 4}
    assert lookup_tuned("Fake GPU 80GB", "tune_sum", "nt", 300, 200, 100) is None
    assert lookup_tuned("Fake GPU 80GB", "sgemm", "nn", 300, 200, 100) is None


@pytest.mark.toolchain
@needs_ptxas
def test_tune_human_report(fake_gpu, tune_sum, run_cli):
    fake_gpu(lambda a, b, c, ta, tb, params: gemm_cost(a, b, c, ta, tb, 1.0 if params and params["THREADS"] == 256 else 3.0))
    code, out, err = run_cli("tune", tune_sum, "--shape", "300,200,100", "--reps", "3", "-j", "1")
    assert code == 0, err
    assert "pruned candidates" in out and "THREADS * LIVE must stay <= 20000" in out
    assert "best: #2 THREADS=256 LIVE=4" in out and "gain of the best over it: +200.0%" in out
    assert "saved to the tuning cache" in out and "512x256x128" in out


@pytest.mark.toolchain
@needs_ptxas
def test_tune_never_stores_a_choice_slower_than_untuned(fake_gpu, tune_sum, run_cli, tmp_path):
    fake_gpu(lambda a, b, c, ta, tb, params: gemm_cost(a, b, c, ta, tb, 1.0 if params is None else 3.0))
    code, out, err = run_cli("tune", tune_sum, "--shape", "300,200,100", "--reps", "3", "-j", "2")
    assert code == 0, err
    assert "tuning cache not changed: untuned gemm() was faster" in out
    assert not (tmp_path / "tune.json").exists()


@pytest.mark.toolchain
@needs_ptxas
def test_tune_interrupted_while_timing_leaves_the_cache(fake_gpu, tune_sum, run_cli, tmp_path):
    (tmp_path / "tune.json").write_text('{"format": 1, "entries": {}}\n')

    def interrupted(*args):
        raise KeyboardInterrupt
    fake_gpu(interrupted)
    code, _, err = run_cli("tune", tune_sum, "--shape", "64,64,64", "--reps", "2", "-j", "1")
    assert code == 130 and "the tuning cache was not changed" in err
    assert (tmp_path / "tune.json").read_text() == '{"format": 1, "entries": {}}\n'


def test_ratio_to_the_faster_cublas_and_the_summary():
    """torch.matmul and cupy.matmul both call cuBLAS, with different heuristics: the ratio that
    counts is to the faster of them; the summary takes its geomean and slowest over correct rows."""
    from asmgemm.bench.runner import BenchRow, summarize
    from asmgemm.bench.shapes import Shape
    from asmgemm.bench.timing import TimingStats

    def row(m, asm_ms, cublas_ms, torch_ms=None, err=1e-7):
        r = BenchRow("hgemm", "float16", "nn", Shape(m, m, m), 1e-3, rel_err={"asmgemm": err})
        for impl, ms in (("asmgemm", asm_ms), ("cublas", cublas_ms), ("torch", torch_ms)):
            if ms is not None:
                r.stats[impl] = TimingStats(ms, ms, ms, ms, 1)
        return r
    rows = [row(64, 1.0, 1.0, 0.8), row(128, 1.0, 2.0), row(256, 1.0, 1.0, 1.25), row(512, 9.0, 1.0, err=1.0)]
    assert rows[0].ratio() == 1.0 and rows[0].ratio_to_best() == pytest.approx(0.8)
    assert rows[1].ratio_to_best() == 2.0 and rows[2].ratio_to_best() == 1.0
    s = summarize(rows)                            # the wrong row (rel err 1.0) is left out
    assert s["shapes"] == 3 and s["shapes_under"] == 1
    assert s["geomean_to_best_cublas"] == pytest.approx((0.8 * 2.0 * 1.0) ** (1 / 3), abs=1e-4)
    assert s["geomean_to_cublas"] == pytest.approx(2.0 ** (1 / 3), abs=1e-4)
    assert s["slowest"] == {"kernel": "hgemm", "layout": "nn", "shape": "64x64x64", "ratio_to_best_cublas": 0.8}
    assert summarize([rows[3]]) is None
