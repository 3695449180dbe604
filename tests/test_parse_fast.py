"""The fast path (asmgemm/parse_fast.py) builds exactly what the grammar path builds.

Over every corpus file, the golden plain PTX, the shipped `.sasm` kernels and generated throughput
input, the fast path must be taken (for most lines) and its AST must equal the grammar path's,
spans included. Over mutants of the corpus and of the kernels (lines dropped, duplicated, swapped;
block-comment, brace, initialiser, `.pin`, macro-layer and semicolon debris inserted), both paths
give the same AST or the same located error, the fast path's found without the grammar path. Plus
the places where a line looks like a statement and is not one.
"""
from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

import asmgemm.parse_fast as parse_fast
from asmgemm import ast
from asmgemm.errors import AsmError
from asmgemm.expand import expand
from asmgemm.files import read_source
from asmgemm.isa.arch import required_features
from asmgemm.parse import parse_source
from asmgemm.parse_tree import statement_parser
from asmgemm.pipeline import _feature_sample, build_file, shipped_kernels
from asmgemm.source import SourceFile
from sweeps import sample_every

HERE = Path(__file__).parent
CORPUS = sorted((HERE / "corpus" / "ptx").glob("*.ptx"))
PLAIN = CORPUS + [HERE / "golden" / "ptx" / "plain_ptx.ptx"]
# The shipped sources and their include files (kernels_ptx/hgemm/ too) that hold PTX lines: a file
# of directives only (constants and `.error` checks: hgemm/config.inc, hgemm/guards.inc,
# epilogue_guards.inc) gives the fast path nothing to do, so the whole of it goes to the grammar.
_PTX_LINE = re.compile(r"^\s*[@a-z_]", re.MULTILINE)
KERNELS = [p for p in sorted(shipped_kernels().values()) + sorted(next(iter(shipped_kernels().values())).parent.rglob("*.inc"))
           if _PTX_LINE.search(p.read_text())]


def grammar_path(source: SourceFile) -> ast.Module:
    """parse_source with the fast path switched off."""
    saved = parse_fast.parse
    parse_fast.parse = lambda s: None
    try:
        return parse_source(source)
    finally:
        parse_fast.parse = saved


def outcome(fn, source: SourceFile):
    try:
        return fn(source)
    except AsmError as exc:
        return ("error", str(exc), exc.span.start if exc.span else None)


def flat(body: list) -> list:
    out = []
    for s in body:
        out.append(s)
        if isinstance(s, (ast.Function, ast.Scope)) and s.body:
            out.extend(flat(s.body))
    return out


def assert_same(fast: ast.Module, slow: ast.Module, name: str):
    if fast == slow:
        return
    for a, b in zip(flat(fast.body), flat(slow.body)):
        assert a == b, f"{name}: first difference\nfast: {a}\ngrammar: {b}"
    assert fast == slow, f"{name}: the statement lists differ in length"


def _generated() -> SourceFile:
    sys.path.insert(0, str(HERE.parent / "tools"))
    try:
        import ptx_throughput
    finally:
        sys.path.pop(0)
    return SourceFile.from_text("generated.ptx", ptx_throughput.generate(150_000))


def fast_path(source: SourceFile):
    """parse_fast.parse, and whether it located an error itself: (AST or error tuple, or None)."""
    return outcome(parse_fast.parse, source)


@pytest.mark.parametrize("path", PLAIN + KERNELS, ids=[p.name for p in PLAIN + KERNELS])
def test_fast_path_builds_the_grammars_ast(path: Path):
    src = read_source(path)
    fast = parse_fast.parse(src)
    assert fast is not None, f"{path.name}: the fast path fell back to the grammar for the whole file"
    assert_same(fast, grammar_path(src), path.name)
    # and it really did the work: most statements come from the fast path, not the skeleton
    counted = _recognised(src)
    assert counted >= 0.5 * sum(1 for s in flat(fast.body) if isinstance(s, (ast.Instr, ast.Label, ast.Decl))), \
        f"{path.name}: only {counted} lines recognised"


