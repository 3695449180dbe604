"""Hostile and mistaken input (issue 13, items 4-8): every mistake is an error at FILE:LINE:COL with
the source line and a caret, exit 1, never "internal error" (exit 70) or a traceback; a limit
that is hit says which limit and its value."""
from __future__ import annotations

import os
import re
import signal
import stat
import time

import pytest

from asmgemm import expand as expand_mod
from asmgemm import parse_tree
from asmgemm.errors import AsmError, ToolchainError
from asmgemm.expand import Expander, MAX_EXPANDED_ITEMS
from asmgemm.expr import MAX_BITS
from asmgemm.parse_tree import MAX_BRACKET_DEPTH, MAX_EXPR_DEPTH, MAX_LINE_CHARS
from asmgemm.pipeline import build_file, build_source
from asmgemm.source import SourceFile
from asmgemm.toolchain import find_tool, parse_diagnostics

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")

HEAD = ".version 8.0\n.target sm_90\n.address_size 64\n"
LOCATED = re.compile(r"^(?P<file>[^\n:]+):(?P<line>\d+):(?P<col>\d+): error: (?P<msg>[^\n]*)\n    [^\n]*\n    [ \t]*\^",
                     re.MULTILINE)


def kernel(body: str, pre: str = "") -> str:
    """A kernel whose body starts on line 6 (after HEAD, `pre` and the two entry lines)."""
    return HEAD + pre + ".visible .entry k(.param .u64 p)\n{\n" + body + "\n    ret;\n}\n"


def cli_build(run_cli, tmp_path, data: bytes | str, name="k.sasm", *extra):
    src = tmp_path / name
    src.write_bytes(data.encode() if isinstance(data, str) else data)
    return run_cli("build", src, "-o", tmp_path / "out.ptx", *extra)


def located(code, err, line: int | None = None):
    """The CLI's answer is one located error: exit 1, FILE:LINE:COL, a caret, no traceback."""
    assert code == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    m = LOCATED.search(err)
    assert m, f"error without FILE:LINE:COL and caret:\n{err}"
    if line is not None:
        assert int(m["line"]) == line, err
    return m


def error_of(text: str, path="k.sasm") -> AsmError:
    with pytest.raises(AsmError) as e:
        build_source(text, path)
    assert e.value.span is not None, e.value.format()
    return e.value


# ---- 4. internal errors where the user made the mistake ----------------------------------------
@pytest.mark.parametrize("what", ["missing", "directory", "not executable", "not a program"])
def test_asmgemm_ptxas_that_is_not_a_program_names_the_variable(tmp_path, monkeypatch, run_cli, what):
    target = {"missing": tmp_path / "nope" / "ptxas", "directory": tmp_path,
              "not executable": tmp_path / "ptxas", "not a program": tmp_path / "ptxas"}[what]
    if what in ("not executable", "not a program"):
        target.write_text("this is not ptxas\n")
        if what == "not a program":
            target.chmod(0o755)        # executable, but neither a script nor a binary: exec fails
    monkeypatch.setenv("ASMGEMM_PTXAS", str(target))
    src = tmp_path / "k.sasm"
    src.write_text(kernel("    .reg .u32 %r<2>;\n    mov.u32 %r1, 1;"))
    for command in (["build", src, "-o", tmp_path / "k.ptx", "--cubin", tmp_path / "k.cubin"], ["check", src]):
        code, _, err = run_cli(*command)
        assert code == 1, err
        assert "internal error" not in err and "Traceback" not in err, err
        assert f"ASMGEMM_PTXAS={target}" in err, err
    assert not (tmp_path / "k.ptx").exists()
    from asmgemm.toolchain import run_ptxas
    with pytest.raises(ToolchainError, match="ASMGEMM_PTXAS"):
        run_ptxas(".version 8.0\n", "sm_90")


@pytest.mark.parametrize("literal, digits", [("9" * 5000, 5000), ("0x" + "f" * 4000, 4000),
                                             ("0b" + "1" * 5000, 5000), ("0" + "7" * 2000, 2001)])
