"""Fixtures shared by the test modules: the GPU gate and the in-process CLI runner."""
import pytest

from asmgemm.runtime.gpu import require_gpu
from asmgemm.errors import AsmError


@pytest.fixture(scope="session")
def cuda_gpu():
    """The cupy module when CuPy is installed and a CUDA device answers; otherwise the test that
    asks for it is skipped with the reason (so `-m gpu` on a CPU machine reports skips, not errors)."""
    try:
        return require_gpu("this test")
    except AsmError as exc:
        pytest.skip(exc.message)


@pytest.fixture
def run_cli(capsys):
    """Run `asmgemm ARGS...` in this process; returns (exit code, stdout, stderr)."""
    from asmgemm.cli import main

    def run(*args) -> tuple[int, str, str]:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code or 0
        out, err = capsys.readouterr()
        return code, out, err

    return run
