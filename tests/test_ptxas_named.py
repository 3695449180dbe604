"""ptxas errors that name an entry, a function or a variable instead of a PTX line point at its
declaration in the source (asmgemm/ptxas_names.py): too much shared, local or constant data at the
largest declaration of that space (with a note at the function), an unresolved function at its
declaration."""
from __future__ import annotations

import re

import pytest

from asmgemm.pipeline import build_source
from asmgemm.ptxas_names import locate
from asmgemm.toolchain import find_tool

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")
HEAD = ".version 8.0\n.target sm_90\n.address_size 64\n"
LOCATED = re.compile(r"^(?P<file>[^\n:]+):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>.*)$", re.M)


def build_error(run_cli, tmp_path, name: str, text: str):
    src = tmp_path / name
    src.write_text(text)
    out, cubin = tmp_path / "out.ptx", tmp_path / "out.cubin"
    code, stdout, err = run_cli("build", src, "-o", out, "--cubin", cubin)
    assert code != 0 and "Traceback" not in err, err
    assert not out.exists() and not cubin.exists()
    m = LOCATED.search(err)
    assert m is not None, f"no FILE:LINE:COL in:\n{err}"
    assert m["file"] == str(src)
    return int(m["line"]), int(m["col"]), m["msg"], err


@pytest.mark.toolchain
@needs_ptxas
def test_too_much_shared_data_points_at_the_shared_declaration(run_cli, tmp_path):
    """The issue's case: a .sasm entry with a 1 MiB .shared array."""
    text = (".visible .entry k(.param .u64 p)\n{\n    .shared .align 4 .b8 small[16];\n"
            "    .shared .align 4 .b8 big[1048576];\n    .regs .u64 ptr\n    ld.param.u64 ptr, [p];\n"
            "    ret;\n}\n")
    line, col, msg, err = build_error(run_cli, tmp_path, "k.sasm", text)
    assert (line, col) == (4, 5) and "Entry function 'k' uses too much shared data" in msg
    assert "^~~~" in err and "big[1048576]" in err
    assert re.search(r"k\.sasm:1:1: note: in entry 'k'", err), err


@pytest.mark.toolchain
@needs_ptxas
def test_too_much_module_shared_data_points_at_the_variable_the_entry_uses(run_cli, tmp_path):
    text = (HEAD + ".shared .align 4 .b8 unused[40000];\n.shared .align 4 .b8 sm[60000];\n"
            ".visible .entry k()\n{\n    .reg .u64 %rd<2>;\n    mov.u64 %rd1, sm;\n    st.shared.u64 [%rd1], %rd1;\n"
            "    ret;\n}\n")
    line, col, msg, _ = build_error(run_cli, tmp_path, "m.ptx", text)
    assert (line, col) == (5, 1) and "uses too much shared data" in msg


@pytest.mark.toolchain
@needs_ptxas
def test_an_unresolved_extern_function_points_at_its_declaration(run_cli, tmp_path):
    text = HEAD + ".extern .func f();\n.visible .entry k()\n{\n    call f, ();\n    ret;\n}\n"
    line, col, msg, _ = build_error(run_cli, tmp_path, "e.ptx", text)
    assert (line, col) == (4, 1) and "Unresolved extern function 'f'" in msg


@pytest.mark.toolchain
@needs_ptxas
def test_too_much_constant_data_points_at_the_largest_constant(run_cli, tmp_path):
    text = (HEAD + ".const .align 4 .b8 c1[8];\n.const .align 4 .b8 c2[70000];\n.visible .entry k()\n{\n"
            "    .reg .u64 %rd<2>;\n    mov.u64 %rd1, c2;\n    ld.const.u64 %rd1, [%rd1];\n    ret;\n}\n")
    line, col, msg, _ = build_error(run_cli, tmp_path, "c.ptx", text)
    assert (line, col) == (5, 1) and "too much global constant data" in msg


def test_locate_without_ptxas():
    """The mapping itself, on messages as ptxas words them: a macro-built declaration, a vector
    type's size, a function named in a message, a name the module does not have."""
    build = build_source(".macro SMEM(name, n)\n    .shared .align 16 .v4 .f32 name[n];\n.endm\n"
                         ".func helper()\n{\n    ret;\n}\n"
                         ".visible .entry k()\n{\n    .shared .align 16 .b8 bytes[8000];\n    SMEM(tiles, 1000)\n"
                         "    call helper, ();\n    ret;\n}\n", "t.sasm")
    span, notes = locate("Entry function 'k' uses too much shared data (0x100000 bytes, 0xc000 max)", build.scheduled)
    # 1000 x .v4 .f32 = 16000 bytes beat 8000: the declaration in the macro's body
    assert span.line == 2 and [n.span.line for n in notes] == [8]
    span, notes = locate("Function 'helper' has a problem", build.scheduled)
    assert span.line == 4 and not notes
    assert locate("Entry function 'nothere' uses too much shared data", build.scheduled) == (None, [])
    assert locate("Ptx assembly aborted due to errors", build.scheduled) == (None, [])
