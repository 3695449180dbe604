"""The architecture objects (asmgemm.isa.arch): one Arch per supported target, its limits, bank
model, timing table and PTX features; the targets the ptxas in use assembles, accepted but
unmodelled; the pipeline's located errors for a feature the target lacks; and, with ptxas, that
the feature table agrees with ptxas's own checks."""
import os
import stat

import pytest

from asmgemm.errors import AsmError
from asmgemm import toolchain
from asmgemm.isa.arch import (ARCHS, DEFAULT_TARGET, FEATURE_USES, FEATURES, MODELLED_TARGETS, Arch, arch_for,
                              arch_for_compute_capability, blocks_per_sm, check_features, required_features)
from asmgemm.isa.register_banks import MAXWELL, VOLTA_PLUS
from asmgemm.pipeline import BuildOptions, build_source
from asmgemm.scheduler.latencies_sm90 import timing_table
from asmgemm.targets import PTXAS_FALLBACK_TARGETS, SUPPORTED_TARGETS, require_supported_target, supported_targets
from asmgemm.toolchain import find_tool, parse_ptxas_targets, ptxas_targets, run_ptxas

needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")

# Modelled non-arch-specific targets in order of compute capability (sm_90a: the `a` variant of sm_90).
ORDERED = [t for t in MODELLED_TARGETS if not t.endswith("a")]


def test_supported_targets_and_default():
    assert MODELLED_TARGETS == tuple(ARCHS) == ("sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70",
                                                "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90",
                                                "sm_90a")
    assert DEFAULT_TARGET == "sm_90" and DEFAULT_TARGET in SUPPORTED_TARGETS
    assert [arch_for(t).number for t in ORDERED] == sorted(arch_for(t).number for t in ORDERED)
    # Accepted: the modelled targets and whatever the ptxas in use assembles, in order.
    listed = ptxas_targets() or PTXAS_FALLBACK_TARGETS
    assert set(SUPPORTED_TARGETS) == set(MODELLED_TARGETS) | set(listed)
    assert tuple(SUPPORTED_TARGETS) == supported_targets() and len(SUPPORTED_TARGETS) == len(supported_targets())
    numbers = [arch_for(t).number for t in SUPPORTED_TARGETS]
    assert numbers == sorted(numbers)
    assert SUPPORTED_TARGETS.index("sm_90a") == SUPPORTED_TARGETS.index("sm_90") + 1


@pytest.mark.parametrize("target", MODELLED_TARGETS)
def test_every_target_has_a_plausible_arch(target):
    a = arch_for(target)
    assert isinstance(a, Arch) and a.name == target and arch_for(target) is a
    assert a.base == f"sm_{a.number}" and target.startswith(a.base)
    assert a.arch_specific == target.endswith("a") and a.suffix == ("a" if target.endswith("a") else "")
    assert a.compute_capability == f"{a.number // 10}.{a.number % 10}"
    assert a.family in ("Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper")
    lim = a.limits
    assert lim.registers_per_sm == 65536
    assert lim.registers_per_block in (32768, 65536)
    assert a.max_registers_per_thread == lim.max_registers_per_thread == 255
    assert lim.register_alloc_unit_per_warp == 256
    assert lim.max_threads_per_block == 1024
    assert lim.max_threads_per_sm in (1024, 1536, 2048) and lim.max_threads_per_sm % 32 == 0
    assert lim.max_blocks_per_sm in (16, 24, 32)
    assert 48 * 1024 <= lim.shared_per_block_optin <= lim.shared_per_sm <= 228 * 1024
    assert lim.static_shared_per_block == 48 * 1024
    assert lim.shared_reserved_per_block == (1024 if a.number >= 80 else 0)
    assert a.bank_model is (MAXWELL if a.number < 70 else VOLTA_PLUS)
    assert a.sass_decodable == (a.number == 90)


