"""launch_config.configure: (kernel spec, problem, device) -> launch configuration, on the CPU.

No CuPy, no arrays: operands are arrays.Matrix descriptions, the device a DeviceFacts. What gemm
decides for a call is checked here directly: the kernel, the geometry, the padded copies TMA
needs, batches folded into rows, nothing to launch for empty products, the build that runs."""
from __future__ import annotations

import pytest

from asmgemm.errors import AsmError
from asmgemm.runtime import launch_config, path_model
from asmgemm.runtime.arrays import Dtype, Matrix
from asmgemm.runtime.gpu import DeviceFacts
from asmgemm.runtime.launch_config import Problem, configure, pick_spec
from asmgemm.runtime.plan import fresh_operands
from asmgemm.toolchain import find_tool

H100 = DeviceFacts(0, "NVIDIA H100 80GB HBM3", "sm_90", 132, 1.98e9, 3.35e12)
F32, F16 = Dtype("float32", 4), Dtype("float16", 2)
needs_ptxas = pytest.mark.skipif(find_tool("ptxas", required=False) is None, reason="needs ptxas")


def row_major(rows, cols, dtype=F32, ld=None, ptr=1 << 20):
    return Matrix((rows, cols), ((ld or cols) * dtype.itemsize, dtype.itemsize), dtype, ptr, 0)


def fresh(m, n, k, layout, dtype=F16):
    """The call on freshly allocated operands of this layout (plan.fresh_operands)."""
    a, b, c, trans_a, trans_b = fresh_operands(m, n, k, layout, dtype)
    return Problem(a, b, c, trans_a=trans_a, trans_b=trans_b)


def problem(m, n, k, dtype=F32, lda=None, **kw):
    return Problem(row_major(m, k, dtype, lda or max(k, 1)), row_major(k, n, dtype, max(n, 1)),
                   row_major(m, n, dtype, max(n, 1)), **kw)


def test_an_empty_product_launches_nothing():
    spec = pick_spec(None, "float32", None, H100)
    cfg = configure(spec, problem(0, 64, 64), H100)
    assert cfg.empty and cfg.built is None and cfg.c_shape == (0, 64)


def test_k_zero_without_an_epilogue_only_scales_c():
    spec = pick_spec(None, "float32", None, H100)
    cfg = configure(spec, problem(32, 64, 0), H100)
    assert not cfg.empty and cfg.built is None


def test_pick_spec_refuses_a_kernel_of_other_dtypes_or_not_built_for_the_device():
    with pytest.raises(AsmError, match="takes A/B float32"):
        pick_spec("sgemm", "float16", None, H100)
    a100 = DeviceFacts(0, "NVIDIA A100-SXM4-80GB", "sm_80", 108)
    with pytest.raises(AsmError, match="not built for sm_80"):
        pick_spec("hgemm", "float16", None, a100)
    assert pick_spec(None, "float16", None, a100).name != "hgemm"      # the portable kernel there


@needs_ptxas
def test_a_catalog_family_is_configured_by_the_dispatch():
    spec = pick_spec(None, "float32", None, H100)
    cfg = configure(spec, problem(17, 576, 2000), H100)
    assert cfg.built is not None and cfg.config is not None
    assert cfg.chosen_by in ("database", "model")
    # the first candidate of the dispatch's order whose build the kernel's guards accepted
    labels = [c.label for c in cfg.choice.order]
    assert cfg.config in labels and all(label in cfg.choice.refused for label in labels[:labels.index(cfg.config)])
    assert (cfg.plan.m, cfg.plan.n, cfg.plan.k) in ((17, 576, 2000), (576, 17, 2000))


@needs_ptxas
def test_params_pin_the_build():
    spec = pick_spec(None, "float32", None, H100)
    cfg = configure(spec, problem(64, 64, 64, params={"THREADS": 64, "BK": 16}), H100)
    assert cfg.chosen_by == "params" and cfg.config is None and cfg.choice is None
    assert cfg.built.threads == 64


