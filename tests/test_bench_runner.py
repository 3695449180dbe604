"""The bench/tune drivers' logic on the CPU: NumPy stands in for CuPy and a Python function for the
kernel, so correctness detection (poisoned outputs, wrong results, failing variants), interleaved
timing and the choice of the best candidate are tested without a GPU."""
import os
import time
import types

import numpy as np
import pytest

from asmgemm.bench import runner as runner_mod
from asmgemm.kernel_spec import get_spec
from asmgemm.tuning import trials as tuner_mod
from asmgemm.bench.shapes import Shape
from asmgemm.bench.timing import summarize
from asmgemm.tuning.space import Candidate
from asmgemm.errors import AsmError

SGEMM = get_spec("sgemm")


class _RandomState:
    def __init__(self, seed):
        self._rs = np.random.RandomState(seed)

    def uniform(self, low, high, size, dtype=np.float64):
        return self._rs.uniform(low, high, size).astype(dtype)


fake_cp = types.SimpleNamespace(
    float32=np.float32, float64=np.float64, dtype=np.dtype, empty=np.empty, isfinite=np.isfinite,
    matmul=np.matmul, linalg=np.linalg,
    random=types.SimpleNamespace(RandomState=_RandomState),
    cuda=types.SimpleNamespace(Device=lambda *a: types.SimpleNamespace(synchronize=lambda: None)),
)


class WallTimer:
    def mark(self):
        return time.perf_counter()

    def elapsed_ms(self, a, b):
        return max((b - a) * 1e3, 1e-6)

    def synchronize(self):
        pass


def runner_from(fn):
    return lambda kernel: fn


def correct(a, b, c, trans_a, trans_b, params):
    c[...] = (a.T if trans_a else a) @ (b.T if trans_b else b)


def leaves_last_element_unwritten(a, b, c, trans_a, trans_b, params):
    full = (a.T if trans_a else a) @ (b.T if trans_b else b)
    c.flat[:-1] = full.flat[:-1]     # the last element keeps whatever was there (the poison)


def slightly_wrong(a, b, c, trans_a, trans_b, params):
    correct(a, b, c, trans_a, trans_b, params)
    c *= 1.001


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
def test_bench_one_correct_kernel(monkeypatch, layout):
    monkeypatch.setattr(runner_mod, "make_runner", runner_from(correct))
    row = runner_mod.bench_one(fake_cp, SGEMM, Shape(33, 17, 9), layout, reps=3, warmup=1, params={"BK": 8},
                               params_source="-D", flush=None, timer=WallTimer())
    assert row.error is None and row.correct
    assert row.rel_err["asmgemm"] < 1e-6 and row.rel_err["cublas"] < 1e-6
    assert set(row.stats) == {"asmgemm", "cublas"} and row.stats["asmgemm"].reps == 3
    assert row.ratio() > 0
    j = row.to_json()
    assert j["m"] == 33 and j["correct"] and "asmgemm" in j["ratio_to_cublas"]


@pytest.mark.parametrize("fn, needle", [(slightly_wrong, "wrong result"), (leaves_last_element_unwritten, "relative error inf")])
def test_bench_one_wrong_kernel_is_reported_and_not_timed(monkeypatch, fn, needle):
    monkeypatch.setattr(runner_mod, "make_runner", runner_from(fn))
    row = runner_mod.bench_one(fake_cp, SGEMM, Shape(16, 16, 16), "nn", reps=2, warmup=0, params=None,
                               params_source="-D", flush=None, timer=WallTimer())
    assert not row.correct and needle in row.error
    assert "asmgemm" not in row.stats and "cublas" in row.stats and row.ratio() is None


def test_bench_one_kernel_error_is_reported(monkeypatch):
    def fails(*args):
        raise AsmError("this layout is not supported")
    monkeypatch.setattr(runner_mod, "make_runner", runner_from(fails))
    row = runner_mod.bench_one(fake_cp, SGEMM, Shape(8, 8, 8), "nn", reps=2, warmup=0, params=None,
                               params_source="defaults", flush=None, timer=WallTimer())
    assert row.error == "this layout is not supported" and not row.correct


