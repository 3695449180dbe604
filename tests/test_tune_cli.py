"""`asmgemm tune` on the command line: --dry-run on the CPU, errors, and the no-GPU path."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from asmgemm.runtime.gpu import gpu_available
from asmgemm.toolchain import find_tool

HAS_GPU = gpu_available()
TUNE_SUM = str(Path(__file__).parent / "data" / "tune" / "tune_sum.sasm")
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")


def test_help(run_cli):
    code, out, _ = run_cli("tune", "--help")
    assert code == 0
    for opt in ("--shape", "--layout", "--dry-run", "--jobs", ".tune", "Ctrl-C"):
        assert opt in out


def test_shape_is_required(run_cli):
    code, _, err = run_cli("tune", "sgemm")
    assert code == 2 and "--shape" in err


@pytest.mark.parametrize("args, needle", [
    (["sgemm", "--shape", "1,2"], "is not a shape"),
    (["no_such_kernel", "--shape", "1,2,3", "--dry-run"], "no such file or shipped kernel"),
    ([TUNE_SUM, "--shape", "8,8,8", "--dry-run", "-D", "NOPE=1"], "NOPE"),
])
def test_errors(run_cli, args, needle):
    code, _, err = run_cli("tune", *args)
    assert code == 1 and needle in err and "Traceback" not in err


@pytest.mark.toolchain
@needs_ptxas
def test_kernel_without_tune_lines(run_cli, tmp_path):
    src = tmp_path / "plain.sasm"
    src.write_text(".visible .entry k()\n{\n    ret;\n}\n")
    code, _, err = run_cli("tune", str(src), "--shape", "8,8,8", "--dry-run")
    assert code == 1 and "declares no tunable parameters" in err


@pytest.mark.toolchain
@needs_ptxas
def test_dry_run_lists_candidates_with_verdicts(run_cli, monkeypatch, tmp_path):
    monkeypatch.setenv("COLUMNS", "160")
    cache = tmp_path / "tune.json"
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(cache))
    code, out, _ = run_cli("tune", TUNE_SUM, "--shape", "128,128,128", "--dry-run", "-j", "2")
    assert code == 0
    assert "THREADS=128 LIVE=96" in out and "spills" in out and "THREADS * LIVE must stay <= 20000" in out
    assert "candidates: 4, survivors: 2, pruned: 2" in out
    assert not cache.exists()


@pytest.mark.toolchain
@needs_ptxas
def test_dry_run_json_and_fixed_parameter(run_cli):
    code, out, _ = run_cli("tune", TUNE_SUM, "--shape", "64,64,64", "--dry-run", "--json", "-D", "THREADS=256")
    assert code == 0
    rep = json.loads(out)
    assert rep["candidates"] == 2 and rep["survivors"] == 1 and rep["pruned"] == {"error": 1}
    assert [b["params"] for b in rep["builds"]] == [{"LIVE": 4}, {"LIVE": 96}]
    ok = rep["builds"][0]["kernels"][0]
    assert ok["threads"] == 256 and ok["spills"] is False and ok["registers"] > 0


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path")
def test_no_gpu_is_a_clear_error_and_leaves_the_cache(tmp_path):
    cache = tmp_path / "tune.json"
    cache.write_text('{"format": 1, "entries": {}}\n')
    env = {**__import__("os").environ, "ASMGEMM_TUNE_CACHE": str(cache)}
    proc = subprocess.run([sys.executable, "-m", "asmgemm.cli", "tune", "sgemm", "--shape", "256,256,256"],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 1
    assert "needs a GPU" in proc.stderr and "--dry-run" in proc.stderr and "Traceback" not in proc.stderr
    assert cache.read_text() == '{"format": 1, "entries": {}}\n'


def test_a_file_kernel_cannot_be_timed(run_cli):
    code, _, err = run_cli("tune", TUNE_SUM, "--shape", "8,8,8")
    assert code == 1 and "has no kernel spec, so gemm() cannot run it on the GPU" in err


@pytest.mark.toolchain
@needs_ptxas
def test_dry_run_of_a_bfloat16_kernel(run_cli):
    """The call values need the element size of A's dtype: bfloat16 has none in numpy (an internal
    error once), so it comes from kernel_spec.DTYPE_ITEMSIZE."""
    code, out, err = run_cli("tune", "bgemm", "--shape", "256,256,256", "--dry-run", "-D", "BN=128", "-D", "STAGES=4",
                             "-D", "GROUP_M=8", "-D", "CLUSTER_M=1", "-D", "CLUSTER_N=1")
    assert code == 0, err
    assert "candidates: 2" in out and "internal error" not in err


def test_fit_reads_plain_and_gzipped_samples_and_names_a_bad_file(tmp_path, run_cli):
    """files.read_json, what `tune --fit` and the tools read sweeps with: .json and .json.gz alike;
    invalid JSON is located (file:line:col), a damaged gzip stream and a missing file are named."""
    import gzip
    from asmgemm.errors import AsmError
    from asmgemm.files import read_json
    doc = {"format": 1, "samples": []}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "a.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    assert read_json(tmp_path / "a.json") == read_json(tmp_path / "a.json.gz") == doc
    (tmp_path / "bad.json").write_text('{"format": 1,\n  "samples": [}')
    with pytest.raises(AsmError, match=r"bad\.json:2:15: error: not valid JSON"):
        read_json(tmp_path / "bad.json")
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b not gzip")
    with pytest.raises(AsmError, match=r"cannot read sweep samples .*bad\.json\.gz"):
        read_json(tmp_path / "bad.json.gz", "sweep samples")
    code, _, err = run_cli("tune", "sgemm", "--fit", str(tmp_path / "missing.json"))
    assert code != 0 and "missing.json" in err and "Traceback" not in err