def _recognised(src: SourceFile) -> int:
    n = 0
    for m in parse_fast._LINE.finditer(src.text):
        try:
            parse_fast._node(m, src)
            n += 1
        except parse_fast._Unrecognised:
            pass
    return n


def test_generated_throughput_input():
    src = _generated()
    fast = parse_fast.parse(src)
    assert fast is not None
    assert_same(fast, grammar_path(src), "generated")


# ---- mutants -----------------------------------------------------------------------------------
DEBRIS = ["/*", "*/", "{", "}", ";", ".pin", "= {1,", "//", "\"", "[", "]", "(", ")", "@%p1", ".loc 1 2 3",
          "$L__x:", ".reg .b32 %q<2>;", "ret;", "%tid.x", "q.x", "!%p1", ".section .x {", ".const .b8 c[2] = {1,"]
MUTANT_FILES = ["globals_init.ptx", "cp_async_copy.ptx", "misc_ops_lineinfo.ptx", "debug_G.ptx", "device_call.ptx"]


def mutants(text: str, seed: int, count: int):
    rng = random.Random(seed)
    lines = text.split("\n")
    for _ in range(count):
        ls = list(lines)
        kind = rng.randrange(5)
        i = rng.randrange(len(ls))
        if kind == 0:
            del ls[i]
        elif kind == 1:
            ls.insert(i, ls[i])
        elif kind == 2 and i + 1 < len(ls):
            ls[i], ls[i + 1] = ls[i + 1], ls[i]
        elif kind == 3:
            ls.insert(i, rng.choice(DEBRIS))
        else:
            line = ls[i]
            at = rng.randrange(len(line) + 1)
            ls[i] = line[:at] + rng.choice(DEBRIS) + line[at:]
        yield "\n".join(ls)


def _agree(src: SourceFile, label: str) -> bool:
    """Both paths give the same AST or the same located error; True when the fast path gave it."""
    expected = outcome(grammar_path, src)
    fast = fast_path(src)
    if fast is not None:
        if isinstance(fast, tuple) or isinstance(expected, tuple):
            assert fast == expected, f"{label}: fast path {fast!r}\ngrammar {expected!r}"
        else:
            assert_same(fast, expected, label)
    assert outcome(parse_source, src) == expected, label
    return fast is not None


@pytest.mark.parametrize("name", sample_every(5, MUTANT_FILES))
def test_mutants_agree(name: str):
    text = (HERE / "corpus" / "ptx" / name).read_text()
    taken = sum(_agree(SourceFile.from_text(name, mutant), f"{name} mutant {k}")
                for k, mutant in enumerate(mutants(text, seed=sum(map(ord, name)), count=30)))
    assert taken, "no mutant went through the fast path: the test no longer tests it"


SASM_DEBRIS = [".endm", ".endfor", ".endif", ".else", ".for i in range(2)", ".if 1", ".macro M(x)", "M(1)",
               ".regs .f32 q", ".schedule", ".endschedule", ".const Z = 1", "{i}", ".include \"x.inc\"",
               ".error \"e\"", "{a, b}", "{or}"]


@pytest.mark.parametrize("path", sample_every(15, KERNELS), ids=[p.name for p in KERNELS])
def test_kernel_mutants_agree(path: Path):
    """The macro layer: recognised lines inside macros, loops, branches and schedule regions, and
    errors in and around them."""
    text = path.read_text()
    global DEBRIS
    saved = DEBRIS
    DEBRIS = saved + SASM_DEBRIS
    try:
        found = list(mutants(text, seed=sum(map(ord, path.name)), count=12))
    finally:
        DEBRIS = saved
    taken = sum(_agree(SourceFile.from_text(path.name, mutant), f"{path.name} mutant {k}")
                for k, mutant in enumerate(found))
    assert taken, "no mutant went through the fast path: the test no longer tests it"


