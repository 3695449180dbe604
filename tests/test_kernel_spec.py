"""Kernel specs (asmgemm/kernel_spec.py, kernels_ptx/kernels.toml): loading, checking, the size rule,
the registry. CPU only."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from asmgemm import kernel_spec
from asmgemm.errors import AsmError
from asmgemm.kernel_spec import get_spec, load_spec_file

TINY = Path(__file__).parent / "data" / "tiny_gemm"

GOOD = """
[k]
source = "k.sasm"
dtypes = { a = "float32", b = "float32", acc = "float32", c = "float32" }
targets = ["sm_90"]
abi = ["A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta"]
rel_err_limit = 1e-4
launch = { threads = "T", tile_m = "TM", tile_n = "TN", smem_bytes = "S" }
"""


def write_spec(tmp_path, text, name="specs.toml"):
    (tmp_path / "k.sasm").write_text("// k\n")
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_the_shipped_sgemm_spec():
    s = get_spec("sgemm")
    assert s.source.name == "sgemm.sasm" and s.source.is_file() and s.entry == "sgemm"
    assert (s.dtypes.a, s.dtypes.acc, s.dtypes.c) == ("float32", "float32", "float32")
    assert s.abi == ("A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta", "bias", "batch_stride_a",
                     "batch_stride_b", "batch_stride_c", "k_chunk", "split_stride", "workspace", "tile_counters")
    assert dict(s.call_params) == {"TRANS_A": "trans_a", "TRANS_B": "trans_b", "VEC_A": "vec_a", "VEC_B": "vec_b",
                                   "BIAS": "bias", "ACT": "activation", "BATCHED": "batched"}
    assert s.call_value_param("activation") == "ACT"
    assert s.rel_err_limit == 1e-4 and s.build_target("sm_90") == "sm_90"
    assert get_spec("sgemm.sasm") is s


def test_build_target_takes_the_a_variant_for_its_base_device(tmp_path):
    p = write_spec(tmp_path, GOOD.replace('targets = ["sm_90"]', 'targets = ["sm_90a"]'))
    (spec,) = load_spec_file(p)
    assert spec.build_target("sm_90") == "sm_90a" and spec.build_target("sm_80") is None


def test_size_rule_first_match_wins(tmp_path):
    p = write_spec(tmp_path, GOOD + """
[[k.size_rule]]
when = "M * N <= 64 * SMS"
set = { T = 64 }
[[k.size_rule]]
when = "K % 16 == 0"
set = { T = 128, BK = 16 }
""")
    (spec,) = load_spec_file(p)
    assert spec.size_rule(8, 8, 32, 132) == {"T": 64}
    assert spec.size_rule(4096, 4096, 32, 132) == {"T": 128, "BK": 16}
    assert spec.size_rule(4096, 4096, 33, 132) == {}


def test_size_rules_see_the_call_parameters(tmp_path):
    """A rule may name the kernel's call parameters (a fused activation can favour another tile);
    those a caller does not give count as 0, and a name that is neither a size nor a call
    parameter fails when the spec loads."""
    p = write_spec(tmp_path, GOOD.replace('rel_err_limit', 'call_params = { ACT = "activation" }\nrel_err_limit') + """
[[k.size_rule]]
when = "M >= 1024 and ACT == 0"
set = { T = 256 }
""")
    (spec,) = load_spec_file(p)
    assert spec.size_rule(2048, 64, 64, 132) == {"T": 256} == spec.size_rule(2048, 64, 64, 132, {"ACT": 0})
    assert spec.size_rule(2048, 64, 64, 132, {"ACT": 2}) == {}
    bad = write_spec(tmp_path, GOOD + '\n[[k.size_rule]]\nwhen = "ACT == 0"\nset = { T = 1 }\n', name="bad.toml")
    with pytest.raises(AsmError, match="undefined name 'ACT'"):
        load_spec_file(bad)


def test_size_rules_see_the_gpus_dram_rate(tmp_path):
    """DRAM_PER_SM_CYCLE: the caller's GPU's (DeviceFacts.dram_per_sm_cycle), the H100's 12 where it
    gives none; a name of its own, which a term may not take."""
    p = write_spec(tmp_path, GOOD + """
