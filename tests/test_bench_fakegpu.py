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
    assert rep["summary"]["shapes_under"] == 4 and "4 shapes: asmgemm over the faster" in stdout
    assert "call           geomean 0.500x over 4 shapes, 4 under 0.9x, 4 under 0.7x" in stdout
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


def test_bench_json_has_the_three_timings(fake_gpu, run_cli, monkeypatch):
    """call, gpu and loop per implementation in every row, their ratios, and the summary per mode.
    The fake clock makes all three 2 ms vs 1 ms here; timing.py's own tests tell them apart."""
    code, stdout, err = run_cli("bench", "sgemm", "--shapes", "small", "--reps", "2", "--loop-calls", "7", "--json")
    assert code == 0, err
    rep = json.loads(stdout)
    assert rep["loop_calls"] == 7 and rep["modes"] == ["call", "gpu", "loop"] and rep["headline"] == "call"
    for row in rep["rows"]:
        for mode in ("call", "gpu", "loop"):
            assert row[f"{mode}_ms"] == {"asmgemm": 2.0, "cublas": 1.0}, (mode, row)
            assert row["ratio_to_best_cublas_by_mode"][mode] == 0.5
            assert set(row["tflops_by_mode"][mode]) == {"asmgemm", "cublas"}
        assert row["timing_ms_by_mode"]["loop"]["asmgemm"]["reps"] == 2       # min(reps, 3) loops
        assert row["timing_ms"] == row["timing_ms_by_mode"]["gpu"]              # the old key: gpu time
        assert row["a_dtype"] == "float32"
    modes = rep["summary"]["modes"]
    assert set(modes) == {"call", "gpu", "loop"} and "by_dtype" not in rep["summary"]
    assert modes["call"] == {"shapes": 2, "geomean_to_best_cublas": 0.5, "under": {"0.9": 2, "0.7": 2},
                             "slowest": {"kernel": "sgemm", "layout": "nn", "shape": "128x128x128",
                                         "ratio_to_best_cublas": 0.5}}
    # --loop-calls 0: no loop column; --no-pre-roll still runs (the gpu column without pre-roll)
    code, stdout, err = run_cli("bench", "sgemm", "--shapes", "small", "--reps", "2", "--loop-calls", "0",
                                "--no-pre-roll", "--json")
    assert code == 0, err
    rep = json.loads(stdout)
    assert rep["pre_roll"] is False and all(r["loop_ms"] == {} and r["call_ms"] for r in rep["rows"])
    assert rep["summary"]["modes"]["loop"] is None and rep["summary"]["modes"]["gpu"]["shapes"] == 2
    code, stdout, err = run_cli("bench", "sgemm", "--shapes", "small", "--reps", "2", "--loop-calls", "0")
    assert code == 0 and "asm/cuBLAS" in stdout and "│ loop" not in stdout and "loop           -" in stdout


def test_bench_runs_random_shapes_in_their_own_layouts(fake_gpu, run_cli):
    """random:3:2 draws two small shapes, 351x434x2 nn and 3385x13x10 tt: each runs once, in its
    own layout, whatever --layouts says; the layouts in --layouts order, then the others'."""
    code, stdout, err = run_cli("bench", "sgemm", "--shapes", "random:3:2", "--layouts", "tt", "--reps", "2",
                                "--loop-calls", "2", "--json")
    assert code == 0, err
    rows = json.loads(stdout)["rows"]
    assert [(r["layout"], r["m"], r["n"], r["k"], r["label"]) for r in rows] == [
        ("tt", 3385, 13, 10, "random 2/2"), ("nn", 351, 434, 2, "random 1/2")]
    assert all(r["correct"] for r in rows)


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


# ---- Triton's mma.sync column (--triton-mma) and tools/mma_bench.py ------------------------------
def _matmul_any(a, b, out=None):
    """The fake cupy.matmul for every dtype: 1 ms (the float64 reference: none), fp16 computed in fp32."""
    if a.dtype != np.float64:
        spend(1.0)
    r = np.matmul(a.astype(np.float32), b.astype(np.float32)) if a.dtype == np.float16 else np.matmul(a, b)
    if out is None:
        return r.astype(a.dtype)
    out[...] = r
    return out


