"""Grammar tests: every construct of plain PTX and of the macro layer parses into the right AST."""
import pytest

from asmgemm import ast
from asmgemm.errors import AsmError
from asmgemm.parse import parse_source
from asmgemm.parse_tree import parse_expression
from asmgemm.source import SourceFile


def parse(text):
    return parse_source(SourceFile.from_text("t.sasm", text)).body


def body_of(text):
    (fn,) = [s for s in parse(text) if isinstance(s, ast.Function)]
    return fn.body


def one_instr(line):
    (ins,) = body_of(".entry k() {\n" + line + "\n}")
    assert isinstance(ins, ast.Instr)
    return ins


def test_module_directives():
    body = parse(".version 8.5\n.target sm_90a, debug\n.address_size 64\n")
    assert isinstance(body[0], ast.Version) and body[0].text == "8.5"
    assert body[1].names == ["sm_90a", "debug"]
    assert body[2].bits == 64


def test_entry_with_param_attributes_and_perf_directives():
    (fn,) = parse(
        ".visible .entry k(\n .param .u64 .ptr .global .align 16 k_p0,\n .param .align 64 .b8 tmap[128]\n)\n"
        ".maxntid 256, 1, 1\n.minnctapersm 2\n{ ret; }")
    assert fn.kind == "entry" and fn.name.plain == "k"
    words = [q.word for q in fn.params[0].qualifiers]
    assert words == [".param", ".u64", ".ptr", ".global", ".align"]
    assert fn.params[0].qualifiers[-1].arg.text == "16"
    assert fn.params[1].dims[0].text == "128"
    assert [p.word for p in fn.perf] == [".maxntid", ".minnctapersm"]


def test_func_with_return_params_and_prototype():
    body = parse(".extern .func (.param .b32 r) f(.param .b32 a);\n"
                 ".func (.param .b32 r) g(.param .b32 a) .noreturn { ret; }")
    proto, g = body
    assert proto.body is None and proto.ret_params[0].name.plain == "r"
    assert g.body is not None and g.perf[0].word == ".noreturn"


def test_declarations():
    b = body_of(".entry k() {\n.reg .b32 %r<291>;\n.reg .pred %p<3>;\n.shared .align 16 .b8 smem[4096];\n"
                ".local .align 8 .b8 stack[16];\n.reg .b32 a, b, c;\n}")
    assert b[0].declarators[0].count == 291
    assert b[2].qualifiers[1].word == ".align" and b[2].declarators[0].dims[0].text == "4096"
    assert [d.name.plain for d in b[4].declarators] == ["a", "b", "c"]


def test_global_const_extern_initialisers():
    body = parse(".global .align 4 .u32 tbl[4] = {1, 2, 3, 4};\n.const .align 4 .f32 c0 = 0f3F800000;\n"
                 ".extern .shared .align 16 .b8 dyn[];\n")
    assert body[0].declarators[0].init == "= {1, 2, 3, 4}"
    assert body[1].qualifiers[0].word == ".const"
    assert body[2].declarators[0].dims == [None]


def test_debug_file_loc_section_pragma():
    body = parse('.file 1 "/tmp/a.cu"\n.section .debug_str { $L__info_string0:\n.b8 95\n.b8 0\n }\n'
                 '.entry k() {\n.loc 1 12 5\n.pragma "nounroll";\nret;\n}')
    assert body[0].keyword == ".file" and body[1].keyword == ".section"
    fn = body[2]
    assert fn.body[0].keyword == ".loc" and fn.body[0].text == "1 12 5"
    assert fn.body[1].keyword == ".pragma"


def test_guards_labels_and_operands():
    b = body_of(".entry k() {\n$L__BB0_2:\n@%p1 bra $L__BB0_2;\n@!p bra.uni done;\ndone:\nret;\n}")
    assert isinstance(b[0], ast.Label) and b[0].name.plain == "$L__BB0_2"
    assert b[1].guard.negated is False and isinstance(b[1].guard.reg, ast.RegRef)
    assert b[2].guard.negated is True and b[2].guard.reg.plain == "p"


@pytest.mark.parametrize("line", [
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%f1, %f2}, %rd1, %rd2, p, 1, 1, 0, 0;",
    "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2, %r3}], [%r4];",
    "mbarrier.try_wait.parity.shared::cta.b64 p, [%r1], %r2;",
    "shfl.sync.bfly.b32 %r2|%p1, %r1, 16, 31, -1;",
    "setp.lt.and.s32 %p1|%p2, %r1, %r2, !%p3;",
    "mov.b64 {%r1, %r2}, %rd1;",
    "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2}, {%r3}, {%f5,%f6,%f7,%f8};",
    "st.global.v4.f32 [%rd1+-4], {%f1, %f2, %f3, %f4};",
    "ld.param.u64 %rd1, [k_param_0];",
    "call.uni (retval0), foo, (param0, param1);",
    "mov.f32 %f1, 0f3F800000;",
    "mov.f64 %fd1, 0d3FF0000000000000;",
    "add.s32 %r1, %r2, 0xFFFFFFFF;",
    "mov.u32 %r1, %tid.x;",
    "mov.u64 %rd1, smem;",
    "st.shared.b32 [smem+16], _;",
    "tex.2d.v4.f32.f32 {%f1, %f2, %f3, %f4}, [tex, {%f5, %f6}];",
    "bar.sync 0;",
    "ret;",
])
def test_instruction_forms_parse(line):
    ins = one_instr(line)
    assert ins.opcode.plain == line.split(None, 1)[0].rstrip(";")


