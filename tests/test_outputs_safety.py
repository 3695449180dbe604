"""Nothing lost through an output: `-o` never replaces an input (by any spelling or link), a device
or FIFO destination is written in place (never replaced by a regular file), a folder is an error,
the outputs of one command are committed together or not at all, outputs get the mode a plain
open() gives, and `run`'s sizes are bounded (the one bound of bench and tune) before the GPU."""
from __future__ import annotations

import os
import stat
import sys
import threading
from pathlib import Path

import pytest

from asmgemm import files
from asmgemm.errors import AsmError
from asmgemm.toolchain import find_tool

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")

KERNEL = """.visible .entry k(.param .u64 p)
{
    .regs .u64 ptr
    .regs .f32 x
    ld.param.u64 ptr, [p];
    ld.global.f32 x, [ptr];
    st.global.f32 [ptr+4], x;
    ret;
}
"""


@pytest.fixture
def src(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "k.sasm"
    p.write_text(KERNEL)
    return p


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith((".tmp", ".bak")))


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


# ---- 1. -o onto the input, a device, a FIFO, a folder ---------------------------------------------
@pytest.mark.parametrize("spelling", ["k.sasm", "./k.sasm", "ABS", "sub/../k.sasm", "link.ptx", "hard.ptx"])
def test_build_refuses_an_output_that_is_the_input(src, tmp_path, run_cli, spelling):
    (tmp_path / "sub").mkdir()
    (tmp_path / "link.ptx").symlink_to("k.sasm")
    os.link(src, tmp_path / "hard.ptx")
    out = str(src) if spelling == "ABS" else spelling
    code, _, err = run_cli("build", "k.sasm", "-o", out)
    assert code == 1 and "is the input" in err and "Traceback" not in err, err
    assert src.read_text() == KERNEL
    assert (tmp_path / "link.ptx").is_symlink()
    assert leftovers(tmp_path) == []


@needs_ptxas
@pytest.mark.toolchain
def test_build_refuses_a_cubin_onto_the_input_or_onto_the_ptx(src, tmp_path, run_cli):
    code, _, err = run_cli("build", "k.sasm", "-o", "out.ptx", "--cubin", "./k.sasm")
    assert code == 1 and "is the input" in err
    assert src.read_text() == KERNEL and not (tmp_path / "out.ptx").exists()
    code, _, err = run_cli("build", "k.sasm", "-o", "out.ptx", "--cubin", "out.ptx")
    assert code == 1 and "two outputs" in err and not (tmp_path / "out.ptx").exists()
    (tmp_path / "alias.cubin").symlink_to("out.ptx")
    (tmp_path / "out.ptx").write_text("old\n")
    code, _, err = run_cli("build", "k.sasm", "-o", "out.ptx", "--cubin", "alias.cubin")
    assert code == 1 and "are the same file" in err and (tmp_path / "out.ptx").read_text() == "old\n"
    assert leftovers(tmp_path) == []


def test_build_refuses_an_output_onto_an_include(tmp_path, run_cli, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "body.inc").write_text("    ret;\n")
    (tmp_path / "k.sasm").write_text('.visible .entry k()\n{\n.include "body.inc"\n}\n')
    code, _, err = run_cli("build", "k.sasm", "-I", "inc", "-o", "inc/body.inc")
    assert code == 1 and "is the input" in err
    assert (tmp_path / "inc" / "body.inc").read_text() == "    ret;\n"


@pytest.fixture
def dev_null_guard():
    """Should the code under test ever replace /dev/null by a regular file again (as root it can),
    put the device back, so a regression fails this test instead of breaking the machine."""
    st = os.stat("/dev/null")
    yield
    if not stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.geteuid() == 0:
        os.unlink("/dev/null")
        os.mknod("/dev/null", 0o666 | stat.S_IFCHR, st.st_rdev)
        os.chmod("/dev/null", 0o666)


@pytest.mark.skipif(not (os.path.exists("/dev/null") and stat.S_ISCHR(os.stat("/dev/null").st_mode)),
                    reason="no /dev/null character device")