def test_known_limits():
    assert arch_for("sm_90").limits.shared_per_block_optin == 232448      # read on the project's H100
    assert arch_for("sm_80").limits.shared_per_sm == 164 * 1024
    assert arch_for("sm_75").limits.max_threads_per_sm == 1024
    assert arch_for("sm_89").limits.max_blocks_per_sm == 24
    assert arch_for("sm_86").limits.max_blocks_per_sm == 16
    assert arch_for("sm_61").limits.shared_per_block_optin == 48 * 1024
    assert arch_for("sm_62").limits.registers_per_block == 32768
    assert arch_for("sm_90a").limits == arch_for("sm_90").limits
    # The occupancy rule, through the arch: 256 threads x 124 registers, 16.5 KB of shared memory.
    occ = arch_for("sm_90").blocks_per_sm(256, 124, 16896)
    assert occ == blocks_per_sm(arch_for("sm_90").limits, 256, 124, 16896)
    assert occ["resident"] == 2 and occ["registers"] == 2
    assert arch_for("sm_75").blocks_per_sm(1024, 32, 0)["resident"] == 1


def test_unknown_targets_list_the_supported_ones():
    with pytest.raises(AsmError) as e:
        arch_for("sm_01")
    assert "unsupported target 'sm_01'" in e.value.message and "sm_90a" in e.value.message
    for bad in ("compute_90", "sm_90x", "sm_", "90"):
        with pytest.raises(AsmError):
            arch_for(bad)
    # isa/ describes a newer target without asking ptxas; whether a build may use it is targets.py's
    listed = ptxas_targets() or PTXAS_FALLBACK_TARGETS
    assert "sm_999" not in listed and not arch_for("sm_999").modelled
    with pytest.raises(AsmError, match="unsupported target 'sm_999' \\(supported: .*sm_90a"):
        require_supported_target("sm_999")
    with pytest.raises(AsmError, match="unsupported target 'sm_999'"):
        build_source(kernel("mov.u32 %r2, 0;", "sm_90"), "k.sasm", BuildOptions(target="sm_999"))
    require_supported_target("sm_90a")


def test_arch_for_compute_capability():
    assert arch_for_compute_capability("90").name == "sm_90"       # cupy's Device().compute_capability
    assert arch_for_compute_capability("8.6").name == "sm_86"
    assert arch_for_compute_capability(75).name == "sm_75"
    assert arch_for_compute_capability((8, 9)).name == "sm_89"
    with pytest.raises(AsmError) as e:      # running a kernel needs the SM limits: modelled targets only
        arch_for_compute_capability("100")
    assert "100" in e.value.message and "sm_90" in e.value.message


def test_timing_table_of_an_arch():
    table, note = timing_table(arch_for("sm_90"))
    assert "FFMA" in table and note == "sm_90 table"
    assert timing_table(arch_for("sm_90a"))[1] == "sm_90 table"
    t80, note80 = timing_table(arch_for("sm_80"))
    assert t80 is table and "no sm_80 table yet" in note80
    with pytest.raises(ValueError, match="Volta-and-later"):
        timing_table(arch_for("sm_61"))


# ---- features ----------------------------------------------------------------------------------
def test_feature_table_is_consistent():
    for use in FEATURE_USES:
        assert use.feature in FEATURES
        assert sum(bool(x) for x in (use.opcode, use.modifiers, use.directive, use.sreg)) == 1, use
    for f in FEATURES.values():
        assert f.min_target in MODELLED_TARGETS and f.section
        assert any(use.feature == f.name for use in FEATURE_USES), f"{f.name}: no way to use it"


def test_features_grow_with_the_architecture():
    for lo, hi in zip(ORDERED, ORDERED[1:]):
        assert arch_for(lo).features <= arch_for(hi).features, (lo, hi)
    assert arch_for("sm_90").features < arch_for("sm_90a").features
    for f in FEATURES.values():
        have = [t for t in MODELLED_TARGETS if arch_for(t).has(f.name)]
        if f.min_target.endswith("a"):
            assert have == [f.min_target]
        else:
            assert have == list(MODELLED_TARGETS[MODELLED_TARGETS.index(f.min_target):])


def test_named_feature_minimums():
    assert arch_for("sm_80").has("cp.async") and not arch_for("sm_75").has("cp.async")
    assert arch_for("sm_90a").has("wgmma") and not arch_for("sm_90").has("wgmma")
    assert arch_for("sm_90a").has("setmaxnreg") and not arch_for("sm_90").has("setmaxnreg")
    assert arch_for("sm_75").has("ldmatrix") and not arch_for("sm_72").has("ldmatrix")
    assert arch_for("sm_90").has("stmatrix") and not arch_for("sm_89").has("stmatrix")
    assert arch_for("sm_70").has("mma.sync") and not arch_for("sm_75").has("mma.sync.m16n8k16")
    assert arch_for("sm_90").has("tma") and arch_for("sm_90").has("clusters")
    assert arch_for("sm_80").has("mbarrier") and not arch_for("sm_80").has("mbarrier.try_wait")
    with pytest.raises(ValueError):
        arch_for("sm_90").has("warp-speed")


