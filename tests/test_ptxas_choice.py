"""`.ptxas_alternative`: the directive's syntax and errors, ptxas_choice.choose on hand-made trials,
and the shipped sgemm builds assembled both ways by the real ptxas, judged by the SASS inspector:
the 128x128 cluster-sum build ships the alternative with a conflict-free loop, the 64x64 cp.async
nn build keeps ptxas's defaults (the alternative needs more registers and conflicts there)."""
from __future__ import annotations

import json

import pytest
from asmgemm.errors import AsmError
from asmgemm.pipeline import BuildOptions, assemble, build_file, build_source
from asmgemm.ptxas_choice import MARGIN, Trial, choose
from asmgemm.toolchain import find_tool

TOOLS = pytest.mark.skipif(find_tool("ptxas", required=False) is None or find_tool("nvdisasm", required=False) is None,
                           reason="needs ptxas and nvdisasm (pip install 'asmgemm[cuda-tools]')")

KERNEL = """.version 8.0
.target sm_90
.address_size 64
{directives}
.visible .entry k(.param .u64 p)
{{
    .regs .u64 q
    .regs .f32 a
    ld.param.u64 q, [p];
    mov.f32 a, 0f3F800000;
    st.global.f32 [q], a;
    ret;
}}
"""


def build(directives: str):
    return build_source(KERNEL.format(directives=directives), "k.sasm")


# ---- the directive --------------------------------------------------------------------------------
def test_the_directive_names_option_sets_in_source_order():
    got = build('.ptxas_alternative "--register-usage-level=0"\n'
                '.ptxas_alternative "--register-usage-level=3 --allow-expensive-optimizations=false"')
    assert got.ptxas_alternatives == (("--register-usage-level=0",),
                                      ("--register-usage-level=3", "--allow-expensive-optimizations=false"))
    assert build("").ptxas_alternatives == ()


def test_the_directive_follows_if_blocks():
    src = '.const ALT ?= 0\n.if ALT\n.ptxas_alternative "--register-usage-level=0"\n.endif'
    assert build_source(KERNEL.format(directives=src), "k.sasm", BuildOptions(defines={"ALT": "1"})).ptxas_alternatives
    assert build_source(KERNEL.format(directives=src), "k.sasm").ptxas_alternatives == ()


@pytest.mark.parametrize("line, message", [
    ('.ptxas_alternative "-o /tmp/x"', "'-o' is not an option it takes"),
    ('.ptxas_alternative "--register-usage-level=11"', "'--register-usage-level=11' is not an option"),
    ('.ptxas_alternative "--register-usage-level"', "'--register-usage-level' is not an option"),
    ('.ptxas_alternative "--allow-expensive-optimizations=maybe"', "is not an option it takes"),
    ('.ptxas_alternative ""', "names no options"),
])
def test_options_other_than_the_allocation_ones_are_refused_at_the_line(line, message):
    with pytest.raises(AsmError) as exc:
        build(line)
    assert message in exc.value.message
    assert exc.value.span is not None and exc.value.span.line == 4
    assert "k.sasm:4:1" in exc.value.format()


def test_a_repeated_option_set_is_an_error_with_the_first_as_a_note():
    with pytest.raises(AsmError) as exc:
        build('.ptxas_alternative "--register-usage-level=0"\n.ptxas_alternative "--register-usage-level=0"')
    assert "appears twice" in exc.value.message and exc.value.span.line == 5
    assert exc.value.notes and exc.value.notes[0].span.line == 4


def test_the_directive_belongs_at_the_top_level():
    src = KERNEL.format(directives="").replace("    ret;", '.ptxas_alternative "--register-usage-level=0"\n    ret;')
    with pytest.raises(AsmError) as exc:
        build_source(src, "k.sasm")
    assert "top level" in exc.value.message


# ---- the choice -----------------------------------------------------------------------------------
ALT = ("--register-usage-level=0",)


def test_an_alternative_ships_only_past_the_margin():
    base = Trial((), 1000, 10, 128, 0)
    assert choose([base, Trial(ALT, 990, 0, 128, 0)]).chosen == 1            # exactly MARGIN fewer
    assert choose([base, Trial(ALT, 991, 0, 128, 0)]).chosen == 0
    assert MARGIN == 0.01
    picked = choose([base, Trial(ALT, 900, 0, 128, 0)])
    assert picked.options == ALT and "900 issue cycles modelled against 1000" in picked.why
    kept = choose([base, Trial(ALT, 1100, 0, 128, 0)])
    assert kept.options == () and "--register-usage-level=0 1100" in kept.why


