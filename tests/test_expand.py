"""Macro/loop expansion: .const, -D parameters, macros, .for, .if, .include, interpolation, limits."""
import pytest

from asmgemm import ir
from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, build_source


def expand(text, **defines):
    r = build_source(text, "t.sasm", BuildOptions(defines={k: str(v) for k, v in defines.items()}))
    return r


def instrs(text, **defines):
    r = expand(text, **defines)
    fn = next(r.expanded.functions())
    return [i.render() for i in fn.instructions()]


def kernel(body, pre=""):
    return pre + "\n.entry k() {\n" + body + "\n}\n"


def test_const_and_interpolation():
    out = instrs(kernel(".for i in range(2)\n.for j in range(2)\nmov.b32 %r{i*2+j}, {i*10+j};\n.endfor\n.endfor",
                        ".const X = 3"))
    assert out == ["mov.b32 %r0, 0;", "mov.b32 %r1, 1;", "mov.b32 %r2, 10;", "mov.b32 %r3, 11;"]


def test_consts_as_bare_operands_and_in_addresses():
    out = instrs(kernel("ld.shared.f32 %f1, [smem+{4*N}];\nadd.s32 %r1, %r1, N;\nld.shared.f32 %f2, [smem+N*2-1];",
                        ".const N = 8"))
    assert out == ["ld.shared.f32 %f1, [smem+32];", "add.s32 %r1, %r1, 8;", "ld.shared.f32 %f2, [smem+15];"]


def test_negative_offsets_keep_ptx_form():
    assert instrs(kernel("ld.global.f32 %f1, [%rd1+-4];")) == ["ld.global.f32 %f1, [%rd1+-4];"]


def test_defines_override_only_parameters():
    text = kernel("mov.b32 %r1, N;", ".const N ?= 4")
    assert instrs(text) == ["mov.b32 %r1, 4;"]
    assert instrs(text, N=9) == ["mov.b32 %r1, 9;"]
    assert instrs(text, N="2*8") == ["mov.b32 %r1, 16;"]
    with pytest.raises(AsmError, match="fixed constant"):
        expand(kernel("ret;", ".const N = 4"), N=5)
    with pytest.raises(AsmError, match="no overridable constant named 'M'"):
        expand(text, M=1)


def test_parameters_and_tunables_are_reported():
    r = expand(kernel("ret;", ".const BK ?= 8\n.tune BK in choices(8, 16)\n.const T ?= 1\n.tune T in range(1, 3)"))
    assert r.parameters == {"BK": 8, "T": 1}
    assert r.tunables == {"BK": [8, 16], "T": [1, 2]}


def test_macro_expansion_binds_registers_numbers_and_addresses():
    text = kernel("F(%f1, %f2, 3)\nG([%rd1+8], %r1)",
                  ".macro F(d, a, n)\nfma.rn.f32 d, a, a, d;\nmov.b32 %r{n}, n;\n.endm\n"
                  ".macro G(addr, v)\nst.global.b32 addr, v;\nst.global.b32 [addr+4], v;\n.endm")
    assert instrs(text) == ["fma.rn.f32 %f1, %f2, %f2, %f1;", "mov.b32 %r3, 3;",
                            "st.global.b32 [%rd1+8], %r1;", "st.global.b32 [%rd1+12], %r1;"]


def test_macro_spans_record_the_call_site():
    r = expand(kernel("F()", ".macro F()\nret;\n.endm"))
    ins = next(next(r.expanded.functions()).instructions())
    assert ins.span.line == 2 and ins.expanded_from[0].line == 5


def test_unique_ids_per_macro_call():
    text = kernel("L()\nL()", ".macro L()\nloop{__uid__}:\nbra loop{__uid__};\n.endm")
    r = expand(text)
    labels = [i.name for i in ir.iter_body(next(r.expanded.functions()).body) if isinstance(i, ir.Label)]
    assert labels == ["loop1", "loop2"]