def test_huge_integer_literals_are_located_errors_naming_the_bound(run_cli, tmp_path, literal, digits):
    for text, line in ((HEAD + f".const X = {literal}\n", 4),
                       (kernel(f"    .reg .u32 %r<2>;\n    mov.u32 %r1, {literal};"), 7)):
        t0 = time.perf_counter()
        code, _, err = cli_build(run_cli, tmp_path, text)
        assert time.perf_counter() - t0 < 10
        m = located(code, err, line)
        assert f"{MAX_BITS} bits" in m["msg"], err
        assert literal[:-20] not in err and f"({digits} digits)" in m["msg"], err   # not echoed whole


def test_a_literal_just_under_the_bound_still_works():
    top = (1 << MAX_BITS) - 1
    src = HEAD + f".const X = {top}\n.const Y = 0x{'f' * (MAX_BITS // 4)}\n.const Z = {'0' * 3000}17\n"
    assert build_source(src, "k.sasm").constants == {"X": top, "Y": top, "Z": 0o17}
    with pytest.raises(AsmError, match=f"{MAX_BITS} bits"):
        build_source(HEAD + f".const X = {top + 1}\n", "k.sasm")


def test_huge_float_literals_are_located_errors():
    e = error_of(HEAD + ".const X = 1e999\n")
    assert "out of range" in e.message and e.span.line == 4
    e = error_of(HEAD + ".const X = " + "1" * 5000 + ".5\n")
    assert "limit of 1000 characters" in e.message and "5002 characters" in e.message


def test_range_beyond_sys_maxsize_in_for_and_tune(run_cli, tmp_path):
    code, _, err = cli_build(run_cli, tmp_path, kernel(".for i in range(2**64)\n    ret;\n.endfor"))
    m = located(code, err, 6)
    assert "18446744073709551616 times (limit 100000)" in m["msg"]
    e = error_of(HEAD + ".const N ?= 1\n.tune N in range(2**64)\n")
    assert "18446744073709551616 values (limit 1024)" in e.message and e.span.line == 5
    e = error_of(kernel(".for i in range(2**70, 0, -1)\n.endfor"))            # negative steps count too
    assert f"{2**70} times (limit 100000)" in e.message
    # big bounds are fine when the trip count is small
    ptx = build_source(kernel(".for i in range(2**64, 2**64 + 3)\n    add.u32 %r1, %r1, 1;\n.endfor"), "k.sasm").ptx
    assert ptx.count("add.u32") == 3
    assert build_source(kernel(".for i in range(2**70, 0, -2**60)\n.endfor"), "k.sasm")


@pytest.mark.parametrize("case", ["expression", "operand", "brace", "regs"])
def test_a_megabyte_line_is_a_located_error_naming_the_limit(run_cli, tmp_path, case):
    big = "+".join(["1"] * 500_000)
    text = {"expression": HEAD + f".const X = {big}\n",
            "operand": kernel(f"    .reg .u32 %r<2>;\n    add.u32 %r1, %r1, {big};"),
            "brace": kernel(f"    .reg .u32 %r<2>;\n    add.u32 %r1, %r1, {{{big}}};"),
            "regs": kernel("    .regs .f32 " + ", ".join(f"r{i}" for i in range(150_000)))}[case]
    t0 = time.perf_counter()
    code, _, err = cli_build(run_cli, tmp_path, text)
    assert time.perf_counter() - t0 < 10
    m = located(code, err, {"expression": 4, "regs": 6}.get(case, 7))
    assert f"limit {MAX_LINE_CHARS:,} characters per line" in m["msg"], err
    assert int(m["col"]) == MAX_LINE_CHARS + 1
    assert len(err) < 2000                       # the line is shown as a window, not 1 MB of text