[[k.size_rule]]
when = "DRAM_PER_SM_CYCLE < 15"
set = { T = 64 }
""")
    (spec,) = load_spec_file(p)
    assert spec.size_rule(64, 64, 64, 132) == {"T": 64} == spec.size_rule(64, 64, 64, 132, dram_per_sm_cycle=12)
    assert spec.size_rule(64, 64, 64, 132, dram_per_sm_cycle=18) == {}
    bad = write_spec(tmp_path, GOOD + '\n[k.terms]\nDRAM_PER_SM_CYCLE = "SMS"\n', name="bad.toml")
    with pytest.raises(AsmError, match="DRAM_PER_SM_CYCLE"):
        load_spec_file(bad)


def test_the_shipped_sgemm_is_dispatched_by_its_catalog():
    """sgemm's tilings, its decoding kernel and its split-K counts are catalog entries ranked by the
    cost model (tests/test_dispatch.py), not size, route or split rules; the skinny entries build
    sgemm_skinny for a few rows, and to_json shows the catalog."""
    s = get_spec("sgemm")
    assert s.configs and s.size_rules == () and s.routes == () and s.split_k.rules == ()
    names = [c.name for c in s.configs]
    assert len(set(names)) == len(names) and "t128x128_k8" in names
    assert {c.kernel for c in s.configs} == {"sgemm", "sgemm_skinny"}
    assert all(c.max_m is not None for c in s.configs if c.kernel == "sgemm_skinny")
    shown = s.to_json()["configs"]
    assert [c["name"] for c in shown] == names and all(1 in c["splits"] for c in shown)


@pytest.mark.parametrize("change, message", [
    (('source = "k.sasm"', 'source = "missing.sasm"'), "no such file"),
    (('rel_err_limit = 1e-4', 'rel_err_limit = 1e-4\ntile = 3'), "unknown key 'tile'"),
    (('targets = ["sm_90"]\n', ''), "needs 'targets'"),
    (('"float32", c', '"float128", c'), "'float128' is not one of"),
    (('"alpha", "beta"]', '"alpha", "gamma"]'), "'gamma' is not an argument"),
    (('"alpha", "beta"]', '"alpha", "alpha"]'), "listed twice"),
    (('targets = ["sm_90"]', 'targets = ["sm_99"]'), "'sm_99' is not a supported target"),
    (('smem_bytes = "S" }', 'smem_bytes = "S", grid = "spiral" }'), "launch.grid"),
    (('rel_err_limit = 1e-4', 'rel_err_limit = 2'), "rel_err_limit"),
    (('[k]', '[k]\ncall_params = { TRANS_A = "sideways" }'), "not a call value"),
])
def test_a_bad_spec_is_named_with_its_file_and_kernel(tmp_path, change, message):
    p = write_spec(tmp_path, GOOD.replace(*change))
    with pytest.raises(AsmError, match=message) as err:
        load_spec_file(p)
    assert str(p) in err.value.message and "[k]" in err.value.message


def test_a_size_rule_expression_error_points_into_the_toml(tmp_path):
    p = write_spec(tmp_path, GOOD + '\n[[k.size_rule]]\nwhen = "M * N <="\nset = { T = 1 }\n')
    with pytest.raises(AsmError) as err:
        load_spec_file(p)
    text = err.value.format()
    line = GOOD.count("\n") + 3
    assert f"{p}:{line}:" in text and "^" in text


def test_a_size_rule_with_an_unknown_name_fails_at_load(tmp_path):
    p = write_spec(tmp_path, GOOD + '\n[[k.size_rule]]\nwhen = "TILES > 4"\nset = { T = 1 }\n')
    with pytest.raises(AsmError, match="undefined name 'TILES'.*known: M, N, K, SMS"):
        load_spec_file(p)



def _caret_line(err: AsmError, path) -> int:
    """The line number of `path:LINE:COL: error` in a formatted error."""
    head = err.format().splitlines()[0]
    assert head.startswith(f"{path}:"), head
    return int(head[len(str(path)) + 1:].split(":")[0])


def test_an_expression_error_points_at_its_own_line_not_the_first_same_text(tmp_path):
    """A route does not see the terms; the same `when` text above, in a size rule, is fine. The
    error points at the route's line (it pointed at the first place the text occurs in the file)."""
    spec = GOOD + textwrap.dedent("""\
        [k.terms]
        TILES = "M * N"
        [[k.size_rule]]
        when = "TILES > 4"
        set = { T = 1 }
        [[k.route]]
        when = "TILES > 4"
        kernel = "other"
        """)
    p = write_spec(tmp_path, spec)
    with pytest.raises(AsmError, match="undefined name 'TILES'") as err:
        load_spec_file(p)
    lines = spec.splitlines()
    route_when = lines.index("[[k.route]]") + 2
    assert _caret_line(err.value, p) == route_when
    assert err.value.format().splitlines()[1].strip() == 'when = "TILES > 4"'


