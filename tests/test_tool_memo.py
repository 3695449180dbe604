"""ASMGEMM_TOOL_MEMO (asm/toolchain.py): a successful ptxas or nvdisasm run is kept and answered
again without starting the tool; a failed one never is; another tool binary, other arguments or
another input is another run."""
from __future__ import annotations

import pytest

from asmgemm import toolchain

PTX = """.version 8.0
.target sm_90
.address_size 64
.visible .entry k(.param .u64 p)
{
    ret;
}
"""


@pytest.fixture
def memo(tmp_path, monkeypatch):
    monkeypatch.setenv(toolchain.TOOL_MEMO_ENV, str(tmp_path / "memo"))
    started = []
    real = toolchain._run_tool

    def counting(name, exe, args):
        started.append(name)
        return real(name, exe, args)
    monkeypatch.setattr(toolchain, "_run_tool", counting)
    return started


def test_a_kept_run_is_answered_without_the_tool(memo):
    first = toolchain.run_ptxas(PTX, "sm_90")
    assert first[0] == 0 and first[2] and memo == ["ptxas"]
    assert toolchain.run_ptxas(PTX, "sm_90") == first and memo == ["ptxas"]
    text = toolchain.disassemble(first[2])
    assert toolchain.disassemble(first[2]) == text and memo == ["ptxas", "nvdisasm"]
    # another target, other arguments, another input: runs of their own
    toolchain.run_ptxas(PTX, "sm_80")
    toolchain.run_ptxas(PTX, "sm_90", ["-O1"])
    toolchain.run_ptxas(PTX.replace("ret;", "ret;\n    ret;"), "sm_90")
    toolchain.disassemble(first[2], ["-c"])
    assert memo == ["ptxas", "nvdisasm", "ptxas", "ptxas", "ptxas", "nvdisasm"]


def test_a_failed_run_is_never_kept(memo, tmp_path):
    bad = PTX.replace("ret;", "bogus;")
    code, log, cubin = toolchain.run_ptxas(bad, "sm_90")
    assert code != 0 and cubin is None
    toolchain.run_ptxas(bad, "sm_90")
    assert memo == ["ptxas", "ptxas"]
    folder = tmp_path / "memo"
    assert not folder.exists() or not any(folder.iterdir())


def test_another_tool_binary_is_another_run(memo, tmp_path, monkeypatch):
    toolchain.run_ptxas(PTX, "sm_90")
    copy = tmp_path / "ptxas"
    copy.write_bytes(open(toolchain.find_tool("ptxas"), "rb").read())
    copy.chmod(0o755)
    monkeypatch.setenv("ASMGEMM_PTXAS", str(copy))
    toolchain.run_ptxas(PTX, "sm_90")
    assert memo == ["ptxas", "ptxas"]


def test_unset_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(toolchain.TOOL_MEMO_ENV, raising=False)
    assert toolchain._memo_key("ptxas", toolchain.find_tool("ptxas"), [], b"") is None
