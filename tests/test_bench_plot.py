"""`asmgemm bench --plot FILE`: the picture of a benchmark (left: asmgemm's call-time ratio to the
faster cuBLAS path per shape against its FLOPs, the slowest labelled; right: TFLOP/s with the GPU's
peak per dtype), drawn from a live run or redrawn from a stored --json result without a GPU. The
drawing tests skip without matplotlib; the missing-matplotlib error is tested everywhere."""
from __future__ import annotations

import json
import sys

import pytest

# a report of before the call-time measurement: gpu-time tflops only
ROWS = [
    {"kernel": "sgemm", "dtype": "float32", "layout": "nn", "m": 1024, "n": 1024, "k": 1024, "label": "",
     "tflops": {"asmgemm": 31.9, "cublas": 33.3, "torch": 33.1, "triton": 25.0}},
    {"kernel": "sgemm", "dtype": "float32", "layout": "nn", "m": 4096, "n": 4096, "k": 4096, "label": "",
     "tflops": {"asmgemm": 51.5, "cublas": 51.5, "torch": 51.2, "triton": 40.2}},
    {"kernel": "hgemm", "dtype": "float16", "layout": "nn", "m": 4096, "n": 4096, "k": 4096, "label": "",
     "tflops": {"asmgemm": 600.0, "cublas": 700.0}},
]


def _recorded_row(kernel, dtype, layout, m, n, k, call_ratio, cublas_tflops=40.0):
    """A row as `asmgemm bench --json` writes it since the three timings (the keys the plot reads)."""
    cublas_ms = 2 * m * n * k / (cublas_tflops * 1e12) * 1e3
    return {"kernel": kernel, "dtype": dtype, "a_dtype": dtype, "layout": layout, "m": m, "n": n, "k": k,
            "label": "", "correct": True, "tflops": {"asmgemm": 1.0, "cublas": 1.0},    # gpu time: not drawn
            "call_ms": {"asmgemm": cublas_ms / call_ratio, "cublas": cublas_ms, "torch": cublas_ms * 1.1},
            "ratio_to_best_cublas_by_mode": {"call": call_ratio, "gpu": 1.0, "loop": None}}


# eight shapes: the five slowest (ratios 0.41..0.85) are labelled, the other three are not
RECORDED = [
    _recorded_row("sgemm", "float32", "nn", 4096, 4096, 4096, 1.02),
    _recorded_row("sgemm", "float32", "tn", 127, 129, 1000, 0.41, 5.0),
    _recorded_row("sgemm", "float32", "nt", 1, 6144, 4096, 0.77, 1.0),
    _recorded_row("sgemm", "float32", "tt", 3000, 5000, 700, 0.95),
    _recorded_row("hgemm", "float16", "nt", 8, 28672, 4096, 0.62, 30.0),
    _recorded_row("hgemm", "float16", "nn", 8192, 8192, 8192, 0.97, 700.0),
    _recorded_row("hgemm", "float16", "tn", 512, 4096, 11008, 0.85, 500.0),
    _recorded_row("hgemm", "float16", "tt", 129, 65, 33, 0.70, 0.01),
    {**_recorded_row("hgemm", "float16", "nn", 5, 5, 5, 0.01), "correct": False},    # a wrong kernel: not drawn
]


@pytest.fixture
def result(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "rows": ROWS}))
    return path


@pytest.fixture
def recorded(tmp_path):
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps({"gpu": "NVIDIA H100 80GB HBM3", "rows": RECORDED, "loop_calls": 200}))
    return path


def test_two_panels_from_a_recorded_report(recorded, tmp_path, run_cli, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setitem(sys.modules, "cupy", None)               # redrawing needs no GPU
    out = tmp_path / "bench.svg"
    code, _, err = run_cli("bench", "--plot", out, "--from", recorded)
    assert code == 0, err
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert 'width="864pt" height="360pt"' in svg                 # 12 x 5 inches
    for text in ("ratio to the faster cuBLAS path, call time", "FLOPs (2·M·N·K)", "TFLOP/s",
                 "FP32 peak 66.9", "float16 tensor peak 989.4", "float32", "float16", "nn", "nt", "tn", "tt",
                 "asmgemm filled, cuBLAS hollow", "sgemm, hgemm on NVIDIA H100 80GB HBM3, 8 shapes"):
        assert text in svg, text
    for slow in ("127x129x1000 tn", "8x28672x4096 nt", "129x65x33 tt", "1x6144x4096 nt", "512x4096x11008 tn"):
        assert slow in svg, slow
    for fine in ("4096x4096x4096 nn", "3000x5000x700 tt", "8192x8192x8192 nn", "5x5x5 nn"):
        assert fine not in svg, fine


def test_a_report_without_call_times_is_drawn_from_its_gpu_times(result, tmp_path, run_cli, monkeypatch):
    pytest.importorskip("matplotlib")
    monkeypatch.setitem(sys.modules, "cupy", None)
    out = tmp_path / "old.svg"
    code, _, err = run_cli("bench", "--plot", out, "--from", result)
    assert code == 0, err
    svg = out.read_text()
    assert "gpu time (a report without call times)" in svg and "1024x1024x1024 nn" in svg
    assert "FP32 peak 66.9" in svg and "float16 tensor peak 989.4" in svg


def test_plot_points_follow_the_call_time_ratio():
    """What the panels draw of a row: flops, asmgemm's and the best reference's call-time TFLOP/s."""
    from asmgemm.bench.plot import _point
    p = _point(RECORDED[1])
    assert p["flops"] == 2 * 127 * 129 * 1000 and p["ratio"] == pytest.approx(0.41) and p["call"]
    assert p["best"] == pytest.approx(5.0) and p["dtype"] == "float32" and p["name"] == "127x129x1000 tn"
    old = _point(ROWS[0])                      # gpu-time tflops, the faster of cupy and torch
    assert old["ratio"] == pytest.approx(31.9 / 33.3) and not old["call"]
    assert _point(RECORDED[-1]) is None and _point({**ROWS[2], "tflops": {"asmgemm": 1.0}}) is None


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
        code, stdout, err = run_cli("bench", "sgemm", "--shapes", "small", "--reps", "2", "--loop-calls", "3",
                                    "--json", tmp_path / "r.json", "--plot", tmp_path / "r.png")
    finally:
        mp.undo()
    assert code == 0, err
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["peak_tflops"] is None and len(report["rows"]) == 2      # 'Fake GPU 80GB': no known peak
    # the stored result redraws
    code, _, err = run_cli("bench", "--plot", tmp_path / "again.svg", "--from", tmp_path / "r.json")
    assert code == 0, err
    svg = (tmp_path / "again.svg").read_text()
    assert "129x65x33 nn" in svg and "call time" in svg and "without call times" not in svg


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