def test_a_syntax_error_points_at_its_own_rule_when_its_text_starts_an_earlier_one(tmp_path):
    spec = GOOD + textwrap.dedent("""\
        [[k.split_k.rule]]
        when = "M <= 64 * 2"
        splits = "2"
        [[k.split_k.rule]]
        when = "M <= 64 *"
        splits = "2"
        """)
    spec = spec.replace("[[k.split_k.rule]]", "[[k.size_rule]]").replace('splits = "2"', "set = { T = 1 }")
    p = write_spec(tmp_path, spec)
    with pytest.raises(AsmError) as err:
        load_spec_file(p)
    assert _caret_line(err.value, p) == spec.splitlines().index('when = "M <= 64 *"') + 1


def test_the_split_k_rules_and_terms_point_at_their_own_keys(tmp_path):
    """Each expression of a spec is located by its key: a term, a split rule's `splits` and `cost`,
    cluster_when; the same text earlier in the file (here in a comment) does not mislead it."""
    (tmp_path / "r.sasm").write_text("// r\n")
    base = GOOD.replace('abi = ["A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta"]',
                        'abi = ["A", "B", "C", "M", "N", "K", "lda", "ldb", "ldc", "alpha", "beta", "k_chunk", '
                        '"split_stride"]')
    cases = {
        "terms": '[k.terms]\nA = "M"\nB = "min(K, )"\n',
        "splits": '[k.split_k]\nswitch = "SPLIT"\nreduce = "r.sasm"\n[[k.split_k.rule]]\nwhen = "M > 1"\n'
                  'splits = "min(K, )"\n',
        "cost": '[k.split_k]\nswitch = "SPLIT"\nreduce = "r.sasm"\n[[k.split_k.rule]]\nwhen = "M > 1"\n'
                'splits = [1, 2]\ncost = "min(K, )"\n',
        "cluster_when": '[k.split_k]\nswitch = "SPLIT"\nreduce = "r.sasm"\ncluster_switch = "CK"\n'
                        'cluster_when = "min(K, )"\n',
    }
    for what, table in cases.items():
        spec = '# an old try: "min(K, )"\n' + base + table
        p = write_spec(tmp_path, spec)
        with pytest.raises(AsmError) as err:
            load_spec_file(p)
        want = next(i for i, line in enumerate(spec.splitlines(), 1) if line.endswith('"min(K, )"') and i > 1)
        assert _caret_line(err.value, p) == want, what


def test_an_expression_in_an_inline_table_is_found_in_its_kernel_table(tmp_path):
    """An inline array of tables, which the line scanner does not follow: the quoted text is looked
    for from the kernel table's header on, not from the top of the file."""
    spec = '# an old try: "M <= 64 *"\n' + GOOD + 'route = [{ when = "M <= 64 *", kernel = "other" }]\n'
    p = write_spec(tmp_path, spec)
    with pytest.raises(AsmError) as err:
        load_spec_file(p)
    assert _caret_line(err.value, p) == len(spec.splitlines())


def test_an_expression_that_cannot_be_placed_names_its_key(tmp_path):
    """A TOML escape makes the value differ from its text in the file: the error names the table
    and key, with the expression as its own line, rather than guess a place."""
    p = write_spec(tmp_path, GOOD + '[[k.size_rule]]\nwhen = "M <=\\u0020"\nset = { T = 1 }\n')
    with pytest.raises(AsmError) as err:
        load_spec_file(p)
    text = err.value.format()
    assert text.startswith(f"{p} [k] size_rule[0].when:1:") and "M <= " in text and "^" in text

TERMS = """
[k.terms]
TILES = "ceil_div(M, 128) * ceil_div(N, 128)"
WAVES = "ceil_div(TILES, SMS)"
[[k.size_rule]]
when = "WAVES == 1 and 2 * TILES > SMS and C_BYTES == 4"
set = { T = 64 }
[[k.size_rule]]
when = "WAVES >= 2"
set = { T = 128 }
"""