def test_a_long_ptx_data_initialiser_line_is_not_limited():
    values = ", ".join(str(i % 256) for i in range(40_000))
    assert len(values) > MAX_LINE_CHARS
    src = HEAD + f".global .align 4 .b8 table[40000] = {{{values}}};\n" + kernel("    ret;")[len(HEAD):]
    assert f".b8 table[40000] = {{{values}}};" in build_source(src, "k.sasm").ptx
    # ...but what follows the initialiser on the same line still is.
    e = error_of(HEAD + f".global .align 4 .b8 t[40000] = {{{values}}}; .const X = {'1+' * 40_000}1\n")
    assert f"limit {MAX_LINE_CHARS:,} characters per line" in e.message


@pytest.mark.parametrize("where", ["expression", "operand", "brace", "address", "multiline operand"])
def test_5000_nested_parentheses_are_a_located_error(run_cli, tmp_path, where):
    deep = "(" * 5000 + "1" + ")" * 5000
    text = {"expression": HEAD + f".const X = {deep}\n",
            "operand": kernel(f"    .reg .u32 %r<2>;\n    add.u32 %r1, %r1, {deep};"),
            "brace": kernel(f"    .reg .u32 %r<2>;\n    add.u32 %r1, %r1, {{{deep}}};"),
            "address": kernel(f"    .reg .u32 %r<2>;\n    ld.shared.u32 %r1, [{'[' * 5000}%r1{']' * 5000}];"),
            "multiline operand": kernel("    .reg .u32 %r<2>;\n    add.u32 %r1, %r1, " + "(\n" * 5000 + "1"
                                        + ")\n" * 5000 + ";")}[where]
    code, _, err = cli_build(run_cli, tmp_path, text)
    m = located(code, err)
    if where == "multiline operand":           # brackets across lines: the expression-depth limit
        assert f"(limit {MAX_EXPR_DEPTH})" in m["msg"], err
    else:
        assert f"brackets nested more than {MAX_BRACKET_DEPTH} deep on one line (limit {MAX_BRACKET_DEPTH})" \
            in m["msg"], err
        assert int(m["col"]) > MAX_BRACKET_DEPTH


def test_long_operator_chains_hit_the_expression_depth_limit(run_cli, tmp_path):
    for text in (HEAD + ".const X = " + "1+" * 20_000 + "1\n",
                 kernel("    .reg .u32 %r<2>;\n    add.u32 %r1, %r1, " + "1+" * 20_000 + "1;"),
                 kernel("    .reg .u32 %r<2>;\n    add.u32 %r1, %r1, " + "1+\n" * 5000 + "1;")):
        code, _, err = cli_build(run_cli, tmp_path, text)
        m = located(code, err)
        assert f"expression nested more than {MAX_EXPR_DEPTH} levels deep" in m["msg"]
        assert f"(limit {MAX_EXPR_DEPTH})" in m["msg"]


def test_expressions_at_the_limits_still_build_deep_inside_blocks_and_macros():
    """The limits fire before Python's recursion limit: the deepest input they allow builds."""
    e = "+".join(["1"] * (MAX_EXPR_DEPTH - 1))
    e_addr = "+".join(["1"] * (MAX_EXPR_DEPTH - 4))
    inner = f"    add.u32 %r1, %r1, {{{e}}};\n.const Q = {e}\n    ld.shared.u32 %r1, [%r1+{e_addr}];\n"
    blocks = parse_tree.MAX_NESTING - 2
    src = kernel("    .reg .u32 %r<2>;\n" + ".if 1\n" * blocks + inner + ".endif\n" * blocks)
    assert build_source(src, "k.sasm").ptx.count(f"add.u32 %r1, %r1, {MAX_EXPR_DEPTH - 1};") == 1
    depth = expand_mod.MAX_MACRO_DEPTH
    macros = "".join(f".macro M{i}(x)\n M{i + 1}(x)\n.endm\n" for i in range(depth - 1))
    macros += (f".macro M{depth - 1}(x)\n" + "".join(f".for i{n} in range(1)\n" for n in range(120)) + inner
               + ".endfor\n" * 120 + ".endm\n")
    src = kernel("    .reg .u32 %r<2>;\n" + ".if 1\n" * 60 + " M0(1)\n" + ".endif\n" * 60, pre=macros)
    assert build_source(src, "k.sasm").ptx.count(f"add.u32 %r1, %r1, {MAX_EXPR_DEPTH - 1};") == 1