# ---- lines that look like statements and are not ---------------------------------------------
TOP = ".version 9.0\n.target sm_90\n.address_size 64\n"
HEAD = TOP + ".visible .entry k()\n{\n\t.reg .b32 %r<4>;\n"
TRICKY = {
    "in a block comment": HEAD + "\t/*\n\tadd.s32 %r1, %r2, %r3;\n\t*/\n\tret;\n}\n",
    "comment closed on an instruction line": HEAD + "\t/* a\n\tadd.s32 %r1, %r2, %r3; // */\n\tret;\n}\n",
    "after .pin": HEAD + "\t.pin\n\tadd.s32 %r1, %r2, %r3;\n\tret;\n}\n",
    "in an initialiser": TOP + ".global .b8 g[2] = {1,\nadd.s32 %r1, %r2, %r3;\n2};\n",
    "in a section": HEAD + "\tret;\n}\n.section .debug_str {\n$L__x:\n.b8 0\n}\n",
    "a .loc with a comment": HEAD + "\t.loc 1 2 3 // x\n\tret;\n}\n",
    "a statement left open": HEAD + "\tadd.s32 %r1, %r2, %r3\n\tret;\n}\n",
    "vector component": HEAD + "\tmov.u32 %r1, %tid.x;\n\tret;\n}\n",
    "negated predicate": HEAD + "\t.reg .pred p;\n\t@!p bra $L;\n$L:\n\tret;\n}\n",
    "top-level instruction": TOP + "add.s32 %r1, %r2, %r3;\n",
    "a label inside a brace operand": HEAD + "\tmov.b64 %r1, {\n$L__y:\n};\n\tret;\n}\n",
    "unclosed function": HEAD + "\tret;\n",
    "vector component without %": HEAD + "\t.reg .v4 .b32 q;\n\tmov.b32 %r1, q.x;\n\tmov.b32 q.y, %r1;\n\tret;\n}\n",
    "one-line function": TOP + ".visible .entry k() .maxntid 32, 1, 1 { ret; }\n",
    "comment in a header": TOP + ".visible .entry k( // p\n\t.param .u64 p\n)\n"
                           "{\n\tret;\n}\n",
    "header in a block comment": TOP + "/*\n.visible .entry k()\n*/\n"
                                 ".visible .entry j()\n{\n\tret;\n}\n",
    "header without body": TOP + ".visible .entry k()\n{\n\tret;\n",
    "prototype": TOP + ".extern .func (.param .b32 r) f\n(\n\t.param .b64 a\n)\n;\n",
    "empty return list": TOP + ".func () f()\n{\n\tret;\n}\n",
}


@pytest.mark.parametrize("case", TRICKY)
def test_tricky_lines(case: str):
    _agree(SourceFile.from_text("t.ptx", TRICKY[case]), case)


def test_a_refused_line_does_not_send_the_whole_file_to_the_grammar():
    """A label in a `.section` body is left to the grammar; the file's instructions are not."""
    src = read_source(HERE / "corpus" / "ptx" / "misc_ops_lineinfo.ptx")
    assert parse_fast.parse(src) is not None


# ---- the target choice samples instructions ----------------------------------------------------
@pytest.mark.parametrize("path", CORPUS + sorted(shipped_kernels().values()), ids=lambda p: p.name)
def test_feature_sample_finds_what_the_whole_module_uses(path: Path):
    module = expand(parse_source(read_source(path))).module
    assert required_features(_feature_sample(module)) == required_features(module)


def test_build_of_plain_ptx_equals_grammar_build(tmp_path):
    """End to end: the PTX built with the fast path is the PTX built without it."""
    for path in CORPUS:
        fast = build_file(str(path)).ptx
        saved = parse_fast.parse
        parse_fast.parse = lambda s: None
        try:
            slow = build_file(str(path)).ptx
        finally:
            parse_fast.parse = saved
        assert fast == slow, path.name


def test_keyword_patterns_are_the_grammars():
    """The fast path's copies of grammar terminals (it needs them before Lark is built) are the
    grammar's own; if the grammar changes one, this says which to follow."""
    terminals = {t.name: t.pattern.to_regexp() for t in statement_parser().terminals}
    assert parse_fast._FUNC_KIND == terminals["FUNC_KIND"]
    assert parse_fast._PERF_KW == terminals["PERF_KW"]
    assert parse_fast._PERF_FLAG_KW == terminals["PERF_FLAG_KW"]
    assert parse_fast._NUMBER == terminals["NUMBER"].replace("([eE]", "(?:[eE]")