KERNEL = """.version 8.7
{target_line}
.address_size 64

.visible .entry k(.param .u64 p){perf}
{{
  .reg .b64 %rd<8>;
  .reg .b32 %r<16>;
  .reg .f32 %f<16>;
  .reg .f64 %fd<8>;
  .reg .b16 %h<4>;
  .reg .pred %p<4>;
  .shared .align 16 .b8 sm[1024];
  ld.param.u64 %rd1, [p];
  mov.u32 %r1, sm;
  mov.u32 %r3, sm;
  {body}
  st.global.u32 [%rd1], %r1;
  ret;
}}
"""
BODY_LINE = 17          # the line of {body} in KERNEL


def kernel(body: str, target: str | None = None, perf: str = "") -> str:
    return KERNEL.format(target_line=f".target {target}" if target else "", perf=perf, body=body)


def build(body, target=None, declared=None, perf=""):
    return build_source(kernel(body, declared, perf), "k.sasm", BuildOptions(target=target))


def features_of(body, perf=""):
    return [f for f, _ in required_features(build(body, target="sm_90a", perf=perf).expanded)]


def test_required_features_of_instructions():
    assert features_of("cp.async.ca.shared.global [%r1], [%rd1], 16;") == ["cp.async"]
    # The longest opcode row decides: cp.async.bulk.tensor is TMA, not cp.async.
    assert features_of("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes "
                       "[%r1], [%rd1, {%r2}], [%r3];") == ["tma", "clusters"]
    assert features_of("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1, %f2, %f3, %f4}, "
                       "{%r2, %r3, %r4, %r5}, {%r6, %r7}, {%f5, %f6, %f7, %f8};") \
        == ["mma.sync", "mma.sync.m16n8k16", "bf16"]
    assert features_of("mov.u32 %r2, %cluster_ctarank;") == ["clusters"]
    assert features_of("mov.u32 %r2, %clusterid.x;") == ["clusters"]
    assert features_of("ld.shared::cluster.u32 %r2, [%r1];") == ["clusters"]
    assert features_of("", perf=" .reqnctapercluster 2, 1, 1") == ["clusters"]
    assert features_of("mov.u32 %r2, %tid.x;\n  fma.rn.f32 %f1, %f2, %f3, %f4;") == []
    # A feature is reported once, at its first use.
    uses = required_features(build("cp.async.commit_group;\n  cp.async.wait_group 0;", target="sm_90").expanded)
    assert [(f, s.line) for f, s in uses] == [("cp.async", BODY_LINE)]


def test_cp_async_for_sm75_is_a_located_error():
    with pytest.raises(AsmError) as e:
        build("mov.u32 %r2, 0;\n  cp.async.ca.shared.global [%r1], [%rd1], 16;", target="sm_75")
    err = e.value
    assert err.message.startswith("cp.async needs sm_80; this build targets sm_75")
    assert err.span is not None and (err.span.line, err.span.col) == (BODY_LINE + 1, 3)
    assert "sm_80" in err.hint
    assert "k.sasm:18:3: error: cp.async needs sm_80" in err.format()


def test_ldmatrix_for_sm70_is_an_error():
    with pytest.raises(AsmError) as e:
        build("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%r2}, [%r1];", target="sm_70")
    assert e.value.message.startswith("ldmatrix needs sm_75; this build targets sm_70")
    assert e.value.span.line == BODY_LINE


def test_wgmma_without_a_target_picks_sm90a():
    assert build("wgmma.fence.sync.aligned;").target == "sm_90a"
    assert build("wgmma.fence.sync.aligned;", declared="sm_90").target == "sm_90a"   # the source's .target
    assert build("setmaxnreg.inc.sync.aligned.u32 232;").target == "sm_90a"
    assert build("mov.u32 %r2, 0;").target == DEFAULT_TARGET
    assert build("mov.u32 %r2, 0;", declared="sm_80").target == "sm_80"