def test_recursion_error_is_a_located_error_as_a_safety_net(monkeypatch):
    """Whatever recursion slips past the limits is reported at the statement being built."""
    src = kernel("    .reg .u32 %r<2>;\n    add.u32 %r1, %r1, 1;")

    def boom(*args, **kwargs):
        raise RecursionError("maximum recursion depth exceeded")
    with monkeypatch.context() as m:
        m.setattr(parse_tree.AstBuilder, "s_instruction", boom)
        m.setattr("asmgemm.parse_fast.parse", lambda source: None)   # the grammar path builds it
        e = error_of(src)
    assert "nested too deeply" in e.message and e.span.line == 7
    assert f"blocks {parse_tree.MAX_NESTING} deep" in e.message
    with monkeypatch.context() as m:
        m.setattr(Expander, "_s_Instr", boom)
        e = error_of(src)
    assert "nested too deeply" in e.message and e.span.line == 7
    assert f"macro calls {expand_mod.MAX_MACRO_DEPTH} deep" in e.message


# ---- 5. limits that fire before the work is done -----------------------------------------------
def test_nested_loops_fail_up_front_before_expanding(monkeypatch):
    src = kernel(".for i in range(1000)\n.for j in range(1000)\n.for k in range(1000)\n"
                 "    add.u32 %r1, %r1, 1;\n.endfor\n.endfor\n.endfor", pre="")
    seen = []
    real = Expander._count

    def count(self, n, span):
        seen.append(self.items_emitted)
        return real(self, n, span)
    monkeypatch.setattr(Expander, "_count", count)
    with pytest.raises(AsmError) as e:
        build_source(src, "k.sasm")
    msg = e.value.message
    assert "at least 1,000,000,000 items (1000 × 1000 × 1000 iterations)" in msg, msg
    assert f"over the limit of {MAX_EXPANDED_ITEMS:,} items" in msg
    assert e.value.span.line == 8                      # the innermost .for
    assert [n.span.line for n in e.value.notes] == [7, 6]
    assert len(seen) == 0                               # nothing was expanded before it failed


def test_the_projection_counts_the_body_and_what_is_left_of_outer_loops(monkeypatch):
    body = "    add.u32 %r1, %r1, 1;\n" * 3
    # 700 × 1000 iterations × 3 instructions = 2.1 M > 2 M: refused up front.
    e = error_of(kernel(f".for i in range(700)\n.for j in range(1000)\n{body}.endfor\n.endfor"))
    assert "(700 × 1000 iterations × 3 statements)" in e.message
    # An empty body counts as one item per iteration: 3000 × 1000 is refused too.
    e = error_of(kernel(".for i in range(3000)\n.for j in range(1000)\n.endfor\n.endfor"))
    assert "(3000 × 1000 iterations)" in e.message
    # Exactly at the limit is allowed; one more item, already produced before the loops, is refused
    # up front, before any of the loops' work (a smaller limit keeps this fast).
    monkeypatch.setattr(expand_mod, "MAX_EXPANDED_ITEMS", 601)          # 3 × 100 × 2 + `ret`
    loops = ".for i in range(3)\n.for j in range(100)\n    add.u32 %r1, %r1, 1;\n    add.u32 %r1, %r1, 2;\n" \
            ".endfor\n.endfor"
    assert build_source(kernel(loops), "k.sasm").ptx.count("add.u32") == 600
    emitted = []
    real = Expander._check_projected_items

    def spy(self, s, trips):
        emitted.append(self.items_emitted)
        return real(self, s, trips)
    monkeypatch.setattr(Expander, "_check_projected_items", spy)
    e = error_of(kernel("    add.u32 %r1, %r1, 0;\n    add.u32 %r1, %r1, 0;\n" + loops))
    assert "at least 600 items (3 × 100 iterations × 2 statements) after the 2 already produced" in e.message
    assert emitted == [2, 2]      # outer loop, then the inner one refused at once