def test_terms_name_subexpressions_of_the_size_rules(tmp_path):
    """[NAME.terms]: each a name over what a size rule sees and the terms above it, evaluated per
    launch; `like` inherits them with the rules."""
    (k, k2) = load_spec_file(write_spec(tmp_path, GOOD + TERMS + '\n[k2]\nlike = "k"\n'))
    assert [t.name for t in k.terms] == ["TILES", "WAVES"] and k2.terms == k.terms
    assert k.size_rule(1152, 1024, 64, 132) == {"T": 64}           # 72 tiles: one wave, more than half
    assert k.size_rule(512, 512, 64, 132) == {}                     # 16 tiles
    assert k.size_rule(4096, 4096, 64, 132) == {"T": 128}           # 1024 tiles: 8 waves
    assert k.to_json()["terms"] == {"TILES": "ceil_div(M, 128) * ceil_div(N, 128)", "WAVES": "ceil_div(TILES, SMS)"}


@pytest.mark.parametrize("terms,message", [
    ('A = "WAVES + 1"\nWAVES = "M"', "undefined name 'WAVES' in the term A"),       # a later term
    ('T = "ceil_div(M, 64) *"', "expected"),
    ('K = "M"', "terms.K: already a name the size rules see"),
    ('C_BYTES = "4"', "terms.C_BYTES: already a name"),
    ('tiles = "M"', "an upper-case identifier"),
    ('T = 3', "terms.T"),
])
def test_a_bad_term_fails_at_load(tmp_path, terms, message):
    p = write_spec(tmp_path, GOOD + "[k.terms]\n" + terms + "\n")
    with pytest.raises(AsmError, match=message):
        load_spec_file(p)


def test_a_size_rule_naming_no_term_fails_at_load(tmp_path):
    p = write_spec(tmp_path, GOOD + '[k.terms]\nTILES = "M * N"\n[[k.size_rule]]\nwhen = "TILE > 4"\nset = { T = 1 }\n')
    with pytest.raises(AsmError, match="undefined name 'TILE'.*TILES"):
        load_spec_file(p)


def test_not_toml_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text("[k\n")
    with pytest.raises(AsmError, match="not valid TOML"):
        load_spec_file(p)


def test_spec_files_from_the_environment(monkeypatch):
    with pytest.raises(AsmError, match="'tiny_dgemm' is not a GEMM kernel"):
        get_spec("tiny_dgemm")
    monkeypatch.setenv(kernel_spec.SPECS_ENV, str(TINY / "tiny_dgemm.toml"))
    spec = get_spec("tiny_dgemm")
    assert spec.source == TINY / "tiny_dgemm.sasm" and spec.dtypes.a == "float64"
    assert kernel_spec.spec_for_dtype("float64", "sm_90") is spec
    assert kernel_spec.spec_for_dtype("float32", "sm_90").name == "sgemm"
    with pytest.raises(AsmError, match="no float64 GEMM kernel supports sm_75"):
        kernel_spec.spec_for_dtype("float64", "sm_75")


def test_a_kernel_defined_twice_is_an_error(monkeypatch, tmp_path):
    p = write_spec(tmp_path, GOOD.replace("[k]", "[sgemm]"))
    monkeypatch.setenv(kernel_spec.SPECS_ENV, str(p))
    with pytest.raises(AsmError, match="kernel 'sgemm' is already defined"):
        kernel_spec.all_specs()


def test_register_and_unregister(tmp_path):
    (spec,) = load_spec_file(write_spec(tmp_path, GOOD))
    kernel_spec.register(spec)
    try:
        assert get_spec("k") is spec
    finally:
        kernel_spec.unregister("k")
    with pytest.raises(AsmError):
        get_spec("k")


def test_unsupported_dtype_names_the_known_ones():
    with pytest.raises(AsmError, match="unsupported dtype int8: asmgemm has GEMM kernels for bfloat16, float16, float32"):
        kernel_spec.spec_for_dtype("int8")