def test_wgmma_for_an_explicit_plain_target_is_an_error():
    for target in ("sm_90", "sm_80"):
        with pytest.raises(AsmError) as e:
            build("wgmma.fence.sync.aligned;", target=target)
        assert e.value.message.startswith(f"wgmma needs sm_90a; this build targets {target} (--target {target})")
        assert e.value.span.line == BODY_LINE
        assert "--target sm_90a" in e.value.hint and "leave --target out" in e.value.hint


def test_the_declared_target_is_checked_too():
    with pytest.raises(AsmError) as e:
        build("stmatrix.sync.aligned.m8n8.x1.shared.b16 [%r1], {%r2};", declared="sm_80")
    assert "stmatrix needs sm_90; this build targets sm_80 (the source's .target sm_80)" in e.value.message
    with pytest.raises(AsmError, match="unsupported .target sm_01"):
        build("mov.u32 %r2, 0;", declared="sm_01")


def test_further_missing_features_become_notes():
    with pytest.raises(AsmError) as e:
        build("cp.async.ca.shared.global [%r1], [%rd1], 16;\n  barrier.cluster.arrive;", target="sm_75")
    assert e.value.message.startswith("cp.async needs sm_80")
    assert [n.message for n in e.value.notes] == ["clusters needs sm_90 too"]
    assert e.value.notes[0].span.line == BODY_LINE + 1


def test_cluster_directive_error_points_at_the_function():
    with pytest.raises(AsmError) as e:
        build("mov.u32 %r2, 0;", target="sm_89", perf=" .reqnctapercluster 2, 1, 1")
    assert e.value.message.startswith("clusters needs sm_90; this build targets sm_89")
    assert e.value.span is not None and e.value.span.line == 5