@needs_ptxas
@pytest.mark.toolchain
def test_output_onto_dev_null_writes_into_the_device(src, run_cli, dev_null_guard):
    before = os.stat("/dev/null")
    code, _, err = run_cli("build", "k.sasm", "-o", "/dev/null", "--cubin", "/dev/null")
    assert code == 0, err
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)
    assert stat.S_IMODE(after.st_mode) == stat.S_IMODE(before.st_mode)
    files.write_atomic("/dev/null", "x")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_output_onto_a_fifo_is_written_in_place(src, tmp_path, run_cli):
    fifo = tmp_path / "pipe.ptx"
    os.mkfifo(fifo)
    got = []

    def reader():
        with open(fifo, "rb") as fh:
            got.append(fh.read())
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    try:
        code, _, err = run_cli("build", "k.sasm", "-o", str(fifo))
    finally:
        t.join(timeout=30)
        if t.is_alive():             # nothing opened it for writing: let the reader go
            with open(fifo, "wb"):
                pass
            t.join(timeout=5)
    assert code == 0, err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert got and b".visible .entry k" in got[0]
    assert leftovers(tmp_path) == []


def test_output_onto_a_folder_is_an_error(src, tmp_path, run_cli):
    (tmp_path / "outdir").mkdir()
    (tmp_path / "outdir" / "keep").write_text("x")
    code, _, err = run_cli("build", "k.sasm", "-o", "outdir")
    assert code == 1 and "is a folder" in err and "Traceback" not in err
    assert (tmp_path / "outdir").is_dir() and (tmp_path / "outdir" / "keep").read_text() == "x"


def test_a_symlinked_output_updates_the_file_it_points_to(src, tmp_path, run_cli):
    (tmp_path / "real.ptx").write_text("old\n")
    (tmp_path / "link.ptx").symlink_to("real.ptx")
    code, _, err = run_cli("build", "k.sasm", "-o", "link.ptx")
    assert code == 0, err
    assert (tmp_path / "link.ptx").is_symlink() and ".entry k" in (tmp_path / "real.ptx").read_text()


# ---- 2. all outputs of one command, or none -----------------------------------------------------
@needs_ptxas
@pytest.mark.toolchain
@pytest.mark.parametrize("existing", [True, False])
def test_a_failed_build_writes_no_output(src, tmp_path, run_cli, existing):
    if existing:
        (tmp_path / "out.ptx").write_text("old\n")
    code, _, err = run_cli("build", "k.sasm", "-o", "out.ptx", "--cubin", "missing/dir/out.cubin")
    assert code == 1 and "does not exist" in err and "Traceback" not in err
    if existing:
        assert (tmp_path / "out.ptx").read_text() == "old\n"
    else:
        assert not (tmp_path / "out.ptx").exists()
    assert leftovers(tmp_path) == []