def test_a_shared_b_folds_a_batch_into_rows():
    spec = pick_spec(None, "float32", None, H100)
    a = Matrix((3, 4, 8), (4 * 8 * 4, 8 * 4, 4), F32, 1 << 20, 0)
    c = Matrix((3, 4, 16), (4 * 16 * 4, 16 * 4, 4), F32, 1 << 21, 0)
    cfg = configure(spec, Problem(a, row_major(8, 16), c), H100)
    assert cfg.kernel_batch == 1 and cfg.c_shape == (3, 4, 16) and cfg.plan.k == 8
    # M' = 3 x 4 rows (or C^T's columns, where the catalog runs the call as C^T)
    assert (cfg.plan.m, cfg.plan.n) == ((16, 12) if cfg.plan.c_trans else (12, 16))


def test_tma_operands_it_cannot_read_are_planned_on_their_padded_copies(monkeypatch):
    """A row of 13 halves (26 bytes) TMA cannot address: the configuration plans on a padded
    copy's layout (a leading dimension of 16 halves) and says A is copied; B, aligned, is not."""
    spec = pick_spec(None, "float32", None, H100)
    monkeypatch.setattr(launch_config, "takes_tensor_maps", lambda s: True)
    monkeypatch.setattr(launch_config, "build_kernel", lambda spec, defines, target: None)
    m, n, k = 40, 64, 13
    plan_args = problem(m, n, k, F16, params={"BK": 16})
    cfg = configure(spec, plan_args, H100)
    assert cfg.copied == (2, 0)
    assert cfg.plan.a.ld == 16 and cfg.plan.b.ld == n
    aligned = configure(spec, problem(m, n, 16, F16, params={"BK": 16}), H100)
    assert aligned.copied == (0, 0) and aligned.plan.a.ld == 16


@needs_ptxas
def test_copy_or_in_place_weighs_the_in_place_configuration_that_builds():
    """1534 x 5477 x 3731 fp16 with odd leading dimensions (every copy 2 bytes wide). The cost
    model ranks hgemm_mma's 64 x 64 warp tile first, but its guards refuse it with 2-byte copies
    (too many registers); weighed against the copies, that tile chose in place, and what ran in
    place took 701 us against the copy path's ~200 (H100, docs/log/dispatch.md). The decision is
    taken on the configuration that builds, so the copies win."""
    from asmgemm.kernel_spec import get_spec
    m, n, k = 1534, 5477, 3731
    hgemm = pick_spec(None, "float16", None, H100)
    assert hgemm.name == "hgemm" and hgemm.in_place == "hgemm_mma"
    cfg = configure(hgemm, problem(m, n, k, F16), H100)
    assert cfg.spec.name == "hgemm" and cfg.copied == (2, 2)
    # the mechanism: the model's own first choice in place is one the kernel refuses here
    in_place = configure(get_spec("hgemm_mma"), problem(m, n, k, F16), H100)
    first = in_place.choice.order[0]
    assert first.label in in_place.choice.refused, (first.label, in_place.config)
    assert "registers" in in_place.choice.refused[first.label]
    assert in_place.config != first.label


@needs_ptxas
def test_the_hgemm_own_path_fixture_turns_the_in_place_choice_off(request, monkeypatch):
    """500 x 3000 x 700 fp16 (A's rows 1400 bytes, which TMA cannot address) runs hgemm_mma in
    place by the path model on the H100's database, and hgemm with A copied under the fixture the
    TMA kernel's GPU tests use (conftest.hgemm_own_path): the fixture must reach the decision
    launch_config makes (it stopped doing so once, when the decision moved to path_model.decide)."""
    spec = pick_spec(None, "float16", None, H100)
    prob = problem(500, 3000, 700, F16)
    cfg = configure(spec, prob, H100)
    assert cfg.spec.name == "hgemm_mma" and cfg.path is not None and cfg.path.in_place
    request.getfixturevalue("hgemm_own_path")
    cfg = configure(spec, prob, H100)
    assert cfg.spec.name == "hgemm" and cfg.copied == (2, 0) and cfg.path is not None and not cfg.path.in_place