# ---- the table agrees with ptxas ---------------------------------------------------------------
F4, F4B = "{%f1, %f2, %f3, %f4}", "{%f5, %f6, %f7, %f8}"
# One use of every feature: ptxas must accept it at the feature's minimum target and refuse it at the
# target before (for an `a` feature: the plain target). ptxas 13 no longer generates code for
# sm_50..sm_72, but it still checks a `.target sm_70` PTX against sm_70 when asked for -arch=sm_75.
SNIPPETS = {
    "dp4a": "dp4a.u32.u32 %r2, %r1, %r1, %r1;",
    "mma.sync": "mma.sync.aligned.m8n8k4.row.col.f32.f16.f16.f32 {%f1, %f2, %f3, %f4, %f5, %f6, %f7, %f8}, "
                "{%r2, %r3}, {%r4, %r5}, {%f9, %f10, %f11, %f12, %f13, %f14, %f15, %f0};",
    "wmma": "wmma.load.a.sync.aligned.row.m16n16k16.shared.f16 {%r2, %r3, %r4, %r5, %r6, %r7, %r8, %r9}, [%r1];",
    "match.sync": "match.any.sync.b32 %r2, %r1, 0xffffffff;",
    "nanosleep": "nanosleep.u32 100;",
    "ldmatrix": "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r2, %r3, %r4, %r5}, [%r1];",
    "movmatrix": "movmatrix.sync.aligned.m8n8.trans.b16 %r2, %r3;",
    "mma.sync.m16n8k8": f"mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {F4}, {{%r2, %r3}}, {{%r4}}, {F4B};",
    "mma.sync.m8n8k16": "mma.sync.aligned.m8n8k16.row.col.s32.s8.s8.s32 {%r2, %r3}, {%r4}, {%r5}, {%r6, %r7};",
    "mma.sync.m8n8k32": "mma.sync.aligned.m8n8k32.row.col.s32.s4.s4.s32 {%r2, %r3}, {%r4}, {%r5}, {%r6, %r7};",
    "mma.sync.m8n8k128": "mma.sync.aligned.m8n8k128.row.col.s32.b1.b1.s32.xor.popc {%r2, %r3}, {%r4}, {%r5}, "
                         "{%r6, %r7};",
    "mma.sync.m16n8k4": f"mma.sync.aligned.m16n8k4.row.col.f32.tf32.tf32.f32 {F4}, {{%r2, %r3}}, {{%r4}}, {F4B};",
    "mma.sync.m16n8k16": f"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {F4}, {{%r2, %r3, %r4, %r5}}, "
                         f"{{%r6, %r7}}, {F4B};",
    "mma.sync.m16n8k32": "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%r2, %r3, %r4, %r5}, "
                         "{%r6, %r7, %r8, %r9}, {%r10, %r11}, {%r12, %r13, %r14, %r15};",
    "mma.sync.m16n8k64": "mma.sync.aligned.m16n8k64.row.col.s32.s4.s4.s32 {%r2, %r3, %r4, %r5}, "
                         "{%r6, %r7, %r8, %r9}, {%r10, %r11}, {%r12, %r13, %r14, %r15};",
    "mma.sync.m16n8k128": "mma.sync.aligned.m16n8k128.row.col.s32.b1.b1.s32.and.popc {%r2, %r3, %r4, %r5}, "
                          "{%r6, %r7}, {%r8}, {%r12, %r13, %r14, %r15};",
    "mma.sync.m16n8k256": "mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc {%r2, %r3, %r4, %r5}, "
                          "{%r6, %r7, %r8, %r9}, {%r10, %r11}, {%r12, %r13, %r14, %r15};",
    "mma.sync.f64": "mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%fd1, %fd2}, {%fd3}, {%fd4}, {%fd5, %fd6};",
    "mma.sync.f64.m16n8": "mma.sync.aligned.m16n8k8.row.col.f64.f64.f64.f64 {%fd1, %fd2, %fd3, %fd4}, "
                          "{%fd5, %fd6, %fd7, %fd0}, {%fd5, %fd6}, {%fd1, %fd2, %fd3, %fd4};",
    "bf16": "cvt.rn.bf16x2.f32 %r2, %f1, %f2;",
    "tf32": "cvt.rna.tf32.f32 %r2, %f1;",
    "fp8": "cvt.rn.satfinite.e4m3x2.f32 %h1, %f1, %f2;",
    "cp.async": "cp.async.cg.shared.global [%r1], [%rd1], 16;\n  cp.async.commit_group;\n  cp.async.wait_group 0;",
    "mbarrier": "mbarrier.init.shared.b64 [%r1], 1;",
    "mbarrier.try_wait": "mbarrier.try_wait.shared.b64 %p1, [%r1], %rd2;",
    "mbarrier.tx": "mbarrier.arrive.expect_tx.shared.b64 %rd2, [%r1], 16;",
    "redux.sync": "redux.sync.add.u32 %r2, %r1, 0xffffffff;",
    "stmatrix": "stmatrix.sync.aligned.m8n8.x1.shared.b16 [%r1], {%r2};",
    "tma": "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], [%rd1, {%r2}], [%r3];",
    "clusters": "barrier.cluster.arrive;\n  barrier.cluster.wait;",
    "elect.sync": "elect.sync %r2|%p1, 0xffffffff;",
    "fence.proxy.async": "fence.proxy.async.shared::cta;",
    "griddepcontrol": "griddepcontrol.wait;",
    "multimem": "multimem.ld_reduce.relaxed.sys.global.add.u32 %r2, [%rd1];",
    "wgmma": "wgmma.fence.sync.aligned;",
    "setmaxnreg": "setmaxnreg.inc.sync.aligned.u32 232;",
    "tensormap.replace": "tensormap.replace.tile.global_address.global.b1024.b64 [%rd1], %rd2;",
}


def test_every_feature_has_a_snippet():
    assert set(SNIPPETS) == set(FEATURES)


def _before(target: str) -> str:
    if target.endswith("a"):
        return target[:-1]
    return ORDERED[ORDERED.index(target) - 1]


def _ptxas(ptx: str, target: str):
    arch = target if ARCHS[target].number >= 75 else "sm_75"
    return run_ptxas(ptx, arch)


@pytest.mark.toolchain
@needs_ptxas
@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_feature_minimum_agrees_with_ptxas(feature):
    need = FEATURES[feature].min_target
    before = _before(need)
    result = build(SNIPPETS[feature], target=need)
    assert feature in [f for f, _ in required_features(result.expanded)]
    code, log, _ = _ptxas(result.ptx, need)
    assert code == 0, f"ptxas refuses {feature} for {need}:\n{log}"
    # Our check refuses the target before, and so does ptxas.
    with pytest.raises(AsmError, match=f"needs {need}; this build targets {before}"):
        build(SNIPPETS[feature], target=before)
    ptx_before = result.ptx.replace(f".target {need}\n", f".target {before}\n")
    assert f".target {before}\n" in ptx_before
    code, log, _ = _ptxas(ptx_before, before)
    assert code != 0 and ("requires .target" in log or "not supported on .target" in log), log