def test_pair_and_negation_operands():
    ins = one_instr("setp.lt.and.s32 %p1|%p2, %r1, %r2, !%p3;")
    assert isinstance(ins.operands[0], ast.Pair)
    assert isinstance(ins.operands[3], ast.UnOp) and ins.operands[3].op == "!"


def test_inline_asm_scope():
    b = body_of(".entry k() {\n{\n.reg .pred p;\nsetp.ne.b32 p, %r1, 0;\n}\n}")
    assert isinstance(b[0], ast.Scope) and len(b[0].body) == 2


def test_macro_layer_constructs():
    body = parse(
        '.const N ?= 4\n.const M = N * 2 ; // comment after the semicolon\n'
        '.macro FMA(d, a, b)\n fma.rn.f32 d, a, b, d;\n.endm\n'
        '.include "x.inc"\n'
        '.entry k() {\n.regs .f32 acc<0-7> : bank(i % 2), vec4\n.temp .b32 t\n'
        '.for i in range(0, N, 2)\n FMA(acc{i}, acc0, acc1)\n.endfor\n'
        '.if N > 2\n ret;\n.elif N == 1\n exit;\n.else\n trap;\n.endif\n'
        '.schedule\n ld.shared.v4.f32 {acc<0-3>}, [smem+{4*N}];\n.endschedule\n'
        '.pin bar.sync 0;\n}\n')
    const_n, const_m, macro, inc, fn = body
    assert const_n.overridable and not const_m.overridable
    assert macro.params == ["d", "a", "b"]
    assert inc.path == "x.inc"
    regs, temp, loop, cond, sched, pinned = fn.body
    assert regs.kind == "regs" and regs.types == [".f32"] and regs.items[0].base == "acc"
    assert [a.name for a in regs.attrs] == ["bank", "vec4"]
    assert temp.kind == "temp"
    assert loop.var == "i" and len(loop.args) == 3
    assert isinstance(loop.body[0], ast.MacroCall) and loop.body[0].name == "FMA"
    assert len(cond.branches) == 2 and cond.orelse is not None
    assert isinstance(sched, ast.Schedule)
    assert pinned.pinned


def test_interpolation_in_names_immediates_and_offsets():
    ins = one_instr("ld.shared.f32 c{i*8+j}, [smem+{4*k}];")
    name = ins.operands[0]
    assert name.parts[0] == "c" and isinstance(name.parts[1], ast.BinOp)
    mem = ins.operands[1]
    assert isinstance(mem.items[0], ast.BinOp) and isinstance(mem.items[0].right, ast.Brace)


def test_expression_precedence_is_pythons():
    src = SourceFile.from_text("e", "1 + 2 * 3 ** 2 // 4 if a < b <= c and not d else ~5 | 6 ^ 7 & 8 << 1")
    e = parse_expression(src.text, src, 0)
    assert isinstance(e, ast.Cond)
    assert isinstance(e.cond, ast.BinOp) and e.cond.op == "and"
    assert isinstance(e.other, ast.BinOp) and e.other.op == "|"


def test_spans_point_at_the_source():
    (fn,) = parse(".entry k() {\n    add.s32 %r1, %r2, 1;\n}")
    ins = fn.body[0]
    assert (ins.span.line, ins.span.col) == (2, 5)
    assert ins.operands[2].span.text() == "1"


def test_floor_division_in_directive_lines():
    (c,) = parse(".const X = 7 // 2\n")
    assert isinstance(c.value, ast.BinOp) and c.value.op == "//"


@pytest.mark.parametrize("text, where", [
    (".entry k() {\nadd.s32 %r1 %r2;\n}", (2, 13)),
    (".entry k() {\n.if 1\nret;\n}", (4, 1)),
    (".for i in range(3)\n", (1, 1)),
    (".macro F(a)\nret;\n", (1, 1)),
    (".entry k() {\nret;\n", (1, 12)),
    (".const X = (1 + \n", (1, 12)),
])
def test_syntax_errors_have_positions(text, where):
    with pytest.raises(AsmError) as ei:
        parse(text)
    err = ei.value
    assert err.span is not None
    assert (err.span.line, err.span.col) == where, err.format()
    assert err.format().startswith(f"t.sasm:{where[0]}:{where[1]}: error:")


def test_unterminated_block_names_the_opener():
    with pytest.raises(AsmError) as ei:
        parse(".entry k() {\n.for i in range(2)\nret;\n}\n")
    assert "still open" in ei.value.message and "'.for'" in ei.value.message and "'.endfor'" in ei.value.message
    assert (ei.value.span.line, ei.value.notes[0].span.line) == (4, 2)
    with pytest.raises(AsmError) as ei:
        parse(".macro F(a)\nret;\n")
    assert "never closed" in ei.value.message and ".macro" in ei.value.message


@pytest.mark.parametrize("between", ["", "    mov.u32 r, 1;\n"])
def test_closed_block_is_not_the_open_one(between):
    """An `.if ... .endif` the parser has not reduced yet (it waits for the next token) is closed:
    an error right after it names the body's `{`, as it does after any statement (found by a
    mutant in tests/test_parse_fast.py, where the fast path's skeleton had blanked the statement
    between `.endif` and the error)."""
    text = ".entry k()\n{\n.if 1\n    ret;\n.endif\n" + between + "%tid.x\n}\n"
    with pytest.raises(AsmError) as ei:
        parse(text)
    err = ei.value
    assert "'{' is still open" in err.message, err.format()
    assert (err.span.line, err.notes[0].span.line) == (6 + bool(between), 2)