@needs_ptxas
def test_a_narrow_c_store_bound_call_is_weighed_against_the_in_place_kernel():
    """4417 x 2901 x 16 fp16 nt: TMA reads A and B (32-byte rows) but C's rows (5802 bytes) are
    not 16-byte pieces, and that store is the TMA kernel's modelled time: the path model decides
    (in place on the H100's database); 4096 x 4096 x 4096 writes whole pieces: the two kernels are
    weighed at their own configurations instead (not a narrow store), and the TMA kernel keeps it."""
    spec = pick_spec(None, "float16", None, H100)
    prob = Problem(row_major(4417, 16, F16), row_major(2901, 16, F16), row_major(4417, 2901, F16), trans_b=True)
    cfg = configure(spec, prob, H100)
    assert cfg.path is not None and cfg.path.narrow_c and cfg.path.copies == 0 and cfg.path.margin == 1
    assert cfg.spec.name == ("hgemm_mma" if cfg.path.in_place else "hgemm")
    wide = configure(spec, problem(4096, 4096, 4096, F16), H100)
    assert wide.spec.name == "hgemm" and not wide.path.narrow_c and not wide.path.in_place


@needs_ptxas
@pytest.mark.parametrize("m, n, k, layout", [
    (16, 112, 12096, "tt"),     # random:154:60:16's: 21.1 us on the TMA kernel, 9.7 in place (H200)
    (16, 144, 12288, "tn"),     # 21.3 -> 10.0
    (8, 104, 14528, "tn"),      # random:9154:60:16's: 28.6 -> 9.9
])
def test_an_aligned_deep_k_call_over_few_outputs_runs_in_place(m, n, k, layout):
    """Aligned operands, C in whole pieces, K deep over a few outputs: the TMA kernel's catalog
    splits K at most 4 ways, a chain of 40-60 K tiles a block, where the in-place catalog splits it
    50-60 ways; the path model weighs the two picks by the cost model and the in-place kernel wins
    by more than the margin (path_model.aligned_margin)."""
    spec = pick_spec(None, "float16", None, H100)
    cfg = configure(spec, fresh(m, n, k, layout), H100)
    p = cfg.path
    assert cfg.spec.name == "hgemm_mma" and cfg.copied == (0, 0)
    assert p.copies == 0 and not p.narrow_c and p.in_place
    assert p.in_place_s * p.margin <= p.tma_kernel_s
    assert p.margin == pytest.approx(path_model.aligned_margin(p.tma_kernel_s, p.in_place_s))


@needs_ptxas
def test_an_aligned_call_the_tma_kernel_wins_builds_no_in_place_configuration(monkeypatch):
    """4096^3 fp16: even the in-place catalog's fastest estimate, times the margin, is longer than the
    TMA kernel's, so no configuration of the in-place kernel is built to find which one would run
    (ptxas's seconds on a cold cache for nothing); the decision is still made and shown."""
    from asmgemm.runtime import dispatch
    built = []
    real = dispatch.build_kernel
    monkeypatch.setattr(dispatch, "build_kernel", lambda spec, defines, target: built.append(spec.name) or
                        real(spec, defines, target))
    cfg = configure(pick_spec(None, "float16", None, H100), problem(4096, 4096, 4096, F16), H100)
    assert cfg.spec.name == "hgemm" and not cfg.path.in_place and cfg.path.copies == 0
    assert cfg.path.in_place_s * cfg.path.margin > cfg.path.tma_kernel_s
    assert "hgemm_mma" not in built
    # where the in-place kernel may win, its configuration is built (the guards decide what runs)
    built.clear()
    assert configure(pick_spec(None, "float16", None, H100), fresh(16, 112, 12096, "tt"), H100).spec.name == "hgemm_mma"
    assert "hgemm_mma" in built


