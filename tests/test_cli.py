"""The `asmgemm` command line as a user meets it: real processes, exit codes, files left behind.

Every user error must print FILE:LINE:COL, the source line and a caret, exit non-zero, print no
traceback, and leave no output file.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from asmgemm.toolchain import find_tool

HAS_PTXAS = find_tool("ptxas", required=False) is not None
needs_ptxas = pytest.mark.skipif(not HAS_PTXAS, reason="needs ptxas")

KERNEL = """\
.const BK ?= 8 ;  // a parameter
.visible .entry k(.param .u64 p)
{
    .regs .f32 x, y, z
    .regs .u64 ptr
    ld.param.u64 ptr, [p];
    ld.global.f32 x, [ptr+{4*BK}];
    ld.global.f32 y, [ptr+4];
    ld.global.f32 z, [ptr+8];
    fma.rn.f32 z, x, y, z;
    st.global.f32 [ptr], z;
    ret;
}
"""


def asmgemm(*args, cwd=None, stdin=None):
    env = dict(os.environ)
    env.pop("ASMGEMM_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "asmgemm.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env=env, input=stdin)


def assert_user_error(proc, where: str, message: str):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    assert "internal error" not in proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith(where), proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "^" in proc.stderr, "no caret under the source line"


@pytest.fixture
def src(tmp_path):
    p = tmp_path / "k.sasm"
    p.write_text(KERNEL)
    return p


def test_help_explains_every_command():
    proc = asmgemm("--help")
    assert proc.returncode == 0
    for name in ("build", "regs", "check", "kernels"):
        assert name in proc.stdout
    for name in ("build", "regs", "check"):
        sub = asmgemm(name, "--help")
        assert sub.returncode == 0 and "--json" in sub.stdout or name == "build" and "-D" in sub.stdout


def test_build_writes_ptx_and_applies_defines(src, tmp_path):
    out = tmp_path / "k.ptx"
    proc = asmgemm("build", src, "-o", out, "-D", "BK=16")
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert ".target sm_90\n" in text and "+64]" in text          # 4*BK with BK=16
    assert "fma.rn.f32" in text


def test_build_to_stdout_and_json(src, tmp_path):
    proc = asmgemm("build", src, "-o", "-")
    assert proc.returncode == 0 and proc.stdout.startswith("//")
    proc = asmgemm("build", src, "-o", tmp_path / "x.ptx", "--json")
    info = json.loads(proc.stdout)
    assert info["kernels"] == ["k"] and info["target"] == "sm_90" and info["parameters"] == {"BK": 8}


def test_shipped_kernel_builds_by_name(tmp_path):
    proc = asmgemm("build", "sgemm_naive", "-o", "n.ptx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ".entry sgemm_naive" in (tmp_path / "n.ptx").read_text()


def test_kernels_lists_shipped_kernels():
    proc = asmgemm("kernels", "--json")
    assert proc.returncode == 0
    names = [k["name"] for k in json.loads(proc.stdout)]
    assert "sgemm_naive" in names


MACRO_R = ".macro R()\nR()\n.endm\n"


@pytest.mark.parametrize("prefix, body, where, message", [
    ("", "mov.b32 %r1, {UNDEF};", "3:15", "undefined name 'UNDEF'"),
    ("", "mov.b32 %r1, {1 // 0};", "3:15", "division by zero"),
    ("", "ld.global.f32 %f1, [%rd1", "4:1", "'[' is still open"),
    ("", ".for i in range(10**9)\nret;\n.endfor", "3:", "would run"),
    (MACRO_R, "R()", "", "nested deeper"),
])
def test_user_errors_point_at_the_source(tmp_path, prefix, body, where, message):
    p = tmp_path / "bad.sasm"
    p.write_text(prefix + ".entry k()\n{\n" + body + "\n}\n")
    out = tmp_path / "bad.ptx"
    proc = asmgemm("build", p, "-o", out)
    assert_user_error(proc, f"{p}:{where}", message)
    assert not out.exists(), "a failed build left an output file"
    assert not list(tmp_path.glob(".bad.ptx.*")), "a temporary file was left behind"


def test_unterminated_block_names_the_opener(tmp_path):
    p = tmp_path / "u.sasm"
    p.write_text(".entry k()\n{\n.for i in range(4)\n  ret;\n}\n")
    proc = asmgemm("build", p, "-o", tmp_path / "u.ptx")
    assert_user_error(proc, f"{p}:", ".for")
    assert "endfor" in proc.stderr


def test_include_not_found_and_cycle(tmp_path):
    p = tmp_path / "a.sasm"
    p.write_text('\n.include "missing.inc"\n')
    assert_user_error(asmgemm("build", p, "-o", "-"), f"{p}:2:1:", "include file not found")
    (tmp_path / "x.inc").write_text('.include "y.inc"\n')
    (tmp_path / "y.inc").write_text('.include "x.inc"\n')
    p.write_text('.include "x.inc"\n')
    proc = asmgemm("build", p, "-o", "-")
    assert proc.returncode != 0 and "include cycle" in proc.stderr and "Traceback" not in proc.stderr


def test_undecodable_bytes(tmp_path):
    p = tmp_path / "b.sasm"
    p.write_bytes(b".entry k()\n{\n  \xff\xfe ret;\n}\n")
    assert_user_error(asmgemm("build", p, "-o", tmp_path / "b.ptx"), f"{p}:3:3:", "UTF-8")
    assert not (tmp_path / "b.ptx").exists()


def test_bad_command_line(src, tmp_path):
    for args, message in [
        (("-D", "NOPE=1"), "no overridable constant named 'NOPE'"),
        (("-D", "BK"), "expected NAME=VALUE"),
        (("-D", "BK=x"), "-D values are numbers"),
        (("--target", "sm_99"), "sm_99"),
    ]:
        proc = asmgemm("build", src, "-o", tmp_path / "o.ptx", *args)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert not (tmp_path / "o.ptx").exists()
    proc = asmgemm("build", tmp_path / "nope.sasm")
    assert proc.returncode != 0 and "no such file or shipped kernel" in proc.stderr


def test_output_folder_missing(src, tmp_path):
    proc = asmgemm("build", src, "-o", tmp_path / "no" / "such" / "k.ptx")
    assert proc.returncode != 0 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_regs_reports_plan_and_conflicts(tmp_path):
    p = tmp_path / "c.sasm"
    p.write_text(KERNEL.replace(".regs .f32 x, y, z", ".regs .f32 x : bank(0)\n.regs .f32 y : bank(0)\n"
                                                      ".regs .f32 z : bank(0)"))
    proc = asmgemm("regs", p, "--json")
    assert proc.returncode == 0, proc.stderr
    fn = json.loads(proc.stdout)["functions"][0]
    banks = {r["name"]: r["bank"] for r in fn["regs"]}
    assert banks["x"] == banks["y"] == banks["z"] == 0
    assert len(fn["conflicts"]) == 1
    assert fn["conflicts"][0]["location"].endswith(":12:5")
    # the instruction as written: the plan renames the build's instructions in place afterwards
    assert fn["conflicts"][0]["text"] == "fma.rn.f32 z, x, y, z;"
    # Without constraints the planner separates the FMA's sources, so nothing conflicts.
    q = tmp_path / "free.sasm"
    q.write_text(KERNEL)
    fn = json.loads(asmgemm("regs", q, "--json").stdout)["functions"][0]
    assert fn["conflicts"] == [] and fn["three_source_instructions"] == 1


def test_regs_impossible_constraint_is_an_error(tmp_path):
    p = tmp_path / "v.sasm"
    p.write_text(".entry k(.param .u64 p)\n{\n    .regs .f32 a<0-3> : vec4, banks(0, 0, 0, 0)\n"
                 "    .regs .u64 q\n    ld.param.u64 q, [p];\n    ld.global.v4.f32 {a<0-3>}, [q];\n"
                 "    st.global.v4.f32 [q], {a<0-3>};\n    ret;\n}\n")
    assert_user_error(asmgemm("regs", p), f"{p}:3:", "bank")


@needs_ptxas
def test_check_reports_ptxas_figures(src):
    proc = asmgemm("check", src, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    kernels = data["kernels"] if isinstance(data, dict) else data
    k = kernels[0]
    assert k["name"] == "k" and k["registers"] > 0 and k["spill_stores"] == 0


@needs_ptxas
def test_check_no_spills_fails_on_spills(tmp_path):
    # 200 live floats under .maxnreg 32 must spill.
    lines = [".visible .entry spill(.param .u64 p)", ".maxnreg 32", "{", "    .regs .u64 q",
             "    .regs .f32 v<0-199>", "    ld.param.u64 q, [p];"]
    lines += [f"    ld.volatile.global.f32 v{i}, [q+{4*i}];" for i in range(200)]
    lines += [f"    st.volatile.global.f32 [q+{4*i}], v{i};" for i in range(200)]
    lines += ["    ret;", "}"]
    p = tmp_path / "s.sasm"
    p.write_text("\n".join(lines) + "\n")
    assert asmgemm("check", p).returncode == 0
    proc = asmgemm("check", p, "--no-spills")
    assert proc.returncode != 0 and "spill" in (proc.stderr + proc.stdout).lower()


@needs_ptxas
def test_ptxas_error_maps_back_to_the_sasm_line(tmp_path):
    p = tmp_path / "e.sasm"
    p.write_text(".visible .entry k()\n{\n    .reg .b32 %r<3>;\n    mov.b32 %r1, 1;\n"
                 "    add.f32 %r2, %r1, %r9;\n    ret;\n}\n")
    proc = asmgemm("build", p, "-o", tmp_path / "e.ptx", "--cubin", tmp_path / "e.cubin")
    assert_user_error(proc, f"{p}:5:5:", "ptxas")
    assert not (tmp_path / "e.ptx").exists() and not (tmp_path / "e.cubin").exists()


def test_missing_ptxas_names_the_extra(src, tmp_path):
    env_missing = tmp_path / "nothing-here"
    proc = subprocess.run([sys.executable, "-m", "asmgemm.cli", "check", str(src)], capture_output=True, text=True,
                          env={**os.environ, "ASMGEMM_PTXAS": str(env_missing)})
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "ASMGEMM_PTXAS" in proc.stderr


def test_sm90a_instructions_pick_sm90a(tmp_path):
    p = tmp_path / "w.sasm"
    p.write_text(".visible .entry k()\n{\n    wgmma.fence.sync.aligned;\n    ret;\n}\n")
    proc = asmgemm("build", p, "-o", "-")
    assert proc.returncode == 0 and ".target sm_90a" in proc.stdout
    proc = asmgemm("build", p, "-o", "-", "--target", "sm_90")
    assert_user_error(proc, f"{p}:3:5:", "sm_90a")


@pytest.mark.parametrize("args", [("kernels",), ("regs", "sgemm_naive"),
                                  pytest.param(("check", "sgemm_naive"), marks=needs_ptxas)])
def test_human_reports_render(args):
    proc = asmgemm(*args)
    assert proc.returncode == 0, proc.stderr
    assert "sgemm_naive" in proc.stdout and "internal error" not in proc.stderr


def _console_script() -> str | None:
    """The installed `asmgemm` executable of this environment (pip's console-script wrapper)."""
    import shutil
    beside = Path(sys.executable).with_name("asmgemm")
    return str(beside) if beside.is_file() else shutil.which("asmgemm")


@pytest.mark.skipif(_console_script() is None, reason="asmgemm is not installed in this environment")
def test_installed_console_script_builds_a_kernel(tmp_path):
    """The entry point users run: a plain import of asmgemm.cli:main in a fresh interpreter (not
    `python -m`, which loads importlib.util and runpy first and so hid a missing import once)."""
    exe = _console_script()
    out = tmp_path / "naive.ptx"
    proc = subprocess.run([exe, "build", "sgemm_naive", "-o", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ".entry sgemm_naive" in out.read_text()
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and all(c in proc.stdout for c in ("build", "regs", "sass", "sched", "bench", "tune"))
