"""`asmgemm sass` and `asmgemm regs --sass` from the command line: output, JSON, and clean errors."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from asmgemm import toolchain
from asmgemm.toolchain import find_tool, run_ptxas

DATA = Path(__file__).parent / "data" / "sass"

pytestmark = [
    pytest.mark.toolchain,
    pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                       reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')"),
]


def cubin_for(ptx_path: Path, arch: str, tmp_path: Path) -> Path:
    text = ptx_path.read_text().replace(".target sm_90", f".target {arch}")
    code, log, cubin = run_ptxas(text, arch)
    assert code == 0, log
    out = tmp_path / f"{ptx_path.stem}.{arch}.cubin"
    out.write_bytes(cubin)
    return out


def test_listing_shows_control_codes_banks_and_summary(run_cli):
    code, out, err = run_cli("sass", str(DATA / "sgemm_loop.ptx"))
    assert code == 0, err
    assert "[B-1----:R-:W-:-:S01]" in out or "[B-1----" in out       # an FFMA waiting on the LDS scoreboard
    assert "LDS.128" in out and "FFMA" in out and "loop 0 header" in out
    assert "kernel summary" in out and "bank conflict" in out
    assert "Traceback" not in out + err


def test_loop_option_shows_only_loop_bodies(run_cli):
    code, out, _ = run_cli("sass", str(DATA / "sgemm_loop.ptx"), "--loop")
    assert code == 0
    assert "LDS.128" in out and "FFMA" in out
    assert "STG.E.128" not in out and "CS2R R16" not in out   # prologue and epilogue are not loop bodies


def test_json_output(run_cli):
    code, out, _ = run_cli("sass", str(DATA / "ldg_ffma.ptx"), "--json")
    assert code == 0
    data = json.loads(out)
    (k,) = data["kernels"]
    assert k["name"] == "ldg_ffma" and k["summary"]["mix"]["LDG"] == 2
    ffma = [i for i in k["instructions"] if i["opcode"] == "FFMA"][0]
    ldg = [i for i in k["instructions"] if i["opcode"] == "LDG"][0]
    assert ldg["write_sb"] in ffma["wait_scoreboards"]
    code, out, _ = run_cli("sass", str(DATA / "sgemm_loop.ptx"), "--json", "--loop")
    loop = json.loads(out)["kernels"][0]["loops"][0]
    assert sum(1 for i in loop["instructions"] if i["opcode"] == "FFMA") == 16


def test_cubin_input_and_kernel_filter(run_cli, tmp_path):
    cubin = cubin_for(DATA / "ldg_ffma.ptx", "sm_90", tmp_path)
    code, out, err = run_cli("sass", str(cubin), "--kernel", "ldg_ffma", "--json")
    assert code == 0, err
    assert json.loads(out)["kernels"][0]["summary"]["mix"]["FFMA"] == 1
    code, out, err = run_cli("sass", str(cubin), "--kernel", "nope")
    assert code == 1 and "no kernel named 'nope'" in err and "Traceback" not in err


def test_cubin_of_another_architecture_is_refused(run_cli, tmp_path):
    cubin = cubin_for(DATA / "ldg_ffma.ptx", "sm_80", tmp_path)
    code, out, err = run_cli("sass", str(cubin))
    assert code == 1
    assert "sm_80" in err and "sm_90" in err and "Traceback" not in err and out == ""


@pytest.mark.parametrize("content", [b"", b"hello, not an ELF file\n", b"\x7fELF\x02\x01\x01" + b"\0" * 9,
                                     b"\x50\xed\x55\xba" + b"\0" * 60])
def test_non_cubin_files_are_refused(run_cli, tmp_path, content):
    bad = tmp_path / "bad.cubin"
    bad.write_bytes(content)
    code, out, err = run_cli("sass", str(bad))
    assert code == 1 and "error" in err and "Traceback" not in err and "internal error" not in err


def test_elf_for_another_machine_is_refused(run_cli, tmp_path):
    elf = bytearray(64)
    elf[:6] = b"\x7fELF\x02\x01"
    elf[18:20] = (62).to_bytes(2, "little")            # EM_X86_64
    bad = tmp_path / "host.o"
    bad.write_bytes(bytes(elf))
    code, _, err = run_cli("sass", str(bad))
    assert code == 1 and "not a CUDA cubin" in err


def test_missing_nvdisasm_names_the_extra(run_cli, tmp_path, monkeypatch):
    cubin = cubin_for(DATA / "ldg_ffma.ptx", "sm_90", tmp_path)
    real_which = toolchain.shutil.which
    monkeypatch.setattr(toolchain.shutil, "which", lambda n, *a, **k: None if n == "nvdisasm" else real_which(n, *a, **k))
    monkeypatch.setattr(toolchain, "_pip_bin_dirs", lambda: [])
    for var in ("ASMGEMM_NVDISASM", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(var, raising=False)
    if toolchain.find_tool("nvdisasm", required=False) is not None:
        pytest.skip("an nvdisasm in /usr/local/cuda/bin cannot be hidden")
    code, out, err = run_cli("sass", str(cubin))
    assert code == 1
    assert "nvdisasm not found" in err and "asmgemm[cuda-tools]" in err and "Traceback" not in err


def test_sass_refuses_targets_it_cannot_decode(run_cli):
    code, _, err = run_cli("sass", str(DATA / "ldg_ffma.ptx"), "--target", "sm_80")
    assert code == 1 and "sm_90/sm_90a only" in err


def test_regs_sass_compares_plan_and_allocation(run_cli):
    code, out, err = run_cli("regs", "sgemm_naive", "--sass", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert "functions" in data and data["functions"][0]["name"] == "sgemm_naive"   # the plan is still there
    cmp = data["sass"]
    assert "inferred" in cmp["method"]
    (fn,) = cmp["functions"]
    assert fn["fmas"], "no FMA matched"
    acc = [r for r in fn["registers"] if r["name"] == "acc"][0]
    assert acc["planned_bank"] == 1 and acc["physical"], acc
    for f in fn["fmas"]:
        assert re.match(r"^(@!?%\w+\s+)?(fma|mad)", f["ptx"]), f["ptx"]
        assert f["verdict"] in ("survived", "lost", "fixed by ptxas", "conflict as planned", "not fully planned")
        # the SASS-side verdict is consistent with the listing's own conflict analysis
        assert f["sass_conflict"] == bool(f["sass_conflict_banks"])
    assert sum(fn["verdicts"].values()) == len(fn["fmas"])
    code, out, err = run_cli("regs", "sgemm_naive", "--sass")
    assert code == 0 and "plan vs ptxas" in out and "inferred" in out