@needs_ptxas
def test_the_users_tuning_entry_for_the_tma_kernel_keeps_an_aligned_call_there(monkeypatch):
    """A tuning-cache entry for the TMA kernel is the user's word: the aligned call that would run
    in place (16 x 112 x 12096 tt) stays on it, with no path decision."""
    spec = pick_spec(None, "float16", None, H100)
    prob = fresh(16, 112, 12096, "tt")
    assert configure(spec, prob, H100).spec.name == "hgemm_mma"
    monkeypatch.setattr(launch_config, "lookup_tuned_choice", lambda gpu, s, plan: {"BN": 128} if s is spec else None)
    cfg = configure(spec, prob, H100)
    assert cfg.spec.name == "hgemm" and cfg.path is None


@needs_ptxas
def test_no_c_transposed_entry_where_that_launch_would_copy_what_the_call_reads_in_place():
    """32 x 3184 x 31 fp16 nn: as called, hgemm loads the K-major A itself (A_LDG) and copies
    nothing; run as C^T, that A becomes a B it must copy into padded rows, a cost the cost model
    has no term for (the copy ran 7.6 us of GPU and 47.6 a call against the in-place kernel's 5.3
    and 31.6 on the H200): the catalog's C^T entries are not offered, and nothing is copied."""
    spec = pick_spec(None, "float16", None, H100)
    cfg = configure(spec, problem(32, 3184, 31, F16), H100)
    assert cfg.copied == (0, 0) and not cfg.plan.c_trans
    assert cfg.choice is None or not any(c.swap for c in cfg.choice.order)


@needs_ptxas
def test_untuned_params_run_what_an_untuned_call_runs():
    """launch_config.untuned_params: a catalog's pick as its candidate's params= (its configuration
    and split), a kernel that chooses by its rules as its build's -D values (hgemm's route to
    hgemm_skinny: MR = 4), and a fused call configured with its bias and activation (no split)."""
    from asmgemm.kernel_spec import activation_code
    spec = pick_spec(None, "float32", None, H100)
    cfg, params = launch_config.untuned_params(spec, 512, 768, 768, "nn", H100)
    picked = next(c for c in cfg.choice.order if c.label == cfg.config)
    assert cfg.spec.name.startswith("sgemm") and params == picked.params()
    cfg, params = launch_config.untuned_params(pick_spec(None, "float16", None, H100), 2, 20000, 500, "tn", H100)
    assert cfg.spec.name == "hgemm_skinny" and cfg.config is None and params["MR"] == 4 and "SPLIT_K" not in params
    cfg, params = launch_config.untuned_params(spec, 64, 4096, 8192, "nn", H100, bias=1, act=activation_code("relu"))
    assert cfg.plan.call_values["bias"] == 1 and cfg.split is None and not cfg.in_cluster and params is not None


@needs_ptxas
def test_scripts_lay_their_overrides_over_what_the_untuned_call_runs():
    """launch_config.untuned_defines (tools/variant_ab.py, tools/mma_bench.py): for a catalog family
    the pick's params= (4 x 4096 x 4096 on hgemm_mma: a 64 x 64 tile split in clusters, not the
    source's 128 x 128 defaults the size rule gives); where the call runs another kernel (fp16 2 x
    20000 x 500 tn on hgemm goes to hgemm_skinny) the size rule's choice for the kernel asked."""
    from asmgemm.runtime.launch import untuned_size_rule
    mma = launch_config.get_spec("hgemm_mma")
    cfg, params = launch_config.untuned_params(mma, 4, 4096, 4096, "nn", H100)
    got = launch_config.untuned_defines(mma, 4, 4096, 4096, "nn", H100)
    assert cfg.spec.name == "hgemm_mma" and got == params and got != untuned_size_rule(mma, 4, 4096, 4096, "nn", 132)
    hgemm = launch_config.get_spec("hgemm")
    assert launch_config.untuned_defines(hgemm, 2, 20000, 500, "tn", H100) == \
        untuned_size_rule(hgemm, 2, 20000, 500, "tn", 132)