def test_loops_within_the_limit_still_build():
    ptx = build_source(kernel("    .reg .u32 %r<2>;\n.for i in range(100)\n.for j in range(100)\n"
                              "    add.u32 %r1, %r1, {i*100+j};\n.endfor\n.endfor"), "k.sasm").ptx
    assert ptx.count("add.u32") == 10_000


# ---- 6. encodings --------------------------------------------------------------------------------
BODY = "    // a comment on the first body line\n    .reg .u32 %r<2>;\n    mov.u32 %r1, 1;"


def test_utf8_bom_is_accepted_and_columns_stay_right(run_cli, tmp_path):
    text = kernel(BODY)
    code, _, err = cli_build(run_cli, tmp_path, b"\xef\xbb\xbf" + text.encode())
    assert code == 0, err
    plain = (tmp_path / "out.ptx").read_text()
    code, _, err = cli_build(run_cli, tmp_path, b"\xef\xbb\xbf" + HEAD.encode() + b".const X = nope + 1\n")
    m = located(code, err, 4)
    assert m["col"] == "12" and "undefined name 'nope'" in m["msg"], err
    assert build_source("\ufeff" + text, "k.sasm").ptx == build_source(text, "k.sasm").ptx
    assert "\ufeff" not in plain


@pytest.mark.parametrize("ending", ["\r", "\r\n"])
def test_cr_only_and_crlf_files_build_the_same_ptx_as_lf(run_cli, tmp_path, ending):
    text = kernel(BODY)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    code, _, err = cli_build(run_cli, tmp_path / "a", text)
    assert code == 0, err
    lf = (tmp_path / "a" / "out.ptx").read_text()
    code, _, err = cli_build(run_cli, tmp_path / "b", text.replace("\n", ending))
    assert code == 0, err
    assert (tmp_path / "b" / "out.ptx").read_text() == lf.replace("/a/k.sasm", "/b/k.sasm")
    assert "mov.u32" in lf
    assert build_source(text.replace("\n", ending), "k.sasm").ptx == build_source(text, "k.sasm").ptx


def test_cr_only_errors_point_at_the_right_line_and_column(run_cli, tmp_path):
    text = kernel("    .reg .u32 %r<2>;\n    mov.u32 %r1, {undefined_thing + 1};")
    for ending in ("\r", "\r\n"):
        code, _, err = cli_build(run_cli, tmp_path, text.replace("\n", ending))
        m = located(code, err, 7)
        assert m["col"] == "19" and "undefined name 'undefined_thing'" in m["msg"], err
        lf_code, _, lf_err = cli_build(run_cli, tmp_path, text)
        assert lf_err == err and lf_code == code


def test_invalid_utf8_is_a_located_error(run_cli, tmp_path):
    data = kernel("    .reg .u32 %r<2>;\n    mov.u32 %r1, X;").encode().replace(b"X;", b"\xff;")
    code, _, err = cli_build(run_cli, tmp_path, data)
    m = located(code, err, 7)
    assert m["col"] == "18" and "invalid UTF-8 byte 0xff" in m["msg"], err
    # the same with CR-only line endings: the line is counted after normalising
    code, _, err = cli_build(run_cli, tmp_path, data.replace(b"\n", b"\r"))
    m = located(code, err, 7)
    assert m["col"] == "18", err
    code, _, err = cli_build(run_cli, tmp_path, "\ufeff.version 8.0\n".encode("utf-16"))
    m = located(code, err, 1)
    assert "UTF-16" in m["msg"], err


def test_from_text_normalises_line_endings():
    src = SourceFile.from_text("x", "\ufeffa\r\nb\rc\n")
    assert src.text == "a\nb\nc\n" and src.line_text(2) == "b" and src.line_col(4) == (3, 1)


# ---- 7. errors without a location ----------------------------------------------------------------
def test_unsupported_target_in_the_source_is_located(run_cli, tmp_path):
    code, _, err = cli_build(run_cli, tmp_path, ".version 8.0\n.target sm_00\n.address_size 64\n")
    m = located(code, err, 2)
    assert "unsupported .target sm_00" in m["msg"] and "sm_90" in m["msg"]


