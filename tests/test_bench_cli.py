"""`asmgemm bench` on the command line: help, argument errors, and the no-GPU path; and the same for
tools/mma_bench.py (issue 31's benchmark), with its pure helpers."""
import subprocess
import sys

import pytest

from asmgemm.runtime.gpu import gpu_available

HAS_GPU = gpu_available()


def test_help_explains_options(run_cli):
    code, out, _ = run_cli("bench", "--help")
    assert code == 0
    for opt in ("--shapes", "--layouts", "--json", "--save-baseline", "--reps", "cuBLAS", "median", "--triton-mma",
                "DISABLE_MMA_V3=1", "--loop-calls", "random:SEED:COUNT[:ALIGN]", "linear"):
        assert opt in out
    # the three timings, each explained in the help
    for column in ("call  the headline", "gpu   device time", "loop  throughput", "--no-pre-roll turns it off"):
        assert column in out, column


@pytest.mark.parametrize("args, needle", [
    (["--shapes", "nonsense"], "neither a preset"),
    (["--shapes", "1x2"], "is not a shape"),
    (["--layouts", "nq"], "unknown layout"),
    (["dgemm_magic"], "'dgemm_magic' is not a GEMM kernel asmgemm can launch"),
    (["--save-baseline", "-D", "BK=16"], "leave out -D"),
    (["-D", "oops"], "expected NAME=VALUE"),
    (["--triton-mma", "--no-torch"], "leave out --no-torch"),
    (["--triton-mma", "--host-overhead"], "--host-overhead times no Triton"),
    (["hgemm", "--shapes", "attention"], "--shapes attention runs what asmgemm.gemm / grouped_gemm pick"),
])
def test_argument_errors_before_any_gpu_work(run_cli, args, needle):
    code, out, err = run_cli("bench", *args)
    assert code == 1
    assert needle in err
    assert "Traceback" not in err


def test_reps_must_be_positive(run_cli):
    code, _, err = run_cli("bench", "--reps", "0")
    assert code == 2 and "--reps" in err
    code, _, err = run_cli("bench", "--loop-calls", "-1")
    assert code == 2 and "--loop-calls" in err


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path")
def test_no_gpu_is_a_clear_error_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "asmgemm.cli", "bench", "--shapes", "small",
                           "--json", str(tmp_path / "out.json")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "needs a GPU" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.json").exists()


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path")
@pytest.mark.parametrize("preset", ["attention", "moe"])
def test_the_batched_sets_need_a_gpu_too(run_cli, preset):
    """issue 33's sets (asm/bench/batched.py) are bench presets: on this machine a clear no-GPU error."""
    code, out, err = run_cli("bench", "--shapes", preset)
    assert code == 1 and "needs a GPU" in err and "Traceback" not in err


def test_the_batched_sets_are_the_issues_grids():
    """The sizes issue 33 names, and skewed tokens that sum to the total with some experts empty."""
    from asmgemm.bench import batched
    att = batched.attention_cases()
    assert {(c.bh, c.s, c.d) for c in att} == {(bh, s, d) for bh in (32, 128, 512) for s in (128, 512, 2048, 4096)
                                               for d in (64, 128)}
    assert {(c.which, c.dtype) for c in att} == {(w, t) for w in ("qk", "pv") for t in ("float16", "bfloat16")}
    moe = batched.moe_cases()
    assert {(c.experts, c.k, c.n, c.total) for c in moe} == {
        (e, k, n, t) for e in (8, 64) for k, n in ((4096, 14336), (14336, 4096), (7168, 2048)) for t in (4096, 32768)}
    for c in moe:
        tokens = c.tokens
        assert sum(tokens) == c.total and len(tokens) == c.experts and 0 in tokens
        assert max(tokens) > 2 * c.total / c.experts                          # skewed
        assert tokens == batched.skewed_tokens(c.total, c.experts, c.seed)       # the same on every machine


# ---- tools/mma_bench.py without a GPU ------------------------------------------------------------
def _mma_bench():
    from conftest import load_tool
    return load_tool("mma_bench")


def test_mma_bench_explains_itself_and_stops_cleanly_without_a_gpu(monkeypatch, capsys):
    tool = _mma_bench()
    with pytest.raises(SystemExit) as e:
        tool.main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for word in ("--variant", "--params", "--odd-shapes", "--edge-pair", "DISABLE_MMA_V3=1", "torch.matmul", "4095^3"):
        assert word in out
    monkeypatch.setitem(sys.modules, "cupy", None)              # no CuPy: require_gpu's clear stop
    assert tool.main(["--parts", "c"]) == 1
    err = capsys.readouterr().err
    assert "needs a GPU" in err and "Traceback" not in err


@pytest.mark.parametrize("args, needle", [
    (["--parts", "d"], "choose from a, b and c"),
    (["--dtypes", "fp8"], "choose from fp16, bf16"),
    (["--variant", "s3"], "expected NAME:JSON"),
    (["--variant", 's3:{"STAGES": 3.5}'], "STAGES must be an integer"),
    (["--variant", "torch:"], "names a reference column"),
    (["--variant", "x:", "--variant", "x:{}"], "names must be distinct"),
    (["--params", "[1]"], "expected a JSON object"),
    (["--params", "{oops"], "not JSON"),
    (["--odd-shapes", "5x5x5:nx"], "unknown layout 'nx'"),
    (["--edge-pair", "4095x4095x4095"], "two different shapes"),
    (["--shapes", "1x2"], "is not a shape"),
    (["--calls", "0"], "--calls must be >= 1"),
])
def test_mma_bench_argument_errors_before_any_gpu_work(args, needle, capsys):
    with pytest.raises(SystemExit) as e:
        _mma_bench().main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and "Traceback" not in err


def test_mma_bench_parsers_and_verdicts():
    tool = _mma_bench()
    from asmgemm.bench.shapes import Shape
    assert tool.parse_variant('s3:{"STAGES": 3}') == ("s3", {"STAGES": 3})
    assert tool.parse_variant("base:") == ("base", {})
    # --params under every variant, a variant's own values over it; no --variant: one run, 'asm'
    assert tool.build_variants({"BK": 64}, []) == [("asm", {"BK": 64})]
    assert tool.build_variants({"BK": 64}, [("a", {}), ("b", {"BK": 32, "STAGES": 3})]) == [
        ("a", {"BK": 64}), ("b", {"BK": 32, "STAGES": 3})]
    assert tool.parse_layout_shapes("305x923x6, 524x455x55:NT", "--odd-shapes") == [
        (Shape(305, 923, 6), "nn"), (Shape(524, 455, 55), "nt")]
    assert [s.key for s, _ in tool.parse_layout_shapes(tool.SHAPES_A, "--shapes")] == list(tool.ANCHORS)
    assert tool.parse_parts("abc") == tool.parse_parts("c,a,b") == ["a", "b", "c"]
    assert tool.parse_dtypes("bf16,fp16,bf16") == ["bf16", "fp16"]
    assert tool.verdict(1.2, 1.15) == "met" and tool.verdict(1.1, 1.15) == "NOT met"
    assert tool.verdict(0.9, 1.0, at_least=False) == "met" and tool.verdict(1.01, 1.0, at_least=False) == "NOT met"
    assert tool.verdict(None, 1.15) == "-"
    assert tool.ran_text({"kernel": "hgemm", "copies": ["A", "B"], "params": None}) == "hgemm (copies A+B)"
    assert tool.text_table(["a", "bb"], [["xyz", "1"]]).splitlines() == ["a    bb", "---  --", "xyz   1"]