def test_write_files_checks_every_destination_before_writing(tmp_path):
    (tmp_path / "a").write_text("old a\n")
    with pytest.raises(AsmError, match="does not exist"):
        files.write_files([(tmp_path / "a", "new a"), (tmp_path / "b", "new b"), (tmp_path / "no" / "c", "c")])
    assert (tmp_path / "a").read_text() == "old a\n" and not (tmp_path / "b").exists()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("failure", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_write_files_undoes_renames_when_a_later_one_fails(tmp_path, monkeypatch, failure):
    (tmp_path / "a").write_text("old a\n")
    (tmp_path / "c").write_text("old c\n")
    real_replace = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 3:           # a, b renamed; c fails
            raise failure
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(AsmError if isinstance(failure, OSError) else KeyboardInterrupt):
        files.write_files([(tmp_path / "a", "new a"), (tmp_path / "b", "new b"), (tmp_path / "c", "new c")])
    monkeypatch.undo()
    assert (tmp_path / "a").read_text() == "old a\n" and (tmp_path / "c").read_text() == "old c\n"
    assert not (tmp_path / "b").exists()
    assert leftovers(tmp_path) == []


def test_bench_json_and_baseline_are_written_together(tmp_path, run_cli, monkeypatch):
    """bench --json OUT --save-baseline: a baseline that cannot be written leaves no JSON either
    (and the table is still shown); a --json OUT that cannot be written fails before the run."""
    from test_bench_fakegpu import _fake_cupy, gemm_cost
    from asmgemm.bench import runner
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setenv("ASMGEMM_NO_TUNE_CACHE", "1")
    ran = []

    def kernel(a, b, c, ta, tb, params):
        ran.append(1)
        gemm_cost(a, b, c, ta, tb, 2.0)
    monkeypatch.setattr(runner, "make_runner", lambda spec: kernel)
    (tmp_path / "file").write_text("not a folder\n")
    code, out, err = run_cli("bench", "sgemm", "--shapes", "64x64x64", "--reps", "1", "--json", tmp_path / "o.json",
                             "--save-baseline", "--baseline-dir", tmp_path / "file" / "bl")
    assert code == 1 and "baseline folder" in err and "Traceback" not in err
    assert ran and "64x64x64" in out and not (tmp_path / "o.json").exists()
    ran.clear()
    code, _, err = run_cli("bench", "sgemm", "--shapes", "64x64x64", "--reps", "1",
                           "--json", tmp_path / "no" / "o.json")
    assert code == 1 and "does not exist" in err and not ran


# ---- 5. modes: what a plain open() gives ----------------------------------------------------------
def test_a_new_output_gets_0666_less_the_umask_and_an_old_one_keeps_its_mode(src, tmp_path, run_cli, umask022):
    code, _, err = run_cli("build", "k.sasm", "-o", "new.ptx")
    assert code == 0, err
    assert stat.S_IMODE(os.stat(tmp_path / "new.ptx").st_mode) == 0o644
    (tmp_path / "old.ptx").write_text("old\n")
    os.chmod(tmp_path / "old.ptx", 0o640)
    code, _, err = run_cli("build", "k.sasm", "-o", "old.ptx")
    assert code == 0, err
    assert stat.S_IMODE(os.stat(tmp_path / "old.ptx").st_mode) == 0o640
    assert ".entry k" in (tmp_path / "old.ptx").read_text()
    os.umask(0o077)
    files.write_atomic(tmp_path / "private", "x")
    assert stat.S_IMODE(os.stat(tmp_path / "private").st_mode) == 0o600


@needs_ptxas
@pytest.mark.toolchain
def test_the_kernel_and_tuning_caches_get_the_same_modes(tmp_path, monkeypatch, umask022):
    from asmgemm.kernel_spec import get_spec
    from asmgemm.runtime import build_cache, tune_cache
    from asmgemm.tuning import store
    monkeypatch.setenv("ASMGEMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("ASMGEMM_TUNE_CACHE", str(tmp_path / "cache" / "tune.json"))
    build_cache.clear_memory_cache()
    try:
        built = build_cache.build_kernel(get_spec("sgemm"),
                                         {"THREADS": 64, "BK": 8, "TRANS_A": 0, "TRANS_B": 0, "VEC_A": 0, "VEC_B": 1},
                                         "sm_90")
    finally:
        build_cache.clear_memory_cache()
    for p in (tmp_path / "cache" / "kernels").iterdir():
        assert stat.S_IMODE(p.stat().st_mode) == 0o644, p
    assert Path(built.cubin_path).parent == tmp_path / "cache" / "kernels"
    entry = store.make_entry("sgemm", "float32", None, {"BK": 8}, (64, 64, 64))
    path, _ = store.store_tuned("GPU", "nn", (64, 64, 64), entry)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    os.chmod(path, 0o640)
    store.store_tuned("GPU", "nt", (64, 64, 64), entry)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    tune_cache.forget(path)


# ---- 6. one bound on M, N, K for run, bench and tune, before the GPU ------------------------------
class _NoCupy:
    """A meta-path finder that fails the test if anything imports CuPy."""

    def find_spec(self, name, path=None, target=None):
        if name == "cupy" or name.startswith("cupy."):
            raise AssertionError("cupy was imported")
        return None


def test_run_bounds_m_n_k_before_touching_the_gpu(run_cli, monkeypatch):
    from asmgemm.bench.shapes import MAX_DIM
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_NoCupy(), *sys.meta_path])
    for flag in ("--m", "--n", "--k"):
        dims = {"--m": "8", "--n": "8", "--k": "8", flag: "99999999999"}
        code, _, err = run_cli("run", "sgemm", *[x for kv in dims.items() for x in kv])
        assert code == 2, err
        assert str(MAX_DIM) in err and flag in err and "Traceback" not in err
    # within the per-dimension bound but a matrix too large: an error before the GPU too
    code, _, err = run_cli("run", "sgemm", "--m", str(MAX_DIM), "--n", str(MAX_DIM), "--k", "8")
    assert code == 1 and "elements" in err and "Traceback" not in err


def test_bench_and_tune_use_the_same_bound(run_cli):
    from asmgemm.bench.shapes import MAX_DIM
    from asmgemm.commands import run
    opts = {p.name: p for p in run.command.params}
    assert all(opts[d].type.max == MAX_DIM for d in "mnk")
    too_big = MAX_DIM + 1
    code, _, err = run_cli("bench", "sgemm", "--shapes", f"{too_big}x8x8")
    assert code == 1 and f"1..{MAX_DIM}" in err
    code, _, err = run_cli("tune", "sgemm", "--shape", f"8,{too_big},8", "--dry-run")
    assert code == 1 and f"1..{MAX_DIM}" in err
