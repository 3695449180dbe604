"""Plain PTX that asmgemm used to refuse (issue 14, items 1-3) goes through `asmgemm build` and
comes out as PTX that ptxas turns into the same machine code as the original:

1. vector registers (`.reg .v4 .b32 q;`, `.reg .v2 .f32 v<4>;`, `%`-named ones) and their
   components `.x .y .z .w` / `.r .g .b .a` as operands wherever a scalar goes, whole as the
   operand of a `.v4` load or store, and inside `{ }`; in `.sasm`, `.regs .v4 .f32 q` too;
2. `.target` sm_100 / sm_120 and their `a`/`f` variants (whatever the ptxas in use assembles);
3. `!` on a predicate declared without '%' (`.reg .pred p;`), in setp and vote.

Each PTX text here is assembled twice, as written and as asmgemm re-emits it; the SASS of every
function and the ELF symbol tables must be identical (tests/test_corpus_roundtrip.py's check).
"""

import json
from pathlib import Path

import pytest

from asmgemm import ir
from asmgemm.errors import AsmError
from asmgemm.pipeline import build_source
from asmgemm.scheduler.depgraph import build_graph
from asmgemm.scheduler.latencies_sm90 import TABLE
from asmgemm.toolchain import find_tool, ptxas_targets

from test_corpus_roundtrip import assert_same_machine_code

