"""`asmgemm bench --plot FILE`: the picture of a benchmark (TFLOP/s per shape, one line per
implementation the report has, the GPU's peak as a dashed line), drawn from a live run or redrawn
from a stored --json result without a GPU. The drawing tests skip without matplotlib; the
missing-matplotlib error is tested everywhere."""
from __future__ import annotations

import json
import sys

import pytest

ROWS = [
    {"kernel": "sgemm", "dtype": "float32", "layout": "nn", "m": 1024, "n": 1024, "k": 1024, "label": "",
     "tflops": {"asmgemm": 31.9, "cublas": 33.3, "torch": 33.1, "triton": 25.0}},
    {"kernel": "sgemm", "dtype": "float32", "layout": "nn", "m": 4096, "n": 4096, "k": 4096, "label": "",
     "tflops": {"asmgemm": 51.5, "cublas": 51.5, "torch": 51.2, "triton": 40.2}},
    {"kernel": "hgemm", "dtype": "float16", "layout": "nn", "m": 4096, "n": 4096, "k": 4096, "label": "",
     "tflops": {"asmgemm": 600.0, "cublas": 700.0}},
]


@pytest.fixture
def result(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "rows": ROWS}))
    return path


def test_svg_has_every_column_and_the_peaks(result, tmp_path, run_cli, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setitem(sys.modules, "cupy", None)               # redrawing needs no GPU
    out = tmp_path / "bench.svg"
    code, _, err = run_cli("bench", "--plot", out, "--from", result)
    assert code == 0, err
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    for text in ("asmgemm", "cuBLAS", "torch", "Triton", "FP32 peak 66.9", "float16 tensor peak 989.4",
                 "sgemm (float32, nn)", "hgemm (float16, nn)", "TFLOP/s"):
        assert text in svg, text


def test_png_from_a_live_run(tmp_path, run_cli):
    """The fake GPU of test_bench_fakegpu: the table, the JSON and the picture of one run."""
    pytest.importorskip("matplotlib")
    from test_bench_fakegpu import _fake_cupy, gemm_cost
    from asmgemm.bench import runner
    mp = pytest.MonkeyPatch()
    try:
        mp.setitem(sys.modules, "cupy", _fake_cupy())
        mp.setitem(sys.modules, "torch", None)
        mp.setenv("ASMGEMM_NO_TUNE_CACHE", "1")
        mp.setattr(runner, "make_runner", lambda spec: lambda a, b, c, ta, tb, params: gemm_cost(a, b, c, ta, tb, 2.0))
        code, stdout, err = run_cli("bench", "sgemm", "--shapes", "small", "--reps", "2", "--json", tmp_path / "r.json",
                                    "--plot", tmp_path / "r.png")
    finally:
        mp.undo()
    assert code == 0, err
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["peak_tflops"] is None and len(report["rows"]) == 2      # 'Fake GPU 80GB': no known peak
    # the stored result redraws
    code, _, err = run_cli("bench", "--plot", tmp_path / "again.svg", "--from", tmp_path / "r.json")
    assert code == 0, err
    assert "129×65×33" in (tmp_path / "again.svg").read_text()


def test_peaks_by_gpu_name():
    from asmgemm.bench.plot import peak_tflops
    assert peak_tflops("NVIDIA H100 80GB HBM3") == {"float32": 66.9, "float16": 989.4, "bfloat16": 989.4}
    assert peak_tflops("NVIDIA H100 PCIe")["float32"] == 51.2
    assert peak_tflops("NVIDIA H200")["float16"] == 989.4
    assert peak_tflops("NVIDIA A100-SXM4-80GB")["float32"] == 19.5
    assert peak_tflops("Fake GPU") is None


def test_missing_matplotlib_is_one_clear_error(result, tmp_path, run_cli, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    for args in (["--from", result], ["sgemm", "--shapes", "small"]):   # a live run stops before the GPU
        monkeypatch.setitem(sys.modules, "cupy", None)
        code, out, err = run_cli("bench", "--plot", tmp_path / "x.png", *args)
        assert code == 1 and "--plot needs matplotlib" in err and "asmgemm[plot]" in err, err
        assert "Traceback" not in err and "needs a GPU" not in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("args, message", [
    (["--from", "{result}"], "give --plot"),
    (["--plot", "{tmp}/x.jpg", "--from", "{result}"], "must end in .png, .svg, .pdf"),
    (["--plot", "{tmp}/x.png", "--from", "{tmp}/missing.json"], "cannot read the benchmark result"),
    (["--plot", "{tmp}/x.png", "--from", "{tmp}/bad.json"], "bad.json:1:2: error: invalid JSON"),
    (["--plot", "{tmp}/x.png", "--from", "{tmp}/rows.json"], "rows[0] is not a benchmark row"),
    (["--plot", "{tmp}/x.png", "--from", "{tmp}/other.json"], "not a benchmark result"),
])
def test_bad_redraws_are_clear_errors(result, tmp_path, run_cli, args, message):
    (tmp_path / "bad.json").write_text("{oops")
    (tmp_path / "rows.json").write_text(json.dumps({"rows": [{"m": 1}]}))
    (tmp_path / "other.json").write_text(json.dumps({"entries": {}}))
    code, _, err = run_cli("bench", *(a.format(result=result, tmp=tmp_path) for a in args))
    assert code in (1, 2) and message in err and "Traceback" not in err, err
    assert not (tmp_path / "x.png").exists()