def test_if_elif_else():
    text = kernel(".if N == 1\nmov.b32 %r1, 1;\n.elif N == 2\nmov.b32 %r1, 2;\n.else\nmov.b32 %r1, 3;\n.endif",
                  ".const N ?= 1")
    assert instrs(text) == ["mov.b32 %r1, 1;"]
    assert instrs(text, N=2) == ["mov.b32 %r1, 2;"]
    assert instrs(text, N=7) == ["mov.b32 %r1, 3;"]


def test_error_directive():
    with pytest.raises(AsmError, match="too big") as ei:
        expand(kernel("ret;", '.const N ?= 1\n.if N > 4\n.error "N too big"\n.endif'), N=5)
    assert ei.value.span.line == 3


def test_vectors_and_ranges():
    text = kernel(".regs .f32 a<0-3> : vec4\nld.shared.v4.f32 {a<0-3>}, [smem];\nmov.b64 {%r1, %r2}, %rd1;\n"
                  "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2}, {%r3}, {%f1,%f2,%f3,%f4};")
    r = expand(text)
    fn = next(r.expanded.functions())
    ld, mov, mma = list(fn.instructions())
    assert isinstance(ld.operands[0], ir.Vector) and [e.name for e in ld.operands[0].elems] == ["a0", "a1", "a2", "a3"]
    assert mma.operands[2] == ir.Vector((ir.Reg("%r3"),))


def test_include_relative_to_the_including_file(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "m.inc").write_text(".macro Z(r)\nmov.b32 r, 0;\n.endm\n")
    main = tmp_path / "main.sasm"
    main.write_text('.include "sub/m.inc"\n.entry k() {\nZ(%r1)\n}\n')
    from asmgemm.pipeline import build_file
    r = build_file(str(main))
    assert [i.render() for i in next(r.expanded.functions()).instructions()] == ["mov.b32 %r1, 0;"]


def test_include_errors(tmp_path):
    from asmgemm.pipeline import build_file
    a = tmp_path / "a.sasm"
    a.write_text('.include "nope.inc"\n')
    with pytest.raises(AsmError, match="include file not found") as ei:
        build_file(str(a))
    assert ei.value.span.line == 1
    (tmp_path / "x.inc").write_text('.include "y.inc"\n')
    (tmp_path / "y.inc").write_text('.include "x.inc"\n')
    a.write_text('.include "x.inc"\n')
    with pytest.raises(AsmError, match="include cycle: x.inc -> y.inc -> x.inc"):
        build_file(str(a))


@pytest.mark.parametrize("text, message", [
    (kernel("mov.b32 %r1, {UNDEF};"), "undefined name 'UNDEF'"),
    (kernel("F(1)", ".macro F(a, b)\nret;\n.endm"), "takes 2 argument"),
    (kernel("Fx(1)", ".macro F(a)\nret;\n.endm"), "undefined macro 'Fx'"),
    (kernel("R()", ".macro R()\nR()\n.endm"), "nested deeper than 64"),
    (kernel(".for i in range(10**9)\nret;\n.endfor"), "would run"),
    (kernel(".for i in range(0, 4, 0)\nret;\n.endfor"), "step must not be zero"),
    (kernel("mov.b32 %r1, {1 // 0};"), "division by zero"),
    (".const A = 1\n.const A = 2\n", "already defined"),
    ("mov.b32 %r1, 1;\n", "inside a function"),
    (kernel(".regs .f32 a\n.regs .f32 a"), "already declared"),
    (kernel(".regs .f99 a"), "register type"),
    (kernel(".regs .f32 a<0-3> : bank(i), banks(0)"), "banks(...) lists 1 banks for 4"),
    (kernel(".regs .f32 a<0-2> : vec4"), "multiple of 4"),
    (kernel(".regs .f32 a : colour(2)"), "unknown register attribute"),
    (kernel(".schedule\n.schedule\nret;\n.endschedule\n.endschedule"), "do not nest"),
    (kernel(".schedule\nL:\nret;\n.endschedule"), "straight-line"),
    (kernel("add.s32 %r1, %r2+4, 1;"), "only valid inside [ ] addresses"),
    (kernel("ld.global.f32 %f1, [%rd1+%rd2];"), "at most one register"),
    (".const X ?= 1\n.tune Y in choices(1)\n", "names no parameter"),
])
def test_user_errors(text, message):
    with pytest.raises(AsmError) as ei:
        expand(text)
    assert message in ei.value.format()