def test_like_starts_from_a_table_above(tmp_path):
    """`like` copies the named table's keys (its entry too); the table's own keys replace whole keys."""
    p = write_spec(tmp_path, GOOD + """
[[k.size_rule]]
when = "M < 64"
set = { TM = 32 }

[k2]
like = "k"
dtypes = { a = "float64", b = "float64", acc = "float64", c = "float64" }
defines = { WIDE = 1 }
""")
    k, k2 = load_spec_file(p)
    assert k2.entry == "k" and k2.source == k.source and k2.abi == k.abi and k2.launch == k.launch
    assert k2.size_rules == k.size_rules and k2.dtypes.a == "float64" and dict(k2.defines) == {"WIDE": 1}
    assert k.dtypes.a == "float32" and k.defines == ()


@pytest.mark.parametrize("like", ['"nope"', '"k2"', '3'])
def test_like_names_a_table_above_or_fails(tmp_path, like):
    p = write_spec(tmp_path, GOOD + f"""
[k2]
like = {like}
""")
    with pytest.raises(AsmError, match=r"\[k2\] like: .* is not a kernel table defined above in this file"):
        load_spec_file(p)


def test_the_shipped_hopper_kernels_share_one_table():
    """bgemm, hgemm_f32c and bgemm_f32c are hgemm with other dtypes and defines: the same abi,
    launch and size rules."""
    h = get_spec("hgemm")
    for name in ("bgemm", "hgemm_f32c", "bgemm_f32c"):
        s = get_spec(name)
        assert (s.source, s.entry, s.abi, s.call_params, s.launch, s.size_rules) == \
            (h.source, h.entry, h.abi, h.call_params, h.launch, h.size_rules)


def test_the_shipped_hopper_kernels_name_their_in_place_kernels():
    """Each Hopper table names the portable kernel of its own dtypes `in_place` (the like-tables
    override hgemm's); the named kernels exist, share the dtypes and name none themselves."""
    want = {"hgemm": "hgemm_mma", "bgemm": "bgemm_mma", "hgemm_f32c": "hgemm_mma_f32c",
            "bgemm_f32c": "bgemm_mma_f32c"}
    for name, other in want.items():
        s = get_spec(name)
        assert s.in_place == other and s.to_json()["in_place"] == other
        o = get_spec(other)
        assert o.dtypes == s.dtypes and o.in_place is None
        assert o.source.name == "mma_gemm.sasm" and o.entry == "mma_gemm"
    assert get_spec("sgemm").in_place is None


def test_the_mma_kernels_share_one_table():
    """bgemm_mma, hgemm_mma_f32c and bgemm_mma_f32c are hgemm_mma with other dtypes and defines."""
    h = get_spec("hgemm_mma")
    assert h.targets == ("sm_80", "sm_86", "sm_89", "sm_90", "sm_120")
    assert dict(h.call_params)["ALIGN_A"] == "align_a" and dict(h.call_params)["ALIGN_B"] == "align_b"
    for name, defines in (("bgemm_mma", {"BF16": 1}), ("hgemm_mma_f32c", {"C_F32": 1}),
                          ("bgemm_mma_f32c", {"BF16": 1, "C_F32": 1})):
        s = get_spec(name)
        assert (s.source, s.entry, s.abi, s.call_params, s.launch, s.size_rules, s.targets) == \
            (h.source, h.entry, h.abi, h.call_params, h.launch, h.size_rules, h.targets)
        assert dict(s.defines) == defines


def test_in_place_is_read_and_inherited_by_like_unless_overridden(tmp_path):
    p = write_spec(tmp_path, GOOD + """in_place = "portable"

[k2]
like = "k"

[k3]
like = "k"
in_place = "other"

[portable]
like = "k"
in_place = "k"
""")
    k, k2, k3, portable = load_spec_file(p)
    assert (k.in_place, k2.in_place, k3.in_place, portable.in_place) == ("portable", "portable", "other", "k")
    (plain,) = load_spec_file(write_spec(tmp_path, GOOD, name="plain.toml"))
    assert plain.in_place is None and plain.to_json()["in_place"] is None


@pytest.mark.parametrize("value, message", [
    ('"k"', "in_place: 'k' is not another kernel's name"),
    ('"two words"', "in_place: 'two words' is not another kernel's name"),
    ('""', "in_place: a non-empty string"),
    ("3", "in_place"),
    ('["hgemm_mma"]', "in_place"),
])
def test_a_bad_in_place_is_an_error(tmp_path, value, message):
    p = write_spec(tmp_path, GOOD + f"in_place = {value}\n")
    with pytest.raises(AsmError, match=message) as err:
        load_spec_file(p)
    assert str(p) in err.value.message and "[k]" in err.value.message
