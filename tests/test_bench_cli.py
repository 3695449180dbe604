"""`asmgemm bench` on the command line: help, argument errors, and the no-GPU path."""
import subprocess
import sys

import pytest

from asmgemm.runtime.gpu import gpu_available

HAS_GPU = gpu_available()


def test_help_explains_options(run_cli):
    code, out, _ = run_cli("bench", "--help")
    assert code == 0
    for opt in ("--shapes", "--layouts", "--json", "--save-baseline", "--reps", "cuBLAS", "median"):
        assert opt in out


@pytest.mark.parametrize("args, needle", [
    (["--shapes", "nonsense"], "neither a preset"),
    (["--shapes", "1x2"], "is not a shape"),
    (["--layouts", "nq"], "unknown layout"),
    (["dgemm_magic"], "'dgemm_magic' is not a GEMM kernel asmgemm can launch"),
    (["--save-baseline", "-D", "BK=16"], "leave out -D"),
    (["-D", "oops"], "expected NAME=VALUE"),
])
def test_argument_errors_before_any_gpu_work(run_cli, args, needle):
    code, out, err = run_cli("bench", *args)
    assert code == 1
    assert needle in err
    assert "Traceback" not in err


def test_reps_must_be_positive(run_cli):
    code, _, err = run_cli("bench", "--reps", "0")
    assert code == 2 and "--reps" in err


@pytest.mark.skipif(HAS_GPU, reason="checks the no-GPU path")
def test_no_gpu_is_a_clear_error_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "asmgemm.cli", "bench", "--shapes", "small",
                           "--json", str(tmp_path / "out.json")], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "needs a GPU" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out.json").exists()