# ---- targets the ptxas in use assembles: accepted, unmodelled -------------------------------------
PTXAS_13_HELP = """Usage  : ptxas [options] <ptx file>,...
--fmad <true|false>                                 (-fmad)
        Enables (disables) the contraction of floating-point multiplies and adds.
        Default value:  'true'.

--gpu-name <gpu name>                               (-arch)
        Specify name of NVIDIA GPU to generate code for. This option also takes virtual
        compute architectures, in which case code generation is suppressed.
        Allowed values for this option:  'compute_100','compute_100a','compute_75','lto_100',
        'sm_100','sm_100a','sm_100f','sm_120','sm_75','sm_90','sm_90a'.
        Default value:  'sm_75'.

--help                                              (-h)
        Print this help information on this tool.

--opt-level <N>                                     (-O)
        Allowed values for this option:  'sm_999'.
"""


def test_ptxas_help_is_parsed_for_its_gpu_names():
    # Only the --gpu-name option's values, only sm_* (compute_*/lto_* are not .target names).
    assert parse_ptxas_targets(PTXAS_13_HELP) == ("sm_100", "sm_100a", "sm_100f", "sm_120", "sm_75", "sm_90", "sm_90a")
    assert parse_ptxas_targets("ptxas: unknown option --help") is None
    assert parse_ptxas_targets("--gpu-name <gpu name>\n  Allowed values for this option: 'compute_90'.\n") is None


@needs_ptxas
@pytest.mark.toolchain
def test_the_installed_ptxas_is_asked():
    listed = ptxas_targets()
    assert listed is not None and "sm_90a" in listed
    assert set(listed) <= set(SUPPORTED_TARGETS)
    code, log, _ = run_ptxas(".version 8.7\n.target sm_90\n.address_size 64\n", listed[-1])
    assert code == 0, log   # every name it lists, it takes