@pytest.mark.parametrize("shape", ["\t{x}\n", "\tadd{s}x\n", "\ta{d}\n", "\tld.u32 %r1, [%r2+{s}x];\n",
                                   ".visible .entry k{n}x\n", "\t.reg{b}\n", "\tmov.u32 %r1,{s}{x};\n"])
def test_hostile_lines_cost_linear_time(shape: str):
    """A 60,000-character line of any of these shapes is recognised or refused in linear time
    (regular expressions with two quantifiers over the same characters take minutes on them)."""
    import time

    n = 60_000
    line = shape.format(x="a" * n, s=" " * n, d=".b" * (n // 2), n=" \n" * (n // 2), b=" .b32" * (n // 5))
    src = SourceFile.from_text("h.ptx", TOP + ".visible .entry k()\n{\n"
                               + line + "\tret;\n}\n")
    t0 = time.process_time()
    outcome(parse_source, src)
    assert time.process_time() - t0 < 3.0


def test_function_body_keeps_its_recognised_lines_by_position_only():
    # A large source's function body is almost all recognised lines: their nodes are built when
    # the body is read and not kept (parse_fast.Statements), so its AST is never whole at once.
    text = (".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 p)\n{\n"
            "    .reg .b32 %r<4>;\n    .reg .u64 %rd<2>;\n    ld.param.u64 %rd1, [p];\nL0:\n"
            "    add.u32 %r1, %r2, 3;\n    { mov.b32 %r3, %r1; }\n    @%p1 bra L0;\n    ret;\n}\n")
    src = SourceFile.from_text("k.ptx", text)
    fn = next(s for s in parse_fast.parse(src).body if isinstance(s, ast.Function))
    body = fn.body
    assert type(body) is parse_fast.Statements
    assert [type(s) for s in body.grammar_nodes] == [ast.Scope]       # the `{ }` only
    first, again = list(body), list(body)
    assert first == again and all(a is not b for a, b in zip(first, again) if type(a) is not ast.Scope)
    assert len(body) == 8 and body[3] == first[3] and body[2:5] == first[2:5] and body[-1] == first[-1]
    # the same statements as the grammar path builds, in order
    assert body == grammar_path(src).body[3].body


def test_parse_source_keeps_a_repeated_sources_ast_per_thread_and_fast_path():
    """parse_source's memo (asmgemm/parse.py): the same path and text give the same AST in one
    thread; another thread, the fast path switched off, another path or a failed parse do not
    share it, and a source over _MEMO_MAX_CHARS is parsed anew."""
    import threading

    import asmgemm.parse as parse_mod
    text = ".visible .entry k()\n{\n    .regs .f32 a, b\n    add.f32 a, a, b;\n    ret;\n}\n"
    first = parse_source(SourceFile.from_text("memo.sasm", text))
    assert parse_source(SourceFile.from_text("memo.sasm", text)) is first
    assert parse_source(SourceFile.from_text("other.sasm", text)) is not first
    grammar = grammar_path(SourceFile.from_text("memo.sasm", text))
    assert grammar is not first and grammar == first
    other = []
    t = threading.Thread(target=lambda: other.append(parse_source(SourceFile.from_text("memo.sasm", text))))
    t.start()
    t.join()
    assert other[0] is not first and other[0] == first
    bad = SourceFile.from_text("bad.sasm", ".visible .entry k()\n{\n    add.f32 a, ;\n")
    for _ in range(2):
        with pytest.raises(AsmError):
            parse_source(bad)
    assert not any(key[0] == "bad.sasm" for key in parse_mod._MEMO)
    big = SourceFile.from_text("big.sasm", text + ("// " + "x" * 1000 + "\n") * (parse_mod._MEMO_MAX_CHARS // 1000))
    assert parse_source(big) is not parse_source(big)