@needs_ptxas
@pytest.mark.toolchain
def test_ptxas_fatal_message_is_kept_and_mapped_to_the_source_line(run_cli, tmp_path):
    text = ".version 99.9\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n    ret;\n}\n"
    code, _, err = cli_build(run_cli, tmp_path, text, "k.sasm", "--cubin", tmp_path / "k.cubin")
    m = located(code, err, 1)
    assert "Unsupported .version 99.9" in m["msg"], err
    assert "aborted due to errors" not in err


def test_parse_diagnostics_keeps_fatal_lines():
    log = ("ptxas /tmp/x/k.ptx, line 6; fatal   : Unsupported .version 99.9; current version is '9.0'\n"
           "ptxas fatal   : Ptx assembly aborted due to errors\n")
    d = parse_diagnostics(log)
    assert (d[0].line, d[0].severity) == (6, "error")
    assert d[0].message == "Unsupported .version 99.9; current version is '9.0'"
    d = parse_diagnostics("ptxas fatal   : Unexpected non-ASCII character encountered on line 22\n")
    assert d[0].line == 22


@needs_ptxas
@pytest.mark.toolchain
def test_non_ascii_identifier_rejected_by_ptxas_is_mapped(run_cli, tmp_path):
    text = kernel("    .reg .u32 %r<2>;\n    m\u00aaov.u32 %r1, 1;")
    code, _, err = cli_build(run_cli, tmp_path, text, "k.sasm", "--cubin", tmp_path / "k.cubin")
    m = located(code, err, 7)
    assert "non-ASCII" in m["msg"]