needs_tools = pytest.mark.skipif(
    find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
    reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')")

# ---- 1. vector registers ------------------------------------------------------------------------
VECTORS = """.version {version}
.target {target}
.address_size 64

.visible .entry vectors(.param .u64 vectors_a, .param .u64 vectors_b)
{{
	.reg .v4 .b32 q;
	.reg .v2 .f32 v<4>;
	.reg .v4 .b16 h;
	.reg .v4 .f32 %fv;
	.reg .v2 .u64 %rdv;
	.reg .b32 t, r, %r<4>;
	.reg .u64 a, b;
	.reg .f32 %f<4>;

	ld.param.u64 a, [vectors_a];
	ld.param.u64 b, [vectors_b];
	ld.global.v4.b32 q, [a];
	ld.global.v4.b16 h, [a+16];
	ld.global.v2.f32 v1, [a+32];
	ld.global.v4.f32 %fv, [a+48];
	add.u32 t, q.x, q.w;
	st.global.b16 [b], h.x;
	cvt.u32.u16 r, h.y;
	add.f32 v2.x, v1.y, v1.x;
	mul.f32 v2.y, v1.r, v1.g;
	fma.rn.f32 %f1, %fv.x, %fv.y, %fv.w;
	mov.f32 %fv.z, %f1;
	mov.b32 q.y, t;
	mov.b32 q.b, r;
	mov.u32 %r1, %tid.x;
	add.u32 q.a, q.a, %r1;
	mov.b64 %rdv.x, a;
	add.s64 %rdv.y, %rdv.x, 128;
	st.global.v4.b32 [b+16], q;
	st.global.v2.f32 [b+32], v2;
	st.global.v4.f32 [b+48], %fv;
	st.global.v4.b32 [b+64], {{q.w, q.z, q.y, r}};
	st.global.v2.f32 [b+80], {{v2.y, v1.x}};
	mov.b32 {{h.x, h.y}}, t;
	st.global.v4.b16 [b+96], h;
	st.global.v2.u64 [b+112], %rdv;
	st.global.b16 [b+128], h.w;
	ret;
}}
"""

# (.version, .target): the plain targets and the newer ones this ptxas assembles.
VECTOR_TARGETS = [("8.7", "sm_90"), ("8.7", "sm_100a"), ("8.7", "sm_120"), ("9.0", "sm_120f")]


def _assembles(target: str) -> bool:
    listed = ptxas_targets()
    return listed is not None and target in listed


@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("version,target", VECTOR_TARGETS, ids=[t for _, t in VECTOR_TARGETS])
def test_vector_registers_round_trip(version, target):
    if not _assembles(target):
        pytest.skip(f"this ptxas does not assemble {target}")
    text = VECTORS.format(version=version, target=target)
    result = build_source(text, "vectors.ptx")
    assert result.target == target
    assert_same_machine_code(text, result.ptx, target, f"vectors ({target})")


def _operands(result, opcode_prefix: str):
    fn = next(result.expanded.functions())
    return [i.operands for i in fn.instructions() if i.opcode.startswith(opcode_prefix)]


def test_components_are_registers_of_their_vector():
    result = build_source(VECTORS.format(version="8.7", target="sm_90"), "vectors.ptx")
    (add,) = [ops for ops in _operands(result, "add.u32") if ops[0] == ir.Reg("t")]
    assert add == [ir.Reg("t"), ir.Reg("q", component="x"), ir.Reg("q", component="w")]
    (fma,) = _operands(result, "fma.rn.f32")
    assert fma[1:] == [ir.Reg("%fv", component="x"), ir.Reg("%fv", component="y"), ir.Reg("%fv", component="w")]
    # %tid.x is a special register, not a component of a declared vector: its name keeps the .x.
    (tid,) = [ops for ops in _operands(result, "mov.u32") if ops[0] == ir.Reg("%r1")]
    assert tid[1] == ir.Reg("%tid.x")
    # Whole vectors are registers too, and `{ }` lists of components are vectors of them.
    stores = _operands(result, "st.global.v4.b32")
    assert stores[0][1] == ir.Reg("q")
    assert stores[1][1] == ir.Vector((ir.Reg("q", component="w"), ir.Reg("q", component="z"),
                                      ir.Reg("q", component="y"), ir.Reg("r")))
    assert ".r, v1.g;" in result.ptx and "q.b, r;" in result.ptx     # the rgba spelling is kept


def test_a_component_write_orders_against_the_whole_vector():
    """The scheduler keys dependencies by register name: q.x and q share the name 'q', so a
    load of q, a write of one component and a read of another stay in order."""
    src = """.target sm_90
.visible .entry k(.param .u64 p)
{
    .reg .v4 .b32 q;
    .reg .b32 t;
    .reg .u64 a;
    ld.param.u64 a, [p];
.schedule
    ld.global.v4.b32 q, [a];
    mov.b32 q.y, 7;
    add.u32 t, q.x, q.y;
    st.global.v4.b32 [a], q;
.endschedule
    ret;
}
"""
    result = build_source(src, "k.sasm")
    region = next(i for i in next(result.expanded.functions()).body if isinstance(i, ir.ScheduleRegion))
    graph = build_graph(region.items, TABLE)
    edges = {(e.src, e.dst) for e in graph.edges}
    # ld q -> mov q.y (both write q: the last writer is what later reads of q.x see), and
    # mov q.y -> add (reads q.x, q.y) and -> st (reads q). As separate names there would be none.
    assert {(0, 1), (1, 2), (1, 3)} <= edges
    order = [i.render() for i in next(result.scheduled.functions()).instructions()]
    assert order.index("mov.b32 q.y, 7;") < order.index("add.u32 t, q.x, q.y;") \
        < order.index("st.global.v4.b32 [a], q;")


def test_component_errors_are_located():
    def err(body: str) -> AsmError:
        src = (".target sm_90\n.visible .entry k()\n{\n    .reg .v2 .f32 v;\n    .reg .f32 f;\n"
               "    .regs .f32 s\n" + body + "\n    ret;\n}\n")
        with pytest.raises(AsmError) as e:
            build_source(src, "k.sasm")
        return e.value

    e = err("    mov.f32 f, v.z;")
    assert e.message == "'v.z': 'v' is a .v2 register, so it has no .z" and (e.span.line, e.span.col) == (7, 16)
    assert e.notes[0].span.line == 4
    e = err("    mov.f32 f, s.x;")
    assert "'s' is a scalar register" in e.message and e.span.line == 7
    e = err("    @!nope bra.uni DONE;\n    and.pred nope, !nope, !nope;")
    assert "'!' negates a predicate register: 'nope' is not a register this function declares" in e.message


# ---- 1 (.sasm): named vector registers -----------------------------------------------------------
NAMED = """.target sm_90
.macro SUM(d, v)
    add.f32 d, v.x, v.w;
.endm
.visible .entry k(.param .u64 p)
{
    .regs .u64 ptr
    .regs .v4 .f32 q
    .temp .v2 .f32 t<0-1>
    .regs .f32 s, u
    ld.param.u64 ptr, [p];
    ld.global.v4.f32 q, [ptr];
    ld.global.v2.f32 t0, [ptr+16];
    add.f32 s, t0.x, t0.y;
    st.global.v2.f32 [ptr+32], {t0.y, q.a};
    ld.global.v2.f32 t1, [ptr+48];
    fma.rn.f32 s, t1.x, q.y, s;
    mov.f32 q.z, t1.g;
    SUM(u, q)
    st.global.v4.f32 [ptr], q;
    st.global.v2.f32 [ptr+64], {s, u};
    ret;
}
"""
NAMED_DECL_LINE = 8


def test_named_vector_registers_are_planned_as_aligned_groups():
    result = build_source(NAMED, "k.sasm")
    plan = {r.name: r for r in result.allocation.functions["k"].regs}
    assert [n for n in plan if n.startswith("q")] == ["q.x", "q.y", "q.z", "q.w"]
    base = plan["q.x"].index
    assert base % 4 == 0 and [plan[f"q.{c}"].index for c in "xyzw"] == [base, base + 1, base + 2, base + 3]
    t0 = [plan["t0.x"].index, plan["t0.y"].index]
    t1 = [plan["t1.x"].index, plan["t1.y"].index]
    assert t0[0] % 2 == 0 and t0[1] == t0[0] + 1 and t1[1] == t1[0] + 1
    assert t0 == t1           # .temp vectors whose live ranges do not overlap share their registers
    name = {n: r.ptx_name for n, r in plan.items()}
    x, y, z, w = (name[f"q.{c}"] for c in "xyzw")
    ptx = result.ptx
    assert f"ld.global.v4.f32 {{{x}, {y}, {z}, {w}}}, [{name['ptr']}];" in ptx      # whole: its components
    assert f"st.global.v2.f32 [{name['ptr']}+32], {{{name['t0.y']}, {w}}};" in ptx  # .a is .w
    assert f"mov.f32 {z}, {name['t1.y']};" in ptx                                   # .g is .y
    assert f"add.f32 {name['u']}, {x}, {w};" in ptx       # a macro parameter bound to the vector


@needs_tools
@pytest.mark.toolchain
def test_named_vector_registers_assemble():
    from asmgemm.pipeline import assemble
    assert assemble(build_source(NAMED, "k.sasm")).cubin


def test_overlapping_temp_vectors_do_not_share():
    src = NAMED.replace("    add.f32 s, t0.x, t0.y;\n", "").replace(
        "    fma.rn.f32 s, t1.x, q.y, s;\n", "    fma.rn.f32 s, t1.x, q.y, t0.x;\n")
    plan = {r.name: r.index for r in build_source(src, "k.sasm").allocation.functions["k"].regs}
    assert {plan["t0.x"], plan["t0.y"]}.isdisjoint({plan["t1.x"], plan["t1.y"]})


@pytest.mark.parametrize("decl,message", [
    ("    .regs .v4 .v2 .f32 q\n", "takes one register type, optionally after .v2 or .v4"),
    ("    .regs .b32 .f32 q\n", "takes one register type, optionally after .v2 or .v4"),
    ("    .regs .v4 .f32 q : vec4\n", "a .v4 register is already a vector group: drop vec4"),
    ("    .regs .v4 .f32 q : bank(1)\n", "bank()/banks() do not apply to a .v4 register"),
    ("    .regs .v4 .pred q\n", "predicate registers have no banks or vectors"),
    ("    .regs .v4 .f32 q\n    .regs .f32 q\n", "register 'q' is already declared"),
    ("    .regs .f32 q\n    .regs .v4 .f32 q\n", "register 'q' is already declared"),
    ("    .regs .v4 .f32 q\n    .reg .f32 q;\n", "register 'q' is declared twice"),
    ("    .reg .f32 q;\n    .regs .v4 .f32 q\n", "register 'q' is declared twice"),
])
def test_named_vector_declaration_errors(decl, message):
    with pytest.raises(AsmError) as e:
        build_source(NAMED.replace("    .regs .v4 .f32 q\n", decl), "k.sasm")
    assert message in e.value.message, e.value.message
    assert e.value.span is not None and e.value.span.line in (NAMED_DECL_LINE, NAMED_DECL_LINE + 1)


def test_named_vector_component_errors():
    with pytest.raises(AsmError) as e:
        build_source(NAMED.replace("mov.f32 q.z, t1.g;", "mov.f32 q.z, t1.z;"), "k.sasm")
    assert e.value.message == "'t1.z': 't1' is a .v2 register, so it has no .z" and e.value.span.line == 18
    with pytest.raises(AsmError) as e:
        build_source(NAMED.replace("SUM(u, q)", "SUM(u, t0)"), "k.sasm")
    assert "'v.w': 'v' is a vector of 2 elements, so it has no .w" in e.value.message


# ---- 3. '!' on predicates declared without '%' ------------------------------------------------------
PREDICATES = """.version 8.7
.target {target}
.address_size 64

.visible .entry preds(.param .u64 preds_a)
{{
	.reg .pred p, q, done;
	.reg .pred %pp<3>;
	.reg .b32 r, t, %r<3>;
	.reg .u64 a;

	ld.param.u64 a, [preds_a];
	ld.global.u32 r, [a];
	ld.global.u32 t, [a+4];
	setp.ne.u32 p, r, 0;
	setp.eq.and.u32 q, t, 1, !p;
	setp.lt.or.u32 %pp1, r, t, !q;
	vote.sync.any.pred done, !p, 0xffffffff;
	vote.sync.all.pred %pp2, !q, 0xffffffff;
	setp.gt.u32 p|q, r, t;
	selp.b32 %r1, r, t, !done;
	and.pred done, done, %pp1;
	or.pred done, done, %pp2;
	@!done bra.uni SKIP;
	st.global.u32 [a+8], %r1;
SKIP:
	@q st.global.u32 [a+12], r;
	@!p st.global.u32 [a+16], t;
	ret;
}}
"""


def test_negated_plain_predicates_are_registers():
    result = build_source(PREDICATES.format(target="sm_90"), "preds.ptx")
    fn = next(result.expanded.functions())
    setp = [i for i in fn.instructions() if i.opcode == "setp.eq.and.u32"][0]
    assert setp.operands[-1] == ir.Reg("p", negated=True)
    vote = [i for i in fn.instructions() if i.opcode == "vote.sync.any.pred"][0]
    assert vote.operands[:2] == [ir.Reg("done"), ir.Reg("p", negated=True)]
    pair = [i for i in fn.instructions() if i.opcode == "setp.gt.u32"][0]
    assert pair.operands[0] == ir.Pair(ir.Reg("p"), ir.Reg("q"))


@pytest.mark.toolchain
@needs_tools
@pytest.mark.parametrize("target", ["sm_90", "sm_120"])
def test_negated_plain_predicates_round_trip(target):
    if not _assembles(target):
        pytest.skip(f"this ptxas does not assemble {target}")
    text = PREDICATES.format(target=target)
    result = build_source(text, "preds.ptx")
    assert_same_machine_code(text, result.ptx, target, f"preds ({target})")


def test_build_says_when_a_target_is_unmodelled(run_cli, tmp_path):
    """`asmgemm build` of sm_120 PTX writes it and says the bank/latency model does not cover it;
    a modelled target says nothing."""
    corpus = Path(__file__).parent / "corpus" / "ptx"
    code, _, err = run_cli("build", corpus / "fp8_video_sm120.ptx", "-o", tmp_path / "a.ptx")
    assert code == 0 and "note: sm_120: sm_120 is unmodelled" in err and (tmp_path / "a.ptx").is_file()
    code, out, _ = run_cli("build", corpus / "fp8_video_sm120.ptx", "-o", tmp_path / "b.ptx", "--json")
    assert code == 0 and "unmodelled" in json.loads(out)["note"]
    code, _, err = run_cli("build", corpus / "reduce_shfl.ptx", "-o", tmp_path / "c.ptx")
    assert code == 0 and "note:" not in err
