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
    monkeypatch.setattr(runner_mod, "make_runner", runner_from(correct))
    calls = []
    runner_mod.bench_one(fake_cp, SGEMM, Shape(8, 8, 8), "nn", reps=4, warmup=1, params=None,
                         params_source="defaults", flush=lambda: calls.append(1), timer=WallTimer())
    assert len(calls) == 4 * 2


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