def test_flush_runs_before_every_timed_call(monkeypatch):
    """Before each call and gpu measurement (2 implementations x 4 reps x 2 modes); never inside a loop."""
    monkeypatch.setattr(runner_mod, "make_runner", runner_from(correct))
    calls = []
    row = runner_mod.bench_one(fake_cp, SGEMM, Shape(8, 8, 8), "nn", reps=4, warmup=1, params=None,
                               params_source="defaults", flush=lambda: calls.append(1), timer=WallTimer(), loop_calls=5)
    assert len(calls) == 4 * 2 * 2
    assert set(row.call_stats) == set(row.stats) == set(row.loop_stats) == {"asmgemm", "cublas"}
    assert row.loop_stats["asmgemm"].reps == 3          # LOOP_REPS loops of 5 calls


def test_trials_are_the_survivors_plus_untuned_gemm():
    survivors = [Candidate(0, {"THREADS": 256, "BK": 8}, "ok"), Candidate(2, {"THREADS": 64, "BK": 8}, "ok")]
    trials = tuner_mod.trials_for(survivors)
    assert [(t.name, t.params, t.is_default) for t in trials] == [
        ("#0", {"THREADS": 256, "BK": 8}, False), ("#2", {"THREADS": 64, "BK": 8}, False), ("default", None, True)]


def test_tune_picks_the_fastest_correct_candidate(monkeypatch):
    seen_env = []

    def variant(a, b, c, trans_a, trans_b, params):
        v = "slow" if params is None else params["V"]      # untuned gemm() runs the slow variant here
        seen_env.append(os.environ.get("ASMGEMM_NO_TUNE_CACHE"))
        if v == "broken":
            raise RuntimeError("too many resources requested for launch")
        correct(a, b, c, trans_a, trans_b, params)
        if v == "wrong":
            c[0, 0] += 1.0
        time.sleep({"slow": 0.004, "fast": 0.0005, "wrong": 0.0}[v])

    monkeypatch.setattr(tuner_mod, "make_runner", runner_from(variant))
    trials = [tuner_mod.Trial("#0", {"V": "slow"}), tuner_mod.Trial("#1", {"V": "fast"}),
              tuner_mod.Trial("#2", {"V": "wrong"}), tuner_mod.Trial("#3", {"V": "broken"}),
              tuner_mod.Trial("default", None, is_default=True)]
    steps = []
    out = tuner_mod.tune_on_gpu(fake_cp, SGEMM, Shape(24, 24, 24), "nn", trials, reps=3, warmup=1, flush=None,
                                on_step=steps.append, timer=WallTimer())
    assert out.best.name == "#1" and out.default.name == "default"
    assert out.gain() > 1.0          # 4 ms vs 0.5 ms
    assert "wrong result" in trials[2].error and trials[2].stats is None
    assert "too many resources" in trials[3].error and trials[3].stats is None
    assert steps.count("timing") == 3 and {"#0", "#1", "#2", "#3", "default"} <= set(steps)
    assert set(seen_env) == {"1"}    # every call ran with tuning-cache lookups off


def test_best_is_never_the_untuned_reference():
    fast_default = tuner_mod.Trial("default", None, is_default=True, stats=summarize([1.0]))
    slow = tuner_mod.Trial("#0", {"V": 1}, stats=summarize([2.0]))
    assert tuner_mod.pick_best([fast_default, slow]) is slow


def call_defines(shape, layout):
    from asmgemm.runtime.launch import call_defines as defines_for
    from asmgemm.runtime.plan import call_values_for
    return {k: str(v) for k, v in defines_for(SGEMM, call_values_for(shape.m, shape.n, shape.k, layout, 4)).items()}


def test_call_defines_follow_the_runtime_planner():
    d = call_defines(Shape(4096, 4096, 4096), "nt")
    assert d["TRANS_A"] == "0" and d["TRANS_B"] == "1"
    # K = 33: rows of A are not a multiple of 4 floats, so no 128-bit loads of A
    assert call_defines(Shape(64, 64, 33), "nn")["VEC_A"] == "0"
    assert call_defines(Shape(64, 64, 32), "nn")["VEC_A"] == "1"


def test_a_failing_reference_is_a_note_not_a_kernel_failure(monkeypatch):
    monkeypatch.setattr(runner_mod, "make_runner", runner_from(correct))
    def cublas_fails(self, c):
        raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")
    # only cuBLAS breaks; the float64 reference (plain matmul) still works
    monkeypatch.setattr("asmgemm.bench.problem.GemmProblem.cublas", cublas_fails)
    row = runner_mod.bench_one(fake_cp, SGEMM, Shape(8, 8, 8), "nn", reps=2, warmup=0, params=None,
                               params_source="defaults", flush=None, timer=WallTimer())
    assert row.error is None and row.correct
    assert row.notes and "cublas did not run" in row.notes[0]
    assert "cublas" not in row.stats and row.ratio() is None