def _fake_torch():
    """torch as bench_one uses it on NumPy arrays: from_dlpack is the identity, matmul 1 ms."""
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(is_available=lambda: True)
    torch.backends = types.SimpleNamespace(cuda=types.SimpleNamespace(matmul=types.SimpleNamespace()),
                                           cudnn=types.SimpleNamespace())
    torch.set_float32_matmul_precision = lambda precision: None
    torch.from_dlpack = lambda x: x
    torch.matmul = _matmul_any
    return torch


def _kernel_ms(ms):
    def run(a, b, c, ta, tb, params):
        c[...] = np.matmul((a.T if ta else a).astype(np.float32), (b.T if tb else b).astype(np.float32))
        spend(ms)
    return run


def test_bench_triton_mma_column_is_left_out_without_triton(fake_gpu, run_cli):
    code, stdout, err = run_cli("bench", "sgemm", "--shapes", "128x128x128", "--reps", "2", "--triton-mma")
    assert code == 0, err
    assert "--triton-mma: column left out" in err and "Triton and torch" in err
    assert "triton-mma" not in stdout


def test_bench_triton_mma_column(fake_gpu, run_cli, monkeypatch, tmp_path):
    """With Triton and torch importable: the column, asm/triton-mma, the autotuned configuration in
    the table and the JSON; for fp32 operands a note instead (the mma.sync path is 16-bit)."""
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setattr(sys.modules["cupy"], "matmul", _matmul_any)
    from asmgemm.bench import triton_ref
    made = []

    def fake_mma(op_a, op_b, c):
        made.append(op_a.dtype)

        def run():
            c[...] = np.matmul(op_a.astype(np.float32), op_b.astype(np.float32))
            spend(1.6)
        return run, "128x128x32 GM8 w4 s4"
    monkeypatch.setattr(triton_ref, "make_triton_mma_matmul", fake_mma)
    fake_gpu(_kernel_ms(2.0))
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli("bench", "hgemm", "sgemm", "--shapes", "64x64x64", "--reps", "2", "--no-triton",
                                "--triton-mma", "--json", str(out))
    assert code == 0, err
    assert made == [np.float16]                        # not built for the fp32 kernel
    rows = {r["kernel"]: r for r in json.loads(out.read_text())["rows"]}
    h, s = rows["hgemm"], rows["sgemm"]
    assert set(h["tflops"]) == {"asmgemm", "cublas", "torch", "triton-mma"}
    assert h["ratio_to_triton_mma"] == 0.8 and h["ratio_to_cublas"]["triton-mma"] == 0.625   # 1.6 ms vs 2 ms, 1 ms
    assert h["ref_configs"] == {"triton-mma": "128x128x32 GM8 w4 s4"} and h["rel_err"]["triton-mma"] < 1e-3
    assert "triton-mma" not in s["tflops"] and s["ratio_to_triton_mma"] is None
    assert any("16-bit operands only" in n for n in s["notes"])
    assert "autotuned to: nn 64x64x64: 128x128x32 GM8 w4 s4" in stdout and "16-bit operands only" in stdout
    # with torch: the headline is the call-time ratio to the faster of cupy.matmul and torch.matmul
    assert "asm/best" in stdout and "asm/cuBLAS" in stdout
    summary = json.loads(out.read_text())["summary"]
    assert set(summary["by_dtype"]) == {"float16", "float32"}       # sgemm and hgemm: two populations
    assert summary["by_dtype"]["float16"]["call"]["shapes"] == 1 and "float16 call" in stdout