def test_the_best_of_several_alternatives_ships():
    base = Trial((), 1000, 10, 128, 0)
    three = ("--register-usage-level=3",)
    assert choose([base, Trial(ALT, 950, 0, 128, 0), Trial(three, 900, 0, 128, 0)]).options == three
    assert choose([base, Trial(ALT, 900, 0, 128, 0), Trial(three, 895, 0, 128, 0)]).options == ALT


def test_more_spills_or_a_larger_register_granule_refuse_an_alternative():
    base = Trial((), 1000, 10, 123, 0)
    assert choose([base, Trial(ALT, 800, 0, 128, 0)]).chosen == 1              # 123 and 128: one granule of 8
    refused = choose([base, Trial(ALT, 800, 0, 130, 0)])
    assert refused.chosen == 0 and "130 registers against 123" in refused.why
    spilled = choose([base, Trial(ALT, 800, 0, 120, 4)])
    assert spilled.chosen == 0 and "4 spills against 0" in spilled.why
    # fewer spills than the defaults are no reason to refuse
    assert choose([Trial((), 1000, 10, 128, 16), Trial(ALT, 900, 0, 128, 0)]).chosen == 1


def test_a_target_the_inspector_cannot_read_keeps_the_defaults():
    why = "the SASS inspector reads sm_90/sm_90a cubins, not sm_80's"
    got = choose([Trial((), None, None, 100, 0, why), Trial(ALT, None, None, 90, 0, why)])
    assert got.chosen == 0 and why in got.why
    doc = got.to_json()
    assert doc["chosen"] == [] and len(doc["trials"]) == 2 and doc["trials"][1]["options"] == list(ALT)


# ---- the shipped sgemm, assembled both ways -------------------------------------------------------
T128_NT = {"THREADS": "256", "RQ": "2", "BK": "16", "TRANS_B": "1"}


@TOOLS
def test_the_cluster_sum_build_ships_the_alternative_with_a_conflict_free_loop():
    got = assemble(build_file("sgemm", BuildOptions(defines={**T128_NT, "CLUSTER_K": "7"})))
    choice = got.ptxas_choice
    assert choice is not None and got.ptxas_options == ("--register-usage-level=0",), choice.why
    base, alt = choice.trials
    assert alt.loop_bank_conflicts == 0 < base.loop_bank_conflicts
    assert alt.loop_issue_cycles <= base.loop_issue_cycles * (1 - MARGIN)
    assert alt.spills == 0 and alt.registers <= 128


@TOOLS
def test_the_cp_async_64x64_nn_build_keeps_ptxas_defaults():
    got = assemble(build_file("sgemm", BuildOptions(defines={"THREADS": "64", "BK": "16", "ASYNC": "1"})))
    assert got.ptxas_options == () and got.ptxas_choice.chosen == 0
    base, alt = got.ptxas_choice.trials
    assert base.loop_bank_conflicts <= 1 and alt.loop_bank_conflicts > base.loop_bank_conflicts, got.ptxas_choice.why


@TOOLS
def test_sass_and_build_say_which_run_shipped(tmp_path, run_cli):
    args = ["-D", "THREADS=256", "-D", "BK=16", "-D", "TRANS_B=1", "-D", "CLUSTER_K=2"]
    code, out, err = run_cli("sass", "sgemm", *args, "--loop")
    assert code == 0, err
    assert "ptxas options: --register-usage-level=0 (main loop" in err
    code, out, err = run_cli("sass", "sgemm", *args, "--loop", "--json")
    doc = json.loads(out)
    assert doc["ptxas_choice"]["chosen"] == ["--register-usage-level=0"]
    assert doc["kernels"][0]["loops"][0]["summary"]["bank_conflicts"] == 0
    code, out, err = run_cli("build", "sgemm", *args, "-o", tmp_path / "k.ptx", "--cubin", tmp_path / "k.cubin",
                             "--json")
    assert code == 0, err
    assert json.loads(out)["ptxas_choice"]["chosen"] == ["--register-usage-level=0"]


@TOOLS
def test_a_target_the_inspector_cannot_read_is_assembled_with_the_defaults():
    """mma_gemm for sm_80 with an alternative added to its source: ptxas runs both ways, the
    defaults ship, and the choice says the inspector reads sm_90/sm_90a only."""
    from asmgemm.pipeline import resolve_input
    src = resolve_input("mma_gemm").read_text(encoding="utf-8")
    got = assemble(build_source('.ptxas_alternative "--register-usage-level=0"\n' + src,
                                str(resolve_input("mma_gemm")), BuildOptions(target="sm_80")))
    assert got.ptxas_options == () and "not sm_80's" in got.ptxas_choice.why
    assert [t.loop_issue_cycles for t in got.ptxas_choice.trials] == [None, None]
