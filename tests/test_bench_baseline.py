"""Baseline files and the regression rule, with synthetic ratios (no GPU)."""
import json

import pytest

from asmgemm.bench import baseline as bl
from asmgemm.errors import AsmError

GPU = "NVIDIA H100 80GB HBM3"


def entry(ratio, key_shape=(4096, 4096, 4096), **kw):
    m, n, k = key_shape
    return bl.new_entry("sgemm", "nn", m, n, k, ratio, tflops=50 * ratio, cublas_tflops=50.0, **kw)


def test_file_name_per_gpu_model():
    assert bl.baseline_file_name(GPU) == "NVIDIA_H100_80GB_HBM3.json"
    assert bl.baseline_file_name("NVIDIA H200") == "NVIDIA_H200.json"
    assert bl.baseline_file_name("  /../x  ") == "x.json"
    assert bl.baseline_file_name("/") == "unknown_gpu.json"


def test_save_load_roundtrip_and_merge(tmp_path):
    k1 = bl.entry_key("sgemm", "nn", 4096, 4096, 4096)
    k2 = bl.entry_key("sgemm", "nn", 1024, 1024, 1024)
    path = bl.save_baseline(tmp_path, GPU, {k1: entry(0.95), k2: entry(0.80, (1024, 1024, 1024))})
    assert path.name == "NVIDIA_H100_80GB_HBM3.json"
    # a later partial run replaces its own keys and keeps the rest
    bl.save_baseline(tmp_path, GPU, {k1: entry(0.99)})
    data = bl.load_baseline(path)
    assert data["gpu"] == GPU
    assert data["entries"][k1]["ratio"] == 0.99 and data["entries"][k2]["ratio"] == 0.80
    assert not list(tmp_path.glob(".*"))  # no temporary file left


def test_save_refuses_another_gpus_file(tmp_path):
    path = tmp_path / bl.baseline_file_name(GPU)
    path.write_text(json.dumps({"format": 1, "gpu": "Other", "entries": {}}))
    with pytest.raises(AsmError):
        bl.save_baseline(tmp_path, GPU, {"k": entry(1.0)})


def baseline(**ratios):
    return {"format": 1, "gpu": GPU, "tolerance": 0.05, "entries": {k: entry(r) for k, r in ratios.items()}}


def test_compare_flags_drop_beyond_tolerance_only():
    base = baseline(a=1.00, b=1.00, c=1.00, d=0.80)
    comps = {c.key: c for c in bl.compare(base, {"a": 0.96, "b": 0.94, "c": 1.10, "e": 0.5})}
    assert comps["a"].status == "ok"          # -4 % is inside 5 %
    assert comps["b"].status == "regressed"   # -6 %
    assert comps["c"].status == "improved"
    assert comps["d"].status == "missing"
    assert comps["e"].status == "new"
    assert comps["b"].change == pytest.approx(-0.06)


def test_tolerance_precedence():
    base = baseline(a=1.0)
    assert bl.compare(base, {"a": 0.90}, tolerance=0.2)[0].status == "ok"
    assert bl.compare(base, {"a": 0.97}, tolerance=0.01)[0].status == "regressed"
    base["entries"]["a"]["tolerance"] = 0.5
    assert bl.compare(base, {"a": 0.6}, tolerance=0.01)[0].status == "ok"
    with pytest.raises(AsmError):
        bl.compare(base, {}, tolerance=1.5)


def test_regression_message_shows_old_and_new():
    comps = bl.compare(baseline(**{"sgemm/nn/4096x4096x4096": 0.98}), {"sgemm/nn/4096x4096x4096": 0.85})
    text = bl.regressions_report(comps)
    assert "sgemm/nn/4096x4096x4096" in text and "0.980" in text and "0.850" in text and "-13.3%" in text
    assert bl.regressions_report(bl.compare(baseline(a=1.0), {"a": 1.0})) == ""


@pytest.mark.parametrize("content", ["{", "[]", '{"format": 1}', '{"format": 1, "entries": {"a": {"ratio": -1}}}',
                                     '{"format": 2, "entries": {}}'])
def test_load_rejects_bad_files(tmp_path, content):
    p = tmp_path / "b.json"
    p.write_text(content)
    with pytest.raises(AsmError):
        bl.load_baseline(p)


def test_load_missing_file_hints_at_save(tmp_path):
    with pytest.raises(AsmError) as e:
        bl.load_baseline(tmp_path / "none.json")
    assert "--save-baseline" in (e.value.hint or "")