def _fake_ptxas(tmp_path, script: str):
    exe = tmp_path / "fake-ptxas"
    exe.write_text("#!/bin/sh\n" + script + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_ptxas_killed_by_a_signal_says_so(run_cli, tmp_path, monkeypatch):
    monkeypatch.setenv("ASMGEMM_PTXAS", str(_fake_ptxas(tmp_path, "kill -SEGV $$")))
    code, _, err = cli_build(run_cli, tmp_path, kernel("    ret;"), "k.sasm", "--cubin", tmp_path / "k.cubin")
    assert code == 1 and "internal error" not in err, err
    assert f"killed by signal {int(signal.SIGSEGV)} (SIGSEGV)" in err and "ptxas crash on this input" in err, err
    assert "exit -" not in err
    monkeypatch.setenv("ASMGEMM_PTXAS", str(_fake_ptxas(tmp_path, "exit 3")))
    code, _, err = cli_build(run_cli, tmp_path, kernel("    ret;"), "k.sasm", "--cubin", tmp_path / "k.cubin")
    assert code == 1 and "ptxas failed (exit 3) and printed nothing" in err, err


def test_long_literals_are_shortened_in_messages():
    e = AsmError("malformed number '" + "9" * 5000 + "'")
    assert e.message == "malformed number '99999999999999999999…99999 (5000 digits)'"
    assert AsmError("x 0x" + "a" * 100).message == "x 0xaaaaaaaaaaaaaaaaaaaa…aaaaa (100 digits)"
    sha = "ab" * 32                                     # a digest is not a number: left alone
    assert AsmError(f"cache {sha}").message == f"cache {sha}"
    assert AsmError("short 12345").message == "short 12345"


def test_a_5000_digit_number_is_not_echoed_whole(run_cli, tmp_path):
    code, _, err = cli_build(run_cli, tmp_path, kernel(f"    .reg .u32 %r<2>;\n    mov.u32 %r1, {'9' * 5000}U;"))
    located(code, err, 7)
    assert "9" * 200 not in err and "(5000 digits)" in err, err


# ---- 8. accepted silently where a user wants a word ------------------------------------------------
def test_inner_for_shadowing_an_outer_loop_variable_is_an_error(run_cli, tmp_path):
    code, _, err = cli_build(run_cli, tmp_path, kernel(".for i in range(2)\n.for i in range(2)\n    ret;\n"
                                                       ".endfor\n.endfor"))
    m = located(code, err, 7)
    assert "enclosing '.for i'" in m["msg"]
    assert ":6:1: note: the enclosing '.for i'" in err


def test_loop_variables_in_macros_and_sibling_loops_are_not_shadowing():
    """A macro's own loops are lexically its own: `.for j` in a macro called from a `.for j` is fine,
    and so are two loops one after the other."""
    pre = ".macro INC(r)\n.for j in range(2)\n    add.u32 r, r, {j};\n.endfor\n.endm\n"
    body = ("    .reg .u32 %r<2>;\n.for j in range(3)\n    INC(%r1)\n.endfor\n"
            ".for j in range(2)\n    add.u32 %r1, %r1, 7;\n.endfor")
    assert build_source(kernel(body, pre=pre), "k.sasm").ptx.count("add.u32") == 8
    e = error_of(kernel("    .reg .u32 %r<2>;\n    INC(%r1)", pre=".macro INC(r)\n.for j in range(2)\n"
                        ".for j in range(2)\n    add.u32 r, r, 1;\n.endfor\n.endfor\n.endm\n"))
    assert "enclosing '.for j'" in e.message and e.span.line == 6


@pytest.mark.parametrize("order", ["regs first", "reg first", "reg range", "temp"])
def test_same_name_from_regs_and_plain_reg_is_an_error(run_cli, tmp_path, order):
    body = {"regs first": "    .regs .f32 acc\n    .reg .f32 acc;",
            "reg first": "    .reg .f32 acc;\n    .regs .f32 acc",
            "reg range": "    .regs .f32 acc<0-3>\n    .reg .f32 acc<4>;",
            "temp": "    .reg .f32 acc2;\n    .temp .f32 acc<0-3>"}[order]
    code, _, err = cli_build(run_cli, tmp_path, kernel(body + "\n    mov.f32 acc2, 0f00000000;"))
    m = located(code, err, 7)
    assert "is declared twice" in m["msg"] and "plain '.reg'" in m["msg"], err
    assert ":6:" in err                                  # the note points at the first declaration


def test_plain_reg_names_that_do_not_clash_still_build():
    body = ("    .regs .f32 acc<0-3>\n    .reg .f32 acc<0>;\n    .reg .f32 acc10, accx;\n    .reg .b32 %r<5>;\n"
            "    mov.f32 acc0, 0f00000000;")
    assert "mov.f32" in build_source(kernel(body), "k.sasm").ptx


def test_pin_outside_schedule_is_an_error(run_cli, tmp_path):
    code, _, err = cli_build(run_cli, tmp_path, kernel("    .reg .u32 %r<2>;\n    .pin mov.u32 %r1, 1;"))
    m = located(code, err, 7)
    assert "'.pin' outside a '.schedule' region" in m["msg"]
    ok = kernel("    .reg .u32 %r<2>;\n.schedule\n    .pin mov.u32 %r1, 1;\n    add.u32 %r1, %r1, 1;\n.endschedule")
    assert "mov.u32" in build_source(ok, "k.sasm").ptx


def test_shipped_kernels_still_build_with_the_new_checks():
    from asmgemm.pipeline import shipped_kernels
    for name, path in shipped_kernels().items():
        assert build_file(path).ptx, name


def test_language_doc_names_the_limits_the_code_uses():
    from pathlib import Path
    doc = (Path(__file__).resolve().parent.parent / "docs" / "language.md").read_text(encoding="utf-8")
    errors = " ".join(doc.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0].split())
    for phrase in (f"{MAX_LINE_CHARS:,} characters per line", f"brackets {MAX_BRACKET_DEPTH} deep",
                   f"expressions {MAX_EXPR_DEPTH} levels deep", f"blocks {parse_tree.MAX_NESTING} deep",
                   f"{MAX_BITS} bits", f"{expand_mod.MAX_LOOP_TRIPS:,} trips per `.for`",
                   f"{MAX_EXPANDED_ITEMS:,} expanded items", f"macro calls {expand_mod.MAX_MACRO_DEPTH} deep",
                   f"includes {expand_mod.MAX_INCLUDE_DEPTH} deep"):
        assert phrase in errors, phrase