def test_macro_parameter_as_interpolation_prefix():
    # `a{j}` inside the macro pastes the argument's name, whatever the parameter is called.
    src = (".macro ZERO(a, n)\n.for j in range(n)\n    mov.f32 a{j}, 0f00000000;\n.endfor\n.endm\n"
           ".entry k()\n{\n    .reg .f32 x<2>;\n    ZERO(x, 2)\n    ret;\n}\n")
    assert instrs(src)[:2] == ["mov.f32 x0, 0f00000000;", "mov.f32 x1, 0f00000000;"]
    # A prefix that is a numeric constant stays literal text.
    src = ".const c = 5\n.entry k()\n{\n    .reg .f32 c<2>;\n    mov.f32 c{1}, 0f00000000;\n    ret;\n}\n"
    assert instrs(src)[0] == "mov.f32 c1, 0f00000000;"


def test_bank_values_follow_the_evaluator():
    # Comparisons are C-like (1 or 0), so a bank chosen by a condition is bank 1 or 0.
    r = expand(kernel(".regs .f32 a<0-3> : bank(i % 2 == 0)\nmov.f32 a0, a1;\nmov.f32 a2, a3;\nret;"))
    fn = next(r.expanded.functions())
    assert [reg.bank for reg in fn.named_regs] == [1, 0, 1, 0]
    r = expand(kernel(".regs .f32 b<0-1> : banks(1 < 2, not 1)\nmov.f32 b0, b1;\nret;"))
    assert [reg.bank for reg in next(r.expanded.functions()).named_regs] == [1, 0]


def test_bank_value_checks():
    from asmgemm.expand import _int_value
    assert _int_value(True, None, "bank") == 1 and type(_int_value(True, None, "bank")) is int
    assert _int_value(False, None, "bank") == 0
    assert _int_value(3, None, "bank") == 3
    with pytest.raises(AsmError, match="bank must be an integer, got 1.5"):
        expand(kernel(".regs .f32 a<0-1> : banks(1.5, 0)\nmov.f32 a0, a1;\nret;"))
    with pytest.raises(AsmError, match="bank must be an integer"):
        expand(kernel('.regs .f32 a : bank("x")\nmov.f32 a, a;\nret;'))


def test_a_string_computed_in_braces_names_a_register_or_a_macro_argument():
    # {"a" if c else "b"} picks an operand by name; as a macro argument it can name a type too
    src = kernel("""    .regs .pred acc_on
    .reg .pred plain;
.macro SEL(p, T)
    cvt.rn.{T}.f32 %h1, %f1;
    @p bra done;
.endm
.for i in range(2)
    SEL({"acc_on" if i == 0 else "plain"}, {"bf16" if BF else "f16"})
.endfor
done:
    ret;""", ".const BF ?= 0")
    out = instrs(src, BF=1)
    assert out[0] == "cvt.rn.bf16.f32 %h1, %f1;" and out[1].startswith("@") and out[1].endswith("bra done;")
    assert out[3] == "@plain bra done;"
    assert instrs(src, BF=0)[0] == "cvt.rn.f16.f32 %h1, %f1;"


def test_a_string_in_braces_that_is_no_name_is_a_located_error():
    with pytest.raises(AsmError, match="not a name an operand can be") as exc:
        instrs(kernel('    mov.b32 %r1, {"1 + 2"};'))
    assert exc.value.span is not None and exc.value.span.line == 3
