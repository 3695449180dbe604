"""`asmgemm bench` on a real GPU (marked gpu; skipped without one): small shapes, JSON, baselines."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("cuda_gpu")]


def asmgemm(*args, env=None):
    return subprocess.run([sys.executable, "-m", "asmgemm.cli", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def test_bench_small_shapes_all_layouts_json(tmp_path):
    out = tmp_path / "bench.json"
    proc = asmgemm("bench", "sgemm", "--shapes", "small", "--layouts", "all", "--reps", "3", "--json", out)
    assert proc.returncode == 0, proc.stderr
    rep = json.loads(out.read_text())
    assert len(rep["rows"]) == 2 * 4
    for row in rep["rows"]:
        assert row["correct"] and row["rel_err"]["asmgemm"] < 1e-4
        assert row["rel_err"]["cublas"] < 1e-4
        assert row["tflops"]["asmgemm"] > 0 and row["tflops"]["cublas"] > 0
        assert row["timing_ms"]["asmgemm"]["min_ms"] <= row["timing_ms"]["asmgemm"]["median_ms"]
    assert "asm/cuBLAS" in proc.stdout


def test_save_then_check_baseline(tmp_path):
    proc = asmgemm("bench", "sgemm", "--shapes", "128x128x128", "--reps", "3", "--save-baseline", "--baseline-dir",
                   tmp_path)
    assert proc.returncode == 0, proc.stderr
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1
    data = json.loads(files[0].read_text())
    assert list(data["entries"]) == ["sgemm/nn/128x128x128"] and data["entries"]["sgemm/nn/128x128x128"]["ratio"] > 0
    # an impossible baseline (ratio 1000x) must be reported as a regression, exit 3
    data["entries"]["sgemm/nn/128x128x128"]["ratio"] = 1000.0
    files[0].write_text(json.dumps(data))
    proc = asmgemm("bench", "sgemm", "--shapes", "128x128x128", "--reps", "3", "--check-baseline", "--baseline-dir",
                   tmp_path)
    assert proc.returncode == 3, proc.stderr
    assert "1000.000" in proc.stdout and "regressed" in proc.stdout


@pytest.mark.parametrize("kernel", ["hgemm_f32c", "bgemm_f32c"])
def test_bench_of_a_kernel_with_fp32_c_times_cublas_gemm_ex(tmp_path, kernel):
    """16-bit A and B with an fp32 C: cuBLAS is timed through cublasGemmEx with the same types (its
    result checked against the float64 reference like asmgemm's, in every layout, so a wrong
    transpose or leading dimension in that call fails), torch is not run (no such matmul)."""
    out = tmp_path / "bench.json"
    proc = asmgemm("bench", kernel, "--shapes", "192x320x136,8x4096x512", "--layouts", "all", "--reps", "3",
                   "--json", out)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 * 4
    for row in rows:
        assert row["dtype"] == "float32" and row["correct"], row
        assert row["rel_err"]["cublas"] < 5e-4, row
        assert "torch" not in row["tflops"] and row["tflops"]["cublas"] > 0
        assert any("cublasGemmEx" in note for note in row["notes"])