def _fake_ptxas(tmp_path, help_text: str) -> str:
    exe = tmp_path / "ptxas"
    exe.write_text("#!/bin/sh\ncat <<'HELP'\n" + help_text + "HELP\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return str(exe)


@pytest.mark.skipif(os.name != "posix", reason="a shell-script ptxas")
def test_accepted_targets_follow_the_ptxas_in_use(tmp_path, monkeypatch):
    newer = PTXAS_13_HELP.replace("'sm_120',", "'sm_120','sm_130','sm_130a',")
    monkeypatch.setenv("ASMGEMM_PTXAS", _fake_ptxas(tmp_path, newer))
    assert "sm_130" in SUPPORTED_TARGETS and "sm_130a" in SUPPORTED_TARGETS and "sm_103" not in SUPPORTED_TARGETS
    assert "sm_61" in SUPPORTED_TARGETS        # modelled targets stay, even where this ptxas dropped them
    result = build_source(kernel("mov.u32 %r2, 0;", "sm_130"), "k.sasm")
    assert result.target == "sm_130" and ".target sm_130\n" in result.ptx
    assert arch_for("sm_130").family == "unknown" and not arch_for("sm_130").modelled


def test_without_ptxas_the_fallback_list_is_accepted(monkeypatch):
    monkeypatch.setattr(toolchain, "find_tool", lambda name, required=True: None)
    assert ptxas_targets() is None
    assert set(SUPPORTED_TARGETS) == set(MODELLED_TARGETS) | set(PTXAS_FALLBACK_TARGETS)
    assert "sm_120" in SUPPORTED_TARGETS and "sm_130" not in SUPPORTED_TARGETS


def test_a_broken_ptxas_override_falls_back_to_the_static_list(tmp_path, monkeypatch):
    monkeypatch.setenv("ASMGEMM_PTXAS", str(tmp_path / "no-such-ptxas"))
    assert ptxas_targets() is None and "sm_100a" in SUPPORTED_TARGETS


@pytest.mark.parametrize("target", ["sm_100", "sm_100a", "sm_100f", "sm_120", "sm_120a"])
def test_an_unmodelled_target_has_features_but_no_tables(target):
    a = arch_for(target)
    assert a is arch_for(target) and target not in ARCHS and not a.modelled
    assert a.family == "Blackwell" and a.number in (100, 120) and a.suffix == target[len(a.base):]
    assert a.arch_specific == target.endswith("a") and a.base == f"sm_{a.number}"
    assert a.max_registers_per_thread == 255
    assert target in a.unmodelled_note and "unmodelled" in a.unmodelled_note
    with pytest.raises(AsmError, match=f"no SM resource limits for {target}"):
        a.limits
    with pytest.raises(AsmError, match=f"no register-bank model for {target}"):
        a.bank_model
    with pytest.raises(ValueError, match=f"no latency data for {target}"):
        timing_table(a)
    assert not a.sass_decodable
    # The onion model for the plain features; none of sm_90a's architecture-specific ones.
    assert a.has("cp.async") and a.has("tma") and a.has("clusters") and a.has("fp8")
    assert not a.has("wgmma") and not a.has("setmaxnreg")


def test_an_unmodelled_target_leaves_architecture_specific_features_to_ptxas():
    uses = [("setmaxnreg", None), ("cp.async", None)]
    check_features(arch_for("sm_100a"), uses)           # ptxas decides: sm_100a has setmaxnreg
    with pytest.raises(AsmError, match="setmaxnreg needs sm_90a; this build targets sm_90"):
        check_features(arch_for("sm_90"), uses)
    with pytest.raises(AsmError, match="fp8 needs sm_89; this build targets sm_88"):
        check_features(arch_for("sm_88"), [("fp8", None)])   # a plain feature above the target: ours to refuse


def test_plain_ptx_builds_for_an_unmodelled_target_with_a_note():
    result = build("mov.u32 %r2, 0;", declared="sm_120")
    assert result.target == "sm_120" and ".target sm_120\n" in result.ptx
    assert result.allocation.model == "none" and "sm_120 is unmodelled" in result.allocation.note
    assert result.allocation.to_json()["note"] == result.allocation.note
    assert "no latency table for sm_120" in result.schedule_report.table_note
    assert build("mov.u32 %r2, 0;", target="sm_100a").target == "sm_100a"
    assert build("mov.u32 %r2, 0;").allocation.note == ""     # modelled: nothing to say


SASM_120 = """.target sm_120
.visible .entry k(.param .u64 p)
{{
    .regs .u64 ptr
    .regs .f32 a, b{attrs}
    ld.param.u64 ptr, [p];
{pre}    ld.global.f32 a, [ptr];
    add.f32 b, a, a;
{post}    st.global.f32 [ptr], b;
    ret;
}}
"""


def test_unmodelled_target_refuses_what_needs_the_model_at_its_line():
    # .regs without banks: planned (no banks, no conflicts to report).
    ok = build_source(SASM_120.format(attrs="", pre="", post=""), "k.sasm")
    plan = ok.allocation.functions["k"]
    assert [r.bank for r in plan.regs] == [None, None, None] and plan.conflicts == []
    assert plan.registers_used == 4
    # A bank constraint: an error at the declaration.
    with pytest.raises(AsmError) as e:
        build_source(SASM_120.format(attrs=" : banks(0, 1)", pre="", post=""), "k.sasm")
    assert "asks for bank 0" in e.value.message and "no register-bank model for sm_120" in e.value.message
    assert (e.value.span.line, e.value.span.col) == (5, 16)
    # A .schedule region: an error at the region, unless scheduling is off.
    sched = SASM_120.format(attrs="", pre=".schedule\n", post=".endschedule\n")
    with pytest.raises(AsmError) as e:
        build_source(sched, "k.sasm")
    assert e.value.message.startswith("cannot schedule for sm_120: asmgemm has no latency data for sm_120")
    assert e.value.span.line == 7 and "--no-schedule" in e.value.hint
    assert "add.f32" in build_source(sched, "k.sasm", BuildOptions(schedule=False)).ptx


@needs_ptxas
@pytest.mark.toolchain
def test_unmodelled_target_ptx_assembles():
    result = build("mov.u32 %r2, 0;", declared="sm_120")
    code, log, cubin = run_ptxas(result.ptx, "sm_120")
    assert code == 0 and cubin, log