def test_summary_per_timing_mode_and_dtype():
    """Hand-made rows whose call, gpu and loop ratios differ: the geomean, the counts under 0.9
    and 0.7 and the slowest of each mode, over the faster of cupy.matmul and torch.matmul, and per
    operand dtype (hgemm_f32c's fp16 operands group with hgemm, not with its fp32 C)."""
    import math
    from asmgemm.bench.runner import BenchRow, summarize as summarize_rows, summarize_mode

    def row(kernel, dtype, m, layout, ms, a_dtype=None, err=1e-7):
        """ms: {mode: (asmgemm, cublas, torch)} in ms; torch None = not timed."""
        r = BenchRow(kernel, dtype, layout, Shape(m, m, m), 1e-3, rel_err={"asmgemm": err}, a_dtype=a_dtype)
        for mode, times in ms.items():
            for impl, t in zip(("asmgemm", "cublas", "torch"), times):
                if t is not None:
                    r.timings(mode)[impl] = summarize([t])
        return r
    rows = [
        # call ratio = best ref ms / asmgemm ms
        row("sgemm", "float32", 64, "nn", {"call": (2.0, 1.0, None), "gpu": (1.0, 1.0, None), "loop": (1.0, 1.2, None)}),
        row("sgemm", "float32", 128, "nt", {"call": (1.0, 0.8, 0.75), "gpu": (1.0, 1.0, 0.5), "loop": (1.0, 1.0, None)}),
        row("hgemm", "float16", 256, "tn", {"call": (1.0, 1.1, 2.0), "gpu": (1.0, 0.95, 3.0), "loop": (1.0, 0.6, None)}),
        row("hgemm_f32c", "float32", 512, "tt", {"call": (1.0, 0.65, None), "gpu": (1.0, 0.85, None)}, a_dtype="float16"),
        row("sgemm", "float32", 1024, "nn", {"call": (9.0, 1.0, None), "gpu": (9.0, 1.0, None)}, err=1.0),   # wrong
    ]
    call = summarize_mode(rows, "call")
    # ratios: 0.5, 0.75, 1.1, 0.65 (the wrong row left out)
    assert call["shapes"] == 4
    assert call["geomean_to_best_cublas"] == pytest.approx((0.5 * 0.75 * 1.1 * 0.65) ** 0.25, abs=1e-4)
    assert call["under"] == {"0.9": 3, "0.7": 2}
    assert call["slowest"] == {"kernel": "sgemm", "layout": "nn", "shape": "64x64x64", "ratio_to_best_cublas": 0.5}
    gpu = summarize_mode(rows, "gpu")           # 1.0, 0.5 (torch faster there), 0.95, 0.85
    assert gpu["under"] == {"0.9": 2, "0.7": 1} and gpu["slowest"]["shape"] == "128x128x128"
    assert gpu["geomean_to_best_cublas"] == pytest.approx(math.exp((math.log(0.5) + math.log(0.95) + math.log(0.85)) / 4),
                                                          abs=1e-4)
    loop = summarize_mode(rows, "loop")         # 1.2, 1.0, 0.6: rows without a loop are left out
    assert loop["shapes"] == 3 and loop["under"] == {"0.9": 1, "0.7": 1}
    assert loop["slowest"] == {"kernel": "hgemm", "layout": "tn", "shape": "256x256x256", "ratio_to_best_cublas": 0.6}
    s = summarize_rows(rows)
    assert s["modes"]["call"] == call and s["modes"]["gpu"] == gpu and s["modes"]["loop"] == loop
    assert set(s["by_dtype"]) == {"float32", "float16"}
    assert s["by_dtype"]["float16"]["call"]["shapes"] == 2 and s["by_dtype"]["float16"]["call"]["under"] == {"0.9": 1, "0.7": 1}
    assert s["by_dtype"]["float32"]["call"]["geomean_to_best_cublas"] == pytest.approx((0.5 * 0.75) ** 0.5, abs=1e-4)
    assert s["by_dtype"]["float16"]["loop"]["shapes"] == 1
    # one dtype: no grouping; no loop timed: the mode is None
    only = summarize_rows(rows[:2])
    assert "by_dtype" not in only and summarize_mode([rows[3]], "loop") is None