def test_bench_triton_mma_column_that_fails_is_a_note(fake_gpu, run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", _fake_torch())
    monkeypatch.setitem(sys.modules, "triton", types.ModuleType("triton"))
    monkeypatch.setattr(sys.modules["cupy"], "matmul", _matmul_any)
    from asmgemm.bench import triton_ref

    def not_mma(op_a, op_b, c):
        raise RuntimeError("Triton's kernel is not the mma.sync path: its PTX has wgmma instructions")
    monkeypatch.setattr(triton_ref, "make_triton_mma_matmul", not_mma)
    fake_gpu(_kernel_ms(2.0))
    code, stdout, err = run_cli("bench", "hgemm", "--shapes", "64x64x64", "--reps", "2", "--no-triton",
                                "--triton-mma", "--json")
    assert code == 0, err
    row = json.loads(stdout)["rows"][0]
    assert "triton-mma" not in row["tflops"] and row["correct"]
    assert row["notes"] == ["triton-mma not run: RuntimeError: Triton's kernel is not the mma.sync path: its PTX has "
                            "wgmma instructions"]


class _Tensor:
    """What make_triton_mma_matmul reads of a torch tensor: shape, element size, strides."""
    def __init__(self, rows, cols, size=2):
        self.shape, self._size, self.dtype = (rows, cols), size, f"float{8 * size}"

    def element_size(self):
        return self._size

    def stride(self, dim):
        return (self.shape[1], 1)[dim]


@pytest.fixture
def fake_triton(monkeypatch):
    """A stand-in Triton whose autotuned launch records DISABLE_MMA_V3 as the launch saw it and
    returns a compiled kernel with the PTX in `state['ptx']`."""
    import os
    from asmgemm.bench import triton_ref
    state = {"ptx": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "env": [], "grids": []}
    triton = types.ModuleType("triton")
    triton.language = types.ModuleType("triton.language")
    triton.jit = lambda fn: fn
    triton.cdiv = lambda a, b: -(-a // b)

    class Config:
        def __init__(self, kwargs, num_warps=4, num_stages=3):
            self.kwargs, self.num_warps, self.num_stages = kwargs, num_warps, num_stages

    class Autotuned:
        def __init__(self, configs, key, fn):
            self.configs, self.key, self.fn, self.best_config = configs, key, fn, None

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                state["env"].append(os.environ.get("DISABLE_MMA_V3"))
                self.best_config = self.configs[1]
                state["grids"].append(grid(self.best_config.kwargs))
                state["key"], state["kwargs"] = self.key, kwargs
                return types.SimpleNamespace(asm={"ptx": state["ptx"]})
            return launch
    triton.Config = Config
    triton.autotune = lambda configs, key: (lambda fn: Autotuned(configs, key, fn))
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.language", triton.language)
    monkeypatch.setattr(triton_ref, "_mma_kernel", None)
    return state


def test_triton_mma_reference_compiles_and_launches_with_mma_v3_off(fake_triton, monkeypatch):
    import os
    from asmgemm.bench import triton_ref
    monkeypatch.setenv("DISABLE_MMA_V3", "0")               # the caller's setting comes back afterwards
    run, config = triton_ref.make_triton_mma_matmul(_Tensor(300, 64), _Tensor(64, 500), _Tensor(300, 500))
    assert config == "256x128x64 GM8 w8 s3"                # MMA_CONFIGS[1], the fake autotuner's choice
    assert fake_triton["grids"] == [(2 * 4,)]                # ceil(300 / 256) * ceil(500 / 128) blocks
    assert fake_triton["key"] == ["M", "N", "K", "s_am", "s_ak", "s_bk", "s_bn"]
    assert fake_triton["kwargs"] == {"IEEE": False}
    run()
    assert fake_triton["env"] == ["1", "1"] and os.environ["DISABLE_MMA_V3"] == "0"
    monkeypatch.delenv("DISABLE_MMA_V3")
    run()
    assert fake_triton["env"][-1] == "1" and "DISABLE_MMA_V3" not in os.environ


def test_triton_mma_reference_refuses_a_kernel_that_is_not_mma_sync(fake_triton):
    from asmgemm.bench import triton_ref
    fake_triton["ptx"] = "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 ...; mma.sync.aligned"
    with pytest.raises(RuntimeError, match="wgmma instructions"):
        triton_ref.make_triton_mma_matmul(_Tensor(64, 64), _Tensor(64, 64), _Tensor(64, 64))
    fake_triton["ptx"] = "fma.rn.f32"
    with pytest.raises(RuntimeError, match="no mma.sync instruction"):
        triton_ref.make_triton_mma_matmul(_Tensor(64, 64), _Tensor(64, 64), _Tensor(64, 64))
    with pytest.raises(RuntimeError, match="16-bit operands"):
        triton_ref.make_triton_mma_matmul(_Tensor(64, 64, 4), _Tensor(64, 64, 4), _Tensor(64, 64, 4))
    assert len(triton_ref.MMA_CONFIGS) == 10 and all(
        64 <= min(bm, bn) and max(bm, bn) <= 256 and 3 <= stages <= 5 and warps in (4, 8)
        for bm, bn, bk, gm, warps, stages in triton_ref.MMA_CONFIGS)


def _mma_bench_tool():
    from conftest import load_tool
    return load_tool("mma_bench")


@pytest.fixture
def fake_mma_gemm(fake_gpu, monkeypatch):
    """asmgemm.gemm for tools/mma_bench.py on the fake GPU: C = op(A) op(B) in fp32, 0.5 ms (0.8 with
    params); last_launch() names hgemm_mma (or the kernel= given) and the params; `state['wrong']`
    makes the calls with STAGES in their params wrong."""
    cp = sys.modules["cupy"]
    monkeypatch.setattr(cp, "float16", np.float16, raising=False)
    monkeypatch.setattr(cp, "matmul", _matmul_any)
    from asmgemm.runtime import gemm as gemm_mod
    from asmgemm.runtime import launch_config
    state = {"last": None, "wrong": False}

    def gemm(a, b, c=None, *, trans_a=False, trans_b=False, params=None, kernel=None, **kw):
        r = np.matmul((a.T if trans_a else a).astype(np.float32), (b.T if trans_b else b).astype(np.float32))
        c = np.empty(r.shape, a.dtype) if c is None else c
        c[...] = -r if state["wrong"] and "STAGES" in (params or {}) else r
        spend(0.8 if params else 0.5)
        state["last"] = {"kernel": kernel or "hgemm_mma", "copies": (), "params": {"BM": 128, **(params or {})}}
        return c
    monkeypatch.setattr(gemm_mod, "gemm", gemm)
    monkeypatch.setattr(gemm_mod, "last_launch", lambda: state["last"])
    monkeypatch.setattr(gemm_mod, "clear_last_launch", lambda: state.update(last=None))
    monkeypatch.setattr(launch_config, "untuned_defines", lambda spec, m, n, k, layout, facts: {"BM": 64, "WN": 32})
    return state


def test_mma_bench_runs_every_part(fake_mma_gemm, tmp_path, capsys):
    tool = _mma_bench_tool()
    out = tmp_path / "mma.json"
    code = tool.main(["--shapes", "64x48x40", "--variant", "base:", "--variant", 's3:{"STAGES": 3}',
                      "--odd-shapes", "33x17x9,20x12x7:nt", "--edge-pair", "31x31x31,32x32x32",
                      "--reps", "2", "--warmup", "1", "--calls", "3", "--json", str(out)])
    stdout = capsys.readouterr().out
    assert code == 0, stdout
    rep = json.loads(out.read_text())
    (a,) = rep["a"]
    assert [v["name"] for v in a["variants"]] == ["base", "s3"] and set(a["tflops"]) == {"base", "s3", "cupy"}
    # base runs as gemm(kernel="hgemm_mma") does; s3's overrides lie over the untuned call's choice
    assert a["ran"]["base"]["params"] == {"BM": 128}
    assert a["ran"]["s3"]["params"] == {"BM": 64, "WN": 32, "STAGES": 3}
    assert a["variants"][0]["to_cublas"] == 2.0 and a["variants"][1]["to_cublas"] == 1.25     # 0.5, 0.8 vs 1 ms
    assert a["variants"][0]["goal"] == "-"            # no Triton here and no anchor for this shape
    assert "Triton's mma.sync column left out" in stdout
    assert [(r["shape"], r["layout"]) for r in rep["b"]] == [("33x17x9", "nn"), ("20x12x7", "nt")]
    assert all(r["ran"]["asm cupy"]["kernel"] == "hgemm_mma" and r["rel_err"]["asm cupy"] < 1e-3 for r in rep["b"])
    assert all(set(r["loop_us"]) == set(r["one_call_us"]) == {"asm cupy", "cupy.matmul"} for r in rep["b"])
    assert all(r["one_call_us"]["asm cupy"] == 500.0 for r in rep["b"])    # the fake clock: 0.5 ms a call
    c = rep["c"]
    assert c["ratio"] == pytest.approx((31 / 32) ** 3, abs=1e-3) and c["goal"] == "NOT met"
    assert set(c["ran"]) == {"31x31x31", "32x32x32"} and not c["failed"]
    for title in ("== summary on Fake GPU 80GB ==", "a) forced mma.sync kernel", "b) odd operands",
                  "c) default choice, TFLOP/s: 31x31x31 / 32x32x32 = 0.909"):
        assert title in stdout


def test_mma_bench_reports_a_wrong_variant_and_exits_3(fake_mma_gemm, capsys):
    fake_mma_gemm["wrong"] = True
    code = _mma_bench_tool().main(["--parts", "a", "--shapes", "64x48x40", "--variant", "base:",
                                   "--variant", 's3:{"STAGES": 3}', "--reps", "2", "--no-triton"])
    out, err = capsys.readouterr()
    assert code == 3 and "s3 WRONG: relative error" in out and "failed or were wrong: s3" in err
