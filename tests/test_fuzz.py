"""Bad input never crashes the toolkit: random token soup, truncated real files and random
expressions either build or raise AsmError (which the CLI prints as FILE:LINE:COL with a caret).
Any other exception is a bug and fails here."""
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, build_source

ROOT = Path(__file__).resolve().parent.parent
REAL_FILES = sorted((ROOT / "kernels_ptx").glob("*.sasm")) + sorted((ROOT / "tests" / "golden" / "ptx").glob("*.sasm")) \
    + [ROOT / "tests" / "corpus" / "ptx" / n for n in ("reduce_shfl.ptx", "wgmma_sm90a.ptx", "device_call.ptx")]
TEXTS = [p.read_text() for p in REAL_FILES]

TOKENS = [
    ".entry", ".func", ".visible", "k", "(", ")", "{", "}", "[", "]", ",", ";", ":", "+", "-", "*", "|", "!",
    ".param", ".u64", ".f32", ".b32", ".pred", ".reg", ".shared", ".align", "16", "%r1", "%r<4>", "%p1",
    "@%p1", "@!p", "bra", "L1", "L1:", "ret", "mov.b32", "fma.rn.f32", "ld.global.v4.f32", "st.shared.f32",
    ".const", "X", "?=", "=", ".macro", "M(", "a", ".endm", "M(1)", ".for", "i", "in", "range(4)", ".endfor",
    ".if", ".elif", ".else", ".endif", ".include", '"x.inc"', ".regs", ".temp", "acc<0-3>", ": bank(1)",
    "vec4", ".schedule", ".endschedule", ".pin", ".tune", "choices(1, 2)", ".error", '"boom"', "{i*4}",
    "{1//0}", "{2**70}", "0f3F800000", "0d3FF0000000000000", "0x10", "1.5", "-3", "//c\n", "/*x*/", "\n",
    ".version 9.0\n", ".target sm_90\n", ".address_size 64\n", ".loc 1 2 3\n", ".pragma \"nounroll\";",
    "\t", "  ", "\\", "#", "$", "'", "\x00", "é",
]

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _build(text: str):
    try:
        build_source(text, "fuzz.sasm", BuildOptions())
    except AsmError as exc:
        rendered = exc.format()  # formatting the error must not crash either
        assert "error" in rendered


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=60).map(" ".join))
def test_token_soup_never_crashes(text):
    _build(text)


@pytest.mark.slow
@FUZZ
@given(st.integers(min_value=0, max_value=len(TEXTS) - 1), st.floats(min_value=0.0, max_value=1.0))
def test_truncated_real_files_never_crash(which, fraction):
    text = TEXTS[which]
    _build(text[: int(len(text) * fraction)])


@pytest.mark.slow
@FUZZ
@given(st.integers(min_value=0, max_value=len(TEXTS) - 1), st.integers(min_value=0, max_value=10**6),
       st.sampled_from(TOKENS))
def test_one_token_spliced_into_real_files_never_crashes(which, where, token):
    text = TEXTS[which]
    at = where % (len(text) + 1)
    _build(text[:at] + " " + token + " " + text[at:])


EXPR_ATOMS = ["0", "1", "7", "-2", "(-2)", "0.5", "3.5", "2**62", "N", "min(1,2)", "max(3)", "log2(8)", "log2(0)", "ceil_div(7,2)",
              "ceil_div(1,0)", "abs(-3)", "unknown(1)", "(1", "1)", "1 if N else 2", "not 0", "~5", "True"]
EXPR_OPS = ["+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^", "<", "==", " and ", " or "]


@FUZZ
@given(st.lists(st.sampled_from(EXPR_ATOMS), min_size=1, max_size=6),
       st.lists(st.sampled_from(EXPR_OPS), min_size=5, max_size=5))
def test_random_expressions_never_crash(atoms, ops):
    expr = atoms[0] + "".join(f" {op} {a}" for op, a in zip(ops, atoms[1:]))
    _build(f".const N = 3\n.const V = {expr} ;\n.entry k()\n{{\n    mov.b32 %r1, {{V}};\n    ret;\n}}\n")
